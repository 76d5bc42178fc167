"""cuflash.rotary (flash-attn's apply_rotary_emb) and rotary_cos/rotary_sin in
flash_attn_with_kvcache (rotated inside the library), on torch CPU tensors,
against rotations written as complex multiplications in float64."""

import math

import pytest

torch = pytest.importorskip("torch")

import cuflash  # noqa: E402
from cuflash.rotary import apply_rotary_emb  # noqa: E402


def tables(seqlen_ro, rotary_dim, base=10000.0):
    inv = 1.0 / base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    angles = torch.arange(seqlen_ro, dtype=torch.float64)[:, None] * inv[None, :]
    return angles.cos(), angles.sin()


def rotate_reference(x, cos, sin, positions, interleaved):
    """x [..., S, H, D] float64; positions [..., S] ints: each feature pair as a complex number times e^(i angle)."""
    half = cos.shape[1]
    rd = 2 * half
    x = x.double()
    part = x[..., :rd]
    if interleaved:
        pairs = torch.complex(part[..., 0::2], part[..., 1::2])
    else:
        pairs = torch.complex(part[..., :half], part[..., half:])
    turn = torch.complex(cos[positions], sin[positions])[..., None, :]  # [..., S, 1, half]
    turned = pairs * turn
    if interleaved:
        rotated = torch.stack((turned.real, turned.imag), dim=-1).flatten(-2)
    else:
        rotated = torch.cat((turned.real, turned.imag), dim=-1)
    return torch.cat((rotated, x[..., rd:]), dim=-1)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("offsets", [0, 5, "per_batch"])
def test_apply_rotary_emb_dense(interleaved, offsets):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(3, 7, 2, 48, generator=gen)
    cos, sin = tables(40, 32)
    if offsets == "per_batch":
        offsets = torch.tensor([0, 3, 20])
    got = apply_rotary_emb(x, cos.float(), sin.float(), interleaved=interleaved, seqlen_offsets=offsets)
    positions = torch.arange(7)[None, :] + (offsets[:, None] if torch.is_tensor(offsets) else offsets)
    want = rotate_reference(x, cos, sin, positions.expand(3, 7), interleaved)
    assert (got.double() - want).abs().max() < 1e-5
    assert torch.equal(got[..., 32:], x[..., 32:])


def test_apply_rotary_emb_varlen_and_inplace():
    gen = torch.Generator().manual_seed(2)
    lengths = [4, 0, 6]
    cu = torch.tensor([0, 4, 4, 10], dtype=torch.int32)
    x = torch.randn(10, 2, 32, generator=gen)
    cos, sin = tables(16, 32)
    offsets = torch.tensor([2, 0, 7])
    want = torch.cat([rotate_reference(x[int(cu[b]):int(cu[b + 1])], cos, sin,
                                       torch.arange(lengths[b]) + int(offsets[b]), False) for b in range(3)])
    got = apply_rotary_emb(x.clone(), cos.float(), sin.float(), seqlen_offsets=offsets, cu_seqlens=cu, max_seqlen=6)
    assert (got.double() - want).abs().max() < 1e-5
    y = x.clone()
    assert apply_rotary_emb(y, cos.float(), sin.float(), inplace=True, seqlen_offsets=offsets, cu_seqlens=cu) is y
    assert torch.equal(y, got)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("interleaved", [True, False])
def test_kvcache_rotary_matches_rotating_first(causal, paged, interleaved):
    """flash-attn's rule: the new keys at cache_seqlens[b] + j; queries at cache_seqlens[b] + i when
    causal (or windowed), else all at cache_seqlens[b]."""
    gen = torch.Generator().manual_seed(3)
    batch, heads, heads_kv, dim, new_len, q_len = 2, 4, 2, 64, 3, 3
    page, pages = 8, 4
    capacity = page * pages
    if paged:
        k_cache = torch.randn(batch * pages, page, heads_kv, dim, generator=gen)
        block_table = torch.randperm(batch * pages, generator=gen).to(torch.int32).view(batch, pages)
    else:
        k_cache = torch.randn(batch, capacity, heads_kv, dim, generator=gen)
        block_table = None
    v_cache = torch.randn_like(k_cache)
    q = torch.randn(batch, q_len, heads, dim, generator=gen)
    k_new, v_new = (torch.randn(batch, new_len, heads_kv, dim, generator=gen) for _ in range(2))
    seqlens = torch.tensor([5, 17], dtype=torch.int32)
    cos, sin = tables(capacity, 32)
    k_before, v_before = k_cache.clone(), v_cache.clone()
    out = cuflash.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, rotary_cos=cos.float(),
                                          rotary_sin=sin.float(), cache_seqlens=seqlens, block_table=block_table,
                                          causal=causal, rotary_interleaved=interleaved)
    start = seqlens.long()[:, None]
    q_pos = start + (torch.arange(q_len) if causal else torch.zeros(q_len, dtype=torch.long))
    q_rot = rotate_reference(q, cos, sin, q_pos, interleaved).float()
    k_rot = rotate_reference(k_new, cos, sin, start + torch.arange(new_len), interleaved).float()
    want = cuflash.flash_attn_with_kvcache(q_rot, k_before, v_before, k_rot, v_new, cache_seqlens=seqlens,
                                           block_table=block_table, causal=causal)
    assert (out - want).abs().max() < 1e-5
    assert (k_cache - k_before).abs().max() < 1e-5 * math.sqrt(dim)  # the cache holds the rotated keys


def test_kvcache_rotary_errors():
    q = torch.randn(1, 1, 2, 32)
    cache = torch.randn(1, 16, 2, 32)
    cos, sin = tables(16, 32)
    with pytest.raises(cuflash.InvalidArgumentError, match="need k_new/v_new"):
        cuflash.flash_attn_with_kvcache(q, cache, cache, rotary_cos=cos.float(), rotary_sin=sin.float(),
                                        cache_seqlens=3)
    short_cos, short_sin = tables(8, 32)
    with pytest.raises(cuflash.InvalidArgumentError, match=r"kv_cache.rotary_cos: expected at least 16 rows"):
        cuflash.flash_attn_with_kvcache(q, cache, cache.clone(), q[:, :, :2], q[:, :, :2], rotary_cos=short_cos.float(),
                                        rotary_sin=short_sin.float(), cache_seqlens=3)
