"""flash-attn 2.x's functions, names, arguments, defaults and return values.

``import cuflash as flash_attn`` (or ``from cuflash import flash_attn_func``)
in place of flash-attn. Dropout (``dropout_p > 0``, its mask drawn from
torch's default generator for torch tensors, numpy's otherwise), attention
sinks (``sinks=``, or flash-attn 3's name ``learnable_sink=``: float32
``(nheads,)``, differentiable) and ``return_attn_probs=True`` (``(out,
softmax_lse, S_dmask)``, S_dmask the probabilities with dropped entries
negated, also without dropout) run on backends cpu and cuda (dropout with a
KV cache on backend cpu only); cudnn refuses them (NotImplementedError naming
the feature). ``flash_attn_with_kvcache``'s ``cache_leftpad`` and
``rotary_cos``/``rotary_sin`` (q and the appended k rotated inside the call)
run on backends cpu and cuda too. ``flash_attn_varlen_func``'s
``block_table`` (paged prefill: packed queries over keys in a paged cache)
runs its forward on backends cpu and cuda; as in flash-attn it has no
backward (a gradient through it raises, naming ``block_table``).
``cache_batch_idx`` reads a contiguous cache as a paged view of itself;
``cache_leftpad`` works with it and, unlike flash-attn, with paged caches
(the leftpad counts key positions, which the block table maps to rows).
``num_splits`` is accepted and ignored (cuflash chooses).

Inputs are any DLPack tensors (torch, CuPy, JAX on a GPU; numpy on the CPU
backend); outputs come in the same framework. With torch the functions are
differentiable (except ``flash_attn_with_kvcache``, as in flash-attn) and
torch.compile traces them without graph breaks.
"""

from . import _args
from ._args import InvalidArgumentError
from ._api import _forward, _is_torch, _torch
from ._frameworks import Space

__all__ = [
    "flash_attn_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_kvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_with_kvcache",
]


def _sinks(sinks, learnable_sink):
    """flash-attn 3 calls the sinks learnable_sink; either name, not both."""
    if learnable_sink is not None:
        if sinks is not None:
            raise InvalidArgumentError("sinks and learnable_sink: the same argument under two names; give one")
        return learnable_sink
    return sinks


def _last_dim_contiguous(x):
    """x itself when its last dimension is contiguous, else a contiguous copy (as flash-attn does)."""
    if x is None:
        return None
    if _is_torch(x):
        return x if x.stride(-1) == 1 else x.contiguous()
    strides = getattr(x, "strides", None)  # numpy / CuPy: bytes
    if strides is not None and len(strides) and strides[-1] != x.itemsize and x.shape[-1] > 1:
        module = type(x).__module__.partition(".")[0]
        if module == "numpy":
            import numpy

            return numpy.ascontiguousarray(x)
        if module == "cupy":
            import cupy

            return cupy.ascontiguousarray(x)
    return x


def _attend(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
            return_attn_probs, sinks=None, **layout):
    q, k, v = _last_dim_contiguous(q), _last_dim_contiguous(k), _last_dim_contiguous(v)
    result = _forward(q, k, v, alibi_slopes=alibi_slopes, softmax_scale=softmax_scale, causal=causal,
                      window=(int(window_size[0]), int(window_size[1])), softcap=softcap,
                      deterministic=deterministic, sinks=sinks, dropout_p=dropout_p,
                      attn_probs=bool(return_attn_probs), **layout)
    return result if return_attn_probs else result[0]


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False, *, sinks=None,
                    learnable_sink=None):
    """Attention over q ``(batch, seqlen_q, nheads, headdim)``, k/v ``(batch, seqlen_k, nheads_k, headdim)``.

    nheads must be a multiple of nheads_k (MQA/GQA). ``causal`` is aligned to the
    bottom right when seqlen_q != seqlen_k; ``window_size=(left, right)``, -1
    unbounded; ``softcap`` > 0 caps scores at ``softcap * tanh(s / softcap)``;
    ``alibi_slopes`` float32 ``(nheads,)`` or ``(batch, nheads)``; ``sinks``
    (``learnable_sink``) float32 ``(nheads,)``; ``dropout_p`` on the
    probabilities. Returns out ``(batch, seqlen_q, nheads, headdim)``, or
    ``(out, softmax_lse, S_dmask)`` with ``return_attn_probs``.
    """
    return _attend(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                   return_attn_probs, _sinks(sinks, learnable_sink))


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                              softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False, *,
                              sinks=None, learnable_sink=None):
    """:func:`flash_attn_func` on qkv ``(batch, seqlen, 3, nheads, headdim)`` (views, no copies)."""
    return _attend(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], dropout_p, softmax_scale, causal, window_size,
                   softcap, alibi_slopes, deterministic, return_attn_probs, _sinks(sinks, learnable_sink))


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                             softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False, *,
                             sinks=None, learnable_sink=None):
    """:func:`flash_attn_func` on q and kv ``(batch, seqlen_k, 2, nheads_k, headdim)``."""
    return _attend(q, kv[:, :, 0], kv[:, :, 1], dropout_p, softmax_scale, causal, window_size, softcap,
                   alibi_slopes, deterministic, return_attn_probs, _sinks(sinks, learnable_sink))


