"""Ring attention's forward and backward on this rank (docs: DESIGN.md, "Beyond one GPU").

With W ranks, at step t = 0..W-1 a rank holds the K/V block of rank (rank - t) mod W
and attends its local queries to it; the next block is already on its way
(sent to rank + 1, received from rank - 1, into a second buffer) while it
computes. Which kernel calls a step makes, on which chunks and with which
mask and position offset, is the C++ planner's answer (``_ext.ring_step_calls``);
the partial (out, lse) of each call merge into float32 accumulators through
``_ext.merge_states``. Nothing here restates either rule.

The backward rotates K/V again; the dk/dv accumulators (float32) travel with
their block, each holder adding its partial gradients, and come home after
the last step; dq stays local.
"""

import functools

import torch

from .. import _args, _ext
from .._torch_call import _capsule, _dl, _stream, _workspace_for
from ._comm import TAG_GRAD, TAG_KV, wait


@functools.lru_cache(maxsize=4096)
def _step_calls(layout, world_size, rank, kv_rank, causal, window_left, window_right, alibi, varlen, chunk_len):
    return tuple(_ext.ring_step_calls(layout, world_size, rank, kv_rank, causal, window_left, window_right, alibi,
                                      varlen, chunk_len))


_call_options = {}


def _options(key, causal, window_left, window_right, diagonal_offset, check):
    """The Options of one call: the ring's own options with the call's mask and position offset."""
    scale, _, _, _, softcap, deterministic, _, backend = key
    full = (scale, causal, window_left, window_right, softcap, deterministic, check, backend, diagonal_offset)
    made = _call_options.get(full)
    if made is None:
        made = _args.options(*full[:8], 0.0).with_diagonal_offset(diagonal_offset)
        if len(_call_options) > 4096:
            _call_options.clear()
        _call_options[full] = made
    return made


class Setup:
    """What one ring call is: its options, its ring, and where a chunk's rows lie in the local tensors.

    Dense tensors are [B, S, H, D] (lse [B, H, S]); the rows of chunk c are S/chunks_per_rank rows from
    c * that along dim 1. Varlen tensors are [T, H, D] (lse [H, T]); contiguous: the one chunk is all rows,
    with the local cu_seqlens; zigzag: the tensors are permuted to chunk-major order first (every sequence's
    front chunk, then every back chunk), so chunk c is half c of the rows, with cu_seqlens // 2.
    """

    def __init__(self, ring, layout, key, causal, window, alibi_slopes, varlen, chunk_rows, cu_seqlens=None,
                 max_seqlen=0, check_first=False):
        self.ring = ring
        self.layout = layout
        self.key = key  # (softmax_scale, causal, left, right, softcap, deterministic, check, backend)
        self.causal = causal
        self.window = window
        self.alibi_slopes = alibi_slopes
        self.varlen = varlen
        self.chunk_rows = chunk_rows
        self.cu_seqlens = cu_seqlens
        self.max_seqlen = max_seqlen
        self.check_first = check_first  # the library checks the index contents on the first call only
        self.seq_dim = 0 if varlen else 1

    def calls(self, kv_rank):
        """The planner's calls for the K/V block of kv_rank: (q_first, q_count, k_first, k_count, causal,
        window_left, window_right, diagonal_offset) each."""
        ring = self.ring
        chunk_len = 0 if self.varlen else self.chunk_rows
        return _step_calls(self.layout, ring.size, ring.rank, kv_rank, self.causal, self.window[0], self.window[1],
                           self.alibi_slopes is not None, self.varlen, chunk_len)

    def rows(self, x, first, count):
        if self.varlen and count != 1:
            raise RuntimeError(f"ring planner: a varlen call spans one chunk, got {count}")
        return x.narrow(self.seq_dim, first * self.chunk_rows, count * self.chunk_rows)

    def lse_rows(self, lse, first, count):
        return lse.narrow(self.seq_dim + 1, first * self.chunk_rows, count * self.chunk_rows)

    def options(self, call):
        check = self.check_first
        self.check_first = False
        return _options(self.key, call[4], call[5], call[6], call[7], check)

    def batched(self, out, lse):
        """merge_states takes [B, S, H, D] and [B, H, S]: varlen rows as a batch of one."""
        return (out.unsqueeze(0), lse.unsqueeze(0)) if self.varlen else (out, lse)


