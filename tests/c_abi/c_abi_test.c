/* The C ABI (include/cuflash/cuflash_c.h) used from C, compiled by a C
 * compiler: dense forward/backward, varlen, a paged KV cache with append,
 * merge_states and errors, each checked against attention computed here in
 * double precision on the CPU backend, and calls with empty tensors; linear
 * attention (forward against a loop here, the decode step, a backward, errors). */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuflash/cuflash_c.h"

static int checks_passed = 0;
static int checks_failed = 0;

#define CHECK(cond, ...)                                              \
  do {                                                                \
    if (cond) {                                                       \
      ++checks_passed;                                                \
    } else {                                                          \
      ++checks_failed;                                                \
      fprintf(stderr, "FAILED %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                   \
      fprintf(stderr, "\n");                                          \
    }                                                                 \
  } while (0)

/* Deterministic values in [-1, 1). */
static unsigned int rng_state = 12345u;
static float next_value(void) {
  rng_state = rng_state * 1664525u + 1013904223u;
  return (float)((rng_state >> 8) & 0xFFFF) / 32768.0f - 1.0f;
}
static float* random_floats(size_t count) {
  float* data = malloc(count * sizeof(float));
  size_t i;
  for (i = 0; i < count; ++i) data[i] = next_value();
  return data;
}
static float* filled_floats(size_t count, float value) {
  float* data = malloc(count * sizeof(float));
  size_t i;
  for (i = 0; i < count; ++i) data[i] = value;
  return data;
}

static cuflash_tensor host_tensor(void* data, int32_t dtype, int32_t rank, const int64_t* shape) {
  return cuflash_make_tensor(data, dtype, rank, shape, CUFLASH_DEVICE_HOST, 0);
}

/* Options of the reference: scale, bottom-right causal, softcap. */
typedef struct {
  double scale;
  int causal;
  double softcap;
} ref_options;

/* One (sequence, head): q [lq][d], k/v [lk][d] with row strides; out [lq][d],
 * lse [lq]; with dout given, also dq [lq][d] and dk/dv [lk][d] (accumulated). */
static void reference(const float* q, long q_row, const float* k, long k_row, const float* v, long v_row, int lq,
                      int lk, int d, ref_options opt, double* out, double* lse, const float* dout, long dout_row,
                      double* dq, double* dk, double* dv) {
  double* p = calloc((size_t)lk, sizeof(double));
  double* raw = calloc((size_t)lk, sizeof(double));
  int i, j, c;
  for (i = 0; i < lq; ++i) {
    double row_max = -INFINITY, sum = 0.0;
    int visible_count = 0;
    for (j = 0; j < lk; ++j) {
      double s = 0.0;
      for (c = 0; c < d; ++c) s += (double)q[i * q_row + c] * (double)k[j * k_row + c];
      s *= opt.scale;
      raw[j] = s;
      if (opt.softcap > 0) s = opt.softcap * tanh(s / opt.softcap);
      if (opt.causal && j > i + lk - lq) s = -INFINITY;
      else ++visible_count;
      p[j] = s;
      if (s > row_max) row_max = s;
    }
    for (c = 0; c < d; ++c) out[i * d + c] = 0.0;
    if (visible_count == 0) {
      lse[i] = -INFINITY;
      continue;
    }
    for (j = 0; j < lk; ++j) {
      p[j] = p[j] == -INFINITY ? 0.0 : exp(p[j] - row_max);
      sum += p[j];
    }
    lse[i] = row_max + log(sum);
    for (j = 0; j < lk; ++j) {
      p[j] /= sum;
      for (c = 0; c < d; ++c) out[i * d + c] += p[j] * (double)v[j * v_row + c];
    }
    if (dout != NULL) {
      double delta = 0.0;
      for (c = 0; c < d; ++c) delta += (double)dout[i * dout_row + c] * out[i * d + c];
      for (j = 0; j < lk; ++j) {
        double dp = 0.0, ds;
        if (p[j] == 0.0) continue;
        for (c = 0; c < d; ++c) dp += (double)dout[i * dout_row + c] * (double)v[j * v_row + c];
        ds = p[j] * (dp - delta);
        if (opt.softcap > 0) {
          double t = tanh(raw[j] / opt.softcap);
          ds *= 1.0 - t * t;
        }
        for (c = 0; c < d; ++c) {
          dq[i * d + c] += opt.scale * ds * (double)k[j * k_row + c];
          dk[j * d + c] += opt.scale * ds * (double)q[i * q_row + c];
          dv[j * d + c] += p[j] * (double)dout[i * dout_row + c];
        }
      }
    }
  }
  free(p);
  free(raw);
}

static double max_abs_diff(const float* got, long got_stride, const double* want, int rows, int cols) {
  double worst = 0.0;
  int r, c;
  for (r = 0; r < rows; ++r)
    for (c = 0; c < cols; ++c) {
      double diff = fabs((double)got[r * got_stride + c] - want[r * cols + c]);
      if (!(diff <= worst)) worst = diff; /* NaN wins */
    }
  return worst;
}

static const double kTolerance = 2e-5;

/* A backward's arguments as far as they repeat the forward's: q, k, v, out, lse and the
 * index tensors. */
static cuflash_backward_args backward_args_of(const cuflash_forward_args* args) {
  cuflash_backward_args grad;
  memset(&grad, 0, sizeof grad);
  grad.q = args->q;
  grad.k = args->k;
  grad.v = args->v;
  grad.out = args->out;
  grad.lse = args->lse;
  grad.cu_seqlens_q = args->cu_seqlens_q;
  grad.cu_seqlens_k = args->cu_seqlens_k;
  grad.max_seqlen_q = args->max_seqlen_q;
  grad.max_seqlen_k = args->max_seqlen_k;
  grad.seqlens_k = args->seqlens_k;
  grad.block_table = args->block_table;
  return grad;
}

/* Dense GQA forward (causal, softcap, Sq != Sk) and its backward. */
static void test_dense_forward_backward(void) {
  enum { B = 2, SQ = 5, SK = 9, HQ = 4, HK = 2, D = 16 };
  const int64_t q_shape[4] = {B, SQ, HQ, D}, kv_shape[4] = {B, SK, HK, D}, lse_shape[3] = {B, HQ, SQ};
  float *q = random_floats(B * SQ * HQ * D), *k = random_floats(B * SK * HK * D), *v = random_floats(B * SK * HK * D);
  float *out = filled_floats(B * SQ * HQ * D, NAN), *lse = filled_floats(B * HQ * SQ, NAN);
  float *dout = random_floats(B * SQ * HQ * D), *dq = filled_floats(B * SQ * HQ * D, NAN);
  float *dk = filled_floats(B * SK * HK * D, NAN), *dv = filled_floats(B * SK * HK * D, NAN);
  double *want_dk = calloc(B * SK * HK * D, sizeof(double)), *want_dv = calloc(B * SK * HK * D, sizeof(double));
  cuflash_forward_args args;
  cuflash_backward_args grad;
  cuflash_options options;
  cuflash_status status;
  ref_options ref = {0.3, 1, 2.0};
  double worst_out = 0, worst_lse = 0, worst_dq = 0, worst_dkv = 0;
  int b, h, i;

  memset(&args, 0, sizeof args);
  args.q = host_tensor(q, CUFLASH_F32, 4, q_shape);
  args.k = host_tensor(k, CUFLASH_F32, 4, kv_shape);
  args.v = host_tensor(v, CUFLASH_F32, 4, kv_shape);
  args.out = host_tensor(out, CUFLASH_F32, 4, q_shape);
  args.lse = host_tensor(lse, CUFLASH_F32, 3, lse_shape);
  cuflash_options_init(&options);
  options.has_softmax_scale = 1;
  options.softmax_scale = (float)ref.scale;
  options.causal = 1;
  options.softcap = (float)ref.softcap;
  options.backend = CUFLASH_BACKEND_CPU;
  status = cuflash_attention_forward(&args, &options, NULL);
  CHECK(status == CUFLASH_OK, "forward: %s: %s", cuflash_status_name(status), cuflash_last_error_message());
  CHECK(strcmp(cuflash_last_error_message(), "") == 0, "message after success: '%s'", cuflash_last_error_message());

  grad = backward_args_of(&args);
  grad.dout = host_tensor(dout, CUFLASH_F32, 4, q_shape);
  grad.dq = host_tensor(dq, CUFLASH_F32, 4, q_shape);
  grad.dk = host_tensor(dk, CUFLASH_F32, 4, kv_shape);
  grad.dv = host_tensor(dv, CUFLASH_F32, 4, kv_shape);
  options.deterministic = 1;
  status = cuflash_attention_backward(&grad, &options, NULL);
  CHECK(status == CUFLASH_OK, "backward: %s: %s", cuflash_status_name(status), cuflash_last_error_message());

  for (b = 0; b < B; ++b)
    for (h = 0; h < HQ; ++h) {
      const int hk = h / (HQ / HK);
      const long q_at = ((long)b * SQ * HQ + h) * D, kv_at = ((long)b * SK * HK + hk) * D;
      double want_out[SQ * D], want_lse[SQ], want_dq[SQ * D] = {0};
      double head_dk[SK * D] = {0}, head_dv[SK * D] = {0};
      int j, c;
      reference(q + q_at, HQ * D, k + kv_at, HK * D, v + kv_at, HK * D, SQ, SK, D, ref, want_out, want_lse,
                dout + q_at, HQ * D, want_dq, head_dk, head_dv);
      worst_out = fmax(worst_out, max_abs_diff(out + q_at, HQ * D, want_out, SQ, D));
      worst_dq = fmax(worst_dq, max_abs_diff(dq + q_at, HQ * D, want_dq, SQ, D));
      for (i = 0; i < SQ; ++i) worst_lse = fmax(worst_lse, fabs(lse[(b * HQ + h) * SQ + i] - want_lse[i]));
      for (j = 0; j < SK; ++j)
        for (c = 0; c < D; ++c) {
          want_dk[((long)b * SK + j) * HK * D + hk * D + c] += head_dk[j * D + c];
          want_dv[((long)b * SK + j) * HK * D + hk * D + c] += head_dv[j * D + c];
        }
    }
  worst_dkv = fmax(max_abs_diff(dk, D, want_dk, B * SK * HK, D), max_abs_diff(dv, D, want_dv, B * SK * HK, D));
  CHECK(worst_out <= kTolerance, "dense out max-abs error %g", worst_out);
  CHECK(worst_lse <= kTolerance, "dense lse max-abs error %g", worst_lse);
  CHECK(worst_dq <= 1e-4, "dense dq max-abs error %g", worst_dq);
  CHECK(worst_dkv <= 1e-4, "dense dk/dv max-abs error %g", worst_dkv);

  free(q), free(k), free(v), free(out), free(lse), free(dout), free(dq), free(dk), free(dv);
  free(want_dk), free(want_dv);
}

/* test_varlen's batch with its keys in pages of 4 (flash-attn's paged prefill: cu_seqlens_k
 * counts each sequence's keys, block_table names its pages, shuffled, page 4 no sequence's):
 * the same bits as with the keys packed. The backward refuses the block table, writing nothing. */
static void check_varlen_keys_in_pages(const cuflash_forward_args* packed, const float* k, const float* v,
                                       const int32_t* cu_k, const float* out, const float* lse) {
  enum { TQ = 9, H = 2, D = 8, B = 3, PAGES = 7, PAGE = 4, MAX_PAGES = 2 };
  int32_t block_table[B * MAX_PAGES] = {6, 2, 0, 5, 3, 1};
  const int64_t q_shape[3] = {TQ, H, D}, cache_shape[4] = {PAGES, PAGE, H, D}, lse_shape[2] = {H, TQ};
  const int64_t table_shape[2] = {B, MAX_PAGES};
  const size_t row_bytes = H * D * sizeof(float);
  float *k_cache = filled_floats(PAGES * PAGE * H * D, NAN), *v_cache = filled_floats(PAGES * PAGE * H * D, NAN);
  float *paged_out = filled_floats(TQ * H * D, NAN), *paged_lse = filled_floats(H * TQ, NAN);
  float *dq = filled_floats(TQ * H * D, NAN), *dk = filled_floats(PAGES * PAGE * H * D, NAN);
  float* dv = filled_floats(PAGES * PAGE * H * D, NAN);
  cuflash_forward_args args = *packed;
  cuflash_backward_args grad;
  cuflash_status status;
  int b, j;

  for (b = 0; b < B; ++b)
    for (j = 0; j < cu_k[b + 1] - cu_k[b]; ++j) {
      const long slot = (long)block_table[b * MAX_PAGES + j / PAGE] * PAGE + j % PAGE;
      memcpy(k_cache + slot * H * D, k + (long)(cu_k[b] + j) * H * D, row_bytes);
      memcpy(v_cache + slot * H * D, v + (long)(cu_k[b] + j) * H * D, row_bytes);
    }
  args.k = host_tensor(k_cache, CUFLASH_F32, 4, cache_shape);
  args.v = host_tensor(v_cache, CUFLASH_F32, 4, cache_shape);
  args.out = host_tensor(paged_out, CUFLASH_F32, 3, q_shape);
  args.lse = host_tensor(paged_lse, CUFLASH_F32, 2, lse_shape);
  args.block_table = host_tensor(block_table, CUFLASH_I32, 2, table_shape);
  status = cuflash_attention_forward(&args, NULL, NULL);
  CHECK(status == CUFLASH_OK, "varlen, keys in pages: %s: %s", cuflash_status_name(status),
        cuflash_last_error_message());
  CHECK(memcmp(paged_out, out, TQ * row_bytes) == 0 && memcmp(paged_lse, lse, H * TQ * sizeof(float)) == 0,
        "varlen, keys in pages: out/lse differ from the packed call's");

  grad = backward_args_of(&args);
  grad.dout = args.out;
  grad.dq = host_tensor(dq, CUFLASH_F32, 3, q_shape);
  grad.dk = host_tensor(dk, CUFLASH_F32, 4, cache_shape);
  grad.dv = host_tensor(dv, CUFLASH_F32, 4, cache_shape);
  CHECK(cuflash_attention_backward(&grad, NULL, NULL) == CUFLASH_INVALID_ARGUMENT &&
            strstr(cuflash_last_error_message(), "block_table") != NULL,
        "varlen backward with a block table: '%s'", cuflash_last_error_message());
  CHECK(isnan(dq[0]) && isnan(dk[0]) && isnan(dv[0]), "the refused backward wrote its gradients");
  free(k_cache), free(v_cache), free(paged_out), free(paged_lse), free(dq), free(dk), free(dv);
}

/* Varlen: sequences of 3, 0 and 6 queries over 4, 2 and 6 keys, strided q (a BHSD-like
 * packing seen through strides). */
static void test_varlen(void) {
  enum { TQ = 9, TK = 12, H = 2, D = 8, B = 3 };
  int32_t cu_q[B + 1] = {0, 3, 3, 9}, cu_k[B + 1] = {0, 4, 6, 12};
  const int64_t kv_shape[3] = {TK, H, D}, out_shape[3] = {TQ, H, D}, lse_shape[2] = {H, TQ}, cu_shape[1] = {B + 1};
  /* q stored as [H, TQ, D] and passed as [TQ, H, D] with strides. */
  float *q = random_floats(H * TQ * D), *k = random_floats(TK * H * D), *v = random_floats(TK * H * D);
  float *out = filled_floats(TQ * H * D, NAN), *lse = filled_floats(H * TQ, NAN);
  cuflash_forward_args args;
  cuflash_status status;
  ref_options ref = {1.0 / sqrt((double)D), 0, 0.0};
  double worst = 0;
  int b, h, i;

  memset(&args, 0, sizeof args);
  args.q = host_tensor(q, CUFLASH_F32, 3, out_shape);
  args.q.strides[0] = D;
  args.q.strides[1] = TQ * D;
  args.q.strides[2] = 1;
  args.k = host_tensor(k, CUFLASH_F32, 3, kv_shape);
  args.v = host_tensor(v, CUFLASH_F32, 3, kv_shape);
  args.out = host_tensor(out, CUFLASH_F32, 3, out_shape);
  args.lse = host_tensor(lse, CUFLASH_F32, 2, lse_shape);
  args.cu_seqlens_q = host_tensor(cu_q, CUFLASH_I32, 1, cu_shape);
  args.cu_seqlens_k = host_tensor(cu_k, CUFLASH_I32, 1, cu_shape);
  args.max_seqlen_q = 6;
  args.max_seqlen_k = 6;
  status = cuflash_attention_forward(&args, NULL, NULL);
  CHECK(status == CUFLASH_OK, "varlen: %s: %s", cuflash_status_name(status), cuflash_last_error_message());
  for (b = 0; b < B; ++b)
    for (h = 0; h < H; ++h) {
      const int lq = cu_q[b + 1] - cu_q[b], lk = cu_k[b + 1] - cu_k[b];
      double want_out[6 * D], want_lse[6];
      if (lq == 0) continue;
      reference(q + (long)h * TQ * D + (long)cu_q[b] * D, D, k + ((long)cu_k[b] * H + h) * D, H * D,
                v + ((long)cu_k[b] * H + h) * D, H * D, lq, lk, D, ref, want_out, want_lse, NULL, 0, NULL, NULL,
                NULL);
      worst = fmax(worst, max_abs_diff(out + ((long)cu_q[b] * H + h) * D, H * D, want_out, lq, D));
      for (i = 0; i < lq; ++i) worst = fmax(worst, fabs(lse[h * TQ + cu_q[b] + i] - want_lse[i]));
    }
  CHECK(worst <= kTolerance, "varlen max-abs error %g", worst);
  check_varlen_keys_in_pages(&args, k, v, cu_k, out, lse);
  free(q), free(k), free(v), free(out), free(lse);
}

/* Paged cache (pages of 4) with an append of 2 keys, through the kvcache entry point. */
static void test_paged_kvcache_append(void) {
  enum { B = 2, SQ = 2, H = 2, D = 8, PAGES = 6, PAGE = 4, MAX_PAGES = 3, NEW = 2 };
  int32_t block_table[B * MAX_PAGES] = {5, 1, 3, 0, 2, 4};
  int32_t seqlens[B] = {7, 3};
  const int64_t q_shape[4] = {B, SQ, H, D}, cache_shape[4] = {PAGES, PAGE, H, D}, new_shape[4] = {B, NEW, H, D};
  const int64_t table_shape[2] = {B, MAX_PAGES}, seqlens_shape[1] = {B}, lse_shape[3] = {B, H, SQ};
  float *q = random_floats(B * SQ * H * D), *k_cache = random_floats(PAGES * PAGE * H * D);
  float *v_cache = random_floats(PAGES * PAGE * H * D), *k_new = random_floats(B * NEW * H * D);
  float *v_new = random_floats(B * NEW * H * D), *out = filled_floats(B * SQ * H * D, NAN);
  float* lse = filled_floats(B * H * SQ, NAN);
  cuflash_tensor tq = host_tensor(q, CUFLASH_F32, 4, q_shape), tk = host_tensor(k_cache, CUFLASH_F32, 4, cache_shape);
  cuflash_tensor tv = host_tensor(v_cache, CUFLASH_F32, 4, cache_shape);
  cuflash_tensor tkn = host_tensor(k_new, CUFLASH_F32, 4, new_shape), tvn = host_tensor(v_new, CUFLASH_F32, 4, new_shape);
  cuflash_tensor tseq = host_tensor(seqlens, CUFLASH_I32, 1, seqlens_shape);
  cuflash_tensor ttable = host_tensor(block_table, CUFLASH_I32, 2, table_shape);
  cuflash_tensor tout = host_tensor(out, CUFLASH_F32, 4, q_shape), tlse = host_tensor(lse, CUFLASH_F32, 3, lse_shape);
  cuflash_options options;
  cuflash_status status;
  ref_options ref = {1.0 / sqrt((double)D), 1, 0.0};
  double worst = 0, worst_cache = 0;
  int b, h, i, j, c;

  cuflash_options_init(&options);
  options.causal = 1;
  status = cuflash_attention_with_kvcache(&tq, &tk, &tv, &tkn, &tvn, &tseq, &ttable, NULL, &tout, &tlse, &options,
                                          NULL);
  CHECK(status == CUFLASH_OK, "kvcache: %s: %s", cuflash_status_name(status), cuflash_last_error_message());
  for (b = 0; b < B; ++b) {
    const int lk = seqlens[b] + NEW;
    /* The appended keys are now in the cache at seqlens[b].. */
    for (j = seqlens[b]; j < lk; ++j)
      for (h = 0; h < H; ++h)
        for (c = 0; c < D; ++c) {
          const long cache_at = (((long)block_table[b * MAX_PAGES + j / PAGE] * PAGE + j % PAGE) * H + h) * D + c;
          const long new_at = (((long)b * NEW + (j - seqlens[b])) * H + h) * D + c;
          worst_cache = fmax(worst_cache, fabs(k_cache[cache_at] - k_new[new_at]));
          worst_cache = fmax(worst_cache, fabs(v_cache[cache_at] - v_new[new_at]));
        }
    for (h = 0; h < H; ++h) {
      float keys[(MAX_PAGES * PAGE) * D], values[(MAX_PAGES * PAGE) * D];
      double want_out[SQ * D], want_lse[SQ];
      for (j = 0; j < lk; ++j)
        for (c = 0; c < D; ++c) {
          const long at = (((long)block_table[b * MAX_PAGES + j / PAGE] * PAGE + j % PAGE) * H + h) * D + c;
          keys[j * D + c] = k_cache[at];
          values[j * D + c] = v_cache[at];
        }
      reference(q + ((long)b * SQ * H + h) * D, H * D, keys, D, values, D, SQ, lk, D, ref, want_out, want_lse, NULL,
                0, NULL, NULL, NULL);
      worst = fmax(worst, max_abs_diff(out + ((long)b * SQ * H + h) * D, H * D, want_out, SQ, D));
      for (i = 0; i < SQ; ++i) worst = fmax(worst, fabs(lse[(b * H + h) * SQ + i] - want_lse[i]));
    }
  }
  CHECK(worst_cache == 0.0, "appended keys not in the cache (max diff %g)", worst_cache);
  CHECK(worst <= kTolerance, "paged kvcache max-abs error %g", worst);
  free(q), free(k_cache), free(v_cache), free(k_new), free(v_new), free(out), free(lse);
}

/* x's first rotary_dim columns turned, GPT-J pairs (2k, 2k + 1), by the angles of cos/sin row `position`. */
static void rotate_interleaved(double* x, const float* cos_table, const float* sin_table, int pairs, int position) {
  int k;
  for (k = 0; k < pairs; ++k) {
    const double c = cos_table[position * pairs + k], s = sin_table[position * pairs + k];
    const double first = x[2 * k], second = x[2 * k + 1];
    x[2 * k] = first * c - second * s;
    x[2 * k + 1] = first * s + second * c;
  }
}

/* A contiguous cache with a leftpad (keys from row leftpad[b]) and an interleaved rotary embedding of q and
 * the 2 appended keys (4 of 8 columns), through cuflash_attention_forward's appended fields; then the same
 * cache as pages. */
static void test_kvcache_leftpad_rotary(void) {
  enum { B = 2, SQ = 2, H = 2, D = 8, CAP = 12, NEW = 2, PAIRS = 2, RO = CAP + SQ };
  int32_t seqlens[B] = {7, 3}, leftpad[B] = {3, 0}, block_table[B] = {0, 1};
  const int64_t q_shape[4] = {B, SQ, H, D}, cache_shape[4] = {B, CAP, H, D}, new_shape[4] = {B, NEW, H, D};
  const int64_t index_shape[1] = {B}, table_shape[2] = {B, 1}, lse_shape[3] = {B, H, SQ}, ro_shape[2] = {RO, PAIRS};
  float *q = random_floats(B * SQ * H * D), *k_cache = random_floats(B * CAP * H * D);
  float *v_cache = random_floats(B * CAP * H * D), *k_new = random_floats(B * NEW * H * D);
  float *v_new = random_floats(B * NEW * H * D), *out = filled_floats(B * SQ * H * D, NAN);
  float *lse = filled_floats(B * H * SQ, NAN), *cos_table = malloc(RO * PAIRS * sizeof(float));
  float* sin_table = malloc(RO * PAIRS * sizeof(float));
  cuflash_forward_args args = {0};
  cuflash_options options;
  cuflash_status status;
  ref_options ref = {1.0 / sqrt((double)D), 1, 0.0};
  double worst = 0, worst_cache = 0;
  int b, h, i, j, c;

  for (i = 0; i < RO * PAIRS; ++i) {
    const double angle = (i / PAIRS) * pow(10000.0, -2.0 * (i % PAIRS) / (2 * PAIRS));
    cos_table[i] = (float)cos(angle);
    sin_table[i] = (float)sin(angle);
  }
  args.q = host_tensor(q, CUFLASH_F32, 4, q_shape);
  args.k = host_tensor(k_cache, CUFLASH_F32, 4, cache_shape);
  args.v = host_tensor(v_cache, CUFLASH_F32, 4, cache_shape);
  args.out = host_tensor(out, CUFLASH_F32, 4, q_shape);
  args.lse = host_tensor(lse, CUFLASH_F32, 3, lse_shape);
  args.seqlens_k = host_tensor(seqlens, CUFLASH_I32, 1, index_shape);
  args.k_new = host_tensor(k_new, CUFLASH_F32, 4, new_shape);
  args.v_new = host_tensor(v_new, CUFLASH_F32, 4, new_shape);
  args.leftpad = host_tensor(leftpad, CUFLASH_I32, 1, index_shape);
  args.rotary_cos = host_tensor(cos_table, CUFLASH_F32, 2, ro_shape);
  args.rotary_sin = host_tensor(sin_table, CUFLASH_F32, 2, ro_shape);
  args.rotary_interleaved = 1;
  cuflash_options_init(&options);
  options.causal = 1;
  status = cuflash_attention_forward(&args, &options, NULL);
  CHECK(status == CUFLASH_OK, "leftpad + rotary: %s: %s", cuflash_status_name(status), cuflash_last_error_message());
  for (b = 0; b < B; ++b) {
    const int lk = seqlens[b] + NEW, first = leftpad[b];
    for (h = 0; h < H; ++h) {
      float queries[SQ * D], keys[CAP * D], values[CAP * D];
      double want_out[SQ * D], want_lse[SQ], row[D];
      for (i = 0; i < SQ; ++i) { /* causal: query i at position seqlens[b] + i */
        for (c = 0; c < D; ++c) row[c] = q[(((long)b * SQ + i) * H + h) * D + c];
        rotate_interleaved(row, cos_table, sin_table, PAIRS, seqlens[b] + i);
        for (c = 0; c < D; ++c) queries[i * D + c] = (float)row[c];
      }
      for (j = first; j < lk; ++j) {
        const long at = (((long)b * CAP + j) * H + h) * D;
        for (c = 0; c < D; ++c) {
          keys[(j - first) * D + c] = k_cache[at + c];
          values[(j - first) * D + c] = v_cache[at + c];
        }
        if (j >= seqlens[b]) { /* appended: the rotated k_new row (to float rounding), v_new as it was */
          const long new_at = (((long)b * NEW + (j - seqlens[b])) * H + h) * D;
          for (c = 0; c < D; ++c) row[c] = k_new[new_at + c];
          rotate_interleaved(row, cos_table, sin_table, PAIRS, j);
          for (c = 0; c < D; ++c) {
            worst_cache = fmax(worst_cache, fabs(k_cache[at + c] - row[c]));
            worst_cache = fmax(worst_cache, fabs(v_cache[at + c] - v_new[new_at + c]));
          }
        }
      }
      reference(queries, D, keys, D, values, D, SQ, lk - first, D, ref, want_out, want_lse, NULL, 0, NULL, NULL, NULL);
      worst = fmax(worst, max_abs_diff(out + ((long)b * SQ * H + h) * D, H * D, want_out, SQ, D));
      for (i = 0; i < SQ; ++i) worst = fmax(worst, fabs(lse[(b * H + h) * SQ + i] - want_lse[i]));
    }
  }
  CHECK(worst_cache <= 1e-6, "rotated appended keys in the cache: max diff %g", worst_cache);
  CHECK(worst <= kTolerance, "leftpad + rotary max-abs error %g", worst);

  /* The same cache seen as two pages of CAP rows: a leftpad counts key positions there too, so the same call
   * (appending the same rows again) gives the same out, bit for bit. */
  {
    float* paged_out = filled_floats(B * SQ * H * D, NAN);
    args.block_table = host_tensor(block_table, CUFLASH_I32, 2, table_shape);
    args.out = host_tensor(paged_out, CUFLASH_F32, 4, q_shape);
    status = cuflash_attention_forward(&args, &options, NULL);
    CHECK(status == CUFLASH_OK, "leftpad with a paged cache: %s: '%s'", cuflash_status_name(status),
          cuflash_last_error_message());
    CHECK(memcmp(out, paged_out, sizeof(float) * B * SQ * H * D) == 0, "leftpad: paged and contiguous outs differ");
    free(paged_out);
  }
  free(q), free(k_cache), free(v_cache), free(k_new), free(v_new), free(out), free(lse), free(cos_table),
      free(sin_table);
}

/* Attention over the first and second halves of the keys, merged, equals attention over all. */
static void test_merge_states(void) {
  enum { B = 1, S = 3, H = 2, D = 8, SK = 10, HALF = 5 };
  const int64_t q_shape[4] = {B, S, H, D}, half_shape[4] = {B, HALF, H, D}, lse_shape[3] = {B, H, S};
  const int64_t kv_shape[4] = {B, SK, H, D};
  float *q = random_floats(B * S * H * D), *k = random_floats(B * SK * H * D), *v = random_floats(B * SK * H * D);
  float *out_a = filled_floats(B * S * H * D, NAN), *out_b = filled_floats(B * S * H * D, NAN);
  float *lse_a = filled_floats(B * H * S, NAN), *lse_b = filled_floats(B * H * S, NAN);
  float *out_full = filled_floats(B * S * H * D, NAN), *lse_full = filled_floats(B * H * S, NAN);
  cuflash_forward_args args;
  cuflash_merge_args merge;
  cuflash_status status;
  double worst = 0;
  int part, i;

  for (part = 0; part < 3; ++part) {
    memset(&args, 0, sizeof args);
    args.q = host_tensor(q, CUFLASH_F32, 4, q_shape);
    if (part < 2) {
      /* The half of the keys as a strided view into k/v: same strides as the full tensor. */
      args.k = host_tensor(k + part * HALF * H * D, CUFLASH_F32, 4, half_shape);
      args.v = host_tensor(v + part * HALF * H * D, CUFLASH_F32, 4, half_shape);
      args.k.strides[0] = args.v.strides[0] = SK * H * D;
    } else {
      args.k = host_tensor(k, CUFLASH_F32, 4, kv_shape);
      args.v = host_tensor(v, CUFLASH_F32, 4, kv_shape);
    }
    args.out = host_tensor(part == 0 ? out_a : part == 1 ? out_b : out_full, CUFLASH_F32, 4, q_shape);
    args.lse = host_tensor(part == 0 ? lse_a : part == 1 ? lse_b : lse_full, CUFLASH_F32, 3, lse_shape);
    status = cuflash_attention_forward(&args, NULL, NULL);
    CHECK(status == CUFLASH_OK, "merge part %d: %s", part, cuflash_last_error_message());
  }
  merge.out_a = host_tensor(out_a, CUFLASH_F32, 4, q_shape);
  merge.lse_a = host_tensor(lse_a, CUFLASH_F32, 3, lse_shape);
  merge.out_b = host_tensor(out_b, CUFLASH_F32, 4, q_shape);
  merge.lse_b = host_tensor(lse_b, CUFLASH_F32, 3, lse_shape);
  merge.out = merge.out_a; /* in place */
  merge.lse = merge.lse_a;
  status = cuflash_merge_states(&merge, CUFLASH_BACKEND_AUTO, NULL);
  CHECK(status == CUFLASH_OK, "merge_states: %s", cuflash_last_error_message());
  for (i = 0; i < B * S * H * D; ++i) worst = fmax(worst, fabs(out_a[i] - out_full[i]));
  for (i = 0; i < B * H * S; ++i) worst = fmax(worst, fabs(lse_a[i] - lse_full[i]));
  CHECK(worst <= kTolerance, "merged vs full max-abs difference %g", worst);
  free(q), free(k), free(v), free(out_a), free(out_b), free(lse_a), free(lse_b), free(out_full), free(lse_full);
}

/* Empty tensors: NULL data with a zero extent is fine; a batch of no sequence
 * writes nothing; rows without keys get out = 0 and lse = -inf; a backward
 * without queries writes dk = dv = 0; the workspace of an empty call is 0. */
static void test_empty_tensors(void) {
  enum { B = 2, SQ = 3, SK = 4, H = 2, D = 8 };
  const int64_t no_batch[4] = {0, SQ, H, D}, no_batch_kv[4] = {0, SK, H, D}, no_batch_lse[3] = {0, H, SQ};
  const int64_t q_shape[4] = {B, SQ, H, D}, no_keys[4] = {B, 0, H, D}, lse_shape[3] = {B, H, SQ};
  const int64_t no_queries[4] = {B, 0, H, D}, kv_shape[4] = {B, SK, H, D}, no_queries_lse[3] = {B, H, 0};
  const int64_t one_entry[1] = {1}, varlen_q[3] = {0, H, D}, no_seqlens[1] = {0}, cache_shape[4] = {0, 16, H, D};
  const int64_t merge_shape[4] = {0, SQ, H, D};
  float *q = random_floats(B * SQ * H * D), *k = random_floats(B * SK * H * D), *v = random_floats(B * SK * H * D);
  float *out = filled_floats(B * SQ * H * D, NAN), *lse = filled_floats(B * H * SQ, NAN);
  float *dk = filled_floats(B * SK * H * D, NAN), *dv = filled_floats(B * SK * H * D, NAN);
  int32_t zero = 0;
  cuflash_forward_args args;
  cuflash_backward_args bwd;
  cuflash_merge_args merge;
  cuflash_tensor cache_q, cache_k, cache_out, seqlens;
  cuflash_status status;
  size_t bytes = 123;
  int i, ok = 1;

  memset(&args, 0, sizeof args);
  args.q = host_tensor(NULL, CUFLASH_F32, 4, no_batch);
  args.k = args.v = host_tensor(NULL, CUFLASH_F32, 4, no_batch_kv);
  args.out = host_tensor(NULL, CUFLASH_F32, 4, no_batch);
  args.lse = host_tensor(NULL, CUFLASH_F32, 3, no_batch_lse);
  status = cuflash_forward_workspace_size(&args, NULL, &bytes);
  CHECK(status == CUFLASH_OK && bytes == 0, "B=0 workspace %zu: %s", bytes, cuflash_last_error_message());
  status = cuflash_attention_forward(&args, NULL, NULL);
  CHECK(status == CUFLASH_OK, "B=0 forward: %s", cuflash_last_error_message());
  args.q.shape[3] = 0;
  CHECK(cuflash_attention_forward(&args, NULL, NULL) == CUFLASH_INVALID_ARGUMENT, "head_dim 0 accepted");
  CHECK(strstr(cuflash_last_error_message(), "head_dim") != NULL, "message: '%s'", cuflash_last_error_message());

  /* Keys of length 0: every row sees no key. */
  args.q = host_tensor(q, CUFLASH_F32, 4, q_shape);
  args.k = args.v = host_tensor(NULL, CUFLASH_F32, 4, no_keys);
  args.out = host_tensor(out, CUFLASH_F32, 4, q_shape);
  args.lse = host_tensor(lse, CUFLASH_F32, 3, lse_shape);
  status = cuflash_attention_forward(&args, NULL, NULL);
  CHECK(status == CUFLASH_OK, "Sk=0 forward: %s", cuflash_last_error_message());
  for (i = 0; i < B * SQ * H * D; ++i) ok &= out[i] == 0.0f;
  for (i = 0; i < B * H * SQ; ++i) ok &= isinf(lse[i]) && lse[i] < 0;
  CHECK(ok, "Sk=0: out must be 0 and lse -inf");

  /* Backward of no query: dk = dv = 0. */
  memset(&bwd, 0, sizeof bwd);
  bwd.q = bwd.out = bwd.dout = bwd.dq = host_tensor(NULL, CUFLASH_F32, 4, no_queries);
  bwd.lse = host_tensor(NULL, CUFLASH_F32, 3, no_queries_lse);
  bwd.k = host_tensor(k, CUFLASH_F32, 4, kv_shape);
  bwd.v = host_tensor(v, CUFLASH_F32, 4, kv_shape);
  bwd.dk = host_tensor(dk, CUFLASH_F32, 4, kv_shape);
  bwd.dv = host_tensor(dv, CUFLASH_F32, 4, kv_shape);
  bytes = 123;
  status = cuflash_backward_workspace_size(&bwd, NULL, &bytes);
  CHECK(status == CUFLASH_OK && bytes == 0, "Sq=0 backward workspace %zu: %s", bytes, cuflash_last_error_message());
  status = cuflash_attention_backward(&bwd, NULL, NULL);
  CHECK(status == CUFLASH_OK, "Sq=0 backward: %s", cuflash_last_error_message());
  ok = 1;
  for (i = 0; i < B * SK * H * D; ++i) ok &= dk[i] == 0.0f && dv[i] == 0.0f;
  CHECK(ok, "Sq=0 backward: dk and dv must be 0");

  /* Varlen batch of no sequence: cu_seqlens = [0]. */
  memset(&args, 0, sizeof args);
  args.q = args.k = args.v = args.out = host_tensor(NULL, CUFLASH_F32, 3, varlen_q);
  args.cu_seqlens_q = args.cu_seqlens_k = host_tensor(&zero, CUFLASH_I32, 1, one_entry);
  status = cuflash_attention_forward(&args, NULL, NULL);
  CHECK(status == CUFLASH_OK, "varlen B=0: %s", cuflash_last_error_message());

  /* KV cache of no sequence. */
  cache_q = host_tensor(NULL, CUFLASH_F32, 4, no_batch);
  cache_out = host_tensor(NULL, CUFLASH_F32, 4, no_batch);
  cache_k = host_tensor(NULL, CUFLASH_F32, 4, cache_shape);
  seqlens = host_tensor(NULL, CUFLASH_I32, 1, no_seqlens);
  status = cuflash_attention_with_kvcache(&cache_q, &cache_k, &cache_k, NULL, NULL, &seqlens, NULL, NULL, &cache_out,
                                          NULL, NULL, NULL);
  CHECK(status == CUFLASH_OK, "kvcache B=0: %s", cuflash_last_error_message());

  memset(&merge, 0, sizeof merge);
  merge.out_a = merge.out_b = merge.out = host_tensor(NULL, CUFLASH_F32, 4, merge_shape);
  merge.lse_a = merge.lse_b = merge.lse = host_tensor(NULL, CUFLASH_F32, 3, no_batch_lse);
  status = cuflash_merge_states(&merge, CUFLASH_BACKEND_CPU, NULL);
  CHECK(status == CUFLASH_OK, "merge_states B=0: %s", cuflash_last_error_message());
  free(q), free(k), free(v), free(out), free(lse), free(dk), free(dv);
}

/* Attention sinks and dropout (backend cpu): out and lse with the sinks in the
 * softmax against a double reference; dsinks against its formula over the
 * outputs; dropout reproducible from (seed, offset), and out decoded from the
 * debug probabilities attn_probs (dropped entries negative). */
static void test_sinks_and_dropout(void) {
  enum { SQ = 3, SK = 4, H = 2, D = 8 };
  const int64_t q_shape[4] = {1, SQ, H, D}, kv_shape[4] = {1, SK, H, D}, lse_shape[3] = {1, H, SQ};
  const int64_t sinks_shape[1] = {H}, probs_shape[4] = {1, H, SQ, SK};
  float *q = random_floats(SQ * H * D), *k = random_floats(SK * H * D), *v = random_floats(SK * H * D);
  float *out = filled_floats(SQ * H * D, NAN), *lse = filled_floats(H * SQ, NAN), *dout = random_floats(SQ * H * D);
  float *dq = filled_floats(SQ * H * D, NAN), *dk = filled_floats(SK * H * D, NAN);
  float *dv = filled_floats(SK * H * D, NAN);
  float *first = filled_floats(SQ * H * D, NAN), *probs = filled_floats(H * SQ * SK, NAN);
  float sinks[H] = {0.5f, 2.0f}, dsinks[H] = {NAN, NAN};
  const double scale = 1.0 / sqrt((double)D), p = 0.5;
  cuflash_forward_args args;
  cuflash_backward_args grad;
  cuflash_options options;
  cuflash_status status;
  double worst_out = 0, worst_lse = 0, worst_dsinks = 0, worst_decoded = 0;
  int h, i, j, d, same = 1, negatives = 0;

  memset(&args, 0, sizeof args);
  args.q = host_tensor(q, CUFLASH_F32, 4, q_shape);
  args.k = host_tensor(k, CUFLASH_F32, 4, kv_shape);
  args.v = host_tensor(v, CUFLASH_F32, 4, kv_shape);
  args.out = host_tensor(out, CUFLASH_F32, 4, q_shape);
  args.lse = host_tensor(lse, CUFLASH_F32, 3, lse_shape);
  args.sinks = host_tensor(sinks, CUFLASH_F32, 1, sinks_shape);
  cuflash_options_init(&options);
  options.backend = CUFLASH_BACKEND_CPU;
  status = cuflash_attention_forward(&args, &options, NULL);
  CHECK(status == CUFLASH_OK, "sinks forward: %s", cuflash_last_error_message());
  for (h = 0; h < H; ++h)
    for (i = 0; i < SQ; ++i) {
      double s[SK], m = sinks[h], sum, o;
      for (j = 0; j < SK; ++j) {
        double dot = 0;
        for (d = 0; d < D; ++d) dot += (double)q[(i * H + h) * D + d] * k[(j * H + h) * D + d];
        s[j] = scale * dot;
        m = fmax(m, s[j]);
      }
      sum = exp(sinks[h] - m);
      for (j = 0; j < SK; ++j) sum += exp(s[j] - m);
      worst_lse = fmax(worst_lse, fabs(lse[h * SQ + i] - (m + log(sum))));
      for (d = 0; d < D; ++d) {
        o = 0;
        for (j = 0; j < SK; ++j) o += exp(s[j] - m) / sum * v[(j * H + h) * D + d];
        worst_out = fmax(worst_out, fabs(out[(i * H + h) * D + d] - o));
      }
    }
  CHECK(worst_out <= kTolerance && worst_lse <= kTolerance, "sinks: out error %g, lse error %g", worst_out, worst_lse);

  memset(&grad, 0, sizeof grad);
  grad.q = args.q, grad.k = args.k, grad.v = args.v, grad.out = args.out, grad.lse = args.lse;
  grad.dout = host_tensor(dout, CUFLASH_F32, 4, q_shape);
  grad.dq = host_tensor(dq, CUFLASH_F32, 4, q_shape);
  grad.dk = host_tensor(dk, CUFLASH_F32, 4, kv_shape);
  grad.dv = host_tensor(dv, CUFLASH_F32, 4, kv_shape);
  grad.sinks = args.sinks;
  grad.dsinks = host_tensor(dsinks, CUFLASH_F32, 1, sinks_shape);
  status = cuflash_attention_backward(&grad, &options, NULL);
  CHECK(status == CUFLASH_OK, "sinks backward: %s", cuflash_last_error_message());
  for (h = 0; h < H; ++h) {
    double want = 0;
    for (i = 0; i < SQ; ++i) {
      double delta = 0;
      for (d = 0; d < D; ++d) delta += (double)dout[(i * H + h) * D + d] * out[(i * H + h) * D + d];
      want -= exp(sinks[h] - lse[h * SQ + i]) * delta;
    }
    worst_dsinks = fmax(worst_dsinks, fabs(dsinks[h] - want));
  }
  CHECK(worst_dsinks <= kTolerance, "dsinks error %g", worst_dsinks);

  /* Dropout: the same (seed, offset) gives the same bits; attn_probs decodes to out. */
  args.sinks.rank = 0;
  options.dropout_p = (float)p;
  options.dropout_seed = 0x123456789ull;
  options.dropout_offset = 3;
  args.attn_probs = host_tensor(probs, CUFLASH_F32, 4, probs_shape);
  status = cuflash_attention_forward(&args, &options, NULL);
  CHECK(status == CUFLASH_OK, "dropout forward: %s", cuflash_last_error_message());
  memcpy(first, out, sizeof(float) * SQ * H * D);
  args.attn_probs.rank = 0;
  status = cuflash_attention_forward(&args, &options, NULL);
  for (i = 0; i < SQ * H * D; ++i) same = same && out[i] == first[i];
  CHECK(status == CUFLASH_OK && same, "dropout: the same seed and offset gave another out");
  options.dropout_offset = 4;
  status = cuflash_attention_forward(&args, &options, NULL);
  same = 1;
  for (i = 0; i < SQ * H * D; ++i) same = same && out[i] == first[i];
  CHECK(status == CUFLASH_OK && !same, "dropout: another offset gave the same out");
  for (h = 0; h < H; ++h)
    for (i = 0; i < SQ; ++i)
      for (d = 0; d < D; ++d) {
        double o = 0;
        for (j = 0; j < SK; ++j) {
          const float entry = probs[(h * SQ + i) * SK + j];
          if (signbit(entry)) ++negatives;
          else o += entry / (1.0 - p) * v[(j * H + h) * D + d];
        }
        worst_decoded = fmax(worst_decoded, fabs(first[(i * H + h) * D + d] - o));
      }
  CHECK(worst_decoded <= kTolerance, "out from attn_probs: error %g", worst_decoded);
  CHECK(negatives > 0 && negatives < H * SQ * SK * D, "dropout p = 0.5 dropped %d of %d", negatives / D, H * SQ * SK);
  options.dropout_p = 1.0f;
  CHECK(cuflash_attention_forward(&args, &options, NULL) == CUFLASH_INVALID_ARGUMENT &&
            strstr(cuflash_last_error_message(), "dropout_p") != NULL,
        "dropout_p = 1: '%s'", cuflash_last_error_message());

  free(q), free(k), free(v), free(out), free(lse), free(dout), free(dq), free(dk), free(dv), free(first), free(probs);
}

static void* failing_call(void* message_out) {
  cuflash_forward_args args;
  memset(&args, 0, sizeof args);
  cuflash_attention_forward(&args, NULL, NULL); /* q not given */
  strncpy((char*)message_out, cuflash_last_error_message(), 255);
  return NULL;
}

static void test_errors(void) {
  enum { B = 1, S = 4, D = 8 };
  const int64_t q_shape[4] = {B, S, 4, D}, kv_shape[4] = {B, S, 3, D}, six[6] = {1, 1, 1, 1, 1, 1};
  float *q = random_floats(B * S * 4 * D), *k = random_floats(B * S * 3 * D), *v = random_floats(B * S * 3 * D);
  float* out = filled_floats(B * S * 4 * D, NAN);
  cuflash_forward_args args;
  cuflash_options options;
  cuflash_tensor too_big = cuflash_make_tensor(q, CUFLASH_F32, 6, six, CUFLASH_DEVICE_HOST, 0);
  cuflash_status status;
  char thread_message[256] = {0};
  pthread_t thread;
  int untouched = 1, i;

  memset(&args, 0, sizeof args);
  args.q = host_tensor(q, CUFLASH_F32, 4, q_shape);
  args.k = host_tensor(k, CUFLASH_F32, 4, kv_shape);
  args.v = host_tensor(v, CUFLASH_F32, 4, kv_shape);
  args.out = host_tensor(out, CUFLASH_F32, 4, q_shape);
  status = cuflash_attention_forward(&args, NULL, NULL);
  CHECK(status == CUFLASH_INVALID_ARGUMENT, "GQA 4 over 3: got %s", cuflash_status_name(status));
  CHECK(strstr(cuflash_last_error_message(), "heads_kv") != NULL, "message: '%s'", cuflash_last_error_message());
  for (i = 0; i < B * S * 4 * D; ++i) untouched &= isnan(out[i]) != 0;
  CHECK(untouched, "a failed call wrote to out");

  /* The message is per thread: a failure elsewhere leaves this thread's own. */
  pthread_create(&thread, NULL, failing_call, thread_message);
  pthread_join(thread, NULL);
  CHECK(strstr(thread_message, "q") != NULL, "other thread's message: '%s'", thread_message);
  CHECK(strstr(cuflash_last_error_message(), "heads_kv") != NULL, "this thread's message changed: '%s'",
        cuflash_last_error_message());

  CHECK(cuflash_attention_forward(NULL, NULL, NULL) == CUFLASH_INVALID_ARGUMENT, "NULL args");
  CHECK(strstr(cuflash_last_error_message(), "args") != NULL, "message: '%s'", cuflash_last_error_message());

  CHECK(too_big.rank == -1, "rank 6 tensor: rank %d", too_big.rank);
  args.k = too_big;
  CHECK(cuflash_attention_forward(&args, NULL, NULL) == CUFLASH_INVALID_ARGUMENT, "rank 6");
  CHECK(strstr(cuflash_last_error_message(), "k: rank") != NULL, "message: '%s'", cuflash_last_error_message());

  args.k = host_tensor(k, 17, 4, kv_shape);
  CHECK(cuflash_attention_forward(&args, NULL, NULL) == CUFLASH_INVALID_ARGUMENT, "dtype 17");
  CHECK(strstr(cuflash_last_error_message(), "dtype") != NULL, "message: '%s'", cuflash_last_error_message());

  args.k = host_tensor(k, CUFLASH_F32, 4, kv_shape);
  cuflash_options_init(&options);
  options.backend = 42;
  CHECK(cuflash_attention_forward(&args, &options, NULL) == CUFLASH_INVALID_ARGUMENT, "backend 42");
  CHECK(strstr(cuflash_last_error_message(), "backend") != NULL, "message: '%s'", cuflash_last_error_message());

  /* Host memory on the cuda backend: wrong place (or not built, or no GPU). */
  cuflash_options_init(&options);
  options.backend = CUFLASH_BACKEND_CUDA;
  status = cuflash_attention_forward(&args, &options, NULL);
  CHECK(status == CUFLASH_INVALID_ARGUMENT || status == CUFLASH_UNSUPPORTED, "cuda backend on host memory: %s",
        cuflash_status_name(status));

  CHECK(strcmp(cuflash_status_name(CUFLASH_UNSUPPORTED), "unsupported") == 0, "status name");
  CHECK(strcmp(cuflash_status_name((cuflash_status)99), "unknown") == 0, "unknown status name");
  free(q), free(k), free(v), free(out);
}

/* Linear attention, elu+1 features, normalized, causal: B=1, S=5, Hq=2, Hk=1,
 * Dk=3, Dv=2, against the recurrence computed here; then decode steps from the
 * final state, a backward and an error naming the argument. */
static double elu_plus_one(double x) { return x > 0.0 ? x + 1.0 : exp(x); }

static void test_linear_attention(void) {
  enum { S = 5, HQ = 2, DK = 3, DV = 2 };
  const int64_t q_shape[4] = {1, S, HQ, DK}, k_shape[4] = {1, S, 1, DK}, v_shape[4] = {1, S, 1, DV};
  const int64_t out_shape[4] = {1, S, HQ, DV}, state_shape[4] = {1, 1, DK, DV}, sum_shape[3] = {1, 1, DK};
  const int64_t step_q[4] = {1, 1, HQ, DK}, step_k[4] = {1, 1, 1, DK}, step_v[4] = {1, 1, 1, DV};
  const int64_t step_out[4] = {1, 1, HQ, DV};
  float* q = random_floats(S * HQ * DK);
  float* k = random_floats(S * DK);
  float* v = random_floats(S * DV);
  float* out = filled_floats(S * HQ * DV, NAN);
  float* state = filled_floats(DK * DV, NAN);
  float* key_sum = filled_floats(DK, NAN);
  float* dq = filled_floats(S * HQ * DK, NAN);
  float* dk = filled_floats(S * DK, NAN);
  float* dv = filled_floats(S * DV, NAN);
  float step_out_data[HQ * DV];
  double s_ref[DK][DV] = {{0}}, z_ref[DK] = {0}, worst = 0.0;
  cuflash_linear_forward_args args;
  cuflash_linear_backward_args bwd;
  cuflash_linear_step_args step;
  cuflash_linear_options options;
  cuflash_status status;
  const double scale = 1.0 / sqrt((double)DK);
  int t, h, i, j;

  cuflash_linear_options_init(&options);
  CHECK(options.causal == 1 && options.feature_map == CUFLASH_FEATURE_IDENTITY && options.normalize == 0 &&
            options.has_scale == 0 && options.backend == CUFLASH_BACKEND_AUTO && options.check_index_contents == 1,
        "linear options_init defaults");
  options.feature_map = CUFLASH_FEATURE_ELU_PLUS_ONE;
  options.normalize = 1;
  memset(&args, 0, sizeof args);
  args.q = host_tensor(q, CUFLASH_F32, 4, q_shape);
  args.k = host_tensor(k, CUFLASH_F32, 4, k_shape);
  args.v = host_tensor(v, CUFLASH_F32, 4, v_shape);
  args.out = host_tensor(out, CUFLASH_F32, 4, out_shape);
  args.final_state = host_tensor(state, CUFLASH_F32, 4, state_shape);
  args.final_key_sum = host_tensor(key_sum, CUFLASH_F32, 3, sum_shape);
  status = cuflash_linear_attention_forward(&args, &options, NULL);
  CHECK(status == CUFLASH_OK, "linear forward: %s: %s", cuflash_status_name(status), cuflash_last_error_message());

  for (t = 0; t < S; ++t) {
    for (i = 0; i < DK; ++i) {
      const double fk = elu_plus_one(k[t * DK + i]);
      z_ref[i] += fk;
      for (j = 0; j < DV; ++j) s_ref[i][j] += fk * v[t * DV + j];
    }
    for (h = 0; h < HQ; ++h) {
      double num[DV] = {0}, den = 1e-10;
      for (i = 0; i < DK; ++i) {
        const double fq = scale * elu_plus_one(q[(t * HQ + h) * DK + i]);
        den += fq * z_ref[i];
        for (j = 0; j < DV; ++j) num[j] += fq * s_ref[i][j];
      }
      for (j = 0; j < DV; ++j) worst = fmax(worst, fabs(out[(t * HQ + h) * DV + j] - num[j] / den));
    }
  }
  for (i = 0; i < DK; ++i) {
    worst = fmax(worst, fabs(key_sum[i] - z_ref[i]));
    for (j = 0; j < DV; ++j) worst = fmax(worst, fabs(state[i * DV + j] - s_ref[i][j]));
  }
  CHECK(worst <= kTolerance, "linear forward max-abs error %g", worst);

  /* One decode step from the final state, in place: equal to the recurrence's next row. */
  memset(&step, 0, sizeof step);
  step.q = host_tensor(q, CUFLASH_F32, 4, step_q); /* reuse token 0's q, k, v as the next token */
  step.k = host_tensor(k, CUFLASH_F32, 4, step_k);
  step.v = host_tensor(v, CUFLASH_F32, 4, step_v);
  step.out = host_tensor(step_out_data, CUFLASH_F32, 4, step_out);
  step.state = args.final_state;
  step.key_sum = args.final_key_sum;
  status = cuflash_linear_attention_step(&step, &options, NULL);
  CHECK(status == CUFLASH_OK, "linear step: %s: %s", cuflash_status_name(status), cuflash_last_error_message());
  worst = 0.0;
  for (i = 0; i < DK; ++i) {
    const double fk = elu_plus_one(k[i]);
    z_ref[i] += fk;
    for (j = 0; j < DV; ++j) s_ref[i][j] += fk * v[j];
  }
  for (h = 0; h < HQ; ++h) {
    double num[DV] = {0}, den = 1e-10;
    for (i = 0; i < DK; ++i) {
      const double fq = scale * elu_plus_one(q[h * DK + i]);
      den += fq * z_ref[i];
      for (j = 0; j < DV; ++j) num[j] += fq * s_ref[i][j];
    }
    for (j = 0; j < DV; ++j) worst = fmax(worst, fabs(step_out_data[h * DV + j] - num[j] / den));
  }
  for (i = 0; i < DK; ++i) worst = fmax(worst, fabs(key_sum[i] - z_ref[i]));
  CHECK(worst <= kTolerance, "linear step max-abs error %g", worst);

  memset(&bwd, 0, sizeof bwd);
  bwd.q = args.q;
  bwd.k = args.k;
  bwd.v = args.v;
  bwd.dout = args.out; /* any values will do */
  bwd.dq = host_tensor(dq, CUFLASH_F32, 4, q_shape);
  bwd.dk = host_tensor(dk, CUFLASH_F32, 4, k_shape);
  bwd.dv = host_tensor(dv, CUFLASH_F32, 4, v_shape);
  status = cuflash_linear_attention_backward(&bwd, &options, NULL);
  CHECK(status == CUFLASH_OK, "linear backward: %s: %s", cuflash_status_name(status), cuflash_last_error_message());
  for (i = 0; i < S * DK; ++i) CHECK(!isnan(dk[i]), "dk[%d] not written", i);

  /* A key sum without normalize is refused by name; nothing is written. */
  options.normalize = 0;
  out[0] = 7.0f;
  status = cuflash_linear_attention_forward(&args, &options, NULL);
  CHECK(status == CUFLASH_INVALID_ARGUMENT, "key sum without normalize: %s", cuflash_status_name(status));
  CHECK(strncmp(cuflash_last_error_message(), "final_key_sum:", 14) == 0, "message: '%s'",
        cuflash_last_error_message());
  CHECK(out[0] == 7.0f, "out written by a failed call");
  options.feature_map = 9;
  CHECK(cuflash_linear_attention_forward(&args, &options, NULL) == CUFLASH_INVALID_ARGUMENT, "feature map 9");
  CHECK(strstr(cuflash_last_error_message(), "options.feature_map") != NULL, "message: '%s'",
        cuflash_last_error_message());
  free(q), free(k), free(v), free(out), free(state), free(key_sum), free(dq), free(dk), free(dv);
}

static void test_basics(void) {
  cuflash_options options;
  size_t bytes = 123;
  cuflash_forward_args args;
  const int64_t shape[4] = {1, 2, 1, 8};
  float q[16], out[16];
  int i;
  for (i = 0; i < 16; ++i) q[i] = 0.5f;
  CHECK(strlen(cuflash_version()) > 0, "version");
  CHECK(cuflash_backend_available(CUFLASH_BACKEND_CPU) == 1, "cpu backend available");
  CHECK(cuflash_backend_available(77) == 0, "unknown backend");
  cuflash_options_init(&options);
  CHECK(options.window_left == -1 && options.window_right == -1 && options.check_index_contents == 1 &&
            options.backend == CUFLASH_BACKEND_AUTO && options.has_softmax_scale == 0,
        "options_init defaults");
  memset(&args, 0, sizeof args);
  args.q = args.k = args.v = host_tensor(q, CUFLASH_F32, 4, shape);
  args.out = host_tensor(out, CUFLASH_F32, 4, shape);
  CHECK(cuflash_forward_workspace_size(&args, NULL, &bytes) == CUFLASH_OK && bytes == 0, "cpu workspace %zu: %s",
        bytes, cuflash_last_error_message());
}

/* The ring's C entry points: a null args or communicator is an error naming it
 * (without NCCL in the build: unsupported, naming NCCL), nothing crashes. */
static void test_ring_errors(void) {
  cuflash_ring_forward_args args;
  memset(&args, 0, sizeof(args));
  cuflash_status status = cuflash_ring_attention_forward(NULL, NULL, CUFLASH_RING_ZIGZAG, NULL, NULL);
  CHECK(status == CUFLASH_INVALID_ARGUMENT, "ring forward without args: %s", cuflash_status_name(status));
  CHECK(strstr(cuflash_last_error_message(), "args") != NULL, "ring message: '%s'", cuflash_last_error_message());
  status = cuflash_ring_attention_forward(&args, NULL, 7, NULL, NULL);
  CHECK(status != CUFLASH_OK, "ring forward with layout 7 succeeded");
  const char* message = cuflash_last_error_message();
  CHECK(strstr(message, "layout") != NULL || strstr(message, "NCCL") != NULL, "ring layout message: '%s'", message);
  status = cuflash_ring_attention_forward(&args, NULL, CUFLASH_RING_ZIGZAG, NULL, NULL);
  message = cuflash_last_error_message();
  if (cuflash_ring_attention_available()) {
    CHECK(status == CUFLASH_INVALID_ARGUMENT && strstr(message, "comm") != NULL, "ring without comm: '%s'", message);
  } else {
    CHECK(status == CUFLASH_UNSUPPORTED && strstr(message, "NCCL") != NULL, "ring without NCCL: '%s'", message);
  }
}

int main(void) {
  test_basics();
  test_dense_forward_backward();
  test_varlen();
  test_paged_kvcache_append();
  test_kvcache_leftpad_rotary();
  test_merge_states();
  test_empty_tensors();
  test_sinks_and_dropout();
  test_errors();
  test_linear_attention();
  test_ring_errors();
  printf("%d passed, %d failed\n", checks_passed, checks_failed);
  return checks_failed == 0 ? 0 : 1;
}
