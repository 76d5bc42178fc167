#!/usr/bin/env bash
# On the GPU machine: bench/ab.py on the builds that bench/ab-prebuild.sh
# packed here into .abbin/ (device call with carry [".abbin"]): nothing is
# built there. The base against every change packed (.abbin/change*.tar.xz,
# in one ab.py run: the builds alternate within each round). With
# AB_GTEST_FILTER set, that gtest filter runs on each change packed with
# --tests (its cuflash_gpu_tests) after the timing. Results in $OUT (else
# $AB_DIR/out): ab.md, ab.json, ab.log, tests-<change>.log.
#   AB_GTEST_FILTER='HopperTma/*:*ForwardPlan*' bench/ab-prebuilt.sh --passes fwd --seqlens 512,1024
set -uo pipefail
cd "$(dirname "$0")/.."
dir=${AB_DIR:-/tmp/ab-prebuilt}
out=${OUT:-$dir/out}
mkdir -p "$out"
changes=()
# (In byte order, change before change2: a locale's collation puts change2 first.)
for pack in $(printf '%s\n' .abbin/change*.tar.xz | LC_ALL=C sort); do
  [ -f "$pack" ] && changes+=("$(basename "$pack" .tar.xz)")
done
[ -f .abbin/base.tar.xz ] && [ "${#changes[@]}" -gt 0 ] ||
  { echo "ab-prebuilt: no .abbin/base.tar.xz or .abbin/change*.tar.xz (bench/ab-prebuild.sh, carry [\".abbin\"])" >&2; exit 2; }
args=()
for name in base "${changes[@]}"; do
  rm -rf "${dir:?}/$name" && mkdir -p "$dir/$name"
  # (Python's tarfile: the machine's image need not have xz.)
  python3 -c "import sys, tarfile; tarfile.open(sys.argv[1], 'r:xz').extractall(sys.argv[2])" \
    ".abbin/$name.tar.xz" "$dir/$name" || exit 2
  # A pack's switches (.abbin/<name>.env, bench/ab-prebuild.sh's
  # AB_CHANGE_ENV) go into its wrapper, for its timed runs and its tests.
  switches=$(tr '\n' ' ' <".abbin/$name.env" 2>/dev/null || true)
  printf '#!/bin/sh\nexec env %sLD_LIBRARY_PATH=%s %s/cuflash "$@"\n' "$switches" "$dir/$name" "$dir/$name" \
    >"$dir/$name/run"
  printf '%s\n' "$switches" >"$dir/$name/switches"
  chmod +x "$dir/$name/run"
  label=$(cat ".abbin/$name.label" 2>/dev/null || echo "$name")
  if [ "$name" = base ]; then
    args+=(--base "$dir/base/run" --label-base "$label")
  else
    args+=(--change "$dir/$name/run" --label-change "$label")
  fi
done
status=0
PYTHONUNBUFFERED=1 python3 bench/ab.py "${args[@]}" --out-dir "$out" "$@" 2>"$out/ab.log" || status=1
if [ -n "${AB_GTEST_FILTER:-}" ]; then
  for name in "${changes[@]}"; do
    tests=$dir/$name/cuflash_gpu_tests
    [ -x "$tests" ] || { echo "ab-prebuilt: $name was packed without --tests" >&2; status=1; continue; }
    env $(cat "$dir/$name/switches") LD_LIBRARY_PATH=$dir/$name "$tests" --gtest_filter="$AB_GTEST_FILTER" >"$out/tests-$name.log" 2>&1 || status=1
    echo "ab-prebuilt: $name: tests '$AB_GTEST_FILTER': $(grep -E '^\[  (PASSED|FAILED|SKIPPED) *\]' "$out/tests-$name.log" | tr '\n' ' ')"
  done
fi
exit "$status"
