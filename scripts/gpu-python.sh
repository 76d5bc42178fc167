#!/usr/bin/env bash
# Runs on the GPU machine (no network; torch in its python3): builds the Python
# package offline and runs tests/python there, torch GPU tests included —
# forward and backward (autograd) of dense, varlen and KV-cache calls against
# PyTorch SDPA's math backend in float64, torch.compile with no graph break,
# flash-attn's README usage through `import cuflash as flash_attn`.
#
#   here:        scripts/stage-python-wheels.sh        (nanobind, scikit-build-core into .whl/)
#   GPU machine: CUFLASH_COMMIT=<sha> scripts/gpu-python.sh   (device call with carry [".whl"])
#
# The package is built with pip --no-build-isolation from the carried wheels
# into a target folder put on PYTHONPATH (a venv made from python3 would not
# see its torch). Logs in $OUT (or build-python-gpu/logs): python-gpu.md (the
# summary, also printed), python-build.log, python-pytest.log, python-errors.jsonl.
# Knobs: PYTHON (default python3), CUDA_ARCHS (default 90a-real),
# CUFLASH_PYTEST_ARGS (extra pytest arguments, e.g. "-k gpu").
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
python=${PYTHON:-python3}
logs=${OUT:-build-python-gpu/logs}
work=${CUFLASH_GPU_PYTHON_DIR:-build-python-gpu}
mkdir -p "$logs" "$work"
export PATH=/usr/local/cuda/bin:$PATH
# The package is loaded into a Python process whose libstdc++ is the
# system's (torch brings it in). The GPU image sets CXX to /opt/gcc/bin/g++, a
# compiler whose libstdc++ code then ends up inside libcuflash.so beside the
# process's own copy: the two disagree on std::locale's facet ids, and the
# cuDNN frontend's first ostream write crashed (SIGSEGV in
# cudnn_frontend::...::check_support_at_index -> basic_ostream::_M_insert;
# docs/perf/NOTES.md, Python path). Built with the system compiler, the
# library uses the one libstdc++ of the process.
export CXX=${CUFLASH_PY_CXX:-/usr/bin/g++} CC=${CUFLASH_PY_CC:-/usr/bin/gcc} CUDAHOSTCXX=${CUFLASH_PY_CXX:-/usr/bin/g++}
summary=$logs/python-gpu.md
say() { echo "$*" >>"$summary"; }
now() { date +%s; }

: >"$summary"
say "# Python package on the GPU"
say ""
say "- date: $(date -u +%Y-%m-%dT%H:%MZ)"
say "- commit: ${CUFLASH_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
say "- device: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"
say "- nvcc: $(nvcc --version 2>/dev/null | tail -1)"
say "- python: $("$python" -c 'import sys; print(sys.version.split()[0], sys.executable)' 2>&1)"
say "- torch: $("$python" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)' 2>&1 | tail -1)"

# Build requirements from the carried wheels, then the package, offline.
deps=$work/build-deps
site=$work/site
rm -rf "$deps" "$site"
# Python.h for the module: the interpreter's own, else the headers staged in .whl/.
include=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
header_args=()
if [ ! -f "$include/Python.h" ] && [ -f ".whl/python$version-include/Python.h" ]; then
  header_args=(--config-settings=cmake.define.Python_INCLUDE_DIR="$PWD/.whl/python$version-include")
  say "- Python.h: not in $include; using the staged .whl/python$version-include"
fi
start=$(now)
{
  "$python" -m pip install --no-index --no-deps --no-compile --disable-pip-version-check --target "$deps" .whl/*.whl &&
    PYTHONPATH=$deps "$python" -m pip install -v --no-index --no-deps --no-build-isolation --disable-pip-version-check \
      --target "$site" --config-settings=cmake.define.CMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-90a-real}" \
      "${header_args[@]}" .
} >"$logs/python-build.log" 2>&1
build_status=$?
say "- build requirements: $(cd .whl 2>/dev/null && ls ./*.whl 2>/dev/null | tr '\n' ' ')"
say "- pip install (CMake, CUDA ${CUDA_ARCHS:-90a-real}): status $build_status in $(( $(now) - start )) s"
if [ $build_status -ne 0 ]; then
  say ""
  say '```'
  tail -40 "$logs/python-build.log" >>"$summary"
  say '```'
  cat "$summary"
  exit 1
fi

export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
# JAX would otherwise take 75% of the GPU's memory at its first GPU array, beside torch's.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
export CUFLASH_PY_ERROR_LOG=$logs/python-errors.jsonl
: >"$CUFLASH_PY_ERROR_LOG"
say "- cuflash: $("$python" -c 'import cuflash; print(cuflash.__version__, cuflash.__file__, "cuda backend available:", cuflash.backend_available("cuda"))' 2>&1 | tail -1)"
say "- torch operators in C++ (_ext_torch.so): $("$python" -c 'from cuflash import _torch_ext as e; print("loaded" if e.LOADED else "not loaded:", "" if e.LOADED else e.REASON)' 2>&1 | tail -1)"
start=$(now)
# shellcheck disable=SC2086
PYTHONUNBUFFERED=1 "$python" -m pytest -p no:cacheprovider -v -rs tests/python ${CUFLASH_PYTEST_ARGS:-} \
  >"$logs/python-pytest.log" 2>&1
pytest_status=$?
say "- pytest tests/python: status $pytest_status in $(( $(now) - start )) s: $(grep -E '^=+ .*(passed|failed|error).* =+$' "$logs/python-pytest.log" | tail -1 | tr -d '=' | sed 's/^ *//')"
say ""

"$python" - "$logs/python-pytest.log" "$CUFLASH_PY_ERROR_LOG" >>"$summary" <<'EOF'
import json, re, sys
log, ledger = open(sys.argv[1]).read().splitlines(), sys.argv[2]
results = [l for l in log if re.match(r"^tests/python/\S+::\S+ (PASSED|FAILED|SKIPPED|ERROR|XFAIL)", l)]
failed = [l for l in results if " FAILED" in l or " ERROR" in l]
skipped = [l for l in log if l.startswith("SKIPPED")]
gpu = [l for l in results if "_gpu_" in l or "torch-cuda" in l]
print(f"Tests: {len(results)} ({sum(' PASSED' in l for l in results)} passed, {len(failed)} failed, "
      f"{sum(' SKIPPED' in l for l in results)} skipped); GPU ones: {len(gpu)}, "
      f"{sum(' PASSED' in l for l in gpu)} passed.")
print()
if failed:
    print("Failed:\n")
    for l in failed:
        print(f"- `{l.split()[0]}`")
    print()
if skipped:
    print("Skipped:\n")
    for l in sorted(set(skipped)):
        print(f"- {l}")
    print()
rows = [json.loads(l) for l in open(ledger) if l.strip()]
if rows:
    print("Errors against float64 (rel-L2 unless the tolerance is 0; torch's SDPA math backend on upcast inputs,")
    print("or the numpy oracle for KV caches), per test and quantity:\n")
    print("| test | quantity | error | tolerance | ok |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        ok = "yes" if r["error"] <= r["tolerance"] else "NO"
        print(f"| `{r['test'].split('::', 1)[1]}` | {r['quantity']} | {r['error']:.3g} | {r['tolerance']:g} | {ok} |")
    print()
EOF
cat "$summary"
exit $pytest_status
