"""flash-attn 2.x calls on torch tensors, feature by feature, forward and backward,
against attention written out here in float64 (the same mask, the same dropout
keep pattern, the same rotation):

1. head dims 40, 59, 64, 80, 111, 224 (flash_attn_func, flash_attn_varlen_func);
2. dropout: the keep pattern read back from S_dmask (negative = dropped), seeds,
   ``deterministic``, causal, GQA, varlen;
3. ``return_attn_probs`` without dropout: (out, softmax_lse, S_dmask);
4. flash_attn_with_kvcache: rotary_cos/rotary_sin (interleaved or not) with
   appended k/v, cache_leftpad, cache_batch_idx, block_table, num_splits;
5. paged prefill: flash_attn_varlen_func with block_table (the packed call's results, no backward);
6. attention sinks (``sinks`` / ``learnable_sink``) with their gradient;
7. bert_padding's unpad_input / pad_input around flash_attn_varlen_func;
8. a bad block table: an exception that is both a RuntimeError and a ValueError.

Each test runs on CUDA tensors (skipped without a GPU and cuflash's CUDA backend)
and, where backend cpu implements the feature, on CPU tensors too, so that the
float64 references here are checked wherever torch is installed. ``backend``
'auto' is the flash-attn function itself; 'explicit' is cuflash.attention with
backend='cuda' (CUDA tensors) or 'cpu' (CPU tensors), where that call can say it.
Tolerances (rel-L2, as test_torch.py): out bf16 1e-2, f16 3e-3; gradients bf16
2e-2, f16 5e-3. Errors go to the CUFLASH_PY_ERROR_LOG ledger (conftest.py).
The whole module skips without torch."""

import math

import pytest

torch = pytest.importorskip("torch")

import cuflash  # noqa: E402
from cuflash.bert_padding import pad_input, unpad_input  # noqa: E402

HAS_GPU = torch.cuda.is_available() and cuflash.backend_available("cuda")
gpu = pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU and cuflash's CUDA backend")

DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=gpu)]
GPU_ONLY = [pytest.param("cuda", id="cuda", marks=gpu)]
DTYPES = [pytest.param(torch.bfloat16, id="bf16"), pytest.param(torch.float16, id="f16")]
BACKENDS = ["auto", "explicit"]
OUT_TOLERANCE = {torch.bfloat16: 1e-2, torch.float16: 3e-3}
GRAD_TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 5e-3}


# ---- helpers ------------------------------------------------------------------------


def rel_l2(got, want):
    got, want = got.detach().double(), want.detach().double()
    return ((got - want).norm() / want.norm().clamp_min(1e-300)).item()


def check_errors(record, pairs, tolerance):
    """pairs: {name: (got, want)}; every rel-L2 error goes to the ledger, then all must be <= tolerance
    (a dict of per-name tolerances or one number)."""
    errors = {}
    for name, (got, want) in pairs.items():
        assert got.shape == want.shape, f"{name}: shape {tuple(got.shape)}, expected {tuple(want.shape)}"
        limit = tolerance[name] if isinstance(tolerance, dict) else tolerance
        errors[name] = rel_l2(got, want)
        record(name, errors[name], limit)
    bad = {n: e for n, e in errors.items() if not e <= (tolerance[n] if isinstance(tolerance, dict) else tolerance)}
    assert not bad, f"rel-L2 errors {errors} (tolerance {tolerance})"


def tolerances(dtype, names=("dq", "dk", "dv")):
    table = {"out": OUT_TOLERANCE[dtype]}
    table.update({name: GRAD_TOLERANCE[dtype] for name in names})
    return table


def randn(generator, device, dtype, *shape):
    return torch.randn(*shape, generator=generator).to(device=device, dtype=dtype)


def cu_seqlens(lengths, device):
    cumulative = [0]
    for n in lengths:
        cumulative.append(cumulative[-1] + n)
    return torch.tensor(cumulative, dtype=torch.int32, device=device)


def explicit_backend(device):
    return "cuda" if device == "cuda" else "cpu"


def grads_of(out, inputs, dout):
    return torch.autograd.grad(out, inputs, dout)


