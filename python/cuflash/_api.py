"""cuflash's own Python calls: every option of the C++ API, any framework.

torch tensors go through the custom ops of ``_torch_ops`` (autograd,
torch.compile); numpy, CuPy, JAX and other DLPack arrays through ``_frameworks``.
"""

from . import _ext
from ._frameworks import Space

try:  # torch is optional; with it, torch tensors are differentiable and compile.
    import torch as _torch
except ImportError:  # pragma: no cover - depends on the environment
    _torch = None

if _torch is not None:
    from . import _torch_ops
else:  # pragma: no cover
    _torch_ops = None

__all__ = ["attention", "attention_backward", "merge_states", "backend_available", "set_index_checks"]

_BACKENDS = ("auto", "cpu", "cuda", "cudnn")

# Default of check_index_contents: copy GPU index tensors (cu_seqlens, cache
# lengths, block tables) to the host to check them. That waits on the stream;
# hot loops (and CUDA graph capture) with known-good indices turn it off.
_check_index_contents = True


def set_index_checks(enabled):
    """Sets the default of ``check_index_contents`` for every later call."""
    global _check_index_contents
    _check_index_contents = bool(enabled)


def backend_available(backend):
    """True when ``backend`` ('auto', 'cpu', 'cuda', 'cudnn') is built in and usable here now."""
    return _ext.backend_available(backend)


def _is_torch(x):
    return _torch is not None and isinstance(x, _torch.Tensor)


def _window(window_size):
    if window_size is None:
        return -1, -1
    left, right = window_size
    return int(left), int(right)


def _check_backend(backend):
    if backend not in _BACKENDS:
        raise ValueError(f"backend: expected one of {', '.join(map(repr, _BACKENDS))}, got {backend!r}")


def _scale(softmax_scale):
    return None if softmax_scale is None else float(softmax_scale)


def _forward(q, k, v, *, alibi_slopes=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0,
             max_seqlen_k=0, seqlens_k=None, block_table=None, k_new=None, v_new=None, softmax_scale=None,
             causal=False, window=(-1, -1), softcap=0.0, deterministic=False, check_index_contents=None,
             backend="auto"):
    """(out, lse) in q's framework. The shared path of attention() and the flash-attn functions."""
    check = _check_index_contents if check_index_contents is None else bool(check_index_contents)
    if _is_torch(q):
        if k_new is not None or v_new is not None:
            if k_new is None or v_new is None:
                raise ValueError("k_new and v_new: give both or neither")
            return _torch_ops.fwd_kvcache(q, k, v, k_new, v_new, seqlens_k, block_table, alibi_slopes,
                                          _scale(softmax_scale), bool(causal), window[0], window[1],
                                          float(softcap), check, backend)
        return _torch_ops.fwd(q, k, v, alibi_slopes, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q),
                              int(max_seqlen_k), seqlens_k, block_table, _scale(softmax_scale), bool(causal),
                              window[0], window[1], float(softcap), bool(deterministic), check, backend)
    space = Space(q)
    if (k_new is not None) and space.immutable:
        raise NotImplementedError(
            "appending k/v into a KV cache writes into it, and JAX arrays are immutable: "
            "update the cache with JAX and call without k/v"
        )
    varlen = cu_seqlens_q is not None
    make = space.zeros if varlen else space.empty
    out = make(q.shape)
    lse = make((q.shape[1], q.shape[0]) if varlen else (q.shape[0], q.shape[2], q.shape[1]), "float32")
    space.before(q, k, v, alibi_slopes, cu_seqlens_q, cu_seqlens_k, seqlens_k, block_table, k_new, v_new)
    _ext.forward(q, k, v, out, lse, alibi_slopes, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q),
                 int(max_seqlen_k), seqlens_k, block_table, k_new, v_new, _scale(softmax_scale), bool(causal),
                 window[0], window[1], float(softcap), check, backend, space.stream)
    space.after()
    return space.finish(out), space.finish(lse)


