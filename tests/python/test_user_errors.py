"""What a new user meets from Python (numpy, CPU backend; runs in CI): read-only
arrays are never written, every bad argument is the documented exception
(ValueError for bad input) naming the argument, and empty tensors give empty
results of the right shapes."""

import numpy as np
import pytest

import cuflash
import reference as ref


def randn(rng, *shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


@pytest.fixture
def rng():
    return np.random.default_rng(17)


def paged_cache(rng, batch=2, pages_per_seq=4, page=8, heads_kv=2, dim=32):
    num_pages = batch * pages_per_seq
    k_cache = randn(rng, num_pages, page, heads_kv, dim)
    v_cache = randn(rng, num_pages, page, heads_kv, dim)
    block_table = rng.permutation(num_pages).astype(np.int32).reshape(batch, pages_per_seq)
    return k_cache, v_cache, block_table


# 1. Read-only caches ------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["writeable_false", "mmap_r"])
def test_append_into_a_read_only_cache_is_refused_and_nothing_changes(rng, tmp_path, how):
    k_cache, v_cache, block_table = paged_cache(rng)
    if how == "mmap_r":
        np.save(tmp_path / "k.npy", k_cache)
        k_cache = np.load(tmp_path / "k.npy", mmap_mode="r")
    else:
        k_cache.flags.writeable = False
    before = np.array(k_cache, copy=True)
    q = randn(rng, 2, 1, 4, 32)
    k_new, v_new = randn(rng, 2, 1, 2, 32), randn(rng, 2, 1, 2, 32)
    seqlens = np.array([3, 9], np.int32)
    with pytest.raises(ValueError, match="k_cache: the call writes into it, and it is read-only"):
        cuflash.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens,
                                        block_table=block_table)
    with pytest.raises(ValueError, match="k_cache: .*read-only"):
        cuflash.attention(q, k_cache, v_cache, k_new=k_new, v_new=v_new, seqlens_k=seqlens, block_table=block_table)
    assert np.array_equal(np.asarray(k_cache), before)


def test_read_only_inputs_are_fine(rng):
    q, k, v = randn(rng, 1, 8, 2, 32), randn(rng, 1, 8, 2, 32), randn(rng, 1, 8, 2, 32)
    for x in (q, k, v):
        x.flags.writeable = False
    out = cuflash.flash_attn_func(q, k, v, causal=True)
    want, _ = ref.dense(q, k, v, causal=True)
    assert ref.max_abs(out, want) < 1e-5


def test_attending_a_read_only_cache_without_append_is_fine(rng):
    k_cache, v_cache, block_table = paged_cache(rng)
    k_cache.flags.writeable = False
    v_cache.flags.writeable = False
    q = randn(rng, 2, 1, 4, 32)
    out = cuflash.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=np.array([3, 9], np.int32),
                                          block_table=block_table)
    assert out.shape == q.shape and np.isfinite(out).all()


# 2. Errors are the documented exceptions, naming the argument --------------------------------


def test_wrong_rank_is_a_value_error(rng):
    q = randn(rng, 32)
    with pytest.raises(ValueError, match=r"q: expected rank 4"):
        cuflash.flash_attn_func(q, q, q)
    with pytest.raises(ValueError, match=r"q: expected rank 4"):
        cuflash.attention(randn(rng, 4, 2, 32), randn(rng, 1, 4, 2, 32), randn(rng, 1, 4, 2, 32))
    with pytest.raises(ValueError, match=r"q: expected rank 3 \(varlen"):
        cuflash.flash_attn_varlen_func(randn(rng, 1, 4, 2, 32), randn(rng, 4, 2, 32), randn(rng, 4, 2, 32),
                                       np.array([0, 4], np.int32), np.array([0, 4], np.int32), 4, 4)


def test_scalars_and_lists_are_value_errors(rng):
    q, k, v = randn(rng, 1, 4, 2, 32), randn(rng, 1, 4, 2, 32), randn(rng, 1, 4, 2, 32)
    with pytest.raises(ValueError, match=r"q: expected a tensor of rank >= 1, got a scalar"):
        cuflash.flash_attn_func(np.float32(1.0), k, v)
    with pytest.raises(ValueError, match=r"k: expected a tensor .* got a list"):
        cuflash.flash_attn_func(q, k.tolist(), v)
    with pytest.raises(ValueError, match=r"v: expected a tensor .* got a float"):
        cuflash.attention(q, k, 1.5)
    with pytest.raises(ValueError, match=r"cu_seqlens_q: expected a tensor .* got a list"):
        cuflash.flash_attn_varlen_func(q[0], k[0], v[0], [0, 4], np.array([0, 4], np.int32), 4, 4)


def test_missing_or_mistyped_index_tensors(rng):
    q, k, v = randn(rng, 4, 2, 32), randn(rng, 4, 2, 32), randn(rng, 4, 2, 32)
    with pytest.raises(ValueError, match=r"cu_seqlens_q: dtype int64 is not supported \(expected int32\)"):
        cuflash.flash_attn_varlen_func(q, k, v, np.array([0, 4], np.int64), np.array([0, 4], np.int32), 4, 4)
    with pytest.raises(ValueError, match="max_seqlen_q and max_seqlen_k: required"):
        cuflash.attention(q, k, v, cu_seqlens_q=np.array([0, 4], np.int32), cu_seqlens_k=np.array([0, 4], np.int32))
    dense = randn(rng, 1, 4, 2, 32)
    out, lse = cuflash.attention(dense, dense, dense, return_lse=True)
    with pytest.raises(ValueError, match=r"lse: required, got None"):
        cuflash.attention_backward(dense, dense, dense, dense, out, None)


