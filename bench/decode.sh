#!/usr/bin/env bash
# The decode benchmark in one command, on the GPU machine: builds the
# `cuflash` command (Release, sm_90a, all cores, no tests) into build-bench/,
# then runs bench/decode.py, which writes decode.json and decode.md into $1,
# else $OUT (the device machine's result folder), else docs/perf. Extra
# arguments after the folder go to decode.py.
#   CUFLASH_COMMIT=$(git rev-parse --short HEAD) bench/decode.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-docs/perf}}
shift || true
export PATH=/usr/local/cuda/bin:$PATH
mkdir -p "$out"
source bench/build_cli.sh
build_cli "$out/decode-build.log"
python3 bench/decode.py --cuflash build-bench/bin/cuflash --out-dir "$out" "$@" 2>&1 | tee "$out/decode-run.log"
