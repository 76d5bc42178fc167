"""cuflash's torch operators in C++ (``_ext_torch.so``), when the package has them.

The library is built when the Python that built the package could import
torch (python/src/torch_ext.cpp, cmake/torch_ext.cmake). It registers
``torch.ops.cuflash.fwd``, ``bwd``, ``fwd_kvcache`` and ``merge_states`` --
the names and schemas that ``_torch_py_ops`` defines in Python otherwise --
with CPU/CUDA kernels that call the C++ API directly, Meta kernels for
torch.compile, and a C++ autograd node for ``fwd``. An eager call is then one
call into torch's dispatcher, and ``loss.backward()`` runs a C++ node instead
of a Python ``torch.autograd.Function`` (whose node alone costs torch's
autograd engine a few hundred microseconds).

``CUFLASH_TORCH_EXT`` in the environment when cuflash is imported: unset or
``auto`` loads the library when it is there and was built for this torch
(else the Python operators, with a warning when it is there but unusable);
``0``/``off`` never loads it; ``1``/``on`` requires it (ImportError
otherwise). ``LOADED``, ``PATH`` and ``REASON`` say what happened.

The eager functions below have the signatures of ``_torch_call``'s, so that
``_api`` takes either module: the options arrive as the key of
``_args.options`` and are checked by ``_args.op_options`` (the same messages,
once per distinct key); an invalid argument the C++ side finds comes back as
torch's ValueError and is raised as InvalidArgumentError.
"""

import os
import re
import warnings

import torch

from . import _args, _torch_call
from ._args import InvalidArgumentError

__all__ = ["LOADED", "PATH", "REASON", "attention_eager", "append_and_attend", "backward", "merge_states"]

FILE_NAME = "_ext_torch.so"
_MARK = re.compile(rb"cuflash-torch-ext-built-for:([^;\x00]*);")


def _release(version):
    """'2.11' from '2.11.0+cu130': torch keeps its C++ ABI within a minor release."""
    return ".".join(version.split("+")[0].split(".")[:2])


def _built_for(path):
    with open(path, "rb") as library:
        found = _MARK.search(library.read())
    return found.group(1).decode() if found else None


def _load():
    """(path or None, reason)."""
    setting = os.environ.get("CUFLASH_TORCH_EXT", "auto").strip().lower()
    if setting in ("0", "off", "false", "no"):
        return None, f"turned off (CUFLASH_TORCH_EXT={os.environ['CUFLASH_TORCH_EXT']})"
    required = setting in ("1", "on", "true", "yes")
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), FILE_NAME)
    if not os.path.exists(path):
        reason = "not in this package (torch was not importable when it was built)"
        if required:
            raise ImportError(f"cuflash: CUFLASH_TORCH_EXT={os.environ['CUFLASH_TORCH_EXT']}, but {FILE_NAME} is "
                              f"{reason}; rebuild with torch installed (pip install --no-build-isolation .)")
        return None, reason
    try:
        built_for = _built_for(path)
        if built_for is None or _release(built_for) != _release(torch.__version__):
            raise OSError(f"built for torch {built_for}, this is torch {torch.__version__}: rebuild the package")
        torch.ops.load_library(path)
    except (OSError, RuntimeError) as error:
        if required:
            raise ImportError(f"cuflash: cannot load {path}: {error}") from error
        warnings.warn(f"cuflash: the torch operators in C++ ({path}) cannot be used ({error}); using the Python "
                      "ones (slower on the host)", RuntimeWarning, stacklevel=3)
        return None, f"cannot be used: {error}"
    return path, "loaded"


PATH, REASON = _load()
LOADED = PATH is not None

