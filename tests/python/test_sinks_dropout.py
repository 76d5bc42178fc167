"""Attention sinks and dropout through the Python package (backend cpu): numpy
arrays against a float64 numpy reference written here, and torch CPU tensors
through autograd against float64 torch. The dropout mask is read back from
S_dmask (return_attn_probs), so the references use the mask the call drew."""

import math

import numpy as np
import pytest

import cuflash


@pytest.fixture
def rng():
    return np.random.default_rng(20260419)


def randn(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def reference(q, k, v, sinks=None, keep=None, dropout_p=0.0, causal=False, dout=None):
    """float64 attention of dense [B, S, H, D] arrays with sinks [H] and a dropout keep mask
    [B, H, Sq, Sk]: (out, lse [B, H, Sq]) and with dout also (dq, dk, dv, dsinks)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    batch, lq, heads, dim = q.shape
    lk, heads_kv = k.shape[1], k.shape[2]
    kh = np.repeat(k, heads // heads_kv, axis=2).transpose(0, 2, 1, 3)  # [B, H, Lk, D]
    vh = np.repeat(v, heads // heads_kv, axis=2).transpose(0, 2, 1, 3)
    qh = q.transpose(0, 2, 1, 3)
    s = qh @ kh.transpose(0, 1, 3, 2) / math.sqrt(dim)  # [B, H, Lq, Lk]
    if causal:
        visible = np.arange(lk)[None, :] <= np.arange(lq)[:, None] + (lk - lq)
        s = np.where(visible, s, -np.inf)
    sink = np.full((heads,), -np.inf) if sinks is None else np.asarray(sinks, np.float64)
    sink_col = np.broadcast_to(sink[None, :, None, None], (batch, heads, lq, 1))
    full = np.concatenate([s, sink_col], axis=-1)
    top = full.max(axis=-1, keepdims=True)
    lse = (top + np.log(np.exp(full - top).sum(axis=-1, keepdims=True)))[..., 0]
    p = np.exp(s - lse[..., None])
    z = np.ones_like(p) if keep is None else keep / (1.0 - dropout_p)
    out = (p * z) @ vh
    result = (out.transpose(0, 2, 1, 3), lse)
    if dout is None:
        return result
    do = np.asarray(dout, np.float64).transpose(0, 2, 1, 3)
    delta = (do * out).sum(-1)  # [B, H, Lq]
    dp = (do @ vh.transpose(0, 1, 3, 2)) * z
    ds = p * (dp - delta[..., None])
    dq = ds @ kh / math.sqrt(dim)
    dkh = ds.transpose(0, 1, 3, 2) @ qh / math.sqrt(dim)
    dvh = (p * z).transpose(0, 1, 3, 2) @ do
    group = heads // heads_kv
    dk = dkh.reshape(batch, heads_kv, group, lk, dim).sum(2).transpose(0, 2, 1, 3)
    dv = dvh.reshape(batch, heads_kv, group, lk, dim).sum(2).transpose(0, 2, 1, 3)
    dsinks = -(np.exp(sink[None, :, None] - lse) * delta).sum(axis=(0, 2)) if sinks is not None else None
    return result + (dq.transpose(0, 2, 1, 3), dk, dv, dsinks)


def close(got, want, tol=2e-5):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.abs(got - want).max()) <= tol * max(1.0, float(np.abs(want).max()))


# ----- numpy -------------------------------------------------------------------------


def test_sinks_forward_and_backward_numpy(rng):
    q, k, v = randn(rng, 2, 7, 4, 16), randn(rng, 2, 9, 2, 16), randn(rng, 2, 9, 2, 16)
    sinks = rng.uniform(-1, 3, 4).astype(np.float32)
    out, lse = cuflash.attention(q, k, v, sinks=sinks, causal=True, return_lse=True)
    want_out, want_lse = reference(q, k, v, sinks, causal=True)
    assert close(out, want_out) and close(lse, want_lse)
    assert np.array_equal(cuflash.flash_attn_func(q, k, v, causal=True, sinks=sinks), out)
    assert np.array_equal(cuflash.flash_attn_func(q, k, v, causal=True, learnable_sink=sinks), out)
    dout = randn(rng, *q.shape)
    dq, dk, dv, dsinks = cuflash.attention_backward(dout, q, k, v, out, lse, causal=True, sinks=sinks)
    *_, want_dq, want_dk, want_dv, want_dsinks = reference(q, k, v, sinks, causal=True, dout=dout)
    for got, want in ((dq, want_dq), (dk, want_dk), (dv, want_dv), (dsinks, want_dsinks)):
        assert close(got, want, 1e-4)
    with pytest.raises(ValueError, match="learnable_sink"):
        cuflash.flash_attn_func(q, k, v, sinks=sinks, learnable_sink=sinks)


def test_sinks_varlen_and_kvcache_numpy(rng):
    """The same sequences packed (varlen) and in a KV cache give the dense result."""
    q, k, v = randn(rng, 2, 5, 2, 8), randn(rng, 2, 6, 1, 8), randn(rng, 2, 6, 1, 8)
    sinks = np.array([0.5, 2.0], np.float32)
    dense = cuflash.attention(q, k, v, sinks=sinks)
    cu_q, cu_k = np.array([0, 5, 10], np.int32), np.array([0, 6, 12], np.int32)
    packed = cuflash.flash_attn_varlen_func(q.reshape(10, 2, 8), k.reshape(12, 1, 8), v.reshape(12, 1, 8), cu_q,
                                            cu_k, 5, 6, sinks=sinks)
    assert close(packed.reshape(q.shape), dense, 1e-6)
    cache_k, cache_v = np.zeros((2, 8, 1, 8), np.float32), np.zeros((2, 8, 1, 8), np.float32)
    cache_k[:, :6], cache_v[:, :6] = k, v
    cached = cuflash.flash_attn_with_kvcache(q, cache_k, cache_v, cache_seqlens=6, sinks=sinks)
    assert close(cached, dense, 1e-6)


def test_dropout_numpy_mask_from_s_dmask(rng):
    q, k, v = randn(rng, 2, 6, 2, 16), randn(rng, 2, 10, 2, 16), randn(rng, 2, 10, 2, 16)
    p = 0.3
    out, lse, s_dmask = cuflash.flash_attn_func(q, k, v, dropout_p=p, causal=True, return_attn_probs=True)
    assert s_dmask.shape == (2, 2, 6, 10) and s_dmask.dtype == np.float32
    keep = ~np.signbit(s_dmask)
    want_out, want_lse = reference(q, k, v, keep=keep, dropout_p=p, causal=True)
    assert close(out, want_out) and close(lse, want_lse)
    probs = reference(q, k, v, causal=True)[1]  # lse alone: the probabilities follow
    assert close(np.abs(s_dmask).sum(-1), np.ones_like(probs), 1e-5)
    assert 0.1 < 1 - keep.mean() < 0.5
    # Without dropout S_dmask is the probabilities, all kept.
    _, _, plain = cuflash.flash_attn_func(q, k, v, return_attn_probs=True)
    assert not np.signbit(plain).any() and close(plain.sum(-1), np.ones((2, 2, 6)), 1e-5)


def test_dropout_numpy_seeds(rng):
    q, k, v = randn(rng, 1, 8, 2, 16), randn(rng, 1, 8, 2, 16), randn(rng, 1, 8, 2, 16)
    np.random.seed(1)
    first = cuflash.flash_attn_func(q, k, v, dropout_p=0.5)
    np.random.seed(1)
    assert np.array_equal(cuflash.flash_attn_func(q, k, v, dropout_p=0.5), first)
    assert not np.array_equal(cuflash.flash_attn_func(q, k, v, dropout_p=0.5), first)
    explicit = cuflash.attention(q, k, v, dropout_p=0.5, dropout_seed=7, dropout_offset=3)
    assert np.array_equal(cuflash.attention(q, k, v, dropout_p=0.5, dropout_seed=7, dropout_offset=3), explicit)
    assert not np.array_equal(cuflash.attention(q, k, v, dropout_p=0.5, dropout_seed=7, dropout_offset=4), explicit)
    with pytest.raises(ValueError, match="dropout_p"):
        cuflash.flash_attn_func(q, k, v, dropout_p=1.5)


def test_dropout_backward_numpy_redraws_the_mask(rng):
    q, k, v = randn(rng, 1, 9, 4, 16), randn(rng, 1, 11, 2, 16), randn(rng, 1, 11, 2, 16)
    sinks = rng.uniform(-1, 2, 4).astype(np.float32)
    options = dict(dropout_p=0.25, dropout_seed=2**64 - 5, dropout_offset=2**40, sinks=sinks)
    out, s_dmask = cuflash.attention(q, k, v, return_attn_probs=True, **options)
    out, lse = cuflash.attention(q, k, v, return_lse=True, **options)
    dout = randn(rng, *q.shape)
    grads = cuflash.attention_backward(dout, q, k, v, out, lse, **options)
    keep = ~np.signbit(s_dmask)
    want = reference(q, k, v, sinks, keep=keep, dropout_p=0.25, dout=dout)
    assert close(out, want[0])
    for got, expected in zip(grads, want[2:]):
        assert close(got, expected, 1e-4)


# ----- torch (CPU tensors) -------------------------------------------------------------


def _torch():
    return pytest.importorskip("torch")


def torch_reference(q, k, v, sinks, keep=None, dropout_p=0.0, causal=False):
    """float64 torch attention with sinks and a keep mask, differentiable."""
    torch = _torch()
    heads, heads_kv = q.shape[2], k.shape[2]
    qh, kh, vh = (x.double().transpose(1, 2) for x in (q, k, v))
    kh = kh.repeat_interleave(heads // heads_kv, dim=1)
    vh = vh.repeat_interleave(heads // heads_kv, dim=1)
    s = qh @ kh.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        lq, lk = q.shape[1], k.shape[1]
        visible = torch.arange(lk, device=q.device)[None, :] <= torch.arange(lq, device=q.device)[:, None] + (lk - lq)
        s = s.masked_fill(~visible, float("-inf"))
    sink_col = sinks.double()[None, :, None, None].expand(s.shape[0], heads, s.shape[2], 1)
    p = torch.softmax(torch.cat([s, sink_col], dim=-1), dim=-1)[..., :-1]
    if keep is not None:
        p = p * keep / (1.0 - dropout_p)
    return (p @ vh).transpose(1, 2)


@pytest.mark.parametrize("dropout_p", [0.0, 0.2])
def test_sinks_and_dropout_autograd_torch(dropout_p):
    torch = _torch()
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 7, 4, 16), torch.randn(2, 9, 2, 16), torch.randn(2, 9, 2, 16)
    sinks = (torch.rand(4) * 3 - 1).requires_grad_()
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    torch.manual_seed(5)
    _, _, s_dmask = cuflash.flash_attn_func(q.detach(), k.detach(), v.detach(), dropout_p=dropout_p, causal=True,
                                            sinks=sinks.detach(), return_attn_probs=True)
    torch.manual_seed(5)  # the same draw: the same mask
    out = cuflash.flash_attn_func(q, k, v, dropout_p=dropout_p, causal=True, sinks=sinks)
    keep = ~torch.signbit(s_dmask) if dropout_p else None
    want = torch_reference(q, k, v, sinks, keep, dropout_p, causal=True)
    assert torch.allclose(out.double(), want, atol=2e-5)
    dout = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v, sinks), dout)
    expected = torch.autograd.grad(want, (q, k, v, sinks), dout.double())
    for name, g, e in zip(("dq", "dk", "dv", "dsinks"), got, expected):
        assert torch.allclose(g.double(), e.double(), atol=1e-4, rtol=1e-4), name


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_sinks_autograd_torch_cuda(dtype):
    """backend cuda (and auto) with sinks: forward and gradients against float64 torch, GQA, causal."""
    torch = _torch()
    if not torch.cuda.is_available() or not cuflash.backend_available("cuda"):
        pytest.skip("needs a CUDA GPU and cuflash's CUDA backend")
    torch.manual_seed(0)
    dt = getattr(torch, dtype)
    q = torch.randn(2, 70, 4, 64, device="cuda", dtype=dt, requires_grad=True)
    k = torch.randn(2, 90, 2, 64, device="cuda", dtype=dt, requires_grad=True)
    v = torch.randn(2, 90, 2, 64, device="cuda", dtype=dt, requires_grad=True)
    sinks = (torch.rand(4, device="cuda") * 3 - 1).requires_grad_()
    for backend in ("cuda", "auto"):
        out = cuflash.attention(q, k, v, causal=True, sinks=sinks, backend=backend)
        want = torch_reference(q, k, v, sinks, causal=True)
        assert (out.double() - want).abs().max().item() < 2e-2, backend
        dout = torch.randn_like(out)
        got = torch.autograd.grad(out, (q, k, v, sinks), dout)
        expected = torch.autograd.grad(want, (q, k, v, sinks), dout.double())
        for name, g, e in zip(("dq", "dk", "dv", "dsinks"), got, expected):
            scale = max(1.0, e.abs().max().item())
            assert (g.double() - e).abs().max().item() < 3e-2 * scale, (backend, name)


def test_dropout_torch_manual_seed_reproduces():
    torch = _torch()
    q, k, v = torch.randn(1, 8, 2, 16), torch.randn(1, 8, 2, 16), torch.randn(1, 8, 2, 16)
    torch.manual_seed(3)
    first = cuflash.flash_attn_func(q, k, v, dropout_p=0.5)
    torch.manual_seed(3)
    assert torch.equal(cuflash.flash_attn_func(q, k, v, dropout_p=0.5), first)
    assert not torch.equal(cuflash.flash_attn_func(q, k, v, dropout_p=0.5), first)


def test_varlen_dropout_torch_s_dmask():
    torch = _torch()
    torch.manual_seed(1)
    q, k, v = torch.randn(9, 2, 8), torch.randn(12, 2, 8), torch.randn(12, 2, 8)
    cu_q, cu_k = torch.tensor([0, 4, 9], dtype=torch.int32), torch.tensor([0, 7, 12], dtype=torch.int32)
    out, lse, s_dmask = cuflash.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 5, 7, dropout_p=0.4,
                                                       return_attn_probs=True)
    assert s_dmask.shape == (2, 2, 5, 7) and lse.shape == (2, 9)
    for b, (q0, q1, k0, k1) in enumerate(((0, 4, 0, 7), (4, 9, 7, 12))):
        keep = ~torch.signbit(s_dmask[b:b + 1, :, :q1 - q0, :k1 - k0])
        want = torch_reference(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], torch.full((2,), -math.inf), keep, 0.4)
        assert torch.allclose(out[q0:q1].double(), want[0], atol=2e-5)
        assert (s_dmask[b, :, q1 - q0:] == 0).all() and (s_dmask[b, :, :, k1 - k0:] == 0).all()


def test_custom_ops_with_sinks_and_dropout_pass_opcheck():
    torch = _torch()
    q, k, v = torch.randn(1, 6, 2, 16), torch.randn(1, 8, 2, 16), torch.randn(1, 8, 2, 16)
    sinks, rng_state = torch.tensor([0.5, 1.5]), torch.tensor([11, 2], dtype=torch.int64)
    fwd_args = (q, k, v, None, None, None, 0, 0, None, None, None, True, -1, -1, 0.0, False, True, "auto", sinks,
                0.2, rng_state)
    torch.library.opcheck(torch.ops.cuflash.fwd.default, fwd_args)
    grads = tuple(x.clone().requires_grad_() for x in (q, k, v))
    torch.library.opcheck(torch.ops.cuflash.fwd.default, grads + fwd_args[3:18] + (sinks.clone().requires_grad_(),)
                          + fwd_args[19:])
    out, lse = torch.ops.cuflash.fwd(*fwd_args)
    bwd_args = (torch.randn_like(out), q, k, v, out, lse) + fwd_args[3:]
    torch.library.opcheck(torch.ops.cuflash.bwd.default, bwd_args)


def test_compiled_sinks_and_dropout_match_eager():
    torch = _torch()
    q, k, v = (torch.randn(1, 6, 2, 16, requires_grad=True) for _ in range(3))
    sinks = torch.tensor([0.5, 1.5], requires_grad=True)

    def step(q, k, v, sinks):
        return cuflash.attention(q, k, v, sinks=sinks, dropout_p=0.3, dropout_seed=9, dropout_offset=1).sum()

    eager = torch.autograd.grad(step(q, k, v, sinks), (q, sinks))
    compiled = torch.compile(step, backend="eager", fullgraph=True)
    again = torch.autograd.grad(compiled(q, k, v, sinks), (q, sinks))
    for a, b in zip(eager, again):
        assert torch.allclose(a, b)