def reference(q, k, v, *, causal=False, window=(-1, -1), kv_start=None, kv_end=None, keep=None, dropout_p=0.0,
              sinks=None, scale=None):
    """float64 attention, differentiable: q [B, Sq, H, D], k/v [B, Sk, Hk, D] (Hk divides H, head h reads kv
    head h // (H / Hk)). Sequence b's keys are rows kv_start[b] <= j < kv_end[b] (default 0 and Sk); causal
    and the window are aligned to the bottom right of those: query i sees j <= i + kv_end[b] - Sq (causal),
    i + kv_end[b] - Sq - left <= j <= i + kv_end[b] - Sq + right (window, -1 unbounded). keep [B, H, Sq, Sk]
    (bool): the dropout pattern, kept probabilities scaled by 1 / (1 - dropout_p). sinks [H]: one more logit
    per row in the softmax denominator, with no value. Returns (out [B, Sq, H, D], lse [B, H, Sq], probs
    [B, H, Sq, Sk] before dropout)."""
    q, k, v = q.double(), k.double(), v.double()
    batch, seqlen_q, heads, head_dim = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    device = q.device
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    k = k.repeat_interleave(heads // heads_kv, dim=2)
    v = v.repeat_interleave(heads // heads_kv, dim=2)
    start = torch.zeros(batch, dtype=torch.long) if kv_start is None else torch.as_tensor(kv_start).long().cpu()
    end = torch.full((batch,), seqlen_k, dtype=torch.long) if kv_end is None else torch.as_tensor(kv_end).long().cpu()
    start, end = start.to(device)[:, None, None, None], end.to(device)[:, None, None, None]
    i = torch.arange(seqlen_q, device=device)[None, None, :, None]
    j = torch.arange(seqlen_k, device=device)[None, None, None, :]
    diagonal = i + end - seqlen_q
    visible = (j >= start) & (j < end)
    left, right = window
    if causal:
        right = 0
    if right >= 0:
        visible = visible & (j <= diagonal + right)
    if left >= 0:
        visible = visible & (j >= diagonal - left)
    scores = scale * torch.einsum("bihd,bjhd->bhij", q, k)
    scores = scores.masked_fill(~visible, float("-inf"))
    full = scores
    if sinks is not None:
        sink_column = sinks.double().to(device)[None, :, None, None].expand(batch, heads, seqlen_q, 1)
        full = torch.cat([scores, sink_column], dim=-1)
    lse = torch.logsumexp(full, dim=-1)
    safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    probs = torch.exp(scores - safe[..., None])
    weights = probs
    if keep is not None:
        weights = probs * keep.to(device=device, dtype=torch.float64) / (1.0 - dropout_p)
    out = torch.einsum("bhij,bjhd->bihd", weights, v)
    return out, lse, probs


def varlen_reference(q, k, v, lengths_q, lengths_k, keep=None, **options):
    """reference() per packed sequence: (out [Tq, H, D], lse [H, Tq], [probs [H, lq, lk] per sequence]).
    keep: [B, H, >= max lq, >= max lk], sequence b's pattern in its top-left corner."""
    outs, lses, probs = [], [], []
    q0 = k0 = 0
    for b, (lq, lk) in enumerate(zip(lengths_q, lengths_k)):
        mask = None if keep is None else keep[b:b + 1, :, :lq, :lk]
        out, lse, p = reference(q[None, q0:q0 + lq], k[None, k0:k0 + lk], v[None, k0:k0 + lk], keep=mask, **options)
        outs.append(out[0])
        lses.append(lse[0])
        probs.append(p[0])
        q0, k0 = q0 + lq, k0 + lk
    return torch.cat(outs), torch.cat(lses, dim=-1), probs


def attend(backend, device, q, k, v, varlen=None, **options):
    """The flash-attn call (backend 'auto'): flash_attn_func, or flash_attn_varlen_func with varlen =
    (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k); or the same through cuflash.attention with
    the device's backend named ('explicit'). Returns what flash-attn returns: out, or (out, softmax_lse,
    S_dmask) with return_attn_probs."""
    if backend == "auto":
        if varlen is None:
            return cuflash.flash_attn_func(q, k, v, **options)
        return cuflash.flash_attn_varlen_func(q, k, v, *varlen, **options)
    options = dict(options)
    probs = options.pop("return_attn_probs", False)
    if "learnable_sink" in options:
        options["sinks"] = options.pop("learnable_sink")
    if varlen is not None:
        options.update(cu_seqlens_q=varlen[0], cu_seqlens_k=varlen[1], max_seqlen_q=varlen[2],
                       max_seqlen_k=varlen[3])
    result = cuflash.attention(q, k, v, backend=explicit_backend(device), return_lse=probs,
                               return_attn_probs=probs, **options)
    return result  # (out, lse, attn_probs) with return_attn_probs, else out


def head_dim_unpadded(x, head_dim):
    """x's last dimension is head_dim elements apart from head to head: not a slice of a buffer padded in
    head_dim (how a padded call would hand back its result)."""
    return x.shape[-1] == head_dim and x.stride(-1) == 1 and x.stride(-2) == head_dim


def s_dmask_corner(s_dmask, seqlen_q, seqlen_k):
    """flash-attn's S_dmask is [B, H, seqlen_q rounded up, seqlen_k rounded up]; the top-left corner is
    the real one."""
    assert s_dmask.shape[2] >= seqlen_q and s_dmask.shape[3] >= seqlen_k, tuple(s_dmask.shape)
    return s_dmask[:, :, :seqlen_q, :seqlen_k]


# ---- 1. head dims -------------------------------------------------------------------------


HEAD_DIMS = [40, 59, 64, 80, 111, 224]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", ["dense_causal_gqa", "varlen"])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_head_dims_forward_backward(head_dim, layout, backend, dtype, device, error_ledger):
    """D a multiple of 8 runs as it is (out and the gradients are not slices of tensors padded in the head
    dim); other D may be padded inside the call."""
    gen = torch.Generator().manual_seed(head_dim)
    heads, heads_kv = 4, 2
    if layout == "varlen":
        lengths_q, lengths_k = [37, 1, 64], [50, 17, 64]
        q = randn(gen, device, dtype, sum(lengths_q), heads, head_dim).requires_grad_()
        k = randn(gen, device, dtype, sum(lengths_k), heads_kv, head_dim).requires_grad_()
        v = randn(gen, device, dtype, sum(lengths_k), heads_kv, head_dim).requires_grad_()
        varlen = (cu_seqlens(lengths_q, device), cu_seqlens(lengths_k, device), max(lengths_q), max(lengths_k))
        out = attend(backend, device, q, k, v, varlen=varlen)
    else:
        q = randn(gen, device, dtype, 2, 67, heads, head_dim).requires_grad_()
        k = randn(gen, device, dtype, 2, 91, heads_kv, head_dim).requires_grad_()
        v = randn(gen, device, dtype, 2, 91, heads_kv, head_dim).requires_grad_()
        out = attend(backend, device, q, k, v, causal=True)
    assert out.shape == q.shape and out.dtype == dtype and out.device == q.device
    dout = randn(gen, device, dtype, *out.shape)
    dq, dk, dv = grads_of(out, (q, k, v), dout)
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    if layout == "varlen":
        want = varlen_reference(q64, k64, v64, lengths_q, lengths_k)[0]
    else:
        want = reference(q64, k64, v64, causal=True)[0]
    want_grads = grads_of(want, (q64, k64, v64), dout.double())
    check_errors(error_ledger, {"out": (out, want), "dq": (dq, want_grads[0]), "dk": (dk, want_grads[1]),
                                "dv": (dv, want_grads[2])}, tolerances(dtype))
    if head_dim % 8 == 0:
        for name, x in (("out", out), ("dq", dq), ("dk", dk), ("dv", dv)):
            assert head_dim_unpadded(x, head_dim), \
                f"{name}: head_dim {head_dim} (a multiple of 8) was padded: strides {x.stride()}"


# ---- 2. dropout ---------------------------------------------------------------------------


DROPOUT_CASES = {
    "mha": dict(heads_kv=4, causal=False),
    "causal_gqa": dict(heads_kv=2, causal=True),
    "varlen_causal_gqa": dict(heads_kv=2, causal=True, varlen=True),
}


def dropout_inputs(case, device, dtype, seed=0):
    """q, k, v (leaves with grad), varlen (or None), lengths (or None), causal."""
    options = DROPOUT_CASES[case]
    gen = torch.Generator().manual_seed(seed)
    heads, heads_kv, head_dim = 4, options["heads_kv"], 64
    if options.get("varlen"):
        lengths_q, lengths_k = [30, 64, 1], [45, 64, 20]
        q = randn(gen, device, dtype, sum(lengths_q), heads, head_dim)
        k = randn(gen, device, dtype, sum(lengths_k), heads_kv, head_dim)
        v = randn(gen, device, dtype, sum(lengths_k), heads_kv, head_dim)
        varlen = (cu_seqlens(lengths_q, device), cu_seqlens(lengths_k, device), max(lengths_q), max(lengths_k))
        lengths = (lengths_q, lengths_k)
    else:
        q = randn(gen, device, dtype, 2, 64, heads, head_dim)
        k = randn(gen, device, dtype, 2, 80, heads_kv, head_dim)
        v = randn(gen, device, dtype, 2, 80, heads_kv, head_dim)
        varlen = lengths = None
    return [x.requires_grad_() for x in (q, k, v)], varlen, lengths, options["causal"]


def dropout_reference(q, k, v, s_dmask, lengths, causal, dropout_p):
    """(out, lse, keep corner(s), visible entries' keep flags) from the keep pattern of S_dmask."""
    if lengths is None:
        keep = ~torch.signbit(s_dmask_corner(s_dmask, q.shape[1], k.shape[1]))
        out, lse, probs = reference(q, k, v, causal=causal, keep=keep, dropout_p=dropout_p)
        visible = (probs > 0).expand_as(keep)
        return out, lse, keep[visible]
    lengths_q, lengths_k = lengths
    keep = ~torch.signbit(s_dmask_corner(s_dmask, max(lengths_q), max(lengths_k)))
    out, lse, probs = varlen_reference(q, k, v, lengths_q, lengths_k, keep=keep, causal=causal, dropout_p=dropout_p)
    flags = [keep[b, :, :lq, :lk][p > 0] for b, (lq, lk, p) in enumerate(zip(lengths_q, lengths_k, probs))]
    return out, lse, torch.cat(flags)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", list(DROPOUT_CASES))
@pytest.mark.parametrize("dropout_p", [0.1, 0.3])
def test_dropout_matches_float64_with_the_mask_of_s_dmask(dropout_p, case, backend, dtype, device, error_ledger):
    """One call with return_attn_probs: out and (through autograd) dq/dk/dv against float64 attention with
    S_dmask's keep pattern (negative = dropped) and the 1 / (1 - p) scale; softmax_lse is dropout's input's."""
    (q, k, v), varlen, lengths, causal = dropout_inputs(case, device, dtype)
    torch.manual_seed(1234)
    out, lse, s_dmask = attend(backend, device, q, k, v, varlen=varlen, dropout_p=dropout_p, causal=causal,
                               return_attn_probs=True)
    assert out.shape == q.shape and out.dtype == dtype
    assert s_dmask.shape[:2] == ((q.shape[0], q.shape[2]) if varlen is None else (len(lengths[0]), q.shape[1]))
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(9)).to(device=device, dtype=dtype)
    dq, dk, dv = grads_of(out, (q, k, v), dout)
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    want, want_lse, kept = dropout_reference(q64, k64, v64, s_dmask.detach(), lengths, causal, dropout_p)
    dropped = 1.0 - kept.double().mean().item()
    error_ledger("dropped fraction - dropout_p", abs(dropped - dropout_p), 0.03)
    assert abs(dropped - dropout_p) < 0.03, f"{dropped:.4f} of the visible entries dropped, dropout_p {dropout_p}"
    want_grads = grads_of(want, (q64, k64, v64), dout.double())
    check_errors(error_ledger, {"out": (out, want), "lse": (lse, want_lse), "dq": (dq, want_grads[0]),
                                "dk": (dk, want_grads[1]), "dv": (dv, want_grads[2])},
                 dict(tolerances(dtype), lse=1e-4))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", list(DROPOUT_CASES))
def test_dropout_torch_manual_seed_reproduces(case, backend, device):
    """The same torch.manual_seed: the same out; another seed: another out."""
    (q, k, v), varlen, _, causal = dropout_inputs(case, device, torch.bfloat16)
    q, k, v = (x.detach() for x in (q, k, v))

    def run(seed):
        torch.manual_seed(seed)
        return attend(backend, device, q, k, v, varlen=varlen, dropout_p=0.3, causal=causal)

    first = run(7)
    assert torch.equal(run(7), first)
    assert not torch.equal(run(8), first)
    assert not torch.equal(attend(backend, device, q, k, v, varlen=varlen, dropout_p=0.3, causal=causal), first)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", ["causal_gqa", "varlen_causal_gqa"])
def test_dropout_deterministic_backward_is_bitwise_reproducible(case, backend, dtype, device):
    """deterministic=True with dropout: two runs from one seed give identical out and dq/dk/dv (the
    backward redraws the forward's mask)."""
    results = []
    for _ in range(2):
        (q, k, v), varlen, _, causal = dropout_inputs(case, device, dtype, seed=3)
        torch.manual_seed(11)
        out = attend(backend, device, q, k, v, varlen=varlen, dropout_p=0.2, causal=causal, deterministic=True)
        dout = torch.ones_like(out)
        results.append((out,) + grads_of(out, (q, k, v), dout))
    for name, a, b in zip(("out", "dq", "dk", "dv"), *results):
        assert torch.equal(a, b), name


# ---- 3. return_attn_probs without dropout ------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", list(DROPOUT_CASES))
def test_return_attn_probs_without_dropout(case, backend, dtype, device, error_ledger):
    """(out, softmax_lse, S_dmask) as flash-attn: lse [B, H, Sq] float32 (varlen [H, total_q]) against
    float64 logsumexp; S_dmask [B, H, >= Sq, >= Sk], not negative, zero on hidden keys, rows summing to 1
    over the visible ones; out and its gradients as without the debug output."""
    (q, k, v), varlen, lengths, causal = dropout_inputs(case, device, dtype, seed=5)
    out, lse, s_dmask = attend(backend, device, q, k, v, varlen=varlen, causal=causal, return_attn_probs=True)
    heads = q.shape[-2]
    assert out.shape == q.shape and out.dtype == dtype
    assert lse.dtype == torch.float32 and s_dmask.device == q.device
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    if varlen is None:
        batch, seqlen_q, seqlen_k = q.shape[0], q.shape[1], k.shape[1]
        assert lse.shape == (batch, heads, seqlen_q)
        assert s_dmask.shape[:2] == (batch, heads)
        want, want_lse, probs = reference(q64, k64, v64, causal=causal)
        corners = [(s_dmask_corner(s_dmask, seqlen_q, seqlen_k), probs)]
    else:
        lengths_q, lengths_k = lengths
        assert lse.shape == (heads, sum(lengths_q))
        assert s_dmask.shape[:2] == (len(lengths_q), heads)
        want, want_lse, probs = varlen_reference(q64, k64, v64, lengths_q, lengths_k, causal=causal)
        full = s_dmask_corner(s_dmask, max(lengths_q), max(lengths_k))
        corners = [(full[b:b + 1, :, :lq, :lk], p[None]) for b, (lq, lk, p) in
                   enumerate(zip(lengths_q, lengths_k, probs))]
    probs_error = 0.0
    for got, expected in corners:
        got = got.double()
        assert not torch.signbit(got).any(), "S_dmask has negative entries without dropout"
        hidden = expected == 0
        assert (got[hidden] == 0).all(), "S_dmask is not zero on hidden keys"
        row_sums = got.sum(dim=-1)
        error = (row_sums - 1).abs().max().item()
        limit = 1e-3 if s_dmask.dtype == torch.float32 else 2e-2
        error_ledger("S_dmask row sum - 1", error, limit)
        assert error <= limit, f"S_dmask rows sum to 1 +- {error}"
        probs_error = max(probs_error, (got - expected.detach()).abs().max().item())
    probs_limit = 2e-3 if s_dmask.dtype == torch.float32 else 1e-2
    error_ledger("S_dmask max abs", probs_error, probs_limit)
    assert probs_error <= probs_limit
    lse_error = (lse.double() - want_lse.detach()).abs().max().item()
    error_ledger("lse max abs", lse_error, 1e-3)
    assert lse_error <= 1e-3
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(2)).to(device=device, dtype=dtype)
    dq, dk, dv = grads_of(out, (q, k, v), dout)
    want_grads = grads_of(want, (q64, k64, v64), dout.double())
    check_errors(error_ledger, {"out": (out, want), "dq": (dq, want_grads[0]), "dk": (dk, want_grads[1]),
                                "dv": (dv, want_grads[2])}, tolerances(dtype))


