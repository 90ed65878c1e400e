#!/usr/bin/env bash
# Installs what the build needs (Debian packages, as root) and builds dquant into build/.
# Idempotent: a second run only rebuilds what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS=(build-essential clang clang-format cppcheck meson ninja-build pkg-config
      libuv1-dev libprotobuf-c-dev protobuf-c-compiler libcriterion-dev libinih-dev libxxhash-dev
      libzstd-dev xxhash libsystemd-dev redis-server redis-tools libclang-rt-14-dev python3 python3-numpy
      python3-setuptools python3-venv python3-pip curl dnsmasq-base)

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

if [ ! -f build/build.ninja ]; then
  meson setup build -Dbuildtype=release -Dwerror=true
fi
ninja -C build
