"""cuflash in a torch process on the GPU: the cuDNN backend (torch imported
before and after cuflash, forward and backward against float64), CUDA-graph
capture and replay with new inputs (dense and varlen forward and
forward+backward, paged KV-cache decode steps with append), and the eager
path's host-side contract (no allocation outside torch's allocator). Every
test here needs a CUDA GPU; they skip elsewhere."""

import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

import cuflash  # noqa: E402
from test_torch import make_inputs, reference_attention, rel_l2  # noqa: E402

HAS_GPU = torch.cuda.is_available() and cuflash.backend_available("cuda")
gpu = pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU and cuflash's CUDA backend")
cudnn = pytest.mark.skipif(not (HAS_GPU and cuflash.backend_available("cudnn")),
                           reason="needs a CUDA GPU and a package built with the cuDNN backend")
BF16 = 1e-2

def cudnn_errors(batch, seqlen, heads, heads_kv, head_dim, seed):
    """rel-L2 errors of out, dq, dk, dv of a causal backend='cudnn' call against float64 attention."""
    q, k, v = make_inputs("cuda", torch.bfloat16, batch=batch, seqlen_q=seqlen, seqlen_k=seqlen, heads=heads,
                          heads_kv=heads_kv, head_dim=head_dim, seed=seed)
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    out = cuflash.attention(q, k, v, causal=True, backend="cudnn")
    dout = torch.randn_like(out)
    out.backward(dout)
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    want = reference_attention(q64, k64, v64, causal=True)
    want.backward(dout.double())
    return {"out": rel_l2(out, want), "dq": rel_l2(q.grad, q64.grad), "dk": rel_l2(k.grad, k64.grad),
            "dv": rel_l2(v.grad, v64.grad)}


_CUDNN_SCRIPT = textwrap.dedent("""
    import sys
    if sys.argv[1] == "torch_first":
        import torch, cuflash
    else:
        import cuflash, torch
    sys.path.insert(0, sys.argv[2])
    from test_torch_graphs_and_cudnn import cudnn_errors
    errors = cudnn_errors(batch=2, seqlen=256, heads=8, heads_kv=2, head_dim=128, seed=3)
    print("errors", errors)
    sys.exit(0 if max(errors.values()) <= 1e-2 else 3)
""")


@cudnn
@pytest.mark.parametrize("order", ["torch_first", "cuflash_first"])
def test_gpu_cudnn_backend_in_a_torch_process(order, tmp_path):
    """In a fresh interpreter, since import order is the point: no crash, and the right numbers."""
    script = tmp_path / "cudnn_in_torch.py"
    script.write_text(_CUDNN_SCRIPT)
    here = os.path.dirname(os.path.abspath(__file__))
    run = subprocess.run([sys.executable, str(script), order, here], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"exit {run.returncode}\n{run.stdout}\n{run.stderr[-3000:]}"
    assert "errors" in run.stdout


@cudnn
def test_gpu_cudnn_dense_forward_backward_in_process(error_ledger):
    for name, error in cudnn_errors(batch=1, seqlen=384, heads=4, heads_kv=4, head_dim=64, seed=5).items():
        error_ledger(name, error, BF16)
        assert error <= BF16, name


def _capture(fn, warmup_stream=None):
    """A CUDA graph of fn() after the warm-up torch asks for on a side stream; returns (graph, outputs)."""
    stream = warmup_stream or torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = fn()
    return graph, outputs


@gpu
@pytest.mark.parametrize("backend", ["cuda", "cudnn"])
def test_gpu_graph_dense_forward_replays_with_new_inputs(backend):
    if not cuflash.backend_available(backend):
        pytest.skip(f"backend {backend} not in this package")
    q, k, v = (x.detach() for x in make_inputs("cuda", torch.bfloat16, batch=2, seqlen_q=192, seqlen_k=192,
                                                 heads=8, heads_kv=2, head_dim=64, seed=7))
    graph, (out, lse) = _capture(lambda: cuflash.attention(q, k, v, causal=True, backend=backend, return_lse=True))
    for seed in (11, 12):
        fresh = make_inputs("cuda", torch.bfloat16, batch=2, seqlen_q=192, seqlen_k=192, heads=8, heads_kv=2,
                            head_dim=64, seed=seed)
        for dst, src in zip((q, k, v), fresh):
            dst.copy_(src)
        out.fill_(float("nan"))
        graph.replay()
        want, want_lse = cuflash.attention(q, k, v, causal=True, backend=backend, return_lse=True)
        torch.cuda.synchronize()
        assert torch.equal(out, want) and torch.equal(lse, want_lse)


@gpu
def test_gpu_graph_forward_backward_replays_with_new_inputs():
    q, k, v = make_inputs("cuda", torch.bfloat16, batch=2, seqlen_q=128, seqlen_k=128, heads=4, heads_kv=4,
                          head_dim=128, seed=9)
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    dout = torch.randn_like(q)

    def step():
        for x in (q, k, v):
            x.grad = None
        out = cuflash.attention(q, k, v, causal=True, backend="cuda")
        out.backward(dout)
        return out, q.grad, k.grad, v.grad

    graph, captured = _capture(step)
    fresh = make_inputs("cuda", torch.bfloat16, batch=2, seqlen_q=128, seqlen_k=128, heads=4, heads_kv=4,
                        head_dim=128, seed=10)
    with torch.no_grad():
        for dst, src in zip((q, k, v), fresh):
            dst.copy_(src)
        dout.copy_(torch.randn_like(dout))
    graph.replay()
    q2, k2, v2 = (x.detach().clone().requires_grad_() for x in (q, k, v))
    out2 = cuflash.attention(q2, k2, v2, causal=True, backend="cuda")
    out2.backward(dout)
    torch.cuda.synchronize()
    for got, want in zip(captured, (out2, q2.grad, k2.grad, v2.grad)):
        assert torch.equal(got, want)


@gpu
def test_gpu_graph_varlen_forward_backward():
    lengths = [37, 0, 128, 90]
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32, device="cuda")
    total = int(cu[-1])
    gen = torch.Generator(device="cuda").manual_seed(4)
    q, k, v = (torch.randn(total, 4, 64, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
               for _ in range(3))
    dout = torch.randn(total, 4, 64, device="cuda", dtype=torch.bfloat16, generator=gen)

    def step():
        for x in (q, k, v):
            x.grad = None
        out = cuflash.flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths), causal=True)
        out.backward(dout)
        return out, q.grad, k.grad, v.grad

    graph, captured = _capture(step)
    with torch.no_grad():
        for x in (q, k, v):
            x.copy_(torch.randn_like(x))
    graph.replay()
    q2, k2, v2 = (x.detach().clone().requires_grad_() for x in (q, k, v))
    out2 = cuflash.flash_attn_varlen_func(q2, k2, v2, cu, cu, max(lengths), max(lengths), causal=True)
    out2.backward(dout)
    torch.cuda.synchronize()
    for got, want in zip(captured, (out2, q2.grad, k2.grad, v2.grad)):
        assert torch.equal(got, want)