if LOADED:

    def _direct(overload):
        # The C++ callable behind an OpOverload: one Python frame less than its __call__.
        return getattr(overload, "_op", overload)

    _fwd = _direct(torch.ops.cuflash.fwd.default)
    _bwd = _direct(torch.ops.cuflash.bwd.default)
    _fwd_kvcache = _direct(torch.ops.cuflash.fwd_kvcache.default)
    _merge_states = _direct(torch.ops.cuflash.merge_states.default)

    def _rng(dropout_p, rng):
        # The operators take the dropout (seed, offset) as an int64 [2] host tensor, given with dropout only.
        return _torch_call.rng_tensor(rng) if dropout_p else None

    def attention_eager(q, k, v, options_key, alibi_slopes=None, cu_seqlens_q=None, cu_seqlens_k=None,
                        max_seqlen_q=0, max_seqlen_k=0, seqlens_k=None, block_table=None, sinks=None, rng=(0, 0),
                        attn_probs=False, cache_leftpad=None):
        """(out, lse), differentiable in q, k, v and sinks when autograd asks for it (the C++ node).
        attn_probs, a debug output that is not an operator's, takes the Python path: (out, lse, attn_probs)."""
        if attn_probs:
            return _torch_call.attention_eager(q, k, v, options_key, alibi_slopes=alibi_slopes,
                                               cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                                               max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                                               seqlens_k=seqlens_k, block_table=block_table, sinks=sinks, rng=rng,
                                               attn_probs=True, cache_leftpad=cache_leftpad)
        scale, causal, left, right, softcap, deterministic, check, backend, dropout_p = _args.op_options(options_key)
        try:
            return _fwd(q, k, v, alibi_slopes, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqlens_k,
                        block_table, scale, causal, left, right, softcap, deterministic, check, backend, sinks,
                        dropout_p, _rng(dropout_p, rng), cache_leftpad)
        except ValueError as error:
            raise InvalidArgumentError(str(error)) from None

    def append_and_attend(q, k_cache, v_cache, k_new, v_new, options_key, alibi_slopes=None, seqlens_k=None,
                          block_table=None, sinks=None, attn_probs=False, cache_leftpad=None, rotary_cos=None,
                          rotary_sin=None, rotary_interleaved=False):
        """KV-cache forward that first writes k_new/v_new (k_new rotated, with rotary_cos/rotary_sin) into the
        caches (in place; not differentiable). The operator bumps the caches' version counters. attn_probs
        takes the Python path."""
        if attn_probs:
            return _torch_call.append_and_attend(q, k_cache, v_cache, k_new, v_new, options_key,
                                                 alibi_slopes=alibi_slopes, seqlens_k=seqlens_k,
                                                 block_table=block_table, sinks=sinks, attn_probs=True,
                                                 cache_leftpad=cache_leftpad, rotary_cos=rotary_cos,
                                                 rotary_sin=rotary_sin, rotary_interleaved=rotary_interleaved)
        scale, causal, left, right, softcap, _, check, backend, _ = _args.op_options(options_key)
        try:
            return _fwd_kvcache(q, k_cache, v_cache, k_new, v_new, seqlens_k, block_table, alibi_slopes, scale,
                                causal, left, right, softcap, check, backend, sinks, cache_leftpad, rotary_cos,
                                rotary_sin, bool(rotary_interleaved))
        except ValueError as error:
            raise InvalidArgumentError(str(error)) from None

    def backward(dout, q, k, v, out, lse, options_key, alibi_slopes=None, cu_seqlens_q=None, cu_seqlens_k=None,
                 max_seqlen_q=0, max_seqlen_k=0, seqlens_k=None, block_table=None, sinks=None, rng=(0, 0),
                 want_dsinks=False, cache_leftpad=None):
        """(dq, dk, dv) from the forward's out and lse; (dq, dk, dv, dsinks) with want_dsinks (and sinks)."""
        scale, causal, left, right, softcap, deterministic, check, backend, dropout_p = _args.op_options(options_key)
        try:
            grads = _bwd(dout, q, k, v, out, lse, alibi_slopes, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                         max_seqlen_k, seqlens_k, block_table, scale, causal, left, right, softcap, deterministic,
                         check, backend, sinks, dropout_p, _rng(dropout_p, rng), cache_leftpad)
        except ValueError as error:
            raise InvalidArgumentError(str(error)) from None
        return grads if want_dsinks and sinks is not None else grads[:3]

    def merge_states(out_a, lse_a, out_b, lse_b, backend):
        try:
            return _merge_states(out_a, lse_a, out_b, lse_b, backend)
        except ValueError as error:
            raise InvalidArgumentError(str(error)) from None
