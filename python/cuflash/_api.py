"""cuflash's own Python calls: every option of the C++ API, any framework.

Arguments are checked first (``_args``). torch tensors then take the eager
path (autograd included) or, under torch.compile and for tensor subclasses,
the operators of ``_torch_ops``; numpy, CuPy, JAX and other DLPack arrays go
through ``_frameworks``, which allocates their outputs. The eager path is
``_torch_ext`` (one call of the C++ operators, a C++ autograd node) when the
package has the torch operators in C++, else ``_torch_call`` (the module
directly, a Python autograd.Function); both take the same arguments.
"""

from . import _args, _ext
from ._args import InvalidArgumentError
from ._frameworks import Space

try:  # torch is optional; with it, torch tensors are differentiable and compile.
    import torch as _torch
except ImportError:  # pragma: no cover - depends on the environment
    _torch = None

if _torch is not None:
    from . import _torch_call, _torch_ext, _torch_ops

    _torch_eager = _torch_ext if _torch_ext.LOADED else _torch_call

    _Tensor = _torch.Tensor
    _is_compiling = _torch.compiler.is_compiling
    _args.register_tensor_type(_Tensor)
    _args.register_torch(_torch)
else:  # pragma: no cover
    _torch_call = _torch_ext = _torch_ops = _torch_eager = _Tensor = _is_compiling = None

__all__ = ["attention", "attention_backward", "merge_states", "backend_available", "set_index_checks"]

# Default of check_index_contents: copy GPU index tensors (cu_seqlens, cache
# lengths, block tables) to the host to check them. That waits on the stream;
# hot loops with known-good indices turn it off (a CUDA-graph capture skips
# it on its own: see _torch_call).
_check_index_contents = True


def set_index_checks(enabled):
    """Sets the default of ``check_index_contents`` for every later call."""
    global _check_index_contents
    _check_index_contents = bool(enabled)


def backend_available(backend):
    """True when ``backend`` ('auto', 'cpu', 'cuda', 'cudnn') is built in and usable here now."""
    return _ext.backend_available(_args.backend(backend))


def _is_torch(x):
    return _Tensor is not None and isinstance(x, _Tensor)


def _eager(q):
    """Plain torch tensors outside dynamo tracing take the direct path; the rest the custom ops."""
    return type(q) is _Tensor and not _is_compiling()


def _dropout_p(dropout_p):
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)) and not hasattr(dropout_p, "__float__"):
        raise InvalidArgumentError(f"dropout_p: expected a number, got {type(dropout_p).__name__}")
    return float(dropout_p)


