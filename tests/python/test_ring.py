"""Ring attention (cuflash.distributed) against single-process cuflash.attention over the whole sequence.

Each world size (1 to 4 ranks; gloo on the CPU, cuflash backend "cpu") is one
spawn of its processes, which run every case of CASES: dense and varlen,
causal and not, both layouts, GQA, windows, ALiBi, softcap, float32 and
bfloat16; forward out and lse and the gradients of q, k, v (autograd, a random
dout). Every rank builds the same global inputs (seeded), runs the reference on
the whole sequence and the ring on its shard, and reports, per quantity, the
largest absolute error of its shard and the largest absolute reference value;
the parent combines the ranks, so an error is max|ring - ref| / max|ref| over
the whole sequence.

Tolerances:
- float32: the ring computes every step with the same float32 kernel as the
  reference and merges the partial states in float32 (merge_states), so it
  differs from the one-call reference by rounding alone: a few float32 ulps of
  the largest value (float32 eps = 1.2e-7; F32_RTOL = 2e-6 leaves ~16 ulps).
  The same problem runs at every world size (S = 48 splits into 2W chunks for
  W = 1..4), and the error must not grow with W
  (test_f32_error_does_not_grow_with_world_size).
- bfloat16: both sides round to bf16 (eps 2^-8), the ring once more per step
  (each step's partial out and partial dq/dk/dv are bf16 before their float32
  merge or sum). Both are measured against float32 attention of the same
  bf16-rounded inputs, and the ring may be off by at most twice what the
  single-process bf16 call is, plus BF16_SLACK (half a bf16 ulp of 1).

Worlds of 3 and 4 ranks also run two rings at once over subgroups (even and
odd ranks), whose group ranks are not the global ranks.

NCCL: the same cases on GPUs (backends "cuda" and "auto"; worlds of 1 and 2 ranks), the
bf16 ones held to the same rule, float32 to GPU_F32_RTOL; skipped unless CUDA,
NCCL, cuflash's CUDA backend and as many GPUs as ranks are there.
"""

import json
import os
import socket
import tempfile
import time
import traceback

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import cuflash  # noqa: E402
from cuflash import distributed as cfd  # noqa: E402

WORLD_SIZES = (1, 2, 3, 4)
SEQ_LEN = 48  # divisible by 2W for every W in WORLD_SIZES: the same problem at every world size
VARLEN_LENS = (24, 72, 48)  # multiples of 24 = lcm(2, 4, 6, 8), different lengths
F32_RTOL = 2e-6
BF16_SLACK = 2.0**-9
# On the GPU, float32 runs on CUDA cores with exp2 approximations and tile orders that depend on the call's
# length, so a ring step's call and the whole-sequence call round differently: ~100 float32 ulps.
GPU_F32_RTOL = 1e-5
SPAWN_TIMEOUT_S = 240


def _case(name, **spec):
    base = dict(varlen=False, causal=False, layout="zigzag", heads=(2, 2), head_dim=16, window=(-1, -1), alibi=None,
                softcap=0.0, scale=None, dtype="float32", batch=2, expect_error=None)
    base.update(spec)
    base["name"] = name
    return base


