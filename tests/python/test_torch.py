"""cuflash with torch: autograd through the custom ops, torch.compile without
graph breaks, KV caches, streams. Tests on CPU tensors run wherever torch is
installed; tests marked `gpu` need CUDA and cuflash's CUDA backend, and compare
forward and backward (through autograd) with PyTorch SDPA's math backend run
in float64 on the upcast inputs (bf16: rel-L2 <= 1e-2, fp16: <= 3e-3)."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import cuflash  # noqa: E402
import reference as ref  # noqa: E402

F = torch.nn.functional
HAS_GPU = torch.cuda.is_available() and cuflash.backend_available("cuda")
gpu = pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU and cuflash's CUDA backend")
TOLERANCE = {torch.bfloat16: 1e-2, torch.float16: 3e-3, torch.float32: 1e-5}


def rel_l2(got, want):
    got, want = got.detach().double(), want.detach().double()
    return ((got - want).norm() / want.norm().clamp_min(1e-300)).item()


def visible_mask(seqlen_q, seqlen_k, causal, window, device):
    left, right = window
    if causal:
        right = 0
    i = torch.arange(seqlen_q, device=device)[:, None] + (seqlen_k - seqlen_q)
    j = torch.arange(seqlen_k, device=device)[None, :]
    mask = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if right >= 0:
        mask &= j <= i + right
    if left >= 0:
        mask &= j >= i - left
    return mask


def reference_attention(q, k, v, causal=False, window=(-1, -1), softcap=0.0, alibi=None, scale=None):
    """float64 attention of [B, S, H, D] tensors, differentiable. SDPA's math backend
    where the options allow (no softcap, every row sees a key), else written out."""
    batch, seqlen_q, heads, head_dim = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    k = k.repeat_interleave(heads // heads_kv, dim=2)
    v = v.repeat_interleave(heads // heads_kv, dim=2)
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))  # [B, H, S, D]
    mask = visible_mask(seqlen_q, seqlen_k, causal, window, q.device)
    bias = torch.zeros(1, 1, seqlen_q, seqlen_k, dtype=torch.float64, device=q.device)
    if alibi is not None:
        i = torch.arange(seqlen_q, device=q.device)[:, None] + (seqlen_k - seqlen_q)
        distance = (i - torch.arange(seqlen_k, device=q.device)[None, :]).abs().double()
        slopes = alibi.double()[None, :, None, None] if alibi.dim() == 1 else alibi.double()[:, :, None, None]
        bias = -slopes * distance
    rows_see_keys = mask.any(dim=-1)
    if softcap == 0 and bool(rows_see_keys.all()):
        attn_mask = bias.masked_fill(~mask, float("-inf"))
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
            out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=attn_mask, scale=scale)
        return out.transpose(1, 2)
    scores = scale * qt @ kt.transpose(-1, -2)
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    scores = (scores + bias).masked_fill(~mask, float("-inf"))
    scores = scores.masked_fill(~rows_see_keys[:, None], 0.0)  # no NaN from rows without keys
    probs = torch.softmax(scores, dim=-1) * rows_see_keys[:, None].to(scores.dtype)
    return (probs @ vt).transpose(1, 2)


def make_inputs(device, dtype, batch=2, seqlen_q=128, seqlen_k=128, heads=4, heads_kv=2, head_dim=64, seed=0):
    generator = torch.Generator(device="cpu").manual_seed(seed)
    shape_q, shape_k = (batch, seqlen_q, heads, head_dim), (batch, seqlen_k, heads_kv, head_dim)
    q, k, v = (torch.randn(s, generator=generator).to(device=device, dtype=dtype) for s in (shape_q, shape_k, shape_k))
    return [x.requires_grad_() for x in (q, k, v)]


def compare_with_reference(q, k, v, out, dout, tolerance, record, **options):
    """out and the autograd gradients of (q, k, v) against the float64 reference."""
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    want = reference_attention(q64, k64, v64, **options)
    want.backward(dout.double())
    errors = {"out": rel_l2(out, want), "dq": rel_l2(q.grad, q64.grad), "dk": rel_l2(k.grad, k64.grad),
              "dv": rel_l2(v.grad, v64.grad)}
    for name, error in errors.items():
        record(name, error, tolerance)
    assert all(e <= tolerance for e in errors.values()), f"rel-L2 errors {errors} (tolerance {tolerance})"


# ---- CPU tensors: the ops, autograd and compile, wherever torch is installed ----


@pytest.mark.parametrize("options", [dict(), dict(causal=True), dict(softcap=2.0, window=(9, 3)),
                                     dict(causal=True, alibi=True)], ids=["plain", "causal", "softcap_window",
                                                                          "causal_alibi"])
def test_cpu_autograd_matches_float64(options, error_ledger):
    q, k, v = make_inputs("cpu", torch.float32, seqlen_q=37, seqlen_k=53, head_dim=32)
    alibi = torch.rand(4, dtype=torch.float32) * 0.3 if options.pop("alibi", False) else None
    window = options.get("window", (-1, -1))
    out = cuflash.flash_attn_func(q, k, v, causal=options.get("causal", False), window_size=window,
                                  softcap=options.get("softcap", 0.0), alibi_slopes=alibi)
    dout = torch.randn_like(out)
    out.backward(dout)
    compare_with_reference(q, k, v, out, dout, 1e-5, error_ledger, alibi=alibi, **options)


def test_cpu_varlen_autograd():
    lengths = [7, 0, 19]
    cu = torch.tensor([0, 7, 7, 26], dtype=torch.int32)
    q, k, v = (torch.randn(26, h, 32, requires_grad=True) for h in (4, 2, 2))
    out = cuflash.flash_attn_varlen_func(q, k, v, cu, cu, 19, 19, causal=True)
    dout = torch.randn_like(out)
    out.backward(dout)
    want = ref.varlen(*(x.detach().numpy() for x in (q, k, v)), cu.numpy(), cu.numpy(), dout=dout.numpy(),
                      causal=True)
    for got, expected in zip((out, q.grad, k.grad, v.grad), (want[0], want[2], want[3], want[4])):
        assert ref.max_abs(got.detach().numpy(), expected) <= 1e-4
    assert sum(lengths) == 26


def test_cpu_qkvpacked_gradient_flows_to_the_packed_tensor():
    qkv = torch.randn(2, 20, 3, 2, 32, requires_grad=True)
    out = cuflash.flash_attn_qkvpacked_func(qkv, causal=True)
    out.sum().backward()
    q64 = qkv.detach().double().requires_grad_()
    reference_attention(q64[:, :, 0], q64[:, :, 1], q64[:, :, 2], causal=True).sum().backward()
    assert rel_l2(qkv.grad, q64.grad) <= 1e-5


def test_cpu_kvcache_append_in_place():
    q = torch.randn(2, 3, 4, 32)
    k_cache, v_cache = torch.randn(2, 16, 2, 32), torch.randn(2, 16, 2, 32)
    k_new, v_new = torch.randn(2, 3, 2, 32), torch.randn(2, 3, 2, 32)
    seqlens = torch.tensor([5, 11], dtype=torch.int32)
    want = ref.kvcache(q.numpy(), k_cache.numpy(), v_cache.numpy(), seqlens.numpy(), None, k_new.numpy(),
                       v_new.numpy(), causal=True)
    out, lse = cuflash.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens,
                                               causal=True, return_softmax_lse=True)
    assert ref.max_abs(out.numpy(), want[0]) <= 2e-5 and ref.max_abs(lse.numpy(), want[1]) <= 2e-5
    np.testing.assert_array_equal(k_cache.numpy(), want[2].astype(np.float32))
    np.testing.assert_array_equal(v_cache.numpy(), want[3].astype(np.float32))


def test_cpu_merge_states_and_backward_call():
    q, k, v = (x.detach() for x in make_inputs("cpu", torch.float32, seqlen_q=9, seqlen_k=30, head_dim=32))
    out_a, lse_a = cuflash.attention(q, k[:, :10], v[:, :10], return_lse=True)
    out_b, lse_b = cuflash.attention(q, k[:, 10:], v[:, 10:], return_lse=True)
    out, lse = cuflash.merge_states(out_a, lse_a, out_b, lse_b)
    full, full_lse = cuflash.attention(q, k, v, return_lse=True)
    assert torch.allclose(out, full, atol=2e-5) and torch.allclose(lse, full_lse, atol=2e-5)
    dout = torch.randn_like(full)
    dq, dk, dv = cuflash.attention_backward(dout, q, k, v, full, full_lse, deterministic=True)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape


def test_cpu_errors_from_torch_calls():
    q, k = torch.randn(1, 8, 4, 32), torch.randn(1, 8, 3, 32)
    with pytest.raises(ValueError, match="heads_kv"):
        cuflash.flash_attn_func(q, k, k)
    with pytest.raises(ValueError, match="float64"):
        cuflash.flash_attn_func(q.double(), q.double(), q.double())
    with pytest.raises(ValueError, match="dropout_p"):
        cuflash.flash_attn_func(q, q, q, dropout_p=1.0)


def test_custom_ops_pass_opcheck():
    """Schema, fake (meta) kernels, autograd registration and AOT dispatch, as torch checks them."""
    q, k, v = (x.detach() for x in make_inputs("cpu", torch.float32, seqlen_q=16, seqlen_k=24, head_dim=32))
    fwd_args = (q, k, v, None, None, None, 0, 0, None, None, None, True, -1, -1, 0.0, False, True, "auto")
    torch.library.opcheck(torch.ops.cuflash.fwd.default, fwd_args)
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    torch.library.opcheck(torch.ops.cuflash.fwd.default, (qg, kg, vg) + fwd_args[3:])
    out, lse = torch.ops.cuflash.fwd(*fwd_args)
    bwd_args = (torch.randn_like(out), q, k, v, out, lse) + fwd_args[3:]
    bwd_args = bwd_args[:18] + (False, True, "auto")  # deterministic, check_index_contents, backend
    torch.library.opcheck(torch.ops.cuflash.bwd.default, bwd_args)


class Block(torch.nn.Module):
    """A transformer-style attention block that calls flash_attn_func."""

    def __init__(self, dim=64, heads=4, heads_kv=2):
        super().__init__()
        self.heads, self.heads_kv, self.head_dim = heads, heads_kv, dim // heads
        self.qkv = torch.nn.Linear(dim, (heads + 2 * heads_kv) * self.head_dim)
        self.proj = torch.nn.Linear(dim, dim)

    def forward(self, x):
        batch, seqlen, _ = x.shape
        qkv = self.qkv(x).view(batch, seqlen, self.heads + 2 * self.heads_kv, self.head_dim)
        q, k, v = qkv.split([self.heads, self.heads_kv, self.heads_kv], dim=2)
        out = cuflash.flash_attn_func(q, k, v, causal=True)
        return self.proj(out.reshape(batch, seqlen, -1))


def graph_breaks(module, *inputs):
    import torch._dynamo

    torch._dynamo.reset()
    explanation = torch._dynamo.explain(module)(*inputs)
    return explanation.graph_break_count, explanation


def test_cpu_compile_has_no_graph_break_and_matches_eager():
    torch.manual_seed(0)
    block = Block()
    x = torch.randn(2, 33, 64, requires_grad=True)
    breaks, explanation = graph_breaks(block, x)
    assert breaks == 0, str(explanation.break_reasons)
    compiled = torch.compile(block, backend="aot_eager", fullgraph=True)
    out = compiled(x)
    out.sum().backward()
    grad_compiled = x.grad.clone()
    x.grad = None
    eager = block(x)
    eager.sum().backward()
    assert torch.allclose(out, eager, atol=1e-6) and torch.allclose(grad_compiled, x.grad, atol=1e-6)


# ---- GPU: cuflash's CUDA backend against float64 SDPA --------------------------

GPU_DENSE_CASES = {
    "plain_d64": dict(),
    "causal_d128": dict(causal=True, head_dim=128),
    "gqa_causal_q_shorter": dict(causal=True, seqlen_q=96, seqlen_k=300, heads=8, heads_kv=2),
    "window_d96": dict(window=(48, 16), head_dim=96, seqlen_q=200, seqlen_k=200),
    "softcap": dict(softcap=10.0, causal=True),
    "alibi": dict(alibi=True, seqlen_q=160, seqlen_k=257),
    "mqa_d256": dict(heads=4, heads_kv=1, head_dim=256, seqlen_q=130, seqlen_k=130, causal=True),
    "d32_odd_lengths": dict(head_dim=32, seqlen_q=77, seqlen_k=1031),
}


@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", list(GPU_DENSE_CASES))
def test_gpu_dense_forward_backward(case, dtype, error_ledger):
    options = dict(GPU_DENSE_CASES[case])
    shape = {key: options.pop(key) for key in ("seqlen_q", "seqlen_k", "heads", "heads_kv", "head_dim")
             if key in options}
    q, k, v = make_inputs("cuda", dtype, **shape)
    alibi = (torch.rand(q.shape[2], device="cuda") * 0.3) if options.pop("alibi", False) else None
    out = cuflash.flash_attn_func(q, k, v, causal=options.get("causal", False),
                                  window_size=options.get("window", (-1, -1)), softcap=options.get("softcap", 0.0),
                                  alibi_slopes=alibi)
    assert out.dtype == dtype and out.device == q.device
    dout = torch.randn_like(out)
    out.backward(dout)
    compare_with_reference(q, k, v, out, dout, TOLERANCE[dtype], error_ledger, alibi=alibi, **options)


@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_gpu_varlen_forward_backward(dtype, error_ledger):
    lengths_q, lengths_k = [100, 1, 0, 257, 64], [100, 30, 9, 257, 400]
    cu_q = torch.tensor([0] + np.cumsum(lengths_q).tolist(), dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0] + np.cumsum(lengths_k).tolist(), dtype=torch.int32, device="cuda")
    generator = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(total, heads, 128, generator=generator).to("cuda", dtype).requires_grad_()
               for total, heads in ((sum(lengths_q), 8), (sum(lengths_k), 2), (sum(lengths_k), 2)))
    out = cuflash.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), causal=True)
    dout = torch.randn_like(out)
    out.backward(dout)
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    pieces = []
    for b in range(len(lengths_q)):
        sq, sk = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        if lengths_q[b] == 0:
            continue
        pieces.append(reference_attention(q64[sq][None], k64[sk][None], v64[sk][None], causal=True)[0])
    want = torch.cat(pieces)
    want.backward(dout.double())
    tolerance = TOLERANCE[dtype]
    errors = {"out": rel_l2(out, want), "dq": rel_l2(q.grad, q64.grad), "dk": rel_l2(k.grad, k64.grad),
              "dv": rel_l2(v.grad, v64.grad)}
    for name, error in errors.items():
        error_ledger(name, error, tolerance)
    assert all(e <= tolerance for e in errors.values()), errors


@gpu
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_gpu_kvcache_append(paged, error_ledger):
    dtype, batch, heads, heads_kv, head_dim, new = torch.bfloat16, 3, 8, 2, 128, 1
    seqlens = torch.tensor([5, 300, 1000], dtype=torch.int32, device="cuda")
    generator = torch.Generator().manual_seed(5)
    rand = lambda *shape: torch.randn(*shape, generator=generator).to("cuda", dtype)  # noqa: E731
    q = rand(batch, new, heads, head_dim)
    if paged:
        page_size, pages_per_seq = 256, 4
        k_cache, v_cache = rand(batch * pages_per_seq, page_size, heads_kv, head_dim), rand(
            batch * pages_per_seq, page_size, heads_kv, head_dim)
        block_table = torch.randperm(batch * pages_per_seq, generator=generator).to(torch.int32).view(batch, -1)
        block_table = block_table.to("cuda")
    else:
        k_cache, v_cache = rand(batch, 1024 + new, heads_kv, head_dim), rand(batch, 1024 + new, heads_kv, head_dim)
        block_table = None
    k_new, v_new = rand(batch, new, heads_kv, head_dim), rand(batch, new, heads_kv, head_dim)
    as_np = lambda t: None if t is None else t.float().cpu().numpy()  # noqa: E731
    want = ref.kvcache(as_np(q), as_np(k_cache), as_np(v_cache), seqlens.cpu().numpy(),
                       None if block_table is None else block_table.cpu().numpy(), as_np(k_new), as_np(v_new),
                       causal=True)
    out = cuflash.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens,
                                          block_table=block_table, causal=True)
    error = ref.rel_l2(as_np(out), want[0])
    error_ledger("out", error, 1e-2)
    assert error <= 1e-2
    assert np.array_equal(as_np(k_cache), want[2].astype(np.float32))


@gpu
def test_gpu_compile_no_graph_break_and_matches_eager(error_ledger):
    torch.manual_seed(0)
    block = Block(dim=512, heads=8, heads_kv=2).cuda().to(torch.bfloat16)
    x = torch.randn(2, 256, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    breaks, explanation = graph_breaks(block, x)
    error_ledger("torch._dynamo.explain graph_break_count", breaks, 0)
    assert breaks == 0, str(explanation.break_reasons)
    compiled = torch.compile(block, fullgraph=True)
    out = compiled(x)
    out.float().sum().backward()
    grad_compiled = x.grad.clone()
    x.grad = None
    eager = block(x)
    eager.float().sum().backward()
    assert rel_l2(out, eager) <= 1e-2 and rel_l2(grad_compiled, x.grad) <= 1e-2


@gpu
def test_gpu_runs_on_the_current_stream():
    q, k, v = (x.detach() for x in make_inputs("cuda", torch.bfloat16, seqlen_q=512, seqlen_k=512))
    want = cuflash.flash_attn_func(q, k, v, causal=True)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        got = cuflash.flash_attn_func(q, k, v, causal=True)
    torch.cuda.current_stream().wait_stream(stream)
    assert torch.equal(got, want)


@gpu
def test_gpu_deterministic_backward_is_bitwise_reproducible():
    grads = []
    for _ in range(2):
        q, k, v = make_inputs("cuda", torch.bfloat16, seqlen_q=300, seqlen_k=300, heads=8, heads_kv=2, seed=7)
        out = cuflash.flash_attn_func(q, k, v, causal=True, deterministic=True)
        out.backward(torch.ones_like(out))
        grads.append((q.grad, k.grad, v.grad))
    assert all(torch.equal(a, b) for a, b in zip(*grads))


@gpu
def test_gpu_errors():
    q = torch.randn(1, 64, 4, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="heads_kv"):
        cuflash.flash_attn_func(q, q[:, :, :3], q[:, :, :3])
    with pytest.raises(ValueError, match="same as q|like q"):
        cuflash.flash_attn_func(q, q.half(), q.half())
    with pytest.raises(ValueError, match="needs host memory"):
        cuflash.attention(q, q, q, backend="cpu")
