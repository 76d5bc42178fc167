"""cuflash as torch custom ops defined in Python (torch.library), with autograd:
what torch.compile traces when the package has no torch operators in C++
(``_torch_ext``; ``_torch_ops`` imports this module only then, since both
register the same names).

Eager calls do not come here (``_torch_call.attention_eager`` runs them with
less host time); dynamo-traced calls and tensor subclasses (FakeTensor,
functional tensors) do. Ops (``torch.ops.cuflash.*``), each opaque to dynamo,
so torch.compile keeps them whole in its graph:

- ``fwd``: dense, varlen or KV-cache attention without append -> (out, lse);
  differentiable through ``bwd``.
- ``fwd_kvcache``: KV-cache attention that first appends k_new/v_new into the
  cache (mutates k_cache and v_cache), with an optional leftpad and rotary
  embedding of q and k_new -> (out, lse); not differentiable, as in
  flash-attn.
- ``bwd``: (dq, dk, dv, dsinks) from dout, q, k, v, out, lse (dsinks empty
  without sinks).
- ``merge_states``: (out, lse) of two partial attentions.

An op's schema holds plain values only, so the options travel as arguments;
the implementations rebuild the options object (cached) and call
``_torch_call``, which the eager path uses too. Fake implementations give
torch.compile the output shapes.
"""

from typing import Optional, Tuple

import torch

from . import _torch_call

Tensor = torch.Tensor


def _key(softmax_scale, causal, window_left, window_right, softcap, deterministic, check_index_contents, backend,
         dropout_p=0.0):
    return (softmax_scale, causal, window_left, window_right, softcap, deterministic, check_index_contents, backend,
            dropout_p)


def _rng(dropout_rng):
    """The call's dropout (seed, offset) from its int64 [2] host tensor (drawn by _api; a tensor, so that
    tracing keeps the draw in the graph): unsigned 64-bit."""
    if dropout_rng is None:
        return 0, 0
    seed, offset = dropout_rng.tolist()
    return seed % 2**64, offset % 2**64


@torch.library.custom_op("cuflash::fwd", mutates_args=())
def fwd(
    q: Tensor, k: Tensor, v: Tensor, alibi_slopes: Optional[Tensor], cu_seqlens_q: Optional[Tensor],
    cu_seqlens_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int, seqlens_k: Optional[Tensor],
    block_table: Optional[Tensor], softmax_scale: Optional[float], causal: bool, window_left: int, window_right: int,
    softcap: float, deterministic: bool, check_index_contents: bool, backend: str, sinks: Optional[Tensor] = None,
    dropout_p: float = 0.0, dropout_rng: Optional[Tensor] = None, cache_leftpad: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor]:
    key = _key(softmax_scale, causal, window_left, window_right, softcap, deterministic, check_index_contents, backend,
               dropout_p)
    return _torch_call.forward(q.detach(), k.detach(), v.detach(), key, alibi_slopes, cu_seqlens_q, cu_seqlens_k,
                               max_seqlen_q, max_seqlen_k, seqlens_k, block_table,
                               sinks=None if sinks is None else sinks.detach(), rng=_rng(dropout_rng),
                               cache_leftpad=cache_leftpad)


@fwd.register_fake
def _fwd_fake(q, k, v, alibi_slopes, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqlens_k,
              block_table, softmax_scale, causal, window_left, window_right, softcap, deterministic,
              check_index_contents, backend, sinks=None, dropout_p=0.0, dropout_rng=None, cache_leftpad=None):
    varlen = cu_seqlens_q is not None
    return q.new_empty(q.shape), q.new_empty(_torch_call.lse_shape(q, varlen), dtype=torch.float32)