# ---- 4. flash_attn_with_kvcache ------------------------------------------------------------


def rotary_tables(seqlen_ro, rotary_dim, dtype, device, base=10000.0):
    inv = 1.0 / base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    angles = torch.arange(seqlen_ro, dtype=torch.float64)[:, None] * inv[None, :]
    return angles.cos().to(device=device, dtype=dtype), angles.sin().to(device=device, dtype=dtype)


def rotate64(x, cos, sin, positions, interleaved):
    """x [B, S, H, D] rotated in float64: the first 2 * cos.shape[1] features, pairs (2i, 2i+1) when
    interleaved (GPT-J), else (i, i + rotary_dim / 2) (GPT-NeoX), token t of sequence b by the angle of
    row positions[b, t] of cos/sin."""
    x = x.double()
    half = cos.shape[1]
    c = cos.double()[positions][:, :, None, :]  # [B, S, 1, half]
    s = sin.double()[positions][:, :, None, :]
    part = x[..., :2 * half]
    if interleaved:
        first, second = part[..., 0::2], part[..., 1::2]
    else:
        first, second = part[..., :half], part[..., half:]
    a, b = first * c - second * s, first * s + second * c
    rotated = torch.stack((a, b), dim=-1).flatten(-2) if interleaved else torch.cat((a, b), dim=-1)
    return torch.cat((rotated, x[..., 2 * half:]), dim=-1)


