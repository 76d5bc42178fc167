#!/usr/bin/env bash
# Builds everything (library, cuflash command, tests) into build/: Release,
# Ninja, all cores, after installing missing build tools (scripts/setup-deps.sh).
# The CUDA targets are built when nvcc is found, on PATH or in /usr/local/cuda/bin
# (CUFLASH_ENABLE_CUDA=OFF in the environment leaves them out, as for pip install .);
# with them the cuDNN backend, when cuDNN 9 is found (cmake/cudnn.cmake) and the
# cuDNN frontend headers are in .deps/ (fetched here by scripts/fetch-cudnn-frontend.sh).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

./scripts/setup-deps.sh

if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
cuda=OFF
if command -v nvcc >/dev/null && [ "${CUFLASH_ENABLE_CUDA:-ON}" != OFF ]; then cuda=ON; fi
# Without the headers (no network, say) the build goes on without the cuDNN backend.
if [ "$cuda" = ON ] && ! ./scripts/fetch-cudnn-frontend.sh; then
  echo "build.sh: could not fetch the cuDNN frontend headers; building without the cuDNN backend" >&2
fi

# A build/ configured for another generator cannot be reused with Ninja.
if [ -f build/CMakeCache.txt ] && ! grep -qx 'CMAKE_GENERATOR:INTERNAL=Ninja' build/CMakeCache.txt; then
  echo "build.sh: build/ was configured with another generator; configuring it afresh for Ninja"
  rm -rf build/CMakeCache.txt build/CMakeFiles
fi

start=$(date +%s)
configure_log=$(mktemp)
trap 'rm -f "$configure_log"' EXIT
# CUFLASH_REQUIRE_CUDNN=ON (.ci/run sets it): with CUDA, a build without the cuDNN backend is an error.
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCUFLASH_ENABLE_CUDA="$cuda" \
  -DCUFLASH_REQUIRE_CUDNN="${CUFLASH_REQUIRE_CUDNN:-OFF}" | tee "$configure_log"
# The build's output is kept in build/build.log too, and its compiler warnings
# counted: a clean build has none (ptxas spill warnings that are known and
# accepted are filtered by cmake/accepted-spills.txt; any other spill warns).
cmake --build build -j "$(nproc)" 2>&1 | tee build/build.log

# CMakeLists.txt reports "cuflash: CUDA backend ON|OFF (architectures: ...)".
summary=$(sed -n 's/.*cuflash: CUDA backend \(ON\|OFF\) (architectures: \(.*\))$/\1 \2/p' "$configure_log" | tail -n 1)
if [ "${summary%% *}" = ON ]; then
  echo "cuflash: CUDA targets ON (architectures ${summary#ON })"
elif [ "$cuda" = ON ]; then
  echo "cuflash: CUDA targets OFF (architectures none: nvcc was found but CMake could not use it, see above)"
else
  echo "cuflash: CUDA targets OFF (architectures none: $([ "${CUFLASH_ENABLE_CUDA:-ON}" = OFF ] && echo "CUFLASH_ENABLE_CUDA=OFF" || echo "no nvcc found"))"
fi
grep -h 'cuflash: cuDNN backend' "$configure_log" | tail -n 1 | sed 's/^-- //'
warnings=$(grep -Eci '(^|[^a-z])warning( #[0-9]+-D)? ?:' build/build.log || true)
echo "cuflash: build took $(($(date +%s) - start)) s, $warnings compiler warnings (output in build/build.log)"
