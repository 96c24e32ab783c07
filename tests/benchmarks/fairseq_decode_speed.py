"""fairseq side by side: `python tests/benchmarks/fairseq_decode_speed.py -m CKPT` (in an environment with fairseq).

Loads one of our checkpoints into fairseq's `transformer` (the same weights: post-norm, our
sinusoid table as learned positions, untied embeddings so that fairseq's start symbol </s> reads
our <s> row), checks that both give the same scores for reference translations, then decodes the
same input as decode_speed.py with fairseq's SequenceGenerator (the search of fairseq-generate:
beam 4, batches of 8,000 source tokens sorted by length, max length a=1, b=50, 2 threads) and
prints one JSON line in decode_speed.py's terms. fairseq's length penalty divides by
length^alpha where ours is GNMT's, so outputs can differ a little. Timing covers the search only,
as in decode_speed.py.

fairseq is not a dependency of nmt-cli; see fairseq_train_speed.py for installing 0.12.2 on
Python 3.11. That environment also needs nmt-cli (`pip install -e .`).
"""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import numpy as np
import torch
from common import OurSide, decoding_arguments, reference_log_probs
from fairseq.data import Dictionary
from fairseq.models.transformer import TransformerModel, base_architecture
from fairseq.sequence_generator import SequenceGenerator

from nmt_cli.decode.generator import batches
from nmt_cli.model.checkpoint import ModelBundle


def fairseq_rows(weight: torch.Tensor, start_row: int | None = None) -> torch.Tensor:
    """Our rows (pad 0, <s> 1, </s> 2, <unk> 3) in fairseq's order (<s> 0, <pad> 1, </s> 2, <unk> 3);
    `start_row`: which of our rows fairseq's row 2 holds (the decoder's first input is </s> there)."""
    rows = weight[[1, 0, 2 if start_row is None else start_row, *range(3, weight.size(0))]]
    return rows.clone()


def to_fairseq(bundle: ModelBundle) -> tuple[TransformerModel, Dictionary]:
    ours, c = bundle.model, bundle.model.config
    if c.norm != "post" or c.positions != "sinusoidal" or bundle.src_vocab != bundle.tgt_vocab:
        raise SystemExit("this converter handles the paper's post-norm, sinusoidal model with a joint vocabulary")
    vocab = Dictionary()
    for token in bundle.tgt_vocab.tokens[4:]:
        vocab.add_symbol(token)
    args = SimpleNamespace(
        encoder_layers=c.encoder_layers, decoder_layers=c.decoder_layers, encoder_embed_dim=c.d_model,
        decoder_embed_dim=c.d_model, encoder_ffn_embed_dim=c.d_ff, decoder_ffn_embed_dim=c.d_ff,
        encoder_attention_heads=c.heads, decoder_attention_heads=c.heads, encoder_learned_pos=True,
        decoder_learned_pos=True, max_source_positions=c.max_positions, max_target_positions=c.max_positions,
        share_all_embeddings=False, share_decoder_input_output_embed=False, dropout=0.0)
    base_architecture(args)
    model = TransformerModel.build_model(args, SimpleNamespace(source_dictionary=vocab, target_dictionary=vocab))
    table = ours.src_embed.sinusoid
    with torch.no_grad():
        embedding = ours.tgt_embed.tokens.weight
        model.encoder.embed_tokens.weight.copy_(fairseq_rows(embedding))
        model.decoder.embed_tokens.weight.copy_(fairseq_rows(embedding, start_row=1))
        model.decoder.output_projection.weight.copy_(fairseq_rows(embedding))
        for side in (model.encoder, model.decoder):
            side.embed_positions.weight.zero_()
            side.embed_positions.weight[2:2 + table.size(0)].copy_(table)  # fairseq's first position is pad + 1
        for theirs, layer in zip(model.encoder.layers, ours.encoder_layers):
            split_attention(theirs.self_attn, layer.self_attn.qkv.weight, layer.self_attn.qkv.bias, layer.self_attn.out)
            copy_norm(theirs.self_attn_layer_norm, layer.sublayers[0].norm)
            copy_ffn(theirs, layer.ffn, layer.sublayers[1].norm)
        for theirs, layer in zip(model.decoder.layers, ours.decoder_layers):
            split_attention(theirs.self_attn, layer.self_attn.qkv.weight, layer.self_attn.qkv.bias, layer.self_attn.out)
            copy_norm(theirs.self_attn_layer_norm, layer.sublayers[0].norm)
            cross = layer.cross_attn
            split_attention(theirs.encoder_attn, torch.cat([cross.q.weight, cross.kv.weight]),
                            torch.cat([cross.q.bias, cross.kv.bias]), cross.out)
            copy_norm(theirs.encoder_attn_layer_norm, layer.sublayers[1].norm)
            copy_ffn(theirs, layer.ffn, layer.sublayers[2].norm)
    return model.eval(), vocab


