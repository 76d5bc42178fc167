"""Rotary position embeddings with flash-attn's signature (``flash_attn.layers.rotary``).

``apply_rotary_emb(x, cos, sin, interleaved=False, inplace=False,
seqlen_offsets=0, cu_seqlens=None, max_seqlen=None)`` rotates the first
``rotary_dim = 2 * cos.shape[1]`` features of each head of ``x`` by the angle
of the token's position: GPT-NeoX style (feature i with i + rotary_dim/2) by
default, GPT-J style (features 2i and 2i+1) with ``interleaved``. Positions
are ``seqlen_offsets[b] + t`` for token t of sequence b. The arithmetic is in
float32 whatever x's dtype, as flash-attn's kernel does; the result is
rounded once to x's dtype.

These are torch operations (gathers and multiply-adds on x's device, no host
synchronization, so they capture in CUDA graphs). ``flash_attn_with_kvcache``
does not use them: its ``rotary_cos`` / ``rotary_sin`` go to the library, which
rotates q and the appended keys inside the call by the same rule
(src/core/rotary.hpp, docs/semantics.md).
"""

from ._args import InvalidArgumentError

__all__ = ["apply_rotary_emb", "rotate_at"]


def _torch():
    import torch

    return torch


def rotate_at(x, cos, sin, positions, interleaved=False):
    """x ``(..., seqlen, heads, head_dim)`` rotated at ``positions`` (int64, broadcastable to
    ``(..., seqlen)``); cos/sin ``(seqlen_ro, rotary_dim / 2)``. Returns a new tensor."""
    torch = _torch()
    half = cos.shape[-1]
    rotary_dim = 2 * half
    if rotary_dim > x.shape[-1]:
        raise InvalidArgumentError(f"rotary_cos: rotary_dim = 2 * {half} = {rotary_dim} exceeds head_dim {x.shape[-1]}")
    # Positions past the table would be an out-of-bounds gather (a device-side assert on a GPU):
    # clamp, and leave bad lengths to the attention call's own checks.
    positions = positions.clamp(0, cos.shape[0] - 1)
    angle_shape = positions.shape + (1, half)  # one angle per (token, pair), shared by the heads
    c = cos.float()[positions].reshape(angle_shape)
    s = sin.float()[positions].reshape(angle_shape)
    part = x[..., :rotary_dim].float()
    if interleaved:
        first, second = part[..., 0::2], part[..., 1::2]
    else:
        first, second = part[..., :half], part[..., half:]
    rotated_first = first * c - second * s
    rotated_second = first * s + second * c
    if interleaved:
        rotated = torch.stack((rotated_first, rotated_second), dim=-1).flatten(-2)
    else:
        rotated = torch.cat((rotated_first, rotated_second), dim=-1)
    return torch.cat((rotated.to(x.dtype), x[..., rotary_dim:]), dim=-1)


def apply_rotary_emb(x, cos, sin, interleaved=False, inplace=False, seqlen_offsets=0, cu_seqlens=None,
                     max_seqlen=None):
    """flash-attn's ``apply_rotary_emb``: x ``(batch, seqlen, heads, head_dim)``, or packed
    ``(total, heads, head_dim)`` with ``cu_seqlens`` ``(batch + 1,)``; cos/sin
    ``(seqlen_ro, rotary_dim / 2)``; seqlen_offsets an int or ``(batch,)`` tensor."""
    torch = _torch()
    if cu_seqlens is None:
        batch, seqlen = x.shape[0], x.shape[1]
        positions = torch.arange(seqlen, device=x.device).expand(batch, seqlen)
        offsets = torch.as_tensor(seqlen_offsets, device=x.device).long()
        positions = positions + (offsets[:, None] if offsets.dim() == 1 else offsets)
    else:
        total = x.shape[0]
        starts = cu_seqlens[:-1].long()
        sequence = torch.searchsorted(cu_seqlens[1:].long(), torch.arange(total, device=x.device), right=True)
        sequence = sequence.clamp(max=starts.numel() - 1)  # packed rows after the last sequence
        positions = torch.arange(total, device=x.device) - starts[sequence]
        offsets = torch.as_tensor(seqlen_offsets, device=x.device).long()
        positions = positions + (offsets[sequence] if offsets.dim() == 1 else offsets)
    out = rotate_at(x, cos, sin, positions, interleaved)
    if inplace:
        x.copy_(out)
        return x
    return out
