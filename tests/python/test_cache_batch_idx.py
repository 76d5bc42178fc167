"""flash_attn_with_kvcache's cache_batch_idx: sequence b reads (and appends into) cache row
cache_batch_idx[b] of a contiguous cache, on numpy (CPU backend, runs in CI) and torch
tensors, against the same call on the rows gathered by hand."""

import numpy as np
import pytest

import cuflash


def inputs(rng, capacity, cache_rows=5, batch=3, heads=4, heads_kv=2, dim=32):
    k_cache = rng.standard_normal((cache_rows, capacity, heads_kv, dim)).astype(np.float32)
    v_cache = rng.standard_normal((cache_rows, capacity, heads_kv, dim)).astype(np.float32)
    q = rng.standard_normal((batch, 2, heads, dim)).astype(np.float32)
    k_new = rng.standard_normal((batch, 2, heads_kv, dim)).astype(np.float32)
    v_new = rng.standard_normal((batch, 2, heads_kv, dim)).astype(np.float32)
    return k_cache, v_cache, q, k_new, v_new


@pytest.mark.parametrize("capacity,append", [(16, False), (16, True), (24, False), (24, True), (1, False)])
def test_cache_batch_idx_reads_and_appends_the_chosen_rows(capacity, append):
    """Capacities: one page per row (16), three pages of 8 per row (24), a row of one key (1)."""
    rng = np.random.default_rng(capacity)
    k_cache, v_cache, q, k_new, v_new = inputs(rng, capacity)
    index = np.array([4, 0, 2], np.int32)
    new_keys = 2 if append else 0
    seqlens = np.array([min(5, capacity - new_keys), 0, capacity - new_keys], np.int32)
    k_rows, v_rows = k_cache[index].copy(), v_cache[index].copy()
    extra = dict(k=k_new, v=v_new) if append else {}
    got = cuflash.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, cache_batch_idx=index,
                                          causal=True, **extra)
    want = cuflash.flash_attn_with_kvcache(q, k_rows, v_rows, cache_seqlens=seqlens, causal=True, **extra)
    assert np.array_equal(got, want)
    assert np.array_equal(k_cache[index], k_rows) and np.array_equal(v_cache[index], v_rows)  # appends landed


def test_cache_batch_idx_refusals():
    rng = np.random.default_rng(0)
    k_cache, v_cache, q, _, _ = inputs(rng, 16)
    with pytest.raises(NotImplementedError, match="cache_batch_idx with a paged cache"):
        cuflash.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=4, cache_batch_idx=np.zeros(3, np.int32),
                                        block_table=np.zeros((3, 1), np.int32))
    strided = np.zeros((5, 48, 2, 32), np.float32)[:, :24]  # rows of 24 keys, 48 apart: pages of 8 need a copy
    with pytest.raises(cuflash.InvalidArgumentError, match="k_cache: with cache_batch_idx, a cache row must be"):
        cuflash.flash_attn_with_kvcache(q, strided, strided, cache_seqlens=4, cache_batch_idx=np.zeros(3, np.int32))
    with pytest.raises(cuflash.InvalidArgumentError, match="block_table"):
        cuflash.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=4,
                                        cache_batch_idx=np.array([0, 9, 1], np.int32))


def test_cache_batch_idx_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    k_cache, v_cache, q, k_new, v_new = (torch.from_numpy(x) for x in inputs(rng, 24))
    index = torch.tensor([1, 3, 0], dtype=torch.int32)
    seqlens = torch.tensor([3, 10, 20], dtype=torch.int32)
    k_rows, v_rows = k_cache[index.long()].clone(), v_cache[index.long()].clone()
    got = cuflash.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens,
                                          cache_batch_idx=index, causal=True)
    want = cuflash.flash_attn_with_kvcache(q, k_rows, v_rows, k_new, v_new, cache_seqlens=seqlens, causal=True)
    assert torch.equal(got, want)
    assert torch.equal(k_cache[index.long()], k_rows)
