/* cuflash's C ABI: the C++ API (include/cuflash/cuflash.hpp) in plain C, for
 * C programs and for bindings from other languages (Rust's extern "C", ctypes,
 * ...). Every function returns a cuflash_status; when it is not CUFLASH_OK,
 * cuflash_last_error_message() gives the library's message for the failed call
 * on this thread (it names the argument, what was expected and what was given).
 * A failed call has written nothing to any output. No C++ exception crosses
 * this interface.
 *
 * Shapes, layouts and semantics are exactly those of the C++ API; see
 * include/cuflash/attention.hpp and docs/semantics.md. In short:
 *   dense:   q [B, Sq, Hq, D], k/v [B, Sk, Hk, D], out like q, lse f32 [B, Hq, Sq]
 *   varlen:  q [Tq, Hq, D], k/v [Tk, Hk, D], cu_seqlens_q/k i32 [B+1], lse f32 [Hq, Tq]
 *   kvcache: q [B, Sq, Hq, D], k/v cache [B, capacity, Hk, D] or paged
 *            [num_pages, page_size, Hk, D] with block_table i32 [B, max_pages];
 *            seqlens_k i32 [B] = keys already cached; optional k_new/v_new
 *            [B, new_len, Hk, D] appended into the cache at seqlens_k[b].. first;
 *            optional leftpad i32 [B] and rotary cos/sin (cuflash_forward_args).
 *   varlen with keys in pages (paged prefill, forward only): q, cu_seqlens_q/k
 *            as varlen, k/v paged [num_pages, page_size, Hk, D] with block_table;
 *            cu_seqlens_k counts each sequence's keys (no seqlens_k, no append).
 * Strides are in elements; the last dimension must be contiguous. Every extent
 * but head_dim may be 0 (an empty result, as in the C++ API), and a tensor
 * without elements may have a NULL data pointer.
 *
 * Structs are plain data: zero-initialise them (or call the *_init helpers),
 * then fill what the call needs. A tensor with rank 0 means "not given".
 * New fields are appended at the end of a struct, where zero means "off", so
 * that a caller that zero-initialises its structs keeps its meaning when
 * recompiled against a newer header (the structs carry no size: a binary
 * built against an older header must be rebuilt with the library). */
#ifndef CUFLASH_CUFLASH_C_H_
#define CUFLASH_CUFLASH_C_H_

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define CUFLASH_C_API __attribute__((visibility("default")))
#else
#define CUFLASH_C_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Values match cuflash::StatusCode. */
typedef enum cuflash_status {
  CUFLASH_OK = 0,
  CUFLASH_INVALID_ARGUMENT = 1, /* the caller passed something wrong */
  CUFLASH_UNSUPPORTED = 2,      /* valid input that the chosen backend cannot run */
  CUFLASH_CUDA_ERROR = 3,       /* a CUDA runtime or launch failure */
  CUFLASH_CUDNN_ERROR = 4,      /* a cuDNN failure */
  CUFLASH_INTERNAL = 5          /* a bug in cuflash (or out of host memory) */
} cuflash_status;

/* Values match cuflash::DType. */
typedef enum cuflash_dtype {
  CUFLASH_F32 = 0,
  CUFLASH_F16 = 1, /* IEEE half, passed as its 16-bit pattern */
  CUFLASH_BF16 = 2, /* bfloat16, passed as its 16-bit pattern */
  CUFLASH_I32 = 3
} cuflash_dtype;

/* Values match cuflash::DeviceKind. */
typedef enum cuflash_device_kind {
  CUFLASH_DEVICE_HOST = 0,
  CUFLASH_DEVICE_CUDA = 1
} cuflash_device_kind;

/* Values match cuflash::Backend. */
typedef enum cuflash_backend {
  CUFLASH_BACKEND_AUTO = 0,
  CUFLASH_BACKEND_CPU = 1,
  CUFLASH_BACKEND_CUDA = 2,
  CUFLASH_BACKEND_CUDNN = 3
} cuflash_backend;

#define CUFLASH_MAX_RANK 5

/* A non-owning strided view of host or CUDA memory (cuflash::TensorView). */
typedef struct cuflash_tensor {
  void* data;
  int32_t dtype;        /* cuflash_dtype */
  int32_t device_kind;  /* cuflash_device_kind */
  int32_t device_index; /* CUDA ordinal; 0 for host */
  int32_t rank;         /* 0 = not given; at most CUFLASH_MAX_RANK */
  int64_t shape[CUFLASH_MAX_RANK];
  int64_t strides[CUFLASH_MAX_RANK]; /* in elements, not bytes */
} cuflash_tensor;

