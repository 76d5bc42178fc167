"""cuflash on torch tensors: the calls themselves, shared by the eager path and the custom ops.

Eager calls (no dynamo tracing, plain tensors) run :func:`attention_eager`:
the compiled module directly, and a ``torch.autograd.Function`` when a
gradient is needed; torch.compile traces the custom ops of ``_torch_ops``
instead, whose implementations call the same functions here. What a call
pays on the host is kept to what it must do (measured in
docs/perf/python-overhead.md):

- tensors cross as DLPack capsules from ``torch.utils.dlpack.to_dlpack`` (a C
  function; ``Tensor.__dlpack__`` is Python and costs ~3 us a tensor);
- the stream is torch's current raw stream, read without making a Stream object;
- outputs and scratch memory come from torch's caching allocator (scratch
  through the ``workspace`` callable), so no cudaMalloc per call, and inside a
  CUDA-graph capture they come from the graph's private pool;
- the options cross as one object made once per distinct set (``_args.options``).
"""

import torch
from torch.utils.dlpack import to_dlpack as _capsule

from . import _args, _ext

Tensor = torch.Tensor

try:  # torch's own fast accessor (what inductor's generated code calls); public fallback below
    from torch._C import _cuda_getCurrentRawStream as _raw_stream
except ImportError:  # pragma: no cover - depends on the torch build
    def _raw_stream(index):
        return torch.cuda.current_stream(index).cuda_stream


def _dl(t):
    return None if t is None else _capsule(t)


_workspaces = {}


def _workspace_for(t):
    """(bytes) -> uint8 tensor on t's device, from torch's caching allocator (None on the CPU)."""
    if not t.is_cuda:
        return None
    device = t.device
    make = _workspaces.get(device)
    if make is None:
        def make(nbytes, device=device):
            return torch.empty(nbytes, dtype=torch.uint8, device=device)

        _workspaces[device] = make
    return make


def _stream(t):
    return _raw_stream(t.get_device()) if t.is_cuda else 0


def lse_shape(q, varlen):
    # dense / KV cache: [batch, heads_q, seqlen_q]; varlen: [heads_q, total_q]
    return (q.shape[1], q.shape[0]) if varlen else (q.shape[0], q.shape[2], q.shape[1])


def rng_tensor(rng):
    """The dropout (seed, offset), unsigned 64-bit, as the int64 [2] host tensor the torch operators take
    (two's complement; the operators read it back modulo 2**64)."""
    return torch.tensor([x - 2**64 if x >= 2**63 else x for x in rng], dtype=torch.int64)


def _capturing(t):
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def _call_options(options_key, index_tensors, q):
    """The options object of a call. With index tensors during a CUDA-graph capture, their
    contents cannot be copied to the host to be checked (that waits on the stream), so the
    capture leaves the check to the eager calls made before it (documented in the README)."""
    check = _args.CHECK_INDEX_CONTENTS
    if options_key[check] and index_tensors and _capturing(q):
        options_key = options_key[:check] + (False,) + options_key[check + 1:]
    return _args.options(*options_key)


def forward(q, k, v, options_key, alibi_slopes=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0,
            max_seqlen_k=0, seqlens_k=None, block_table=None, k_new=None, v_new=None, sinks=None, rng=(0, 0),
            attn_probs=False, cache_leftpad=None, rotary_cos=None, rotary_sin=None, rotary_interleaved=False):
    """(out, lse) of one forward call, or (out, lse, attn_probs) when asked; options_key is the tuple of
    _args.options' arguments, rng the call's dropout (seed, offset)."""
    varlen = cu_seqlens_q is not None
    indexed = varlen or seqlens_k is not None or block_table is not None or cache_leftpad is not None
    options = _call_options(options_key, indexed, q)
    # Packed rows after the last sequence belong to none and are not written: zeros, not garbage.
    out = torch.zeros(q.shape, dtype=q.dtype, device=q.device) if varlen else torch.empty_like(
        q, memory_format=torch.contiguous_format)
    lse = torch.empty(lse_shape(q, varlen), dtype=torch.float32, device=q.device)
    probs = None
    if attn_probs:
        probs = torch.empty(_args.attn_probs_shape(q, k, cu_seqlens_q, max_seqlen_q, max_seqlen_k, seqlens_k,
                                                   block_table), dtype=torch.float32, device=q.device)
    _ext.forward(_capsule(q), _capsule(k), _capsule(v), _capsule(out), _capsule(lse), options, _stream(q),
                 _workspace_for(q), _dl(alibi_slopes), _dl(cu_seqlens_q), _dl(cu_seqlens_k), max_seqlen_q,
                 max_seqlen_k, _dl(seqlens_k), _dl(block_table), _dl(k_new), _dl(v_new), _dl(sinks), _dl(probs),
                 rng[0], rng[1], _dl(cache_leftpad), _dl(rotary_cos), _dl(rotary_sin), bool(rotary_interleaved))
    return (out, lse) if probs is None else (out, lse, probs)


