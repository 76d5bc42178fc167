"""How a sequence is split over the ranks of a ring, and put back together.

A sequence of length S is cut into equal chunks: W of them for the
"contiguous" layout (rank r holds chunk r), 2W for "zigzag" (rank r holds
chunks r and 2W-1-r, in that order), so that under a causal mask every rank
has the same amount of work (an early chunk and its mirror at the end). A
varlen batch is split sequence by sequence, each rank holding its share of
every sequence, so the local cu_seqlens are the same on every rank.
"""

import torch
import torch.distributed as dist

from .._args import InvalidArgumentError

LAYOUTS = ("zigzag", "contiguous")
# Equal chunks of each rank's shard: zigzag's two (an early and a late one), contiguous's one.
CHUNKS_PER_RANK = {"zigzag": 2, "contiguous": 1}


def check_layout(layout):
    if layout not in LAYOUTS:
        raise InvalidArgumentError(f"layout: expected 'zigzag' or 'contiguous', got {layout!r}")
    return layout


def _check_world(world_size, rank):
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise InvalidArgumentError(f"world_size: expected an integer >= 1, got {world_size!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise InvalidArgumentError(f"rank: expected an integer in [0, {world_size}), got {rank!r}")


def _chunk_count(world_size, layout):
    return world_size * CHUNKS_PER_RANK[layout]


def _chunks_of_rank(world_size, rank, layout):
    """The global chunk indices rank `rank` holds, in the order of its shard."""
    return (rank,) if layout == "contiguous" else (rank, 2 * world_size - 1 - rank)


def shard_sequence(x, world_size, rank, layout="zigzag", dim=1):
    """This rank's shard of `x` along `dim` (the sequence): chunk `rank` of `world_size` (contiguous; a view) or
    chunks `rank` and `2*world_size-1-rank` of `2*world_size`, concatenated (zigzag). Differentiable."""
    check_layout(layout)
    _check_world(world_size, rank)
    dim = dim % x.dim()
    chunks = _chunk_count(world_size, layout)
    if x.shape[dim] % chunks:
        raise InvalidArgumentError(f"x: its length along dim {dim} ({x.shape[dim]}) must be divisible by {chunks} "
                                   f"({layout} layout over {world_size} ranks)")
    chunk_len = x.shape[dim] // chunks
    parts = [x.narrow(dim, chunk * chunk_len, chunk_len) for chunk in _chunks_of_rank(world_size, rank, layout)]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim)


def unshard_sequence(shards, layout="zigzag", dim=1):
    """The whole sequence from every rank's shard (shards[r] of rank r): the inverse of shard_sequence.
    Differentiable."""
    check_layout(layout)
    shards = list(shards)
    if not shards:
        raise InvalidArgumentError("shards: expected one tensor per rank, got none")
    dim = dim % shards[0].dim()
    if any(s.shape != shards[0].shape for s in shards):
        shapes = [tuple(s.shape) for s in shards]
        raise InvalidArgumentError(f"shards: expected the same shape on every rank, got {shapes}")
    if layout == "contiguous":
        return torch.cat(shards, dim)
    if shards[0].shape[dim] % 2:
        raise InvalidArgumentError(f"shards: a zigzag shard holds two equal chunks, so its length along dim {dim} "
                                   f"must be even, got {shards[0].shape[dim]}")
    halves = [s.chunk(2, dim) for s in shards]
    return torch.cat([h[0] for h in halves] + [h[1] for h in reversed(halves)], dim)


def _host_cu_seqlens(cu_seqlens, name="cu_seqlens_global"):
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 1:
        raise InvalidArgumentError(f"{name}: expected a 1-D int32 tensor [batch + 1]")
    values = cu_seqlens.tolist()
    if values[0] != 0 or any(b < a for a, b in zip(values, values[1:])):
        raise InvalidArgumentError(f"{name}: expected non-decreasing offsets starting at 0, got {values}")
    return values


