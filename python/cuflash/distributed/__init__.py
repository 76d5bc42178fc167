"""Ring attention (context parallelism) over torch.distributed.

The sequence is sharded over the ranks of a process group; each rank holds
its queries and its K/V block, the K/V blocks travel round the ring, and
every rank ends with the exact attention of its queries over the whole
sequence (and, through autograd, exact gradients). GPU tensors go over an
NCCL group (cuflash backend "auto" by default: cuDNN or cuflash's kernels
per local call), CPU tensors over gloo (backend "cpu").

    from cuflash.distributed import ring_flash_attn_func, shard_sequence
    q_local = shard_sequence(q, world_size, rank)          # zigzag by default
    out_local = ring_flash_attn_func(q_local, k_local, v_local, causal=True)

Layouts: "zigzag" (rank r holds chunks r and 2W-1-r of 2W equal chunks,
concatenated: a causal mask gives every rank the same work) and
"contiguous" (chunk r of W). The helpers cut and reassemble sequences:
shard_sequence/unshard_sequence (dense), shard_varlen/unshard_varlen
(packed varlen batches, sequence by sequence), gather_sequence/gather_varlen
(all_gather then unshard).

Which kernel calls each ring step makes is decided in C++ (the ring planner,
shared with the C++ ring over NCCL); the partial results merge in float32
through cuflash's merge_states.
"""

try:
    import torch as _torch  # noqa: F401  (the package needs torch; say so plainly)
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError("cuflash.distributed needs torch (torch.distributed)") from error

from .. import _api, _args
from .._args import InvalidArgumentError
from ._comm import Ring
from ._ring import Setup, run
from ._shard import (
    CHUNKS_PER_RANK,
    LAYOUTS,
    check_layout,
    gather_sequence,
    gather_varlen,
    shard_sequence,
    shard_varlen,
    unshard_sequence,
    unshard_varlen,
)

__all__ = [
    "ring_flash_attn_func",
    "ring_flash_attn_varlen_func",
    "shard_sequence",
    "unshard_sequence",
    "shard_varlen",
    "unshard_varlen",
    "gather_sequence",
    "gather_varlen",
    "LAYOUTS",
    "InvalidArgumentError",
]


def _backend(backend, q):
    # auto: each local call on the fastest backend that runs it (cuDNN where a
    # step needs no diagonal offset, cuflash's kernels where it does).
    return "auto" if backend is None else _args.backend(backend)


def _check_kv(q, k, v, seq_dim):
    _args.array(k, "k")
    _args.array(v, "v")
    if k.dim() != q.dim() or tuple(k.shape) != tuple(v.shape):
        raise InvalidArgumentError(f"k and v: expected the same shape and q's rank, got k {tuple(k.shape)}, "
                                   f"v {tuple(v.shape)}, q {tuple(q.shape)}")
    if k.shape[seq_dim] != q.shape[seq_dim]:
        raise InvalidArgumentError(f"k: ring attention is self-attention (every rank's K/V shard matches its query "
                                   f"shard), so k's length along dim {seq_dim} must be q's {q.shape[seq_dim]}, got "
                                   f"{k.shape[seq_dim]}")


def _finish(setup, q, k, v, permutation, return_lse):
    # Ask the planner once before anything is sent: an unsupported combination fails the same way on every rank.
    setup.calls(setup.ring.rank)
    out, lse = run(q, k, v, setup, permutation)
    return (out, lse) if return_lse else out


