#!/usr/bin/env bash
# A change against its base on the GPU machine, in one device call: the
# `cuflash` command built from the base (a `git archive` staged here), from
# the working tree and from any extra changes staged beside them, side by
# side with all cores, optionally a ctest selection on the working tree's
# build, then bench/ab.py (alternating rounds of the builds on the same
# prefill points, PyTorch SDPA's cuDNN in the same run).
#   here:  bench/ab.sh --stage [REF]         # .ab/base.tar (REF: HEAD) and .ab/base-commit
#          bench/ab.sh --stage-extra REF     # optional, repeatable: .ab/extra/<REF>.tar, another
#                                            # change timed against the same base (a branch, say)
#          (the device call then carries [".ab", ".deps"]; .deps from scripts/stage-gpu-deps.sh)
#   there: AB_TESTS='HopperTma|Sanitize' bench/ab.sh [bench/ab.py flags...]
# Environment: AB_TESTS, a ctest -R regex run on the working tree's build
# after the timing (empty: no tests, and no test build); AB_DIR, where the
# builds go (default /root/ab, outside the tree, so that a warm machine keeps
# them between calls). Results go to $OUT (else $AB_DIR/out): ab.md and
# ab.json, and the logs, written there as they grow (so that a call cut off
# at its time limit still brings back what ran): ab-logs/build-base.log,
# build-change.log, ab.log, ctest.log. The timing runs before the tests, so
# that a call short of time keeps the numbers; a failing test makes them
# void, and the exit code says so.
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--stage" ]; then
  ref=${2:-HEAD}
  mkdir -p .ab
  git archive --format=tar -o .ab/base.tar "$ref"
  git rev-parse --short "$ref" >.ab/base-commit
  rm -rf .ab/extra  # a new base starts a new comparison
  echo "staged $(cat .ab/base-commit) in .ab/base.tar ($(du -h .ab/base.tar | cut -f1)); carry [\".ab\", \".deps\"]"
  exit 0
fi
if [ "${1:-}" = "--stage-extra" ]; then
  ref=${2:?"--stage-extra: which ref?"}
  name=$(printf '%s' "$ref" | tr -c 'A-Za-z0-9._-' '_')
  mkdir -p .ab/extra
  git archive --format=tar -o ".ab/extra/$name.tar" "$ref"
  echo "$ref $(git rev-parse --short "$ref")" >".ab/extra/$name.label"
  echo "staged $(cat ".ab/extra/$name.label") in .ab/extra/$name.tar"
  exit 0
fi

[ -f .ab/base.tar ] || { echo "ab.sh: no .ab/base.tar: run bench/ab.sh --stage here first" >&2; exit 2; }
dir=${AB_DIR:-/root/ab}
out=${OUT:-$dir/out}
logs=$out/ab-logs
mkdir -p "$dir/base-src" "$out" "$logs"
export PATH=/usr/local/cuda/bin:$PATH
tar -xf .ab/base.tar -C "$dir/base-src"
base_commit=$(cat .ab/base-commit 2>/dev/null || echo base)
gtest=()
[ -d .deps/googletest ] && gtest=(-DCUFLASH_GTEST_SOURCE="$PWD/.deps/googletest")

# Backend cuda only: the cuDNN backend and the NCCL ring are not what is
# compared, and leaving them out shortens both builds.
configure() {  # <source> <build> <tests ON|OFF>
  cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a-real \
    -DCUFLASH_ENABLE_CUDNN=OFF -DCUFLASH_ENABLE_NCCL=OFF -DCUFLASH_BUILD_TESTS="$3" "${gtest[@]}"
}
tests=OFF targets=(cuflash_cli)
[ -n "${AB_TESTS:-}" ] && tests=ON targets+=(cuflash_gpu_tests)
start=$(date +%s)
# Both builds at once: the CPU work is the same, and neither waits on the other's serial tail.
(configure "$dir/base-src" "$dir/base-build" OFF && cmake --build "$dir/base-build" -j "$(nproc)" \
  --target cuflash_cli) >"$logs/build-base.log" 2>&1 &
base_pid=$!
extra_names=() extra_pids=()
for tarball in .ab/extra/*.tar; do
  [ -e "$tarball" ] || continue
  name=$(basename "$tarball" .tar)
  rm -rf "$dir/extra-$name-src" && mkdir -p "$dir/extra-$name-src" && tar -xf "$tarball" -C "$dir/extra-$name-src"
  (configure "$dir/extra-$name-src" "$dir/extra-$name-build" OFF && cmake --build "$dir/extra-$name-build" \
    -j "$(nproc)" --target cuflash_cli) >"$logs/build-extra-$name.log" 2>&1 &
  extra_names+=("$name") extra_pids+=($!)
done
(configure . "$dir/change-build" "$tests" && cmake --build "$dir/change-build" -j "$(nproc)" \
  --target "${targets[@]}") >"$logs/build-change.log" 2>&1
change_status=$?
wait $base_pid
base_status=$?
echo "ab.sh: builds in $(( $(date +%s) - start )) s (base status $base_status, change status $change_status)"
for build in base change; do
  status_var=${build}_status
  if [ "${!status_var}" -ne 0 ]; then
    echo "ab.sh: the $build build failed:"
    tail -30 "$logs/build-$build.log"
    exit 1
  fi
done
extra_flags=()
for i in "${!extra_names[@]}"; do
  name=${extra_names[$i]}
  if ! wait "${extra_pids[$i]}"; then
    echo "ab.sh: the extra build $name failed:"
    tail -30 "$logs/build-extra-$name.log"
    exit 1
  fi
  extra_flags+=(--change "$dir/extra-$name-build/bin/cuflash" --label-change "$(cat ".ab/extra/$name.label")")
done

status=0
PYTHONUNBUFFERED=1 python3 bench/ab.py --base "$dir/base-build/bin/cuflash" --change "$dir/change-build/bin/cuflash" \
  --label-base "$base_commit" --label-change "working tree on $base_commit" "${extra_flags[@]}" --out-dir "$out" "$@" \
  2>"$logs/ab.log" || status=1
if [ -n "${AB_TESTS:-}" ]; then
  start=$(date +%s)
  ctest --test-dir "$dir/change-build" -j "$(nproc)" -R "$AB_TESTS" --timeout 120 --output-on-failure \
    >"$logs/ctest.log" 2>&1 || status=1
  echo "ab.sh: ctest -R '$AB_TESTS' in $(( $(date +%s) - start )) s: $(grep -E 'tests passed|tests failed' "$logs/ctest.log")"
  grep -E '^\s*[0-9]+ - .*\((Failed|Timeout|SEGFAULT|Subprocess aborted)\)' "$logs/ctest.log" | head -20
fi
exit "$status"
