"""DLPack tensors of other frameworks: JAX (CPU, and GPU when there is one)
and CuPy (GPU). Outputs must come back in the caller's framework with the
right values; each test skips when its framework (or a GPU) is missing."""

import importlib.util

import numpy as np
import pytest

import cuflash
import reference as ref


def _inputs(seed=0, batch=2, seqlen_q=40, seqlen_k=56, heads=4, heads_kv=2, head_dim=64):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((batch, seqlen_q, heads, head_dim)).astype(np.float32)
    k = rng.standard_normal((batch, seqlen_k, heads_kv, head_dim)).astype(np.float32)
    v = rng.standard_normal((batch, seqlen_k, heads_kv, head_dim)).astype(np.float32)
    return q, k, v


def _jax_devices():
    try:
        import jax
    except ImportError:
        return [pytest.param(None, marks=pytest.mark.skip(reason="jax is not installed"))]
    params = [pytest.param("cpu", id="jax-cpu")]
    try:
        if jax.devices("gpu") and cuflash.backend_available("cuda"):
            params.append(pytest.param("gpu", id="jax-gpu"))
    except RuntimeError:
        pass
    return params


@pytest.mark.parametrize("platform", _jax_devices())
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_jax_arrays_in_jax_arrays_out(platform, dtype):
    import jax
    import jax.numpy as jnp

    if platform == "gpu" and dtype == "float32":
        pytest.skip("float32 on the GPU takes the f32 path, tested in C++; bf16 is the one that matters")
    if platform == "cpu" and dtype == "bfloat16" and importlib.util.find_spec("torch") is None:
        pytest.skip("bf16 JAX outputs on the CPU are allocated through torch, which is not installed")
    device = jax.devices(platform)[0]
    q, k, v = _inputs()
    jq, jk, jv = (jax.device_put(jnp.asarray(x, dtype=dtype), device) for x in (q, k, v))
    out, lse = cuflash.attention(jq, jk, jv, causal=True, return_lse=True)
    assert isinstance(out, jax.Array) and out.dtype == jnp.dtype(dtype) and lse.dtype == jnp.float32
    assert next(iter(out.devices())).platform == device.platform
    upcast = [np.asarray(x.astype(jnp.float32)) for x in (jq, jk, jv)]
    want_out, want_lse = ref.dense(*upcast, causal=True)
    tolerance = 2e-5 if dtype == "float32" else 1e-2
    assert ref.rel_l2(np.asarray(out.astype(jnp.float32)), want_out) <= tolerance
    assert ref.max_abs(np.asarray(lse), want_lse) <= (1e-4 if dtype == "float32" else 5e-2)
    # On the GPU a decode step runs on cudnn or cuda, whichever auto picks (both have KV-cache kernels).
    decode = cuflash.flash_attn_with_kvcache(jq[:, :1], jk, jv, cache_seqlens=30)
    assert isinstance(decode, jax.Array) and decode.shape == (2, 1, 4, 64)
    upcast_cache = [np.asarray(x.astype(jnp.float32)) for x in (jq[:, :1], jk[:, :30], jv[:, :30])]
    want_decode, _ = ref.dense(*upcast_cache, causal=False)
    assert ref.rel_l2(np.asarray(decode.astype(jnp.float32)), want_decode) <= tolerance
    with pytest.raises(NotImplementedError, match="immutable"):
        cuflash.flash_attn_with_kvcache(jq[:, :1], jk, jv, jk[:, :1], jv[:, :1], cache_seqlens=30)


def _cupy_or_skip():
    cupy = pytest.importorskip("cupy")
    try:
        if cupy.cuda.runtime.getDeviceCount() == 0 or not cuflash.backend_available("cuda"):
            pytest.skip("needs a CUDA GPU and cuflash's CUDA backend")
    except cupy.cuda.runtime.CUDARuntimeError:
        pytest.skip("needs a CUDA GPU")
    return cupy


def test_cupy_arrays_on_a_cupy_stream():
    cupy = _cupy_or_skip()
    q, k, v = _inputs(seed=1)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        cq, ck, cv = (cupy.asarray(x, dtype=cupy.float16) for x in (q, k, v))
        out = cuflash.flash_attn_func(cq, ck, cv, causal=True, window_size=(20, 0))
        result = cupy.asnumpy(out.astype(cupy.float32), stream=stream)
        stream.synchronize()
    assert isinstance(out, cupy.ndarray) and out.dtype == cupy.float16
    upcast = [np.asarray(x, dtype=np.float16).astype(np.float32) for x in (q, k, v)]
    want = ref.dense(*upcast, causal=True, window=(20, 0))[0]
    assert ref.rel_l2(result, want) <= 3e-3
