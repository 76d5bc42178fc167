#!/usr/bin/env bash
# Run here, before a device run: the GPU machine has no GoogleTest package, no
# cuDNN frontend and no network, so GoogleTest's sources (Debian's googletest,
# installed here by setup-deps.sh) and the cuDNN frontend headers
# (scripts/fetch-cudnn-frontend.sh) travel in the git-ignored .deps/ folder.
# Then call the device with carry [".deps"] and
# `CUFLASH_COMMIT=$(git rev-parse --short HEAD) scripts/gpu-check.sh`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[ -d /usr/src/googletest ] || ./scripts/setup-deps.sh
mkdir -p .deps
rm -rf .deps/googletest
cp -r /usr/src/googletest .deps/googletest
echo "staged .deps/googletest ($(du -sh .deps/googletest | cut -f1))"
./scripts/fetch-cudnn-frontend.sh
