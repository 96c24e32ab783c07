"""CTranslate2 side by side: `python tests/benchmarks/ctranslate2_decode_speed.py -m CKPT [--compute-type float32]`.

Converts one of our checkpoints into a CTranslate2 model (same weights: post-norm Transformer,
fused QKV, our sinusoid table as the position encodings, decoding starts from <s>), checks that
both give the same scores for the reference translations, then translates the same input as
decode_speed.py (Multi30k test_2016_flickr.en, beam 4, 2 threads, batches of 8,000 source
tokens) and prints one JSON line in decode_speed.py's terms: sentences/s, target tokens/s (BPE
tokens + EOS), BLEU. Run it next to decode_speed.py with the same checkpoint, on an idle machine.

CTranslate2 is not a dependency of nmt-cli: `pip install ctranslate2` (4.8.5 here). Its length
penalty divides by length^alpha where ours is GNMT's ((5 + length) / 6)^alpha, so outputs can differ
a little; the score check runs on the references, with no search involved.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import ctranslate2
import numpy as np
import torch
from common import OurSide, decoding_arguments, reference_log_probs
from ctranslate2.specs import transformer_spec

from nmt_cli.checkpoint import ModelBundle
from nmt_cli.model import MultiHeadAttention, SublayerConnection, Transformer


def linear(spec, module: torch.nn.Linear) -> None:
    spec.weight = module.weight.detach().numpy()
    spec.bias = module.bias.detach().numpy()


def norm(spec, sublayer: SublayerConnection) -> None:
    spec.gamma = sublayer.norm.weight.detach().numpy()
    spec.beta = sublayer.norm.bias.detach().numpy()


def attention(spec, module: MultiHeadAttention, sublayer: SublayerConnection, cross: bool) -> None:
    for target, source in zip(spec.linear, [module.q, module.kv, module.out] if cross else [module.qkv, module.out]):
        linear(target, source)
    norm(spec.layer_norm, sublayer)


def ffn(spec, layer, sublayer: SublayerConnection) -> None:
    linear(spec.linear_0, layer.ffn.w1)
    linear(spec.linear_1, layer.ffn.w2)
    norm(spec.layer_norm, sublayer)


def convert(bundle: ModelBundle, out: Path) -> None:
    model: Transformer = bundle.model
    config = model.config
    if config.norm != "post" or config.positions != "sinusoidal":
        raise SystemExit("this converter handles the paper's post-norm, sinusoidal model only")
    spec = transformer_spec.TransformerSpec.from_config((config.encoder_layers, config.decoder_layers),
                                                        config.heads, pre_norm=False)
    table = model.src_embed.sinusoid.numpy()
    spec.encoder.embeddings[0].weight = model.src_embed.tokens.weight.detach().numpy()
    spec.decoder.embeddings.weight = model.tgt_embed.tokens.weight.detach().numpy()
    spec.decoder.projection.weight = model.tgt_embed.tokens.weight.detach().numpy()
    for side in (spec.encoder, spec.decoder):
        side.scale_embeddings = True
        side.position_encodings.encodings = table
    for layer_spec, layer in zip(spec.encoder.layer, model.encoder_layers):
        attention(layer_spec.self_attention, layer.self_attn, layer.sublayers[0], cross=False)
        ffn(layer_spec.ffn, layer, layer.sublayers[1])
    for layer_spec, layer in zip(spec.decoder.layer, model.decoder_layers):
        attention(layer_spec.self_attention, layer.self_attn, layer.sublayers[0], cross=False)
        attention(layer_spec.attention, layer.cross_attn, layer.sublayers[1], cross=True)
        ffn(layer_spec.ffn, layer, layer.sublayers[2])
    spec.config.layer_norm_epsilon = model.encoder_layers[0].sublayers[0].norm.eps
    spec.config.add_source_eos = True
    spec.register_source_vocabulary(bundle.src_vocab.tokens)
    spec.register_target_vocabulary(bundle.tgt_vocab.tokens)
    spec.validate()
    spec.optimize(quantization=None)
    out.mkdir(parents=True, exist_ok=True)
    spec.save(str(out))


def main() -> None:
    parser = decoding_arguments(__doc__)
    parser.add_argument("--compute-type", default="float32", choices=["float32", "int8", "int8_float32"])
    args = parser.parse_args()
    ours = OurSide.load(args)
    source_tokens = [ours.bundle.src_vocab.decode(s) for s in ours.sources]
    references = reference_log_probs(ours.bundle, ours.translator, ours.sources[:50], ours.refs[:50])
    with tempfile.TemporaryDirectory() as work:
        convert(ours.bundle, Path(work) / "ct2")
        translator = ctranslate2.Translator(str(Path(work) / "ct2"), device="cpu", compute_type=args.compute_type,
                                            intra_threads=args.threads, inter_threads=1)
        # same model? score the references with CTranslate2 too (it adds the EOS itself)
        targets = [ours.bundle.tgt_vocab.decode(target[:-1]) for target, _ in references]
        scores = translator.score_batch(source_tokens[:50], targets)
        diffs = [float(np.abs(mine - np.array(theirs.log_probs)).max())
                 for (_, mine), theirs in zip(references, scores)]
        start = time.perf_counter()
        results = translator.translate_batch(source_tokens, beam_size=args.beam, length_penalty=args.lenpen,
                                             max_batch_size=args.max_tokens, batch_type="tokens",
                                             max_decoding_length=256)
        seconds = time.perf_counter() - start
    hyps = [r.hypotheses[0] for r in results]
    outputs = [ours.translator.target.decode(h) for h in hyps]
    print(json.dumps({
        "benchmark": "ctranslate2_decode_speed", "ctranslate2": ctranslate2.__version__,
        "compute_type": args.compute_type, "model": str(args.model), "sentences": len(ours.lines), "beam": args.beam,
        "threads": args.threads, "max_token_logprob_difference": round(max(diffs), 5),
        **ours.figures(seconds, sum(len(h) + 1 for h in hyps), outputs),
    }))


if __name__ == "__main__":
    main()