# (layout, rotary, causal, num_splits, append)
KV_CASES = {
    "contiguous": ("contiguous", None, True, 0, True),
    "contiguous_neox": ("contiguous", "neox", True, 0, True),
    "contiguous_interleaved_noncausal": ("contiguous", "interleaved", False, 0, True),
    "contiguous_splits3": ("contiguous", None, True, 3, True),
    "paged": ("paged", None, True, 0, True),
    "paged_neox_splits2": ("paged", "neox", True, 2, True),
    "paged_interleaved_noncausal": ("paged", "interleaved", False, 0, True),
    "paged_no_append": ("paged", None, True, 0, False),
    "batch_idx": ("batch_idx", None, True, 0, True),
    "batch_idx_interleaved_splits4": ("batch_idx", "interleaved", True, 4, True),
    "batch_idx_leftpad_neox": ("batch_idx_leftpad", "neox", True, 0, True),
    "leftpad": ("leftpad", None, True, 0, True),
    "leftpad_neox": ("leftpad", "neox", True, 0, True),
    "leftpad_interleaved_noncausal_splits2": ("leftpad", "interleaved", False, 2, True),
}
KV_PARAMS = [pytest.param(device, name, id=f"{name}-{device}", marks=[gpu] if device == "cuda" else [])
             for name in KV_CASES for device in ("cpu", "cuda")]
PAGE_SIZE, CAPACITY = 256, 512  # flash-attn 2 wants pages of a multiple of 256 keys


def kvcache_setup(layout, device, dtype, append, batch=3, seqlen_q=3, heads=4, heads_kv=2, head_dim=64, seed=0):
    """The caches as the call takes them, and the logical [B, CAPACITY, Hk, D] view of sequence b's keys
    (gather(cache)) with the arguments that select it."""
    gen = torch.Generator().manual_seed(seed)
    new = seqlen_q if append else 0
    seqlens = [0 if append else 5, 100, 300]  # keys cached before the call (every row sees a key)
    extra, leftpad = {}, [0, 0, 0]
    if layout == "paged":
        pages_per_seq = CAPACITY // PAGE_SIZE
        shape = (batch * pages_per_seq + 1, PAGE_SIZE, heads_kv, head_dim)  # one page no sequence uses
        order = torch.randperm(shape[0], generator=gen)[:batch * pages_per_seq]
        table = order.view(batch, pages_per_seq).to(torch.int32)
        extra["block_table"] = table.to(device)

        def gather(cache):
            return cache[table.long().to(cache.device)].reshape(batch, CAPACITY, heads_kv, head_dim)
    elif layout.startswith("batch_idx"):
        shape = (batch + 2, CAPACITY, heads_kv, head_dim)
        index = torch.tensor([4, 0, 2], dtype=torch.int32)
        extra["cache_batch_idx"] = index.to(device)
        if layout == "batch_idx_leftpad":
            leftpad = [0, 7, 150]
            extra["cache_leftpad"] = torch.tensor(leftpad, dtype=torch.int32, device=device)

        def gather(cache):
            return cache[index.long().to(cache.device)]
    else:
        shape = (batch, CAPACITY, heads_kv, head_dim)
        if layout == "leftpad":
            leftpad = [0, 7, 150]
            extra["cache_leftpad"] = torch.tensor(leftpad, dtype=torch.int32, device=device)

        def gather(cache):
            return cache
    k_cache, v_cache = randn(gen, device, dtype, *shape), randn(gen, device, dtype, *shape)
    q = randn(gen, device, dtype, batch, seqlen_q, heads, head_dim)
    k_new = randn(gen, device, dtype, batch, new, heads_kv, head_dim) if append else None
    v_new = randn(gen, device, dtype, batch, new, heads_kv, head_dim) if append else None
    return dict(q=q, k_cache=k_cache, v_cache=v_cache, k_new=k_new, v_new=v_new, seqlens=seqlens, new=new,
                leftpad=leftpad, extra=extra, gather=gather)