CASES = [
    _case("causal_zigzag", causal=True),
    _case("full_zigzag"),
    _case("causal_contiguous", causal=True, layout="contiguous"),
    _case("full_contiguous", layout="contiguous"),
    _case("gqa_causal_zigzag", causal=True, heads=(4, 2), head_dim=32),
    _case("gqa_full_contiguous", heads=(4, 2), layout="contiguous"),
    _case("window_causal_zigzag", causal=True, window=(5, 0)),
    _case("window_full_zigzag", window=(7, 3)),
    _case("window_causal_contiguous", causal=True, window=(5, 0), layout="contiguous"),
    _case("window_full_contiguous", window=(7, 3), layout="contiguous", heads=(4, 2)),
    _case("alibi_causal_zigzag", causal=True, alibi="heads", heads=(4, 2)),
    _case("alibi_full_contiguous", alibi="batch", layout="contiguous"),
    _case("alibi_window_full_zigzag", alibi="heads", window=(7, 3)),
    _case("softcap_causal_zigzag", causal=True, softcap=5.0, scale=0.3),
    _case("bf16_gqa_causal_zigzag", causal=True, heads=(4, 2), head_dim=32, dtype="bfloat16"),
    _case("bf16_full_contiguous", layout="contiguous", dtype="bfloat16", head_dim=32),
    _case("bf16_window_causal_zigzag", causal=True, window=(5, 0), dtype="bfloat16", head_dim=32),
    _case("varlen_causal_zigzag", varlen=True, causal=True, heads=(4, 2)),
    _case("varlen_full_zigzag", varlen=True),
    _case("varlen_causal_contiguous", varlen=True, causal=True, layout="contiguous"),
    _case("varlen_full_contiguous", varlen=True, layout="contiguous", heads=(4, 2)),
    _case("varlen_bf16_causal_zigzag", varlen=True, causal=True, dtype="bfloat16", head_dim=32),
    _case("varlen_window_refused", varlen=True, causal=True, window=(4, 0), expect_error="window_size"),
    _case("varlen_alibi_refused", varlen=True, alibi="heads", expect_error="alibi_slopes"),
]
CASE_NAMES = [c["name"] for c in CASES]
GATHER_CASE = "gather"
# Run again over subgroups when the world has 3 or more ranks (even and odd ranks: group ranks are not global ranks).
SUBGROUP_CASES = ("gqa_causal_zigzag", "window_full_contiguous", "varlen_causal_zigzag", "bf16_full_contiguous")
SUBGROUP_PREFIX = "subgroup:"


# ---------------------------------------------------------------------------------------------------------------
# What every rank runs


def _inputs(case, seed):
    """The global inputs (same on every rank: seeded), float32 on the CPU."""
    gen = torch.Generator().manual_seed(seed)
    heads_q, heads_k = case["heads"]
    dim = case["head_dim"]

    def randn(*shape):
        return torch.randn(*shape, generator=gen)

    if case["varlen"]:
        total = sum(VARLEN_LENS)
        q, k, v, dout = randn(total, heads_q, dim), randn(total, heads_k, dim), randn(total, heads_k, dim), randn(
            total, heads_q, dim)
    else:
        batch = case["batch"]
        q, k, v = randn(batch, SEQ_LEN, heads_q, dim), randn(batch, SEQ_LEN, heads_k, dim), randn(
            batch, SEQ_LEN, heads_k, dim)
        dout = randn(batch, SEQ_LEN, heads_q, dim)
    slopes = None
    if case["alibi"] == "heads":
        slopes = 0.05 + 0.3 * torch.rand(heads_q, generator=gen)
    elif case["alibi"] == "batch":
        batch = len(VARLEN_LENS) if case["varlen"] else case["batch"]
        slopes = 0.05 + 0.3 * torch.rand(batch, heads_q, generator=gen)
    return q, k, v, dout, slopes


def _cu_seqlens():
    cu = [0]
    for length in VARLEN_LENS:
        cu.append(cu[-1] + length)
    return torch.tensor(cu, dtype=torch.int32)


def _reference(case, q, k, v, dout, slopes, cu, backend, max_seqlen=max(VARLEN_LENS)):
    """(out, lse, dq, dk, dv) of one call over the whole sequence, through autograd."""
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    extra = {}
    if cu is not None:
        length = max_seqlen
        extra = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=length, max_seqlen_k=length)
    out, lse = cuflash.attention(q, k, v, causal=case["causal"], window_size=case["window"], softcap=case["softcap"],
                                 softmax_scale=case["scale"], alibi_slopes=slopes, backend=backend, return_lse=True,
                                 **extra)
    out.backward(dout)
    return out.detach(), lse, q.grad, k.grad, v.grad