@torch.library.custom_op("cuflash::bwd", mutates_args=())
def bwd(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, alibi_slopes: Optional[Tensor],
    cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int,
    seqlens_k: Optional[Tensor], block_table: Optional[Tensor], softmax_scale: Optional[float], causal: bool,
    window_left: int, window_right: int, softcap: float, deterministic: bool, check_index_contents: bool,
    backend: str, sinks: Optional[Tensor] = None, dropout_p: float = 0.0, dropout_rng: Optional[Tensor] = None,
    cache_leftpad: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dv, dsinks); dsinks is empty ([0]) without sinks."""
    key = _key(softmax_scale, causal, window_left, window_right, softcap, deterministic, check_index_contents, backend,
               dropout_p)
    grads = _torch_call.backward(dout, q, k, v, out, lse, key, alibi_slopes, cu_seqlens_q, cu_seqlens_k,
                                 max_seqlen_q, max_seqlen_k, seqlens_k, block_table, sinks=sinks,
                                 rng=_rng(dropout_rng), want_dsinks=sinks is not None, cache_leftpad=cache_leftpad)
    if sinks is None:
        grads = grads + (q.new_empty((0,), dtype=torch.float32),)
    return grads


@bwd.register_fake
def _bwd_fake(dout, q, k, v, out, lse, alibi_slopes, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
              seqlens_k, block_table, softmax_scale, causal, window_left, window_right, softcap, deterministic,
              check_index_contents, backend, sinks=None, dropout_p=0.0, dropout_rng=None, cache_leftpad=None):
    dsinks = q.new_empty((0,) if sinks is None else sinks.shape, dtype=torch.float32)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dsinks


# fwd's arguments after q, k, v that bwd takes too, in order.
_SHARED = ("alibi_slopes", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k", "seqlens_k",
           "block_table", "softmax_scale", "causal", "window_left", "window_right", "softcap", "deterministic",
           "check_index_contents", "backend", "sinks", "dropout_p", "dropout_rng", "cache_leftpad")
_SHARED_TENSORS = ("alibi_slopes", "cu_seqlens_q", "cu_seqlens_k", "seqlens_k", "block_table", "sinks",
                   "dropout_rng", "cache_leftpad")


def _setup_context(ctx, inputs, output):
    q, k, v = inputs[:3]
    out, lse = output
    shared = dict(zip(_SHARED, inputs[3:]))
    ctx.save_for_backward(q, k, v, out, lse, *(shared.pop(name) for name in _SHARED_TENSORS))
    ctx.shared = shared  # the plain values


def _backward(ctx, grad_out, grad_lse):
    q, k, v, out, lse, *tensors = ctx.saved_tensors
    shared = dict(ctx.shared, **dict(zip(_SHARED_TENSORS, tensors)))
    if grad_out is None:
        grad_out = torch.zeros_like(out)
    # A gradient through lse is not propagated (as in flash-attn).
    dq, dk, dv, dsinks = bwd(grad_out, q, k, v, out, lse, *(shared[name] for name in _SHARED))
    has_sinks = shared["sinks"] is not None
    return (dq, dk, dv) + tuple(dsinks if name == "sinks" and has_sinks else None for name in _SHARED)


fwd.register_autograd(_backward, setup_context=_setup_context)


@torch.library.custom_op("cuflash::fwd_kvcache", mutates_args=("k_cache", "v_cache"))
def fwd_kvcache(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, k_new: Tensor, v_new: Tensor, seqlens_k: Tensor,
    block_table: Optional[Tensor], alibi_slopes: Optional[Tensor], softmax_scale: Optional[float], causal: bool,
    window_left: int, window_right: int, softcap: float, check_index_contents: bool, backend: str,
    sinks: Optional[Tensor] = None, cache_leftpad: Optional[Tensor] = None, rotary_cos: Optional[Tensor] = None,
    rotary_sin: Optional[Tensor] = None, rotary_interleaved: bool = False,
) -> Tuple[Tensor, Tensor]:
    key = _key(softmax_scale, causal, window_left, window_right, softcap, False, check_index_contents, backend)
    # The op's mutation is declared in its schema: no version bump of our own here.
    return _torch_call.forward(q, k_cache, v_cache, key, alibi_slopes, seqlens_k=seqlens_k, block_table=block_table,
                               k_new=k_new, v_new=v_new, sinks=sinks, cache_leftpad=cache_leftpad,
                               rotary_cos=rotary_cos, rotary_sin=rotary_sin, rotary_interleaved=rotary_interleaved)


@fwd_kvcache.register_fake
def _fwd_kvcache_fake(q, k_cache, v_cache, k_new, v_new, seqlens_k, block_table, alibi_slopes, softmax_scale,
                      causal, window_left, window_right, softcap, check_index_contents, backend, sinks=None,
                      cache_leftpad=None, rotary_cos=None, rotary_sin=None, rotary_interleaved=False):
    return q.new_empty(q.shape), q.new_empty(_torch_call.lse_shape(q, False), dtype=torch.float32)


@torch.library.custom_op("cuflash::merge_states", mutates_args=())
def merge_states(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor, backend: str) -> Tuple[Tensor, Tensor]:
    return _torch_call.merge_states(out_a, lse_a, out_b, lse_b, backend)


@merge_states.register_fake
def _merge_states_fake(out_a, lse_a, out_b, lse_b, backend):
    return out_a.new_empty(out_a.shape), lse_a.new_empty(lse_a.shape, dtype=torch.float32)
