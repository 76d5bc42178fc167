"""cuflash's Python package on numpy arrays (the CPU backend), against the
float64 oracle in reference.py: the flash-attn functions, cuflash.attention /
attention_backward / merge_states, KV caches, and the errors."""

import numpy as np
import pytest

import cuflash
import reference as ref

F32_TOL = 2e-5  # max-abs error against float64, float32 inputs
F16_TOL = 3e-3  # rel-L2 error against float64 on the upcast float16 inputs


def randn(rng, *shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def check_close(got, want, dtype, what, tol=None):
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    if dtype == np.float32:
        err = ref.max_abs(got, want)
        assert err <= (tol or F32_TOL), f"{what}: max-abs error {err:.3g}"
    else:
        finite = np.isfinite(want)
        err = ref.rel_l2(np.where(finite, got, 0), np.where(finite, want, 0))
        assert err <= (tol or F16_TOL), f"{what}: rel-L2 error {err:.3g}"


DENSE_CASES = {
    "plain": dict(),
    "causal": dict(causal=True),
    "causal_q_shorter": dict(causal=True, seqlen_q=9, seqlen_k=40),
    "causal_q_longer": dict(causal=True, seqlen_q=40, seqlen_k=9),  # first rows see no key
    "window": dict(window_size=(5, 2)),
    "window_causal": dict(window_size=(7, -1), causal=True),
    "softcap": dict(softcap=3.0, softmax_scale=0.6),
    "alibi_heads": dict(alibi="heads", causal=True),
    "alibi_batch": dict(alibi="batch"),
    "scale": dict(softmax_scale=0.05),
    "mqa": dict(heads_kv=1),
    "head_dim_128": dict(head_dim=128, seqlen_q=17, seqlen_k=17),
}


def dense_case(rng, dtype=np.float32, batch=2, seqlen_q=33, seqlen_k=45, heads=4, heads_kv=2, head_dim=32,
               alibi=None, **options):
    q = randn(rng, batch, seqlen_q, heads, head_dim, dtype=dtype)
    k = randn(rng, batch, seqlen_k, heads_kv, head_dim, dtype=dtype)
    v = randn(rng, batch, seqlen_k, heads_kv, head_dim, dtype=dtype)
    slopes = None
    if alibi == "heads":
        slopes = rng.uniform(0.05, 0.5, heads).astype(np.float32)
    elif alibi == "batch":
        slopes = rng.uniform(0.05, 0.5, (batch, heads)).astype(np.float32)
    return q, k, v, slopes, options


def ref_options(options):
    return dict(scale=options.get("softmax_scale"), causal=options.get("causal", False),
                window=options.get("window_size", (-1, -1)), softcap=options.get("softcap", 0.0))


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("case", list(DENSE_CASES))
def test_flash_attn_func_matches_float64(rng, case, dtype):
    q, k, v, slopes, options = dense_case(rng, dtype, **DENSE_CASES[case])
    out = cuflash.flash_attn_func(q, k, v, alibi_slopes=slopes, **options)
    assert isinstance(out, np.ndarray) and out.dtype == dtype
    want_out, want_lse = ref.dense(q, k, v, alibi=slopes, **ref_options(options))
    check_close(out, want_out, dtype, "out")

    out2, lse = cuflash.attention(q, k, v, alibi_slopes=slopes, return_lse=True, backend="cpu", **options)
    assert lse.dtype == np.float32 and lse.shape == (q.shape[0], q.shape[2], q.shape[1])
    np.testing.assert_array_equal(out2, out)
    check_close(lse, want_lse, np.float32, "lse", tol=1e-4 if dtype == np.float16 else None)
    if case == "causal_q_longer":  # rows with no visible key: out 0, lse -inf
        assert np.all(out[:, :31] == 0) and np.all(np.isneginf(lse[:, :, :31]))


def test_inputs_are_read_through_their_strides(rng):
    """BHSD memory passed as a BSHD view (and a read-only array): read in place, same answer."""
    q_bhsd = randn(rng, 2, 4, 19, 32)
    k_bhsd = randn(rng, 2, 2, 23, 32)
    v = randn(rng, 2, 23, 2, 32)
    q, k = q_bhsd.transpose(0, 2, 1, 3), k_bhsd.transpose(0, 2, 1, 3)
    assert not q.flags.c_contiguous
    v.flags.writeable = False
    before = q_bhsd.copy()
    out = cuflash.flash_attn_func(q, k, v, causal=True)
    check_close(out, ref.dense(q, k, v, causal=True)[0], np.float32, "out")
    np.testing.assert_array_equal(q_bhsd, before)


def test_last_dim_not_contiguous_is_copied_like_flash_attn(rng):
    q = randn(rng, 1, 8, 2, 64)[..., ::2]
    k, v = randn(rng, 1, 8, 2, 32), randn(rng, 1, 8, 2, 32)
    check_close(cuflash.flash_attn_func(q, k, v), ref.dense(q, k, v)[0], np.float32, "out")


def test_packed_functions(rng):
    qkv = randn(rng, 2, 21, 3, 4, 32)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    want = ref.dense(q, k, v, causal=True)[0]
    check_close(cuflash.flash_attn_qkvpacked_func(qkv, causal=True), want, np.float32, "qkvpacked")
    kv = np.ascontiguousarray(qkv[:, :, 1:])
    check_close(cuflash.flash_attn_kvpacked_func(q, kv, causal=True), want, np.float32, "kvpacked")


def varlen_case(rng, lengths_q, lengths_k, heads=4, heads_kv=2, head_dim=32, dtype=np.float32, spare_rows=3):
    cu_q = np.concatenate([[0], np.cumsum(lengths_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lengths_k)]).astype(np.int32)
    q = randn(rng, cu_q[-1] + spare_rows, heads, head_dim, dtype=dtype)  # rows past the last sequence
    k = randn(rng, cu_k[-1], heads_kv, head_dim, dtype=dtype)
    v = randn(rng, cu_k[-1], heads_kv, head_dim, dtype=dtype)
    return q, k, v, cu_q, cu_k


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_varlen(rng, causal, dtype):
    lengths_q, lengths_k = [5, 0, 17, 1], [9, 3, 17, 30]
    q, k, v, cu_q, cu_k = varlen_case(rng, lengths_q, lengths_k, dtype=dtype)
    out = cuflash.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), causal=causal,
                                         window_size=(6, -1))
    want_out, want_lse = ref.varlen(q, k, v, cu_q, cu_k, causal=causal, window=(6, -1))
    check_close(out, want_out, dtype, "varlen out")
    assert np.all(out[cu_q[-1]:] == 0), "rows past the last sequence must be zero"
    _, lse = cuflash.attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=17, max_seqlen_k=30,
                               causal=causal, window_size=(6, -1), return_lse=True)
    assert lse.shape == (4, q.shape[0])
    check_close(lse[:, : cu_q[-1]], want_lse[:, : cu_q[-1]], np.float32, "varlen lse",
                tol=1e-4 if dtype == np.float16 else None)


