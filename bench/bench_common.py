"""What bench/prefill.py and bench/decode.py share: the PyTorch peers' timing
loop (the same method as `cuflash bench`: warm-up, then calls queued back to
back, each between its own CUDA events with the L2 overwritten before it,
median reported), and small command-line and report helpers.

A Python call can take longer to launch than to run (SDPA's forward+backward
of a small problem: 150-300 µs of host time for 30-50 µs on the GPU). Events
around such a call time the host: the GPU reaches the start event and waits
for the call's kernels. So a timed call is queued behind a spin kernel
(torch.cuda._sleep) where the host would otherwise fall behind: before the
first, and before each whose launch takes longer than the GPU's time on the
one before (queue_lead_spin_us). A call the GPU takes longer to run than the
host to launch needs none: the host stays ahead, and the calls run back to
back as `cuflash bench`'s do (its calls launch in 10-30 µs, each behind a
host-function gate). The GPU must not rest more between one backend's calls
than another's: at the power cap (H200: 690 W in long forward+backward
calls) a rest raises the clock of the calls after it (NOTES.md, session 41:
a spin of twice the host time before every call ran SDPA's cuDNN at
1.90-1.94 GHz where `cuflash bench` ran back to back at 1.80)."""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import time


class TorchTimer:
    """torch, SDPA's backend switch, an L2-sized flush buffer and a CUDA generator,
    for the PyTorch peers of one benchmark; `args` has warmup_ms, rep_ms, min_reps, max_reps."""

    def __init__(self, args, dtype_name: str = "bf16"):
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        self.torch, self.F, self.SDPBackend, self.sdpa_kernel = torch, F, SDPBackend, sdpa_kernel
        self.args = args
        self.dtype = {"bf16": torch.bfloat16, "f16": torch.float16}[dtype_name]
        properties = torch.cuda.get_device_properties(0)
        l2_bytes = getattr(properties, "L2_cache_size", 50 << 20) or (50 << 20)
        self.flush_buffer = torch.empty(max(2 * l2_bytes, 32 << 20), dtype=torch.int8, device="cuda")
        self.generator = torch.Generator(device="cuda")
        self.spin_cycles_per_us = self._spin_rate()

    def _spin_rate(self) -> float:
        """torch.cuda._sleep's cycles per µs on this GPU (its SM clock), measured."""
        torch = self.torch
        cycles = 2_000_000
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(cycles)  # (the first launch loads the kernel)
        start.record()
        torch.cuda._sleep(cycles)
        stop.record()
        stop.synchronize()
        return cycles / max(start.elapsed_time(stop) * 1e3, 1.0)

    def time_calls(self, call, before) -> tuple[float, int, float]:
        """(median ms, timed calls, median host µs per call) of `call`, `before` run ahead of each."""
        torch, args = self.torch, self.args
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        warm_ms, warm_calls = 0.0, 0
        while warm_calls < 3 or warm_ms < args.warmup_ms:
            before()
            self.flush_buffer.zero_()
            start.record()
            call()
            stop.record()
            stop.synchronize()
            warm_ms += start.elapsed_time(stop)
            warm_calls += 1
        call_us = warm_ms / warm_calls * 1e3  # (a host-bound call's includes its launch: an overestimate)
        reps = min(max(math.ceil(args.rep_ms * 1e3 / max(call_us, 1.0)), args.min_reps), args.max_reps)
        # One rep's host time (its launch, the flush's and the events'), for the spins.
        host_start = time.perf_counter()
        before()
        self.flush_buffer.zero_()
        start.record()
        call()
        stop.record()
        rep_host_us = (time.perf_counter() - host_start) * 1e6
        stop.synchronize()
        spins = [queue_lead_spin_us(rep_host_us, call_us, first=i == 0) for i in range(reps)]
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        stops = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        host = []
        for i in range(reps):
            before()
            self.flush_buffer.zero_()
            if spins[i] > 0:
                torch.cuda._sleep(int(spins[i] * self.spin_cycles_per_us))
            starts[i].record()
            launch = time.perf_counter()
            call()
            host.append((time.perf_counter() - launch) * 1e6)
            stops[i].record()
        torch.cuda.synchronize()
        return median(a.elapsed_time(b) for a, b in zip(starts, stops)), reps, median(host)


def queue_lead_spin_us(rep_host_us: float, call_us: float, first: bool) -> float:
    """How long the GPU spins before a timed call so that the call is queued
    before the GPU reaches it: the first call gets twice a rep's host time (+20
    µs); a later one the part of that which the GPU's time on the call before
    does not already give the host (none when the GPU takes the longer)."""
    lead_us = 2.0 * rep_host_us + 20.0
    return lead_us if first else max(0.0, lead_us - call_us)


def write_report(out: str, meta: dict, rows: list, markdown) -> None:
    """OUT.json (meta and rows) and OUT.md (markdown(meta, rows)), and the markdown printed."""
    with open(out + ".json", "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    text = markdown(meta, rows)
    with open(out + ".md", "w") as f:
        f.write(text)
    print(text)


def median(values) -> float:
    values = sorted(values)
    middle = len(values) // 2
    return values[middle] if len(values) % 2 else 0.5 * (values[middle - 1] + values[middle])


def git_commit() -> str:
    try:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        return subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def name_list(choices):
    """An argparse type: comma-separated names, each one of `choices`."""
    def parse(text):
        items = text.split(",")
        for item in items:
            if item not in choices:
                raise argparse.ArgumentTypeError(f"'{item}' is not one of {', '.join(choices)}")
        return items
    return parse


def add_timing_arguments(parser, rep_ms: float) -> None:
    """The timing flags both scripts take, for `cuflash bench` and the PyTorch peers alike."""
    parser.add_argument("--warmup-ms", type=float, default=25.0)
    parser.add_argument("--rep-ms", type=float, default=rep_ms, help="timed GPU time per point and backend")
    parser.add_argument("--min-reps", type=int, default=10)
    parser.add_argument("--max-reps", type=int, default=1000)


def timing_flags(args) -> list[str]:
    """The same flags, passed on to `cuflash bench`."""
    return ["--warmup-ms", str(args.warmup_ms), "--rep-ms", str(args.rep_ms),
            "--min-reps", str(args.min_reps), "--max-reps", str(args.max_reps)]


def missing_points(results: list[dict], points: list[dict], backends: list[str], row_key, point_key) -> list:
    """The (point, backend) pairs that no row of `results` reports (row_key of
    a row and point_key of a point name the same point)."""
    seen = {(r["backend"],) + row_key(r) for r in results}
    return [(point, backend) for point in points for backend in backends if (backend,) + point_key(point) not in seen]


def run_json_lines(command: list[str], log, on_object) -> int | None:
    """Runs `command` (a `cuflash bench --json`), hands each JSON object it
    prints to `on_object` as it comes, logs what is not JSON, and returns the
    exit code (None when the command could not run)."""
    log("running " + " ".join(command))
    exit_code = None
    try:
        with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as process:
            for line in process.stdout:
                line = line.strip()
                if not line:
                    continue
                try:
                    raw = json.loads(line)
                except json.JSONDecodeError:
                    log(f"cuflash printed a line that is not JSON: {line}")
                    continue
                on_object(raw)
        exit_code = process.returncode
    except OSError as error:
        log(f"cannot run {command[0]}: {error}")
    if exit_code not in (0, None):
        log(f"cuflash bench exited with {exit_code} (1: some point failed, see the rows)")
    return exit_code
