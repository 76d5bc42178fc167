#!/usr/bin/env bash
# The Python package's tests, as CI runs them (scripts/test.sh calls this):
# a git-ignored virtual environment .venv, `pip install .` into it, numpy and
# pytest from tests/python/requirements.txt, then pytest over tests/python.
# numpy tests run on the CPU backend; torch and GPU tests skip where torch or a
# GPU is missing.
#
# The package reuses the library that scripts/build.sh built, build/src/libcuflash.so
# (brought up to date first; a no-op after build.sh): `pip install .` then
# compiles only the nanobind module, and the package has that library's
# backends (cmake/prebuilt.cmake). Without build/ it compiles the library
# itself, with its CUDA backend when nvcc is found, as a bare `pip install .` does.
#   PYTHON=python3.12 scripts/test-python.sh [pytest args]
#   CUFLASH_PREBUILT_LIBRARY= scripts/test-python.sh     (empty: compile, never reuse)
# Full logs in build/test-logs/ (CUFLASH_TEST_LOG_DIR): pip-install.log, pytest.log,
# pytest-junit.xml (which scripts/test.sh counts); printed: the pip install's
# time and pytest's last lines.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

python=${PYTHON:-python3}
venv=.venv
logs=${CUFLASH_TEST_LOG_DIR:-build/test-logs}
mkdir -p "$logs"
rm -f "$logs/pip-install.log" "$logs/pytest.log" "$logs/pytest-junit.xml"

if ! "$python" -c 'import venv, ensurepip' 2>/dev/null; then
  # Debian's python3 keeps venv/ensurepip in python3-venv.
  sudo=()
  [ "$(id -u)" -ne 0 ] && sudo=(sudo)
  echo "test-python: installing python3-venv"
  { "${sudo[@]}" apt-get update -qq &&
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv; } ||
    { echo "test-python: could not install python3-venv" >&2; exit 1; }
fi
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv" || exit 1
fi
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi

# Which library the package gets: the caller's (CUFLASH_PREBUILT_LIBRARY set,
# empty meaning none), else build/'s when there is one and it is up to date.
if [ -z "${CUFLASH_PREBUILT_LIBRARY+set}" ]; then
  CUFLASH_PREBUILT_LIBRARY=
  if [ -f build/CMakeCache.txt ] && [ -e build/src/libcuflash.so ]; then
    if cmake --build build --target cuflash >"$logs/pip-install.log" 2>&1; then
      CUFLASH_PREBUILT_LIBRARY=$PWD/build/src/libcuflash.so
    else
      echo "test-python: could not bring build/src/libcuflash.so up to date (see $logs/pip-install.log); the package compiles its own"
    fi
  fi
fi
export CUFLASH_PREBUILT_LIBRARY
if [ -n "$CUFLASH_PREBUILT_LIBRARY" ]; then
  library="reusing ${CUFLASH_PREBUILT_LIBRARY#"$PWD"/}, no library compile"
elif command -v nvcc >/dev/null && [ "${CUFLASH_ENABLE_CUDA:-ON}" != OFF ]; then
  library="compiling the library with its CUDA backend (nvcc found)"
else
  library="compiling the library without its CUDA backend (no nvcc, or CUFLASH_ENABLE_CUDA=OFF)"
fi

# CUFLASH_TEST_TORCH=1 (.ci/run sets it): torch from PyPI too (tests/python/requirements-torch.txt,
# ~4.7 GB with its nvidia-* wheels, ~1.5 min here), so that the torch tests run on CPU tensors
# instead of skipping. Left out of the README's test command, whose time is a user's first wait.
# One pip install of the file downloads every wheel (~3.4 GB) before it installs any: 8 GB of
# disk at its peak, which once filled a CI machine's disk (ENOSPC) after the build. So pip
# resolves first (--dry-run --report, nothing installed), then installs what it chose one
# distribution at a time, without its cache: the peak is what is installed plus one wheel.
pip_quiet=(-q --no-cache-dir --disable-pip-version-check)
install_one_at_a_time() {
  local requirements=$1 report=$logs/pip-torch-report.json
  "$venv/bin/python" -m pip install "${pip_quiet[@]}" --dry-run --report "$report" -r "$requirements" || return 1
  "$venv/bin/python" - "$report" <<'PY' >"$logs/pip-torch-plan.txt" || return 1
import json, sys
# One line per distribution pip chose: name==version (the versions its resolution fixed).
for item in json.load(open(sys.argv[1]))["install"]:
    print(f'{item["metadata"]["name"]}=={item["metadata"]["version"]}')
PY
  local requirement
  while read -r requirement; do
    "$venv/bin/python" -m pip install "${pip_quiet[@]}" --no-deps "$requirement" || return 1
  done <"$logs/pip-torch-plan.txt"
  # (Whatever the order, the set is complete: pip check says so.)
  "$venv/bin/python" -m pip check
}
if [ "${CUFLASH_TEST_TORCH:-0}" = 1 ]; then
  start=$(date +%s)
  free_before=$(df -Pm . | awk 'NR == 2 { print $4 }')
  if install_one_at_a_time tests/python/requirements-torch.txt >"$logs/pip-torch.log" 2>&1; then
    echo "test-python: torch installed in $(($(date +%s) - start)) s, $(grep -c . "$logs/pip-torch-plan.txt")" \
      "distributions one at a time ($free_before MB free before, $(df -Pm . | awk 'NR == 2 { print $4 }') MB after;" \
      "log: $logs/pip-torch.log)"
  else
    tail -n 20 "$logs/pip-torch.log"
    echo "test-python: could not install torch (CUFLASH_TEST_TORCH=1; $free_before MB free before," \
      "$(df -Pm . | awk 'NR == 2 { print $4 }') MB now); full log: $logs/pip-torch.log"
    exit 1
  fi
fi

start=$(date +%s)
if ! { "$venv/bin/python" -m pip install -q --disable-pip-version-check -r tests/python/requirements.txt &&
       "$venv/bin/python" -m pip install -v --disable-pip-version-check .; } >>"$logs/pip-install.log" 2>&1; then
  tail -n 30 "$logs/pip-install.log"
  echo "test-python: pip install . failed after $(($(date +%s) - start)) s ($library); full log: $logs/pip-install.log"
  exit 1
fi
echo "test-python: pip install . took $(($(date +%s) - start)) s ($library; log: $logs/pip-install.log)"

# Run from tests/python's parent with the package as installed (never python/cuflash, which has no _ext).
status=0
"$venv/bin/python" -m pytest -p no:cacheprovider -q -rfEs --junitxml="$logs/pytest-junit.xml" tests/python "$@" \
  >"$logs/pytest.log" 2>&1 || status=$?
# pytest's own summary: the failures and skips (-rfEs) and the count line
# (or, where pytest itself died, the end of its output).
if grep -q 'short test summary info' "$logs/pytest.log"; then
  sed -n '/short test summary info/,$p' "$logs/pytest.log" | sed '1d; s/^/test-python: /'
elif [ "$status" -eq 0 ]; then
  tail -n 1 "$logs/pytest.log" | sed 's/^/test-python: /'
else
  tail -n 20 "$logs/pytest.log"
fi
[ "$status" -eq 0 ] || echo "test-python: pytest failed (status $status); full log: $logs/pytest.log"
exit "$status"
