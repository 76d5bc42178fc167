"""cuflash: exact softmax attention (FlashAttention-2 semantics) for Python.

- flash-attn 2.x's functions, so that ``import cuflash as flash_attn`` works:
  :func:`flash_attn_func`, :func:`flash_attn_qkvpacked_func`,
  :func:`flash_attn_kvpacked_func`, :func:`flash_attn_varlen_func` (and its
  packed variants), :func:`flash_attn_with_kvcache`.
- cuflash's own calls with every option of the C++ API and a backend choice:
  :func:`attention`, :func:`attention_backward`, :func:`merge_states`.
- linear attention (flash-linear-attention's semantics, docs/linear.md):
  :func:`linear_attention`, :func:`linear_attention_backward`,
  :func:`linear_attention_step` (backends cpu and cuda).

Inputs are DLPack tensors (torch, CuPy, JAX on a GPU; numpy on the CPU),
read without copies; outputs come in the caller's framework, computed on its
current CUDA stream. With torch installed the calls are torch custom ops
(``torch.ops.cuflash.*``) with autograd, so torch.compile keeps them whole.
Errors: InvalidArgumentError (bad input; both a ValueError and a RuntimeError,
since flash-attn raises RuntimeError there), NotImplementedError (valid, not
supported by the backend), RuntimeError (CUDA failures), with the library's
message.
"""

# torch first, when it is installed: libcuflash links NVRTC and cuDNN by
# soname, and whichever copy a process loads first is the one everybody
# gets. Loaded after ours, torch's CUDA libraries met a CUDA toolkit's NVRTC
# instead of the one torch ships, and its initialization aborted (free():
# invalid pointer, on the H100 machine with torch 2.11); loaded first, torch
# brings its own and ours resolve to them.
try:
    import torch as _torch  # noqa: F401
except ImportError:
    pass

from . import _ext, bert_padding
from ._api import attention, attention_backward, backend_available, merge_states, set_index_checks
from ._args import InvalidArgumentError
from ._linear import linear_attention, linear_attention_backward, linear_attention_step
from .flash_attn_interface import (
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    flash_attn_with_kvcache,
)

__version__ = _ext.version()

from . import flash_attn_interface as _flash_attn_interface

__all__ = [
    "attention",
    "attention_backward",
    "merge_states",
    "linear_attention",
    "linear_attention_backward",
    "linear_attention_step",
    "backend_available",
    "set_index_checks",
    "InvalidArgumentError",
    *_flash_attn_interface.__all__,
]
