#!/usr/bin/env bash
# Formats the tracked C/CUDA sources in place with clang-format (settings: .clang-format).
#   scripts/format.sh            reformat every file
#   scripts/format.sh --check    change nothing; list the files that are not formatted, exit 1 if any
#   scripts/format.sh [--check] FILE...   only these files
# CLANG_FORMAT=/path/to/clang-format overrides the binary. The settings are tuned to clang-format 14
# (Debian 12); other versions may format some constructs differently.
set -euo pipefail
cd "$(dirname "$0")/.."

check=0
if [ "${1:-}" = "--check" ]; then
  check=1
  shift
fi
case "${1:-}" in
-h | --help)
  sed -n '2,7s/^# \{0,1\}//p' "$0"
  exit 0
  ;;
-*)
  echo "format.sh: unknown option '$1' (--check, --help)" >&2
  exit 2
  ;;
esac

cf=${CLANG_FORMAT:-}
if [ -z "$cf" ]; then
  for c in clang-format-14 clang-format; do
    if command -v "$c" >/dev/null 2>&1; then
      cf=$c
      break
    fi
  done
fi
if [ -z "$cf" ] || ! command -v "$cf" >/dev/null 2>&1; then
  echo "format.sh: clang-format not found; install it (apt-get install clang-format) or set CLANG_FORMAT" >&2
  exit 2
fi
ver=$("$cf" --version | sed -n 's/.*version \([0-9]*\).*/\1/p')
[ "$ver" = 14 ] || echo "format.sh: warning: $cf is version ${ver:-unknown}, .clang-format is tuned to 14" >&2

# Tracked C/CUDA sources. Nothing generated is tracked (protoc-c output lives in the build
# directory); corpora and templates are not C files, so they never match.
if [ $# -gt 0 ]; then
  files=("$@")
else
  mapfile -t files < <(git ls-files -- '*.c' '*.h' '*.cu' '*.cuh')
fi

if [ $check -eq 0 ]; then
  printf '%s\0' "${files[@]}" | xargs -0 -n 32 "$cf" -i
  exit 0
fi

bad=0
for f in "${files[@]}"; do
  if ! "$cf" --dry-run --Werror "$f" >/dev/null 2>&1; then
    echo "$f"
    bad=$((bad + 1))
  fi
done
if [ $bad -gt 0 ]; then
  echo "format.sh: $bad file(s) not formatted; run scripts/format.sh" >&2
  exit 1
fi
