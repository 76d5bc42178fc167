// Options shared by every attention call: the score modifiers (scale, masks,
// softcap) and where the call runs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

namespace cuflash {

enum class Backend {
  automatic,  // "auto": the fastest backend that supports the call
  cpu,        // exact reference, host memory
  cuda,       // cuflash's own kernels
  cudnn,      // NVIDIA cuDNN fused attention
};

const char* backend_name(Backend backend);

struct AttentionOptions {
  // Defaults to 1/sqrt(head_dim).
  std::optional<float> softmax_scale;
  // Query i may see key j only if j <= i + kv_len - q_len (bottom-right
  // aligned). Implies window_right = 0, as in flash-attn.
  bool causal = false;
  // Key j is visible to query i if
  //   i + kv_len - q_len - window_left <= j <= i + kv_len - q_len + window_right;
  // -1 leaves that side unbounded.
  int window_left = -1;
  int window_right = -1;
  // Where the diagonal lies: key j is aligned with query i when
  // j = i + diagonal_offset, in every sequence. It replaces kv_len - q_len
  // (the bottom-right default) in the causal and window masks above and in
  // ALiBi's |i + offset - j|. Ring attention's steps pass the difference of
  // the global positions of their first query and first key; |offset| <= 2^30.
  // Not with a KV cache; the cudnn backend refuses it.
  std::optional<std::int64_t> diagonal_offset;
  // score = softcap * tanh(score / softcap); 0 turns it off.
  float softcap = 0.0f;
  // Dropout on the normalized probabilities (flash-attn's semantics): each
  // p_ij is kept with probability 1 - dropout_p and scaled by 1/(1 - dropout_p),
  // out = (mask * P / (1 - dropout_p)) V; lse is not affected. 0 = off, < 1.
  // The mask is a function of (dropout_seed, dropout_offset, b, h, i, j)
  // (src/core/philox.hpp, docs/semantics.md): a backward given the forward's
  // seed and offset drops the same entries, and no mask is stored.
  float dropout_p = 0.0f;
  std::uint64_t dropout_seed = 0;
  std::uint64_t dropout_offset = 0;
  // Backward only: results bitwise identical from run to run.
  bool deterministic = false;
  // Index tensors (cu_seqlens, seqlens_k, block_table) that live on a GPU are
  // copied to the host to check their contents, which waits on the stream.
  // Hot inference loops whose indices are known good may turn this off.
  bool check_index_contents = true;
  Backend backend = Backend::automatic;
};

// Scratch memory on demand, from the caller's allocator (a framework's caching
// allocator, say), for calls that give no workspace: a GPU backend asks once
// per call for the bytes it needs, on the call's stream, and hands the block
// back with `release` once its kernels are enqueued on that stream (so the
// allocator may reuse it in stream order, as caching allocators do). allocate
// returns nullptr when it cannot; the call then fails (cuda_error, "out of memory").
struct WorkspaceAllocator {
  void* (*allocate)(std::size_t bytes, void* stream, void* state) = nullptr;
  void (*release)(void* pointer, void* stream, void* state) = nullptr;
  void* state = nullptr;

  bool given() const { return allocate != nullptr; }
};

// Where and with what scratch memory a call runs: `workspace` if given (at
// least the *_workspace_size bytes), else `allocator` if given, else
// stream-ordered cudaMallocAsync/cudaFreeAsync.
struct RunContext {
  void* stream = nullptr;  // cudaStream_t for GPU backends; nullptr = default stream
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  WorkspaceAllocator allocator;
};

}  // namespace cuflash
