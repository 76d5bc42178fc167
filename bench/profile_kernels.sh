#!/usr/bin/env bash
# Nsight Compute side by side, on the GPU machine: one launch of a cuflash
# kernel and one of PyTorch's FlashAttention-2 kernel on the same shape, with
# the sections that explain a gap (throughput, warp stalls, instruction mix,
# launch resources, hottest stall sites). Writes <tag>-{cuflash,torch}.txt to
# $OUT (or docs/perf). ncu runs with --clock-control none: the card's clocks
# stay as found (the device notes ask it).
#   bench/profile_kernels.sh <tag> <pass fwd|fwdbwd> <head_dim> <seqlen> <causal 0|1> <cuflash kernel regex> <torch kernel regex>
# Expects build-bench/bin/cuflash (bench/prefill.sh builds it; CUFLASH_BIN
# names another, e.g. gpu-check's /root/build/bin/cuflash). TORCH_SDPA
# picks PyTorch's SDPA backend (default FLASH_ATTENTION; CUDNN_ATTENTION for
# cuDNN's kernel, e.g. with the regex 'sdpa|cudnn|fprop|dgrad'); TORCH_SDPA=FA4
# runs FlashAttention-4 (flash_attn.cute.flash_attn_func, installed by
# bench/fa4-receive.sh: source /root/fa4/env first) instead of SDPA, e.g. with
# the regex 'FlashAttentionForwardSm90|FlashAttentionBackwardSm90'. (Our
# backward's main kernel: 'flash_bwd_tma_kernel'; a bare 'flash_bwd_tma'
# catches its preparation kernel first.) The shape is the sweep's (2048 /
# head_dim heads, 16k tokens); PROFILE_BATCH and PROFILE_HEADS set another,
# e.g. the small shapes' PROFILE_BATCH=1 PROFILE_HEADS=16.
set -euo pipefail
cd "$(dirname "$0")/.."
tag=$1 pass=$2 head_dim=$3 seqlen=$4 causal=$5 ours=$6 theirs=$7
out=${OUT:-docs/perf}
heads=${PROFILE_HEADS:-$((2048 / head_dim))} batch=${PROFILE_BATCH:-$((16384 / seqlen))}
sections=(--section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats
          --section InstructionStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis
          --section SchedulerStats --section SourceCounters)
mask=none; [ "$causal" = 1 ] && mask=causal
ncu --clock-control none --kernel-name "regex:$ours" --launch-skip 3 --launch-count 1 "${sections[@]}" -f -o "/tmp/$tag-cuflash" \
  "${CUFLASH_BIN:-build-bench/bin/cuflash}" bench --backend cuda --pass "$pass" --head-dim "$head_dim" --seqlen "$seqlen" \
  --heads "$heads" --batch "$batch" --mask "$mask" --reps 3 --warmup-ms 0 --min-reps 1 >"/tmp/$tag-cuflash.log" 2>&1 || true
ncu --clock-control none --kernel-name "regex:$theirs" --launch-skip 3 --launch-count 1 "${sections[@]}" -f -o "/tmp/$tag-torch" \
  python3 - "$pass" "$head_dim" "$seqlen" "$heads" "$batch" "$causal" "${TORCH_SDPA:-FLASH_ATTENTION}" >"/tmp/$tag-torch.log" 2>&1 <<'PY' || true
import contextlib, sys, torch
from torch.nn.attention import SDPBackend, sdpa_kernel
p, d, s, h, b, causal = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6] == "1"
# [B, S, H, D] memory seen as [B, H, S, D], as cuflash gets it (bench/prefill.py's default layout)
q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2).requires_grad_() for _ in range(3))
if sys.argv[7] == "FA4":
    # flash-attn takes [B, S, H, D]: the transposes are views of that memory.
    from flash_attn.cute import flash_attn_func
    def attention():
        out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal)
        return out[0] if isinstance(out, tuple) else out
    backend = contextlib.nullcontext()
else:
    def attention():
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    backend = sdpa_kernel(getattr(SDPBackend, sys.argv[7]))
with backend:
    for _ in range(6):
        o = attention()
        if p == "fwdbwd":
            o.backward(torch.randn_like(o))
torch.cuda.synchronize()
PY
# Per report: the details pages, and per SASS instruction the executed count
# and stall samples (bench/sass_profile.py condenses these).
for who in cuflash torch; do
  ncu -i "/tmp/$tag-$who.ncu-rep" --print-details all >"$out/$tag-$who.txt" 2>&1 || true
  ncu -i "/tmp/$tag-$who.ncu-rep" --page source --print-source sass --csv >"$out/$tag-$who-sass.csv" 2>&1 || true
done
for f in "$out/$tag-cuflash.txt" "$out/$tag-torch.txt"; do
  echo "== $f"
  grep -E "^  [a-zA-Z_].*\(|Duration|Registers Per|Shared Memory Config|Dynamic Shared|Executed Ipc A|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Tensor|Executed Instructions  " "$f" | head -30 || true
done
