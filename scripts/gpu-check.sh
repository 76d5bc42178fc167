#!/usr/bin/env bash
# Runs on the GPU machine, in one invocation: builds with all cores, runs the
# whole test suite (GPU tests included), the Hopper forward's other paths,
# compute-sanitizer's four tools side by side over a representative subset
# of the GPU tests, and `cuflash run`. Full logs go to build-gpu/logs
# (CUFLASH_BUILD_DIR/logs): build.log, ctest.log, sm80-forward.log,
# tma-walk.log, tma-store-off.log, sanitizer-<tool>.log, cuflash-run.log,
# sweep.log, and a concise summary, gpu-check-summary.md, also printed at
# the end; with $OUT set (the device tool), the summary and logs.tar.gz (all
# the logs) are copied there, two files of the eight that come back.
#   CUFLASH_COMMIT=$(git rev-parse --short HEAD) scripts/gpu-check.sh
# Knobs (environment):
#   CUFLASH_GPU_CHECK_STEPS  steps to run, default "build shards sm80fwd sm80bwd tma
#                            memcheck racecheck synccheck initcheck run"
#                            (shards: the whole suite, the GPU test binary
#                            cuflash_gpu_tests in CUFLASH_GPU_SHARDS processes
#                            (default nproc) split by gtest's sharding instead of a
#                            process per test, which costs ~2.5 s of CUDA start-up
#                            each; everything else through ctest -LE gpu, the
#                            ring's binary in one process; ctest, not in the
#                            default, runs the same tests a process each)
#                            (sm80fwd: the CUDA forward tests again with
#                            CUFLASH_SM90_FORWARD=0, so that on Hopper the sm80
#                            kernel, which the wgmma kernel replaces there for head
#                            dims 64/128/192/256, is tested too; sm80bwd: the CUDA
#                            backward tests again with CUFLASH_SM90_BACKWARD=0, the
#                            sm80 kernels where the TMA backward takes D = 128; tma: the TMA
#                            kernel's cases again with the persistent walk forced
#                            on every call, CUFLASH_TMA_PERSISTENT=1, and with the
#                            TMA store off, CUFLASH_TMA_STORE=0; sweep, not in the
#                            default: bench/prefill.py's forward points at D = 64,
#                            128, 256 with the peers, into logs.tar.gz)
#                            (e.g. "build" in one call, "ctest memcheck racecheck run"
#                            in the next, while the machine stays warm: build-gpu/
#                            is git-ignored, so the device tool keeps it)
#   CUFLASH_CTEST_ARGS       more ctest arguments, e.g. "-I 1,1950" then "-I 1951,": the
#                            whole suite through ctest takes 9-10 minutes on 16 cores
#                            (2026-11-28, 3868 tests: 185 + 392 s), longer than one
#                            device call's 600 s, so it runs in two calls (the logs of
#                            each call are its own); the `shards` step runs them in
#                            one (112 s on 16 cores, H200, 2026-11-29)
#   CUFLASH_GPU_SHARDS       processes of the shards step (default nproc)
#   CUFLASH_SANITIZE_FILTER  gtest filter of the sanitizer runs, default
#                            "Sanitize*:*MergeStatesGpu*:HopperTma/*" (the sanitizers
#                            run with the TMA walk forced, so that the TMA cases
#                            run every TMA kernel both ways): the tests named Sanitize*
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
#                            still runs them; synccheck and initcheck take this
#                            filter too (our kernels)
#   CUFLASH_SANITIZE_TIMEOUT seconds per sanitizer run, default 300 (the tools run
#                            side by side, so this bounds the step)
#   CUFLASH_BUILD_DIR        build directory, default build-gpu
#   CUFLASH_GPU_CHECK_WITHOUT_CUDNN  1: build without .deps/cudnn-frontend (no cuDNN backend,
#                            its tests skip); else a `build` step without it stops at once
# GoogleTest: the system's if installed, else the sources carried in .deps/googletest;
# the cuDNN backend: the frontend headers carried in .deps/cudnn-frontend and
# PyTorch's cuDNN (cmake/cudnn.cmake finds /opt/torch/.venv's wheel first)
# (scripts/stage-gpu-deps.sh puts both in .deps/; pass carry [".deps"]).
set -uo pipefail
cd "$(dirname "$0")/.."
steps=" ${CUFLASH_GPU_CHECK_STEPS:-build shards sm80fwd sm80bwd tma memcheck racecheck synccheck initcheck run} "
wants() { [[ $steps == *" $1 "* ]]; }
# A build without the cuDNN frontend's headers has no cuDNN backend, and
# every cuDNN test then skips: said before any device time goes into it
# (CUFLASH_GPU_CHECK_WITHOUT_CUDNN=1 builds without it on purpose).
if wants build && [ ! -d .deps/cudnn-frontend/include ] &&
   [ "${CUFLASH_GPU_CHECK_WITHOUT_CUDNN:-0}" != 1 ]; then
  echo "gpu-check: no .deps/cudnn-frontend here: carry [\".deps\"] (scripts/fetch-cudnn-frontend.sh fills it), or set CUFLASH_GPU_CHECK_WITHOUT_CUDNN=1" >&2
  exit 2
