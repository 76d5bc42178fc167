"""cuflash.linear_attention / linear_attention_backward / linear_attention_step on
numpy arrays and torch CPU tensors (the CPU backend), against references written
here from docs/linear.md: a float64 numpy recurrence (token by token, the state
carried) for the forward, and a float64 torch implementation (pairwise scores)
whose autograd gives the gradients that cuflash's backward must match."""

import numpy as np
import pytest

import cuflash

MAPS = ["identity", "elu+1", "relu"]
TOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1e-2}
EPS = 1e-10


def rel_l2(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-300))


def phi_np(name, x):
    if name == "identity":
        return x
    if name == "relu":
        return np.maximum(x, 0.0)
    return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))


def recurrence(q, k, v, *, causal=True, feature_map="identity", normalize=False, scale=None, s0=None, z0=None):
    """One sequence in float64: q [L, Hq, Dk], k [L, Hk, Dk], v [L, Hk, Dv], s0 [Hk, Dk, Dv],
    z0 [Hk, Dk] -> out [L, Hq, Dv], final state, final key sum."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    length, hq, dk = q.shape
    hk, dv = k.shape[1], v.shape[2]
    group = hq // hk
    scale = dk ** -0.5 if scale is None else scale
    state = np.zeros((hk, dk, dv)) if s0 is None else np.array(s0, np.float64)
    key_sum = np.zeros((hk, dk)) if z0 is None else np.array(z0, np.float64)
    fq, fk = scale * phi_np(feature_map, q), phi_np(feature_map, k)
    if not causal:  # every row sees the whole sequence
        state = state + np.einsum("lhd,lhe->hde", fk, v)
        key_sum = key_sum + fk.sum(0)
    out = np.zeros((length, hq, dv))
    for t in range(length):
        if causal:
            state = state + np.einsum("hd,he->hde", fk[t], v[t])
            key_sum = key_sum + fk[t]
        for h in range(hq):
            num = fq[t, h] @ state[h // group]
            out[t, h] = num / (fq[t, h] @ key_sum[h // group] + EPS) if normalize else num
    return out, state, key_sum


def random_inputs(rng, shape_q, shape_k, shape_v, dtype, positive=False):
    """q, k, v; with identity features and normalize the normalizer has no sign of its own:
    positive-mean inputs keep it away from 0."""
    mean, std = (1.0, 0.5) if positive else (0.0, 1.0)
    q = (rng.standard_normal(shape_q) * std + mean).astype(dtype)
    k = (rng.standard_normal(shape_k) * std + mean).astype(dtype)
    v = rng.standard_normal(shape_v).astype(dtype)
    return q, k, v


@pytest.fixture
def rng():
    return np.random.default_rng(2024)


# ---- numpy ------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("normalize", [False, True], ids=["plain", "norm"])
@pytest.mark.parametrize("feature_map", MAPS)
def test_numpy_dense_matches_recurrence(rng, feature_map, normalize, causal, dtype):
    positive = normalize and feature_map == "identity"
    q, k, v = random_inputs(rng, (2, 65, 4, 16), (2, 65, 2, 16), (2, 65, 2, 8), dtype, positive)
    s0 = rng.standard_normal((2, 2, 16, 8)).astype(np.float32)
    z0 = (rng.standard_normal((2, 2, 16)) * 0.5 + 2.0).astype(np.float32)
    initial = (s0, z0) if normalize else s0
    out, final = cuflash.linear_attention(q, k, v, causal=causal, feature_map=feature_map, normalize=normalize,
                                          initial_state=initial, return_final_state=True, backend="cpu")
    assert isinstance(out, np.ndarray) and out.dtype == np.dtype(dtype) and out.shape == (2, 65, 4, 8)
    state, key_sum = final if normalize else (final, None)
    assert state.dtype == np.float32 and state.shape == (2, 2, 16, 8)
    for b in range(2):
        want, want_state, want_sum = recurrence(q[b], k[b], v[b], causal=causal, feature_map=feature_map,
                                                normalize=normalize, s0=s0[b], z0=z0[b] if normalize else None)
        assert rel_l2(out[b], want) <= TOL[dtype]
        assert rel_l2(state[b], want_state) <= 1e-5
        if normalize:
            assert key_sum.shape == (2, 2, 16) and rel_l2(key_sum[b], want_sum) <= 1e-5


@pytest.mark.parametrize("normalize", [False, True], ids=["plain", "norm"])
def test_numpy_varlen_with_empty_sequences(rng, normalize):
    lengths = [3, 0, 64, 70, 0]
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    total = int(cu[-1]) + 2  # two packed rows after the last sequence
    q, k, v = random_inputs(rng, (total, 2, 8), (total, 1, 8), (total, 1, 4), np.float32)
    out, final = cuflash.linear_attention(q, k, v, feature_map="elu", normalize=normalize, cu_seqlens=cu,
                                          return_final_state=True, scale=0.7)
    state = final[0] if normalize else final
    assert state.shape == (5, 1, 8, 4)
    for b, length in enumerate(lengths):
        rows = slice(cu[b], cu[b + 1])
        want, want_state, _ = recurrence(q[rows], k[rows], v[rows], feature_map="elu+1", normalize=normalize,
                                         scale=0.7)
        if length:
            assert rel_l2(out[rows], want) <= 1e-5
        np.testing.assert_allclose(state[b], want_state, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(out[cu[-1]:], 0)  # rows of no sequence: left as allocated (zeros)


def test_numpy_prefill_then_decode_steps(rng):
    """The chunked forward's final state, stepped token by token, gives the rows a longer forward gives."""
    q, k, v = random_inputs(rng, (1, 75, 2, 8), (1, 75, 1, 8), (1, 75, 1, 6), np.float32)
    full, full_final = cuflash.linear_attention(q, k, v, feature_map="relu", normalize=True,
                                                return_final_state=True)
    out, state = cuflash.linear_attention(q[:, :70], k[:, :70], v[:, :70], feature_map="relu", normalize=True,
                                          return_final_state=True)
    for t in range(70, 75):
        step_out, new_state = cuflash.linear_attention_step(q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1], state,
                                                            feature_map="relu", normalize=True, in_place=(t % 2 == 0))
        if t % 2 == 0:
            assert new_state[0] is state[0] and new_state[1] is state[1]
        state = new_state
        assert rel_l2(step_out, full[:, t:t + 1]) <= 1e-5
    np.testing.assert_allclose(state[0], full_final[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(state[1], full_final[1], rtol=1e-5, atol=1e-5)


def test_numpy_errors(rng):
    q, k, v = random_inputs(rng, (1, 4, 2, 8), (1, 4, 1, 8), (1, 4, 1, 8), np.float32)
    with pytest.raises(cuflash.InvalidArgumentError, match="^feature_map: expected one of"):
        cuflash.linear_attention(q, k, v, feature_map="softmax")
    with pytest.raises(cuflash.InvalidArgumentError, match=r"^initial_state: a \(state, key_sum\) pair belongs"):
        cuflash.linear_attention(q, k, v, initial_state=(np.zeros((1, 1, 8, 8), np.float32),
                                                         np.zeros((1, 1, 8), np.float32)))
    with pytest.raises(cuflash.InvalidArgumentError, match="^initial_state: dim 2 \\(key_dim\\) expected 8"):
        cuflash.linear_attention(q, k, v, initial_state=np.zeros((1, 1, 4, 8), np.float32))
    with pytest.raises(cuflash.InvalidArgumentError, match="^k: heads_kv"):
        cuflash.linear_attention(q, np.repeat(k, 3, axis=2), np.repeat(v, 3, axis=2))
    with pytest.raises(cuflash.InvalidArgumentError, match="^key_sum: required"):
        cuflash.linear_attention_step(q[:, :1], k[:, :1], v[:, :1], np.zeros((1, 1, 8, 8), np.float32),
                                      normalize=True)
    with pytest.raises(cuflash.InvalidArgumentError, match="^backend: expected one of"):
        cuflash.linear_attention(q, k, v, backend="tpu")
    # Host memory on a GPU backend: the wrong place (the GPU backends have no linear kernels yet either).
    with pytest.raises(cuflash.InvalidArgumentError, match="^q: backend cuda needs CUDA memory"):
        cuflash.linear_attention(q, k, v, backend="cuda")


# ---- torch ------------------------------------------------------------------------------------


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


def torch_reference(torch, q, k, v, *, causal, feature_map, normalize, scale=None, s0=None, z0=None):
    """Dense float64 linear attention from pairwise scores (autograd-differentiable):
    (out, final_state, final_key_sum)."""
    F = torch.nn.functional
    phi = {"identity": lambda x: x, "elu+1": lambda x: F.elu(x) + 1, "relu": F.relu}[feature_map]
    hq, hk = q.shape[2], k.shape[2]
    group = hq // hk
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    fq, fk = scale * phi(q), phi(k)
    fkq, vq = fk.repeat_interleave(group, 2), v.repeat_interleave(group, 2)
    scores = torch.einsum("bthd,bshd->bhts", fq, fkq)
    if causal:
        length = q.shape[1]
        scores = scores * torch.ones(length, length, dtype=scores.dtype).tril()
    num = torch.einsum("bhts,bshe->bthe", scores, vq)
    den = scores.sum(-1).transpose(1, 2)  # [b, t, h]
    final_state = torch.einsum("bshd,bshe->bhde", fk, v)
    final_key_sum = fk.sum(1)
    if s0 is not None:
        num = num + torch.einsum("bthd,bhde->bthe", fq, s0.repeat_interleave(group, 1))
        final_state = final_state + s0
    if z0 is not None:
        den = den + torch.einsum("bthd,bhd->bth", fq, z0.repeat_interleave(group, 1))
        final_key_sum = final_key_sum + z0
    out = num / (den + EPS)[..., None] if normalize else num
    return out, final_state, final_key_sum


def torch_rel(got, want):
    got, want = got.detach().double(), want.detach().double()
    return ((got - want).norm() / want.norm().clamp_min(1e-300)).item()


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("normalize", [False, True], ids=["plain", "norm"])
@pytest.mark.parametrize("feature_map", MAPS)
def test_torch_gradients_match_float64(torch, feature_map, normalize, causal, dtype):
    """Forward and every gradient (q, k, v, initial state and key sum; a loss that also reads
    the final state) against the float64 reference's autograd on the same inputs."""
    gen = torch.Generator().manual_seed(7)
    positive = normalize and feature_map == "identity"
    mean, std = (1.0, 0.5) if positive else (0.0, 1.0)
    shape = (2, 67, 4, 16)
    q = torch.randn(shape, generator=gen) * std + mean
    k = torch.randn(2, 67, 2, 16, generator=gen) * std + mean
    v = torch.randn(2, 67, 2, 8, generator=gen)
    s0 = torch.randn(2, 2, 16, 8, generator=gen)
    z0 = torch.randn(2, 2, 16, generator=gen) * 0.5 + 2.0
    dout = torch.randn(2, 67, 4, 8, generator=gen)
    dstate = torch.randn(2, 2, 16, 8, generator=gen)
    dsum = torch.randn(2, 2, 16, generator=gen)
    low = getattr(torch, dtype)
    q, k, v = (x.to(low).requires_grad_() for x in (q, k, v))
    dout = dout.to(low).float()  # out's gradient reaches the backward in out's dtype: make it exact there
    s0.requires_grad_()
    z0.requires_grad_()
    initial = (s0, z0) if normalize else s0
    out, final = cuflash.linear_attention(q, k, v, causal=causal, feature_map=feature_map, normalize=normalize,
                                          initial_state=initial, return_final_state=True)
    state, key_sum = final if normalize else (final, None)
    loss = (out.float() * dout).sum() + (state * dstate).sum() + ((key_sum * dsum).sum() if normalize else 0)
    loss.backward()

    leaves = [x.detach().double().requires_grad_() for x in (q, k, v, s0, z0)]
    want_out, want_state, want_sum = torch_reference(torch, *leaves[:3], causal=causal, feature_map=feature_map,
                                                     normalize=normalize, s0=leaves[3],
                                                     z0=leaves[4] if normalize else None)
    want_loss = (want_out * dout.double()).sum() + (want_state * dstate.double()).sum()
    if normalize:
        want_loss = want_loss + (want_sum * dsum.double()).sum()
    want_loss.backward()
    tol = TOL[dtype]
    assert out.dtype == low and torch_rel(out, want_out) <= tol
    assert torch_rel(state, want_state) <= 1e-5
    for name, got, want in (("dq", q.grad, leaves[0].grad), ("dk", k.grad, leaves[1].grad),
                            ("dv", v.grad, leaves[2].grad)):
        assert got.dtype == low, name
        assert torch_rel(got, want) <= 2 * tol, name
    assert torch_rel(s0.grad, leaves[3].grad) <= 2e-5
    if normalize:
        assert torch_rel(key_sum, want_sum) <= 1e-5
        assert torch_rel(z0.grad, leaves[4].grad) <= 2e-5
    else:
        assert z0.grad is None


def test_torch_varlen_gradients(torch):
    """Varlen with an empty sequence: gradients against the dense reference run per sequence."""
    gen = torch.Generator().manual_seed(3)
    lengths = [5, 0, 66, 1]
    cu = torch.tensor([0, 5, 5, 71, 72], dtype=torch.int32)
    q = torch.randn(72, 2, 8, generator=gen, requires_grad=True)
    k = torch.randn(72, 1, 8, generator=gen, requires_grad=True)
    v = torch.randn(72, 1, 4, generator=gen, requires_grad=True)
    dout = torch.randn(72, 2, 4, generator=gen)
    out = cuflash.linear_attention(q, k, v, feature_map="elu+1", cu_seqlens=cu)
    (out * dout).sum().backward()
    for b, length in enumerate(lengths):
        if not length:
            continue
        rows = slice(int(cu[b]), int(cu[b + 1]))
        leaves = [x[rows].detach().double()[None].requires_grad_() for x in (q, k, v)]
        want, _, _ = torch_reference(torch, *leaves, causal=True, feature_map="elu+1", normalize=False)
        (want * dout[rows].double()[None]).sum().backward()
        assert torch_rel(out[rows], want[0]) <= 1e-5
        for got, leaf in zip((q.grad, k.grad, v.grad), leaves):
            assert torch_rel(got[rows], leaf.grad[0]) <= 2e-5


def test_torch_two_halves_chain_gradients(torch):
    """Prefill in two calls, the first one's final state the second one's initial state: outputs
    and gradients equal one call's (autograd carries the state's gradient across)."""
    gen = torch.Generator().manual_seed(11)
    q = torch.randn(1, 90, 2, 8, generator=gen, requires_grad=True)
    k = torch.randn(1, 90, 2, 8, generator=gen, requires_grad=True)
    v = torch.randn(1, 90, 2, 8, generator=gen, requires_grad=True)
    kwargs = dict(feature_map="relu", normalize=True)
    whole = cuflash.linear_attention(q, k, v, **kwargs)
    grads = torch.autograd.grad(whole.square().sum(), (q, k, v))
    first, state = cuflash.linear_attention(q[:, :40], k[:, :40], v[:, :40], return_final_state=True, **kwargs)
    second = cuflash.linear_attention(q[:, 40:], k[:, 40:], v[:, 40:], initial_state=state, **kwargs)
    halves = torch.cat([first, second], 1)
    assert torch_rel(halves, whole) <= 1e-5
    chained = torch.autograd.grad(halves.square().sum(), (q, k, v))
    for got, want in zip(chained, grads):
        assert torch_rel(got, want) <= 2e-5


def test_torch_step_in_place_and_backward_function(torch):
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(2, 10, 4, 8, generator=gen)
    k = torch.randn(2, 10, 2, 8, generator=gen)
    v = torch.randn(2, 10, 2, 6, generator=gen)
    full, final = cuflash.linear_attention(q, k, v, return_final_state=True)
    state = torch.zeros(2, 2, 8, 6)
    for t in range(10):
        out, returned = cuflash.linear_attention_step(q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1], state)
        assert returned is state
        assert torch_rel(out, full[:, t:t + 1]) <= 1e-5
    assert torch_rel(state, final) <= 1e-5
    # linear_attention_backward without autograd equals autograd's gradients.
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    dout = torch.randn(2, 10, 4, 6, generator=gen)
    (cuflash.linear_attention(*leaves, causal=False) * dout).sum().backward()
    dq, dk, dv = cuflash.linear_attention_backward(dout, q, k, v, causal=False)
    for got, leaf in zip((dq, dk, dv), leaves):
        torch.testing.assert_close(got, leaf.grad)


def test_torch_errors(torch):
    q = torch.randn(1, 4, 2, 8)
    k = torch.randn(1, 4, 1, 8)
    with pytest.raises(cuflash.InvalidArgumentError, match="^v: dim 1 expected 4"):
        cuflash.linear_attention(q, k, torch.randn(1, 3, 1, 8))
    with pytest.raises(cuflash.InvalidArgumentError, match="^q: expected rank 4"):
        cuflash.linear_attention(q[0], k, k)
    with pytest.raises(cuflash.InvalidArgumentError, match="^scale: expected a finite number"):
        cuflash.linear_attention(q, k, k, scale=float("nan"))
