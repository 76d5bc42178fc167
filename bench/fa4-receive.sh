#!/usr/bin/env bash
# On the GPU machine: FlashAttention-4 for bench/prefill.py's `fa4` peer, from
# the wheels scripts/stage-fa4-wheels.sh staged in two parts (one per device
# call: see there). Each call copies the part it carried into $FA4_DIR
# (default /root/fa4, outside the tree, so a warm machine keeps it); once
# both parts are there it joins the compiler's wheel (sha256 checked),
# installs every wheel with pip --no-deps --target $FA4_DIR/site, and runs
# bench/fa4_check.py: FlashAttention-4 against PyTorch's math SDPA in float32
# at the sweep's head dims, causal and not, forward and backward (which also
# compiles the kernels the sweep runs into FlashAttention-4's disk cache).
# Writes $FA4_DIR/env, to source before the sweep:
#   bench/fa4-receive.sh && . /root/fa4/env && python3 bench/prefill.py ... --backends ...,fa4
# Exit 0: installed and checked; 3: a part is still missing (carry the other
# one in the next call); 1: an error (a wrong checksum, a failed install or check).
set -uo pipefail
cd "$(dirname "$0")/.."
dir=${FA4_DIR:-/root/fa4}
mkdir -p "$dir/parts"
for part in .fa4/part1 .fa4/part2; do
  [ -d "$part" ] && cp -f "$part"/* "$dir/parts/"
done
if [ -f "$dir/env" ]; then
  echo "fa4-receive: installed already ($dir/env)"
  exit 0
fi
manifest=$dir/parts/manifest
[ -f "$manifest" ] || { echo "fa4-receive: part2 (with the manifest) not received yet"; exit 3; }
read -r _ wheel sha < <(grep '^wheel ' "$manifest")
read -r _ parts < <(grep '^parts ' "$manifest")
pieces=()
for ((i = 0; i < parts; i++)); do
  piece=$(printf '%s/%s.part%02d' "$dir/parts" "$wheel" "$i")
  [ -f "$piece" ] || { echo "fa4-receive: $(basename "$piece") not received yet"; exit 3; }
  pieces+=("$piece")
done
cat "${pieces[@]}" >"$dir/$wheel"
echo "$sha  $dir/$wheel" | sha256sum -c --quiet || { echo "fa4-receive: $wheel: wrong sha256" >&2; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$dir/site" \
  "$dir/$wheel" "$dir"/parts/*.whl || { echo "fa4-receive: pip install failed" >&2; exit 1; }
# The site's .pth files (nvidia-cutlass-dsl's adds its dsl_packages, where
# `cutlass` lives) are not read from a PYTHONPATH entry: their paths are
# taken out here, by site.addsitedir, and listed after it.
paths=$(python3 -c "import site, sys; before = set(sys.path); site.addsitedir(sys.argv[1]); print(':'.join(p for p in sys.path if p not in before))" "$dir/site") ||
  { echo "fa4-receive: reading $dir/site's .pth files failed" >&2; exit 1; }
cat >"$dir/env" <<ENV
export PYTHONPATH=$paths\${PYTHONPATH:+:\$PYTHONPATH}
export FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=$dir/cache
ENV
# shellcheck disable=SC1091
. "$dir/env"
if ! python3 bench/fa4_check.py; then
  mv "$dir/env" "$dir/env.unchecked"
  echo "fa4-receive: bench/fa4_check.py failed: fa4 is not a peer to time" >&2
  exit 1
fi
echo "fa4-receive: installed and checked; . $dir/env"
