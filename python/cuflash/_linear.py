"""Linear attention (docs/linear.md), the Python side: :func:`linear_attention`,
:func:`linear_attention_backward` and :func:`linear_attention_step` on any DLPack
framework, with flash-linear-attention's conventions (``chunk_linear_attn``):
``scale`` multiplies the feature-mapped queries, ``initial_state`` and the final
state are a tensor, or a ``(state, key_sum)`` pair with ``normalize``.

torch tensors are differentiable through a ``torch.autograd.Function`` that calls
the compiled backward (the eager path: under torch.compile the call is a graph
break). Other frameworks get their outputs from ``_frameworks.Space``.
"""

from . import _args, _ext
from ._args import InvalidArgumentError
from ._frameworks import Space

try:
    import torch as _torch
except ImportError:  # pragma: no cover - depends on the environment
    _torch = None

if _torch is not None:
    from ._torch_call import _capsule, _stream

__all__ = ["linear_attention", "linear_attention_backward", "linear_attention_step"]

FEATURE_MAPS = ("identity", "elu+1", "elu", "relu")

_options = {}


def _linear_options(scale, causal, feature_map, normalize, backend):
    """The compiled module's LinearOptions, made once per distinct set and reused."""
    key = (scale, bool(causal), feature_map, bool(normalize), backend)
    made = _options.get(key)
    if made is None:
        if scale is not None:
            if isinstance(scale, bool) or not isinstance(scale, (int, float)) and not hasattr(scale, "__float__"):
                raise InvalidArgumentError(f"scale: expected a number or None, got {type(scale).__name__}")
            scale = float(scale)
        if feature_map not in FEATURE_MAPS:
            raise InvalidArgumentError(f"feature_map: expected one of {', '.join(map(repr, FEATURE_MAPS))} ('elu' is "
                                       f"flash-linear-attention's name for elu+1), got {feature_map!r}")
        _args.backend(backend)
        made = _ext.LinearOptions(scale, bool(causal), feature_map, bool(normalize), True, backend)
        if len(_options) > 4096:
            _options.clear()
        _options[key] = made
    return made


def _split_state(state, normalize, name):
    """(state, key_sum) from a tensor or, with normalize, a (state, key_sum) pair (key_sum may be None)."""
    if state is None:
        return None, None
    if isinstance(state, (tuple, list)):
        if len(state) != 2:
            raise InvalidArgumentError(f"{name}: expected a tensor or a (state, key_sum) pair, got {len(state)} items")
        if not normalize and state[1] is not None:
            raise InvalidArgumentError(f"{name}: a (state, key_sum) pair belongs to normalize=True (the key sum is "
                                       "the normalizer's state); without normalize pass the state alone")
        return _args.array(state[0], name), _args.optional_array(state[1], f"{name}[1] (the key sum)")
    return _args.array(state, name), None


def _joined(state, key_sum, normalize):
    """The state as the caller gave it: a tensor, or (state, key_sum) with normalize (fla's form)."""
    return (state, key_sum) if normalize else state


def _is_torch(x):
    return _torch is not None and isinstance(x, _torch.Tensor)


class _TorchSpace:
    """Space's interface for torch tensors: torch allocates, the current stream runs the call."""

    immutable = False

    def __init__(self, like):
        self.like = like

    def empty(self, shape, which="like"):
        dtype = self.like.dtype if which == "like" else getattr(_torch, which)
        return _torch.empty(tuple(shape), dtype=dtype, device=self.like.device)

    def zeros(self, shape, which="like"):
        dtype = self.like.dtype if which == "like" else getattr(_torch, which)
        return _torch.zeros(tuple(shape), dtype=dtype, device=self.like.device)

    @property
    def stream(self):
        return _stream(self.like)

    def before(self, *arrays):
        pass

    def after(self):
        pass

    def finish(self, array):
        return array


def _space(q):
    return _TorchSpace(q) if _is_torch(q) else Space(q)


