"""cuflash.bert_padding: flash-attn's unpad_input / pad_input / index_first_axis on torch
tensors (CPU here; they are torch indexing ops, the same on a GPU), and the padded-batch
recipe they exist for: unpad, varlen attention, pad back, against float64 attention of
each sequence alone."""

import pytest

torch = pytest.importorskip("torch")

import cuflash  # noqa: E402
from cuflash.bert_padding import index_first_axis, pad_input, unpad_input  # noqa: E402
from test_torch import reference_attention, rel_l2  # noqa: E402


def padded_batch(lengths, seqlen, width=6, seed=0):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(len(lengths), seqlen, 3, width, generator=gen)
    mask = torch.zeros(len(lengths), seqlen, dtype=torch.int32)
    for b, n in enumerate(lengths):
        mask[b, :n] = 1
    return hidden, mask


def test_unpad_then_pad_round_trips_and_counts():
    lengths, seqlen = [3, 0, 5, 1], 5
    hidden, mask = padded_batch(lengths, seqlen)
    packed, indices, cu_seqlens, max_seqlen, used = unpad_input(hidden, mask)
    assert packed.shape == (sum(lengths), 3, 6)
    assert torch.equal(packed, hidden[mask.bool()])
    assert cu_seqlens.dtype == torch.int32 and cu_seqlens.tolist() == [0, 3, 3, 8, 9]
    assert max_seqlen == 5 and used.tolist() == lengths
    assert torch.equal(index_first_axis(hidden.reshape(-1, 3, 6), indices), packed)
    back = pad_input(packed, indices, len(lengths), seqlen)
    assert torch.equal(back, hidden * mask[:, :, None, None])


def test_unused_slots_are_packed_but_not_counted_as_used():
    hidden, mask = padded_batch([2, 1], 4)
    unused = torch.zeros_like(mask)
    unused[0, 2] = 1
    packed, _, cu_seqlens, max_seqlen, used = unpad_input(hidden, mask, unused)
    assert cu_seqlens.tolist() == [0, 3, 4] and max_seqlen == 3 and used.tolist() == [2, 1]
    assert torch.equal(packed[2], hidden[0, 2])


def test_gradients_flow_through_unpad_and_pad():
    hidden, mask = padded_batch([2, 4], 4)
    hidden.requires_grad_()
    packed, indices, *_ = unpad_input(hidden, mask)
    pad_input(packed * 2, indices, 2, 4).sum().backward()
    assert torch.equal(hidden.grad, 2 * mask[:, :, None, None].expand_as(hidden).to(hidden.dtype))


def test_padded_batch_through_varlen_attention_matches_each_sequence():
    lengths, seqlen, heads, dim = [7, 2, 16, 11], 16, 2, 32
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(len(lengths), seqlen, heads, dim, generator=gen) for _ in range(3))
    mask = torch.zeros(len(lengths), seqlen, dtype=torch.bool)
    for b, n in enumerate(lengths):
        mask[b, :n] = True
    q_packed, indices, cu, max_seqlen, _ = unpad_input(q, mask)
    k_packed, v_packed = unpad_input(k, mask)[0], unpad_input(v, mask)[0]
    out = cuflash.flash_attn_varlen_func(q_packed, k_packed, v_packed, cu, cu, max_seqlen, max_seqlen, causal=True)
    padded = pad_input(out, indices, len(lengths), seqlen)
    for b, n in enumerate(lengths):
        want = reference_attention(*(x[b:b + 1, :n].double() for x in (q, k, v)), causal=True)
        assert rel_l2(padded[b:b + 1, :n], want) < 1e-5
        assert not padded[b, n:].any()
