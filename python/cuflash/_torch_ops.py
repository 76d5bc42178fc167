"""The torch operators ``torch.ops.cuflash.fwd``, ``bwd``, ``fwd_kvcache`` and
``merge_states``: what torch.compile traces, and tensor subclasses call.

From the C++ library when the package has it and it loaded (``_torch_ext``:
C++ kernels and autograd node), else defined in Python (``_torch_py_ops``:
torch.library custom ops over ``_torch_call``). Same names, schemas and
semantics either way; only one of the two may register them in a process.
"""

import torch

from . import _torch_ext

if _torch_ext.LOADED:
    fwd = torch.ops.cuflash.fwd
    bwd = torch.ops.cuflash.bwd
    fwd_kvcache = torch.ops.cuflash.fwd_kvcache
    merge_states = torch.ops.cuflash.merge_states
else:
    from ._torch_py_ops import bwd, fwd, fwd_kvcache, merge_states  # noqa: F401

__all__ = ["fwd", "bwd", "fwd_kvcache", "merge_states"]
