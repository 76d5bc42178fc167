#!/usr/bin/env bash
# The Python package's tests, as CI runs them (scripts/test.sh calls this):
# a git-ignored virtual environment .venv, `pip install .` into it (the
# library with its CUDA backend when nvcc is found, and the nanobind module),
# numpy and pytest from tests/python/requirements.txt, then pytest over
# tests/python. numpy tests run on the CPU backend; torch and GPU tests skip
# where torch or a GPU is missing.
#   PYTHON=python3.12 scripts/test-python.sh [pytest args]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

python=${PYTHON:-python3}
venv=.venv
if ! "$python" -c 'import venv, ensurepip' 2>/dev/null; then
  # Debian's python3 keeps venv/ensurepip in python3-venv.
  sudo=()
  [ "$(id -u)" -ne 0 ] && sudo=(sudo)
  echo "test-python: installing python3-venv"
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv
fi
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi

start=$(date +%s)
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r tests/python/requirements.txt
"$venv/bin/python" -m pip install -q --disable-pip-version-check .
echo "test-python: pip install . took $(($(date +%s) - start)) s ($(command -v nvcc >/dev/null && echo "with" || echo "without") nvcc: CUDA backend $(command -v nvcc >/dev/null && echo built || echo not built))"
# Run from tests/python's parent with the package as installed (never python/cuflash, which has no _ext).
exec "$venv/bin/python" -m pytest -p no:cacheprovider -q -rs tests/python "$@"
