#!/usr/bin/env bash
# The main job on the embedded default: set up, build, then run it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec build/client/dquant codec demo --data "${DQ_DATA_DIR:-../shared/data}"
