#!/usr/bin/env python3
"""Ring-attention benchmark: cuflash's ring (cuflash.distributed.ring_flash_attn_func)
against PyTorch's context parallel (SDPA with the cuDNN and with the flash
backend), on W GPUs of one host, one process per GPU:

    torchrun --nproc_per_node W bench/ring.py --out-dir DIR [--commit SHA] [--quick]
    python3 bench/ring.py --merge w1/ring.json w2/ring.json --out-dir DIR   # no GPU, no torch

bf16, B=1, H=16, D=128, causal (zigzag layout) and non-causal, forward and
forward+backward; weak scaling (tokens per GPU 8k, 16k, 32k, 64k; --quick: 8k,
32k; global sequence W × tokens per GPU) and strong scaling (one 128k-token
sequence over W GPUs). Per point and backend: a checked first call (outputs
finite), a warm-up, then calls timed one by one between CUDA events, each
after a barrier (and the L2 overwritten); each rank's median, the maximum over
ranks reported. Beside them the baseline (this rank's local attention calls of
the ring, K/V already local, no communication; max over ranks) and the ring's
communication alone (its K/V send/recv rounds without compute), from which
the efficiency (baseline / ring) and the share of communication hidden come.
A correctness spot check at the smallest size compares each backend's output
(and cuflash's gradients) with single-GPU cuflash.attention. Rank 0 writes
DIR/ring.json, ring.md and ring.png (bench/ring_report.py), after every point.

NCCL's NVLink multicast stays as the environment sets it (never turned on here).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import math
import os
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_common import git_commit, int_list, median, name_list  # noqa: E402
import ring_report  # noqa: E402

BACKENDS = ["cuflash_ring", "torch_cp_cudnn", "torch_cp_flash"]
TORCH_CP_BACKENDS = {"torch_cp_cudnn": "CUDNN_ATTENTION", "torch_cp_flash": "FLASH_ATTENTION"}
PASSES = ["fwd", "fwd_bwd"]
MASKS = ["causal", "none"]
LAYOUTS = ["zigzag", "contiguous"]
WEAK_TOKENS = [8192, 16384, 32768, 65536]
QUICK_WEAK_TOKENS = [8192, 32768]
STRONG_SEQ_LENS = [131072]
# What the comm-only measurement sends: the ring's traffic as docs/ring.md describes it.
COMM_MODEL = ("forward: W-1 rounds of (K, V) to the next rank; forward+backward adds W-1 rounds of "
              "(K, V, dK fp32, dV fp32) and one round of (dK fp32, dV fp32) home; batch_isend_irecv, no compute")
# Environment variables worth recording (NVLink multicast stays as the machine sets it).
ENV_RECORDED = ["NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS", "NCCL_P2P_DISABLE",
                "NCCL_SHM_DISABLE", "NCCL_IB_DISABLE", "NCCL_ALGO", "NCCL_PROTO", "CUDA_DEVICE_MAX_CONNECTIONS"]
# Rough rate used only to decide whether a point still fits in --budget-s.
BUDGET_TFLOPS = 250.0


def log(message: str, rank: int | None = None) -> None:
    prefix = "ring" if rank is None else f"ring[{rank}]"
    print(f"{prefix}: {message}", file=sys.stderr, flush=True)


def points(world_size: int, weak_tokens, strong_seq_lens, passes, masks, heads: int, head_dim: int,
           layout: str = "zigzag", batch: int = 1) -> list[dict]:
    """The benchmark's points in the order they run: weak scaling from the
    smallest tokens per GPU up, then strong scaling. A point whose sequence
    the layout cannot split evenly carries `invalid` (the reason)."""
    chunks = (2 if layout == "zigzag" else 1) * world_size
    result = []
    for scaling, sizes in (("weak", weak_tokens), ("strong", strong_seq_lens)):
        for size in sizes:
            seq_len = size * world_size if scaling == "weak" else size
            for pass_name in passes:
                for mask in masks:
                    point = dict(scaling=scaling, tokens_per_gpu=seq_len // world_size, seq_len=seq_len,
                                 world_size=world_size, causal=mask == "causal", batch=batch, heads=heads,
                                 head_dim=head_dim, dtype="bf16", layout=layout, **{"pass": pass_name})
                    if seq_len % chunks:
                        point["invalid"] = f"{seq_len} tokens do not split into {chunks} equal chunks ({layout})"
                    result.append(point)
    return result


def layout_chunks(layout: str, world_size: int, rank: int) -> list[int]:
    """The global chunk indices a rank holds, in local order: zigzag, chunks
    r and 2W-1-r of 2W; contiguous, chunk r of W."""
    return [rank, 2 * world_size - 1 - rank] if layout == "zigzag" else [rank]


def local_call_options(causal: bool, window_left: int, window_right: int, diagonal_offset) -> dict:
    """cuflash.attention's mask arguments for one local call of the ring's
    schedule. The benchmark's masks (causal or none, no window, no ALiBi)
    never need a diagonal offset (ring_schedule.hpp: such blocks are the
    default alignment), which cuflash.attention does not take."""
    if diagonal_offset is not None:
        raise ValueError(f"a local call with diagonal_offset {diagonal_offset}: not one of the benchmark's masks")
    return dict(causal=causal, window_size=(window_left, window_right))


def estimate_seconds(point: dict, args, measurements: int) -> float:
    """A generous guess of a point's time, for --budget-s only."""
    per_call = (ring_report.flops(point["pass"], point["seq_len"], point["heads"], point["head_dim"], point["causal"],
                                  point["batch"]) / point["world_size"] / (BUDGET_TFLOPS * 1e12))
    calls = args.warmup + 1 + max(args.min_reps, math.ceil(args.rep_ms * 1e-3 / max(per_call, 1e-6)))
    return 2.0 + measurements * (calls * per_call + 0.5)


