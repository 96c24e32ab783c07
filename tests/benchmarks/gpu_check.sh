#!/usr/bin/env bash
# One call on a GPU machine: the whole test suite, then the training benchmarks side by side with a
# plain torch.nn.Transformer, and a profile; decoding speed, its profile and `nmt translate`'s
# start-up. Results go to $OUT (default: ./gpu-results), with summary.json (gpu_summary.py) after each call.
#   WHEELS=DIR   wheels to install first (subword-nmt, sacremoses, ... where the machine lacks them:
#     gpu_carry.sh puts them and the data in .gpu/)
#   NMT_SHARED_DATA=DIR   Multi30k for the tests that read it, and for the decode stage
#   TESTS="tests/test_gpu.py ..."   the tests stage runs these only (default: the whole suite)
#   STAGES="loss tests speed compile buckets decode quickstart"   which parts to run (default: tests speed compile);
#     one or two per call keep a call within a 10-minute limit (buckets: one of COMPILE_ARCHS per call)
#   DECODE_ARCHS="small"   the presets the decode stage trains for TRAIN_MINUTES (1.5) each (one per
#     call keeps a call within a 10-minute limit: "base" in a second call), then decodes
#     test_2016_flickr in fp32 and bf16 without and with --cuda-graphs, with graphs also reading the
#     search's state every READS (1 4 16; empty: none) steps, checks that graphs give the same lines (graph_check.py),
#     and times `nmt translate` of 100 lines on the GPU (without and with graphs) and the CPU
#     (ROUNDS: 3 each)
#   DATA_BIN=DIR   the decode stage's Multi30k en-de, preprocessed as it would (gpu_carry.sh), to save the device's time
#   COMPILE_TIMEOUT=300   seconds for each arch of the compile stage
#   QUICKSTART_MINUTES=10   the quickstart stage: data/quickstart.sh (the README's main job) on the GPU
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-results}
mkdir -p "$OUT"
if [ -n "${WHEELS:-}" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site "$WHEELS"/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
STAGES=${STAGES:-tests speed compile}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/device.txt"
python3 -c "import torch; print('torch', torch.__version__)" | tee -a "$OUT/device.txt"

if [[ $STAGES == *loss* ]]; then  # the label-smoothed loss alone, each way, fp32 and bf16 (half a minute)
    for dtype in bfloat16 float32; do
        timeout 120 python3 tests/benchmarks/loss_speed.py --device cuda --dtype $dtype 2>>"$OUT/stderr.txt" \
            | tee -a "$OUT/loss_speed.jsonl"
    done
fi
if [[ $STAGES == *speed* ]]; then
    for arch in base big; do
        timeout 150 python3 tests/benchmarks/gpu_speed.py --arch "$arch" --baseline --profile "$OUT/profile_$arch.txt" \
            2>>"$OUT/stderr.txt" | tee -a "$OUT/gpu_speed.jsonl"
    done
fi
mkdir -p /tmp/bin && printf '#!/bin/sh\nexec python3 -m nmt_cli "$@"\n' > /tmp/bin/nmt && chmod +x /tmp/bin/nmt
export PATH=/tmp/bin:$PATH  # `nmt`, as the README's commands and data/*.sh call it (the package is not installed)
if [[ $STAGES == *tests* ]]; then
    # one thread a worker, 14 workers on 16 cores; each failure written to failures.txt as it happens
    OMP_NUM_THREADS=1 NMT_TEST_FAILURES="$OUT/failures.txt" timeout ${TEST_TIMEOUT:-420} python3 -m pytest -q \
        -n ${TEST_WORKERS:-14} -p no:cacheprovider --tb=short ${TESTS:-} > "$OUT/pytest.txt" 2>&1
    tail -25 "$OUT/pytest.txt"
fi
if [[ $STAGES == *compile* ]]; then
    for arch in ${COMPILE_ARCHS:-base big}; do
        timeout ${COMPILE_TIMEOUT:-300} python3 tests/benchmarks/gpu_speed.py --arch "$arch" --compile --baseline \
            --profile "$OUT/profile_${arch}_compiled.txt" 2>>"$OUT/stderr.txt" | tee -a "$OUT/gpu_speed.jsonl"
    done
fi
if [[ $STAGES == *buckets* ]]; then  # compiled, once per shape of 16 length buckets (nmt train --length-buckets),
    for arch in ${COMPILE_ARCHS:-base big}; do  # in each of BUCKET_MODES (reduce-overhead: a CUDA graph per shape)
        for mode in ${BUCKET_MODES:-default reduce-overhead}; do
            timeout 280 python3 tests/benchmarks/gpu_speed.py --arch "$arch" --compile --compile-mode "$mode" \
                --length-buckets 16 2>>"$OUT/stderr.txt" | tee -a "$OUT/gpu_speed.jsonl"
        done
    done
fi
if [[ $STAGES == *decode* ]]; then
    multi30k=$NMT_SHARED_DATA/multi30k
    work=$(mktemp -d)
    if [ -n "${DATA_BIN:-}" ]; then cp -r "$DATA_BIN" "$work/data"; else
        python3 -m nmt_cli preprocess -s en -t de --trainpref "$multi30k/train" --validpref "$multi30k/val" \
            --destdir "$work/data" --bpe-merges 8000 --max-len-ratio 3 --quiet || exit 1
    fi
    for arch in ${DECODE_ARCHS:-small}; do
        timeout 300 python3 -m nmt_cli train "$work/data" --save-dir "$work/$arch" --arch "$arch" --device cuda \
            --lr-schedule inverse-sqrt --lr 1e-3 --warmup 400 --max-tokens 8192 --max-time "${TRAIN_MINUTES:-1.5}" \
            --quiet 2>>"$OUT/stderr.txt"
        for graphs in "" --cuda-graphs; do
            for precision in fp32 bf16; do
                timeout 120 python3 tests/benchmarks/decode_speed.py -m "$work/$arch/checkpoint_last.pt" --device cuda \
                    --precision "$precision" $graphs --ref "$multi30k/test_2016_flickr.de" \
                    --profile "$OUT/decode_profile_${arch}_$precision$graphs.txt" 2>>"$OUT/stderr.txt" \
                    | tee -a "$OUT/decode_speed.jsonl"
            done
        done
        for reads in ${READS-1 4 16}; do  # how often the search reads which sentences are done (8 by default)
            timeout 120 python3 tests/benchmarks/decode_speed.py -m "$work/$arch/checkpoint_last.pt" --device cuda \
                --precision bf16 --cuda-graphs --steps-between-reads $reads 2>>"$OUT/stderr.txt" \
                | tee -a "$OUT/decode_speed.jsonl"
        done
        timeout 180 python3 tests/benchmarks/graph_check.py -m "$work/$arch/checkpoint_last.pt" --device cuda \
            --precision bf16 2>>"$OUT/stderr.txt" | tee -a "$OUT/graph_check.jsonl"
        for device in "cuda" "cuda --cuda-graphs" "cpu"; do
            timeout 120 python3 tests/benchmarks/translate_startup.py -m "$work/$arch/checkpoint_last.pt" \
                --rounds ${ROUNDS:-3} --device $device 2>>"$OUT/stderr.txt" | tee -a "$OUT/translate_startup.jsonl"
        done
    done
    rm -rf "$work"
fi
if [[ $STAGES == *quickstart* ]]; then  # the README's main job on the GPU for QUICKSTART_MINUTES (10)
    work=$(mktemp -d)
    MULTI30K_DIR=$NMT_SHARED_DATA/multi30k WORK=$work DEVICE=cuda \
        MINUTES=${QUICKSTART_MINUTES:-10} timeout $((${QUICKSTART_MINUTES:-10} * 60 + 150)) bash data/quickstart.sh \
        > "$OUT/quickstart.txt" 2>>"$OUT/stderr.txt"
    tail -1 "$OUT/quickstart.txt"
    rm -rf "$work"
fi
python3 tests/benchmarks/gpu_summary.py "$OUT"  # summary.json: the figures so far, null where unmeasured