def kvcache_reference(setup, k_before, v_before, rotary, causal, cos=None, sin=None):
    """(out, lse, expected logical k cache, v cache) in float64: k_new (rotated at cache_seqlens[b] + j)
    and v_new written at rows cache_seqlens[b].., q rotated at cache_seqlens[b] + i (causal) or
    cache_seqlens[b] (not), keys leftpad[b] <= j < cache_seqlens[b] + new. The rotated q and k_new are
    rounded once to their dtype, as flash-attn and cuflash store them before attending."""
    q, seqlens, new = setup["q"], setup["seqlens"], setup["new"]
    batch, seqlen_q = q.shape[0], q.shape[1]
    k_cache, v_cache = k_before.double().clone(), v_before.double().clone()
    start = torch.tensor(seqlens)[:, None]
    q64 = q.double()
    if rotary is not None:
        steps = torch.arange(seqlen_q)[None, :] if causal else torch.zeros(1, seqlen_q, dtype=torch.long)
        q64 = rotate64(q64, cos, sin, (start + steps).to(q.device), rotary == "interleaved").to(q.dtype).double()
    if new:
        k_new = setup["k_new"].double()
        if rotary is not None:
            k_new = rotate64(k_new, cos, sin, (start + torch.arange(new)[None, :]).to(q.device),
                             rotary == "interleaved").to(q.dtype).double()
        for b in range(batch):
            k_cache[b, seqlens[b]:seqlens[b] + new] = k_new[b]
            v_cache[b, seqlens[b]:seqlens[b] + new] = setup["v_new"][b].double()
    out, lse, _ = reference(q64, k_cache, v_cache, causal=causal, kv_start=setup["leftpad"],
                            kv_end=[n + new for n in seqlens])
    return out, lse, k_cache, v_cache


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("device,case", KV_PARAMS)
def test_kvcache_options(case, device, dtype, error_ledger):
    """flash_attn_with_kvcache with rotary_cos/rotary_sin (GPT-NeoX or interleaved), k/v appended,
    cache_leftpad, cache_batch_idx, a paged block_table and num_splits (0 or > 1): out and lse against
    float64 attention over the gathered, rotated cache; the cache holds the (rotated) new keys after."""
    layout, rotary, causal, num_splits, append = KV_CASES[case]
    setup = kvcache_setup(layout, device, dtype, append)
    q, k_cache, v_cache = setup["q"], setup["k_cache"], setup["v_cache"]
    k_before, v_before = setup["gather"](k_cache).clone(), setup["gather"](v_cache).clone()
    untouched = (k_cache.clone(), v_cache.clone())
    cos = sin = None
    if rotary is not None:
        cos, sin = rotary_tables(CAPACITY, 32, dtype, device)  # rotary_dim 32 of head_dim 64
    seqlens = torch.tensor(setup["seqlens"], dtype=torch.int32, device=device)
    out, lse = cuflash.flash_attn_with_kvcache(
        q, k_cache, v_cache, setup["k_new"], setup["v_new"], rotary_cos=cos, rotary_sin=sin, cache_seqlens=seqlens,
        causal=causal, rotary_interleaved=rotary == "interleaved", num_splits=num_splits, return_softmax_lse=True,
        **setup["extra"])
    assert out.shape == q.shape and out.dtype == dtype
    assert lse.shape == (q.shape[0], q.shape[2], q.shape[1]) and lse.dtype == torch.float32
    want, want_lse, want_k, want_v = kvcache_reference(setup, k_before, v_before, rotary, causal, cos, sin)
    check_errors(error_ledger, {"out": (out, want), "lse": (lse, want_lse)},
                 {"out": OUT_TOLERANCE[dtype], "lse": 1e-4})
    # The appended rows as the call wrote them (the rotated keys rounded once), the rest as they were.
    got_k, got_v = setup["gather"](k_cache), setup["gather"](v_cache)
    rounding = 1e-2 if dtype == torch.bfloat16 else 2e-3
    torch.testing.assert_close(got_k.double(), want_k, rtol=rounding, atol=rounding)
    assert torch.equal(got_v.double(), want_v)
    for b, start in enumerate(setup["seqlens"]):
        end = start + setup["new"]
        assert torch.equal(got_k[b, :start], k_before[b, :start]) and torch.equal(got_k[b, end:], k_before[b, end:])
    if layout.startswith("batch_idx"):  # rows no sequence names stay as they were
        assert torch.equal(k_cache[[1, 3]], untouched[0][[1, 3]]) and torch.equal(v_cache[[1, 3]],
                                                                                  untouched[1][[1, 3]])
    if layout == "paged":  # so does the page no sequence uses
        used = set(setup["extra"]["block_table"].flatten().tolist())
        spare = [p for p in range(k_cache.shape[0]) if p not in used]
        assert torch.equal(k_cache[spare], untouched[0][spare]) and torch.equal(v_cache[spare], untouched[1][spare])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["contiguous", "paged"])
