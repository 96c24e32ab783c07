#!/usr/bin/env bash
# `nmt import` of base-size fairseq and OpenNMT-py checkpoints, and the decoding speed of what it
# gives against the same model in its own toolkit, on this machine's CPU:
#   P=../peers bash tests/benchmarks/import_peers.sh     (the peers' venvs: ../shared/peers)
# Each toolkit trains its base Transformer (6+6 layers, d_model 512, FFN 2048, 8 heads, all
# embeddings shared) for 20 updates on 2,000 pairs of Multi30k en-de (whitespace tokens), so the
# checkpoints are real and base-size. Then, per format: `nmt import`'s wall time and peak RSS
# (/usr/bin/time), and the first 200 val lines translated greedily and with the toolkit's default
# beam (5) by the toolkit's own command and by `nmt translate` (the imported model's search is the
# toolkit's: tests/interop), each with 2 threads, wall time of the whole command (loading
# included) and the lines that agree (onmt_translate a sentence at a time, as its length limit is
# otherwise a batch's longest source's).
set -euo pipefail
P=${P:?set P to the folder of venv-fairseq and venv-onmt}
HERE=$(cd "$(dirname "$0")" && pwd)
DATA=${NMT_SHARED_DATA:-$HERE/../../../shared/data}/multi30k
WORK=${WORK:-$(mktemp -d)}
export OMP_NUM_THREADS=2 TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1  # the peers load their own checkpoints only so
for lang in en de; do
  head -2000 "$DATA/train.$lang" | sed 's/  */ /g; s/^ //; s/ $//' > "$WORK/train.$lang"
  head -200 "$DATA/val.$lang" | sed 's/  */ /g; s/^ //; s/ $//' > "$WORK/valid.$lang"
done
F=$P/venv-fairseq/bin O=$P/venv-onmt/bin
$F/fairseq-preprocess -s en -t de --trainpref "$WORK/train" --validpref "$WORK/valid" --destdir "$WORK/fs" \
  --joined-dictionary --workers 2 > /dev/null 2>&1
$F/fairseq-train "$WORK/fs" --arch transformer_wmt_en_de --share-all-embeddings --optimizer adam --lr 1e-3 \
  --max-tokens 2000 --max-update 20 --cpu --no-epoch-checkpoints --save-dir "$WORK/fs-ckpt" \
  --no-save-optimizer-state > /dev/null 2>&1
cat > "$WORK/onmt.yaml" <<YAML
save_data: $WORK/run
src_vocab: $WORK/vocab.shared
share_vocab: true
data:
  corpus_1: {path_src: $WORK/train.en, path_tgt: $WORK/train.de}
save_model: $WORK/onmt
save_checkpoint_steps: 20
train_steps: 20
encoder_type: transformer
decoder_type: transformer
position_encoding: true
enc_layers: 6
dec_layers: 6
heads: 8
hidden_size: 512
word_vec_size: 512
transformer_ff: 2048
share_embeddings: true
share_decoder_embeddings: true
batch_type: tokens
batch_size: 2000
bucket_size: 2000
num_workers: 0
optim: adam
learning_rate: 0.001
decay_method: none
YAML
$O/onmt_build_vocab -config "$WORK/onmt.yaml" -n_sample -1 > /dev/null 2>&1
$O/onmt_train -config "$WORK/onmt.yaml" > /dev/null 2>&1
measure() {  # NAME COMMAND...: wall seconds and peak RSS in MB of COMMAND
  /usr/bin/time -f "%e %M" -o "$WORK/time" "${@:2}" > /dev/null 2>&1
  read -r seconds kb < "$WORK/time"
  echo "$1: ${seconds} s, peak RSS $((kb / 1024)) MB"
}
measure "fairseq: nmt import" nmt import "$WORK/fs-ckpt/checkpoint_last.pt" -o "$WORK/fs.pt" -s en -t de \
  --tokenizer none
measure "OpenNMT-py: nmt import" nmt import "$WORK/onmt_step_20.pt" -o "$WORK/onmt.pt" -s en -t de
for beam in 1 5; do
  measure "fairseq-interactive, beam $beam" sh -c "$F/fairseq-interactive $WORK/fs --path \
    $WORK/fs-ckpt/checkpoint_last.pt -s en -t de --beam $beam --cpu --buffer-size 200 --batch-size 200 \
    < $WORK/valid.en | grep '^H-' | sed 's/^H-//' | sort -n | cut -f3 > $WORK/fs$beam.out"
  measure "nmt translate of the fairseq import, beam $beam" sh -c "nmt translate -m $WORK/fs.pt --beam $beam \
    --threads 2 < $WORK/valid.en > $WORK/fs$beam.nmt"
  measure "onmt_translate, beam $beam, a sentence at a time" $O/onmt_translate -model "$WORK/onmt_step_20.pt" \
    -src "$WORK/valid.en" -output "$WORK/onmt$beam.out" -beam_size "$beam" -batch_size 1 -gpu -1
  measure "onmt_translate, beam $beam, batches of 64 (its length limit then a batch's)" $O/onmt_translate \
    -model "$WORK/onmt_step_20.pt" -src "$WORK/valid.en" -output "$WORK/onmt64.out" -beam_size "$beam" \
    -batch_size 64 -gpu -1
  measure "nmt translate of the OpenNMT-py import, beam $beam" sh -c "nmt translate -m $WORK/onmt.pt \
    --beam $beam --threads 2 < $WORK/valid.en > $WORK/onmt$beam.nmt"
done
equal() {  # A B: the lines of A and B that are equal, of 200
  paste -d '\n' "$1" "$2" | paste - - | awk -F'\t' '$1==$2' | wc -l
}
for beam in 1 5; do
  echo "beam $beam: fairseq lines equal: $(equal "$WORK/fs$beam.out" "$WORK/fs$beam.nmt") of 200," \
    "OpenNMT-py lines equal: $(equal "$WORK/onmt$beam.out" "$WORK/onmt$beam.nmt") of 200"
done
