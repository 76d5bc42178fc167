#!/usr/bin/env bash
# Issue 5 on the GPU machine, in steps that each fit one device call (the
# machine stays warm between calls, and build-gpu/ is git-ignored, so it is
# kept): the build (~2 min on 16 cores), the KV-cache GPU tests alone (fast
# feedback), every test (~4-5 min), compute-sanitizer memcheck and racecheck
# over the Sanitize* subset plus `cuflash run` (up to 2 x 5 min), and the
# decode benchmark (~5 min). Logs and results go to $OUT (else build-gpu/logs).
#   scripts/stage-gpu-deps.sh                       # here, before the device calls (carry [".deps"])
#   CUFLASH_COMMIT=<sha> scripts/gpu-decode.sh build focus
#   CUFLASH_COMMIT=<sha> scripts/gpu-decode.sh ctest
#   CUFLASH_COMMIT=<sha> scripts/gpu-decode.sh sanitize
#   CUFLASH_COMMIT=<sha> scripts/gpu-decode.sh bench
set -uo pipefail
cd "$(dirname "$0")/.."
build=${CUFLASH_BUILD_DIR:-build-gpu}
logs=${OUT:-$build/logs}
mkdir -p "$logs"
export PATH=/usr/local/cuda/bin:$PATH
status=0
for step in "$@"; do
  case $step in
    build)
      CUFLASH_GPU_CHECK_STEPS=build scripts/gpu-check.sh || exit 1 ;;
    focus)
      # The decode kernel, the append, the combine, the refusals and the cuDNN suite's decode cases.
      "$build/tests/cuflash_gpu_tests" \
        --gtest_filter='*Decode*:*KvCache*:CudaUnsupported*:CudaBackendGpu*:*CudaWorkspace*' \
        >"$logs/decode-focus.log" 2>&1 || status=1
      grep -E '^\[  (PASSED|FAILED|SKIPPED) \]|^\[ cuflash \]' "$logs/decode-focus.log" | head -80 ;;
    ctest)
      CUFLASH_GPU_CHECK_STEPS="ctest" scripts/gpu-check.sh || status=1 ;;
    sanitize)
      CUFLASH_GPU_CHECK_STEPS="memcheck racecheck run" scripts/gpu-check.sh || status=1 ;;
    bench)
      python3 bench/decode.py --cuflash "$build/bin/cuflash" --out-dir "$logs" 2>&1 | tee "$logs/decode-run.log" |
        tail -40 || status=1
      [ -f "$logs/decode.md" ] && sed -n '1,40p' "$logs/decode.md" ;;
    *)
      echo "gpu-decode.sh: unknown step '$step' (build, focus, ctest, sanitize, bench)" >&2
      exit 2 ;;
  esac
done
exit $status
