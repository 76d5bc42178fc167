"""The torch operators in C++ (cuflash/_ext_torch.so, built when torch was importable at build
time) against the Python path they replace: gradients through the C++ autograd node equal to
the Python autograd.Function's and to float64, torch.compile without graph breaks, the same
error messages, and the fallback to the Python operators (CUFLASH_TORCH_EXT=0 at import), in
fresh interpreters since the choice is made once per process. Tests that need the library skip
where the package was built without torch; CPU tensors, so they run wherever torch is."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

import cuflash  # noqa: E402
from cuflash import _torch_call, _torch_ext  # noqa: E402
from test_torch import Block, graph_breaks, make_inputs, reference_attention, rel_l2  # noqa: E402

HAS_EXT = _torch_ext.LOADED
BUILT = os.path.exists(os.path.join(os.path.dirname(cuflash.__file__), _torch_ext.FILE_NAME))
ext = pytest.mark.skipif(not HAS_EXT, reason=f"torch operators in C++: {_torch_ext.REASON}")
HERE = os.path.dirname(os.path.abspath(__file__))


def run_python(code, setting):
    """Runs code in a fresh interpreter with CUFLASH_TORCH_EXT=setting (None: unset); returns stdout."""
    env = dict(os.environ)
    env.pop("CUFLASH_TORCH_EXT", None)
    if setting is not None:
        env["CUFLASH_TORCH_EXT"] = setting
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(cuflash.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([package_parent, HERE] + [p for p in [env.get("PYTHONPATH")] if p])
    run = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                         timeout=600)
    assert run.returncode == 0, f"exit {run.returncode}\n{run.stdout}\n{run.stderr[-4000:]}"
    return run.stdout


def python_path(q, k, v, key, **extras):
    """The Python path's eager call (the module directly, a Python autograd.Function)."""
    return _torch_call.attention_eager(q, k, v, key, **extras)


def key(causal=False, window=(-1, -1), softcap=0.0, deterministic=False, scale=None, backend="auto"):
    return (scale, causal, window[0], window[1], softcap, deterministic, True, backend)


def fresh(*tensors):
    return [t.detach().clone().requires_grad_(t.requires_grad) for t in tensors]


# ---- the C++ autograd node against the Python path and float64 -------------------------------

DENSE = {
    "plain": dict(),
    "causal_gqa": dict(causal=True),
    "softcap_window": dict(softcap=3.0, window=(7, 2)),
    "alibi_causal_scale": dict(causal=True, alibi=True, scale=0.3),
    "deterministic": dict(causal=True, deterministic=True),
}


@ext
@pytest.mark.parametrize("case", list(DENSE))
def test_cpp_node_gradients_equal_the_python_path_and_float64(case):
    options = dict(DENSE[case])
    alibi = torch.rand(4) * 0.3 if options.pop("alibi", False) else None
    q, k, v = make_inputs("cpu", torch.float32, seqlen_q=29, seqlen_k=41, head_dim=32, seed=3)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(1))
    got = {}
    for name, call in (("ext", _torch_ext.attention_eager), ("python", python_path)):
        qq, kk, vv = fresh(q, k, v)
        out, lse = call(qq, kk, vv, key(**options), alibi_slopes=alibi)
        assert not lse.requires_grad
        out.backward(dout)
        got[name] = (out.detach(), lse, qq.grad, kk.grad, vv.grad, type(out.grad_fn).__name__)
    assert got["ext"][5] == "CppFunction" and got["python"][5] != "CppFunction"
    for a, b in zip(got["ext"][:5], got["python"][:5]):
        assert torch.equal(a, b)
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    want = reference_attention(q64, k64, v64, causal=options.get("causal", False),
                               window=options.get("window", (-1, -1)), softcap=options.get("softcap", 0.0),
                               alibi=alibi, scale=options.get("scale"))
    want.backward(dout.double())
    out, _, dq, dk, dv, _ = got["ext"]
    for g, w in ((out, want), (dq, q64.grad), (dk, k64.grad), (dv, v64.grad)):
        assert rel_l2(g, w) <= 1e-5