def _packed(k, v):
    """K and V in one contiguous buffer [2, ...]: one message per step instead of two."""
    kv = torch.empty((2, *k.shape), dtype=k.dtype, device=k.device)
    kv[0].copy_(k)
    kv[1].copy_(v)
    return kv


def _lse_shape(q, varlen):
    return (q.shape[1], q.shape[0]) if varlen else (q.shape[0], q.shape[2], q.shape[1])


def ring_forward(q, k, v, setup):
    """(out like q, lse float32) of this rank's queries against every rank's keys."""
    ring = setup.ring
    acc_out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    acc_lse = torch.full(_lse_shape(q, setup.varlen), float("-inf"), dtype=torch.float32, device=q.device)
    stream, workspace, backend = _stream(q), _workspace_for(q), setup.key[7]
    alibi, cu, max_seqlen = setup.alibi_slopes, setup.cu_seqlens, setup.max_seqlen
    kv = _packed(k, v)
    spare = torch.empty_like(kv) if ring.size > 1 else None
    for step in range(ring.size):
        incoming = ring.exchange(kv, spare, TAG_KV) if step + 1 < ring.size else None
        for call in setup.calls((ring.rank - step) % ring.size):
            q_first, q_count, k_first, k_count = call[:4]
            q_part = setup.rows(q, q_first, q_count)
            k_part = setup.rows(kv[0], k_first, k_count)
            v_part = setup.rows(kv[1], k_first, k_count)
            if setup.varlen:  # rows outside every sequence are not written: no attention, not garbage
                part_out = torch.zeros(q_part.shape, dtype=q.dtype, device=q.device)
                part_lse = torch.full(_lse_shape(q_part, True), float("-inf"), dtype=torch.float32, device=q.device)
            else:
                part_out = torch.empty(q_part.shape, dtype=q.dtype, device=q.device)
                part_lse = torch.empty(_lse_shape(q_part, False), dtype=torch.float32, device=q.device)
            _ext.forward(_capsule(q_part), _capsule(k_part), _capsule(v_part), _capsule(part_out),
                         _capsule(part_lse), setup.options(call), stream, workspace, _dl(alibi), _dl(cu), _dl(cu),
                         max_seqlen, max_seqlen, None, None, None, None, None, None, 0, 0)
            acc_out_rows, acc_lse_rows = setup.batched(setup.rows(acc_out, q_first, q_count),
                                                       setup.lse_rows(acc_lse, q_first, q_count))
            part_out, part_lse = setup.batched(part_out, part_lse)
            _ext.merge_states(_capsule(acc_out_rows), _capsule(acc_lse_rows), _capsule(part_out),
                              _capsule(part_lse), _capsule(acc_out_rows), _capsule(acc_lse_rows), backend, stream)
        if incoming is not None:
            wait(incoming)
            kv, spare = spare, kv
    return acc_out.to(q.dtype), acc_lse


