#!/usr/bin/env bash
# Runs on the GPU machine, in one invocation: builds with all cores, runs the
# whole test suite (GPU tests included), compute-sanitizer memcheck and
# racecheck over a representative subset of the GPU tests, and `cuflash run`.
# Full logs go to $OUT (or build-gpu/logs): build.log, ctest.log,
# sanitizer-memcheck.log, sanitizer-racecheck.log, cuflash-run.log, and a
# concise summary, gpu-check-summary.md, also printed at the end.
#   CUFLASH_COMMIT=$(git rev-parse --short HEAD) scripts/gpu-check.sh
# Knobs (environment):
#   CUFLASH_GPU_CHECK_STEPS  steps to run, default "build ctest sm80fwd memcheck racecheck run"
#                            (sm80fwd: the CUDA forward tests again with
#                            CUFLASH_SM90_FORWARD=0, so that on Hopper the sm80
#                            kernel, which the wgmma kernel replaces there for head
#                            dims 64/128/192/256, is tested too)
#                            (e.g. "build" in one call, "ctest memcheck racecheck run"
#                            in the next, while the machine stays warm: build-gpu/
#                            is git-ignored, so the device tool keeps it)
#   CUFLASH_SANITIZE_FILTER  gtest filter of the sanitizer runs, default
#                            "Sanitize*:*MergeStatesGpu*": the tests named Sanitize*
#                            (every kernel once with small shapes: forward bf16/fp16 at
#                            head dims 32..256, causal, window/softcap/ALiBi, varlen,
#                            split-KV, backward atomic and deterministic, the f32
#                            path, the KV-cache decode kernel in each of its shapes
#                            with the append and the combine, and with unchecked bad
#                            indices; backend cudnn's dense, varlen and KV-cache calls
#                            and fix-up kernels) and merge_states
#   CUFLASH_RACECHECK_FILTER gtest filter of the racecheck run, default the sanitizer
#                            filter without the cuDNN tests: cuDNN's own Hopper kernels
#                            synchronize through mbarriers and the async proxy (TMA,
#                            wgmma), which racecheck does not model, so it reports
#                            hazards inside NVIDIA's code that say nothing about ours
#                            (seen: 84, all in cudnn_generated_* kernels); memcheck
#                            still runs them
#   CUFLASH_SANITIZE_TIMEOUT seconds per sanitizer run, default 300
#   CUFLASH_BUILD_DIR        build directory, default build-gpu
# GoogleTest: the system's if installed, else the sources carried in .deps/googletest;
# the cuDNN backend: the frontend headers carried in .deps/cudnn-frontend and
# PyTorch's cuDNN (cmake/cudnn.cmake finds /opt/torch/.venv's wheel first)
# (scripts/stage-gpu-deps.sh puts both in .deps/; pass carry [".deps"]).
set -uo pipefail
cd "$(dirname "$0")/.."
build=${CUFLASH_BUILD_DIR:-build-gpu}
logs=${OUT:-$build/logs}
mkdir -p "$logs"
summary=$logs/gpu-check-summary.md
steps=" ${CUFLASH_GPU_CHECK_STEPS:-build ctest sm80fwd memcheck racecheck run} "
sanitize_filter=${CUFLASH_SANITIZE_FILTER:-'Sanitize*:*MergeStatesGpu*'}
racecheck_filter=${CUFLASH_RACECHECK_FILTER:-"$sanitize_filter-*Cudnn*"}
export PATH=/usr/local/cuda/bin:$PATH
gtest_args=()
[ -d .deps/googletest ] && gtest_args=(-DCUFLASH_GTEST_SOURCE="$PWD/.deps/googletest")

wants() { [[ $steps == *" $1 "* ]]; }
say() { echo "$*" >>"$summary"; }
now() { date +%s; }
status_all=0

: >"$summary"
say "# GPU check"
say ""
say "- date: $(date -u +%Y-%m-%dT%H:%MZ)"
# The device machine gets the working tree without .git: pass CUFLASH_COMMIT.
say "- commit: ${CUFLASH_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
say "- device: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"
say "- nvcc: $(nvcc --version 2>/dev/null | tail -1)"
say "- cores: $(nproc); steps:$steps"

if wants build; then
  start=$(now)
  { cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a-real "${gtest_args[@]}" &&
      cmake --build "$build" -j "$(nproc)"; } >"$logs/build.log" 2>&1
  build_status=$?
  say "- build: status $build_status in $(( $(now) - start )) s"
  say "- $(grep -h 'cuflash: cuDNN backend' "$logs/build.log" | tail -n 1 | sed 's/^-- //')"
  if [ $build_status -ne 0 ]; then
    say ""
    say '```'
    tail -30 "$logs/build.log" >>"$summary"
    say '```'
    cat "$summary"
    exit 1
  fi
fi

