#!/usr/bin/env bash
# A new language pair for LibreTranslate and Argos Translate, from raw parallel text to a package
# they install as it is:
#   1. nmt preprocess: a joint SentencePiece model of VOCAB pieces (the text pipeline Argos runs),
#      the training and validation pairs binarized
#   2. nmt train: the quickstart's recipe (data/quickstart.yaml: the `small` preset, batches of
#      1,024 tokens, a linear rate from 1.5e-3) for MINUTES minutes; ARCH changes the preset
#   3. nmt average-checkpoints: the last 5
#   4. nmt export --format argos: WORK/translate-SRC_TGT-1_0.argosmodel, its weights in QUANTIZE
#      (int8, as published packages are), its sentence splitter trained on the training source
#   5. the package imported again (nmt import) and the validation set translated with it as Argos
#      searches (beam 4, length penalty 0.2) and scored: what LibreTranslate's users will get
# Install it: `argospm install` is for the index's packages; this file installs with
#   python -c 'import argostranslate.package as p; p.install_from_path("WORK/translate-SRC_TGT-1_0.argosmodel")'
# into the folder LibreTranslate reads (ARGOS_PACKAGES_DIR, default ~/.local/share/argos-translate/packages).
# Settings: SRC and TGT (language codes: required), TRAIN and VALID (the files' prefixes:
# TRAIN.SRC, TRAIN.TGT, VALID.SRC, VALID.TGT; required), WORK (default runs/argos-SRC-TGT of the
# checkout), MINUTES (default 30), VOCAB (default 8000), ARCH (default small), QUANTIZE (default
# int8), THREADS (default: all cores), TRAIN_ARGS (more `nmt train` flags), EXPORT_ARGS (more
# `nmt export` flags: --from-name, --to-name, --package-version). Paths are taken from where it is
# called. Running it again resumes an unfinished training and redoes the steps after it.
set -euo pipefail
CHECKOUT=$(cd "$(dirname "$0")/.." && pwd)
SRC=${SRC:?SRC=en TGT=de TRAIN=raw/train VALID=raw/val bash data/argos.sh}
TGT=${TGT:?TGT: the target language code}
TRAIN=${TRAIN:?TRAIN: the training files prefix (TRAIN.SRC, TRAIN.TGT)}
VALID=${VALID:?VALID: the validation files prefix (VALID.SRC, VALID.TGT)}
WORK=${WORK:-$CHECKOUT/runs/argos-$SRC-$TGT}
MINUTES=${MINUTES:-30}
VOCAB=${VOCAB:-8000}
ARCH=${ARCH:-small}
QUANTIZE=${QUANTIZE:-int8}
THREADS=${THREADS:-$(nproc)}
for file in "$TRAIN.$SRC" "$TRAIN.$TGT" "$VALID.$SRC" "$VALID.$TGT"; do
  [ -f "$file" ] || { echo "argos.sh: $file: missing (TRAIN and VALID are prefixes of SRC and TGT files)" >&2; exit 1; }
done

if [ ! -f "$WORK/data/meta.json" ]; then
  nmt preprocess -s "$SRC" -t "$TGT" --trainpref "$TRAIN" --validpref "$VALID" --destdir "$WORK/data" \
    --subword sentencepiece --vocab-size "$VOCAB" --max-len-ratio 3
fi
nmt train "$WORK/data" --save-dir "$WORK/ckpt" --config "$CHECKOUT/data/quickstart.yaml" --arch "$ARCH" \
  --max-time "$MINUTES" --save-interval-minutes "$(python3 -c "print(max($MINUTES / 15, 0.1))")" --keep-last 5 \
  --threads "$THREADS" ${TRAIN_ARGS:-}
nmt average-checkpoints --dir "$WORK/ckpt" --last 5 -o "$WORK/average.pt"

package=$WORK/translate-${SRC}_$TGT-1_0.argosmodel
nmt export -m "$WORK/average.pt" --format argos -o "$package" --quantize "$QUANTIZE" --sentences "$TRAIN.$SRC" \
  ${EXPORT_ARGS:-}
nmt import "$package" -o "$WORK/package.pt"
nmt translate -m "$WORK/package.pt" -i "$VALID.$SRC" -o "$WORK/valid.hyp.$TGT" --threads "$THREADS"
nmt score -r "$VALID.$TGT" -i "$WORK/valid.hyp.$TGT" | tee "$WORK/bleu.txt"
echo "argos.sh: $package is ready: install it into argostranslate or LibreTranslate (this script's header says how)"