def test_huge_integers_are_value_errors(rng):
    q, k, v = randn(rng, 4, 2, 32), randn(rng, 4, 2, 32), randn(rng, 4, 2, 32)
    cu = np.array([0, 4], np.int32)
    with pytest.raises(ValueError, match=r"max_seqlen_q: expected an integer in \[0, 2147483647\], got 1099511627776"):
        cuflash.flash_attn_varlen_func(q, k, v, cu, cu, 2**40, 4)
    with pytest.raises(ValueError, match=r"max_seqlen_k: expected an integer, got float"):
        cuflash.flash_attn_varlen_func(q, k, v, cu, cu, 4, 4.5)
    with pytest.raises(ValueError, match=r"window_size\[0\]: expected an integer"):
        cuflash.attention(q[None], k[None], v[None], window_size=(2**40, 0))
    with pytest.raises(ValueError, match=r"window_size: expected \(left, right\)"):
        cuflash.attention(q[None], k[None], v[None], window_size=5)


def test_bad_option_types_are_value_errors(rng):
    q = randn(rng, 1, 4, 2, 32)
    with pytest.raises(ValueError, match="softmax_scale: expected a number"):
        cuflash.attention(q, q, q, softmax_scale="big")
    with pytest.raises(ValueError, match="backend: expected one of"):
        cuflash.attention(q, q, q, backend=3)


# 3. Empty tensors ------------------------------------------------------------------------------


@pytest.mark.parametrize("shape_q,shape_kv", [
    ((0, 8, 2, 32), (0, 8, 2, 32)),   # no sequences
    ((2, 0, 2, 32), (2, 8, 2, 32)),   # no queries
    ((2, 4, 0, 32), (2, 8, 0, 32)),   # no heads
])
def test_empty_dense_forward_and_backward(rng, shape_q, shape_kv):
    q, k, v = randn(rng, *shape_q), randn(rng, *shape_kv), randn(rng, *shape_kv)
    out, lse = cuflash.attention(q, k, v, causal=True, return_lse=True)
    assert out.shape == q.shape
    assert lse.shape == (shape_q[0], shape_q[2], shape_q[1])
    dq, dk, dv = cuflash.attention_backward(np.ones_like(out), q, k, v, out, lse, causal=True)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    assert not np.any(dk) and not np.any(dv)  # keys no query sees get zero gradients, written


def test_no_keys_gives_zero_rows_and_minus_infinity(rng):
    q, k, v = randn(rng, 2, 4, 2, 32), randn(rng, 2, 0, 2, 32), randn(rng, 2, 0, 2, 32)
    out, lse = cuflash.attention(q, k, v, return_lse=True)
    assert out.shape == q.shape and not np.any(out)
    assert np.all(np.isneginf(lse))
    dq, dk, dv = cuflash.attention_backward(np.ones_like(out), q, k, v, out, lse)
    assert not np.any(dq) and dk.shape == k.shape


def test_empty_varlen_batches(rng):
    q, k, v = randn(rng, 0, 2, 32), randn(rng, 0, 2, 32), randn(rng, 0, 2, 32)
    for cu in (np.array([0], np.int32), np.array([0, 0, 0], np.int32)):
        out, lse = cuflash.attention(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=0, max_seqlen_k=0,
                                     return_lse=True)
        assert out.shape == (0, 2, 32) and lse.shape == (2, 0)
        dq, dk, dv = cuflash.attention_backward(out, q, k, v, out, lse, cu_seqlens_q=cu, cu_seqlens_k=cu,
                                                max_seqlen_q=0, max_seqlen_k=0)
        assert dq.shape == q.shape


def test_empty_kv_cache_batch(rng):
    k_cache, v_cache = randn(rng, 0, 16, 2, 32), randn(rng, 0, 16, 2, 32)
    q = randn(rng, 0, 1, 4, 32)
    out = cuflash.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=np.zeros(0, np.int32))
    assert out.shape == q.shape


def test_empty_merge_states(rng):
    out_a, out_b = randn(rng, 0, 4, 2, 32), randn(rng, 0, 4, 2, 32)
    lse_a, lse_b = randn(rng, 0, 2, 4), randn(rng, 0, 2, 4)
    out, lse = cuflash.merge_states(out_a, lse_a, out_b, lse_b)
    assert out.shape == out_a.shape and lse.shape == lse_a.shape


def test_bad_input_is_both_value_error_and_runtime_error(rng):
    """flash-attn raises RuntimeError where cuflash says invalid_argument: code catching either works."""
    assert issubclass(cuflash.InvalidArgumentError, ValueError)
    assert issubclass(cuflash.InvalidArgumentError, RuntimeError)
    q, k = randn(rng, 1, 4, 4, 32), randn(rng, 1, 4, 3, 32)
    with pytest.raises(RuntimeError, match=r"k: heads_kv \(dim 2\) must divide heads_q = 4"):
        cuflash.flash_attn_func(q, k, k)  # from the library
    with pytest.raises(cuflash.InvalidArgumentError, match=r"q: expected rank 4"):
        cuflash.flash_attn_func(q[0], k, k)  # from the Python checks
    k_cache, v_cache, block_table = paged_cache(rng)
    block_table[0, 0] = 10_000
    with pytest.raises(RuntimeError, match="block_table"):
        cuflash.flash_attn_with_kvcache(randn(rng, 2, 1, 4, 32), k_cache, v_cache,
                                        cache_seqlens=np.array([3, 9], np.int32), block_table=block_table)