@ext
def test_cpp_node_varlen_and_paged_cache_gradients_equal_the_python_path():
    gen = torch.Generator().manual_seed(5)
    cu = torch.tensor([0, 7, 7, 26], dtype=torch.int32)
    tensors = [torch.randn(26, h, 32, generator=gen).requires_grad_() for h in (4, 2, 2)]
    varlen = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=19, max_seqlen_k=19)
    # A paged cache attended without append is differentiable too (through fwd).
    q = torch.randn(2, 3, 4, 32, generator=gen).requires_grad_()
    k_cache, v_cache = (torch.randn(6, 8, 2, 32, generator=gen).requires_grad_() for _ in range(2))
    paged = dict(seqlens_k=torch.tensor([11, 20], dtype=torch.int32),
                 block_table=torch.tensor([[4, 0, 2], [1, 5, 3]], dtype=torch.int32))
    # ... and a contiguous cache with a leftpad (saved by the node for the backward).
    contiguous = [x.detach().reshape(2, 24, 2, 32).clone().requires_grad_() for x in (k_cache, v_cache)]
    leftpad = dict(seqlens_k=torch.tensor([11, 20], dtype=torch.int32),
                   cache_leftpad=torch.tensor([4, 0], dtype=torch.int32))
    for inputs, extras in ((tensors, varlen), ([q, k_cache, v_cache], paged), ([q, *contiguous], leftpad)):
        results = []
        for call in (_torch_ext.attention_eager, python_path):
            qq, kk, vv = fresh(*inputs)
            out, lse = call(qq, kk, vv, key(causal=True), **extras)
            out.backward(torch.ones_like(out))
            results.append((out.detach(), lse, qq.grad, kk.grad, vv.grad))
        for a, b in zip(*results):
            assert torch.equal(a, b)


@ext
def test_public_calls_take_the_cpp_node():
    q, k, v = make_inputs("cpu", torch.float32, seqlen_q=9, seqlen_k=9, head_dim=32)
    assert type(cuflash.flash_attn_func(q, k, v, causal=True).grad_fn).__name__ == "CppFunction"
    cu = torch.tensor([0, 4, 9], dtype=torch.int32)
    packed = [x.detach()[0].clone().requires_grad_() for x in (q, k, v)]
    out = cuflash.flash_attn_varlen_func(*packed, cu, cu, 5, 5)
    assert type(out.grad_fn).__name__ == "CppFunction"
    with torch.no_grad():
        assert cuflash.attention(q, k, v).grad_fn is None
    out.sum().backward()  # expanded ones: dout with stride 0, made contiguous by the kernel
    assert all(x.grad is not None for x in packed)


@ext
def test_kvcache_append_bumps_versions_and_writes_inference_tensors():
    q = torch.randn(2, 3, 4, 32)
    k_cache, v_cache = torch.randn(2, 16, 2, 32), torch.randn(2, 16, 2, 32)
    k_new, v_new = torch.randn(2, 3, 2, 32), torch.randn(2, 3, 2, 32)
    seqlens = torch.tensor([5, 11], dtype=torch.int32)
    before = k_cache._version, v_cache._version
    cuflash.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens, causal=True)
    assert (k_cache._version, v_cache._version) == (before[0] + 1, before[1] + 1)
    assert torch.equal(k_cache[0, 5:8], k_new[0]) and torch.equal(v_cache[1, 11:14], v_new[1])
    with torch.inference_mode():
        k_inf, v_inf = k_cache.clone(), v_cache.clone()
    # Inference tensors written outside inference mode, as the Python path allows.
    cuflash.flash_attn_with_kvcache(q, k_inf, v_inf, k_new * 2, v_new, cache_seqlens=seqlens - 2)
    assert torch.equal(k_inf[0, 3:6], k_new[0] * 2)