def backward(dout, q, k, v, out, lse, options_key, alibi_slopes=None, cu_seqlens_q=None, cu_seqlens_k=None,
             max_seqlen_q=0, max_seqlen_k=0, seqlens_k=None, block_table=None, sinks=None, rng=(0, 0),
             want_dsinks=False, cache_leftpad=None):
    """(dq, dk, dv) from the forward's out and lse; (dq, dk, dv, dsinks) with want_dsinks (and sinks)."""
    if dout.stride(-1) != 1:  # e.g. the expanded ones of out.sum()
        dout = dout.contiguous()
    indexed = cu_seqlens_q is not None or seqlens_k is not None or block_table is not None or cache_leftpad is not None
    options = _call_options(options_key, indexed, q)
    dq = torch.empty_like(q, memory_format=torch.contiguous_format)
    dk = torch.empty_like(k, memory_format=torch.contiguous_format)
    dv = torch.empty_like(v, memory_format=torch.contiguous_format)
    dsinks = torch.empty(sinks.shape, dtype=torch.float32, device=sinks.device) if want_dsinks else None
    _ext.backward(_capsule(dout), _capsule(q), _capsule(k), _capsule(v), _capsule(out), _capsule(lse), _capsule(dq),
                  _capsule(dk), _capsule(dv), options, _stream(q), _workspace_for(q), _dl(alibi_slopes),
                  _dl(cu_seqlens_q), _dl(cu_seqlens_k), max_seqlen_q, max_seqlen_k, _dl(seqlens_k), _dl(block_table),
                  _dl(sinks), _dl(dsinks), rng[0], rng[1], _dl(cache_leftpad))
    return (dq, dk, dv) if dsinks is None else (dq, dk, dv, dsinks)


def merge_states(out_a, lse_a, out_b, lse_b, backend):
    out = torch.empty_like(out_a, memory_format=torch.contiguous_format)
    lse = torch.empty(lse_a.shape, dtype=torch.float32, device=lse_a.device)
    _ext.merge_states(_capsule(out_a), _capsule(lse_a), _capsule(out_b), _capsule(lse_b), _capsule(out),
                      _capsule(lse), backend, _stream(out_a))
    return out, lse


class _Attention(torch.autograd.Function):
    """Eager autograd for dense, varlen and KV-cache (no append) calls, in q, k, v and sinks; lse and
    attn_probs are not differentiable. The backward redraws dropout's mask from the same (seed, offset)."""

    @staticmethod
    def forward(ctx, q, k, v, sinks, options_key, extras, rng, attn_probs):
        result = forward(q, k, v, options_key, sinks=sinks, rng=rng, attn_probs=attn_probs, **extras)
        ctx.save_for_backward(q, k, v, result[0], result[1], sinks)
        ctx.options_key = options_key
        ctx.extras = extras
        ctx.rng = rng
        ctx.mark_non_differentiable(*result[1:])
        return result

    @staticmethod
    def backward(ctx, grad_out, *unused_grads):
        q, k, v, out, lse, sinks = ctx.saved_tensors
        if grad_out is None:
            grad_out = torch.zeros_like(out)
        # A gradient through lse is not propagated (as in flash-attn).
        want_dsinks = sinks is not None and ctx.needs_input_grad[3]
        grads = backward(grad_out, q, k, v, out, lse, ctx.options_key, sinks=sinks, rng=ctx.rng,
                         want_dsinks=want_dsinks, **ctx.extras)
        dsinks = grads[3] if want_dsinks else None
        return grads[0], grads[1], grads[2], dsinks, None, None, None, None


def _needs_grad(q, k, v, sinks=None):
    return torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad or (
        sinks is not None and sinks.requires_grad))


def attention_eager(q, k, v, options_key, sinks=None, rng=(0, 0), attn_probs=False, **extras):
    """(out, lse) (and attn_probs when asked), differentiable in q, k, v and sinks when autograd asks for it."""
    if _needs_grad(q, k, v, sinks):
        return _Attention.apply(q, k, v, sinks, options_key, extras, rng, attn_probs)
    return forward(q, k, v, options_key, sinks=sinks, rng=rng, attn_probs=attn_probs, **extras)


def append_and_attend(q, k_cache, v_cache, k_new, v_new, options_key, **extras):
    """KV-cache forward that first writes k_new/v_new (k_new rotated, with rotary_cos/rotary_sin) into the
    caches (in place; not differentiable)."""
    if extras.get("sinks") is not None:
        extras["sinks"] = extras["sinks"].detach()
    result = forward(q, k_cache, v_cache, options_key, k_new=k_new, v_new=v_new, **extras)
    bump = getattr(torch.autograd.graph, "increment_version", None)
    if bump is not None and not k_cache.is_inference():
        bump(k_cache)  # autograd must see that the caches changed, as after any in-place op
        bump(v_cache)
    return result
