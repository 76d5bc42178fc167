#!/usr/bin/env bash
# Here, where building costs no device time: the `cuflash` command of a base
# and of a change, built for sm_90a with the cuda backend only (as ab.sh
# builds them on the GPU machine), each packed with its library into
# .abbin/<base|change>.tar.xz (~7 MB each, git-ignored), so that the device
# call only times them (bench/ab-prebuilt.sh there, carry [".abbin"]) instead
# of spending ~110 s of device time building both.
#   bench/ab-prebuild.sh BASE_REF CHANGE_REF [--tests]
# --tests also packs the change's cuflash_gpu_tests (AB_GTEST_FILTER there).
# AB_CHANGE_NAME=change2 packs the change as .abbin/change2.tar.xz (several
# changes against one base, timed in one device call); the base is not
# built again when .abbin/base.label names BASE_REF's commit or one that
# differs from it in documentation only. AB_CMAKE_ARGS adds CMake arguments
# to both builds, e.g. the step timeline's (-DCUFLASH_STEP_TIMELINE=ON, with
# AB_CHANGE_NAME=timeline, which ab-prebuilt.sh does not time, and an
# AB_PREBUILD_DIR of its own, so that the A/B builds' objects stay).
# AB_CHANGE_ENV="NAME=value ..." writes .abbin/<change name>.env, which
# ab-prebuilt.sh exports for that pack's runs and tests: with
# AB_CHANGE_NAME=change2 and the same CHANGE_REF (its objects are built
# already: only the packing runs), the change timed with a switch off.
# One clone and one build directory in $AB_PREBUILD_DIR (default
# /tmp/cuflash-ab): the base is built first, then the change on top of it,
# so only what the change touches compiles again (2 cores: ~7 min for a
# fresh base, ~1 min for a change to the TMA forward's kernels).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
base=${1:?"usage: bench/ab-prebuild.sh BASE_REF CHANGE_REF [--tests]"}
change=${2:?"usage: bench/ab-prebuild.sh BASE_REF CHANGE_REF [--tests]"}
tests=OFF
[ "${3:-}" = "--tests" ] && tests=ON
repo=$PWD dir=${AB_PREBUILD_DIR:-/tmp/cuflash-ab}
base_sha=$(git rev-parse --verify "$base^{commit}") change_sha=$(git rev-parse --verify "$change^{commit}")
[ -d "$dir/.git" ] || git clone -q --no-checkout "$repo" "$dir"
git -C "$dir" fetch -q "$repo" "$base_sha" "$change_sha"
export PATH=/usr/local/cuda/bin:$PATH
mkdir -p .abbin
build() {  # <sha> <name> <targets...>
  local sha=$1 name=$2 pack
  shift 2
  git -C "$dir" checkout -q --detach "$sha"
  cmake -S "$dir" -B "$dir/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a-real \
    -DCUFLASH_ENABLE_CUDNN=OFF -DCUFLASH_ENABLE_NCCL=OFF -DCUFLASH_BUILD_TESTS="$tests" ${AB_CMAKE_ARGS:-} >/dev/null
  echo "ab-prebuild: building $name ($(git rev-parse --short "$sha"))"
  cmake --build "$dir/build" -j "$(nproc)" --target "$@" >"$dir/build-$name.log" 2>&1 ||
    { tail -30 "$dir/build-$name.log"; exit 1; }
  pack=$(mktemp -d)
  cp -a "$dir"/build/src/libcuflash.so* "$dir/build/bin/cuflash" "$pack/"
  [ "$tests" = OFF ] || [ "$name" = base ] || cp "$dir/build/tests/cuflash_gpu_tests" "$pack/"
  tar -cf - -C "$pack" . | xz -6 -T0 >".abbin/$name.tar.xz"
  rm -rf "$pack"
  echo "$(git rev-parse --short "$sha") ($(git name-rev --name-only --always "$sha"))" >".abbin/$name.label"
  echo "ab-prebuild: .abbin/$name.tar.xz ($(du -h ".abbin/$name.tar.xz" | cut -f1)): $(cat ".abbin/$name.label")"
}
change_name=${AB_CHANGE_NAME:-change}
# The packed base serves while it was built from BASE_REF's commit or from
# one that differs from it in documentation only (docs/, *.md): a notes
# commit between two prebuilds does not cost a base build.
packed=$(cut -d' ' -f1 .abbin/base.label 2>/dev/null || true)
same_code() {
  [ -n "$packed" ] && git rev-parse -q --verify "$packed^{commit}" >/dev/null &&
    git diff --quiet "$packed" "$base_sha" -- . ':(exclude)docs' ':(exclude)*.md'
}
if [ -f .abbin/base.tar.xz ] && same_code; then
  echo "ab-prebuild: base already packed: $(cat .abbin/base.label)"
else
  # AB_CMAKE_ARGS is for a change of its own (the step timeline's build):
  # a base built with it would replace the plain base that ab-prebuilt.sh
  # times every change against.
  if [ -n "${AB_CMAKE_ARGS:-}" ]; then
    echo "ab-prebuild: .abbin/base.tar.xz is not $base's plain build and AB_CMAKE_ARGS is set:" \
      "pack the base first without AB_CMAKE_ARGS (bench/ab-prebuild.sh $base $base)" >&2
    exit 2
  fi
  build "$base_sha" base cuflash_cli
fi
targets=(cuflash_cli)
[ "$tests" = OFF ] || targets+=(cuflash_gpu_tests)
build "$change_sha" "$change_name" "${targets[@]}"
if [ -n "${AB_CHANGE_ENV:-}" ]; then
  printf '%s\n' $AB_CHANGE_ENV >".abbin/$change_name.env"
  echo "$(cat ".abbin/$change_name.label"), $AB_CHANGE_ENV" >".abbin/$change_name.label"
  echo "ab-prebuild: .abbin/$change_name.env: $AB_CHANGE_ENV"
else
  rm -f ".abbin/$change_name.env"
fi
echo "ab-prebuild: carry [\".abbin\"]; there: bench/ab-prebuilt.sh [bench/ab.py flags] (the base against every .abbin/change*)"