/* cuflash::AttentionOptions. Start from cuflash_options_init(). */
typedef struct cuflash_options {
  int32_t has_softmax_scale; /* 0: 1/sqrt(head_dim) */
  float softmax_scale;
  int32_t causal;       /* bottom-right aligned; implies window_right = 0 */
  int32_t window_left;  /* -1: unbounded */
  int32_t window_right; /* -1: unbounded */
  float softcap;        /* 0: off */
  int32_t deterministic;        /* backward: bitwise reproducible */
  int32_t check_index_contents; /* 1 (default): copy GPU index tensors to the host to check them */
  int32_t backend;              /* cuflash_backend */
  /* Dropout on the normalized probabilities (flash-attn's): kept with
   * probability 1 - dropout_p, scaled by 1 / (1 - dropout_p); 0 = off, < 1.
   * The mask is a function of (seed, offset, b, h, i, j) (docs/semantics.md):
   * give the backward the forward's seed and offset. Backend cpu only for now. */
  float dropout_p;
  uint64_t dropout_seed;
  uint64_t dropout_offset;
  /* Key j is aligned with query i when j = i + diagonal_offset (replaces
   * kv_len - q_len in the causal/window masks and ALiBi); used when
   * has_diagonal_offset. Not with a KV cache; |offset| <= 2^30. */
  int32_t has_diagonal_offset;
  int64_t diagonal_offset;
} cuflash_options;

/* cuflash::RunContext. All zero: default stream, no caller workspace. */
typedef struct cuflash_run_context {
  void* stream; /* cudaStream_t */
  void* workspace;
  size_t workspace_bytes;
} cuflash_run_context;

/* Forward. For varlen give cu_seqlens_q/k and max_seqlen_q/k (and block_table
 * when the keys are in pages); for a KV cache give seqlens_k (and block_table
 * when paged, k_new/v_new to append). */
typedef struct cuflash_forward_args {
  cuflash_tensor q, k, v, out;
  cuflash_tensor lse;          /* optional */
  cuflash_tensor alibi_slopes; /* optional f32 [Hq] or [B, Hq] */
  /* varlen */
  cuflash_tensor cu_seqlens_q, cu_seqlens_k;
  int32_t max_seqlen_q, max_seqlen_k;
  /* KV cache */
  cuflash_tensor seqlens_k, block_table, k_new, v_new;
  /* optional f32 [Hq]: attention sinks, one logit per query head in every
   * row's softmax denominator (no value); backend cpu only for now */
  cuflash_tensor sinks;
  /* optional debug output f32 [B, Hq, max_seqlen_q, max_kv]: the probabilities,
   * entries dropout dropped negated (flash-attn's S_dmask); backend cpu only */
  cuflash_tensor attn_probs;
  /* KV cache, optional (rank 0 / 0: off):
   * leftpad i32 [B], flash-attn's cache_leftpad: the cache row where sequence
   * b's keys start (rows before it are none of its keys); paged caches too.
   * rotary_cos/rotary_sin [seqlen_ro, rotary_dim / 2] like q: a rotary
   * embedding of q and k_new (needs k_new), GPT-NeoX halves, or GPT-J pairs
   * with rotary_interleaved = 1. Semantics: include/cuflash/attention.hpp (KvCache). */
  cuflash_tensor leftpad;
  cuflash_tensor rotary_cos, rotary_sin;
  int32_t rotary_interleaved;
} cuflash_forward_args;

typedef struct cuflash_backward_args {
  cuflash_tensor q, k, v, out, dout;
  cuflash_tensor lse; /* required: as the forward wrote it */
  cuflash_tensor dq, dk, dv;
  cuflash_tensor alibi_slopes;
  cuflash_tensor cu_seqlens_q, cu_seqlens_k;
  int32_t max_seqlen_q, max_seqlen_k;
  cuflash_tensor seqlens_k, block_table; /* no appends in backward; no block_table with varlen */
  cuflash_tensor sinks;  /* as given to the forward */
  cuflash_tensor dsinks; /* optional output f32 [Hq], with sinks: their gradient */
  cuflash_tensor leftpad; /* KV cache: as given to the forward */
} cuflash_backward_args;

/* out_* [B, S, H, D]; lse_* f32 [B, H, S]. out/lse may be exactly out_a/lse_a. */
typedef struct cuflash_merge_args {
  cuflash_tensor out_a, lse_a, out_b, lse_b, out, lse;
} cuflash_merge_args;

