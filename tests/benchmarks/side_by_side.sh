#!/usr/bin/env bash
# The README's side-by-side table in one command: rounds of interleaved runs of nmt-cli, fairseq
# and CTranslate2 on the same data and weights, one labelled JSON line per run.
#
#   DATA=DIR CKPT=FILE FAIRSEQ_BIN=VENV/bin bash tests/benchmarks/side_by_side.sh > runs.log
#
# DATA: `nmt preprocess` of Multi30k en-de (8,000 merges); CKPT: a checkpoint trained on it;
# FAIRSEQ_BIN: bin/ of a virtual environment with fairseq 0.12.2 and nmt-cli installed (see
# fairseq_train_speed.py); ctranslate2 must be installed where `python` runs. ROUNDS (3).
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${DATA:?set DATA}" "${CKPT:?set CKPT}" "${FAIRSEQ_BIN:?set FAIRSEQ_BIN}"
ROUNDS=${ROUNDS:-3}
SHARED=${NMT_SHARED_DATA:-../shared/data}
REF=$SHARED/multi30k/test_2016_flickr.de
run() { label=$1; shift; echo "$label $("$@" 2>/dev/null | grep '^{' | tail -1)"; }
for _ in $(seq "$ROUNDS"); do
  run train-nmt python tests/benchmarks/train_speed.py "$DATA" --updates 40
  run train-fairseq python tests/benchmarks/fairseq_train_speed.py "$DATA" --fairseq-bin "$FAIRSEQ_BIN"
done
for _ in $(seq "$ROUNDS"); do
  run decode-nmt-fp32 python tests/benchmarks/decode_speed.py -m "$CKPT" --ref "$REF"
  run decode-nmt-int8 python tests/benchmarks/decode_speed.py -m "$CKPT" --ref "$REF" --quantize int8
  run decode-fairseq "$FAIRSEQ_BIN/python" tests/benchmarks/fairseq_decode_speed.py -m "$CKPT"
  run decode-ct2-fp32 python tests/benchmarks/ctranslate2_decode_speed.py -m "$CKPT"
  run decode-ct2-int8 python tests/benchmarks/ctranslate2_decode_speed.py -m "$CKPT" --compute-type int8
done
python tests/benchmarks/fairseq_preprocess_speed.py --fairseq-bin "$FAIRSEQ_BIN" --rounds "$ROUNDS" 2>/dev/null \
  | grep '^{' | sed 's/^/preprocess-side-by-side /'
for _ in $(seq "$ROUNDS"); do
  python tests/benchmarks/preprocess_speed.py --repeat 1 2>/dev/null | grep '^{' | sed 's/^/preprocess-x1 /'
  python tests/benchmarks/preprocess_speed.py --repeat 4 2>/dev/null | grep '^{' | sed 's/^/preprocess-x4 /'
done
