"""cuflash as torch custom ops (torch.library), with autograd.

Ops (``torch.ops.cuflash.*``), each opaque to dynamo, so torch.compile keeps
them whole in its graph:

- ``fwd``: dense, varlen or KV-cache attention without append -> (out, lse);
  differentiable through ``bwd``.
- ``fwd_kvcache``: KV-cache attention that first appends k_new/v_new into the
  cache (mutates k_cache and v_cache) -> (out, lse); not differentiable, as in
  flash-attn.
- ``bwd``: (dq, dk, dv) from dout, q, k, v, out, lse.
- ``merge_states``: (out, lse) of two partial attentions.

Each runs on the current CUDA stream of the query's device (host tensors on the
CPU backend). Fake implementations give torch.compile the output shapes.
"""

from typing import Optional, Tuple

import torch

from . import _ext

Tensor = torch.Tensor


def _stream(t: Tensor) -> int:
    return torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else 0


def _view(t: Optional[Tensor]) -> Optional[Tensor]:
    # torch refuses to export a tensor that requires grad through DLPack.
    return None if t is None else t.detach()


def _lse_shape(q: Tensor, varlen: bool):
    # dense / KV cache: [batch, heads_q, seqlen_q]; varlen: [heads_q, total_q]
    return (q.shape[1], q.shape[0]) if varlen else (q.shape[0], q.shape[2], q.shape[1])


@torch.library.custom_op("cuflash::fwd", mutates_args=())
def fwd(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    alibi_slopes: Optional[Tensor],
    cu_seqlens_q: Optional[Tensor],
    cu_seqlens_k: Optional[Tensor],
    max_seqlen_q: int,
    max_seqlen_k: int,
    seqlens_k: Optional[Tensor],
    block_table: Optional[Tensor],
    softmax_scale: Optional[float],
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    deterministic: bool,
    check_index_contents: bool,
    backend: str,
) -> Tuple[Tensor, Tensor]:
    varlen = cu_seqlens_q is not None
    # Packed rows after the last sequence belong to none and are not written: zeros, not garbage.
    make = torch.zeros if varlen else torch.empty
    out = make(q.shape, dtype=q.dtype, device=q.device)
    lse = make(_lse_shape(q, varlen), dtype=torch.float32, device=q.device)
    _ext.forward(
        _view(q), _view(k), _view(v), out, lse, _view(alibi_slopes), cu_seqlens_q, cu_seqlens_k,
        max_seqlen_q, max_seqlen_k, seqlens_k, block_table, None, None, softmax_scale, causal,
        window_left, window_right, softcap, check_index_contents, backend, _stream(q),
    )
    return out, lse


@fwd.register_fake
def _fwd_fake(q, k, v, alibi_slopes, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqlens_k,
              block_table, softmax_scale, causal, window_left, window_right, softcap, deterministic,
              check_index_contents, backend):
    out = q.new_empty(q.shape)
    lse = q.new_empty(_lse_shape(q, cu_seqlens_q is not None), dtype=torch.float32)
    return out, lse


@torch.library.custom_op("cuflash::bwd", mutates_args=())
def bwd(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    alibi_slopes: Optional[Tensor],
    cu_seqlens_q: Optional[Tensor],
    cu_seqlens_k: Optional[Tensor],
    max_seqlen_q: int,
    max_seqlen_k: int,
    seqlens_k: Optional[Tensor],
    block_table: Optional[Tensor],
    softmax_scale: Optional[float],
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    deterministic: bool,
    check_index_contents: bool,
    backend: str,
) -> Tuple[Tensor, Tensor, Tensor]:
    if dout.stride(-1) != 1:  # e.g. the expanded ones of out.sum()
        dout = dout.contiguous()
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    _ext.backward(
        _view(dout), _view(q), _view(k), _view(v), _view(out), _view(lse), dq, dk, dv, _view(alibi_slopes),
        cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqlens_k, block_table, softmax_scale, causal,
        window_left, window_right, softcap, deterministic, check_index_contents, backend, _stream(q),
    )
    return dq, dk, dv


@bwd.register_fake
def _bwd_fake(dout, q, k, v, out, lse, alibi_slopes, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
              seqlens_k, block_table, softmax_scale, causal, window_left, window_right, softcap, deterministic,
              check_index_contents, backend):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


# fwd's arguments after q, k, v that bwd takes too, in order.
_SHARED = ("alibi_slopes", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k", "seqlens_k",
           "block_table", "softmax_scale", "causal", "window_left", "window_right", "softcap", "deterministic",
           "check_index_contents", "backend")
_SHARED_TENSORS = ("alibi_slopes", "cu_seqlens_q", "cu_seqlens_k", "seqlens_k", "block_table")


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
    dq, dk, dv = bwd(grad_out, q, k, v, out, lse, *(shared[name] for name in _SHARED))
    return (dq, dk, dv) + (None,) * len(_SHARED)


fwd.register_autograd(_backward, setup_context=_setup_context)


@torch.library.custom_op("cuflash::fwd_kvcache", mutates_args=("k_cache", "v_cache"))
def fwd_kvcache(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    k_new: Tensor,
    v_new: Tensor,
    seqlens_k: Tensor,
    block_table: Optional[Tensor],
    alibi_slopes: Optional[Tensor],
    softmax_scale: Optional[float],
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    check_index_contents: bool,
    backend: str,
) -> Tuple[Tensor, Tensor]:
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(_lse_shape(q, False), dtype=torch.float32, device=q.device)
    _ext.forward(
        _view(q), k_cache, v_cache, out, lse, _view(alibi_slopes), None, None, 0, 0, seqlens_k, block_table,
        _view(k_new), _view(v_new), softmax_scale, causal, window_left, window_right, softcap,
        check_index_contents, backend, _stream(q),
    )
    return out, lse


@fwd_kvcache.register_fake
def _fwd_kvcache_fake(q, k_cache, v_cache, k_new, v_new, seqlens_k, block_table, alibi_slopes, softmax_scale,
                      causal, window_left, window_right, softcap, check_index_contents, backend):
    return q.new_empty(q.shape), q.new_empty(_lse_shape(q, False), dtype=torch.float32)


@torch.library.custom_op("cuflash::merge_states", mutates_args=())
def merge_states(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor, backend: str) -> Tuple[Tensor, Tensor]:
    out = torch.empty(out_a.shape, dtype=out_a.dtype, device=out_a.device)
    lse = torch.empty(lse_a.shape, dtype=torch.float32, device=lse_a.device)
    _ext.merge_states(_view(out_a), _view(lse_a), _view(out_b), _view(lse_b), out, lse, backend, _stream(out_a))
    return out, lse


@merge_states.register_fake
def _merge_states_fake(out_a, lse_a, out_b, lse_b, backend):
    return out_a.new_empty(out_a.shape), lse_a.new_empty(lse_a.shape, dtype=torch.float32)
