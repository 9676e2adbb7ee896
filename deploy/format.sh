#!/usr/bin/env bash
# Formats the tracked C, C++ and CUDA sources with clang-format and the
# root .clang-format.
# Usage: deploy/format.sh          rewrite the files in place
#        deploy/format.sh --check  change nothing; print each place that differs
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

# --dry-run --Werror: one warning per place that differs, exit 1 if any.
if ! printf '%s\0' "${files[@]}" | xargs -0 -n 50 -P 2 "$CLANG_FORMAT" --style=file --dry-run --Werror; then
  echo "format.sh: the places above differ from .clang-format; run deploy/format.sh" >&2
  exit 1
fi