def _arg(x):
    """What crosses into the compiled module: torch tensors as DLPack capsules (Tensor.__dlpack__
    refuses tensors that require grad), anything else as it is."""
    if x is None or not _is_torch(x):
        return x
    return _capsule(x)


def _finish(space, array):
    return None if array is None else space.finish(array)


def _geometry(q, k, v, cu_seqlens):
    """(varlen, out shape, state shape, key-sum shape); the library checks the rest."""
    varlen = cu_seqlens is not None
    if varlen:
        _args.ranked(q, "q", (3,), "varlen: [total, heads_q, key_dim]")
        _args.ranked(cu_seqlens, "cu_seqlens", (1,), "[batch + 1]")
        batch = max(cu_seqlens.shape[0] - 1, 0)
    else:
        _args.ranked(q, "q", (4,), "[batch, seqlen, heads_q, key_dim]")
        batch = q.shape[0]
    _args.ranked(k, "k", (q.ndim,), "like q")
    _args.ranked(v, "v", (q.ndim,), "like q")
    out_shape = tuple(q.shape[:-1]) + (v.shape[-1],)
    state_shape = (batch, k.shape[-2], k.shape[-1], v.shape[-1])
    return varlen, out_shape, state_shape, state_shape[:3]


def _forward(q, k, v, options, normalize, initial_state, initial_key_sum, cu_seqlens, want_final):
    """(out, final_state or None, final_key_sum or None) in q's framework."""
    varlen, out_shape, state_shape, key_sum_shape = _geometry(q, k, v, cu_seqlens)
    space = _space(q)
    # Packed rows after the last sequence belong to none and are not written: zeros, not garbage.
    out = (space.zeros if varlen else space.empty)(out_shape)
    final_state = space.empty(state_shape, "float32") if want_final else None
    final_key_sum = space.empty(key_sum_shape, "float32") if want_final and normalize else None
    space.before(q, k, v, cu_seqlens, initial_state, initial_key_sum)
    _ext.linear_forward(_arg(q), _arg(k), _arg(v), _arg(out), options, space.stream, _arg(cu_seqlens),
                        _arg(initial_state), _arg(initial_key_sum), _arg(final_state), _arg(final_key_sum))
    space.after()
    return space.finish(out), _finish(space, final_state), _finish(space, final_key_sum)


def _backward(dout, q, k, v, options, initial_state, initial_key_sum, dfinal_state, dfinal_key_sum, cu_seqlens,
              want_dinitial_state, want_dinitial_key_sum):
    """(dq, dk, dv, dinitial_state or None, dinitial_key_sum or None) in q's framework."""
    varlen, _, state_shape, key_sum_shape = _geometry(q, k, v, cu_seqlens)
    space = _space(q)
    dq, dk, dv = space.empty(q.shape), space.empty(k.shape), space.empty(v.shape)
    ds0 = space.empty(state_shape, "float32") if want_dinitial_state else None
    dz0 = space.empty(key_sum_shape, "float32") if want_dinitial_key_sum else None
    space.before(dout, q, k, v, cu_seqlens, initial_state, initial_key_sum, dfinal_state, dfinal_key_sum)
    _ext.linear_backward(_arg(dout), _arg(q), _arg(k), _arg(v), _arg(dq), _arg(dk), _arg(dv), options, space.stream,
                         _arg(cu_seqlens), _arg(initial_state), _arg(initial_key_sum), _arg(dfinal_state),
                         _arg(dfinal_key_sum), _arg(ds0), _arg(dz0))
    space.after()
    return (space.finish(dq), space.finish(dk), space.finish(dv), _finish(space, ds0), _finish(space, dz0))


def _last_dim_contiguous(t):
    return t if t is None or t.stride(-1) == 1 or t.numel() <= 1 else t.contiguous()


