#!/usr/bin/env bash
# A small, fast model from a big one (sequence-level knowledge distillation, Kim & Rush 2016):
#   1. the teacher translates the training source: beam 4, NBEST hypotheses each, and the one of
#      best chrF against the reference kept (Kim & Rush's sequence-level interpolation; NBEST=1:
#      the best alone)
#   2. the distilled pairs are checked: as many lines as the source, and in its order (SPOT_CHECK
#      lines drawn at random, translated again, give the same lines: all but a tenth of them, as
#      a batch of other shapes may round a close call the other way; a shifted file gives none)
#   3. nmt preprocess of the source with the distilled targets, reusing the teacher's data
#      directory (its subwords and vocabularies: a shortlist and the teacher's tools fit both)
#   4. nmt train: the `student` preset (3 encoder layers, 1 decoder layer: a search steps the
#      decoder alone) with the quickstart's recipe (data/quickstart.yaml) for MINUTES minutes
#   5. the last 5 checkpoints averaged, a shortlist of the distilled data, and the test set
#      translated with int8 and the shortlist, timed, and scored
#   6. the teacher times the test set as the student did (beam 4, no int8 nor shortlist: as it
#      runs), and their speeds are printed side by side with their ratio
# Settings: TEACHER (a checkpoint: required), TEACHER_DATA (its data directory: default
# runs/quickstart/data of the checkout), RAW (the raw corpus, RAW/{train,val,test_2016_flickr}.{en,de}:
# default runs/quickstart/raw of the checkout), WORK (default runs/distill of the checkout),
# MINUTES (the student's training: default 30), SAMPLE (the teacher translates this many training
# pairs, drawn at random: the whole training set by default, about 80 minutes for Multi30k at
# NBEST 4 on 2 cores), THREADS, PRECISION (the student's training: default fastest, measured at
# each start: PERFORMANCE.md), NBEST (default 4), SPOT_CHECK (default 20), STUDENT_ARCH (default
# student), TRAIN_ARGS (more `nmt train` flags), SHORTLIST_ARGS (default "--first 100 --best 5"),
# LENPEN (the test set's: default 1.5, the quickstart's), SRC and TGT (default en, de). Paths are
# taken from where it is called. Off a terminal, the teacher's translation says how many lines it
# has done and the time left after each 4,096 lines (at most once a minute).
# Running it again resumes where it stopped: finished steps are kept, training resumes. A WORK
# holds one run: one made from other inputs (TEACHER, TEACHER_DATA, RAW, SAMPLE, NBEST, SRC, TGT)
# is refused; every setting is checked before any work.
set -euo pipefail
CHECKOUT=$(cd "$(dirname "$0")/.." && pwd)
TEACHER=${TEACHER:?TEACHER=CHECKPOINT bash data/distill.sh}
TEACHER_DATA=${TEACHER_DATA:-$CHECKOUT/runs/quickstart/data}
RAW=${RAW:-$CHECKOUT/runs/quickstart/raw}
WORK=${WORK:-$CHECKOUT/runs/distill}
MINUTES=${MINUTES:-30}
THREADS=${THREADS:-$(nproc)}
SPOT_CHECK=${SPOT_CHECK:-20}
PRECISION=${PRECISION:-fastest}
NBEST=${NBEST:-4}
LENPEN=${LENPEN:-1.5}
SRC=${SRC:-en}
TGT=${TGT:-de}
# Every setting checked before any work (a value is pasted into commands and Python below).
whole() {  # NAME VALUE WHAT LOW
  if ! [[ "$2" =~ ^[0-9]+$ ]] || [ "$((10#$2))" -lt "$4" ]; then
    echo "distill: $1=$2: expected a whole number of $3, $4 or more" >&2
    exit 1
  fi
}
number() {  # NAME VALUE WHAT: a decimal number above 0 (MINUTES) or at least 0 (LENPEN)
  if ! [[ "$2" =~ ^([0-9]+[.]?[0-9]*|[.][0-9]+)$ ]] || { [ "$1" = MINUTES ] && ! awk "BEGIN { exit !($2 > 0) }"; }; then
    echo "distill: $1=$2: expected $3" >&2
    exit 1
  fi
}
whole NBEST "$NBEST" hypotheses 1
[ -z "${SAMPLE:-}" ] || whole SAMPLE "$SAMPLE" "training pairs" 1
whole SPOT_CHECK "$SPOT_CHECK" "lines to check" 0
whole THREADS "$THREADS" threads 1
number MINUTES "$MINUTES" "a number of minutes above 0"
number LENPEN "$LENPEN" "a length penalty, 0 or more"
# WORK holds one run's data: another teacher, corpus, sample or n-best would train on the last one's.
inputs="TEACHER=$(realpath -m "$TEACHER") TEACHER_DATA=$(realpath -m "$TEACHER_DATA") RAW=$(realpath -m "$RAW")"
inputs+=" SAMPLE=${SAMPLE:-all} NBEST=$NBEST SRC=$SRC TGT=$TGT"
if [ -f "$WORK/inputs.txt" ] && [ "$(cat "$WORK/inputs.txt")" != "$inputs" ]; then
  echo "distill: $WORK holds the run of other inputs ($(cat "$WORK/inputs.txt")): give another WORK, or remove it" >&2
  exit 1