def test_varlen_packed_functions(rng):
    lengths = [4, 11, 7]
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    qkv = randn(rng, cu[-1], 3, 2, 32)
    q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
    want = ref.varlen(q, k, v, cu, cu, causal=True)[0]
    check_close(cuflash.flash_attn_varlen_qkvpacked_func(qkv, cu, 11, causal=True), want, np.float32, "qkv")
    kv = np.ascontiguousarray(qkv[:, 1:])
    check_close(cuflash.flash_attn_varlen_kvpacked_func(q, kv, cu, cu, 11, 11, causal=True), want, np.float32, "kv")


@pytest.mark.parametrize("page_size", [4, 6, 16])
def test_varlen_keys_in_pages(rng, page_size):
    """flash_attn_varlen_func with block_table: sequence b's cu_seqlens_k[b+1] - cu_seqlens_k[b] keys are read
    from its pages (shuffled, one page no sequence uses); causal bottom-right with fewer queries than keys."""
    lengths_q, lengths_k = [5, 0, 17, 1], [9, 3, 17, 30]
    pages_per_seq = -(-max(lengths_k) // page_size)
    num_pages = len(lengths_q) * pages_per_seq + 1
    q = randn(rng, sum(lengths_q), 4, 32)
    k_cache, v_cache = randn(rng, num_pages, page_size, 2, 32), randn(rng, num_pages, page_size, 2, 32)
    table = rng.permutation(num_pages)[:len(lengths_q) * pages_per_seq].reshape(len(lengths_q), -1).astype(np.int32)
    cu_q, cu_k = (np.concatenate([[0], np.cumsum(n)]).astype(np.int32) for n in (lengths_q, lengths_k))
    out = cuflash.flash_attn_varlen_func(q, k_cache, v_cache, cu_q, cu_k, max(lengths_q), max(lengths_k),
                                         causal=True, block_table=table)
    want_out, want_lse = ref.paged_varlen(q, k_cache, v_cache, cu_q, cu_k, table, causal=True)
    check_close(out, want_out, np.float32, "paged varlen out")
    _, lse = cuflash.attention(q, k_cache, v_cache, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=17,
                               max_seqlen_k=30, block_table=table, causal=True, return_lse=True, backend="cpu")
    check_close(lse, want_lse, np.float32, "paged varlen lse")
    bad = table.copy()
    bad[3, -1] = num_pages  # sequence 3's last page: its keys up to 29
    with pytest.raises(ValueError, match="block_table"):
        cuflash.flash_attn_varlen_func(q, k_cache, v_cache, cu_q, cu_k, 17, 30, block_table=bad)


def test_kvcache_contiguous_int_seqlens(rng):
    q = randn(rng, 3, 2, 4, 32)
    k_cache, v_cache = randn(rng, 3, 40, 2, 32), randn(rng, 3, 40, 2, 32)
    out, lse = cuflash.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=25, causal=True,
                                               return_softmax_lse=True)
    want_out, want_lse, _, _ = ref.kvcache(q, k_cache, v_cache, [25, 25, 25], causal=True)
    check_close(out, want_out, np.float32, "out")
    check_close(lse, want_lse, np.float32, "lse")
    # No cache_seqlens: the whole cache.
    out_full = cuflash.flash_attn_with_kvcache(q, k_cache, v_cache)
    check_close(out_full, ref.kvcache(q, k_cache, v_cache, [40] * 3)[0], np.float32, "whole cache")


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_kvcache_paged_append_updates_cache_in_place(rng, dtype):
    batch, page_size, num_pages, new = 2, 8, 7, 3
    q = randn(rng, batch, new, 4, 64, dtype=dtype)
    k_cache, v_cache = randn(rng, num_pages, page_size, 1, 64, dtype=dtype), randn(rng, num_pages, page_size, 1, 64,
                                                                                   dtype=dtype)
    k_new, v_new = randn(rng, batch, new, 1, 64, dtype=dtype), randn(rng, batch, new, 1, 64, dtype=dtype)
    block_table = np.array([[6, 2, 4], [0, 5, 1]], dtype=np.int32)
    seqlens = np.array([13, 21], dtype=np.int32)
    want_out, want_lse, want_k, want_v = ref.kvcache(q, k_cache, v_cache, seqlens, block_table, k_new, v_new,
                                                     causal=True, softcap=4.0)
    k_before = k_cache.copy()
    out = cuflash.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens,
                                         block_table=block_table, causal=True, softcap=4.0)
    check_close(out, want_out, dtype, "paged out")
    np.testing.assert_array_equal(k_cache, want_k.astype(dtype))  # appended in place, nothing else touched
    np.testing.assert_array_equal(v_cache, want_v.astype(dtype))
    np.testing.assert_array_equal(seqlens, [13, 21])  # as flash-attn: the caller advances the lengths
    assert not np.array_equal(k_cache, k_before)