if _torch is not None:

    class _LinearAttention(_torch.autograd.Function):
        """Eager autograd in q, k, v and the initial state (and key sum); the final state's
        gradient flows back too."""

        @staticmethod
        def forward(ctx, q, k, v, initial_state, initial_key_sum, cu_seqlens, options_key, want_final):
            # The key (plain values), not the compiled options object: a graph kept alive until
            # interpreter exit must not hold the module's objects.
            options = _linear_options(*options_key)
            out, final_state, final_key_sum = _forward(q, k, v, options, options_key[3], initial_state,
                                                       initial_key_sum, cu_seqlens, want_final)
            ctx.save_for_backward(q, k, v, initial_state, initial_key_sum, cu_seqlens)
            ctx.options_key = options_key
            return out, final_state, final_key_sum

        @staticmethod
        def backward(ctx, dout, dfinal_state, dfinal_key_sum):
            q, k, v, initial_state, initial_key_sum, cu_seqlens = ctx.saved_tensors
            if dout is None:
                dout = _torch.zeros(tuple(q.shape[:-1]) + (v.shape[-1],), dtype=q.dtype, device=q.device)
            dq, dk, dv, ds0, dz0 = _backward(
                _last_dim_contiguous(dout), q, k, v, _linear_options(*ctx.options_key), initial_state, initial_key_sum,
                _last_dim_contiguous(dfinal_state), _last_dim_contiguous(dfinal_key_sum), cu_seqlens,
                initial_state is not None and ctx.needs_input_grad[3],
                initial_key_sum is not None and ctx.needs_input_grad[4])
            return dq, dk, dv, ds0, dz0, None, None, None


def _needs_grad(*tensors):
    return _torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def linear_attention(q, k, v, causal=True, feature_map="identity", normalize=False, scale=None, initial_state=None,
                     return_final_state=False, cu_seqlens=None, backend="auto"):
    """Linear attention, flash-linear-attention's ``chunk_linear_attn`` with a feature map:

        o_t = (scale·φ(q_t))ᵀ S_t,   S_t = S_0 + Σ_{s<=t} φ(k_s) v_sᵀ
        normalize: o_t / ((scale·φ(q_t))·z_t + 1e-10),   z_t = z_0 + Σ_{s<=t} φ(k_s)

    (non-causal: the sums run over the whole sequence). ``feature_map``: 'identity',
    'elu+1' (also 'elu', fla's name for it) or 'relu', applied to q and k in fp32;
    ``scale`` defaults to ``1/sqrt(Dk)``.

    Layouts: dense q ``[B, S, Hq, Dk]``, k ``[B, S, Hk, Dk]``, v ``[B, S, Hk, Dv]``
    (Hq a multiple of Hk); varlen ``[T, H, D]`` with ``cu_seqlens`` int32 ``[B+1]``.
    f32, f16 or bf16; the state is float32 ``[B, Hk, Dk, Dv]``, the key sum z
    float32 ``[B, Hk, Dk]``. ``initial_state``: a state tensor, or with normalize a
    ``(state, key_sum)`` pair (either may be None).

    Returns ``out`` ``[..., Hq, Dv]`` like q, or ``(out, final_state)`` with
    ``return_final_state``, where final_state is a tensor, or ``(state, key_sum)``
    with normalize. With torch tensors the call is differentiable (q, k, v and the
    initial state; gradients arriving at the final state flow back). Backends cpu
    and cuda; cudnn raises NotImplementedError.
    """
    options = _linear_options(scale, causal, feature_map, normalize, backend)
    s0, z0 = _split_state(initial_state, normalize, "initial_state")
    _args.array(q, "q")
    _args.array(k, "k")
    _args.array(v, "v")
    _args.optional_array(cu_seqlens, "cu_seqlens")
    if _is_torch(q) and _needs_grad(q, k, v, s0, z0):
        key = (scale, bool(causal), feature_map, bool(normalize), backend)
        out, final_state, final_key_sum = _LinearAttention.apply(q, k, v, s0, z0, cu_seqlens, key,
                                                                 bool(return_final_state))
    else:
        out, final_state, final_key_sum = _forward(q, k, v, options, normalize, s0, z0, cu_seqlens,
                                                   bool(return_final_state))
    if not return_final_state:
        return out
    return out, _joined(final_state, final_key_sum, normalize)