def _ring(case, world, rank, q, k, v, dout, slopes, cu, backend, group=None):
    """(out, lse, dq, dk, dv) of this rank's shard through the ring, and the sharding of a global tensor."""
    layout = case["layout"]
    if case["varlen"]:
        def shard(x):
            return cfd.shard_varlen(x, cu, world, rank, layout)[0]

        def shard_lse(x):  # [H, T]
            return shard(x.transpose(0, 1)).transpose(0, 1)

        _, cu_local, max_local = cfd.shard_varlen(q, cu, world, rank, layout)
    else:
        def shard(x):
            return cfd.shard_sequence(x, world, rank, layout)

        def shard_lse(x):  # [B, H, S]
            return cfd.shard_sequence(x, world, rank, layout, dim=2)

    q_local, k_local, v_local = (shard(x).detach().clone().requires_grad_() for x in (q, k, v))
    options = dict(causal=case["causal"], window_size=case["window"], softcap=case["softcap"],
                   softmax_scale=case["scale"], alibi_slopes=slopes, layout=layout, backend=backend, return_lse=True,
                   group=group)
    if case["varlen"]:
        out, lse = cfd.ring_flash_attn_varlen_func(q_local, k_local, v_local, cu_local, max_local, **options)
    else:
        out, lse = cfd.ring_flash_attn_func(q_local, k_local, v_local, **options)
    out.backward(shard(dout))
    return (out.detach(), lse, q_local.grad, k_local.grad, v_local.grad), shard, shard_lse


QUANTITIES = ("out", "lse", "dq", "dk", "dv")


def _extent(got, want):
    """(max |got - want|, max |want|) over the finite entries of want."""
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    finite = torch.isfinite(want)
    if not bool(torch.equal(finite, torch.isfinite(got))):
        return float("inf"), 1.0
    if not bool(finite.any()):
        return 0.0, 0.0
    return (got[finite] - want[finite]).abs().max().item(), want[finite].abs().max().item()


def _run_case(case, seed, world, rank, device, backend, group=None):
    q, k, v, dout, slopes = _inputs(case, seed)
    dtype = getattr(torch, case["dtype"])
    q, k, v, dout = (x.to(dtype).to(device) for x in (q, k, v, dout))
    slopes = None if slopes is None else slopes.to(device)
    cu = _cu_seqlens().to(device) if case["varlen"] else None
    if case["expect_error"]:
        try:
            _ring(case, world, rank, q, k, v, dout, slopes, cu, backend, group)
        except cfd.InvalidArgumentError as error:
            if case["expect_error"] not in str(error):
                raise AssertionError(f"the error does not name {case['expect_error']}: {error}") from error
            return {}
        raise AssertionError(f"expected InvalidArgumentError naming {case['expect_error']}")
    ring, shard, shard_lse = _ring(case, world, rank, q, k, v, dout, slopes, cu, backend, group)
    shards = (shard, shard_lse, shard, shard, shard)
    result = {}
    if dtype == torch.float32:
        want = _reference(case, q, k, v, dout, slopes, cu, backend)
        for name, got, full, cut in zip(QUANTITIES, ring, want, shards):
            result[name] = {"ring": _extent(got, cut(full))}
    else:
        # float32 attention of the same rounded inputs (cpu backend), and the single-process call in this dtype.
        up = [x.float().cpu() for x in (q, k, v, dout)]
        want = _reference(case, *up[:3], up[3], None if slopes is None else slopes.cpu(),
                          None if cu is None else cu.cpu(), "cpu")
        single = _reference(case, q, k, v, dout, slopes, cu, backend)
        for name, got, one, full, cut in zip(QUANTITIES, ring, single, want, shards):
            expected = cut(full)
            result[name] = {"ring": _extent(got, expected), "single": _extent(cut(one), expected)}
    return result


def _gather_checks(world, rank, device):
    """gather_sequence / gather_varlen give back the global tensor exactly."""
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(2, SEQ_LEN, 3, 4, generator=gen).to(device)
    cu = _cu_seqlens()
    packed = torch.randn(int(cu[-1]), 3, 4, generator=gen).to(device)
    for layout in cfd.LAYOUTS:
        got = cfd.gather_sequence(cfd.shard_sequence(x, world, rank, layout).contiguous(), layout=layout)
        assert torch.equal(got, x), f"gather_sequence ({layout})"
        local = cfd.shard_varlen(packed, cu.to(device), world, rank, layout)[0]
        assert torch.equal(cfd.gather_varlen(local, cu, layout=layout), packed), f"gather_varlen ({layout})"
    return {}


