#!/usr/bin/env bash
# Run here, before scripts/gpu-python.sh on the GPU machine, which has no
# network: downloads the build requirements pinned in pyproject.toml
# (scikit-build-core, nanobind) and scikit-build-core's own requirements
# (packaging, pathspec), all pure-Python wheels, into the git-ignored .whl/,
# which the device call carries.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
requirements="$(sed -n 's/^requires = \[\(.*\)\]$/\1/p' pyproject.toml | tr -d '"' | tr ',' ' ') packaging==24.2 pathspec==0.12.1"
[ -n "$requirements" ] || { echo "stage-python-wheels: no build requirements found in pyproject.toml" >&2; exit 1; }
mkdir -p .whl
rm -f .whl/scikit_build_core-*.whl .whl/nanobind-*.whl .whl/packaging-*.whl .whl/pathspec-*.whl
# shellcheck disable=SC2086
python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: -d .whl $requirements
# The GPU machine's python3 is 3.12 (KINDS.md); should its headers be missing,
# gpu-python.sh falls back to these (any 3.12.x: the C API is that of the minor version).
gpu_python=${GPU_PYTHON_VERSION:-3.12}
rm -rf ".whl/python$gpu_python-include"
for include in "$(pyenv root 2>/dev/null || echo /nonexistent)"/versions/"$gpu_python".*/include/python"$gpu_python" \
               /usr/include/python"$gpu_python"; do
  if [ -f "$include/Python.h" ]; then
    cp -r "$include" ".whl/python$gpu_python-include"
    echo "stage-python-wheels: Python $gpu_python headers from $include"
    break
  fi
done
ls -l .whl