def _forward(q, k, v, *, alibi_slopes=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0,
             max_seqlen_k=0, seqlens_k=None, block_table=None, k_new=None, v_new=None, softmax_scale=None,
             causal=False, window=(-1, -1), softcap=0.0, deterministic=False, check_index_contents=None,
             backend="auto", sinks=None, dropout_p=0.0, dropout_seed=None, dropout_offset=None, attn_probs=False,
             cache_leftpad=None, rotary_cos=None, rotary_sin=None, rotary_interleaved=False):
    """(out, lse) in q's framework, or (out, lse, attn_probs) with attn_probs. The shared path of
    attention() and the flash-attn functions."""
    check = _check_index_contents if check_index_contents is None else bool(check_index_contents)
    tensor = _Tensor
    dropout_p = _dropout_p(dropout_p)
    plain = (sinks is None and not dropout_p and not attn_probs and cache_leftpad is None and rotary_cos is None
             and rotary_sin is None)
    if (plain and tensor is not None and type(q) is tensor and type(k) is tensor and type(v) is tensor and q.dim() == 4
            and alibi_slopes is None and cu_seqlens_q is None and cu_seqlens_k is None and seqlens_k is None
            and block_table is None and k_new is None and v_new is None and not _is_compiling()):
        # The common call, a dense batch of plain eager tensors: nothing is left for _args to check
        # that the library does not (shapes, dtypes, devices), so it goes straight to the call.
        return _torch_eager.attention_eager(q, k, v, (softmax_scale, causal, window[0], window[1], softcap,
                                                      deterministic, check, backend))
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    if varlen:
        _args.ranked(q, "q", (3,), "varlen: [total_q, heads_q, head_dim]")
        max_seqlen_q = _args.integer(max_seqlen_q, "max_seqlen_q")
        max_seqlen_k = _args.integer(max_seqlen_k, "max_seqlen_k")
    else:
        _args.ranked(q, "q", (4,), "[batch, seqlen_q, heads_q, head_dim]")
    _args.array(k, "k")
    _args.array(v, "v")
    appends = k_new is not None or v_new is not None
    if appends and (k_new is None or v_new is None):
        raise InvalidArgumentError("k_new and v_new: give both or neither")
    _args.optional_array(sinks, "sinks")
    _args.optional_array(cache_leftpad, "cache_leftpad")
    rotary = rotary_cos is not None or rotary_sin is not None
    if rotary:
        _args.optional_array(rotary_cos, "rotary_cos")
        _args.optional_array(rotary_sin, "rotary_sin")
        if not appends:  # the calls without an append (torch's fwd operator) take no rotary tables
            raise InvalidArgumentError("rotary_cos/rotary_sin: need k_new/v_new (q and the appended keys are rotated "
                                       "at their cache positions, as in flash-attn)")
    if appends and dropout_p:
        raise InvalidArgumentError("dropout_p: a KV-cache call that appends k_new/v_new is inference (no dropout, as "
                                   "in flash-attn's flash_attn_with_kvcache)")
    if _is_torch(q):
        extras = dict(alibi_slopes=alibi_slopes, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                      max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, seqlens_k=seqlens_k,
                      block_table=block_table, cache_leftpad=cache_leftpad)
        for name in ("alibi_slopes", "cu_seqlens_q", "cu_seqlens_k", "seqlens_k", "block_table"):
            _args.optional_array(extras[name], name)
        key = (softmax_scale, bool(causal), window[0], window[1], softcap, bool(deterministic), check, backend,
               dropout_p)
        if appends:
            if seqlens_k is None:
                raise InvalidArgumentError("seqlens_k: required when appending k_new/v_new")
            cache_options = dict(cache_leftpad=cache_leftpad, rotary_cos=rotary_cos, rotary_sin=rotary_sin,
                                 rotary_interleaved=bool(rotary_interleaved))
            if _eager(q) or attn_probs:
                return _torch_eager.append_and_attend(q, k, v, k_new, v_new, key, alibi_slopes=alibi_slopes,
                                                      seqlens_k=seqlens_k, block_table=block_table, sinks=sinks,
                                                      attn_probs=attn_probs, **cache_options)
            scale, causal, left, right, softcap, _, check, backend, _ = _args.option_values(*key)
            return _torch_ops.fwd_kvcache(q, k, v, k_new, v_new, seqlens_k, block_table, alibi_slopes, scale, causal,
                                          left, right, softcap, check, backend, sinks, **cache_options)
        if _eager(q):
            rng = _args.dropout_rng(dropout_p, dropout_seed, dropout_offset, q)
            return _torch_eager.attention_eager(q, k, v, key, sinks=sinks, rng=rng, attn_probs=attn_probs, **extras)
        if attn_probs:
            raise NotImplementedError("return_attn_probs / attn_probs: a debug output of eager calls, not traced "
                                      "by torch.compile")
        rng_tensor = None
        if dropout_p:
            # A tensor, drawn in the traced graph (torch's generator) or holding the explicit seed.
            if dropout_seed is None:
                rng_tensor = _torch.randint(0, 2**63 - 1, (2,), dtype=_torch.int64)
            else:
                rng_tensor = _torch_call.rng_tensor(_args.dropout_rng(dropout_p, dropout_seed, dropout_offset, q))
        # Traced (torch.compile): the options are checked here, at trace time (plain Python, no graph break).
        scale, causal, left, right, softcap, deterministic, check, backend, dropout_p = _args.option_values(*key)
        return _torch_ops.fwd(q, k, v, alibi_slopes, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                              seqlens_k, block_table, scale, causal, left, right, softcap, deterministic, check,
                              backend, sinks, dropout_p, rng_tensor, cache_leftpad)
    for name, x in (("alibi_slopes", alibi_slopes), ("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k),
                    ("seqlens_k", seqlens_k), ("block_table", block_table), ("k_new", k_new), ("v_new", v_new)):
        _args.optional_array(x, name)
    space = Space(q)
    if appends:
        if space.immutable:
            raise NotImplementedError(
                "appending k/v into a KV cache writes into it, and JAX arrays are immutable: "
                "update the cache with JAX and call without k/v"
            )
        _args.writable(k, "k_cache")
        _args.writable(v, "v_cache")
    options = _args.options(softmax_scale, causal, window[0], window[1], softcap, deterministic, check, backend,
                            dropout_p)
    seed, offset = _args.dropout_rng(dropout_p, dropout_seed, dropout_offset, q)
    make = space.zeros if varlen else space.empty
    out = make(q.shape)
    lse = make((q.shape[1], q.shape[0]) if varlen else (q.shape[0], q.shape[2], q.shape[1]), "float32")
    probs = None
    if attn_probs:
        probs = space.empty(_args.attn_probs_shape(q, k, cu_seqlens_q, max_seqlen_q, max_seqlen_k, seqlens_k,
                                                   block_table), "float32")
    space.before(q, k, v, alibi_slopes, cu_seqlens_q, cu_seqlens_k, seqlens_k, block_table, k_new, v_new, sinks,
                 cache_leftpad, rotary_cos, rotary_sin)
    _ext.forward(q, k, v, out, lse, options, space.stream, None, alibi_slopes, cu_seqlens_q, cu_seqlens_k,
                 max_seqlen_q, max_seqlen_k, seqlens_k, block_table, k_new, v_new, sinks, probs, seed, offset,
                 cache_leftpad, rotary_cos, rotary_sin, bool(rotary_interleaved))
    space.after()
    if probs is not None:
        return space.finish(out), space.finish(lse), space.finish(probs)
    return space.finish(out), space.finish(lse)


def attention(q, k, v, *, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
              alibi_slopes=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
              seqlens_k=None, block_table=None, k_new=None, v_new=None, deterministic=False,
              check_index_contents=None, backend="auto", return_lse=False, sinks=None, dropout_p=0.0,
              dropout_seed=None, dropout_offset=None, return_attn_probs=False, cache_leftpad=None, rotary_cos=None,
              rotary_sin=None, rotary_interleaved=False):
    """Exact softmax attention: ``cuflash::attention_forward`` with every option.

    Layouts (strides are free but for the last dimension, which must be contiguous):

    - dense: q ``[B, Sq, Hq, D]``, k/v ``[B, Sk, Hk, D]``;
    - varlen: q ``[Tq, Hq, D]``, k/v ``[Tk, Hk, D]`` with ``cu_seqlens_q/k`` int32
      ``[B+1]`` and ``max_seqlen_q/k``;
    - KV cache: k/v are the cache, ``[B, capacity, Hk, D]`` or paged
      ``[num_pages, page_size, Hk, D]`` with ``block_table`` int32 ``[B, max_pages]``;
      ``seqlens_k`` int32 ``[B]`` holds how many keys each sequence has cached;
      ``k_new``/``v_new`` ``[B, new_len, Hk, D]`` are written into the cache at
      ``seqlens_k[b]..`` first (the cache is updated in place);
      ``cache_leftpad`` int32 ``[B]`` (contiguous or paged caches): sequence b's keys are
      cache rows ``cache_leftpad[b] <= j < seqlens_k[b] + new_len`` (masks and
      ALiBi align as without it); ``rotary_cos``/``rotary_sin``
      ``[seqlen_ro, rotary_dim / 2]`` (q's dtype, with ``k_new``): q and the new
      keys are rotated, GPT-NeoX halves or, with ``rotary_interleaved``, GPT-J
      pairs; key n at ``seqlens_k[b] + n``, query i at ``seqlens_k[b] + i`` when
      causal or windowed, else at ``seqlens_k[b]`` (flash-attn's rule).
    - varlen with keys in pages (paged prefill, forward only): q and
      ``cu_seqlens_q/k`` as varlen, k/v a paged cache with ``block_table``
      (no ``seqlens_k``): ``cu_seqlens_k`` counts each sequence's keys, key j of
      sequence b in page ``block_table[b][j // page_size]``.

    Options: ``softmax_scale`` (default ``1/sqrt(D)``), ``causal`` (bottom-right
    aligned), ``window_size=(left, right)`` (-1 unbounded), ``softcap`` (0 off),
    ``alibi_slopes`` float32 ``[Hq]`` or ``[B, Hq]``, ``deterministic`` (for the
    backward of torch autograd), ``check_index_contents`` (default: see
    ``set_index_checks``), ``backend`` ('auto', 'cpu', 'cuda', 'cudnn').

    Attention sinks (gpt-oss): ``sinks`` float32 ``[Hq]``, one logit per query head
    in every row's softmax denominator, with no value (differentiable with torch).
    Dropout (flash-attn's): ``dropout_p`` drops normalized probabilities, scaling
    the kept ones by ``1/(1 - dropout_p)``; the mask is a function of
    ``(dropout_seed, dropout_offset, b, h, i, j)`` (docs/semantics.md). Without
    ``dropout_seed`` both are drawn from torch's default generator for torch
    tensors (``torch.manual_seed`` reproduces a run), else from numpy's global
    one; the torch backward redraws the same mask. Sinks and dropout run on
    backends cpu and cuda (cudnn refuses them, and backend cuda refuses dropout
    with a KV cache: NotImplementedError).

    Returns ``out`` (like q), or ``(out, lse)`` with ``return_lse`` (float32,
    natural log; ``[B, Hq, Sq]``, varlen ``[Hq, Tq]``), in q's framework; with
    ``return_attn_probs`` also the debug probabilities ``attn_probs`` float32
    ``[B, Hq, max_seqlen_q, max_seqlen_k]`` (dropped entries negated; flash-attn's
    S_dmask; backends cpu, and cuda for dense and varlen calls). With torch tensors the call is differentiable (but
    for appends) and compiles.
    """
    if cu_seqlens_q is not None or cu_seqlens_k is not None:
        if max_seqlen_q is None or max_seqlen_k is None:
            raise InvalidArgumentError("max_seqlen_q and max_seqlen_k: required with cu_seqlens_q/cu_seqlens_k")
    result = _forward(q, k, v, alibi_slopes=alibi_slopes, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                      max_seqlen_q=max_seqlen_q or 0, max_seqlen_k=max_seqlen_k or 0, seqlens_k=seqlens_k,
                      block_table=block_table, k_new=k_new, v_new=v_new, softmax_scale=softmax_scale,
                      causal=causal, window=_args.window(window_size), softcap=softcap, deterministic=deterministic,
                      check_index_contents=check_index_contents, backend=backend, sinks=sinks, dropout_p=dropout_p,
                      dropout_seed=dropout_seed, dropout_offset=dropout_offset, attn_probs=return_attn_probs,
                      cache_leftpad=cache_leftpad, rotary_cos=rotary_cos, rotary_sin=rotary_sin,
                      rotary_interleaved=rotary_interleaved)
    if return_attn_probs:
        return result if return_lse else (result[0], result[2])
    return result if return_lse else result[0]


def attention_backward(dout, q, k, v, out, lse, *, softmax_scale=None, causal=False, window_size=(-1, -1),
                       softcap=0.0, alibi_slopes=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
                       max_seqlen_k=None, seqlens_k=None, block_table=None, deterministic=False,
                       check_index_contents=None, backend="auto", sinks=None, dropout_p=0.0, dropout_seed=0,
                       dropout_offset=0, cache_leftpad=None):
    """``cuflash::attention_backward``: ``(dq, dk, dv)`` from the forward's out and lse.

    Same layouts and options as :func:`attention` (no appends, so no rotary embedding;
    no block_table with cu_seqlens: a varlen call over keys in pages has no backward); dq is like q,
    dk/dv like k/v (for GQA summed over each group of query heads). With
    ``sinks``: ``(dq, dk, dv, dsinks)``. With dropout, give the forward's
    ``dropout_p``, ``dropout_seed`` and ``dropout_offset``: the mask is redrawn.
    """
    dropout_p = _dropout_p(dropout_p)
    rng = _args.dropout_rng(dropout_p, dropout_seed or 0, dropout_offset or 0, q)
    check = _check_index_contents if check_index_contents is None else bool(check_index_contents)
    left, right = _args.window(window_size)
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    if varlen:
        _args.ranked(q, "q", (3,), "varlen: [total_q, heads_q, head_dim]")
    else:
        _args.ranked(q, "q", (4,), "[batch, seqlen_q, heads_q, head_dim]")
    max_q = 0 if max_seqlen_q is None else _args.integer(max_seqlen_q, "max_seqlen_q")
    max_k = 0 if max_seqlen_k is None else _args.integer(max_seqlen_k, "max_seqlen_k")
    for name, x in (("dout", dout), ("k", k), ("v", v), ("out", out), ("lse", lse)):
        _args.array(x, name)
    for name, x in (("alibi_slopes", alibi_slopes), ("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k),
                    ("seqlens_k", seqlens_k), ("block_table", block_table), ("sinks", sinks),
                    ("cache_leftpad", cache_leftpad)):
        _args.optional_array(x, name)
    if _is_torch(q):
        key = (softmax_scale, bool(causal), left, right, softcap, bool(deterministic), check, backend, dropout_p)
        if _eager(q):
            return _torch_eager.backward(dout, q, k, v, out, lse, key, alibi_slopes, cu_seqlens_q, cu_seqlens_k,
                                         max_q, max_k, seqlens_k, block_table, sinks=sinks, rng=rng,
                                         want_dsinks=sinks is not None, cache_leftpad=cache_leftpad)
        scale, causal, left, right, softcap, deterministic, check, backend, dropout_p = _args.option_values(*key)
        grads = _torch_ops.bwd(dout, q, k, v, out, lse, alibi_slopes, cu_seqlens_q, cu_seqlens_k, max_q, max_k,
                               seqlens_k, block_table, scale, causal, left, right, softcap, deterministic, check,
                               backend, sinks, dropout_p, _torch_call.rng_tensor(rng), cache_leftpad)
        return grads if sinks is not None else grads[:3]
    options = _args.options(softmax_scale, causal, left, right, softcap, deterministic, check, backend, dropout_p)
    space = Space(q)
    dq, dk, dv = space.empty(q.shape), space.empty(k.shape), space.empty(v.shape)
    dsinks = None if sinks is None else space.empty(sinks.shape, "float32")
    space.before(dout, q, k, v, out, lse, alibi_slopes, cu_seqlens_q, cu_seqlens_k, seqlens_k, block_table, sinks,
                 cache_leftpad)
    _ext.backward(dout, q, k, v, out, lse, dq, dk, dv, options, space.stream, None, alibi_slopes, cu_seqlens_q,
                  cu_seqlens_k, max_q, max_k, seqlens_k, block_table, sinks, dsinks, rng[0], rng[1], cache_leftpad)
    space.after()
    grads = space.finish(dq), space.finish(dk), space.finish(dv)
    return grads if dsinks is None else grads + (space.finish(dsinks),)


def merge_states(out_a, lse_a, out_b, lse_b, *, backend="auto"):
    """Exact combination of two partial attentions over disjoint keys: ``(out, lse)``.

    ``out_*`` ``[B, S, H, D]``, ``lse_*`` float32 ``[B, H, S]``;
    ``lse = log(exp(lse_a) + exp(lse_b))``, ``out = exp(lse_a - lse) out_a + exp(lse_b - lse) out_b``.
    """
    _args.backend(backend)
    for name, x in (("out_a", out_a), ("lse_a", lse_a), ("out_b", out_b), ("lse_b", lse_b)):
        _args.array(x, name)
    if _is_torch(out_a):
        if _eager(out_a):
            return _torch_eager.merge_states(out_a, lse_a, out_b, lse_b, backend)
        return _torch_ops.merge_states(out_a, lse_a, out_b, lse_b, backend)
    space = Space(out_a, "out_a")
    out, lse = space.empty(out_a.shape), space.empty(lse_a.shape, "float32")
    space.before(out_a, lse_a, out_b, lse_b)
    _ext.merge_states(out_a, lse_a, out_b, lse_b, out, lse, backend, space.stream)
    space.after()
    return space.finish(out), space.finish(lse)