def _worker(rank, world, port, device_kind, out_dir, case_names):
    os.environ["CUFLASH_NUM_THREADS"] = "1"  # up to 4 processes share the CI's 2 cores
    torch.set_num_threads(1)
    if device_kind == "cuda":
        torch.cuda.set_device(rank)
        device, backend, pg_backend = torch.device("cuda", rank), "cuda", "nccl"
    else:
        device, backend, pg_backend = torch.device("cpu"), "cpu", "gloo"
    dist.init_process_group(pg_backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            **({"device_id": device} if device_kind == "cuda" else {}))
    results = {}
    try:
        for index, case in enumerate(CASES):
            if case["name"] not in case_names:
                continue
            start = time.perf_counter()
            try:
                results[case["name"]] = {"quantities": _run_case(case, 1000 + index, world, rank, device, backend)}
            except Exception:  # reported by the parent, case by case; the other ranks go on
                results[case["name"]] = {"failure": traceback.format_exc()}
            results[case["name"]]["seconds"] = time.perf_counter() - start
        try:
            results[GATHER_CASE] = {"quantities": _gather_checks(world, rank, device)}
        except Exception:
            results[GATHER_CASE] = {"failure": traceback.format_exc()}
        if world >= 3:
            groups = [dist.new_group([r for r in range(world) if r % 2 == parity]) for parity in (0, 1)]
            group = groups[rank % 2]
            for name in SUBGROUP_CASES:
                if name not in case_names:
                    continue
                index = CASE_NAMES.index(name)
                try:
                    results[SUBGROUP_PREFIX + name] = {"quantities": _run_case(
                        CASES[index], 1000 + index, dist.get_world_size(group), dist.get_rank(group), device, backend,
                        group)}
                except Exception:
                    results[SUBGROUP_PREFIX + name] = {"failure": traceback.format_exc()}
    finally:
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as file:
            json.dump(results, file)
        dist.destroy_process_group()


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(world, device_kind, case_names):
    """Runs the cases in `world` processes; {case: {"failure": text} or {"quantities": {q: {side: (err, ref)}}}},
    the ranks combined (errors and reference extents are the maxima over the ranks)."""
    with tempfile.TemporaryDirectory() as out_dir:
        context = mp.start_processes(_worker, args=(world, _free_port(), device_kind, out_dir, case_names),
                                     nprocs=world, join=False, start_method="spawn")
        deadline = time.monotonic() + SPAWN_TIMEOUT_S
        while not context.join(timeout=5):
            if time.monotonic() > deadline:
                for process in context.processes:
                    if process.is_alive():
                        process.terminate()
                raise AssertionError(f"ring test world {world} ({device_kind}): no result in {SPAWN_TIMEOUT_S} s")
        per_rank = []
        for rank in range(world):
            with open(os.path.join(out_dir, f"rank{rank}.json")) as file:
                per_rank.append(json.load(file))
    combined = {}
    for name in sorted(set().union(*per_rank)):
        failures = [f"rank {r}:\n{res.get(name, {}).get('failure', 'no result')}" for r, res in enumerate(per_rank)
                    if name not in res or "failure" in res[name]]
        if failures:
            combined[name] = {"failure": "\n".join(failures)}
            continue
        quantities = {}
        for res in per_rank:
            for quantity, sides in res[name]["quantities"].items():
                slot = quantities.setdefault(quantity, {})
                for side, (err, extent) in sides.items():
                    old = slot.get(side, (0.0, 0.0))
                    slot[side] = (max(old[0], err), max(old[1], extent))
        combined[name] = {"quantities": quantities, "seconds": max(res[name].get("seconds", 0.0) for res in per_rank)}
    return combined


_results = {}


def _world_results(world, device_kind="cpu"):
    key = (world, device_kind)
    if key not in _results:
        _results[key] = _spawn(world, device_kind, CASE_NAMES)
    return _results[key]


def _relative(err_extent):
    err, extent = err_extent
    return err / extent if extent > 0 else err