fi
mkdir -p "$WORK/distilled"
echo "$inputs" > "$WORK/inputs.txt"
distilled=$WORK/distilled/train${SAMPLE:+-sample$SAMPLE}
train=$RAW/train

# 1. The teacher's translations of the training source, or of SAMPLE pairs of it (nmt translate
#    writes -o only when complete).
if [ -n "${SAMPLE:-}" ]; then
  train=$WORK/distilled/sample$SAMPLE
  python3 - "$RAW/train" "$SRC" "$TGT" "$SAMPLE" "$train" <<'PYTHON'
import os, random, sys
prefix, src, tgt, count, out = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
sides = [open(f"{prefix}.{lang}", encoding="utf-8").read().split("\n")[:-1] for lang in (src, tgt)]
if len(sides[0]) != len(sides[1]):
    sys.exit(f"distill: {prefix}.{src} has {len(sides[0])} lines, {prefix}.{tgt} {len(sides[1])}")
numbers = sorted(random.Random(0).sample(range(len(sides[0])), min(count, len(sides[0]))))
for lang, lines in zip((src, tgt), sides):
    with open(f"{out}.{lang}.part", "w", encoding="utf-8") as f:
        f.writelines(lines[n] + "\n" for n in numbers)
    os.replace(f"{out}.{lang}.part", f"{out}.{lang}")
print(f"distill: the teacher translates {len(numbers)} of the {len(sides[0])} training pairs (SAMPLE)", file=sys.stderr)
PYTHON
fi
if [ ! -f "$distilled.$TGT" ]; then
  if [ "$NBEST" -gt 1 ]; then
    nmt translate -m "$TEACHER" -i "$train.$SRC" -o "$WORK/distilled/nbest.jsonl" --beam "$(( NBEST > 4 ? NBEST : 4 ))" \
      --nbest "$NBEST" --format jsonl --threads "$THREADS"
    python3 - "$WORK/distilled/nbest.jsonl" "$train.$TGT" "$distilled.$TGT.part" <<'PYTHON'
import json, sys
from sacrebleu.metrics import CHRF
chrf = CHRF()
with open(sys.argv[1], encoding="utf-8") as records, open(sys.argv[2], encoding="utf-8") as references, \
        open(sys.argv[3], "w", encoding="utf-8") as out:
    for record, reference in zip(records, references):
        texts = [h["text"] for h in json.loads(record)["nbest"]] or [""]
        out.write(max(texts, key=lambda t: chrf.sentence_score(t, [reference.rstrip("\n")]).score) + "\n")
PYTHON
    mv "$distilled.$TGT.part" "$distilled.$TGT"
  else
    nmt translate -m "$TEACHER" -i "$train.$SRC" -o "$distilled.$TGT" --beam 4 --threads "$THREADS"
  fi
fi
cp "$train.$SRC" "$distilled.$SRC"

# 2. The pairs checked: the line counts, and a spot check of the order.
source_lines=$(wc -l < "$distilled.$SRC")
target_lines=$(wc -l < "$distilled.$TGT")
if [ "$source_lines" != "$target_lines" ]; then
  echo "distill: $distilled.$TGT has $target_lines lines, $distilled.$SRC $source_lines: remove it and run again" >&2
  exit 1