@ext
def test_ops_pass_opcheck():
    """Schemas, Meta kernels (dynamic shapes too), the autograd registration, for all four ops."""
    q, k, v = (x.detach() for x in make_inputs("cpu", torch.float32, seqlen_q=16, seqlen_k=24, head_dim=32))
    k_cache, v_cache = torch.randn(2, 40, 2, 32), torch.randn(2, 40, 2, 32)
    k_new, v_new = torch.randn(2, 3, 2, 32), torch.randn(2, 3, 2, 32)
    seqlens = torch.tensor([5, 11], dtype=torch.int32)
    torch.library.opcheck(torch.ops.cuflash.fwd_kvcache.default,
                          (q, k_cache, v_cache, k_new, v_new, seqlens, None, None, None, True, -1, -1, 0.0, True,
                           "auto"))
    out_a, lse_a = cuflash.attention(q, k[:, :10], v[:, :10], return_lse=True)
    out_b, lse_b = cuflash.attention(q, k[:, 10:], v[:, 10:], return_lse=True)
    torch.library.opcheck(torch.ops.cuflash.merge_states.default, (out_a, lse_a, out_b, lse_b, "auto"))
    cu = torch.tensor([0, 7, 16], dtype=torch.int32)
    packed = [x[0].clone().requires_grad_() for x in (q, k[:, :16], v[:, :16])]
    torch.library.opcheck(torch.ops.cuflash.fwd.default,
                          (*packed, None, cu, cu, 9, 9, None, None, 0.5, True, -1, -1, 0.0, True, True, "cpu"))
    # Sinks (differentiable) and dropout with its (seed, offset) tensor; sinks in a KV-cache append.
    sinks = torch.randn(4, requires_grad=True)
    rng = torch.tensor([-3, 5], dtype=torch.int64)
    torch.library.opcheck(torch.ops.cuflash.fwd.default,
                          (*packed, None, cu, cu, 9, 9, None, None, None, True, -1, -1, 0.0, False, True, "cpu",
                           sinks, 0.3, rng))
    torch.library.opcheck(torch.ops.cuflash.fwd_kvcache.default,
                          (q, k_cache, v_cache, k_new, v_new, seqlens, None, None, None, True, -1, -1, 0.0, True,
                           "auto", sinks.detach()))
    # A leftpad, with an interleaved rotary embedding of q and the appended keys; a leftpad through fwd.
    leftpad = torch.tensor([2, 11], dtype=torch.int32)
    angles = torch.arange(56)[:, None] * 10000.0 ** (-torch.arange(8) / 8.0)[None, :]
    torch.library.opcheck(torch.ops.cuflash.fwd_kvcache.default,
                          (q, k_cache, v_cache, k_new, v_new, seqlens, None, None, None, True, -1, -1, 0.0, True,
                           "auto", None, leftpad, angles.cos(), angles.sin(), True))
    torch.library.opcheck(torch.ops.cuflash.fwd.default,
                          (q.requires_grad_(), k_cache.requires_grad_(), v_cache.requires_grad_(), None, None, None, 0,
                           0, seqlens, None, None, True, -1, -1, 0.0, False, True, "cpu", None, 0.0, None, leftpad))


@ext
def test_cpp_node_sinks_and_dropout_equal_the_python_path():
    """Sinks (with their gradient) and dropout through the C++ node: out, lse, dq, dk, dv and dsinks
    equal to the Python autograd.Function's, dense and varlen, the backward redrawing the same mask."""
    gen = torch.Generator().manual_seed(11)
    q, k, v = make_inputs("cpu", torch.float32, seqlen_q=19, seqlen_k=23, head_dim=32, seed=4)
    sinks = torch.randn(4, generator=gen).requires_grad_()
    cu = torch.tensor([0, 9, 9, 26], dtype=torch.int32)
    packed = [torch.randn(26, h, 32, generator=gen).requires_grad_() for h in (4, 2, 2)]
    varlen = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=17, max_seqlen_k=17)
    dropout_key = key(causal=True) + (0.25,)
    for inputs, extras, options in (((q, k, v), {}, dropout_key), ((q, k, v), {}, key(softcap=2.0)),
                                    (packed, varlen, dropout_key)):
        results = []
        for call in (_torch_ext.attention_eager, python_path):
            qq, kk, vv, ss = fresh(*inputs, sinks)
            out, lse = call(qq, kk, vv, options, sinks=ss, rng=(2**64 - 5, 17), **extras)
            out.backward(torch.ones_like(out))
            results.append((out.detach(), lse, qq.grad, kk.grad, vv.grad, ss.grad, type(out.grad_fn).__name__))
        ext_result, python_result = results
        assert ext_result[6] == "CppFunction" and python_result[6] != "CppFunction"
        for a, b in zip(ext_result[:6], python_result[:6]):
            assert a is not None and torch.equal(a, b)
    # Sinks alone asking for a gradient make a node too; dsinks only then.
    qq, kk, vv = (x.detach() for x in (q, k, v))
    out, lse = _torch_ext.attention_eager(qq, kk, vv, key(), sinks=sinks.detach().requires_grad_())
    assert type(out.grad_fn).__name__ == "CppFunction"
    grads = _torch_ext.backward(torch.ones_like(out), qq, kk, vv, out.detach(), lse, key(), sinks=sinks.detach())
    assert len(grads) == 3