def ring_flash_attn_func(q, k, v, causal=False, softmax_scale=None, group=None, layout="zigzag",
                         window_size=(-1, -1), alibi_slopes=None, softcap=0.0, deterministic=False, backend=None,
                         return_lse=False):
    """Attention of this rank's queries over the whole sharded sequence.

    q [B, S_local, Hq, D], k/v [B, S_local, Hk, D] (Hq % Hk == 0): this rank's shard along dim 1 (see
    shard_sequence; S_local must be even for zigzag), the same S_local on every rank of `group` (default: the
    default process group; with none initialized, a ring of one). Options as in flash-attn: causal, window_size
    (left, right), alibi_slopes float32 [Hq] or [B, Hq], softcap, softmax_scale (default 1/sqrt(D)), deterministic
    (backward); positions are global, so the result equals attention over the unsharded sequence. backend: the
    cuflash backend of the local kernels (default "auto": per call the fastest that runs it; "cpu" for CPU tensors).

    Returns out [B, S_local, Hq, D] like q, or (out, lse float32 [B, Hq, S_local]) with return_lse.
    Differentiable in q, k and v (not through lse).
    """
    check_layout(layout)
    _args.ranked(q, "q", (4,), "[batch, seqlen_local, heads_q, head_dim]")
    _check_kv(q, k, v, 1)
    _args.optional_array(alibi_slopes, "alibi_slopes")
    chunks = CHUNKS_PER_RANK[layout]
    if q.shape[1] % chunks:
        raise InvalidArgumentError(f"q: a zigzag shard is two equal chunks, so seqlen_local must be even, got "
                                   f"{q.shape[1]}")
    left, right = _args.window(window_size)
    backend = _backend(backend, q)
    key = (softmax_scale, bool(causal), left, right, softcap, bool(deterministic), False, backend)
    setup = Setup(Ring(group), layout, key, bool(causal), (left, right), alibi_slopes, False, q.shape[1] // chunks)
    return _finish(setup, q, k, v, None, return_lse)


def _zigzag_permutation(cu, total_rows, device):
    """(order, inverse) int64 of the chunk-major rows of a zigzag varlen shard: every sequence's front chunk,
    then every back chunk; and the local cu_seqlens as a host list, checked."""
    import torch

    if cu[0] != 0 or any(b < a for a, b in zip(cu, cu[1:])) or cu[-1] > total_rows:
        raise InvalidArgumentError(f"cu_seqlens: expected non-decreasing offsets from 0 to at most q's {total_rows} "
                                   f"rows, got {cu}")
    fronts, backs = [], []
    for start, end in zip(cu, cu[1:]):
        if (end - start) % 2:
            raise InvalidArgumentError(f"cu_seqlens: a zigzag shard of a sequence is two equal chunks, so every local "
                                       f"length must be even, got {end - start}")
        middle = (start + end) // 2
        fronts.append(torch.arange(start, middle))
        backs.append(torch.arange(middle, end))
    order = torch.cat(fronts + backs) if fronts else torch.zeros(0, dtype=torch.int64)
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel())
    return order.to(device), inverse.to(device)


def ring_flash_attn_varlen_func(q, k, v, cu_seqlens, max_seqlen, causal=False, softmax_scale=None, group=None,
                                layout="zigzag", window_size=(-1, -1), alibi_slopes=None, softcap=0.0,
                                deterministic=False, backend=None, return_lse=False):
    """Ring attention of a packed varlen batch (self-attention: the same lengths for q and k).

    q [T_local, Hq, D], k/v [T_local, Hk, D]; cu_seqlens int32 [B+1] of the LOCAL shares (shard_varlen's: of
    each sequence its chunk r (contiguous) or its chunks r then 2W-1-r (zigzag), so every global length is
    divisible by W resp. 2W and the local cu_seqlens are the same on every rank); max_seqlen the local maximum.
    Options as ring_flash_attn_func's (the planner refuses a window and ALiBi with varlen).

    Returns out [T_local, Hq, D] like q, or (out, lse float32 [Hq, T_local]) with return_lse. Differentiable in
    q, k and v. Zigzag reads cu_seqlens on the host once per call (to permute the rows chunk-major).
    """
    check_layout(layout)
    _args.ranked(q, "q", (3,), "varlen: [total_local, heads_q, head_dim]")
    _check_kv(q, k, v, 0)
    _args.ranked(cu_seqlens, "cu_seqlens", (1,), "[batch + 1] int32")
    max_seqlen = _args.integer(max_seqlen, "max_seqlen")
    _args.optional_array(alibi_slopes, "alibi_slopes")
    left, right = _args.window(window_size)
    backend = _backend(backend, q)
    check = _api._check_index_contents
    key = (softmax_scale, bool(causal), left, right, softcap, bool(deterministic), check, backend)
    ring = Ring(group)
    permutation = None
    if layout == "zigzag":
        cu = cu_seqlens.tolist()
        permutation = _zigzag_permutation(cu, q.shape[0], q.device)
        chunk_rows, call_cu, call_max = cu[-1] // 2, cu_seqlens // 2, max_seqlen // 2
    else:
        chunk_rows, call_cu, call_max = q.shape[0], cu_seqlens, max_seqlen
    setup = Setup(ring, layout, key, bool(causal), (left, right), alibi_slopes, True, chunk_rows, call_cu, call_max,
                  check_first=check)
    return _finish(setup, q, k, v, permutation, return_lse)