/* Ring attention over NCCL (include/cuflash/ring.hpp, docs/ring.md): each
 * rank's shard of sequences split along their length; every rank of `comm`
 * makes the same call on its own device. Dense: q [B, S_local, Hq, D], k/v
 * [B, S_local, Hk, D]; varlen: [T_local, H, D] with cu_seqlens of the local
 * shards (on the device) and max_seqlen. lse and alibi_slopes may be rank 0. */
typedef struct ncclComm* ncclComm_t;
typedef enum cuflash_ring_layout {
  CUFLASH_RING_CONTIGUOUS = 0, /* rank r holds chunk r of W */
  CUFLASH_RING_ZIGZAG = 1      /* rank r holds chunks r and 2W-1-r of 2W (balanced causal work) */
} cuflash_ring_layout;
typedef struct cuflash_ring_forward_args {
  cuflash_tensor q, k, v, out, lse, alibi_slopes, cu_seqlens;
  int32_t max_seqlen;
} cuflash_ring_forward_args;
typedef struct cuflash_ring_backward_args {
  cuflash_tensor q, k, v, out, dout, lse, dq, dk, dv, alibi_slopes, cu_seqlens;
  int32_t max_seqlen;
} cuflash_ring_backward_args;

/* Linear attention (include/cuflash/linear_attention.hpp, docs/linear.md):
 *   o_t = S_t^T fq_t with fq_t = scale * phi(q_t), S_t = S_0 + sum_{s<=t} phi(k_s) v_s^T;
 *   normalize: o_t / (fq_t . z_t + 1e-10), z_t = z_0 + sum_{s<=t} phi(k_s); non-causal: sums over the sequence.
 * dense q [B, S, Hq, Dk], k [B, S, Hk, Dk], v [B, S, Hk, Dv], out [B, S, Hq, Dv];
 * varlen [T, H, D] with cu_seqlens i32 [B+1]; state f32 [B, Hk, Dk, Dv], key sum f32 [B, Hk, Dk].
 * Values of cuflash_feature_map match cuflash::FeatureMap. */
typedef enum cuflash_feature_map {
  CUFLASH_FEATURE_IDENTITY = 0,
  CUFLASH_FEATURE_ELU_PLUS_ONE = 1, /* elu(x) + 1 */
  CUFLASH_FEATURE_RELU = 2
} cuflash_feature_map;

/* cuflash::LinearAttentionOptions. Start from cuflash_linear_options_init(). */
typedef struct cuflash_linear_options {
  int32_t has_scale; /* 0: 1/sqrt(Dk) */
  float scale;       /* multiplies phi(q) */
  int32_t causal;    /* default 1 */
  int32_t feature_map; /* cuflash_feature_map */
  int32_t normalize;
  int32_t check_index_contents; /* 1 (default): copy a GPU cu_seqlens to the host to check it */
  int32_t backend;              /* cuflash_backend */
} cuflash_linear_options;

/* Optional tensors have rank 0; key sums only with normalize. */
typedef struct cuflash_linear_forward_args {
  cuflash_tensor q, k, v, out;
  cuflash_tensor cu_seqlens; /* given: varlen */
  cuflash_tensor initial_state, initial_key_sum; /* optional inputs */
  cuflash_tensor final_state, final_key_sum;     /* optional outputs */
} cuflash_linear_forward_args;

typedef struct cuflash_linear_backward_args {
  cuflash_tensor q, k, v, dout;
  cuflash_tensor cu_seqlens;
  cuflash_tensor initial_state, initial_key_sum; /* as given to the forward */
  cuflash_tensor dfinal_state, dfinal_key_sum;   /* optional: gradients arriving at the final state */
  cuflash_tensor dq, dk, dv;
  cuflash_tensor dinitial_state, dinitial_key_sum; /* optional outputs, with initial_state / initial_key_sum */
} cuflash_linear_backward_args;

/* One decode step: q [B, 1, Hq, Dk], k [B, 1, Hk, Dk], v [B, 1, Hk, Dv], out [B, 1, Hq, Dv];
 * state (and key_sum with normalize) updated in place unless state_out (key_sum_out) is given. */
typedef struct cuflash_linear_step_args {
  cuflash_tensor q, k, v, out;
  cuflash_tensor state, key_sum;
  cuflash_tensor state_out, key_sum_out;
} cuflash_linear_step_args;