def test_kvcache_append_explicit_backend(layout, dtype, device, error_ledger):
    """The same append-and-attend through cuflash.attention with the backend named (k_new/v_new,
    seqlens_k, block_table)."""
    setup = kvcache_setup(layout, device, dtype, append=True, seed=1)
    q, k_cache, v_cache = setup["q"], setup["k_cache"], setup["v_cache"]
    k_before, v_before = setup["gather"](k_cache).clone(), setup["gather"](v_cache).clone()
    seqlens = torch.tensor(setup["seqlens"], dtype=torch.int32, device=device)
    out, lse = cuflash.attention(q, k_cache, v_cache, k_new=setup["k_new"], v_new=setup["v_new"], seqlens_k=seqlens,
                                 block_table=setup["extra"].get("block_table"), causal=True, return_lse=True,
                                 backend=explicit_backend(device))
    want, want_lse, want_k, want_v = kvcache_reference(setup, k_before, v_before, None, True)
    check_errors(error_ledger, {"out": (out, want), "lse": (lse, want_lse)},
                 {"out": OUT_TOLERANCE[dtype], "lse": 1e-4})
    assert torch.equal(setup["gather"](k_cache).double(), want_k)
    assert torch.equal(setup["gather"](v_cache).double(), want_v)


@pytest.mark.parametrize("rotary", ["neox", "interleaved"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "noncausal"])
def test_leftpad_reference_matches_shifted_calls_cpu(causal, rotary):
    """Checks the leftpad semantics of kvcache_reference (which the leftpad cases of test_kvcache_options
    hold the library to) by calls without a leftpad: sequence b with cache_leftpad l is the cache row from
    l on, with cache_seqlens - l keys, and cos/sin from row l (rotary positions are cache rows)."""
    dtype = torch.float32
    setup = kvcache_setup("leftpad", "cpu", dtype, append=True, seed=2)
    q, k_cache, v_cache = setup["q"], setup["k_cache"], setup["v_cache"]
    k_before, v_before = k_cache.clone(), v_cache.clone()
    cos, sin = rotary_tables(CAPACITY, 32, dtype, "cpu")
    want, want_lse, want_k, _ = kvcache_reference(setup, k_before, v_before, rotary, causal, cos, sin)
    for b, (start, pad) in enumerate(zip(setup["seqlens"], setup["leftpad"])):
        out, lse = cuflash.flash_attn_with_kvcache(
            q[b:b + 1], k_cache[b:b + 1, pad:], v_cache[b:b + 1, pad:], setup["k_new"][b:b + 1],
            setup["v_new"][b:b + 1], rotary_cos=cos[pad:], rotary_sin=sin[pad:],
            cache_seqlens=torch.tensor([start - pad], dtype=torch.int32), causal=causal,
            rotary_interleaved=rotary == "interleaved", return_softmax_lse=True)
        assert rel_l2(out, want[b:b + 1]) <= 1e-5 and rel_l2(lse, want_lse[b:b + 1]) <= 1e-6
    torch.testing.assert_close(k_cache.double(), want_k, rtol=1e-6, atol=1e-6)


# ---- 5. paged prefill: flash_attn_varlen_func with block_table ----------------------------------


def paged_prefill_setup(device, dtype, page_size=PAGE_SIZE, seed=0):
    """q packed [total_q, H, D]; paged caches [num_pages, page_size, Hk, D]; sequence b's keys are the first
    lengths_k[b] rows of its pages block_table[b] (cu_seqlens_k counts them, as in flash-attn). Causal
    calls align bottom-right: the first sequence has fewer queries than keys, the second one query."""
    gen = torch.Generator().manual_seed(seed)
    lengths_q, lengths_k = [40, 1, 100], [300, 37, 100]
    heads, heads_kv, head_dim, batch = 4, 2, 64, 3
    pages_per_seq = -(-max(lengths_k) // page_size)
    num_pages = batch * pages_per_seq + 1  # one page no sequence uses
    k_cache = randn(gen, device, dtype, num_pages, page_size, heads_kv, head_dim)
    v_cache = randn(gen, device, dtype, num_pages, page_size, heads_kv, head_dim)
    table = torch.randperm(num_pages, generator=gen)[:batch * pages_per_seq].view(batch, pages_per_seq)
    q = randn(gen, device, dtype, sum(lengths_q), heads, head_dim)
    varlen = (cu_seqlens(lengths_q, device), cu_seqlens(lengths_k, device), max(lengths_q), max(lengths_k))
    return q, k_cache, v_cache, table.to(torch.int32).to(device), varlen, lengths_q, lengths_k


def packed_keys(k_cache, v_cache, table, lengths_k):
    """The keys and values of every sequence gathered from its pages and packed, as a varlen call takes them."""
    gathered = [c[table.long()].flatten(1, 2) for c in (k_cache, v_cache)]  # [B, pages * page_size, Hk, D]
    k = torch.cat([gathered[0][b, :n] for b, n in enumerate(lengths_k)])
    v = torch.cat([gathered[1][b, :n] for b, n in enumerate(lengths_k)])
    return k, v


# Page sizes: flash-attn 2's 256, and 16, smaller than the kernels' key tiles (64, 128), so that a tile spans
# several pages.
PAGE_SIZES = [pytest.param(256, id="page256"), pytest.param(768, id="page768"), pytest.param(16, id="page16")]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "noncausal"])
def test_paged_prefill_varlen_block_table(causal, page_size, backend, dtype, device, error_ledger):
    """flash_attn_varlen_func(q, k_cache, v_cache, cu_seqlens_q, cu_seqlens_k, ..., block_table=...): forward
    (flash-attn's paged varlen call has no backward) against float64 attention over the gathered pages."""
    q, k_cache, v_cache, table, varlen, lengths_q, lengths_k = paged_prefill_setup(device, dtype, page_size)
    out = attend(backend, device, q, k_cache, v_cache, varlen=varlen, causal=causal, block_table=table)
    assert out.shape == q.shape and out.dtype == dtype
    k, v = packed_keys(k_cache, v_cache, table, lengths_k)
    want = varlen_reference(q.double(), k.double(), v.double(), lengths_q, lengths_k, causal=causal)[0]
    check_errors(error_ledger, {"out": (out, want)}, OUT_TOLERANCE[dtype])