def _check_case(result, case, record=None, rtol=F32_RTOL):
    assert "failure" not in result, result.get("failure")
    for quantity, sides in result["quantities"].items():
        error = _relative(sides["ring"])
        if case["dtype"] == "float32":
            tolerance = rtol
        else:
            tolerance = 2 * _relative(sides["single"]) + BF16_SLACK
        if record is not None:
            record(quantity, error, tolerance)
        assert error <= tolerance, f"{quantity}: relative error {error:.3g} > {tolerance:.3g} ({sides})"


# ---------------------------------------------------------------------------------------------------------------
# gloo on the CPU


@pytest.mark.parametrize("case", CASE_NAMES)
@pytest.mark.parametrize("world", WORLD_SIZES)
def test_ring_cpu(world, case, error_ledger):
    result = _world_results(world)[case]
    _check_case(result, CASES[CASE_NAMES.index(case)], error_ledger)


@pytest.mark.parametrize("world", WORLD_SIZES)
def test_gather_cpu(world):
    result = _world_results(world)[GATHER_CASE]
    assert "failure" not in result, result.get("failure")


@pytest.mark.parametrize("world", [w for w in WORLD_SIZES if w >= 3])
def test_ring_subgroups_cpu(world):
    """Two rings at once over the even and the odd ranks (new_group), each equal to the reference."""
    results = _world_results(world)
    for name in SUBGROUP_CASES:
        _check_case(results[SUBGROUP_PREFIX + name], CASES[CASE_NAMES.index(name)])


def test_f32_error_does_not_grow_with_world_size():
    """The same float32 problems at W = 1..4. Each error is already held to F32_RTOL at every W (test_ring_cpu);
    here their mean over every float32 case and quantity, a smooth statistic of what are otherwise ulp-level
    draws, must not grow from 2 to 4 ranks (at most 1.5x: an error growing with the number of ring steps, which
    doubles, would double it)."""
    means = {}
    for world in WORLD_SIZES:
        errors = []
        for case in CASES:
            if case["dtype"] != "float32" or case["expect_error"]:
                continue
            result = _world_results(world)[case["name"]]
            if "failure" in result:
                pytest.fail(f"{case['name']} failed at world {world} (see test_ring_cpu)")
            errors += [_relative(result["quantities"][q]["ring"]) for q in QUANTITIES]
        means[world] = sum(errors) / len(errors)
    assert max(means[w] for w in WORLD_SIZES[1:]) <= F32_RTOL / 4, f"mean relative errors by world size: {means}"
    assert means[4] <= 1.5 * means[2], f"mean relative errors by world size: {means}"


# ---------------------------------------------------------------------------------------------------------------
# NCCL on GPUs


def _gpus():
    if not torch.cuda.is_available() or not dist.is_nccl_available() or not cuflash.backend_available("cuda"):
        return 0
    return torch.cuda.device_count()


NCCL_CASES = CASE_NAMES  # bfloat16 cases have head dim 32: the CUDA backend's tensor-core kernels take it


@pytest.mark.parametrize("world,backend", ((1, "cuda"), (1, "auto"), (2, "cuda"), (2, "auto")))
def test_ring_nccl(world, backend):
    """backend "auto" (the default): cuDNN runs the steps that need no diagonal offset where it is built in."""
    gpus = _gpus()
    if gpus < world:
        pytest.skip(f"NCCL ring over {world} rank(s) needs CUDA, NCCL, cuflash's CUDA backend and {world} GPU(s); "
                    f"{gpus} usable here")
    results = _spawn(world, backend, NCCL_CASES)
    failed = []
    for name in NCCL_CASES + [GATHER_CASE]:
        try:
            if name == GATHER_CASE:
                assert "failure" not in results[name], results[name].get("failure")
            else:
                _check_case(results[name], CASES[CASE_NAMES.index(name)], rtol=GPU_F32_RTOL)
        except AssertionError as error:
            failed.append(f"{name}: {error}")
    assert not failed, "\n".join(failed)


# ---------------------------------------------------------------------------------------------------------------
# In this process: no ring (a ring of one without a process group) and the shard helpers


