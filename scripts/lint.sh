#!/usr/bin/env bash
# Static analysis that the tree passes today, run by CI: cppcheck (warnings and portability) on
# the parts that build without generated or CUDA headers: lib/src and proto/*.c. -Wall -Wextra
# -Werror in the build cover the rest. Exit 1 on any finding, 2 when cppcheck is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v cppcheck >/dev/null 2>&1; then
  echo "lint.sh: cppcheck not found; install it (apt-get install cppcheck)" >&2
  exit 2
fi
cppcheck -q --error-exitcode=1 --enable=warning,portability --inline-suppr \
  -Ilib/include -Ilib/src -DDQ_BUILDING_LIB lib/src proto/*.c
echo "lint.sh: cppcheck clean (lib/src, proto)"
