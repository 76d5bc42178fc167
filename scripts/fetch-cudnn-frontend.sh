#!/usr/bin/env bash
# Fetches the header-only NVIDIA cuDNN frontend, which the cuDNN backend is
# built on, into the git-ignored .deps/cudnn-frontend/include. The headers come
# from PyPI's nvidia-cudnn-frontend wheel (they sit in the wheel's top-level
# include/); the wheel's Python module is not used. Version and checksum are
# pinned here; idempotent: with the pinned version in place it downloads
# nothing. The GPU machine has no network: there, .deps/ travels with the
# source tree (the device call carries it) and CMake finds the headers in it.
#   scripts/fetch-cudnn-frontend.sh        (scripts/build.sh calls it)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

version=1.32.0
# The cp312 manylinux x86_64 wheel; every wheel of a release carries the same headers.
wheel=nvidia_cudnn_frontend-${version}-cp312-cp312-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl
sha256=8b354a8e550c083eb247f1eb39a7d69a4a269075f5a01e4fcbd2531680b17239
prefix=.deps/cudnn-frontend

if [ -f "$prefix/VERSION" ] && [ "$(cat "$prefix/VERSION")" = "$version" ] && [ -f "$prefix/include/cudnn_frontend.h" ]; then
  echo "fetch-cudnn-frontend: found cuDNN frontend $version in $prefix"
  exit 0
fi

command -v python3 >/dev/null || { echo "fetch-cudnn-frontend: needs python3 (with pip)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "fetch-cudnn-frontend: downloading nvidia-cudnn-frontend==$version from PyPI"
# A fixed platform and Python version, so that every machine gets the same file
# (and checksum) whatever its own interpreter.
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --abi cp312 --platform manylinux_2_28_x86_64 --dest "$work" "nvidia-cudnn-frontend==$version"
[ -f "$work/$wheel" ] || { echo "fetch-cudnn-frontend: pip did not give $wheel:" >&2; ls "$work" >&2; exit 1; }
got=$(sha256sum "$work/$wheel" | cut -d' ' -f1)
if [ "$got" != "$sha256" ]; then
  echo "fetch-cudnn-frontend: $wheel has sha256 $got, expected $sha256" >&2
  exit 1
fi

# Unpack include/ only, next to the final place, then swap it in.
python3 - "$work/$wheel" "$work/unpacked" <<'PY'
import sys, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    members = [n for n in z.namelist() if n.startswith("include/")]
    if not any(n == "include/cudnn_frontend.h" for n in members):
        sys.exit(f"{wheel}: no include/cudnn_frontend.h in the wheel")
    z.extractall(dest, members)
PY
mkdir -p .deps
rm -rf "$prefix.new"
mkdir -p "$prefix.new"
mv "$work/unpacked/include" "$prefix.new/include"
echo "$version" >"$prefix.new/VERSION"
rm -rf "$prefix"
mv "$prefix.new" "$prefix"
echo "fetch-cudnn-frontend: installed cuDNN frontend $version headers in $prefix/include ($(du -sh "$prefix/include" | cut -f1))"
