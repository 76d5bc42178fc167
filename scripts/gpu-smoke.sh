#!/usr/bin/env bash
# Developer's quick look on the GPU machine: builds the library and the
# `cuflash` command only (no tests), then runs a handful of `cuflash run`
# problems on backend=cuda (CUFLASH_SMOKE_BACKEND=cudnn: on cuDNN), each checked
# against the float64 oracle, and a few timing-only points. For the full suite
# use scripts/gpu-check.sh.
#   scripts/gpu-smoke.sh [extra cuflash-run lines file]
set -uo pipefail
cd "$(dirname "$0")/.."
build=${CUFLASH_BUILD_DIR:-build-gpu}
logs=${OUT:-$build/logs}
mkdir -p "$logs"
export PATH=/usr/local/cuda/bin:$PATH
start=$(date +%s)
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a-real \
  -DCUFLASH_BUILD_TESTS=OFF >"$logs/configure.log" 2>&1 &&
  cmake --build "$build" -j "$(nproc)" --target cuflash_cli >"$logs/build.log" 2>&1 ||
  { tail -30 "$logs/build.log"; exit 1; }
echo "build: $(( $(date +%s) - start )) s"
cases=${1:-}
run() {
  local out
  out=$("$build/bin/cuflash" run --backend "${CUFLASH_SMOKE_BACKEND:-cuda}" "$@" 2>&1)
  local status=$?
  printf '%-4s %s\n' "$([ $status -eq 0 ] && echo ok || echo FAIL)" "$*"
  echo "== $* (status $status)" >>"$logs/smoke.log"
  echo "$out" >>"$logs/smoke.log"
  [ $status -eq 0 ] || echo "$out" | tail -8
  echo "$out" | grep -E "^(forward|backward):|vs float64|result:" | head -4 | sed 's/^/     /'
}
while read -r line; do
  [ -z "$line" ] || [ "${line:0:1}" = "#" ] && continue
  # shellcheck disable=SC2086
  run $line
done < <(if [ -n "$cases" ]; then cat "$cases"; else cat <<'LIST'
--dtype bf16 --head-dim 64 --seqlen 512
--dtype f16 --head-dim 128 --seqlen 1000 --causal
--dtype bf16 --head-dim 32 --seqlen 65 --heads-q 4 --heads-kv 2
--dtype bf16 --head-dim 96 --seqlen-q 63 --seqlen-k 1000 --causal
--dtype bf16 --head-dim 192 --seqlen 300 --window-left 50 --window-right 10
--dtype f16 --head-dim 256 --seqlen 257 --softcap 30 --alibi
--dtype bf16 --head-dim 128 --layout varlen --batch 5 --seqlen 700 --causal
--dtype bf16 --head-dim 128 --batch 1 --heads 2 --seqlen-q 4 --seqlen-k 8192
--dtype f32 --head-dim 64 --seqlen 300 --causal
--dtype bf16 --head-dim 128 --seqlen 512 --backward
--dtype bf16 --head-dim 64 --seqlen 1000 --causal --backward --heads-q 4 --heads-kv 1
--dtype f16 --head-dim 128 --seqlen 777 --causal --backward --deterministic
--dtype f32 --head-dim 64 --seqlen 200 --backward --causal
--dtype bf16 --head-dim 128 --heads 16 --batch 4 --seqlen 4096 --no-check --repeats 20
--dtype bf16 --head-dim 128 --heads 16 --batch 4 --seqlen 4096 --causal --no-check --repeats 20
--dtype bf16 --head-dim 64 --heads 32 --batch 4 --seqlen 4096 --no-check --repeats 20
--dtype bf16 --head-dim 128 --heads 16 --batch 4 --seqlen 4096 --no-check --repeats 10 --backward
LIST
fi)
