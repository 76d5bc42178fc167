#!/usr/bin/env bash
# Ring attention on a machine of W GPUs (no network), in one call: build, the
# ring tests, the benchmark at W=1 and at W, the merged report.
#
#   here:        scripts/stage-python-wheels.sh; scripts/stage-gpu-deps.sh   (.whl/, .deps/)
#   GPU machine: CUFLASH_COMMIT=<sha> bench/ring-multigpu.sh [W] [--quick]  (carry [".whl", ".deps"])
#
# W: the GPUs to use (default: all that nvidia-smi lists). --quick fits one
# 10-minute call with the build: the library and any dedicated ring test
# binaries only (the big GPU test binary is skipped), weak scaling at 8k and
# 32k tokens per GPU, exactly 10 timed calls per point, and every benchmark run
# under a time budget (points that would not fit are recorded as skipped).
#
# 1. The library (CMake, Ninja, Release, CUDA ${CUDA_ARCHS:-90a-real}, all
#    cores; /usr/bin/g++ for C++ and CUDA's host compiler, as
#    scripts/gpu-python.sh says why) into $CUFLASH_BUILD_DIR (build-ring/),
#    then the Python package with pip from the carried wheels
#    (--no-index --no-build-isolation --target), reusing that libcuflash.so
#    (CUFLASH_PREBUILT_LIBRARY; compiled afresh if that fails).
# 2. The ring tests at W=2 (and 4 when there are 4 GPUs; 1 on a one-GPU machine): tests/python/test_ring.py
#    (pytest) and `ctest -R Ring` (C++), each with CUDA_VISIBLE_DEVICES naming
#    that many GPUs.
# 3. torchrun --nproc_per_node W, then --nproc_per_node 1, of bench/ring.py,
#    then `bench/ring.py --merge` of both into $OUT (else docs/perf):
#    ring.json, ring.md, ring.png.
# Logs in $OUT (else build-ring/logs): ring-summary.md (also printed),
# ring-build.log, ring-pip.log, ring-pytest-w*.log, ring-ctest-w*.log,
# ring-bench-w*.log, the runs' own reports in ring-w*/, topo.txt.
# NCCL's NVLink multicast is left as the machine sets it (NCCL_NVLS_ENABLE=0
# there); nothing here turns it on.
# Knobs: PYTHON (python3), CUDA_ARCHS (90a-real), CUFLASH_BUILD_DIR (build-ring),
# CUFLASH_RING_BUDGET_S (seconds for the whole script, default 570 with --quick,
# else 3600), CUFLASH_RING_BENCH_ARGS (extra arguments for both bench runs).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
started=$(date +%s)
now() { date +%s; }

quick=0
world=
for arg in "$@"; do
  case $arg in
    --quick) quick=1 ;;
    ''|*[!0-9]*) echo "ring-multigpu: unknown argument '$arg' (usage: bench/ring-multigpu.sh [W] [--quick])" >&2; exit 2 ;;
    *) world=$arg ;;
  esac
done
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
world=${world:-$gpus}
if [ "${world:-0}" -lt 1 ] || [ "$world" -gt "$gpus" ]; then
  echo "ring-multigpu: W=$world but nvidia-smi lists $gpus GPUs" >&2
  exit 2
fi
budget=${CUFLASH_RING_BUDGET_S:-$([ $quick -eq 1 ] && echo 570 || echo 3600)}
deadline=$((started + budget))
left() { echo $((deadline - $(now))); }