PARITY = """
import sys, torch, cuflash
torch.manual_seed(7)
q, k, v = (torch.randn(2, 13, h, 32, requires_grad=True) for h in (4, 2, 2))
sinks = torch.randn(4, requires_grad=True)
results = {}
out, lse, probs = cuflash.flash_attn_func(q, k, v, dropout_p=0.3, causal=True, return_attn_probs=True, sinks=sinks)
results["probs"] = (out.detach(), lse, probs)
out = cuflash.flash_attn_func(q, k, v, dropout_p=0.2, softcap=3.0, learnable_sink=sinks)
out.sum().backward()
results["dropout_sinks"] = (out.detach(), q.grad, k.grad, v.grad, sinks.grad)
out = cuflash.attention(q, k, v, dropout_p=0.4, dropout_seed=2**64 - 3, dropout_offset=5)
results["explicit_seed"] = (out,)
grads = cuflash.attention_backward(torch.ones_like(out), q, k, v, out, cuflash.attention(
    q, k, v, dropout_p=0.4, dropout_seed=2**64 - 3, dropout_offset=5, return_lse=True)[1], sinks=sinks,
    dropout_p=0.4, dropout_seed=2**64 - 3, dropout_offset=5)
results["backward"] = grads
k_cache, v_cache = torch.randn(2, 16, 2, 32), torch.randn(2, 16, 2, 32)
out, lse = cuflash.flash_attn_with_kvcache(q[:, :1].detach(), k_cache, v_cache, torch.randn(2, 1, 2, 32),
                                           torch.randn(2, 1, 2, 32), cache_seqlens=torch.tensor([3, 9],
                                           dtype=torch.int32), sinks=sinks, return_softmax_lse=True)
results["kvcache"] = (out, lse, k_cache)
angles = torch.arange(18)[:, None] * 10000.0 ** (-torch.arange(8) / 8.0)[None, :]
out, lse = cuflash.flash_attn_with_kvcache(q[:, :2].detach(), k_cache, v_cache, torch.randn(2, 2, 2, 32),
                                           torch.randn(2, 2, 2, 32), rotary_cos=angles.cos(), rotary_sin=angles.sin(),
                                           cache_seqlens=torch.tensor([3, 9], dtype=torch.int32), causal=True,
                                           cache_leftpad=torch.tensor([1, 4], dtype=torch.int32),
                                           return_softmax_lse=True)
results["kvcache_leftpad_rotary"] = (out, lse, k_cache)
compiled = torch.compile(lambda q, k, v, s: cuflash.flash_attn_func(q, k, v, dropout_p=0.3, sinks=s),
                         backend="aot_eager", fullgraph=True)
torch.manual_seed(9)
q.grad = k.grad = v.grad = sinks.grad = None
out = compiled(q, k, v, sinks)
out.sum().backward()
results["compiled"] = (out.detach(), q.grad, k.grad, v.grad, sinks.grad)
torch.save({name: [t.detach() for t in ts] for name, ts in results.items()}, sys.argv[1] if len(sys.argv) > 1 else "")
print("loaded", cuflash._torch_ext.LOADED)
"""


