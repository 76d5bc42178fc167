#!/usr/bin/env bash
# The CUDA compiler launcher of the library (src/CMakeLists.txt): runs the
# compile command given after the list and passes its messages on, except
# ptxas's spill warnings (-Xptxas=-warn-spills) for the kernels that
# cmake/accepted-spills.txt lists, as long as they spill no more bytes than
# it says. Any other spill, or a listed one that grew, still warns.
#   filter-spills.sh <accepted-spills.txt> <compiler> [args...]
set -uo pipefail
accepted_file=$1
shift

declare -A max_stores max_loads
if [ -f "$accepted_file" ]; then
  while read -r function stores loads _; do
    case "$function" in '' | '#'*) continue ;; esac
    max_stores[$function]=$stores
    max_loads[$function]=$loads
  done <"$accepted_file"
fi

messages=$(mktemp)
trap 'rm -f "$messages"' EXIT
"$@" 2>"$messages"
status=$?

spill="^ptxas warning : Registers are spilled to local memory in function '([^']+)', ([0-9]+) bytes spill stores, ([0-9]+) bytes spill loads"
while IFS= read -r line || [ -n "$line" ]; do
  if [[ $line =~ $spill ]]; then
    function=${BASH_REMATCH[1]} stores=${BASH_REMATCH[2]} loads=${BASH_REMATCH[3]}
    if [ -n "${max_stores[$function]+set}" ] &&
       [ "$stores" -le "${max_stores[$function]}" ] && [ "$loads" -le "${max_loads[$function]}" ]; then
      continue
    fi
  fi
  printf '%s\n' "$line" >&2
done <"$messages"
exit "$status"