fi
build=${CUFLASH_BUILD_DIR:-build-gpu}
logs=$build/logs
rm -rf "$logs"
mkdir -p "$logs"
summary=$logs/gpu-check-summary.md
sanitize_filter=${CUFLASH_SANITIZE_FILTER:-'Sanitize*:*MergeStatesGpu*:HopperTma/*'}
racecheck_filter=${CUFLASH_RACECHECK_FILTER:-"$sanitize_filter-*Cudnn*"}
export PATH=/usr/local/cuda/bin:$PATH
gtest_args=()
[ -d .deps/googletest ] && gtest_args=(-DCUFLASH_GTEST_SOURCE="$PWD/.deps/googletest")

say() { echo "$*" >>"$summary"; }
now() { date +%s; }
status_all=0
# The summary and every log, to $OUT where the device tool collects them.
finish() {
  cat "$summary"
  if [ -n "${OUT:-}" ]; then
    cp "$summary" "$OUT/"
    tar -czf "$OUT/logs.tar.gz" -C "$logs" .
  fi
  exit "$1"
}
# gtest's totals of a log: "N passed, M failed, K skipped".
totals() {
  local passed failed skipped
  passed=$(grep -E '^\[  PASSED  \]' "$1" | grep -oE '[0-9]+' | head -1)
  failed=$(grep -E '^\[  FAILED  \] [0-9]+ tests?' "$1" | grep -oE '[0-9]+' | head -1)
  skipped=$(grep -E '^\[  SKIPPED \] [0-9]+ tests?' "$1" | grep -oE '[0-9]+' | head -1)
  echo "${passed:-0} passed, ${failed:-0} failed, ${skipped:-0} skipped"
}
# One run of the GPU tests: gpu_tests LOG "WHAT" [ENV=VALUE ...] FILTER.
gpu_tests() {
  local log=$logs/$1 what=$2 start status filter settings
  shift 2
  filter=${!#}
  settings=("${@:1:$#-1}")
  start=$(now)
  env "${settings[@]}" "$build/tests/cuflash_gpu_tests" --gtest_filter="$filter" >"$log" 2>&1
  status=$?
  [ $status -eq 0 ] || status_all=1
  say "- $what: status $status in $(( $(now) - start )) s; $(totals "$log")"
  grep -E '^\[  FAILED  \] .*\.' "$log" | head -20 | sed 's/^\[  FAILED  \] /  - failed: /' >>"$summary"
}

# The tests ctest.log lists as failed, into the summary.
ctest_failures() {
  if grep -q "The following tests FAILED" "$logs/ctest.log"; then
    say "  - failed:"
    sed -n '/The following tests FAILED/,$p' "$logs/ctest.log" | grep -E '\((Failed|Timeout|Exception|SEGFAULT|Subprocess)' |
      head -40 | sed 's/^[[:space:]]*/    - /' >>"$summary"
  fi
}

# The largest error against the float64 oracle per dtype, backend and
# quantity over the GPU tests' logs, with the test that reached it (each test
# binary prints its ledger, "[ cuflash ]   <key> <value> <test>", at exit;
# in ctest's log, whose lines carry their test's number, only the GPU test
# binaries' count, as in a shard's log), then the tests' notes, into the
# summary.
ledger_and_notes() {
  local existing=() f
  for f in "$@"; do [ -f "$f" ] && existing+=("$f"); done
  set -- "${existing[@]}"
  say ""
  say "Largest errors of the GPU tests against the float64 oracle (dtype, backend, quantity):"
  say ""
  say '```'
  awk '/^[0-9]+: Test command: / { if ($0 ~ /cuflash_(ring_)?gpu_tests/) gpu[FILENAME, $1 + 0] = 1 }
       index($0, "[ cuflash ]   ") {
         if ($0 ~ /^[0-9]+: / && !((FILENAME, $1 + 0) in gpu)) next
         line = $0; sub(/^.*\[ cuflash \] */, "", line)
         count = split(line, field, " ")
         if (count < 3) next
         test = field[count]; value = field[count - 1]
         key = line; sub(/ +[^ ]+ +[^ ]+ *$/, "", key)
         n = (value ~ /^[-+0-9.eE]+$/) ? value + 0 : 1e308
         if (!(key in worst) || n > worst[key]) { worst[key] = n; shown[key] = value; where[key] = test }
       }
       END { for (k in worst) printf "%-32s %-10s %s\n", k, shown[k], where[k] }' "$@" | sort >>"$summary"
  say '```'
  if grep -qF '[ note ]' "$@"; then
    say ""
    say "Notes (views off 16-byte rows: refused or computed; cuDNN graph build against a cached call):"
    say ""
    grep -hF '[ note ]' "$@" | sed 's/^.*\[ note \] */- /' | sort -u >>"$summary"
  fi
  say ""
}

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
  # The GPU machine has no network: the frontend headers travel with the
  # call (.deps/ is git-ignored). Without them every cuDNN test skips.
  if grep -q 'cuflash: cuDNN backend OFF' "$logs/build.log" && [ ! -d .deps/cudnn-frontend/include ]; then
    say "  - no .deps/cudnn-frontend here: run the call with carry [\".deps\"] (scripts/fetch-cudnn-frontend.sh fills it) for the cuDNN backend and its tests"
  fi
  if [ $build_status -ne 0 ]; then
    say ""
    say '```'
    tail -30 "$logs/build.log" >>"$summary"
    say '```'
    finish 1
  fi
fi

if wants ctest; then
  # -V keeps every test's output: the error ledgers ("[ cuflash ]" lines) and notes below come from it.
  start=$(now)
  # shellcheck disable=SC2086 # (the extra arguments are words)
  ctest --test-dir "$build" -V --output-on-failure --timeout 600 -j "$(nproc)" ${CUFLASH_CTEST_ARGS:-} >"$logs/ctest.log" 2>&1
  ctest_status=$?
  [ $ctest_status -eq 0 ] || status_all=1
  say "- ctest: status $ctest_status in $(( $(now) - start )) s; $(grep -E 'tests passed' "$logs/ctest.log" | tail -1)"
  say "  - skipped: $(grep -c '(Skipped)' "$logs/ctest.log")"
  grep -E '^ *(cpu|gpu) +=' "$logs/ctest.log" | sed 's/^ */  - label /' >>"$summary"
  ctest_failures
  ledger_and_notes "$logs/ctest.log"
fi

if wants shards; then
  # The same tests in far fewer processes: the GPU test binaries (ctest's
  # label gpu) run by gtest itself, cuflash_gpu_tests in CUFLASH_GPU_SHARDS
  # processes that split its tests (gtest's sharding) side by side, the
  # ring's binary in one; everything else through ctest. A process per test
  # costs ~2.5 s of CUDA start-up (2700 GPU tests: most of ctest's 9-10
  # minutes on 16 cores, NOTES.md session 27); a shard pays it once.
  start=$(now)
  # shellcheck disable=SC2086 # (the extra arguments are words)
  ctest --test-dir "$build" -V --output-on-failure --timeout 600 -j "$(nproc)" -LE gpu ${CUFLASH_CTEST_ARGS:-} \
    >"$logs/ctest.log" 2>&1
  ctest_status=$?
  [ $ctest_status -eq 0 ] || status_all=1
  say "- ctest (all but the GPU test binaries): status $ctest_status in $(( $(now) - start )) s; $(grep -E 'tests passed' "$logs/ctest.log" | tail -1)"
  say "  - skipped: $(grep -c '(Skipped)' "$logs/ctest.log")"
  ctest_failures
  if [ -x "$build/tests/cuflash_ring_gpu_tests" ]; then
    start=$(now)
    "$build/tests/cuflash_ring_gpu_tests" >"$logs/ring.log" 2>&1
    status=$?
    [ $status -eq 0 ] || status_all=1
    say "- cuflash_ring_gpu_tests (one process): status $status in $(( $(now) - start )) s; $(totals "$logs/ring.log")"
    grep -E '^\[  FAILED  \] .*\.' "$logs/ring.log" | head -20 | sed 's/^\[  FAILED  \] /  - failed: /' >>"$summary"
  fi
  start=$(now)
  shards=${CUFLASH_GPU_SHARDS:-$(nproc)}
  pids=()
  for ((i = 0; i < shards; i++)); do
    GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i "$build/tests/cuflash_gpu_tests" >"$logs/shard-$i.log" 2>&1 &
    pids+=($!)
  done
  shard_status=0
  for pid in "${pids[@]}"; do wait "$pid" || shard_status=1; done
  [ $shard_status -eq 0 ] || status_all=1
  passed=0 failed=0 skipped=0
  for ((i = 0; i < shards; i++)); do
    read -r p _ f _ k _ <<<"$(totals "$logs/shard-$i.log" | tr -d ,)"
    passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + k))
    # A shard that died (a crash, the device lost) prints no totals: say so.
    grep -qE '^\[==========\] [0-9]+ tests? from .* ran' "$logs/shard-$i.log" || say "  - shard $i did not finish: $(tail -1 "$logs/shard-$i.log")"
  done
  say "- cuflash_gpu_tests in $shards shards: status $shard_status in $(( $(now) - start )) s; $passed passed, $failed failed, $skipped skipped"
  grep -hE '^\[  FAILED  \] .*\.' "$logs"/shard-*.log | sort -u | head -40 | sed 's/^\[  FAILED  \] /  - failed: /' >>"$summary"
  ledger_and_notes "$logs/ctest.log" "$logs"/shard-*.log "$logs"/ring.log