@ext
def test_sinks_dropout_and_attn_probs_are_the_same_without_the_extension(tmp_path):
    """The public calls with sinks, dropout (seeds from torch's generator or given), return_attn_probs,
    their gradients, a KV-cache append with sinks and a compiled call: identical results in a process
    with the C++ operators and in one without (CUFLASH_TORCH_EXT=0)."""
    saved = {}
    for setting in ("1", "0"):
        path = tmp_path / f"results_{setting}.pt"
        code = PARITY.replace('sys.argv[1] if len(sys.argv) > 1 else ""', repr(str(path)))
        assert f"loaded {setting == '1'}" in run_python(code, setting)
        saved[setting] = torch.load(path)
    assert saved["1"].keys() == saved["0"].keys()
    for name in saved["1"]:
        for a, b in zip(saved["1"][name], saved["0"][name], strict=True):
            assert torch.equal(a, b), name


# ---- torch.compile -------------------------------------------------------------------------


class CacheStep(torch.nn.Module):
    def forward(self, q, k_cache, v_cache, k_new, v_new, seqlens):
        return cuflash.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens,
                                               causal=True) * 2


class LeftpadRotaryCacheStep(torch.nn.Module):
    def forward(self, q, k_cache, v_cache, k_new, v_new, seqlens, leftpad, cos, sin):
        return cuflash.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, rotary_cos=cos, rotary_sin=sin,
                                               cache_seqlens=seqlens, cache_leftpad=leftpad, causal=True) * 2


def varlen_block(q, k, v, cu):
    return cuflash.flash_attn_varlen_func(q, k, v, cu, cu, 9, 9, causal=True, softcap=2.0).sin()


@ext
def test_compile_no_graph_break_with_the_cpp_ops():
    torch.manual_seed(0)
    block = Block()
    x = torch.randn(2, 21, 64, requires_grad=True)
    breaks, explanation = graph_breaks(block, x)
    assert breaks == 0, str(explanation.break_reasons)
    cu = torch.tensor([0, 7, 16], dtype=torch.int32)
    q, k, v = (torch.randn(16, h, 32, requires_grad=True) for h in (4, 2, 2))
    breaks, explanation = graph_breaks(varlen_block, q, k, v, cu)
    assert breaks == 0, str(explanation.break_reasons)
    args = (torch.randn(2, 1, 4, 32), torch.randn(2, 16, 2, 32), torch.randn(2, 16, 2, 32), torch.randn(2, 1, 2, 32),
            torch.randn(2, 1, 2, 32), torch.tensor([3, 9], dtype=torch.int32))
    breaks, explanation = graph_breaks(CacheStep(), *args)
    assert breaks == 0, str(explanation.break_reasons)
    angles = torch.arange(17)[:, None] * 10000.0 ** (-torch.arange(8) / 8.0)[None, :]
    breaks, explanation = graph_breaks(LeftpadRotaryCacheStep(), *args, torch.tensor([1, 5], dtype=torch.int32),
                                       angles.cos(), angles.sin())
    assert breaks == 0, str(explanation.break_reasons)


@ext
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_compile_forward_backward_matches_eager(dynamic):
    """aot_eager: the joint graph traced through the C++ autograd node (Meta kernels with symbolic
    sizes when dynamic), then run; values and gradients equal to eager."""
    torch._dynamo.reset()
    cu = torch.tensor([0, 7, 16], dtype=torch.int32)
    compiled = torch.compile(varlen_block, backend="aot_eager", fullgraph=True, dynamic=dynamic)
    for total in (16, 16) if not dynamic else (16, 14):
        cu = torch.tensor([0, 7, total], dtype=torch.int32)
        q, k, v = (torch.randn(total, h, 32, requires_grad=True) for h in (4, 2, 2))
        out = compiled(q, k, v, cu)
        out.sum().backward()
        grads = [x.grad.clone() for x in (q, k, v)]
        for x in (q, k, v):
            x.grad = None
        want = varlen_block(q, k, v, cu)
        want.sum().backward()
        assert torch.equal(out, want)
        for got, expected in zip(grads, (q.grad, k.grad, v.grad)):
            assert torch.equal(got, expected)
    args = [torch.randn(2, 1, 4, 32), torch.randn(2, 16, 2, 32), torch.randn(2, 16, 2, 32), torch.randn(2, 1, 2, 32),
            torch.randn(2, 1, 2, 32), torch.tensor([3, 9], dtype=torch.int32)]
    eager_args = [a.clone() for a in args]
    out = torch.compile(CacheStep(), backend="aot_eager", fullgraph=True, dynamic=dynamic)(*args)
    want = CacheStep()(*eager_args)
    assert torch.equal(out, want) and torch.equal(args[1], eager_args[1]) and torch.equal(args[2], eager_args[2])