def ring_backward(dout, q, k, v, out, lse, setup):
    """(dq, dk, dv) in q's, k's and v's dtypes, from the forward's final out and lse."""
    ring = setup.ring
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    stream, workspace = _stream(q), _workspace_for(q)
    alibi, cu, max_seqlen = setup.alibi_slopes, setup.cu_seqlens, setup.max_seqlen
    dq_acc = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    kv = _packed(k, v)
    spare = torch.empty_like(kv) if ring.size > 1 else None
    # grads[step % 2] holds the dk/dv accumulator of the block held at `step`: zeros at step 0, else received from
    # the previous holder, while this step's own partial gradients go into `partial` first.
    grads = [torch.zeros((2, *k.shape), dtype=torch.float32, device=k.device)]
    if ring.size > 1:
        grads.append(torch.empty_like(grads[0]))
        partial = torch.empty_like(grads[0])
    arriving = None  # the exchange bringing the accumulator of the next step's block
    for step in range(ring.size):
        incoming = ring.exchange(kv, spare, TAG_KV) if step + 1 < ring.size else None
        calls = setup.calls((ring.rank - step) % ring.size)
        target = grads[0] if step == 0 else partial
        if step > 0 and calls:
            partial.zero_()
        for call in calls:
            q_first, q_count, k_first, k_count = call[:4]
            q_part = setup.rows(q, q_first, q_count)
            k_part = setup.rows(kv[0], k_first, k_count)
            v_part = setup.rows(kv[1], k_first, k_count)
            # Varlen rows outside every sequence (packed padding) get no gradient: zeros, not garbage.
            make = torch.zeros if setup.varlen else torch.empty
            dq = make(q_part.shape, dtype=q.dtype, device=q.device)
            dk = make(k_part.shape, dtype=k.dtype, device=k.device)
            dv = make(v_part.shape, dtype=v.dtype, device=v.device)
            _ext.backward(_capsule(setup.rows(dout, q_first, q_count)), _capsule(q_part), _capsule(k_part),
                          _capsule(v_part), _capsule(setup.rows(out, q_first, q_count)),
                          _capsule(setup.lse_rows(lse, q_first, q_count)), _capsule(dq), _capsule(dk), _capsule(dv),
                          setup.options(call), stream, workspace, _dl(alibi), _dl(cu), _dl(cu), max_seqlen, max_seqlen,
                          None, None, None, None, 0, 0)
            setup.rows(dq_acc, q_first, q_count).add_(dq)
            setup.rows(target[0], k_first, k_count).add_(dk)
            setup.rows(target[1], k_first, k_count).add_(dv)
        if ring.size > 1:
            held = grads[step % 2]
            if step > 0:
                wait(arriving)  # the accumulator of this block, from its previous holder
                if calls:
                    held.add_(partial)
            # On to the next holder; after the last step that is the block's own rank.
            arriving = ring.exchange(held, grads[(step + 1) % 2], TAG_GRAD)
        if incoming is not None:
            wait(incoming)
            kv, spare = spare, kv
    wait(arriving)
    home = grads[ring.size % 2] if ring.size > 1 else grads[0]
    return dq_acc.to(q.dtype), home[0].to(k.dtype), home[1].to(v.dtype)


def _unpermute(x, inverse, total_rows, dim, fill):
    """Rows of x (chunk-major order, along dim) back to the local order, padded to total_rows with `fill`."""
    x = x.index_select(dim, inverse)
    missing = total_rows - x.shape[dim]
    if missing:
        shape = list(x.shape)
        shape[dim] = missing
        x = torch.cat([x, torch.full(shape, fill, dtype=x.dtype, device=x.device)], dim)
    return x


class RingAttention(torch.autograd.Function):
    """Autograd over ring_forward/ring_backward; lse is not differentiable (as in flash-attn).

    `permutation` (varlen zigzag): (order, inverse) int64 of the chunk-major rows; the tensors are permuted
    once here and the gradients permuted back."""

    @staticmethod
    def forward(ctx, q, k, v, setup, permutation):
        total_rows = q.shape[0]
        if permutation is not None:
            order = permutation[0]
            q, k, v = (x.index_select(0, order) for x in (q, k, v))
        out, lse = ring_forward(q, k, v, setup)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.setup = setup
        ctx.permutation = permutation
        ctx.total_rows = total_rows
        if permutation is not None:
            inverse = permutation[1]
            out = _unpermute(out, inverse, total_rows, 0, 0.0)
            lse = _unpermute(lse, inverse, total_rows, 1, float("-inf"))
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, _grad_lse):
        q, k, v, out, lse = ctx.saved_tensors
        setup = ctx.setup
        if grad_out is None:
            grad_out = torch.zeros_like(out)
        elif ctx.permutation is not None:
            grad_out = grad_out.index_select(0, ctx.permutation[0])
        setup.check_first = False
        dq, dk, dv = ring_backward(grad_out, q, k, v, out, lse, setup)
        if ctx.permutation is not None:
            inverse = ctx.permutation[1]
            dq, dk, dv = (_unpermute(g, inverse, ctx.total_rows, 0, 0.0) for g in (dq, dk, dv))
        return dq, dk, dv, None, None


def run(q, k, v, setup, permutation=None):
    """(out, lse), through autograd when a gradient is wanted."""
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return RingAttention.apply(q, k, v, setup, permutation)
    with torch.no_grad():
        return RingAttention.forward(_NoContext(), q, k, v, setup, permutation)


class _NoContext:
    """Stands in for autograd's ctx when no backward will be run."""

    def save_for_backward(self, *tensors):
        pass

    def mark_non_differentiable(self, *tensors):
        pass

