#!/usr/bin/env bash
# Builds the `cuflash` command for the benchmarks (Release, sm_90a, all
# cores, no tests) into build-bench/, logging to $1; on failure prints the
# log's tail and exits 1. Sourced by bench/prefill.sh and bench/decode.sh
# (after they cd to the repository root), which then run build-bench/bin/cuflash.
build_cli() {
  local log=$1 start
  start=$(date +%s)
  cmake -S . -B build-bench -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a-real \
    -DCUFLASH_BUILD_TESTS=OFF >"$log" 2>&1 &&
    cmake --build build-bench -j "$(nproc)" --target cuflash_cli >>"$log" 2>&1 ||
    { tail -30 "$log"; exit 1; }
  echo "$(basename "$0"): built in $(( $(date +%s) - start )) s" >&2
}