def test_ring_of_one_without_a_process_group():
    """With no process group and group=None the ring has one rank: the whole sequence, forward and backward."""
    if dist.is_initialized():
        pytest.skip("a process group is initialized in this process")
    gen = torch.Generator().manual_seed(3)
    q, k, v, dout = (torch.randn(2, 16, 2, 16, generator=gen) for _ in range(4))
    for causal in (False, True):
        got, got_lse = cfd.ring_flash_attn_func(q, k, v, causal=causal, return_lse=True)  # no autograd
        want, want_lse = cuflash.attention(q, k, v, causal=causal, backend="cpu", return_lse=True)
        assert torch.equal(got, want) and torch.equal(got_lse, want_lse)
        grads = []
        for attend in (lambda *x: cfd.ring_flash_attn_func(*x, causal=causal),
                       lambda *x: cuflash.attention(*x, causal=causal, backend="cpu")):
            inputs = [x.clone().requires_grad_() for x in (q, k, v)]
            attend(*inputs).backward(dout)
            grads.append([x.grad for x in inputs])
        for got_grad, want_grad in zip(*grads):
            assert torch.equal(got_grad, want_grad)
    # Varlen, with 4 packed rows after the last sequence: out 0, lse -inf and no gradient there.
    cu = torch.tensor([0, 6, 16, 30], dtype=torch.int32)
    q, k, v, dout = (torch.randn(34, 2, 16, generator=gen) for _ in range(4))
    want = _reference(dict(causal=True, window=(-1, -1), softcap=0.0, scale=None), q[:30], k[:30], v[:30], dout[:30],
                      None, cu, "cpu", max_seqlen=14)
    for layout in cfd.LAYOUTS:
        inputs = [x.clone().requires_grad_() for x in (q, k, v)]
        out, lse = cfd.ring_flash_attn_varlen_func(*inputs, cu, 14, causal=True, layout=layout, return_lse=True)
        out.backward(dout)
        got = (out, lse, *(x.grad for x in inputs))
        for name, got_x, want_x in zip(QUANTITIES, got, want):
            rows = got_x[:, :30] if name == "lse" else got_x[:30]
            assert (rows - want_x).abs().max() <= F32_RTOL * want_x.abs().max(), (layout, name)
            padding = got_x[:, 30:] if name == "lse" else got_x[30:]
            assert bool((padding == (float("-inf") if name == "lse" else 0.0)).all()), (layout, name)


def test_bad_arguments():
    q = torch.randn(1, 6, 2, 16)
    with pytest.raises(cfd.InvalidArgumentError, match="layout"):
        cfd.ring_flash_attn_func(q, q, q, layout="spiral")
    with pytest.raises(cfd.InvalidArgumentError, match="even"):
        cfd.ring_flash_attn_func(q[:, :5], q[:, :5], q[:, :5])
    with pytest.raises(cfd.InvalidArgumentError, match="self-attention"):
        cfd.ring_flash_attn_func(q, q[:, :4], q[:, :4])
    with pytest.raises(cfd.InvalidArgumentError, match="rank 4"):
        cfd.ring_flash_attn_func(q[0], q[0], q[0])
    with pytest.raises(cfd.InvalidArgumentError, match="divisible by 6"):
        cfd.shard_sequence(torch.randn(1, 8), 3, 0)
    with pytest.raises(cfd.InvalidArgumentError, match="rank"):
        cfd.shard_sequence(torch.randn(1, 8), 2, 2)


@pytest.mark.parametrize("layout", cfd.LAYOUTS)
@pytest.mark.parametrize("world", WORLD_SIZES)
def test_shard_sequence_round_trip(world, layout):
    chunks = 2 * world if layout == "zigzag" else world
    x = torch.randn(2, 5 * chunks, 3)
    for dim in (1, -2, 0) if layout == "contiguous" else (1,):
        if x.shape[dim] % chunks:
            continue
        shards = [cfd.shard_sequence(x, world, r, layout, dim=dim) for r in range(world)]
        assert torch.equal(cfd.unshard_sequence(shards, layout, dim=dim), x)
    # What rank r holds: its chunk(s), in order.
    positions = torch.arange(4 * chunks).view(1, -1)
    chunk_len = 4
    for rank in range(world):
        held = cfd.shard_sequence(positions, world, rank, layout).view(-1, chunk_len)[:, 0] // chunk_len
        expected = [rank] if layout == "contiguous" else [rank, 2 * world - 1 - rank]
        assert held.tolist() == expected