def _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal,
            window_size, softcap, alibi_slopes, deterministic, return_attn_probs, block_table=None, sinks=None):
    return _attend(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                   return_attn_probs, sinks, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                   max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, block_table=block_table)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None, *, sinks=None,
                           learnable_sink=None):
    """Packed sequences: q ``(total_q, nheads, headdim)``, k/v ``(total_k, nheads_k, headdim)``.

    Sequence b is rows ``cu_seqlens[b]:cu_seqlens[b+1]`` (int32 ``(batch+1,)``);
    ``max_seqlen_q/k`` bound the lengths. Returns out ``(total_q, nheads, headdim)``,
    or ``(out, softmax_lse, S_dmask)`` with ``return_attn_probs`` (S_dmask
    ``(batch, nheads, max_seqlen_q, max_seqlen_k)``).

    With ``block_table`` int32 ``(batch, max_pages)`` the keys are in a paged
    cache: k/v ``(num_pages, page_size, nheads_k, headdim)``, sequence b's
    ``cu_seqlens_k[b+1] - cu_seqlens_k[b]`` keys in its pages
    ``block_table[b]`` (key j at page ``block_table[b][j // page_size]``, slot
    ``j % page_size``); forward only, as in flash-attn.
    """
    return _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
                   causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs, block_table,
                   _sinks(sinks, learnable_sink))


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None, causal=False,
                                     window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False, *, sinks=None, learnable_sink=None):
    """:func:`flash_attn_varlen_func` on qkv ``(total, 3, nheads, headdim)``."""
    return _varlen(qkv[:, 0], qkv[:, 1], qkv[:, 2], cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p,
                   softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs,
                   sinks=_sinks(sinks, learnable_sink))


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                                    softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False, return_attn_probs=False, *, sinks=None,
                                    learnable_sink=None):
    """:func:`flash_attn_varlen_func` on q and kv ``(total_k, 2, nheads_k, headdim)``."""
    return _varlen(q, kv[:, 0], kv[:, 1], cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                   softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs,
                   sinks=_sinks(sinks, learnable_sink))


def _int32_lengths(like, batch, value):
    """cache_seqlens given as an int: an int32 tensor of `batch` copies, beside the query."""
    if _is_torch(like):
        return _torch.full((batch,), int(value), dtype=_torch.int32, device=like.device)
    return Space(like).full_int32((batch,), int(value))


