"""flash-attn's padding helpers (``flash_attn.bert_padding``), on torch tensors.

They turn a padded batch ``(batch, seqlen, ...)`` with an attention mask into
the packed rows the varlen functions take, and back:

    packed, indices, cu_seqlens, max_seqlen, used = unpad_input(hidden, mask)
    out = cuflash.flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen)
    padded = pad_input(out, indices, batch, seqlen)

Each is differentiable through torch's own indexing ops. torch is imported on
first use, so ``import cuflash`` works without it.
"""

__all__ = ["index_first_axis", "index_put_first_axis", "unpad_input", "pad_input"]


def _torch():
    import torch

    return torch


def index_first_axis(input, indices):
    """``input[indices]`` along the first axis: input ``(n, ...)``, indices int64 ``(m,)`` -> ``(m, ...)``."""
    return input.index_select(0, indices)


def index_put_first_axis(values, indices, first_axis_dim):
    """The inverse scatter: a zero tensor ``(first_axis_dim, ...)`` with ``values`` at rows ``indices``."""
    torch = _torch()
    output = torch.zeros((first_axis_dim, *values.shape[1:]), dtype=values.dtype, device=values.device)
    return output.index_copy(0, indices, values)


def unpad_input(hidden_states, attention_mask, unused_mask=None):
    """Packs the tokens a mask selects.

    hidden_states ``(batch, seqlen, ...)``; attention_mask ``(batch, seqlen)``,
    bool or int, nonzero for a valid token; unused_mask, the same shape, for
    slots that are allocated but unused (they are packed too, and counted in
    cu_seqlens but not in the last return value).

    Returns ``(packed (total, ...), indices (total,) int64 into the flattened
    (batch * seqlen) tokens, cu_seqlens (batch + 1,) int32, max_seqlen_in_batch
    (int), seqused (batch,) int32: valid tokens per sequence)``.
    """
    torch = _torch()
    selected = attention_mask if unused_mask is None else (attention_mask.bool() | unused_mask.bool())
    seqlens = selected.sum(dim=-1, dtype=torch.int32)
    used = attention_mask.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(selected.flatten(), as_tuple=False).flatten()
    cu_seqlens = torch.zeros(seqlens.numel() + 1, dtype=torch.int32, device=seqlens.device)
    cu_seqlens[1:] = torch.cumsum(seqlens, dim=0, dtype=torch.int32)
    max_seqlen = int(seqlens.max().item()) if seqlens.numel() else 0
    flat = hidden_states.reshape(-1, *hidden_states.shape[2:])
    return index_first_axis(flat, indices), indices, cu_seqlens, max_seqlen, used


def pad_input(hidden_states, indices, batch, seqlen):
    """The inverse of :func:`unpad_input`: packed rows ``(total, ...)`` back to ``(batch, seqlen, ...)``,
    zeros where the mask selected nothing."""
    output = index_put_first_axis(hidden_states, indices, batch * seqlen)
    return output.reshape(batch, seqlen, *hidden_states.shape[1:])