def attention(q, k, v, *, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
              alibi_slopes=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
              seqlens_k=None, block_table=None, k_new=None, v_new=None, deterministic=False,
              check_index_contents=None, backend="auto", return_lse=False):
    """Exact softmax attention: ``cuflash::attention_forward`` with every option.

    Layouts (strides are free but for the last dimension, which must be contiguous):

    - dense: q ``[B, Sq, Hq, D]``, k/v ``[B, Sk, Hk, D]``;
    - varlen: q ``[Tq, Hq, D]``, k/v ``[Tk, Hk, D]`` with ``cu_seqlens_q/k`` int32
      ``[B+1]`` and ``max_seqlen_q/k``;
    - KV cache: k/v are the cache, ``[B, capacity, Hk, D]`` or paged
      ``[num_pages, page_size, Hk, D]`` with ``block_table`` int32 ``[B, max_pages]``;
      ``seqlens_k`` int32 ``[B]`` holds how many keys each sequence has cached;
      ``k_new``/``v_new`` ``[B, new_len, Hk, D]`` are written into the cache at
      ``seqlens_k[b]..`` first (the cache is updated in place).

    Options: ``softmax_scale`` (default ``1/sqrt(D)``), ``causal`` (bottom-right
    aligned), ``window_size=(left, right)`` (-1 unbounded), ``softcap`` (0 off),
    ``alibi_slopes`` float32 ``[Hq]`` or ``[B, Hq]``, ``deterministic`` (for the
    backward of torch autograd), ``check_index_contents`` (default: see
    ``set_index_checks``), ``backend`` ('auto', 'cpu', 'cuda', 'cudnn').

    Returns ``out`` (like q), or ``(out, lse)`` with ``return_lse`` (float32,
    natural log; ``[B, Hq, Sq]``, varlen ``[Hq, Tq]``), in q's framework. With
    torch tensors the call is differentiable (but for appends) and compiles.
    """
    _check_backend(backend)
    if cu_seqlens_q is not None or cu_seqlens_k is not None:
        if max_seqlen_q is None or max_seqlen_k is None:
            raise ValueError("max_seqlen_q and max_seqlen_k: required with cu_seqlens_q/cu_seqlens_k")
    out, lse = _forward(q, k, v, alibi_slopes=alibi_slopes, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                        max_seqlen_q=max_seqlen_q or 0, max_seqlen_k=max_seqlen_k or 0, seqlens_k=seqlens_k,
                        block_table=block_table, k_new=k_new, v_new=v_new, softmax_scale=softmax_scale,
                        causal=causal, window=_window(window_size), softcap=softcap, deterministic=deterministic,
                        check_index_contents=check_index_contents, backend=backend)
    return (out, lse) if return_lse else out


def attention_backward(dout, q, k, v, out, lse, *, softmax_scale=None, causal=False, window_size=(-1, -1),
                       softcap=0.0, alibi_slopes=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
                       max_seqlen_k=None, seqlens_k=None, block_table=None, deterministic=False,
                       check_index_contents=None, backend="auto"):
    """``cuflash::attention_backward``: ``(dq, dk, dv)`` from the forward's out and lse.

    Same layouts and options as :func:`attention` (no appends); dq is like q,
    dk/dv like k/v (for GQA summed over each group of query heads).
    """
    _check_backend(backend)
    check = _check_index_contents if check_index_contents is None else bool(check_index_contents)
    left, right = _window(window_size)
    max_q, max_k = int(max_seqlen_q or 0), int(max_seqlen_k or 0)
    if _is_torch(q):
        return _torch_ops.bwd(dout, q, k, v, out, lse, alibi_slopes, cu_seqlens_q, cu_seqlens_k, max_q, max_k,
                              seqlens_k, block_table, _scale(softmax_scale), bool(causal), left, right,
                              float(softcap), bool(deterministic), check, backend)
    space = Space(q)
    dq, dk, dv = space.empty(q.shape), space.empty(k.shape), space.empty(v.shape)
    space.before(dout, q, k, v, out, lse, alibi_slopes, cu_seqlens_q, cu_seqlens_k, seqlens_k, block_table)
    _ext.backward(dout, q, k, v, out, lse, dq, dk, dv, alibi_slopes, cu_seqlens_q, cu_seqlens_k, max_q, max_k,
                  seqlens_k, block_table, _scale(softmax_scale), bool(causal), left, right, float(softcap),
                  bool(deterministic), check, backend, space.stream)
    space.after()
    return space.finish(dq), space.finish(dk), space.finish(dv)


def merge_states(out_a, lse_a, out_b, lse_b, *, backend="auto"):
    """Exact combination of two partial attentions over disjoint keys: ``(out, lse)``.

    ``out_*`` ``[B, S, H, D]``, ``lse_*`` float32 ``[B, H, S]``;
    ``lse = log(exp(lse_a) + exp(lse_b))``, ``out = exp(lse_a - lse) out_a + exp(lse_b - lse) out_b``.
    """
    _check_backend(backend)
    if _is_torch(out_a):
        return _torch_ops.merge_states(out_a, lse_a, out_b, lse_b, backend)
    space = Space(out_a, "out_a")
    out, lse = space.empty(out_a.shape), space.empty(lse_a.shape, "float32")
    space.before(out_a, lse_a, out_b, lse_b)
    _ext.merge_states(out_a, lse_a, out_b, lse_b, out, lse, backend, space.stream)
    space.after()
    return space.finish(out), space.finish(lse)
