#!/usr/bin/env bash
# WMT 2014 English-German, as in the paper (§5.1): ~4.5M training pairs (Europarl v7, Common Crawl,
# News Commentary v9), newstest2013 as dev, newstest2014 (full, 3,003 lines) as test. Then
# `nmt preprocess` with joint BPE (32,000 merges gives a shared vocabulary of about 37,000 as in the
# paper). Needs internet, ~2 GB of disk, and an hour of CPU for preprocessing.
#
#   bash data/get_wmt14_en_de.sh DEST
#
# Dev/test come through sacreBLEU (`sacrebleu -t wmt13 / wmt14/full`), so they are the exact
# files that `nmt score` references. Reviewed by reading: this workplace has no internet.
set -euo pipefail
dest=${1:?usage: get_wmt14_en_de.sh DEST}
raw=$dest/raw
mkdir -p "$raw"
cd "$raw"

fetch() {  # URL -> file in the current directory, once; a partial download never looks complete
  local file
  file=$(basename "$1")
  [ -s "$file" ] && return
  curl -fL --retry 3 -o "$file.part" "$1"
  mv "$file.part" "$file"
}
fetch https://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz
fetch https://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz
fetch https://www.statmt.org/wmt14/training-parallel-nc-v9.tgz
for archive in *.tgz; do tar -xzf "$archive"; done

# One file per language, in the same order on both sides.
: > train.en; : > train.de
for corpus in training/europarl-v7.de-en commoncrawl.de-en training/news-commentary-v9.de-en; do
  cat "$corpus.en" >> train.en
  cat "$corpus.de" >> train.de
done

sacrebleu -t wmt13 -l en-de --echo src > valid.en
sacrebleu -t wmt13 -l en-de --echo ref > valid.de
sacrebleu -t wmt14/full -l en-de --echo src > test.en
sacrebleu -t wmt14/full -l en-de --echo ref > test.de
wc -l train.en train.de valid.en test.en >&2

cd - > /dev/null
nmt preprocess -s en -t de --trainpref "$raw/train" --validpref "$raw/valid" --testpref "$raw/test" \
  --destdir "$dest/data" --bpe-merges 32000 --max-len 250 --max-len-ratio 1.5
