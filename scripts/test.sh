#!/usr/bin/env bash
# Builds everything (scripts/build.sh), runs every test with CTest, then the
# Python package's tests (scripts/test-python.sh: pip install . into .venv,
# pytest tests/python). The exit code is non-zero when either failed. GPU
# tests skip where no GPU is visible; torch tests where torch is not installed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

./scripts/build.sh
status=0
ctest --test-dir build --output-on-failure -j "$(nproc)" || status=$?
./scripts/test-python.sh || status=$?
exit $status
