#!/usr/bin/env bash
# Every test: set up, build with gcc (release, -Werror) and run the suite, then build with clang
# under AddressSanitizer + UndefinedBehaviorSanitizer (-Werror) and run the suite again.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export DQ_DATA_DIR="${DQ_DATA_DIR:-$(cd .. && pwd)/shared/data}"

echo "== gcc release build: meson test"
meson test -C build --print-errorlogs --num-processes 2

echo "== clang ASan+UBSan build: meson test"
if [ ! -f build-asan/build.ninja ]; then
  CC=clang meson setup build-asan -Dbuildtype=debug -Doptimization=1 -Dwerror=true \
    -Db_sanitize=address,undefined -Db_lundef=false
fi
ninja -C build-asan
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1 \
UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  meson test -C build-asan --print-errorlogs --num-processes 2 --timeout-multiplier 4

# ThreadSanitizer: the daemon under load from programs with a main() of their own (Criterion's
# runner itself crashes under TSan, SEGV in libcriterion before any test runs, so the Criterion
# suites stay in the two runs above). gpu_e2e check drives the worker threads, the io threads and
# the emulated GPU threads of dquantd-fakecuda; about 80 s on 2 cores plus the build.
echo "== clang TSan build: the daemon's threads"
if [ ! -f build-tsan/build.ninja ]; then
  CC=clang meson setup build-tsan -Dbuildtype=debug -Doptimization=1 -Dwerror=true \
    -Db_sanitize=thread -Db_lundef=false
fi
ninja -C build-tsan tests/daemon/gpu_e2e_fake tests/daemon/dquantd-fakecuda tests/daemon/dqd_fuzz_replay
TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
  meson test -C build-tsan --no-rebuild --print-errorlogs --num-processes 2 --timeout-multiplier 4 \
  daemon-gpu-fake-check daemon-fuzz-replay