def _varlen_rows(cu, world_size, rank, layout):
    """The global rows (int64, in the local order) that rank `rank` holds, and its local sequence lengths."""
    chunks = _chunk_count(world_size, layout)
    pieces, lengths = [], []
    for start, end in zip(cu, cu[1:]):
        if (end - start) % chunks:
            raise InvalidArgumentError(f"cu_seqlens_global: every sequence's length must be divisible by {chunks} "
                                       f"({layout} layout over {world_size} ranks), got {end - start}")
        chunk_len = (end - start) // chunks
        for chunk in _chunks_of_rank(world_size, rank, layout):
            pieces.append(torch.arange(start + chunk * chunk_len, start + (chunk + 1) * chunk_len))
        lengths.append(chunk_len * CHUNKS_PER_RANK[layout])
    rows = torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.int64)
    return rows, lengths


def shard_varlen(x, cu_seqlens_global, world_size, rank, layout="zigzag"):
    """This rank's share of a packed varlen batch x [total, ...] (dim 0): of every sequence its chunk `rank`
    (contiguous) or its chunks `rank` then `2W-1-rank` (zigzag). Every sequence's length must be divisible by W
    (contiguous) or 2W (zigzag). Returns (x_local, cu_seqlens_local int32 on cu_seqlens_global's device,
    max_seqlen_local). Differentiable in x."""
    check_layout(layout)
    _check_world(world_size, rank)
    cu = _host_cu_seqlens(cu_seqlens_global)
    if cu[-1] > x.shape[0]:
        raise InvalidArgumentError(f"cu_seqlens_global: its last offset {cu[-1]} exceeds x's rows {x.shape[0]}")
    rows, lengths = _varlen_rows(cu, world_size, rank, layout)
    cu_local = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    if lengths:
        cu_local[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int64), 0).to(torch.int32)
    return (x.index_select(0, rows.to(x.device)), cu_local.to(cu_seqlens_global.device),
            max(lengths, default=0))


def unshard_varlen(shards, cu_seqlens_global, layout="zigzag"):
    """The packed batch [cu_seqlens_global[-1], ...] from every rank's shard_varlen share (shards[r] of rank r):
    its inverse. Differentiable."""
    check_layout(layout)
    shards = list(shards)
    if not shards:
        raise InvalidArgumentError("shards: expected one tensor per rank, got none")
    cu = _host_cu_seqlens(cu_seqlens_global)
    world_size = len(shards)
    rows = [_varlen_rows(cu, world_size, rank, layout)[0] for rank in range(world_size)]
    for rank, (shard, rank_rows) in enumerate(zip(shards, rows)):
        if shard.shape[0] != rank_rows.numel():
            raise InvalidArgumentError(f"shards[{rank}]: expected {rank_rows.numel()} rows from cu_seqlens_global, "
                                       f"got {shard.shape[0]}")
    # Row i of the concatenated shards is global row order[i]; gather by the inverse permutation.
    order = torch.cat(rows)
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel())
    return torch.cat(shards, 0).index_select(0, inverse.to(shards[0].device))


def _all_gather(x_local, group):
    x_local = x_local.contiguous()
    world_size = dist.get_world_size(group)
    gathered = [torch.empty_like(x_local) for _ in range(world_size)]
    dist.all_gather(gathered, x_local, group=group)
    return gathered


def gather_sequence(x_local, group=None, layout="zigzag", dim=1):
    """The whole sequence on every rank: all_gather of every rank's shard, then unshard_sequence.
    Not differentiable (torch.distributed's all_gather is not)."""
    check_layout(layout)
    return unshard_sequence(_all_gather(x_local, group), layout, dim)


def gather_varlen(x_local, cu_seqlens_global, group=None, layout="zigzag"):
    """The whole packed varlen batch on every rank: all_gather of every rank's share, then unshard_varlen.
    Not differentiable."""
    check_layout(layout)
    return unshard_varlen(_all_gather(x_local, group), cu_seqlens_global, layout)