python=${PYTHON:-python3}
build=${CUFLASH_BUILD_DIR:-build-ring}
logs=${OUT:-$build/logs}
report_dir=${OUT:-docs/perf}
commit=${CUFLASH_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
mkdir -p "$build" "$logs" "$report_dir"
build=$(cd "$build" && pwd)
site=$build/site
export PATH=/usr/local/cuda/bin:$PATH
# The library is loaded into a Python process whose libstdc++ is the system's (scripts/gpu-python.sh).
export CXX=/usr/bin/g++ CC=/usr/bin/gcc CUDAHOSTCXX=/usr/bin/g++
summary=$logs/ring-summary.md
say() { echo "$*" >>"$summary"; }
quick_flag=()
[ $quick -eq 1 ] && quick_flag=(--quick)

: >"$summary"
say "# Ring attention on $world GPUs"
say ""
say "- date: $(date -u +%Y-%m-%dT%H:%MZ); commit: $commit; mode: $([ $quick -eq 1 ] && echo quick || echo full); budget ${budget} s"
say "- GPUs: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sort | uniq -c | sed 's/^ *//' | tr '\n' ';')"
say "- cores: $(nproc); nvcc: $(nvcc --version 2>/dev/null | tail -1)"
say "- python: $("$python" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "NCCL", ".".join(map(str, torch.cuda.nccl.version())))' 2>&1 | tail -1)"
say "- NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE-unset} TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST-unset} NVSHMEM_DISABLE_NVLS=${NVSHMEM_DISABLE_NVLS-unset} (left as set)"
nvidia-smi topo -m >"$logs/topo.txt" 2>&1 || true

# ---- 1. build ----
start=$(now)
gtest_args=()
[ -d .deps/googletest ] && gtest_args=(-DCUFLASH_GTEST_SOURCE="$PWD/.deps/googletest")
configure() {
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-90a-real}" \
    -DCUFLASH_BUILD_TOOLS=OFF "$@"
}
tests=ON
{ configure -DCUFLASH_BUILD_TESTS=ON "${gtest_args[@]}" ||
    { echo "ring-multigpu: configure with tests failed; again without them"; tests=OFF; configure -DCUFLASH_BUILD_TESTS=OFF; }
} >"$logs/ring-build.log" 2>&1
configure_status=$?
# Quick: the library and the executables named after the ring; full: everything.
targets=(cuflash)
if [ $quick -eq 1 ] && [ $tests = ON ]; then
  while read -r target; do targets+=("$target"); done < <(ninja -C "$build" -t targets all 2>/dev/null |
    sed -n 's/^\([A-Za-z0-9_.-]*\): phony$/\1/p' | grep -E '(^|[_.-])[Rr]ing([_.-]|$)' | sort -u)
  build_args=(--target "${targets[@]}")
else
  build_args=()
fi
if [ $configure_status -eq 0 ]; then
  cmake --build "$build" -j "$(nproc)" "${build_args[@]}" >>"$logs/ring-build.log" 2>&1
  build_status=$?
else
  build_status=$configure_status
fi
say "- build ($build, tests $tests, targets: ${build_args[*]:-all}): status $build_status in $(( $(now) - start )) s;" \
  "$(grep -h -i -E 'cuflash: (CUDA|cuDNN|NCCL|ring)' "$logs/ring-build.log" | sed 's/^-- //' | tr '\n' ';')"
library=$build/src/libcuflash.so
if [ $build_status -ne 0 ] || [ ! -e "$library" ]; then
  say ""
  say '```'
  tail -30 "$logs/ring-build.log" >>"$summary"
  say '```'
  cat "$summary"
  exit 1
fi

start=$(now)
deps=$build/build-deps
rm -rf "$deps" "$site"
include=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
header_args=()
if [ ! -f "$include/Python.h" ] && [ -f ".whl/python$version-include/Python.h" ]; then
  header_args=(--config-settings=cmake.define.Python_INCLUDE_DIR="$PWD/.whl/python$version-include")