def describe_error(error: BaseException, caught=()) -> str:
    message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    reasons = list(dict.fromkeys(str(w.message).strip() for w in caught))
    return " | ".join([f"{type(error).__name__}: {message}"] + reasons)[:600]


class Bench:
    """One rank's side of the benchmark: the process group, the timers and the backends."""

    def __init__(self, args):
        import torch
        import torch.distributed as dist
        import torch.nn.functional as F

        self.torch, self.dist, self.F, self.args = torch, dist, F, args
        self.rank = int(os.environ.get("RANK", "0"))
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(self.local_rank)
        self.device = torch.device("cuda", self.local_rank)
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")  # a plain `python3 bench/ring.py`: one rank
        os.environ.setdefault("MASTER_PORT", "29531")
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
        dist.init_process_group("nccl", device_id=self.device,
                                timeout=datetime.timedelta(seconds=args.timeout_s))
        self.group = dist.group.WORLD
        self.dtype = torch.bfloat16
        properties = torch.cuda.get_device_properties(self.device)
        l2_bytes = getattr(properties, "L2_cache_size", 50 << 20) or (50 << 20)
        self.flush_buffer = torch.empty(max(2 * l2_bytes, 32 << 20), dtype=torch.int8, device=self.device)
        self.generator = torch.Generator(device=self.device)
        self._mesh = None

    # ---- agreement between ranks ----

    def all_max(self, value: float) -> float:
        tensor = self.torch.tensor([float(value)], dtype=self.torch.float64, device=self.device)
        self.dist.all_reduce(tensor, op=self.dist.ReduceOp.MAX)
        return float(tensor.item())

    def gather(self, value: float) -> list[float]:
        tensor = self.torch.tensor([float(value)], dtype=self.torch.float64, device=self.device)
        out = self.torch.empty(self.world, dtype=self.torch.float64, device=self.device)
        self.dist.all_gather_into_tensor(out, tensor)
        return [float(x) for x in out.tolist()]

    def guarded(self, fn):
        """(fn(), None) when fn succeeded on every rank, else (None, the first
        failing rank's message). A failure must happen on every rank at the
        same collective, or before any: one rank failing inside a ring call
        leaves the others waiting (the process group's timeout ends that)."""
        torch = self.torch
        error, result = None, None
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                result = fn()
            except (RuntimeError, NotImplementedError, ValueError, TypeError, AttributeError, ImportError,
                    AssertionError, IndexError, KeyError) as exception:  # OutOfMemoryError is a RuntimeError
                error = describe_error(exception, caught)
        try:
            torch.cuda.synchronize()
        except RuntimeError as exception:  # an asynchronous CUDA error surfaces here
            error = error or describe_error(exception)
        if self.all_max(1.0 if error else 0.0) == 0.0:
            return result, None
        messages = [None] * self.world
        self.dist.all_gather_object(messages, error)
        first = next((r, m) for r, m in enumerate(messages) if m)
        return None, (first[1] if self.world == 1 else f"rank {first[0]}: {first[1]}")

    # ---- timing ----

    def time_calls(self, call, before) -> dict:
        """Warm-up, then calls one by one between CUDA events, each after a
        barrier; the same number of calls on every rank (the calls hold
        collectives). Returns the max over ranks of the per-rank medians, the
        medians and the number of timed calls."""
        torch, dist, args = self.torch, self.dist, self.args
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        warm = []
        for _ in range(args.warmup):
            before()
            self.flush_buffer.zero_()
            start.record()
            call()
            stop.record()
            stop.synchronize()
            warm.append(start.elapsed_time(stop))
        estimate_ms = self.all_max(min(warm) if warm else 1.0)
        reps = min(max(math.ceil(args.rep_ms / max(estimate_ms, 1e-3)), args.min_reps), args.max_reps)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        stops = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for i in range(reps):
            before()
            self.flush_buffer.zero_()
            torch.cuda.synchronize()
            dist.barrier(device_ids=[self.local_rank])
            torch.cuda.synchronize()  # every rank past the barrier: the calls start together
            starts[i].record()
            call()
            stops[i].record()
        torch.cuda.synchronize()
        local = median(a.elapsed_time(b) for a, b in zip(starts, stops))
        ranks = self.gather(local)
        return dict(ms=max(ranks), ms_ranks=[round(x, 5) for x in ranks], reps=reps)

    def measure(self, setup) -> dict:
        """setup(stack) -> (call, before, outputs) with its contexts entered
        into stack; one checked call (outputs finite), then time_calls."""
        torch = self.torch
        with contextlib.ExitStack() as stack:
            def first():
                call, before, outputs = setup(stack)
                before()
                call()
                torch.cuda.synchronize()
                if not all(bool(torch.isfinite(x).all()) for x in outputs()):
                    raise RuntimeError("outputs not finite after the first call")
                return call, before
            state, error = self.guarded(first)
            if error is None:
                timing, error = self.guarded(lambda: self.time_calls(*state))
            state = None
        torch.cuda.empty_cache()
        return dict(error=error) if error else timing

    # ---- inputs ----

    def randn(self, *shape, dtype=None, requires_grad=False, seed_offset=0):
        self.generator.manual_seed(self.args.seed + 1000 * self.rank + seed_offset)
        x = self.torch.randn(*shape, device=self.device, dtype=dtype or self.dtype, generator=self.generator)
        return x.requires_grad_(requires_grad)

    def local_shape(self, point: dict) -> tuple:
        return (point["batch"], point["seq_len"] // self.world, point["heads"], point["head_dim"])

    def mesh(self):
        if self._mesh is None:
            from torch.distributed.device_mesh import init_device_mesh
            self._mesh = init_device_mesh("cuda", (self.world,))
        return self._mesh

    # ---- backends ----

    def attention_calls(self, attend, shape: tuple, fwd_bwd: bool):
        """(call, before, outputs) timing attend(q, k, v) on random inputs of `shape`:
        the forward under no_grad, or forward and .backward(dout) on fresh leaves' gradients."""
        torch = self.torch
        q, k, v = (self.randn(*shape, requires_grad=fwd_bwd, seed_offset=i) for i in range(3))
        if fwd_bwd:
            dout = self.randn(*shape, seed_offset=3)

            def call():
                attend(q, k, v).backward(dout)

            def before():
                q.grad = k.grad = v.grad = None  # so that backward writes, not accumulates
            return call, before, lambda: [q.grad, k.grad, v.grad]
        result = {}

        def call():
            with torch.no_grad():
                result["out"] = attend(q, k, v)
        return call, lambda: result.pop("out", None), lambda: [result["out"]]

    def setup_ring(self, point: dict):
        def setup(stack):
            from cuflash.distributed import ring_flash_attn_func
            kwargs = dict(causal=point["causal"], group=self.group, layout=point["layout"])
            if self.args.cuflash_backend:
                kwargs["backend"] = self.args.cuflash_backend
            return self.attention_calls(lambda q, k, v: ring_flash_attn_func(q, k, v, **kwargs),
                                        self.local_shape(point), point["pass"] == "fwd_bwd")
        return setup

    def cp_options(self):
        """torch's context-parallel option object and set_rotate_method (2.11: _context_parallel._attention;
        older releases: _attention)."""
        try:
            from torch.distributed.tensor.experimental._context_parallel import _attention as module
        except ImportError:
            from torch.distributed.tensor.experimental import _attention as module
        return module._cp_options, module.set_rotate_method, getattr(module, "context_parallel_unshard", None)

    def enter_torch_cp(self, stack, point: dict, backend: str, buffers: list):
        """Enters torch's context parallel with `buffers` (global [B, H, S, D] tensors it shards in place along
        dim 2) and SDPA restricted to the backend; the options come back on exit."""
        from torch.distributed.tensor.experimental import context_parallel
        from torch.nn.attention import SDPBackend, sdpa_kernel
        options, set_rotate_method, _ = self.cp_options()
        saved = (options.enable_load_balance, options.rotate_method, self.F.scaled_dot_product_attention)

        def restore():
            # context_parallel's generator skips its own restore when the body raises: put SDPA back here too.
            options.enable_load_balance, options.rotate_method, self.F.scaled_dot_product_attention = saved
        stack.callback(restore)
        # Head-tail load balancing (rank r: chunks r and 2W-1-r of 2W) is torch's default and what it wants
        # for causal; with it on, a non-causal call raises "Load balancing requires `is_causal=True`".
        options.enable_load_balance = bool(point["causal"])
        set_rotate_method(self.args.cp_rotate)
        stack.enter_context(context_parallel(self.mesh(), buffers=buffers, buffer_seq_dims=[2] * len(buffers),
                                             no_restore_buffers=set(buffers)))
        stack.enter_context(sdpa_kernel(getattr(SDPBackend, TORCH_CP_BACKENDS[backend])))

    def setup_torch_cp(self, point: dict, backend: str):
        def setup(stack):
            # context_parallel shards its buffers: one of the global length marks the sequence; the timed
            # inputs are made directly as this rank's [B, H, S_local, D] shards (their values do not matter).
            marker = self.torch.zeros(1, 1, point["seq_len"], 1, device=self.device)
            self.enter_torch_cp(stack, point, backend, [marker])
            b, s, h, d = self.local_shape(point)

            def attend(q, k, v):  # context_parallel patched F.scaled_dot_product_attention: look it up per call
                return self.F.scaled_dot_product_attention(q, k, v, is_causal=point["causal"])
            return self.attention_calls(attend, (b, h, s, d), point["pass"] == "fwd_bwd")
        return setup

    def step_calls(self, point: dict, kv_rank: int) -> list[tuple]:
        """This rank's local calls on kv_rank's block, from the ring's one schedule
        (cuflash._ext.ring_step_calls), in rows: (q_first, q_count, k_first, k_count,
        causal, window_left, window_right, diagonal_offset)."""
        from cuflash import _ext
        layout, causal = point["layout"], point["causal"]
        chunk_len = point["seq_len"] // (len(layout_chunks(layout, self.world, 0)) * self.world)
        calls = _ext.ring_step_calls(layout, self.world, self.rank, kv_rank, causal, -1, -1, False, False, chunk_len)
        return [(qf * chunk_len, qc * chunk_len, kf * chunk_len, kc * chunk_len, c, left, right, offset)
                for qf, qc, kf, kc, c, left, right, offset in calls]

    def setup_baseline(self, point: dict):
        """The ring's local attention calls of this rank, K/V already local:
        for each ring step (the block of rank - step), each call of
        step_calls on slices of q and of a random K/V block of that step;
        forward+backward adds each call's attention_backward."""
        torch = self.torch
        fwd_bwd = point["pass"] == "fwd_bwd"
        backend = self.args.cuflash_backend or "auto"

        def setup(stack):
            import cuflash
            shape = self.local_shape(point)
            local = shape[1]
            q = self.randn(*shape, seed_offset=0)
            prepared = []
            for step in range(self.world):
                kv_rank = (self.rank - step) % self.world
                k, v = self.randn(*shape, seed_offset=10 + 2 * step), self.randn(*shape, seed_offset=11 + 2 * step)
                for q_first, q_count, k_first, k_count, causal, left, right, offset in self.step_calls(point, kv_rank):
                    if not (0 <= q_first and q_first + q_count <= local
                            and 0 <= k_first and k_first + k_count <= local):
                        raise ValueError(f"local call ({q_first}, {q_count}, {k_first}, {k_count}) outside the "
                                         f"{local}-token shards")
                    options = local_call_options(causal, left, right, offset)
                    prepared.append(dict(q=q[:, q_first:q_first + q_count], k=k[:, k_first:k_first + k_count],
                                         v=v[:, k_first:k_first + k_count], options=options))
            if fwd_bwd:
                with torch.no_grad():
                    for call in prepared:
                        call["out"], call["lse"] = cuflash.attention(call["q"], call["k"], call["v"], backend=backend,
                                                                     return_lse=True, **call["options"])
                        call["dout"] = self.randn(*call["out"].shape, seed_offset=99)
            result = {}

            def run():
                with torch.no_grad():
                    for call in prepared:
                        result["out"] = cuflash.attention(call["q"], call["k"], call["v"], backend=backend,
                                                          return_lse=True, **call["options"])[0]
                    if fwd_bwd:
                        for call in prepared:
                            result["grads"] = cuflash.attention_backward(
                                call["dout"], call["q"], call["k"], call["v"], call["out"], call["lse"],
                                backend=backend, **call["options"])
            return run, result.clear, lambda: [result["out"], *result.get("grads", ())]
        return setup

    def setup_comm(self, point: dict):
        """The ring's send/recv rounds alone (COMM_MODEL), on buffers of the ring's sizes."""
        torch, dist = self.torch, self.dist
        fwd_bwd = point["pass"] == "fwd_bwd"
        following, preceding = (self.rank + 1) % self.world, (self.rank - 1) % self.world

        def rounds(send, receive, count):
            for _ in range(count):
                ops = [dist.P2POp(dist.isend, t, following) for t in send]
                ops += [dist.P2POp(dist.irecv, t, preceding) for t in receive]
                for work in dist.batch_isend_irecv(ops):
                    work.wait()
                send, receive = receive, send

        def setup(stack):
            shape = self.local_shape(point)
            kv = [self.randn(*shape, seed_offset=i) for i in range(4)]
            grads = [self.randn(*shape, dtype=torch.float32, seed_offset=4 + i) for i in range(4)] if fwd_bwd else []

            def call():
                rounds(kv[:2], kv[2:], self.world - 1)
                if fwd_bwd:
                    rounds(kv[:2] + grads[:2], kv[2:] + grads[2:], self.world - 1)
                    rounds(grads[:2], grads[2:], 1)
            return call, lambda: None, lambda: kv + grads
        return setup

    # ---- the correctness spot check ----

    def check(self, point: dict) -> list[dict]:
        """At `point`'s size (forward+backward): each backend against single-GPU
        cuflash.attention on the whole sequence, on the same inputs."""
        torch, dist = self.torch, self.dist
        causal, layout = point["causal"], point["layout"]
        b, s, h, d = point["batch"], point["seq_len"], point["heads"], point["head_dim"]
        base = dict(world_size=self.world, seq_len=s, causal=causal, layout=layout, heads=h, head_dim=d)
        inputs = {}

        def make_inputs():
            tensors = [torch.empty(b, s, h, d, device=self.device, dtype=self.dtype) for _ in range(4)]
            if self.rank == 0:
                self.generator.manual_seed(self.args.seed + 7)
                for t in tensors:
                    t.normal_(generator=self.generator)
            for t in tensors:
                dist.broadcast(t, 0)
            inputs.update(zip(("q", "k", "v", "dout"), tensors))
        _, error = self.guarded(make_inputs)
        if error:
            return [dict(base, backend="all", error=error)]

        reference = {}

        def run_reference():
            if self.rank != 0:
                return
            import cuflash
            q, k, v = (inputs[n].detach().clone().requires_grad_() for n in ("q", "k", "v"))
            out = cuflash.attention(q, k, v, causal=causal, backend=self.args.cuflash_backend or "auto")
            out.backward(inputs["dout"])
            reference.update(out=out.detach(), dq=q.grad, dk=k.grad, dv=v.grad)
        _, error = self.guarded(run_reference)
        if error:
            return [dict(base, backend="reference", error=error)]

        def max_errors(got: dict) -> dict:
            return {name: float((got[name].float() - reference[name].float()).abs().max().item())
                    for name in got}

        def gather(local, unshard):
            parts = [torch.empty_like(local) for _ in range(self.world)]
            dist.all_gather(parts, local.contiguous())
            return unshard(parts)

        checks = []

        def check_ring():
            from cuflash.distributed import ring_flash_attn_func, shard_sequence, unshard_sequence
            shards = {n: shard_sequence(inputs[n], self.world, self.rank, layout=layout, dim=1).contiguous()
                      for n in ("q", "k", "v", "dout")}
            q, k, v = (shards[n].detach().clone().requires_grad_() for n in ("q", "k", "v"))
            kwargs = dict(backend=self.args.cuflash_backend) if self.args.cuflash_backend else {}
            out = ring_flash_attn_func(q, k, v, causal=causal, group=self.group, layout=layout, **kwargs)
            out.backward(shards["dout"])
            unshard = lambda parts: unshard_sequence(parts, layout=layout, dim=1)  # noqa: E731
            got = {n: gather(t, unshard) for n, t in (("out", out.detach()), ("dq", q.grad), ("dk", k.grad),
                                                       ("dv", v.grad))}
            return max_errors(got) if self.rank == 0 else None
        errors, error = self.guarded(check_ring)
        checks.append(dict(base, backend="cuflash_ring", max_abs_error=errors, error=error))

        for backend in [b for b in self.args.backends if b in TORCH_CP_BACKENDS]:
            def check_torch(backend=backend):
                with contextlib.ExitStack() as stack:
                    buffers = [inputs[n].transpose(1, 2).contiguous() for n in ("q", "k", "v")]
                    self.enter_torch_cp(stack, dict(point, causal=causal), backend, buffers)
                    with torch.no_grad():
                        out = self.F.scaled_dot_product_attention(*buffers, is_causal=causal)
                    _, _, unshard = self.cp_options()
                    whole = unshard(self.mesh(), [out], [2])[0].transpose(1, 2)
                return max_errors({"out": whole}) if self.rank == 0 else None
            errors, error = self.guarded(check_torch)
            checks.append(dict(base, backend=backend, max_abs_error=errors, error=error))
        if self.rank == 0:
            for check in checks:
                check["max_abs_ref"] = float(reference["out"].float().abs().max().item()) if reference else None
        inputs.clear()
        reference.clear()
        torch.cuda.empty_cache()
        return checks


def torch_cp_note(args) -> str:
    return (f"torch's own ring (`_templated_ring_attention`): its K/V rotate method `{args.cp_rotate}` "
            "(torch's default `allgather` gathers every rank's K/V once, asynchronously, and slices a block per "
            "step; `alltoall` passes blocks round a ring), partial outputs merged in fp32 (sigmoid form of the "
            "LSE merge), dK/dV passed back round the ring in fp32 (all-to-all). For causal it shards with its "
            "head-tail load balancer (`_HeadTailLoadBalancer`: rank r holds chunks r and 2W−1−r of 2W, cuflash's "
            "zigzag) and computes per step: both local chunks with `is_causal` on its own block, all queries "
            "against the first K/V chunk of an earlier rank's block, the second query chunk against all of a "
            "later rank's block; it needs load balancing off for non-causal calls (else \"Load balancing "
            "requires `is_causal=True`\"), so non-causal runs shard contiguously. Inputs are [B, H, S, D] "
            "shards (torch's sequence dimension is 2)")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--out-dir", default="docs/perf", help="where ring.json/md/png go (rank 0 writes)")
    parser.add_argument("--commit", default=os.environ.get("CUFLASH_COMMIT") or None,
                        help="commit named in the report (default: $CUFLASH_COMMIT, else git rev-parse)")
    parser.add_argument("--merge", nargs="+", metavar="JSON",
                        help="no measuring: merge these ring.json files (e.g. a W=1 and a W=2 run) into --out-dir")
    parser.add_argument("--quick", action="store_true",
                        help=f"weak scaling at {','.join(map(str, QUICK_WEAK_TOKENS))} tokens per GPU only, "
                             "exactly --min-reps timed calls, one warm-up call after the checked first call")
    parser.add_argument("--backends", type=name_list(BACKENDS), default=BACKENDS)
    parser.add_argument("--passes", type=name_list(PASSES), default=PASSES)
    parser.add_argument("--masks", type=name_list(MASKS), default=MASKS)
    parser.add_argument("--tokens-per-gpu", type=int_list, default=None,
                        help=f"weak scaling (default {','.join(map(str, WEAK_TOKENS))}; --quick: "
                             f"{','.join(map(str, QUICK_WEAK_TOKENS))}); '' for none")
    parser.add_argument("--strong-seq-lens", type=int_list, default=STRONG_SEQ_LENS,
                        help="strong scaling: global sequence lengths; '' for none")
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--layout", choices=LAYOUTS, default="zigzag", help="cuflash's sharding")
    parser.add_argument("--cuflash-backend", default=None,
                        help="backend= for the ring's local calls and the baseline (default: the ring's own; "
                             "the baseline then uses 'auto')")
    parser.add_argument("--cp-rotate", choices=["allgather", "alltoall"], default="allgather",
                        help="torch context parallel's K/V rotate method (torch's default: allgather)")
    parser.add_argument("--no-check", action="store_true", help="skip the correctness spot check")
    parser.add_argument("--warmup", type=int, default=3, help="warm-up calls per measurement")
    parser.add_argument("--rep-ms", type=float, default=200.0, help="timed GPU time per measurement")
    parser.add_argument("--min-reps", type=int, default=10)
    parser.add_argument("--max-reps", type=int, default=50)
    parser.add_argument("--budget-s", type=float, default=0.0,
                        help="wall-time budget: points that would not fit are recorded as skipped (0: none)")
    parser.add_argument("--timeout-s", type=float, default=300.0, help="process group timeout (a hung collective)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.quick:
        args.warmup = min(args.warmup, 1)  # after the checked first call
        args.rep_ms = 0.0
    if args.tokens_per_gpu is None:
        args.tokens_per_gpu = QUICK_WEAK_TOKENS if args.quick else WEAK_TOKENS
    if args.min_reps < 10:
        parser.error("--min-reps: at least 10 (medians of fewer calls are noise)")
    args.max_reps = max(args.max_reps, args.min_reps)
    return args


def run(args) -> int:
    started = time.monotonic()
    bench = Bench(args)
    torch, rank, world = bench.torch, bench.rank, bench.world
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ")
    device = torch.cuda.get_device_name(bench.device)
    names = [None] * world
    bench.dist.all_gather_object(names, device)
    gpus = ", ".join(f"{names.count(n)} × {n}" for n in dict.fromkeys(names))
    try:
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
    except (AttributeError, RuntimeError):
        nccl = "unknown"
    try:
        import cuflash
        cuflash_version = cuflash.__version__
    except ImportError as error:
        cuflash_version = f"not importable: {error}"
    meta = dict(device=device, gpus=gpus, world_size=world, date=date, commit=args.commit or git_commit(),
                torch=torch.__version__, nccl=nccl, cuflash=cuflash_version, dtype="bf16", batch=1, heads=args.heads,
                head_dim=args.head_dim, layout=args.layout, quick=args.quick, cp_rotate=args.cp_rotate,
                torch_cp_note=torch_cp_note(args), comm_model=COMM_MODEL,
                env={name: os.environ[name] for name in ENV_RECORDED if name in os.environ},
                timing=dict(warmup=args.warmup, rep_ms=args.rep_ms, min_reps=args.min_reps, max_reps=args.max_reps,
                            barrier_before_each_call=True, l2_flushed=True, statistic="max over ranks of the median"))
    if rank == 0:
        log(f"W={world} on {gpus}; torch {torch.__version__}, NCCL {nccl}, cuflash {cuflash_version}; "
            f"NCCL_NVLS_ENABLE={os.environ.get('NCCL_NVLS_ENABLE', 'unset')}")
    report = dict(meta=meta, rows=[], checks=[])

    def write(plot: bool) -> None:
        if rank == 0:
            meta["elapsed_s"] = round(time.monotonic() - started, 1)
            ring_report.write_report(report, args.out_dir, plot=plot)

    all_points = points(world, args.tokens_per_gpu, args.strong_seq_lens, args.passes, args.masks, args.heads,
                        args.head_dim, args.layout)
    valid = [p for p in all_points if "invalid" not in p]
    if not args.no_check and valid:
        smallest = min(valid, key=lambda p: p["seq_len"])
        for causal in dict.fromkeys(p["causal"] for p in valid):
            checks = bench.check(dict(smallest, causal=causal))
            report["checks"] += checks
            if rank == 0:
                for check in checks:
                    log(f"check W={world} S={check['seq_len']} {'causal' if causal else 'none'} {check['backend']}: "
                        + (f"failed: {check['error']}" if check.get("error") else
                           f"max abs error {check['max_abs_error']} (max |ref| {check.get('max_abs_ref')})"))
        write(plot=False)

    measurements = len(args.backends) + 1 + (1 if world > 1 else 0)
    for point in all_points:
        row = {k: v for k, v in point.items() if k != "invalid"}
        row.update(ms={}, ms_ranks={}, reps={}, baseline_ms=None, comm_only_ms=None, device=device, date=date,
                   commit=meta["commit"], torch=meta["torch"])
        errors = {}
        needed = estimate_seconds(point, args, measurements)
        over = args.budget_s and time.monotonic() - started + needed > args.budget_s
        if point.get("invalid") or bench.all_max(1.0 if over else 0.0):
            reason = point.get("invalid") or f"skipped: over the time budget (--budget-s {args.budget_s:g})"
            row["ms"] = {b: None for b in args.backends}
            errors["all"] = reason
        else:
            for backend in args.backends:
                setup = bench.setup_ring(point) if backend == "cuflash_ring" else bench.setup_torch_cp(point, backend)
                result = bench.measure(setup)
                row["ms"][backend] = None if result.get("error") else round(result["ms"], 5)
                if result.get("error"):
                    errors[backend] = result["error"]
                else:
                    row["ms_ranks"][backend], row["reps"][backend] = result["ms_ranks"], result["reps"]
            result = bench.measure(bench.setup_baseline(point))
            if result.get("error"):
                errors["baseline"] = result["error"]
            else:
                row["baseline_ms"], row["baseline_ms_ranks"] = round(result["ms"], 5), result["ms_ranks"]
            if world > 1:
                result = bench.measure(bench.setup_comm(point))
                if result.get("error"):
                    errors["comm_only"] = result["error"]
                else:
                    row["comm_only_ms"] = round(result["ms"], 5)
        if errors:
            row["errors"] = errors
        ring_report.derive(row)
        report["rows"].append(row)
        if rank == 0:
            label, fmt_ms = ring_report.tokens_label, ring_report.fmt_ms
            times = ", ".join(f"{b} {fmt_ms(ms)}" for b, ms in row["ms"].items())
            log(f"W={world} {row['scaling']} {row['pass']} {'causal' if row['causal'] else 'none'} "
                f"{label(row['tokens_per_gpu'])}/GPU (S={label(row['seq_len'])}): {times}; "
                f"baseline {fmt_ms(row['baseline_ms'])}, comm {fmt_ms(row['comm_only_ms'])}, "
                f"efficiency {ring_report.fmt(row['efficiency'])}, comm hidden {ring_report.fmt(row['comm_hidden'])}"
                + (f"; errors: {errors}" if errors else ""))
        write(plot=False)
    report["rows"].sort(key=ring_report.sort_key)
    write(plot=True)
    if rank == 0:
        failed = sum(len(r.get("errors", {})) for r in report["rows"])
        log(f"{len(report['rows'])} points in {time.monotonic() - started:.0f} s; "
            f"wrote {args.out_dir}/ring.{{json,md,png}}"
            + (f"; {failed} failed or skipped measurements (listed in ring.md)" if failed else ""))
    bench.dist.barrier(device_ids=[bench.local_rank])
    bench.dist.destroy_process_group()
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.merge:
        try:
            reports = [ring_report.load(path) for path in args.merge]
        except (OSError, ValueError) as error:
            log(str(error))
            return 1
        ring_report.write_report(ring_report.merge_reports(reports), args.out_dir)
        log(f"merged {len(reports)} runs into {args.out_dir}/ring.{{json,md,png}}")
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
