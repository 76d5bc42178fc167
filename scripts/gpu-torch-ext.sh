#!/usr/bin/env bash
# Runs on the GPU machine (no network; torch in its python3), no scratch script
# needed: everything the torch operators in C++ (cuflash/_ext_torch.so) still
# owe a GPU.
#
#   here:        scripts/stage-python-wheels.sh        (nanobind, scikit-build-core into .whl/)
#   GPU machine: CUFLASH_COMMIT=<sha> scripts/gpu-torch-ext.sh   (device call with carry [".whl"])
#
# 1. scripts/gpu-python.sh with CUFLASH_TORCH_EXT=1: the package built with the
#    operators required (the build fails without them, the import raises if
#    they do not load), then tests/python with them: every torch GPU test
#    (dense/varlen/KV-cache forward and backward against float64, cuDNN in a
#    torch process, CUDA-graph capture and replay of forward+backward through
#    the C++ node -- the capture rule for index checks --, allocations only
#    through torch's allocator, torch.compile without graph breaks) and
#    test_torch_ext.py.
# 2. The torch GPU tests again with CUFLASH_TORCH_EXT=0: the Python operators
#    of the same package, as without the library.
# 3. bench/torch_ext_probe.py: host us per call, C++ operators against the
#    Python path and SDPA (B1 H16 S128 D64 bf16 causal, then S512 D128).
# Logs in $OUT (or build-python-gpu/logs): python-gpu.md and the others of
# gpu-python.sh, torch-ext-fallback.log, torch-ext-probe-*.json/txt,
# torch-ext.md (the summary, also printed).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
python=${PYTHON:-python3}
logs=${OUT:-build-python-gpu/logs}
work=${CUFLASH_GPU_PYTHON_DIR:-build-python-gpu}
mkdir -p "$logs"
summary=$logs/torch-ext.md

CUFLASH_TORCH_EXT=1 scripts/gpu-python.sh
python_status=$?

export PYTHONPATH=$work/site${PYTHONPATH:+:$PYTHONPATH}
export XLA_PYTHON_CLIENT_PREALLOCATE=false
{
  echo "# torch operators in C++ on the GPU"
  echo
  echo "- gpu-python.sh with CUFLASH_TORCH_EXT=1: status $python_status (python-gpu.md)"
  echo "- loaded: $(CUFLASH_TORCH_EXT=1 "$python" -c 'import cuflash; from cuflash import _torch_ext as e; print(e.LOADED, e.PATH, e.REASON)' 2>&1 | tail -1)"
} >"$summary"

CUFLASH_TORCH_EXT=0 "$python" -m pytest -p no:cacheprovider -q -rs tests/python/test_torch.py \
  tests/python/test_torch_graphs_and_cudnn.py tests/python/test_torch_ext.py >"$logs/torch-ext-fallback.log" 2>&1
fallback_status=$?
echo "- the same GPU tests on the Python operators (CUFLASH_TORCH_EXT=0): status $fallback_status: $(tail -1 "$logs/torch-ext-fallback.log")" >>"$summary"

for shape in "--seqlen 128 --head-dim 64" "--seqlen 512 --head-dim 128"; do
  name=$(echo "$shape" | tr -d ' -' | sed 's/seqlen/S/; s/headdim/-D/')
  # shellcheck disable=SC2086
  timeout 600 "$python" bench/torch_ext_probe.py $shape --json "$logs/torch-ext-probe-$name.json" \
    >"$logs/torch-ext-probe-$name.txt" 2>&1
  {
    echo
    echo '```'
    cat "$logs/torch-ext-probe-$name.txt"
    echo '```'
  } >>"$summary"
done
cat "$summary"
[ "$python_status" -eq 0 ] && [ "$fallback_status" -eq 0 ]
