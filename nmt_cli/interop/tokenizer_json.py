"""`tokenizer.json`, the tokenizer of the JavaScript routes: a model's SentencePiece model in the
format of Hugging Face's tokenizers, which transformers.js (and Python's PreTrainedTokenizerFast)
read. It encodes a line into the model's ids as `nmt translate` does and decodes them back.

SentencePiece's unigram model becomes tokenizers' `Unigram` over the model's vocabulary in id
order, each piece with its SentencePiece score, so the best segmentation is SentencePiece's. A
vocabulary token that the source's SentencePiece model lacks (a target piece of a release's
shared vocabulary) gets a score that no segmentation takes; a piece the vocabulary lacks follows
the vocabulary, past its last id, and the exported encoder reads it as <unk>, as nmt does. The
normalizer is SentencePiece's own table (`Precompiled`: transformers.js applies NFKC in its
place), spaces collapsed and trimmed as SentencePiece does, then the `▁` word boundaries.

A multilingual model's >>code<< tokens are matched whole, as nmt splits them off a line's start.
The JavaScript routes take one tokenizer for both sides: `javascript_refusal` says, in one line,
why a model cannot have one and what to train instead.
"""

from __future__ import annotations

from typing import Any

from nmt_cli.model.checkpoint import ModelBundle
from nmt_cli.text.vocab import EOS, EOS_ID, SPECIALS, UNK_ID

# A score no segmentation takes: a token SentencePiece never outputs on the source side.
NEVER = -1e9
UNIGRAM, NORMAL = 1, 1  # SentencePiece's ModelProto enums: trainer_spec.model_type, a piece's type


def javascript_refusal(bundle: ModelBundle) -> str | None:
    """Why this model's text pipeline cannot be a `tokenizer.json`, in a clause that names what
    to train instead; None if it can."""
    text = bundle.text
    if not text.sentencepiece:
        words = "Moses tokenization" if text.tokenizer == "moses" else "whitespace tokens"
        return (f"it reads {words}{' and BPE' if bundle.bpe_codes else ''}, for which JavaScript has no tokenizer: "
                "train on `nmt preprocess --subword sentencepiece` data for the JavaScript routes")
    if bundle.src_vocab.tokens != bundle.tgt_vocab.tokens:
        return ("its sides have separate vocabularies and transformers.js reads one tokenizer for both: "
                "preprocess without --separate-dictionaries for the JavaScript routes")
    config = bundle.model.config
    if config.d_k != config.d_model // config.heads or config.d_v != config.d_k:
        return (f"its heads are {config.d_k} wide, and transformers.js shapes an empty past d_model / heads = "
                f"{config.d_model // config.heads} wide")
    if _proto(bundle.pieces("source")).trainer_spec.model_type != UNIGRAM:
        return ("its SentencePiece model is not a unigram model: preprocess with --sentencepiece-type unigram "
                "for the JavaScript routes")
    return None


def tokenizer_json(bundle: ModelBundle) -> dict[str, Any]:
    """The tokenizer of a model that `javascript_refusal` passes."""
    proto = _proto(bundle.pieces("source"))
    scores = {p.piece: p.score for p in proto.pieces if p.type == NORMAL}
    tokens = bundle.src_vocab.tokens
    vocab = [[token, scores.get(token, NEVER)] for token in tokens]  # the specials too: added tokens, never pieces
    known = set(tokens)
    vocab += [[piece, score] for piece, score in scores.items() if piece not in known]
    spec = proto.normalizer_spec
    normalizers = [{"type": "Lowercase"}] if bundle.text.lowercase else []
    if spec.precompiled_charsmap:
        import base64

        normalizers.append({"type": "Precompiled",
                            "precompiled_charsmap": base64.b64encode(spec.precompiled_charsmap).decode("ascii")})
    if spec.remove_extra_whitespaces:
        normalizers += [{"type": "Strip", "strip_left": True, "strip_right": True},
                        {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "}]
    metaspace = {"type": "Metaspace", "replacement": "\u2581",
                 "prepend_scheme": "always" if spec.add_dummy_prefix else "never",
                 "split": proto.trainer_spec.split_by_whitespace}
    end = [{"SpecialToken": {"id": EOS, "type_id": 0}}] if bundle.model.config.source_eos else []
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": token, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": i < len(SPECIALS)} for i, token in added(bundle)],
        "normalizer": {"type": "Sequence", "normalizers": normalizers},
        "pre_tokenizer": metaspace,
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"Sequence": {"id": "A", "type_id": 0}}, *end],
                           "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 0}},
                                    *end],
                           "special_tokens": {EOS: {"id": EOS, "ids": [EOS_ID], "tokens": [EOS]}}},
        "decoder": metaspace,
        "model": {"type": "Unigram", "unk_id": UNK_ID, "vocab": vocab, "byte_fallback": False},
    }


def added(bundle: ModelBundle) -> list[tuple[int, str]]:
    """The tokens matched whole before SentencePiece, with their ids: the specials, and a
    multilingual model's target-language codes (>>code<<, which nmt splits off a line's start)."""
    ids = {token: i for i, token in enumerate(bundle.src_vocab.tokens)}
    return [*enumerate(SPECIALS), *((ids[code], code) for code in bundle.language_codes)]


def tokenizer_config(bundle: ModelBundle) -> dict[str, Any]:
    """tokenizer_config.json: the generic fast tokenizer of tokenizer.json, its specials, and
    decoding without transformers' clean-up of spaces before punctuation (SentencePiece's text)."""
    pad, _, eos, unk = SPECIALS
    return {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": bundle.model.config.max_positions,
            "pad_token": pad, "eos_token": eos, "unk_token": unk, "clean_up_tokenization_spaces": False}


def _proto(model: bytes | None) -> Any:
    """A serialized SentencePiece model's ModelProto (its normalizer's table, its pieces' scores)."""
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model)
    return proto