# Options that the paged call takes from the varlen one: (options, backend cpu and cuda run it).
PAGED_OPTION_CASES = {
    "window_softcap_alibi": dict(window_size=(50, 10), softcap=5.0, alibi=True),
    "causal_sinks_dropout_probs": dict(causal=True, sinks=True, dropout_p=0.3, return_attn_probs=True),
    "probs_gqa": dict(return_attn_probs=True),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", list(PAGED_OPTION_CASES))
def test_paged_prefill_is_the_packed_call(case, dtype, device):
    """Keys read through block_table change where they come from, nothing else: out, softmax_lse and S_dmask
    are those of flash_attn_varlen_func on the same keys packed, bit for bit (the same dropout mask too, from
    the same torch seed), with window, softcap, ALiBi, sinks and dropout."""
    options = dict(PAGED_OPTION_CASES[case])
    q, k_cache, v_cache, table, varlen, _, lengths_k = paged_prefill_setup(device, dtype, 16, seed=3)
    heads = q.shape[1]
    if options.pop("alibi", False):
        options["alibi_slopes"] = torch.linspace(0.05, 0.5, heads, device=device)
    if options.pop("sinks", False):
        options["sinks"] = torch.linspace(-1.0, 2.0, heads, device=device)
    k, v = packed_keys(k_cache, v_cache, table, lengths_k)
    torch.manual_seed(11)
    paged = cuflash.flash_attn_varlen_func(q, k_cache, v_cache, *varlen, block_table=table, **options)
    torch.manual_seed(11)
    packed = cuflash.flash_attn_varlen_func(q, k, v, *varlen, **options)
    if not options.get("return_attn_probs"):
        paged, packed = (paged,), (packed,)
    for name, got, want in zip(("out", "softmax_lse", "S_dmask"), paged, packed):
        assert torch.equal(got, want), f"{name} differs from the packed call's"


@pytest.mark.parametrize("device", DEVICES)
def test_paged_prefill_has_no_backward(device):
    """As in flash-attn, a paged varlen call has no backward: a gradient through it raises, naming
    block_table (the forward itself runs)."""
    q, k_cache, v_cache, table, varlen, _, _ = paged_prefill_setup(device, torch.bfloat16, 16)
    q.requires_grad_()
    out = cuflash.flash_attn_varlen_func(q, k_cache, v_cache, *varlen, causal=True, block_table=table)
    with pytest.raises(ValueError, match="block_table"):
        out.sum().backward()


def test_paged_prefill_page_size_not_a_power_of_two():
    """Any page size on backend cpu; backend cuda (KV caches and paged prefill alike) takes powers of two
    and multiples of 64 (flash-attn's page sizes are multiples of 256), not 48,
    and says so."""
    q, k_cache, v_cache, table, varlen, lengths_q, lengths_k = paged_prefill_setup("cpu", torch.float32, 48)
    out = cuflash.flash_attn_varlen_func(q, k_cache, v_cache, *varlen, causal=True, block_table=table)
    k, v = packed_keys(k_cache, v_cache, table, lengths_k)
    want = varlen_reference(q.double(), k.double(), v.double(), lengths_q, lengths_k, causal=True)[0]
    assert rel_l2(out, want) <= 1e-5
    if HAS_GPU:
        with pytest.raises(NotImplementedError, match="power of two"):
            cuflash.flash_attn_varlen_func(*(x.cuda() for x in (q, k_cache, v_cache)), varlen[0].cuda(),
                                           varlen[1].cuda(), *varlen[2:], causal=True, block_table=table.cuda())


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "noncausal"])
def test_paged_prefill_reference_matches_kvcache_calls_cpu(causal):
    """Checks the paged prefill reference on CPU against another call: sequence b alone is a KV-cache call
    over its pages with cache_seqlens lengths_k[b] (no append)."""
    q, k_cache, v_cache, table, varlen, lengths_q, lengths_k = paged_prefill_setup("cpu", torch.float32,
                                                                                 page_size=16, seed=1)
    # Pages of 16 here, 2 per sequence: 32 keys at most; the sequences are cut to fit.
    lengths_k = [min(n, 32) for n in lengths_k]
    lengths_q = [min(n, m) for n, m in zip(lengths_q, lengths_k)]
    gathered = [c[table.long()].flatten(1, 2) for c in (k_cache, v_cache)]
    ks = [gathered[0][b, :n] for b, n in enumerate(lengths_k)]
    vs = [gathered[1][b, :n] for b, n in enumerate(lengths_k)]
    qs = [q[int(varlen[0][b]):int(varlen[0][b]) + n] for b, n in enumerate(lengths_q)]
    want = varlen_reference(torch.cat(qs).double(), torch.cat(ks).double(), torch.cat(vs).double(), lengths_q,
                            lengths_k, causal=causal)[0]
    got = [cuflash.flash_attn_with_kvcache(qs[b][None], k_cache, v_cache, block_table=table[b:b + 1],
                                           cache_seqlens=lengths_k[b], causal=causal)[0]
           for b in range(len(lengths_q))]
    assert rel_l2(torch.cat(got), want) <= 1e-5


# ---- 6. attention sinks ---------------------------------------------------------------------


