#!/usr/bin/env bash
# Prepares what gpu_check.sh needs on a GPU machine that reaches no package index, in .gpu/ (ignored
# by git through .git/info/exclude): the wheels of the packages its image lacks (for Python 3.12)
# and the shared data the tests read. Then, on that machine (the device tool's `carry: [".gpu"]`):
#   NMT_SHARED_DATA=$PWD/.gpu/data WHEELS=.gpu/whl STAGES="speed tests" bash tests/benchmarks/gpu_check.sh
#   NMT_SHARED_DATA=$PWD/.gpu/data DATA_BIN=.gpu/data-bin WHEELS=.gpu/whl STAGES=decode bash tests/benchmarks/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
shared=${NMT_SHARED_DATA:-../shared/data}
rm -rf .gpu && mkdir -p .gpu/whl .gpu/data
cp -r "$shared/multi30k" "$shared/opus-mt-en-mg" .gpu/data/
# Versions as this project's tests last ran with them; ctranslate2 (43 MB) stays behind: its tests skip.
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .gpu/whl \
    subword-nmt==0.3.8 mock==5.2.0 sacremoses==0.2.0 sentencepiece==0.2.3 fastapi==0.165.0 starlette==1.10.0 \
    pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 annotated-doc==0.0.7 typing-inspection==0.4.5 \
    typing_extensions==4.16.0 anyio==4.16.0 uvicorn==0.54.0 h11==0.16.0 fastapi_offline==1.7.7 \
    libretranslatepy==2.1.4 opentelemetry-api==1.45.2
m=.gpu/data/multi30k  # the decode stage's data, preprocessed here (DATA_BIN=.gpu/data-bin)
nmt preprocess -s en -t de --trainpref $m/train --validpref $m/val --destdir .gpu/data-bin --bpe-merges 8000 \
    --max-len-ratio 3 --quiet
du -sh .gpu