@gpu
def test_gpu_graph_paged_decode_steps_with_append():
    """A decode loop as serving engines capture it: one graph, replayed each step with the next token."""
    batch, heads, heads_kv, dim, page, pages_per_seq = 4, 8, 2, 128, 16, 8
    gen = torch.Generator(device="cuda").manual_seed(8)
    num_pages = batch * pages_per_seq
    k_cache = torch.randn(num_pages, page, heads_kv, dim, device="cuda", dtype=torch.bfloat16, generator=gen)
    v_cache = torch.randn_like(k_cache)
    block_table = torch.randperm(num_pages, device="cuda", generator=gen).to(torch.int32).view(batch, -1)
    seqlens = torch.tensor([5, 17, 40, 63], dtype=torch.int32, device="cuda")
    q = torch.randn(batch, 1, heads, dim, device="cuda", dtype=torch.bfloat16, generator=gen)
    k_new = torch.randn(batch, 1, heads_kv, dim, device="cuda", dtype=torch.bfloat16, generator=gen)
    v_new = torch.randn_like(k_new)
    k_eager, v_eager, seqlens_eager = k_cache.clone(), v_cache.clone(), seqlens.clone()

    def step():
        return cuflash.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens,
                                               block_table=block_table, causal=True)

    # The warm-up calls append too: start the eager copy from the same state afterwards.
    graph, out = _capture(step)
    k_eager.copy_(k_cache)
    v_eager.copy_(v_cache)
    for _ in range(3):
        with torch.no_grad():
            q.copy_(torch.randn_like(q))
            k_new.copy_(torch.randn_like(k_new))
            v_new.copy_(torch.randn_like(v_new))
        graph.replay()
        want = cuflash.flash_attn_with_kvcache(q, k_eager, v_eager, k_new, v_new, cache_seqlens=seqlens_eager,
                                               block_table=block_table, causal=True)
        torch.cuda.synchronize()
        assert torch.equal(out, want)
        assert torch.equal(k_cache, k_eager) and torch.equal(v_cache, v_eager)
        seqlens += 1  # the caller advances the lengths, in place: the graph reads them on each replay
        seqlens_eager += 1


@gpu
def test_gpu_eager_path_allocates_only_through_torch():
    """Scratch memory (the backward's dq accumulator) comes from torch's caching allocator:
    after a warm-up, repeated calls reserve nothing new, and no cudaMallocAsync pool grows."""
    q, k, v = make_inputs("cuda", torch.bfloat16, batch=2, seqlen_q=512, seqlen_k=512, heads=8, heads_kv=8,
                          head_dim=128, seed=2)
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    for _ in range(3):
        cuflash.attention(q, k, v, causal=True, backend="cuda").sum().backward()
    torch.cuda.synchronize()
    reserved = torch.cuda.memory_reserved()
    used_before = torch.cuda.mem_get_info()[0]
    for _ in range(20):
        cuflash.attention(q, k, v, causal=True, backend="cuda").sum().backward()
    torch.cuda.synchronize()
    assert torch.cuda.memory_reserved() == reserved
    assert abs(torch.cuda.mem_get_info()[0] - used_before) < (2 << 20)


@gpu
def test_gpu_compile_no_graph_break_with_the_eager_fast_path():
    q, k, v = make_inputs("cuda", torch.bfloat16, batch=1, seqlen_q=128, seqlen_k=128, heads=4, heads_kv=4,
                          head_dim=64, seed=1)

    def attend(q, k, v):
        return cuflash.attention(q, k, v, causal=True) * 2

    explanation = torch._dynamo.explain(attend)(q, k, v)
    assert explanation.graph_break_count == 0
    compiled = torch.compile(attend, fullgraph=True)
    assert torch.equal(compiled(q, k, v), attend(q, k, v))