SINK_CASES = {
    "dense_sinks": dict(causal=False, name="sinks"),
    "causal_gqa_learnable_sink": dict(causal=True, name="learnable_sink", heads_kv=2),
    "varlen_causal_sinks": dict(causal=True, name="sinks", varlen=True),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", list(SINK_CASES))
def test_sinks_forward_backward(case, backend, dtype, device, error_ledger):
    """sinks / learnable_sink float32 [H]: out, dq/dk/dv and dsinks against float64 attention with one
    more logit per row."""
    options = SINK_CASES[case]
    gen = torch.Generator().manual_seed(4)
    heads, heads_kv, head_dim = 4, options.get("heads_kv", 4), 64
    if options.get("varlen"):
        lengths_q, lengths_k = [20, 70, 3], [20, 90, 33]
        shapes = ((sum(lengths_q), heads), (sum(lengths_k), heads_kv), (sum(lengths_k), heads_kv))
        varlen = (cu_seqlens(lengths_q, device), cu_seqlens(lengths_k, device), max(lengths_q), max(lengths_k))
        q, k, v = (randn(gen, device, dtype, *shape, head_dim).requires_grad_() for shape in shapes)
    else:
        q = randn(gen, device, dtype, 2, 70, heads, head_dim).requires_grad_()
        k = randn(gen, device, dtype, 2, 90, heads_kv, head_dim).requires_grad_()
        v = randn(gen, device, dtype, 2, 90, heads_kv, head_dim).requires_grad_()
        varlen = None
    sinks = (torch.rand(heads, generator=gen) * 4 - 1).to(device).requires_grad_()
    out = attend(backend, device, q, k, v, varlen=varlen, causal=options["causal"], **{options["name"]: sinks})
    assert out.shape == q.shape and out.dtype == dtype
    dout = randn(gen, device, dtype, *out.shape)
    got = grads_of(out, (q, k, v, sinks), dout)
    assert got[3].shape == sinks.shape and got[3].dtype == torch.float32
    q64, k64, v64, s64 = (x.detach().double().requires_grad_() for x in (q, k, v, sinks))
    if varlen is None:
        want = reference(q64, k64, v64, causal=options["causal"], sinks=s64)[0]
    else:
        want = varlen_reference(q64, k64, v64, lengths_q, lengths_k, causal=options["causal"], sinks=s64)[0]
    expected = grads_of(want, (q64, k64, v64, s64), dout.double())
    check_errors(error_ledger, {"out": (out, want), **{name: (g, e) for name, g, e in
                                                       zip(("dq", "dk", "dv", "dsinks"), got, expected)}},
                 tolerances(dtype, ("dq", "dk", "dv", "dsinks")))


# ---- 7. bert_padding around flash_attn_varlen_func ------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "noncausal"])
def test_bert_padding_round_trip_through_varlen(causal, dtype, device, error_ledger):
    """unpad_input (q, k, v of a padded batch), flash_attn_varlen_func, pad_input back: each sequence's
    attention alone, zeros at the padding; gradients reach the padded inputs (zero at the padding)."""
    lengths, seqlen, heads, heads_kv, head_dim = [48, 17, 30, 1], 48, 4, 2, 64
    gen = torch.Generator().manual_seed(6)
    batch = len(lengths)
    q = randn(gen, device, dtype, batch, seqlen, heads, head_dim).requires_grad_()
    k = randn(gen, device, dtype, batch, seqlen, heads_kv, head_dim).requires_grad_()
    v = randn(gen, device, dtype, batch, seqlen, heads_kv, head_dim).requires_grad_()
    mask = torch.zeros(batch, seqlen, dtype=torch.bool, device=device)
    for b, n in enumerate(lengths):
        mask[b, :n] = True
    q_packed, indices, cu, max_seqlen, used = unpad_input(q, mask)
    k_packed, _, _, _, _ = unpad_input(k, mask)
    v_packed, _, _, _, _ = unpad_input(v, mask)
    assert cu.dtype == torch.int32 and cu.tolist() == cu_seqlens(lengths, "cpu").tolist()
    assert max_seqlen == max(lengths) and used.tolist() == lengths
    packed = cuflash.flash_attn_varlen_func(q_packed, k_packed, v_packed, cu, cu, max_seqlen, max_seqlen,
                                            causal=causal)
    out = pad_input(packed, indices, batch, seqlen)
    assert out.shape == q.shape and (out[~mask] == 0).all()
    dout = randn(gen, device, dtype, *out.shape)
    dq, dk, dv = grads_of(out, (q, k, v), dout)
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    want = torch.zeros_like(q64)
    pieces = [reference(q64[b:b + 1, :n], k64[b:b + 1, :n], v64[b:b + 1, :n], causal=causal)[0]
              for b, n in enumerate(lengths)]
    want = torch.cat([torch.cat([piece, want[b:b + 1, n:]], dim=1) for b, (piece, n) in
                      enumerate(zip(pieces, lengths))])
    expected = grads_of(want, (q64, k64, v64), dout.double())
    for g in (dq, dk, dv):
        assert (g[~mask] == 0).all()
    check_errors(error_ledger, {"out": (out, want), "dq": (dq, expected[0]), "dk": (dk, expected[1]),
                                "dv": (dv, expected[2])}, tolerances(dtype))


# ---- 8. errors -------------------------------------------------------------------------------


def bad_block_tables(device, num_pages, batch=2, pages=2):
    good = torch.arange(batch * pages, dtype=torch.int32).view(batch, pages)
    out_of_range, negative = good.clone(), good.clone()
    out_of_range[1, 0] = num_pages
    negative[0, 0] = -1
    return {"out_of_range": out_of_range.to(device), "negative": negative.to(device),
            "int64": good.long().to(device), "rank1": good.flatten().to(device)}


BAD_TABLES = ["out_of_range", "negative", "int64", "rank1"]


def assert_names_block_table(info):
    assert isinstance(info.value, RuntimeError) and isinstance(info.value, ValueError), type(info.value).__mro__
    assert "block_table" in str(info.value), str(info.value)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bad", BAD_TABLES)
def test_bad_block_table_raises_runtime_and_value_error(bad, backend, device):
    """A bad block table in a KV-cache call: one exception, catchable as RuntimeError (flash-attn's) and as
    ValueError, naming block_table."""
    gen = torch.Generator().manual_seed(0)
    num_pages, page_size = 5, 16
    k_cache = randn(gen, device, torch.bfloat16, num_pages, page_size, 2, 64)
    v_cache = randn(gen, device, torch.bfloat16, num_pages, page_size, 2, 64)
    q = randn(gen, device, torch.bfloat16, 2, 1, 4, 64)
    seqlens = torch.tensor([20, 30], dtype=torch.int32, device=device)  # both sequences use both pages
    table = bad_block_tables(device, num_pages)[bad]
    with pytest.raises(RuntimeError) as info:
        if backend == "auto":
            cuflash.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, block_table=table)
        else:
            cuflash.attention(q, k_cache, v_cache, seqlens_k=seqlens, block_table=table,
                              backend=explicit_backend(device))
    assert_names_block_table(info)
    with pytest.raises(ValueError):
        cuflash.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, block_table=table)
    if device == "cuda":
        torch.cuda.synchronize()  # nothing was launched that could fault later


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bad", BAD_TABLES)
def test_bad_block_table_in_paged_prefill_raises_runtime_and_value_error(bad, device):
    """The same for flash_attn_varlen_func's block_table (paged prefill)."""
    q, k_cache, v_cache, _, varlen, _, _ = paged_prefill_setup(device, torch.bfloat16)
    table = bad_block_tables(device, k_cache.shape[0], batch=3)[bad]
    with pytest.raises(RuntimeError) as info:
        cuflash.flash_attn_varlen_func(q, k_cache, v_cache, *varlen, causal=True, block_table=table)
    assert_names_block_table(info)
    if device == "cuda":
        torch.cuda.synchronize()  # nothing was launched that could fault later
