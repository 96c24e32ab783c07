#!/usr/bin/env bash
# One call on a GPU machine: the whole test suite, then the training benchmarks side by side with a
# plain torch.nn.Transformer, and a profile. Results go to $OUT (default: ./gpu-results).
#   WHEELS=DIR   wheels to install first (subword-nmt, sacremoses, ... where the machine lacks them)
#   NMT_SHARED_DATA=DIR   Multi30k for the tests that read it
#   STAGES="tests speed compile"   which parts to run
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-results}
mkdir -p "$OUT"
if [ -n "${WHEELS:-}" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$WHEELS"/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
STAGES=${STAGES:-tests speed compile}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/device.txt"
python3 -c "import torch; print('torch', torch.__version__)" | tee -a "$OUT/device.txt"

if [[ $STAGES == *speed* ]]; then
    for arch in base big; do
        timeout 150 python3 tests/benchmarks/gpu_speed.py --arch "$arch" --baseline --profile "$OUT/profile_$arch.txt" \
            2>>"$OUT/stderr.txt" | tee -a "$OUT/gpu_speed.jsonl"
    done
fi
if [[ $STAGES == *tests* ]]; then
    timeout ${TEST_TIMEOUT:-420} python3 -m pytest -q -n 12 -p no:cacheprovider 2>&1 | tail -40 > "$OUT/pytest.txt"
    tail -15 "$OUT/pytest.txt"
fi
if [[ $STAGES == *compile* ]]; then
    for arch in ${COMPILE_ARCHS:-base big}; do
        timeout 300 python3 tests/benchmarks/gpu_speed.py --arch "$arch" --compile --baseline 2>>"$OUT/stderr.txt" \
            | tee -a "$OUT/gpu_speed.jsonl"
    done
fi