def test_failed_call_writes_nothing(rng):
    q = randn(rng, 2, 1, 2, 32)
    k_cache, v_cache = randn(rng, 2, 10, 2, 32), randn(rng, 2, 10, 2, 32)
    k_new, v_new = randn(rng, 2, 4, 2, 32), randn(rng, 2, 4, 2, 32)
    before = k_cache.copy()
    with pytest.raises(ValueError, match="k_new"):  # 8 + 4 keys do not fit in 10
        cuflash.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new,
                                        cache_seqlens=np.array([2, 8], dtype=np.int32))
    np.testing.assert_array_equal(k_cache, before)


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("case", ["plain", "causal_q_longer", "softcap", "alibi_batch", "window_causal", "mqa"])
def test_backward_dense(rng, case, deterministic):
    q, k, v, slopes, options = dense_case(rng, **DENSE_CASES[case])
    dout = randn(rng, *q.shape)
    out, lse = cuflash.attention(q, k, v, alibi_slopes=slopes, return_lse=True, **options)
    dq, dk, dv = cuflash.attention_backward(dout, q, k, v, out, lse, alibi_slopes=slopes,
                                            deterministic=deterministic, **options)
    _, _, want_dq, want_dk, want_dv = ref.dense(q, k, v, dout=dout, alibi=slopes, **ref_options(options))
    for got, want, name in ((dq, want_dq, "dq"), (dk, want_dk, "dk"), (dv, want_dv, "dv")):
        check_close(got, want, np.float32, name, tol=1e-4)