def linear_attention_backward(dout, q, k, v, causal=True, feature_map="identity", normalize=False, scale=None,
                              initial_state=None, dfinal_state=None, cu_seqlens=None, backend="auto"):
    """The backward of :func:`linear_attention`: ``(dq, dk, dv)``, or ``(dq, dk, dv, dinitial_state)``
    when ``initial_state`` is given (a tensor, or ``(dstate, dkey_sum)`` with normalize).

    Everything is recomputed from q, k, v and the initial state. ``dfinal_state``: the
    gradient arriving at the forward's final state (a tensor, or a pair with normalize).
    """
    options = _linear_options(scale, causal, feature_map, normalize, backend)
    s0, z0 = _split_state(initial_state, normalize, "initial_state")
    ds, dz = _split_state(dfinal_state, normalize, "dfinal_state")
    for name, x in (("dout", dout), ("q", q), ("k", k), ("v", v)):
        _args.array(x, name)
    _args.optional_array(cu_seqlens, "cu_seqlens")
    dq, dk, dv, ds0, dz0 = _backward(dout, q, k, v, options, s0, z0, ds, dz, cu_seqlens, s0 is not None,
                                     z0 is not None)
    if s0 is None and z0 is None:
        return dq, dk, dv
    return dq, dk, dv, _joined(ds0, dz0, normalize)


def linear_attention_step(q, k, v, state, feature_map="identity", normalize=False, scale=None, in_place=True,
                          backend="auto"):
    """One decode step of causal linear attention: ``(out, new_state)``.

    q ``[B, 1, Hq, Dk]``, k ``[B, 1, Hk, Dk]``, v ``[B, 1, Hk, Dv]``; ``state`` float32
    ``[B, Hk, Dk, Dv]``, with normalize a ``(state, key_sum)`` pair (key_sum
    ``[B, Hk, Dk]``), as :func:`linear_attention` returns it. S' = S + φ(k) vᵀ,
    z' = z + φ(k), out = (scale·φ(q))ᵀ S' (÷ ((scale·φ(q))·z' + 1e-10) with normalize):
    the next row of the chunked forward. ``in_place`` (default) updates ``state`` and
    returns it; otherwise the new state is a new tensor (JAX arrays, being immutable,
    need ``in_place=False``). Not differentiable.
    """
    options = _linear_options(scale, True, feature_map, normalize, backend)
    s, z = _split_state(state, normalize, "state")
    _args.ranked(q, "q", (4,), "[batch, 1, heads_q, key_dim]")
    _args.array(k, "k")
    _args.array(v, "v")
    space = _space(q)
    if in_place:
        if space.immutable:
            raise NotImplementedError("linear_attention_step(in_place=True) writes into the state, and JAX arrays "
                                      "are immutable: pass in_place=False")
        _args.writable(s, "state")
        if z is not None:
            _args.writable(z, "state[1] (the key sum)")
        s_out = z_out = None
    else:
        s_out = space.empty(s.shape, "float32")
        z_out = space.empty(z.shape, "float32") if z is not None else None
    out = space.empty(tuple(q.shape[:-1]) + (v.shape[-1],))
    space.before(q, k, v, s, z)
    _ext.linear_step(_arg(q), _arg(k), _arg(v), _arg(out), _arg(s), options, space.stream, _arg(z), _arg(s_out),
                     _arg(z_out))
    space.after()
    if in_place:
        bump = getattr(_torch.autograd.graph, "increment_version", None) if _is_torch(s) else None
        if bump is not None:
            for t in (s, z):
                if t is not None and not t.is_inference():
                    bump(t)  # autograd must see that the state changed, as after any in-place op
        return space.finish(out), _joined(s, z, normalize)
    return space.finish(out), _joined(space.finish(s_out), _finish(space, z_out), normalize)