fi
python3 - "$TEACHER" "$distilled.$SRC" "$distilled.$TGT" "$SPOT_CHECK" "$NBEST" <<'PYTHON'
import random, sys
from nmt_cli import Translator
teacher, source, target, count, nbest = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
sources = open(source, encoding="utf-8").read().split("\n")[:-1]
targets = open(target, encoding="utf-8").read().split("\n")[:-1]
numbers = sorted(random.Random(0).sample(range(len(sources)), min(count, len(sources))))
found = Translator.load(teacher, device="cpu", beam=max(nbest, 4)).hypotheses([sources[n] for n in numbers],
                                                                              nbest=nbest)
wrong = [n for n, hyps in zip(numbers, found) if targets[n] not in [h.text for h in hyps]]
if len(wrong) > len(numbers) // 10:
    sys.exit(f"distill: {target}:{wrong[0] + 1} and {len(wrong) - 1} more of {len(numbers)} lines checked are not the "
             f"translations of their lines of {source}: the pairs are out of order; remove it and run again")
print(f"distill: {len(sources)} pairs, {len(numbers) - len(wrong)} of {len(numbers)} spot-checked as translated",
      file=sys.stderr)
PYTHON

# 3. The distilled data, in the teacher's subwords and vocabularies.
if [ ! -f "$WORK/data/meta.json" ]; then
  nmt preprocess -s "$SRC" -t "$TGT" --trainpref "$distilled" --validpref "$RAW/val" \
    --testpref "$RAW/test_2016_flickr" --destdir "$WORK/data" --from-data "$TEACHER_DATA" --quiet
fi

# 4. The student.
SAVE_EVERY=$(python3 -c "print(max($MINUTES / 15, 0.1))")
nmt train "$WORK/data" --save-dir "$WORK/ckpt" --config "$CHECKOUT/data/quickstart.yaml" --arch "${STUDENT_ARCH:-student}" \
  --max-time "$MINUTES" --save-interval-minutes "$SAVE_EVERY" --keep-last 5 --threads "$THREADS" \
  --precision "$PRECISION" --quiet ${TRAIN_ARGS:-}

# 5. Averaged, shortlisted, quantized, evaluated.
nmt average-checkpoints --dir "$WORK/ckpt" --last 5 -o "$WORK/student.pt"
nmt shortlist "$WORK/data" -o "$WORK/shortlist.txt" ${SHORTLIST_ARGS:---first 100 --best 5}
start=$(date +%s.%N)
nmt translate -m "$WORK/student.pt" -i "$RAW/test_2016_flickr.$SRC" -o "$WORK/test_2016_flickr.hyp.$TGT" \
  --beam 4 --lenpen "$LENPEN" --quantize int8 --shortlist "$WORK/shortlist.txt" --threads "$THREADS"
student=$(python3 -c "print(round($(date +%s.%N) - $start, 1))")
echo "distill: the student translated test_2016_flickr in $student s" \
  "(int8, shortlist, $THREADS threads, start-up included)" | tee "$WORK/speed.txt"
nmt score -r "$RAW/test_2016_flickr.$TGT" -i "$WORK/test_2016_flickr.hyp.$TGT" | tee "$WORK/bleu.txt"

# 6. The teacher on the same test set, as it runs (timed once: kept in teacher_speed.txt).
if [ ! -f "$WORK/teacher_speed.txt" ]; then
  start=$(date +%s.%N)
  nmt translate -m "$TEACHER" -i "$RAW/test_2016_flickr.$SRC" -o "$WORK/test_2016_flickr.teacher.$TGT" --beam 4 \
    --lenpen "$LENPEN" --threads "$THREADS"
  python3 -c "print(round($(date +%s.%N) - $start, 1))" > "$WORK/teacher_speed.txt"
fi
teacher=$(cat "$WORK/teacher_speed.txt")
echo "distill: test_2016_flickr in $teacher s by the teacher, $student s by the student: the student" \
  "$(python3 -c "print(f'{$teacher / max($student, 0.1):.1f}')") times as fast ($THREADS threads)" | tee -a "$WORK/speed.txt"