def test_backward_varlen(rng):
    q, k, v, cu_q, cu_k = varlen_case(rng, [6, 13, 0], [6, 20, 4], spare_rows=0)
    dout = randn(rng, *q.shape)
    options = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=13, max_seqlen_k=20, causal=True)
    out, lse = cuflash.attention(q, k, v, return_lse=True, **options)
    grads = cuflash.attention_backward(dout, q, k, v, out, lse, **options)
    want = ref.varlen(q, k, v, cu_q, cu_k, dout=dout, causal=True)[2:]
    for got, expected, name in zip(grads, want, ("dq", "dk", "dv")):
        check_close(got, expected, np.float32, name, tol=1e-4)


def test_merge_states(rng):
    q = randn(rng, 2, 5, 4, 32)
    k, v = randn(rng, 2, 30, 4, 32), randn(rng, 2, 30, 4, 32)
    out_a, lse_a = cuflash.attention(q, k[:, :12], v[:, :12], return_lse=True)
    out_b, lse_b = cuflash.attention(q, k[:, 12:], v[:, 12:], return_lse=True)
    out, lse = cuflash.merge_states(out_a, lse_a, out_b, lse_b)
    full_out, full_lse = ref.dense(q, k, v)
    check_close(out, full_out, np.float32, "merged out")
    check_close(lse, full_lse, np.float32, "merged lse")
    want_out, want_lse = ref.merge(out_a, lse_a, out_b, lse_b)
    check_close(out, want_out, np.float32, "merge formula")


def test_errors_are_python_exceptions_with_the_library_message(rng):
    q, k, v = randn(rng, 1, 4, 4, 32), randn(rng, 1, 4, 3, 32), randn(rng, 1, 4, 3, 32)
    with pytest.raises(ValueError, match=r"k: heads_kv \(dim 2\) must divide heads_q = 4"):
        cuflash.flash_attn_func(q, k, v)
    k, v = randn(rng, 1, 4, 2, 32), randn(rng, 1, 4, 2, 32)
    with pytest.raises(ValueError, match="q: dtype float64 is not supported"):
        cuflash.flash_attn_func(q.astype(np.float64), k, v)
    with pytest.raises(ValueError, match="dtype"):
        cuflash.flash_attn_func(q, k.astype(np.float16), v)
    with pytest.raises(ValueError, match="cu_seqlens_q: dtype int64"):
        cuflash.flash_attn_varlen_func(q[0], k[0], v[0], np.array([0, 4]), np.array([0, 4], np.int32), 4, 4)
    with pytest.raises(ValueError, match="varlen.cu_seqlens_q: must be non-decreasing"):
        cuflash.flash_attn_varlen_func(q[0], k[0], v[0], np.array([0, 3, 2], np.int32),
                                       np.array([0, 2, 4], np.int32), 4, 4)
    with pytest.raises(ValueError, match="window_left"):
        cuflash.flash_attn_func(q, k, v, window_size=(-5, -1))
    with pytest.raises(ValueError, match="backend"):
        cuflash.attention(q, k, v, backend="tpu")
    with pytest.raises(ValueError, match="needs CUDA memory"):
        cuflash.attention(q, k, v, backend="cuda")
    with pytest.raises(ValueError, match="q: expected a tensor"):
        cuflash.flash_attn_func(q.tolist(), k, v)
    big = randn(rng, 1, 2, 1, 512)
    with pytest.raises(NotImplementedError, match="head_dim"):
        cuflash.flash_attn_func(big, big, big)


