#!/usr/bin/env bash
# Multi30k task 1 (Elliott et al., 2016), raw text: train (29,000), val (1,014), test_2016_flickr (1,000)
# in en, de, fr. Writes DEST/{train,val,test_2016_flickr}.{en,de,fr} and checks their sha256.
#
#   bash data/get_multi30k.sh DEST                 # a local copy if one is found, else download
#   bash data/get_multi30k.sh DEST --from DIR      # use the files in DIR (no network)
#   MULTI30K_DIR=DIR bash data/get_multi30k.sh DEST
#
# Without --from or MULTI30K_DIR, ../shared/data/multi30k beside the checkout is used when present.
set -euo pipefail
dest=${1:?usage: get_multi30k.sh DEST [--from DIR]}
from=${MULTI30K_DIR:-}
if [ "${2:-}" = "--from" ]; then from=${3:?--from needs a directory}; fi
here=$(cd "$(dirname "$0")" && pwd)
if [ -z "$from" ] && [ -f "$here/../../shared/data/multi30k/train.en" ]; then from="$here/../../shared/data/multi30k"; fi
url=https://raw.githubusercontent.com/multi30k/dataset/a3d2e0d26b56f3846f66a952536ffed4e401d05a/data/task1/raw

mkdir -p "$dest"
for split in train val test_2016_flickr; do
  for lang in en de fr; do
    file=$split.$lang
    [ -s "$dest/$file" ] && continue
    if [ -n "$from" ]; then
      cp "$from/$file" "$dest/$file.part"
    else
      curl -fsSL "$url/$file.gz" -o "$dest/$file.gz" || { rm -f "$dest/$file.gz"
        echo "get_multi30k.sh: cannot download $url/$file.gz (offline? with the files at hand: --from DIR)" >&2; exit 1; }
      gunzip -c "$dest/$file.gz" > "$dest/$file.part" && rm "$dest/$file.gz"
    fi
    mv "$dest/$file.part" "$dest/$file"
  done
done

(cd "$dest" && sha256sum --quiet -c) <<'SUMS'
460a15fbd157e34a7a9957ee388c1ca247fe47af3ef25fb50442af6c274e0fc6  train.en
2c2b73fd2b548fbcde3a875e0a78d6ee94d498bfdee6bd3eae3945779e9ddf72  train.de
1f2a23d992769b5b3d209b0a10dd0b77c08cceb1f20dfb97ed0aafa49d107227  val.en
660e09eb7e1da2f856ea13ee5ad3cf6d36b3d5b0b733c857e94c5747a3dfc660  val.de
399a4382932c1aadd3ceb9bef1008d388a64c76d4ae4e9d4728c6f4301cac182  test_2016_flickr.en
4be6b5b3236b79c25475c6bb829800a7ce559e9ba7a1f6c2394fe4d40be46d16  test_2016_flickr.de
5925a3c18f1587b6b54b87743106e6e8ab93618edb6f65d19eac0621f853a10d  train.fr
5304e444d842e962b2dda4d816b70b22a1765b15401642b7ca37a67477e708dc  val.fr
cb3160d69b002bb638e66cc7612fcd56cb0af82eadc9c142dedc438afb885ef6  test_2016_flickr.fr
SUMS
echo "Multi30k in $dest (sha256 checked)" >&2
