"""The one place where Python arguments are checked before they reach C++.

The compiled module checks shapes, strides, dtypes and devices (the library's
``validate``, shared with C++ and C callers); what it cannot see is the Python
side of an argument: a list where an array goes, a scalar, None for a
required tensor, an integer that does not fit a C int, a read-only array the
call would write into. Those are checked here and raised as the documented
exceptions (InvalidArgumentError, a ValueError and a RuntimeError, for bad
input), with the argument's name, instead of
nanobind's TypeError with its signature dump or an IndexError from Python
code that assumed a rank. The options object the compiled module takes is
also built here, once per distinct set of options.
"""

from . import _ext

InvalidArgumentError = _ext.InvalidArgumentError  # a ValueError and a RuntimeError

__all__ = ["InvalidArgumentError", "array", "optional_array", "ranked", "integer", "window", "backend", "writable",
           "options", "option_values", "op_options", "register_tensor_type", "register_torch", "dropout_rng",
           "attn_probs_shape"]

BACKENDS = ("auto", "cpu", "cuda", "cudnn")
_INT_MAX = 2**31 - 1


def _describe(x):
    kind = type(x)
    return f"{kind.__module__}.{kind.__qualname__}" if kind.__module__ != "builtins" else kind.__qualname__


# Tensor classes known to be DLPack tensors (torch.Tensor, registered by _api when torch is
# there): array() takes them after one type lookup, which the hot paths pay per tensor.
_known_tensor_types = set()


def register_tensor_type(kind):
    _known_tensor_types.add(kind)


def array(x, name):
    """x when it is a tensor of rank >= 1 (DLPack or buffer protocol), else ValueError naming `name`."""
    if type(x) in _known_tensor_types and x.ndim:
        return x
    if x is None:
        raise InvalidArgumentError(f"{name}: required, got None")
    if isinstance(x, (list, tuple, int, float, bool, str, bytes)):
        raise InvalidArgumentError(f"{name}: expected a tensor (torch, numpy, CuPy, JAX, ...), got a {_describe(x)}")
    ndim = getattr(x, "ndim", None)
    if ndim is None or not (hasattr(x, "__dlpack__") or hasattr(x, "__array_interface__")):
        raise InvalidArgumentError(f"{name}: expected a tensor (torch, numpy, CuPy, JAX, ...), got {_describe(x)}")
    if ndim == 0:
        raise InvalidArgumentError(f"{name}: expected a tensor of rank >= 1, got a scalar ({_describe(x)})")
    return x


def optional_array(x, name):
    return None if x is None else array(x, name)


def ranked(x, name, ranks, what):
    """x (a tensor) when its rank is one of `ranks`; `what` says which layout expects it."""
    array(x, name)
    if x.ndim not in ranks:
        expected = " or ".join(str(r) for r in ranks)
        raise InvalidArgumentError(
            f"{name}: expected rank {expected} ({what}), got rank {x.ndim} with shape {tuple(x.shape)}")
    return x


def integer(x, name, low=0, high=_INT_MAX):
    """int(x) when x is an integer in [low, high]."""
    if isinstance(x, bool) or not hasattr(x, "__index__"):
        raise InvalidArgumentError(f"{name}: expected an integer, got {_describe(x)}")
    value = x.__index__()
    if not low <= value <= high:
        raise InvalidArgumentError(f"{name}: expected an integer in [{low}, {high}], got {value}")
    return value


def window(window_size):
    """(left, right) from flash-attn's window_size; None is unbounded."""
    if window_size is None or window_size == (-1, -1):
        return -1, -1
    try:
        left, right = window_size
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"window_size: expected (left, right), got {window_size!r}") from None
    # The range is the library's to check (its message names window_left/right).
    return integer(left, "window_size[0]", -_INT_MAX - 1), integer(right, "window_size[1]", -_INT_MAX - 1)


def backend(name):
    if name not in BACKENDS:
        raise InvalidArgumentError(f"backend: expected one of {', '.join(map(repr, BACKENDS))}, got {name!r}")
    return name


_UINT64 = 2**64


