#!/usr/bin/env bash
# Installs what the build needs (Debian packages, as root) and builds dquant into build/.
# Idempotent: a second run only rebuilds what changed.
#   scripts/setup.sh          everything the tests need, then the whole build (scripts/test.sh)
#   scripts/setup.sh --demo   only what building dquantd and the dquant tool needs, and only those
#                             two (scripts/demo.sh: no test tools, no Node.js, no test programs)
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-all}

# The build: compilers, meson, the libraries; criterion because configuring declares the tests.
PKGS=(build-essential meson ninja-build pkg-config python3 curl
      libuv1-dev libprotobuf-c-dev protobuf-c-compiler libcriterion-dev libinih-dev libxxhash-dev
      libzstd-dev libsystemd-dev libssl-dev openssl)
if [ "$MODE" != --demo ]; then
  # The tests and checks: sanitizers, formatters, the baselines' servers, Python, man pages, netns.
  PKGS+=(clang clang-format cppcheck xxhash redis-server redis-tools libclang-rt-14-dev python3-numpy
         python3-setuptools python3-venv python3-pip groff-base man-db systemd iproute2 dnsmasq-base)
  # Node.js for the offline checks of deploy/ (tests/deploy): Debian's nodejs and npm, unless a node
  # with its npm is there already (a nodejs package from elsewhere conflicts with Debian's npm).
  if ! command -v npm >/dev/null 2>&1; then
    PKGS+=(nodejs npm)
  fi
fi

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The checkers' packages (tests/deploy/package-lock.json), installed once; the tests then run offline.
if [ "$MODE" != --demo ] && { [ ! -f tests/deploy/node_modules/.package-lock.json ] ||
   [ tests/deploy/package-lock.json -nt tests/deploy/node_modules/.package-lock.json ]; }; then
  echo "setup: npm ci in tests/deploy"
  (cd tests/deploy && npm ci --no-audit --no-fund --loglevel=error)
fi

if [ ! -f build/build.ninja ]; then
  meson setup build -Dbuildtype=release -Dwerror=true
fi
if [ "$MODE" = --demo ]; then
  ninja -C build daemon/dquantd client/tool/dquant
else
  ninja -C build
fi