def test_kvcache_leftpad_with_cache_batch_idx(rng):
    """cache_leftpad with cache_batch_idx (a paged view of the caches, so the leftpad goes through the block
    table): the call on the indexed caches, and the append lands in the named rows."""
    q, k_new, v_new = randn(rng, 2, 1, 2, 32), randn(rng, 2, 1, 2, 32), randn(rng, 2, 1, 2, 32)
    k_cache, v_cache = randn(rng, 3, 8, 2, 32), randn(rng, 3, 8, 2, 32)
    index, leftpad = np.array([2, 0], np.int32), np.array([3, 0], np.int32)
    seqlens = np.array([5, 2], np.int32)
    k_gathered, v_gathered = k_cache[index].copy(), v_cache[index].copy()
    want = cuflash.flash_attn_with_kvcache(q, k_gathered, v_gathered, k_new, v_new, cache_seqlens=seqlens,
                                           cache_leftpad=leftpad, causal=True)
    got = cuflash.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens,
                                          cache_leftpad=leftpad, cache_batch_idx=index, causal=True)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(k_cache[index], k_gathered)
    np.testing.assert_array_equal(v_cache[index], v_gathered)


def test_kvcache_leftpad_and_rotary(rng):
    """flash_attn_with_kvcache's cache_leftpad and rotary_cos/rotary_sin on numpy arrays (backend cpu): sequence
    b with leftpad l is the call on its cache from row l on with the tables from row l on (rotary positions are
    cache rows), and the appended keys land rotated."""
    batch, q_len, heads, dim, capacity, new = 2, 2, 2, 32, 24, 2
    q = randn(rng, batch, q_len, heads, dim)
    k_cache, v_cache = randn(rng, batch, capacity, 1, dim), randn(rng, batch, capacity, 1, dim)
    k_new, v_new = randn(rng, batch, new, 1, dim), randn(rng, batch, new, 1, dim)
    angles = np.arange(capacity + q_len)[:, None] * 10000.0 ** (-np.arange(8) / 8.0)[None, :]
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)  # rotary_dim 16
    seqlens, leftpad = np.array([9, 5], np.int32), np.array([4, 0], np.int32)
    k_shifted, v_shifted = k_cache.copy(), v_cache.copy()
    out = cuflash.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, rotary_cos=cos, rotary_sin=sin,
                                          cache_seqlens=seqlens, cache_leftpad=leftpad, causal=True)
    for b in range(batch):
        pad = int(leftpad[b])
        k_row, v_row = k_shifted[b:b + 1, pad:].copy(), v_shifted[b:b + 1, pad:].copy()
        want = cuflash.flash_attn_with_kvcache(q[b:b + 1], k_row, v_row, k_new[b:b + 1], v_new[b:b + 1],
                                               rotary_cos=cos[pad:], rotary_sin=sin[pad:],
                                               cache_seqlens=np.array([seqlens[b] - pad], np.int32), causal=True)
        np.testing.assert_allclose(out[b:b + 1], want, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(k_cache[b, pad:], k_row[0])  # the same rotated keys, in the same rows
        assert not np.array_equal(k_cache[b, seqlens[b]:seqlens[b] + new], k_new[b])  # rotated, not copied


def test_module_surface():
    assert cuflash.__version__ == "0.1.0"
    assert cuflash.backend_available("cpu")
    import cuflash.flash_attn_interface as interface

    for name in ("flash_attn_func", "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func", "flash_attn_varlen_func",
                 "flash_attn_varlen_qkvpacked_func", "flash_attn_varlen_kvpacked_func", "flash_attn_with_kvcache"):
        assert getattr(cuflash, name) is getattr(interface, name)
