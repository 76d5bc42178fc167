#!/usr/bin/env bash
# Run here, before the device calls that bring FlashAttention-4 (the
# flash-attn-4 package, CuTe-DSL kernels with a Hopper path) to the GPU
# machine for bench/prefill.py's `fa4` peer. That machine has no network and
# lacks the package and its compiler; one call carries at most 64 MiB with the
# working tree, and the compiler's wheel (nvidia-cutlass-dsl-libs-cu13) is
# ~92 MB, so it travels in two parts, one per call:
#   here:    scripts/stage-fa4-wheels.sh
#   call 1:  carry [".fa4/part1", ...]   bench/fa4-receive.sh; (other work)
#   call 2:  carry [".fa4/part2"]        bench/fa4-receive.sh && . /root/fa4/env && python3 bench/prefill.py ...
# back to back on a warm machine (what a call leaves outside the tree, in
# /root/fa4, survives only while the machine stays warm). part2 also holds the
# small wheels and the manifest (file names and sha256 of the whole wheel).
# Versions pinned here; --no-deps everywhere, each dependency named (torch,
# einops, typing-extensions, cuda-bindings and protobuf are on the image).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cutlass=4.8.1
wheels=("flash-attn-4==4.0.0b36" "nvidia-cutlass-dsl==$cutlass" "nvidia-cutlass-dsl-libs-base==$cutlass"
        "nvidia-cutlass-dsl-libs-core==$cutlass" "nvidia-cutlass-dsl-libs-cu13==$cutlass"
        "apache-tvm-ffi==0.1.15.post2" "torch-c-dlpack-ext==0.1.5" "quack-kernels==0.6.5")
# The GPU machine's python3 is 3.12 on x86-64 (KINDS.md).
platform=(--python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
          --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
          --platform manylinux2014_x86_64 --only-binary=:all: --no-deps)
download=.fa4/download
rm -rf .fa4 && mkdir -p "$download" .fa4/part1 .fa4/part2
python3 -m pip download -q --disable-pip-version-check --pre "${platform[@]}" -d "$download" "${wheels[@]}"
big=$(ls "$download"/nvidia_cutlass_dsl_libs_cu13-*.whl)
# Two parts of at most 48 MiB: each call's carry stays under 64 MiB with the tree.
split -b 48m -d "$big" ".fa4/part1/$(basename "$big").part"
mv .fa4/part1/"$(basename "$big")".part01 .fa4/part2/
[ ! -e .fa4/part1/"$(basename "$big")".part02 ] || { echo "stage-fa4-wheels: the wheel needs more than two parts" >&2; exit 1; }
for w in "$download"/*.whl; do [ "$w" = "$big" ] || mv "$w" .fa4/part2/; done
{
  echo "wheel $(basename "$big") $(sha256sum "$big" | cut -d' ' -f1)"
  echo "parts 2"
} >.fa4/part2/manifest
rm -rf "$download"
du -sh .fa4/part1 .fa4/part2
