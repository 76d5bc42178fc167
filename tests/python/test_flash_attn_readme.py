"""flash-attn's README usage, unchanged but for the import: ``import cuflash as
flash_attn``. The README shows the calls with their keyword arguments; here they
run on real tensors: numpy float16 on the CPU backend (always), torch bfloat16
on the CPU and, when there is one, on the GPU."""

import numpy as np
import pytest

import cuflash as flash_attn
from cuflash import flash_attn_func, flash_attn_qkvpacked_func, flash_attn_with_kvcache  # noqa: F401


def _frameworks():
    yield pytest.param("numpy", "cpu", id="numpy-cpu")
    try:
        import torch
    except ImportError:
        return
    yield pytest.param("torch", "cpu", id="torch-cpu")
    if torch.cuda.is_available() and flash_attn.backend_available("cuda"):
        yield pytest.param("torch", "cuda", id="torch-cuda")


def _maker(framework, device):
    rng = np.random.default_rng(0)
    if framework == "numpy":
        return lambda *shape: rng.standard_normal(shape).astype(np.float16), lambda x: np.asarray(x, np.float32)
    import torch

    def make(*shape):
        return torch.from_numpy(rng.standard_normal(shape).astype(np.float32)).to(device, torch.bfloat16)

    return make, lambda x: x.float().cpu().numpy()


@pytest.mark.parametrize("framework,device", list(_frameworks()))
def test_readme_usage(framework, device):
    make, to_numpy = _maker(framework, device)
    batch_size, seqlen, nheads, nheads_k, headdim = 2, 64, 8, 2, 64

    qkv = make(batch_size, seqlen, 3, nheads, headdim)
    out = flash_attn.flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False,
                                               window_size=(-1, -1), alibi_slopes=None, deterministic=False)
    assert out.shape == (batch_size, seqlen, nheads, headdim)

    q, k, v = make(batch_size, seqlen, nheads, headdim), make(batch_size, seqlen, nheads_k, headdim), make(
        batch_size, seqlen, nheads_k, headdim)
    out = flash_attn.flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                                     window_size=(-1, -1), alibi_slopes=None, deterministic=False)
    assert out.shape == (batch_size, seqlen, nheads, headdim)
    # The changelog's shorter forms.
    flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False)
    causal_out = flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=True)
    assert np.isfinite(to_numpy(causal_out)).all()

    cache_len = 128
    k_cache, v_cache = make(batch_size, cache_len, nheads_k, headdim), make(batch_size, cache_len, nheads_k, headdim)
    q1 = make(batch_size, 1, nheads, headdim)
    k1, v1 = make(batch_size, 1, nheads_k, headdim), make(batch_size, 1, nheads_k, headdim)
    out = flash_attn.flash_attn_with_kvcache(q1, k_cache, v_cache, k=k1, v=v1, rotary_cos=None, rotary_sin=None,
                                             cache_seqlens=seqlen, cache_batch_idx=None, cache_leftpad=None,
                                             block_table=None, softmax_scale=None, causal=False,
                                             window_size=(-1, -1), rotary_interleaved=True, alibi_slopes=None)
    assert out.shape == (batch_size, 1, nheads, headdim)
    np.testing.assert_array_equal(to_numpy(k_cache[:, seqlen]), to_numpy(k1[:, 0]))  # updated in place
