#!/usr/bin/env bash
# Checks that every tracked C++ / CUDA source (*.h, *.cc, *.cu, *.cuh) is
# clang-formatted (.clang-format: Google style). Prints the unformatted files
# and fails when there are any; fix them with `clang-format -i FILE...`.
# scripts/test.sh runs it first. CLANG_FORMAT overrides the binary (default:
# clang-format, Debian 12's is version 14; other versions may format a few
# constructs differently).
set -euo pipefail
cd "$(dirname "$0")/.."
clang_format=${CLANG_FORMAT:-clang-format}
command -v "$clang_format" > /dev/null \
  || { echo "check-format: $clang_format not found (scripts/install-deps.sh installs it)"; exit 1; }

bad=()
checked=0
while IFS= read -r -d '' f; do
  [[ -f $f ]] || continue  # deleted in the work tree, not yet committed
  checked=$((checked + 1))
  "$clang_format" --dry-run -Werror "$f" > /dev/null 2>&1 || bad+=("$f")
done < <(git ls-files -z -- '*.h' '*.cc' '*.cu' '*.cuh')

if ((${#bad[@]})); then
  echo "check-format: ${#bad[@]} of $checked files are not clang-formatted:"
  printf '  %s\n' "${bad[@]}"
  echo "fix with: $clang_format -i ${bad[*]}"
  exit 1
fi
echo "check-format: all $checked files formatted"
