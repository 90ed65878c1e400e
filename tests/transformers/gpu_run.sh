#!/bin/bash
# The transformers integration on the GPU host: build dquantd (cuda backend) and the libraries,
# install the Python package with pip (beside the host's torch and transformers), run
# tests/transformers/test_transformers.py (CUDA model + cuda backend, then CPU model + cpu
# backend) and the disaggregated prefill -> decode run (scripts/disagg_demo.py) on each model
# folder given. Results (logs, JSON) go to $OUT (default ./gpu-out).
#
#   source .debs/gpu-host-env.sh && tests/transformers/gpu_run.sh .models/bytellama-n1024
#
# A model folder may hold model.safetensors.gz instead of model.safetensors (the tree that travels
# to the GPU host is limited in size); it is unpacked in place. SKIP_TESTS=1 / SKIP_DEMO=1 /
# SKIP_CPU=1 skip parts; DEMO_ARGS are passed to disagg_demo.py.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$ROOT/gpu-out}
BUILD=${BUILD:-$ROOT/build-gpu}
mkdir -p "$OUT"
say() { echo "[gpu_run $(date +%T)] $*" >&2; }
[ $# -ge 1 ] || { echo "usage: $0 MODEL_DIR..." >&2; exit 2; }

t0=$(date +%s)
if [ ! -f "$BUILD/build.ninja" ]; then
    meson setup "$BUILD" "$ROOT" -Dcuda=enabled -Dbuildtype=release > "$OUT/build.log" 2>&1 ||
        { tail -40 "$OUT/build.log"; exit 1; }
fi
ninja -C "$BUILD" -j "$(nproc)" daemon/dquantd lib/libdquant.so.0.1.0 client/lib/libdquant-client.so.0.1.0 >> "$OUT/build.log" 2>&1 ||
    { grep -E "error|FAILED" "$OUT/build.log" | tail -30; exit 1; }
say "built in $(( $(date +%s) - t0 )) s"

# The package installed with pip into a folder of its own (the host's torch and transformers live
# in user site-packages, which a venv would not see).
PKG=${PKG:-/tmp/dquant-pkg}
python3 -m pip install -q --no-build-isolation --no-index --upgrade --target "$PKG" "$ROOT/client/python" \
    > "$OUT/pip.log" 2>&1 || { cat "$OUT/pip.log"; exit 1; }
export PYTHONPATH="$PKG${PYTHONPATH:+:$PYTHONPATH}"
export DQUANT_LIB_DIR="$BUILD/lib:$BUILD/client/lib"
export DQUANTD="$BUILD/daemon/dquantd"
PY=python3
"$PY" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__,
    "cuda", torch.cuda.is_available())' | tee "$OUT/versions.txt"

status=0
for model in "$@"; do
    name=$(basename "$model")
    if [ -f "$model/model.safetensors.gz" ] && [ ! -f "$model/model.safetensors" ]; then
        gunzip -k "$model/model.safetensors.gz"
    fi
    if [ "${SKIP_TESTS:-0}" != 1 ]; then
        say "$name: transformers tests, CUDA model on the cuda backend"
        DQ_MODEL_DIR=$model DQ_TORCH_DEVICE=cuda DQ_BACKEND=cuda timeout 900 "$PY" "$ROOT/tests/transformers/test_transformers.py" -v \
            > "$OUT/test-$name-cuda.log" 2>&1 || status=1
        grep -E "agreement|leading|tier|^(OK|FAILED|Ran)" "$OUT/test-$name-cuda.log" || true
        if [ "${SKIP_CPU:-0}" != 1 ]; then
            say "$name: transformers tests, CPU model on the cpu backend"
            DQ_MODEL_DIR=$model DQ_TORCH_DEVICE=cpu DQ_BACKEND=cpu timeout 900 "$PY" "$ROOT/tests/transformers/test_transformers.py" -v \
                > "$OUT/test-$name-cpu.log" 2>&1 || status=1
            grep -E "agreement|leading|tier|^(OK|FAILED|Ran)" "$OUT/test-$name-cpu.log" || true
        fi
    fi
    if [ "${SKIP_DEMO:-0}" != 1 ]; then
        say "$name: disaggregated run"
        timeout 900 "$PY" "$ROOT/scripts/disagg_demo.py" --dquantd "$DQUANTD" --model "$model" \
            --json "$OUT/disagg-$name.json" ${DEMO_ARGS:-} 2>&1 | tee "$OUT/disagg-$name.log" || status=1
    fi
done
say "done in $(( $(date +%s) - t0 )) s, status $status"
exit $status
