#!/usr/bin/env bash
# On the GPU machine: bench/ab.py on the two builds that bench/ab-prebuild.sh
# packed here into .abbin/ (device call with carry [".abbin"]): nothing is
# built there. With AB_GTEST_FILTER set (and the change packed with
# --tests), that gtest filter runs on the change's cuflash_gpu_tests after
# the timing. Results in $OUT (else $AB_DIR/out): ab.md, ab.json, ab.log,
# tests.log.
#   AB_GTEST_FILTER='HopperTma/*:*ForwardPlan*' bench/ab-prebuilt.sh --passes fwd --seqlens 512,1024
set -uo pipefail
cd "$(dirname "$0")/.."
dir=${AB_DIR:-/tmp/ab-prebuilt}
out=${OUT:-$dir/out}
mkdir -p "$out"
for name in base change; do
  [ -f ".abbin/$name.tar.xz" ] || { echo "ab-prebuilt: no .abbin/$name.tar.xz (bench/ab-prebuild.sh, carry [\".abbin\"])" >&2; exit 2; }
  rm -rf "${dir:?}/$name" && mkdir -p "$dir/$name"
  # (Python's tarfile: the machine's image need not have xz.)
  python3 -c "import sys, tarfile; tarfile.open(sys.argv[1], 'r:xz').extractall(sys.argv[2])" \
    ".abbin/$name.tar.xz" "$dir/$name" || exit 2
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s/cuflash "$@"\n' "$dir/$name" "$dir/$name" >"$dir/$name/run"
  chmod +x "$dir/$name/run"
done
status=0
PYTHONUNBUFFERED=1 python3 bench/ab.py --base "$dir/base/run" --change "$dir/change/run" \
  --label-base "$(cat .abbin/base.label 2>/dev/null || echo base)" \
  --label-change "$(cat .abbin/change.label 2>/dev/null || echo change)" --out-dir "$out" "$@" 2>"$out/ab.log" || status=1
if [ -n "${AB_GTEST_FILTER:-}" ]; then
  tests=$dir/change/cuflash_gpu_tests
  [ -x "$tests" ] || { echo "ab-prebuilt: the change was packed without --tests" >&2; exit 1; }
  LD_LIBRARY_PATH=$dir/change "$tests" --gtest_filter="$AB_GTEST_FILTER" >"$out/tests.log" 2>&1 || status=1
  echo "ab-prebuilt: tests '$AB_GTEST_FILTER': $(grep -E '^\[  (PASSED|FAILED|SKIPPED) \]' "$out/tests.log" | tr '\n' ' ')"
fi
exit "$status"