if wants ctest; then
  # -V keeps every test's output: the error ledgers ("[ cuflash ]" lines) and notes below come from it.
  start=$(now)
  ctest --test-dir "$build" -V --output-on-failure --timeout 600 -j 8 >"$logs/ctest.log" 2>&1
  ctest_status=$?
  [ $ctest_status -eq 0 ] || status_all=1
  say "- ctest: status $ctest_status in $(( $(now) - start )) s; $(grep -E 'tests passed' "$logs/ctest.log" | tail -1)"
  say "  - skipped: $(grep -c '(Skipped)' "$logs/ctest.log")"
  grep -E '^ *(cpu|gpu) +=' "$logs/ctest.log" | sed 's/^ */  - label /' >>"$summary"
  if grep -q "The following tests FAILED" "$logs/ctest.log"; then
    say "  - failed:"
    sed -n '/The following tests FAILED/,$p' "$logs/ctest.log" | grep -E '\((Failed|Timeout|Exception|SEGFAULT|Subprocess)' |
      head -40 | sed 's/^[[:space:]]*/    - /' >>"$summary"
  fi
  # Largest error against the float64 oracle per dtype, backend and quantity over the
  # GPU tests (each prints its ledger), with the test that reached it.
  say ""
  say "Largest errors of the GPU tests against the float64 oracle (dtype, backend, quantity):"
  say ""
  say '```'
  awk 'NR == FNR {
         if ($0 ~ /^[0-9]+: Test command: .*cuflash_gpu_tests/ && match($0, /--gtest_filter=[^" ]*/))
           name[$1 + 0] = substr($0, RSTART + 15, RLENGTH - 15)
         next
       }
       index($0, "[ cuflash ]   ") {
         test = $1 + 0
         if (!(test in name)) next
         line = $0; sub(/^.*\[ cuflash \] */, "", line)
         count = split(line, field, " "); value = field[count]
         key = substr(line, 1, length(line) - length(value)); sub(/ +$/, "", key)
         n = (value ~ /^[-+0-9.eE]+$/) ? value + 0 : 1e308
         if (!(key in worst) || n > worst[key]) { worst[key] = n; shown[key] = value; where[key] = name[test] }
       }
       END { for (k in worst) printf "%-32s %-10s %s\n", k, shown[k], where[k] }' \
    "$logs/ctest.log" "$logs/ctest.log" | sort >>"$summary"
  say '```'
  if grep -qF '[ note ]' "$logs/ctest.log"; then
    say ""
    say "Notes (views off 16-byte rows: refused or computed; cuDNN graph build against a cached call):"
    say ""
    grep -F '[ note ]' "$logs/ctest.log" | sed 's/^.*\[ note \] */- /' | sort -u >>"$summary"
  fi
  say ""
fi

if wants sm80fwd; then
  start=$(now)
  CUFLASH_SM90_FORWARD=0 "$build/tests/cuflash_gpu_tests" --gtest_filter='*CudaForward*' >"$logs/sm80-forward.log" 2>&1
  sm80_status=$?
  [ $sm80_status -eq 0 ] || status_all=1
  say "- CUDA forward tests with CUFLASH_SM90_FORWARD=0 (the sm80 kernel on this GPU): status $sm80_status in $(( $(now) - start )) s; $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]|^\[  SKIPPED \]' "$logs/sm80-forward.log" | head -3 | tr '\n' ' ')"
fi

for tool in memcheck racecheck; do
  wants $tool || continue
  command -v compute-sanitizer >/dev/null || say "- compute-sanitizer: not found on PATH"
  log=$logs/sanitizer-$tool.log
  filter=$sanitize_filter
  [ "$tool" = racecheck ] && filter=$racecheck_filter
  start=$(now)
  # No guard bytes around the test's tensors: memcheck then sees a read past any of them.
  CUFLASH_TEST_NO_GUARDS=1 timeout "${CUFLASH_SANITIZE_TIMEOUT:-300}" compute-sanitizer --tool "$tool" --error-exitcode 3 "$build/tests/cuflash_gpu_tests" \
    --gtest_filter="$filter" >"$log" 2>&1
  status=$?
  [ $status -eq 0 ] || status_all=1
  ran=$(grep -E '^\[==========\] [0-9]+ tests? from .* ran' "$log" | tail -1 | grep -oE '[0-9]+ tests?' | head -1)
  passed=$(grep -E '^\[  PASSED  \]' "$log" | grep -oE '[0-9]+' | head -1)
  failed=$(grep -E '^\[  FAILED  \] [0-9]+ tests?' "$log" | grep -oE '[0-9]+' | head -1)
  skipped=$(grep -E '^\[  SKIPPED \] [0-9]+ tests?' "$log" | grep -oE '[0-9]+' | head -1)
  result=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1 | sed 's/^=* *//')
  say "- compute-sanitizer $tool (filter '$filter'): status $status in $(( $(now) - start )) s;" \
    "${ran:-0 tests} ran, ${passed:-0} passed, ${failed:-0} failed, ${skipped:-0} skipped; ${result:-no summary line}"
  grep -E '^\[  FAILED  \] .*\.' "$log" | head -20 | sed 's/^\[  FAILED  \] /  - failed: /' >>"$summary"
done

if wants run; then
  "$build/bin/cuflash" run >"$logs/cuflash-run.log" 2>&1
  run_status=$?
  [ $run_status -eq 0 ] || status_all=1
  say "- cuflash run: status $run_status"
fi

cat "$summary"
exit $status_all