def dropout_rng(dropout_p, seed, offset, like):
    """(seed, offset) of a call's dropout mask, unsigned 64-bit. Without dropout (0, 0). An explicit
    seed is taken as given (offset default 0); otherwise both are drawn from the caller's framework:
    torch's default generator for torch tensors (so torch.manual_seed reproduces a run), numpy's
    global one otherwise (np.random.seed)."""
    if not dropout_p:
        return 0, 0
    if seed is not None:
        return integer(seed, "dropout_seed", -_UINT64 // 2, _UINT64 - 1) % _UINT64, integer(
            offset or 0, "dropout_offset", -_UINT64 // 2, _UINT64 - 1) % _UINT64
    if _torch_module is not None and type(like) in _known_tensor_types:
        drawn = _torch_module.randint(0, 2**63 - 1, (2,), dtype=_torch_module.int64).tolist()
    else:
        import numpy

        drawn = numpy.random.randint(0, 2**63 - 1, size=2, dtype=numpy.int64).tolist()
    return drawn[0], drawn[1]


_torch_module = None


def attn_probs_shape(q, k, cu_seqlens_q=None, max_seqlen_q=0, max_seqlen_k=0, seqlens_k=None, block_table=None):
    """[B, Hq, max_seqlen_q, max_kv] of the debug probabilities (S_dmask): max_kv is kv_len (dense),
    max_seqlen_k (varlen) or the cache's capacity (KV cache)."""
    if cu_seqlens_q is not None:
        return (cu_seqlens_q.shape[0] - 1, q.shape[1], max_seqlen_q, max_seqlen_k)
    if block_table is not None:
        return (q.shape[0], q.shape[2], q.shape[1], block_table.shape[1] * k.shape[1])
    return (q.shape[0], q.shape[2], q.shape[1], k.shape[1])


def register_torch(module):
    global _torch_module
    _torch_module = module


def writable(x, name):
    """Refuses an array the call would write into when its framework marks it read-only
    (numpy's writeable flag: e.g. np.load(..., mmap_mode='r'), or writeable=False)."""
    flags = getattr(x, "flags", None)
    if flags is not None and getattr(flags, "writeable", True) is False:
        raise InvalidArgumentError(f"{name}: the call writes into it, and it is read-only (numpy writeable=False; "
                         "e.g. a memory map opened with mode 'r'): pass a writable array")
    return x


def _number(x, name):
    if isinstance(x, bool) or not isinstance(x, (int, float)) and not hasattr(x, "__float__"):
        raise InvalidArgumentError(f"{name}: expected a number, got {_describe(x)}")
    return float(x)


_options = {}
_values = {}
# Where check_index_contents sits in an options key (the arguments of options(), in order).
CHECK_INDEX_CONTENTS = 6


def option_values(softmax_scale, causal, window_left, window_right, softcap, deterministic, check_index_contents,
                  backend_name, dropout_p=0.0):
    """The options checked and normalized: (softmax_scale float or None, causal, window_left, window_right,
    softcap float, deterministic, check_index_contents, backend, dropout_p float), as the torch operators
    take them (dropout_p comes after sinks there). Plain Python on plain values, which torch.compile traces
    without a graph break."""
    if softmax_scale is not None and type(softmax_scale) is not float:
        softmax_scale = _number(softmax_scale, "softmax_scale")
    if type(window_left) is not int or not -_INT_MAX - 1 <= window_left <= _INT_MAX:
        window_left = integer(window_left, "window_size[0]", -_INT_MAX - 1)
    if type(window_right) is not int or not -_INT_MAX - 1 <= window_right <= _INT_MAX:
        window_right = integer(window_right, "window_size[1]", -_INT_MAX - 1)
    if type(softcap) is not float:
        softcap = _number(softcap, "softcap")
    if backend_name not in BACKENDS:
        backend(backend_name)
    if type(dropout_p) is not float:
        dropout_p = _number(dropout_p, "dropout_p")
    return (softmax_scale, bool(causal), window_left, window_right, softcap, bool(deterministic),
            bool(check_index_contents), backend_name, dropout_p)


def op_options(key):
    """option_values(*key), made once per distinct key and reused (the eager path's per-call cost)."""
    made = _values.get(key)
    if made is None:
        made = option_values(*key)
        if len(_values) > 4096:  # options that vary per call (a scale per step, say) must not grow without end
            _values.clear()
        _values[key] = made
    return made


def options(softmax_scale, causal, window_left, window_right, softcap, deterministic, check_index_contents,
            backend_name, dropout_p=0.0):
    """The compiled module's Options for these values, made once per distinct set and reused.
    (A call's dropout seed and offset are not in it: they change per call and cross beside it.)"""
    key = (softmax_scale, causal, window_left, window_right, softcap, deterministic, check_index_contents,
           backend_name, dropout_p)
    made = _options.get(key)
    if made is None:
        made = _ext.Options(*option_values(*key))
        if len(_options) > 4096:  # options that vary per call (a scale per step, say) must not grow without end
            _options.clear()
        _options[key] = made
    return made
