#!/usr/bin/env bash
# The prefill benchmark in one command, on the GPU machine: builds the
# `cuflash` command (Release, sm_90a, all cores, no tests) into build-bench/,
# then runs bench/prefill.py, which writes prefill.json, prefill.md and
# prefill.png into $1, else $OUT (the device machine's result folder), else
# docs/perf. Extra arguments after the folder go to prefill.py.
#   CUFLASH_COMMIT=$(git rev-parse --short HEAD) bench/prefill.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-docs/perf}}
shift || true
export PATH=/usr/local/cuda/bin:$PATH
mkdir -p "$out"
source bench/build_cli.sh
build_cli "$out/prefill-build.log"
python3 bench/prefill.py --cuflash build-bench/bin/cuflash --out-dir "$out" "$@" 2>&1 | tee "$out/prefill-run.log"