/* Library version, e.g. "0.1.0". */
CUFLASH_C_API const char* cuflash_version(void);
/* 1 when the backend is compiled in and usable on this machine now. */
CUFLASH_C_API int cuflash_backend_available(int32_t backend);
/* "ok", "invalid_argument", "unsupported", "cuda_error", "cudnn_error", "internal". */
CUFLASH_C_API const char* cuflash_status_name(cuflash_status status);
/* The message of this thread's last call that failed, or "" when this
 * thread's last call succeeded. Valid until this thread's next cuflash call. */
CUFLASH_C_API const char* cuflash_last_error_message(void);

/* Defaults: scale 1/sqrt(D), no mask, no softcap, no dropout, index checks on, backend auto. */
CUFLASH_C_API void cuflash_options_init(cuflash_options* options);
/* A row-major view of `rank` dims (contiguous strides); rank > CUFLASH_MAX_RANK
 * leaves rank at -1, which every call rejects. */
CUFLASH_C_API cuflash_tensor cuflash_make_tensor(void* data, int32_t dtype, int32_t rank, const int64_t* shape,
                                                 int32_t device_kind, int32_t device_index);

/* options and context may be NULL (defaults). */
CUFLASH_C_API cuflash_status cuflash_attention_forward(const cuflash_forward_args* args,
                                                       const cuflash_options* options,
                                                       const cuflash_run_context* context);
CUFLASH_C_API cuflash_status cuflash_attention_backward(const cuflash_backward_args* args,
                                                        const cuflash_options* options,
                                                        const cuflash_run_context* context);
/* flash-attn's flash_attn_with_kvcache as one call: a KV-cache forward.
 * k_new/v_new and block_table may be NULL or rank 0; lse and alibi_slopes too.
 * (Sinks, attn_probs, a leftpad and a rotary embedding: through
 * cuflash_attention_forward's args.) */
CUFLASH_C_API cuflash_status cuflash_attention_with_kvcache(
    const cuflash_tensor* q, const cuflash_tensor* k_cache, const cuflash_tensor* v_cache,
    const cuflash_tensor* k_new, const cuflash_tensor* v_new, const cuflash_tensor* seqlens_k,
    const cuflash_tensor* block_table, const cuflash_tensor* alibi_slopes, const cuflash_tensor* out,
    const cuflash_tensor* lse, const cuflash_options* options, const cuflash_run_context* context);
CUFLASH_C_API cuflash_status cuflash_merge_states(const cuflash_merge_args* args, int32_t backend,
                                                  const cuflash_run_context* context);

/* Defaults: scale 1/sqrt(Dk), causal, identity features, no normalization, index checks on, backend auto. */
CUFLASH_C_API void cuflash_linear_options_init(cuflash_linear_options* options);
/* options and context may be NULL (defaults). Backend cpu only for now: cuda and
 * cudnn answer CUFLASH_UNSUPPORTED naming the op. */
CUFLASH_C_API cuflash_status cuflash_linear_attention_forward(const cuflash_linear_forward_args* args,
                                                              const cuflash_linear_options* options,
                                                              const cuflash_run_context* context);
CUFLASH_C_API cuflash_status cuflash_linear_attention_backward(const cuflash_linear_backward_args* args,
                                                               const cuflash_linear_options* options,
                                                               const cuflash_run_context* context);
CUFLASH_C_API cuflash_status cuflash_linear_attention_step(const cuflash_linear_step_args* args,
                                                           const cuflash_linear_options* options,
                                                           const cuflash_run_context* context);

/* 1 when this build has the NCCL ring. */
CUFLASH_C_API int cuflash_ring_attention_available(void);
CUFLASH_C_API cuflash_status cuflash_ring_attention_forward(const cuflash_ring_forward_args* args,
                                                            const cuflash_options* options, int32_t layout,
                                                            ncclComm_t comm, const cuflash_run_context* context);
CUFLASH_C_API cuflash_status cuflash_ring_attention_backward(const cuflash_ring_backward_args* args,
                                                             const cuflash_options* options, int32_t layout,
                                                             ncclComm_t comm, const cuflash_run_context* context);

/* Scratch bytes the call needs in cuflash_run_context.workspace (0 on the CPU). */
CUFLASH_C_API cuflash_status cuflash_forward_workspace_size(const cuflash_forward_args* args,
                                                            const cuflash_options* options, size_t* bytes);
CUFLASH_C_API cuflash_status cuflash_backward_workspace_size(const cuflash_backward_args* args,
                                                             const cuflash_options* options, size_t* bytes);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* CUFLASH_CUFLASH_C_H_ */
