#!/usr/bin/env bash
# Runs on the GPU machine, in one invocation: builds with all cores, runs the
# whole test suite (GPU tests included), compute-sanitizer memcheck and
# racecheck over the GPU tests, and `cuflash run`. Logs go to $OUT (or
# build-gpu/logs) and a summary to stdout.
#   CUFLASH_COMMIT=$(git rev-parse --short HEAD) scripts/gpu-check.sh
# GoogleTest: the system's if installed, else the sources carried in .deps/googletest
# (scripts/stage-gpu-deps.sh puts them there; pass carry [".deps"]).
set -uo pipefail
cd "$(dirname "$0")/.."
build=build-gpu
logs=${OUT:-$build/logs}
mkdir -p "$logs"
export PATH=/usr/local/cuda/bin:$PATH
gtest_args=()
[ -d .deps/googletest ] && gtest_args=(-DCUFLASH_GTEST_SOURCE="$PWD/.deps/googletest")

{
  echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
  # The device machine gets the working tree without .git: pass CUFLASH_COMMIT.
  echo "commit: ${CUFLASH_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/device: /'
  echo "nvcc: $(nvcc --version | tail -1)"
} | tee "$logs/summary.txt"

start=$(date +%s)
cmake -S . -B "$build" -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90a-real "${gtest_args[@]}" >"$logs/configure.log" 2>&1 &&
  cmake --build "$build" -j "$(nproc)" >"$logs/build.log" 2>&1
build_status=$?
echo "build: status $build_status in $(( $(date +%s) - start )) s" | tee -a "$logs/summary.txt"
[ $build_status -eq 0 ] || { tail -30 "$logs/build.log"; exit 1; }

ctest --test-dir "$build" --output-on-failure -j 8 >"$logs/ctest.log" 2>&1
ctest_status=$?
grep -E "tests passed|tests failed|Skipped|\(Failed\)" "$logs/ctest.log" | sed 's/^/ctest: /' | tee -a "$logs/summary.txt"

sanitizer_status=0
for tool in memcheck racecheck; do
  compute-sanitizer --tool "$tool" --error-exitcode 3 "$build/tests/cuflash_gpu_tests" >"$logs/sanitizer-$tool.log" 2>&1
  status=$?
  [ $status -eq 0 ] || sanitizer_status=$status
  echo "compute-sanitizer $tool: status $status; $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$logs/sanitizer-$tool.log" | tail -1)" |
    tee -a "$logs/summary.txt"
done

"$build/bin/cuflash" run >"$logs/cuflash-run.log" 2>&1
run_status=$?
echo "cuflash run: status $run_status" | tee -a "$logs/summary.txt"
cat "$logs/cuflash-run.log"
[ $ctest_status -eq 0 ] && [ $sanitizer_status -eq 0 ] && [ $run_status -eq 0 ]