def _element_strides(x):
    if _is_torch(x):
        return x.stride()
    return tuple(stride // x.itemsize for stride in x.strides)


def _batch_idx_as_pages(k_cache, v_cache, block_table, cache_batch_idx):
    """The contiguous caches ``[cache_batch, capacity, Hk, D]`` read through cache_batch_idx, as paged
    views of the same memory: pages of the largest power-of-two divisor of the capacity (a page size
    every backend takes), sequence b's pages those of cache row
    cache_batch_idx[b]. No copy, so appends land in the caller's cache; a bad index is reported by
    the call's block-table check."""
    if block_table is not None:
        raise NotImplementedError("cache_batch_idx with a paged cache (block_table): not supported (nor in "
                                  "flash-attn); index the block table instead")
    _args.ranked(cache_batch_idx, "cache_batch_idx", (1,), "[batch]")
    rows, capacity = k_cache.shape[0], k_cache.shape[1]
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        strides = _element_strides(cache)
        if capacity > 1 and strides[0] != capacity * strides[1]:
            raise InvalidArgumentError(f"{name}: with cache_batch_idx, a cache row must be one run of memory "
                                       f"(stride[0] = capacity * stride[1]); got strides {tuple(strides)}")
    page = capacity & -capacity if capacity > 0 else 1
    pages_per_row = capacity // page if capacity > 0 else 0
    if _is_torch(cache_batch_idx):
        steps = _torch.arange(pages_per_row, device=cache_batch_idx.device)
        table = (cache_batch_idx.long()[:, None] * pages_per_row + steps[None, :]).to(_torch.int32)
        as_pages = [c.view(rows * pages_per_row, page, *c.shape[2:]) for c in (k_cache, v_cache)]
    else:
        import numpy as np

        if not isinstance(k_cache, np.ndarray) or not isinstance(v_cache, np.ndarray):
            raise NotImplementedError("cache_batch_idx: supported for torch tensors and numpy arrays")
        index = np.asarray(cache_batch_idx).astype(np.int64)
        table = (index[:, None] * pages_per_row + np.arange(pages_per_row)[None, :]).astype(np.int32)
        as_pages = []
        for c in (k_cache, v_cache):
            paged = c.view()
            paged.shape = (rows * pages_per_row, page, *c.shape[2:])  # raises rather than copies
            as_pages.append(paged)
    return as_pages[0], as_pages[1], table


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False, *,
                            sinks=None, learnable_sink=None):
    """Attention of q ``(batch, seqlen_q, nheads, headdim)`` over a KV cache, appending k/v first.

    k_cache/v_cache ``(batch, seqlen_cache, nheads_k, headdim)``, or with
    ``block_table`` int32 ``(batch, max_pages)`` paged ``(num_pages, page_size,
    nheads_k, headdim)``. ``cache_seqlens`` (int or int32 ``(batch,)``): keys
    already cached; None means the whole cache. k/v ``(batch, seqlen_new,
    nheads_k, headdim)``, if given, are written into the cache in place at
    ``cache_seqlens[b]..`` and attended to; ``cache_seqlens`` is not updated.
    ``cache_leftpad`` (int32 ``(batch,)``; with a paged cache or
    ``cache_batch_idx`` too, which flash-attn refuses): sequence b's keys start
    at key position ``cache_leftpad[b]``; the positions before it are none of
    its keys. ``rotary_cos``/``rotary_sin`` ``(seqlen_ro, rotary_dim / 2)`` (with
    k/v): q and the new keys are rotated inside the call, GPT-J pairs with
    ``rotary_interleaved`` (the default) else GPT-NeoX halves; the new key n of
    sequence b at position ``cache_seqlens[b] + n`` (and written rotated), query
    i at ``cache_seqlens[b] + i`` when causal or windowed, else at
    ``cache_seqlens[b]``. ``sinks`` (``learnable_sink``): attention sinks,
    float32 ``(nheads,)``.
    Returns out, or ``(out, softmax_lse)`` with ``return_softmax_lse``.
    Not differentiable.
    """
    if (k is None) != (v is None):
        raise InvalidArgumentError("k and v: give both or neither")
    _args.ranked(q, "q", (4,), "[batch, seqlen_q, heads_q, head_dim]")
    _args.ranked(k_cache, "k_cache", (4,),
                 "[batch, capacity, heads_kv, head_dim] or paged [num_pages, page_size, heads_kv, head_dim]")
    if block_table is not None:
        _args.ranked(block_table, "block_table", (2,), "[batch, max_pages]")
    q, k, v = _last_dim_contiguous(q), _last_dim_contiguous(k), _last_dim_contiguous(v)
    batch = q.shape[0]
    if cache_seqlens is None:
        if k is not None:
            raise InvalidArgumentError("cache_seqlens: required when appending k/v (where in the cache would they go?)")
        capacity = k_cache.shape[1] if block_table is None else block_table.shape[1] * k_cache.shape[1]
        cache_seqlens = capacity
    if isinstance(cache_seqlens, int):
        cache_seqlens = _int32_lengths(q, batch, _args.integer(cache_seqlens, "cache_seqlens"))
    if cache_batch_idx is not None:
        k_cache, v_cache, block_table = _batch_idx_as_pages(k_cache, v_cache, block_table, cache_batch_idx)
    out, lse = _forward(q, k_cache, v_cache, alibi_slopes=alibi_slopes, seqlens_k=cache_seqlens,
                        block_table=block_table, k_new=k, v_new=v, softmax_scale=softmax_scale, causal=causal,
                        window=(int(window_size[0]), int(window_size[1])), softcap=softcap,
                        sinks=_sinks(sinks, learnable_sink), cache_leftpad=_last_dim_contiguous(cache_leftpad),
                        rotary_cos=_last_dim_contiguous(rotary_cos), rotary_sin=_last_dim_contiguous(rotary_sin),
                        rotary_interleaved=rotary_interleaved)
    return (out, lse) if return_softmax_lse else out

