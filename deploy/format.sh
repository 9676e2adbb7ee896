#!/usr/bin/env bash
# Formats the tracked C, C++ and CUDA sources with clang-format and the
# root .clang-format.
# Usage: deploy/format.sh          rewrite the files in place
#        deploy/format.sh --check  change nothing; list the files that differ
#                                  from the format and exit 1 if any does
# CLANG_FORMAT selects the binary (default: clang-format).
set -euo pipefail
cd "$(dirname "$0")/.."

CLANG_FORMAT="${CLANG_FORMAT:-clang-format}"
check=0
case "${1:-}" in
  "") ;;
  --check) check=1 ;;
  *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac
if ! command -v "$CLANG_FORMAT" >/dev/null; then
  echo "format.sh: $CLANG_FORMAT not found (apt-get install clang-format)" >&2
  exit 2
fi

mapfile -d '' files < <(git ls-files -z -- '*.c' '*.cc' '*.cpp' '*.h' '*.hpp' '*.cu' '*.cuh')
if [ "${#files[@]}" -eq 0 ]; then exit 0; fi

if [ "$check" -eq 0 ]; then
  printf '%s\0' "${files[@]}" | xargs -0 -n 50 "$CLANG_FORMAT" -i --style=file
  exit 0
fi

differ=0
for f in "${files[@]}"; do
  if ! "$CLANG_FORMAT" --style=file "$f" | cmp -s - "$f"; then
    echo "$f"
    differ=1
  fi
done
if [ "$differ" -ne 0 ]; then
  echo "format.sh: the files above differ from .clang-format; run deploy/format.sh" >&2
fi
exit "$differ"