fi

if wants sm80fwd; then
  gpu_tests sm80-forward.log "CUDA forward tests with CUFLASH_SM90_FORWARD=0 (the sm80 kernel on this GPU)" \
    CUFLASH_SM90_FORWARD=0 '*CudaForward*'
fi

if wants sm80bwd; then
  gpu_tests sm80-backward.log "CUDA backward tests with CUFLASH_SM90_BACKWARD=0 (the sm80 kernels on this GPU)" \
    CUFLASH_SM90_BACKWARD=0 '*CudaBackward*'
fi

if wants tma; then
  gpu_tests tma-walk.log "TMA forward cases with the persistent walk forced (CUFLASH_TMA_PERSISTENT=1)" \
    CUFLASH_TMA_PERSISTENT=1 'HopperTma/*'
  gpu_tests tma-store-off.log "TMA forward and varlen cases with the TMA store off (CUFLASH_TMA_STORE=0)" \
    CUFLASH_TMA_STORE=0 'HopperTma/*:Varlen/CudaForward.*'
fi

# The sanitizers chosen run side by side (each on its own process; the GPU
# has room for all four), with the TMA walk forced.
sanitizers=()
for tool in memcheck racecheck synccheck initcheck; do wants $tool && sanitizers+=("$tool"); done
if [ ${#sanitizers[@]} -gt 0 ]; then
  command -v compute-sanitizer >/dev/null || say "- compute-sanitizer: not found on PATH"
  start=$(now)
  pids=()
  for tool in "${sanitizers[@]}"; do
    filter=$sanitize_filter
    [ "$tool" = memcheck ] || filter=$racecheck_filter
    # No guard bytes around the test's tensors: memcheck then sees a read past any of them.
    CUFLASH_TMA_PERSISTENT=1 CUFLASH_TEST_NO_GUARDS=1 timeout "${CUFLASH_SANITIZE_TIMEOUT:-300}" \
      compute-sanitizer --tool "$tool" --error-exitcode 3 "$build/tests/cuflash_gpu_tests" \
      --gtest_filter="$filter" >"$logs/sanitizer-$tool.log" 2>&1 &
    pids+=($!)
  done
  i=0
  for tool in "${sanitizers[@]}"; do
    # (each pid by name: a bare `wait` would also wait on a caller's process substitution)
    wait "${pids[$i]}"
    status=$?
    i=$((i + 1))
    [ $status -eq 0 ] || status_all=1
    log=$logs/sanitizer-$tool.log
    filter=$sanitize_filter
    [ "$tool" = memcheck ] || filter=$racecheck_filter
    result=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1 | sed 's/^=* *//')
    say "- compute-sanitizer $tool (filter '$filter', walk forced): status $status; $(totals "$log"); ${result:-no summary line}"
    grep -E '^\[  FAILED  \] .*\.' "$log" | head -20 | sed 's/^\[  FAILED  \] /  - failed: /' >>"$summary"
  done
  say "  - the sanitizers side by side: $(( $(now) - start )) s"
fi

if wants run; then
  "$build/bin/cuflash" run >"$logs/cuflash-run.log" 2>&1
  run_status=$?
  [ $run_status -eq 0 ] || status_all=1
  say "- cuflash run: status $run_status"
fi

if wants sweep; then
  start=$(now)
  python3 bench/prefill.py --cuflash "$build/bin/cuflash" --commit "${CUFLASH_COMMIT:-unknown}" --passes fwd \
    --head-dims 64,128,256 --seqlens 512,1024,2048,16384 --backends cuflash_cuda,cuflash_cudnn,torch_cudnn \
    --out-dir "$logs" >"$logs/sweep.log" 2>&1
  status=$?
  [ $status -eq 0 ] || status_all=1
  say "- forward sweep: status $status in $(( $(now) - start )) s (prefill.md and prefill.json in logs.tar.gz)"
fi

finish $status_all
