#!/usr/bin/env bash
# Installs from Debian what building and testing cuflash needs, when it is
# missing: cmake, ninja-build, g++, libgtest-dev, python3 and pip (which
# scripts/fetch-cudnn-frontend.sh uses to fetch the cuDNN frontend). Idempotent: with
# everything present it installs nothing and says what it found. The CUDA
# toolkit is not installed here; scripts/build.sh uses nvcc when it finds one.
set -euo pipefail

missing=()

# A tool counts as present when its command is on PATH, wherever it came from.
check_command() {  # <command> <Debian package>
  local path
  if path=$(command -v "$1"); then
    echo "setup-deps: found $1 at $path: $("$1" --version 2>&1 | head -n 1)"
  else
    missing+=("$2")
  fi
}

check_package() {  # <Debian package>
  if dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; then
    echo "setup-deps: found $1 $(dpkg-query -W -f='${Version}' "$1")"
  else
    missing+=("$1")
  fi
}

check_command cmake cmake
check_command ninja ninja-build
check_command g++ g++
check_command python3 python3
check_package libgtest-dev
if command -v python3 >/dev/null && python3 -m pip --version >/dev/null 2>&1; then
  echo "setup-deps: found pip: $(python3 -m pip --version 2>&1 | head -n 1)"
else
  missing+=(python3-pip)
fi

if ((${#missing[@]} > 0)); then
  if ! command -v apt-get >/dev/null; then
    echo "setup-deps: missing ${missing[*]}, and apt-get is not available: install them by hand" >&2
    exit 1
  fi
  sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "setup-deps: need root or sudo to install ${missing[*]}" >&2; exit 1; }
    sudo=(sudo)
  fi
  echo "setup-deps: installing ${missing[*]}"
  "${sudo[@]}" apt-get update
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
fi

# The top CMakeLists.txt needs CMake 3.25 (Debian 12's version).
cmake_version=$(cmake --version | sed -n 's/^cmake version \([0-9.]*\).*/\1/p')
if [ "$(printf '%s\n' 3.25 "$cmake_version" | sort -V | head -n 1)" != 3.25 ]; then
  echo "setup-deps: cmake $cmake_version is older than 3.25, which cuflash needs" >&2
  exit 1
fi
echo "setup-deps: all dependencies present"