def split_attention(theirs, weight: torch.Tensor, bias: torch.Tensor, out: torch.nn.Linear) -> None:
    for proj, w, b in zip((theirs.q_proj, theirs.k_proj, theirs.v_proj), weight.chunk(3), bias.chunk(3)):
        proj.weight.copy_(w)
        proj.bias.copy_(b)
    theirs.out_proj.weight.copy_(out.weight)
    theirs.out_proj.bias.copy_(out.bias)


def copy_norm(theirs, norm: torch.nn.LayerNorm) -> None:
    theirs.weight.copy_(norm.weight)
    theirs.bias.copy_(norm.bias)


def copy_ffn(theirs, ffn, norm: torch.nn.LayerNorm) -> None:
    for dst, src in ((theirs.fc1, ffn.w1), (theirs.fc2, ffn.w2)):
        dst.weight.copy_(src.weight)
        dst.bias.copy_(src.bias)
    copy_norm(theirs.final_layer_norm, norm)


def main() -> None:
    args = decoding_arguments(__doc__).parse_args()
    ours = OurSide.load(args)
    bundle, sources = ours.bundle, ours.sources
    model, vocab = to_fairseq(bundle)

    references = reference_log_probs(ours.engine, sources[:50], ours.refs[:50])
    diffs = []  # same model? score the references with fairseq too (ids >= 2 are the same in both)
    with torch.inference_mode():
        for source, (target, mine) in zip(sources, references):
            prev = torch.tensor([[vocab.eos()] + target[:-1]])
            theirs = model(torch.tensor([source + [vocab.eos()]]), torch.tensor([len(source) + 1]), prev)[0]
            theirs = theirs.log_softmax(-1)[0].gather(-1, torch.tensor(target)[:, None]).squeeze(-1).numpy()
            diffs.append(float(np.abs(mine - theirs).max()))

    generator = SequenceGenerator([model], vocab, beam_size=args.beam, len_penalty=args.lenpen,
                                  max_len_a=1, max_len_b=50)
    hyps: dict[int, list[int]] = {}
    start = time.perf_counter()
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    widths, config = [len(s) + 1 for s in sources], ours.engine.config
    for batch in batches(order, widths, config.max_tokens, config.batch_size):  # fairseq-generate's: by length
        longest = max(len(sources[i]) for i in batch) + 1
        src_tokens = torch.full((len(batch), longest), vocab.pad(), dtype=torch.long)
        for row, i in enumerate(batch):  # left-padded, as fairseq's LanguagePairDataset does
            src_tokens[row, longest - len(sources[i]) - 1:] = torch.tensor(sources[i] + [vocab.eos()])
        sample = {"net_input": {"src_tokens": src_tokens,
                                "src_lengths": torch.tensor([len(sources[i]) + 1 for i in batch])}}
        for i, result in zip(batch, generator.generate([model], sample)):
            hyps[i] = result[0]["tokens"].tolist()  # ends with </s>
    seconds = time.perf_counter() - start
    outputs = [ours.engine.pipeline.text(hyps[i][:-1]) for i in range(len(sources))]
    print(json.dumps({
        "benchmark": "fairseq_decode_speed", "fairseq": "0.12.2", "model": str(args.model), "sentences": len(sources),
        "beam": args.beam, "threads": args.threads, "max_token_logprob_difference": round(max(diffs), 5),
        **ours.figures(seconds, sum(len(h) for h in hyps.values()), outputs),
    }))


if __name__ == "__main__":
    main()
