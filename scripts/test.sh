#!/usr/bin/env bash
# Builds everything (scripts/build.sh), then runs every test with CTest. The
# output ends with CTest's summary and the exit code is CTest's. GPU tests skip
# where no GPU is visible.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

./scripts/build.sh
exec ctest --test-dir build --output-on-failure -j "$(nproc)"