# ---- the same errors, and the fallback -------------------------------------------------------

ERRORS = """
import json, torch, cuflash
q = torch.randn(2, 5, 4, 32)
calls = [
    lambda: cuflash.attention(q, q, q, softmax_scale="x"),
    lambda: cuflash.attention(q, q, q, window_size=(1.5, 2)),
    lambda: cuflash.attention(q, q, q, backend="nope"),
    lambda: cuflash.flash_attn_func(q, torch.randn(2, 5, 3, 32), torch.randn(2, 5, 3, 32)),
    lambda: cuflash.flash_attn_func(q.double(), q.double(), q.double()),
    lambda: cuflash.flash_attn_func(q, q.long(), q),
    lambda: cuflash.flash_attn_func(q, q[..., :16], q),
    lambda: cuflash.flash_attn_varlen_func(q[0], q[0], q[0], torch.tensor([0, 5]), torch.tensor([0, 5]), 5, 5),
    lambda: cuflash.flash_attn_varlen_func(q[0], q[0], q[0], torch.tensor([0, 9], dtype=torch.int32),
                                           torch.tensor([0, 5], dtype=torch.int32), 9, 5),
    lambda: cuflash.flash_attn_with_kvcache(q, q, q, cache_seqlens=torch.tensor([9, 1], dtype=torch.int32)),
    lambda: cuflash.attention_backward(q, q, q, q, q, torch.zeros(2, 4, 6)),
    lambda: cuflash.merge_states(q, torch.zeros(2, 4, 5), q, torch.zeros(2, 4, 6)),
]
seen = []
for call in calls:
    try:
        call()
        seen.append(None)
    except Exception as error:
        seen.append([type(error).__name__, isinstance(error, cuflash.InvalidArgumentError), str(error)])
print(json.dumps({"loaded": cuflash._torch_ext.LOADED, "errors": seen}))
"""


def errors_with(setting):
    return json.loads(run_python(ERRORS, setting).strip().splitlines()[-1])


@ext
def test_errors_are_the_python_paths():
    with_ext, without = errors_with("1"), errors_with("0")
    assert with_ext["loaded"] and not without["loaded"]
    assert all(e is not None and e[1] for e in with_ext["errors"]), with_ext["errors"]
    assert with_ext["errors"] == without["errors"]


FALLBACK = """
import torch, cuflash
from cuflash import _torch_ext, _torch_ops
from test_torch import Block, graph_breaks
print("loaded", _torch_ext.LOADED, type(_torch_ops.fwd).__name__)
q, k, v = (torch.randn(2, 9, h, 32, requires_grad=True) for h in (4, 2, 2))
out = cuflash.flash_attn_func(q, k, v, causal=True)
out.sum().backward()
print("node", type(out.grad_fn).__name__, float(q.grad.abs().sum()) > 0)
print("breaks", graph_breaks(Block(), torch.randn(2, 9, 64, requires_grad=True))[0])
"""


def test_fallback_to_the_python_ops_when_turned_off():
    lines = run_python(FALLBACK, "0").splitlines()
    assert "loaded False CustomOpDef" in lines
    assert "node _AttentionBackward True" in lines  # the Python autograd.Function's node
    assert "breaks 0" in lines


def test_required_extension_loads_or_import_fails():
    """CUFLASH_TORCH_EXT=1: the C++ operators, or ImportError when the package has none."""
    if BUILT:
        lines = run_python(FALLBACK, "1").splitlines()
        assert "loaded True OpOverloadPacket" in lines and "node CppFunction True" in lines
        assert "breaks 0" in lines
    else:
        with pytest.raises(AssertionError, match="ImportError"):
            run_python("import cuflash", "1")


def test_default_loads_what_the_package_has():
    lines = run_python("import cuflash; print(cuflash._torch_ext.LOADED, cuflash._torch_ext.REASON)", None)
    assert lines.split()[0] == str(BUILT)
