"""Outputs in the caller's framework, for calls that do not go through torch.

The compiled module only takes views (DLPack) and writes through them; this
module decides where outputs are allocated, on which stream the call runs, and
how results are handed back, from the framework the query tensor comes from:

- numpy: ``numpy.empty``; host memory, so no stream.
- CuPy: ``cupy.empty`` on the array's device; CuPy's current stream.
- JAX: JAX arrays are immutable, so outputs are allocated with numpy (CPU;
  torch for bfloat16, which numpy cannot export) or with torch / CuPy (GPU),
  written, and handed to JAX with ``from_dlpack`` (no copy). JAX does not expose its stream: the call waits for the inputs
  (``block_until_ready``) and, on a GPU, for its own completion. Appending to a
  KV cache (which writes into it) is refused for JAX arrays.
- anything else with ``__array_namespace__`` (the array API standard):
  ``xp.empty(..., device=x.device)`` and the default stream.
torch tensors never come here: they go through the custom ops of ``_torch_ops``.
"""

import sys

from ._ext import InvalidArgumentError

__all__ = ["Space", "framework_name"]


def framework_name(array, name="q"):
    """'numpy', 'cupy', 'jax', 'torch', 'array_api' or 'dlpack'; ValueError for anything else."""
    top = type(array).__module__.partition(".")[0]
    if top in ("numpy", "cupy", "torch"):
        return top
    if top in ("jax", "jaxlib"):
        return "jax"
    if hasattr(array, "__array_namespace__"):
        return "array_api"
    if hasattr(array, "__dlpack__"):
        return "dlpack"
    raise InvalidArgumentError(
        f"{name}: expected a DLPack tensor (numpy, torch, CuPy, JAX, ...), got {type(array).__module__}."
        f"{type(array).__name__}"
    )


def _dlpack_device(array):
    """(is_cuda, device_index) from __dlpack_device__ (kDLCUDA = 2, kDLCUDAManaged = 13)."""
    device_type, device_id = array.__dlpack_device__()
    return int(device_type) in (2, 13), int(device_id)


class Space:
    """Where a call's outputs live: allocation, stream, hand-back, for one framework."""

    def __init__(self, like, name="q"):
        self.like = like
        self.kind = framework_name(like, name)
        if self.kind == "torch":  # pragma: no cover - the torch path never builds a Space
            raise TypeError("torch tensors go through cuflash's torch ops")
        if self.kind == "dlpack":
            raise InvalidArgumentError(
                f"{name}: {type(like).__module__}.{type(like).__name__} has __dlpack__ but no array namespace: "
                "cuflash cannot allocate outputs beside it; pass numpy, torch, CuPy or JAX arrays"
            )
        self.on_cuda, self.device_index = _dlpack_device(like)
        self.helper = None  # the module that allocates outputs for JAX
        if self.kind == "jax":
            self._init_jax()

    # Allocation -----------------------------------------------------------------

    def _init_jax(self):
        # numpy cannot export bfloat16 through DLPack, and CuPy has no bfloat16: torch makes those.
        bfloat16 = str(self.like.dtype) == "bfloat16"
        if not self.on_cuda and not bfloat16:
            import numpy

            self.helper = ("numpy", numpy)
            return
        torch = sys.modules.get("torch")
        if torch is None:
            try:
                import torch  # noqa: F811
            except ImportError:
                torch = None
        if torch is not None and (not self.on_cuda or torch.cuda.is_available()):
            self.helper = ("torch", torch)
            return
        if self.on_cuda and not bfloat16:
            try:
                import cupy

                self.helper = ("cupy", cupy)
                return
            except ImportError:
                pass
        raise NotImplementedError(
            f"JAX {self.like.dtype} arrays on the {'GPU' if self.on_cuda else 'CPU'}: cuflash allocates their "
            f"outputs with {'torch' if bfloat16 else 'torch or CuPy'}, and it is not installed"
        )

    def _dtype(self, which):
        """The output dtype in the allocating module: 'like' (the query's), 'float32' or 'int32'."""
        kind, module = self.helper if self.helper else (self.kind, None)
        if kind == "torch":
            if which == "like":
                return _torch_dtype_of(self.like, module)
            return getattr(module, which)
        if which == "like":
            return self.like.dtype
        if kind == "numpy":
            import numpy

            return numpy.dtype(which)
        if kind == "cupy":
            import cupy

            return cupy.dtype(which)
        return getattr(self.like.__array_namespace__(), which)

    def empty(self, shape, which="like"):
        return self._allocate(tuple(int(s) for s in shape), which, zero=False)

    def zeros(self, shape, which="like"):
        return self._allocate(tuple(int(s) for s in shape), which, zero=True)

    def _allocate(self, shape, which, zero):
        dtype = self._dtype(which)
        kind, module = self.helper if self.helper else (self.kind, None)
        if kind == "numpy":
            import numpy

            return (numpy.zeros if zero else numpy.empty)(shape, dtype=dtype)
        if kind == "cupy":
            import cupy

            with cupy.cuda.Device(self.device_index):
                return (cupy.zeros if zero else cupy.empty)(shape, dtype=dtype)
        if kind == "torch":
            device = module.device("cuda", self.device_index) if self.on_cuda else module.device("cpu")
            return (module.zeros if zero else module.empty)(shape, dtype=dtype, device=device)
        xp = self.like.__array_namespace__()
        return (xp.zeros if zero else xp.empty)(shape, dtype=dtype, device=self.like.device)

    def full_int32(self, shape, value):
        """An int32 input tensor (e.g. cache_seqlens given as an int), beside the query."""
        if self.kind == "jax":
            import jax.numpy as jnp

            return jnp.full(shape, value, dtype=jnp.int32, device=next(iter(self.like.devices())))
        out = self.empty(shape, "int32")
        out[...] = value
        return out

    # The call ---------------------------------------------------------------------

    @property
    def stream(self):
        if self.kind == "cupy":
            import cupy

            return int(cupy.cuda.get_current_stream().ptr)
        return 0

    @property
    def immutable(self):
        return self.kind == "jax"

    def before(self, *arrays):
        """Waits for JAX inputs: JAX does not say on which stream they are being made."""
        if self.kind == "jax":
            for array in arrays:
                if array is not None and hasattr(array, "block_until_ready"):
                    array.block_until_ready()

    def after(self):
        if self.kind == "jax" and self.on_cuda:
            kind, module = self.helper
            if kind == "torch":
                module.cuda.synchronize(self.device_index)
            else:
                with module.cuda.Device(self.device_index):
                    module.cuda.runtime.deviceSynchronize()

    def finish(self, array):
        """An output as an array of the caller's framework."""
        if self.kind != "jax":
            return array
        import jax

        return jax.dlpack.from_dlpack(array)


def _torch_dtype_of(like, torch):
    name = str(like.dtype)
    table = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "int32": torch.int32}
    if name not in table:
        raise InvalidArgumentError(f"q: dtype {name} is not supported (expected float32, float16 or bfloat16)")
    return table[name]