@pytest.mark.parametrize("layout", cfd.LAYOUTS)
@pytest.mark.parametrize("world", WORLD_SIZES)
def test_shard_varlen_round_trip(world, layout):
    chunks = 2 * world if layout == "zigzag" else world
    lengths = [chunks * n for n in (3, 1, 0, 2)]
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)
    x = torch.randn(int(cu[-1]) + 5, 2, 3)  # 5 packed rows after the last sequence belong to none
    shares = [cfd.shard_varlen(x, cu, world, r, layout) for r in range(world)]
    for x_local, cu_local, max_local in shares:
        local_lengths = [n // world for n in lengths]
        assert cu_local.dtype == torch.int32
        assert cu_local.tolist() == [0] + torch.tensor(local_lengths).cumsum(0).tolist()
        assert max_local == max(local_lengths)
        assert x_local.shape[0] == sum(local_lengths)
    assert torch.equal(cfd.unshard_varlen([s[0] for s in shares], cu, layout), x[:int(cu[-1])])
    # Each local sequence is the sequence's chunk r (contiguous) or chunks r and 2W-1-r (zigzag).
    positions = torch.arange(int(cu[-1]))
    for rank in range(world):
        local, cu_local, _ = cfd.shard_varlen(positions, cu, world, rank, layout)
        for b, length in enumerate(lengths):
            seq = local[cu_local[b]:cu_local[b + 1]] - cu[b]
            chunk_len = length // chunks
            ids = [rank] if layout == "contiguous" else [rank, 2 * world - 1 - rank]
            expected = torch.cat([torch.arange(i * chunk_len, (i + 1) * chunk_len) for i in ids]) if length else seq
            assert torch.equal(seq, expected)
    if chunks > 1:
        with pytest.raises(cfd.InvalidArgumentError, match="divisible"):
            cfd.shard_varlen(x, torch.tensor([0, chunks + 1], dtype=torch.int32), world, 0, layout)


def test_shard_helpers_are_differentiable():
    x = torch.randn(1, 8, 2, requires_grad=True)
    shards = [cfd.shard_sequence(x, 2, r) for r in range(2)]
    (cfd.unshard_sequence(shards) * torch.arange(8.0).view(1, 8, 1)).sum().backward()
    assert torch.equal(x.grad, torch.arange(8.0).view(1, 8, 1).expand(1, 8, 2))


def test_communication_overlaps_compute(monkeypatch):
    """The order of events on one rank of a ring of 3 (a stand-in ring that records instead of sending): each
    step starts the next K/V block's exchange before its kernel calls and waits for it only after them; in the
    backward the dk/dv accumulator goes on after the step's calls, and its arrival is awaited after them too."""
    from cuflash.distributed import _ring

    events = []

    class Request:
        def __init__(self, what):
            self.what = what

        def wait(self):
            events.append("wait " + self.what)

    class RecordingRing:
        size, rank = 3, 1

        def exchange(self, send, recv, tag):
            recv.copy_(send)
            what = "kv" if tag == 0 else "grad"
            events.append("send " + what)
            return [Request(what)]

    for name in ("forward", "backward"):
        real = getattr(_ring._ext, name)

        def recorded(*args, real=real, name=name):
            events.append(name)
            return real(*args)

        monkeypatch.setattr(_ring._ext, name, recorded)
    q, k, v = (torch.randn(1, 8, 2, 16, requires_grad=True) for _ in range(3))
    key = (None, False, -1, -1, 0.0, False, False, "cpu")
    setup = _ring.Setup(RecordingRing(), "zigzag", key, False, (-1, -1), None, False, 4)
    out, _ = _ring.run(q, k, v, setup)
    assert events == ["send kv", "forward", "wait kv", "send kv", "forward", "wait kv", "forward"]
    events.clear()
    out.sum().backward()
    assert events == ["send kv", "backward", "send grad", "wait kv",
                      "send kv", "backward", "wait grad", "send grad", "wait kv",
                      "backward", "wait grad", "send grad", "wait grad"]