fi
pip_package() {
  PYTHONPATH=$deps "$python" -m pip install -v --no-index --no-deps --no-build-isolation --disable-pip-version-check \
    --target "$site" --config-settings=cmake.define.CMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-90a-real}" \
    "${header_args[@]}" .
}
{
  "$python" -m pip install --no-index --no-deps --no-compile --disable-pip-version-check --target "$deps" .whl/*.whl &&
    { CUFLASH_PREBUILT_LIBRARY=$library pip_package ||
        { echo "ring-multigpu: the package with the prebuilt library failed; compiling its own"; rm -rf "$site";
          CUFLASH_PREBUILT_LIBRARY='' pip_package; }; }
} >"$logs/ring-pip.log" 2>&1
pip_status=$?
export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
say "- Python package (pip --target $site): status $pip_status in $(( $(now) - start )) s;" \
  "$(grep -c 'compiling its own' "$logs/ring-pip.log" | sed 's/^0$/prebuilt library/; s/^[1-9].*/compiled its own library/')"
say "- cuflash: $("$python" -c 'import cuflash, cuflash.distributed as d; from cuflash import _ext; print(cuflash.__version__, "cuda:", cuflash.backend_available("cuda"), "ring_step_calls:", hasattr(_ext, "ring_step_calls"))' 2>&1 | tail -1)"
if [ $pip_status -ne 0 ]; then
  say ""
  say '```'
  tail -30 "$logs/ring-pip.log" >>"$summary"
  say '```'
  cat "$summary"
  exit 1
fi

# ---- 2. ring tests ----
status_all=0
visible() { seq -s, 0 $(($1 - 1)); }
test_worlds=()
[ "$world" -eq 1 ] && test_worlds+=(1)
[ "$world" -ge 2 ] && test_worlds+=(2)
[ "$world" -ge 4 ] && test_worlds+=(4)
# Each test run gets a quarter of what is left (60..300 s): the benchmark needs the rest.
test_timeout() { local t=$(( $(left) / 4 )); [ $t -gt 300 ] && t=300; [ $t -lt 60 ] && t=60; echo $t; }
for w in "${test_worlds[@]}"; do
  if [ -f tests/python/test_ring.py ]; then
    start=$(now)
    CUDA_VISIBLE_DEVICES=$(visible "$w") timeout "$(test_timeout)" "$python" -m pytest -p no:cacheprovider -q -rs \
      tests/python/test_ring.py >"$logs/ring-pytest-w$w.log" 2>&1
    status=$?
    [ $status -eq 0 ] || status_all=1
    say "- pytest tests/python/test_ring.py, $w GPUs visible: status $status in $(( $(now) - start )) s: $(tail -1 "$logs/ring-pytest-w$w.log")"
  else
    say "- tests/python/test_ring.py: not in this tree"
  fi
  if [ $tests = ON ]; then
    start=$(now)
    CUDA_VISIBLE_DEVICES=$(visible "$w") timeout "$(test_timeout)" ctest --test-dir "$build" -R Ring --output-on-failure \
      >"$logs/ring-ctest-w$w.log" 2>&1
    status=$?
    if grep -q "No tests were found" "$logs/ring-ctest-w$w.log"; then
      say "- ctest -R Ring: no C++ ring test registered$([ $quick -eq 1 ] && echo ' among the targets built with --quick (the GPU test binary is not built)')"
    else
      [ $status -eq 0 ] || status_all=1
      say "- ctest -R Ring, $w GPUs visible: status $status in $(( $(now) - start )) s: $(grep -E 'tests passed' "$logs/ring-ctest-w$w.log" | tail -1)"
    fi
  fi
done

# ---- 3. the benchmark: W, then 1, then the merge ----
runs=("$world")
[ "$world" -gt 1 ] && runs+=(1)
jsons=()
for n in "${runs[@]}"; do
  # The W run gets 60% of what is left (the W=1 run follows), the last run all of it, less a minute for the merge.
  remaining=$(( $(left) - 60 ))
  [ "$n" = "${runs[-1]}" ] || remaining=$(( remaining * 60 / 100 ))
  if [ $remaining -lt 60 ]; then
    say "- bench W=$n: not run, $remaining s left of the budget"
    continue
  fi
  start=$(now)
  # shellcheck disable=SC2086
  timeout --kill-after=20 "$remaining" "$python" -m torch.distributed.run --standalone --nproc_per_node "$n" \
    bench/ring.py --out-dir "$logs/ring-w$n" --commit "$commit" "${quick_flag[@]}" \
    --budget-s $((remaining - 20)) ${CUFLASH_RING_BENCH_ARGS:-} >"$logs/ring-bench-w$n.log" 2>&1
  status=$?
  [ $status -eq 0 ] || status_all=1
  say "- bench W=$n (torchrun, budget $((remaining - 20)) s): status $status in $(( $(now) - start )) s$([ $status -eq 124 ] && echo ' (timed out; the report has the points done)')"
  [ -f "$logs/ring-w$n/ring.json" ] && jsons+=("$logs/ring-w$n/ring.json")
done
if [ ${#jsons[@]} -gt 0 ]; then
  "$python" bench/ring.py --merge "${jsons[@]}" --out-dir "$report_dir" >>"$logs/ring-merge.log" 2>&1
  say "- merged ${jsons[*]} into $report_dir/ring.{json,md,png}: status $?"
fi

say ""
say "Correctness checks and points (rank 0's lines):"
say ""
say '```'
for n in "${runs[@]}"; do
  [ -f "$logs/ring-bench-w$n.log" ] && grep -E '^ring: (check|W=)' "$logs/ring-bench-w$n.log" | cut -c1-400 >>"$summary"
done
say '```'
cat "$summary"
exit $status_all
