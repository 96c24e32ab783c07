"""Every option of nmt-cli as a frozen dataclass: the model (with the paper's presets and
Table 3), training, the text pipeline, preprocessing, search and translation.

The fields generate the command-line flags (cli.py), so a knob has one name and one default
everywhere: the field `d_ff` is the flag `--d-ff` and the key `d_ff` inside every checkpoint.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import MISSING, dataclass, field
from pathlib import Path
from typing import Any

POSITIONS = ("sinusoidal", "learned")
NORMS = ("post", "pre")
LR_SCHEDULES = ("noam", "inverse-sqrt")
VALID_METRICS = ("ppl", "bleu", "chrf", "ter")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
DEVICES = ("auto", "cpu", "cuda")
TOKENIZERS = ("moses", "none")
SUBWORDS = ("bpe", "sentencepiece")
TAG = r"<[^<>\s]+>"  # a tag such as <2de> or <BT>: tagged back-translation, multilingual models


def _knob(default: Any, help: str, **flag: Any) -> Any:
    """A config field with its command-line help and flag details: range (`min`, `max`,
    `exclusive_min`, `choices`), `flags` (the names, when not `--field-name`), `negation` (the
    off-switch of a flag that is on by default), `path` (click.Path's checks). MISSING: required."""
    return field(default=default, metadata={"help": help, **flag})


def _device_knob() -> Any:
    return _knob("auto", "auto: CUDA when available.", choices=DEVICES)


def _precision_knob() -> Any:
    return _knob("auto", "auto: bf16 on a CUDA GPU that supports it, else fp32.", choices=PRECISIONS)


def _threads_knob() -> Any:
    return _knob(None, "CPU threads for PyTorch [default: PyTorch's].", min=1)


def check_knobs(config: Any) -> None:
    """Validate every field of a config dataclass against its `min`, `max` and `choices`."""
    for f in dataclasses.fields(config):
        values = getattr(config, f.name)
        for value in values if isinstance(values, tuple) else (values,):
            _check_knob(f.name, value, f.metadata)


def _check_knob(name: str, value: Any, meta: Any) -> None:
    if value is None or isinstance(value, (bool, Path)) or dataclasses.is_dataclass(value):
        return
    if "choices" in meta and value not in meta["choices"]:
        raise ValueError(f"{name}={value!r}: expected one of {', '.join(meta['choices'])}")
    if "min" in meta and (value <= meta["min"] if meta.get("exclusive_min") else value < meta["min"]):
        raise ValueError(f"{name}={value}: must be {'>' if meta.get('exclusive_min') else '>='} {meta['min']}")
    if "max" in meta and value >= meta["max"]:
        raise ValueError(f"{name}={value}: must be < {meta['max']}")


@dataclass(frozen=True)
class ModelConfig:
    """The architecture of §3 and every knob of Table 3. Defaults are the paper's base model."""

    encoder_layers: int = _knob(6, "Encoder layers N (§3.1).", min=1)
    decoder_layers: int = _knob(6, "Decoder layers N (§3.1).", min=1)
    d_model: int = _knob(512, "Model dimension d_model.", min=1)
    d_ff: int = _knob(2048, "Inner dimension of the feed-forward network (eq. 2).", min=1)
    heads: int = _knob(8, "Attention heads h (§3.2.2).", min=1)
    d_k: int | None = _knob(None, "Query/key dimension per head [default: d_model / heads].", min=1)
    d_v: int | None = _knob(None, "Value dimension per head [default: d_model / heads].", min=1)
    dropout: float = _knob(0.1, "Residual and embedding dropout P_drop (§5.4).", min=0.0, max=1.0)
    attention_dropout: float = _knob(0.0, "Dropout on attention weights.", min=0.0, max=1.0)
    relu_dropout: float = _knob(0.0, "Dropout after the FFN's ReLU.", min=0.0, max=1.0)
    label_smoothing: float = _knob(0.1, "Label smoothing eps_ls (§5.4).", min=0.0, max=1.0)
    positions: str = _knob("sinusoidal", "Positional encoding (§3.5; Table 3 row E).", choices=POSITIONS)
    norm: str = _knob("post", "Sub-layer norm: post = LayerNorm(x + Sublayer(x)) as in the paper.", choices=NORMS)
    max_positions: int = _knob(1024, "Longest sequence (tokens, incl. EOS) the model accepts.", min=1)

    def __post_init__(self) -> None:
        check_knobs(self)
        if self.d_k is None or self.d_v is None:
            if self.d_model % self.heads:
                raise ValueError(
                    f"d_model={self.d_model} is not divisible by heads={self.heads}: set d_k and d_v"
                )
            object.__setattr__(self, "d_k", self.d_k or self.d_model // self.heads)
            object.__setattr__(self, "d_v", self.d_v or self.d_model // self.heads)

    def replace(self, **overrides: Any) -> ModelConfig:
        """A copy with the given fields changed (None values are ignored)."""
        overrides = {k: v for k, v in overrides.items() if v is not None}
        if "heads" in overrides or "d_model" in overrides:
            # d_k/d_v follow d_model/heads unless they are given explicitly.
            overrides.setdefault("d_k", None)
            overrides.setdefault("d_v", None)
        return dataclasses.replace(self, **overrides)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown model config field(s): {', '.join(sorted(unknown))}")
        return cls(**d)

    def num_parameters(self, src_vocab: int, tgt_vocab: int, shared_vocab: bool) -> int:
        """The analytic parameter count of the model `model.Transformer` builds.

        Embeddings: one V x d matrix when the vocabulary is shared (3-way tying, §3.4), else a
        source and a target matrix (the target one doubles as the pre-softmax projection).
        Attention: Q, K, V projections d -> h*d_k, h*d_k, h*d_v and W^O h*d_v -> d, with biases.
        FFN: d -> d_ff -> d with biases. LayerNorm: 2d each (2 per encoder layer, 3 per decoder
        layer, plus a final one per stack with pre-norm). Learned positions: max_positions x d
        per stack.
        """
        d, h = self.d_model, self.heads
        assert self.d_k is not None and self.d_v is not None
        attention = d * h * (2 * self.d_k + self.d_v) + h * (2 * self.d_k + self.d_v)
        attention += h * self.d_v * d + d
        ffn = d * self.d_ff + self.d_ff + self.d_ff * d + d
        norm = 2 * d
        encoder_layer = attention + ffn + 2 * norm
        decoder_layer = 2 * attention + ffn + 3 * norm
        total = self.encoder_layers * encoder_layer + self.decoder_layers * decoder_layer
        total += src_vocab * d if shared_vocab else (src_vocab + tgt_vocab) * d
        if self.norm == "pre":
            total += 2 * norm
        if self.positions == "learned":
            total += 2 * self.max_positions * d
        return total


PRESETS: dict[str, ModelConfig] = {
    # Table 3, first and last rows.
    "base": ModelConfig(),
    "big": ModelConfig(d_model=1024, d_ff=4096, heads=16, dropout=0.3),
    # The common IWSLT'14 de-en setting (fairseq's transformer_iwslt_de_en).
    "iwslt": ModelConfig(d_ff=1024, heads=4, dropout=0.3),
    # A model that trains on 2 CPU cores in minutes (Multi30k quickstart).
    "small": ModelConfig(encoder_layers=3, decoder_layers=3, d_model=256, d_ff=1024, heads=4),
}


@dataclass(frozen=True)
class SearchConfig:
    """Beam search (search.py; §6.1: beam 4, length penalty 0.6, max output length input + 50)."""

    beam: int = _knob(4, "Beam size (1: greedy).", min=1)
    lenpen: float = _knob(0.6, "Length penalty alpha: score / ((5 + |Y|) / 6)^alpha.", min=0.0)
    max_len_a: float = _knob(1.0, "Max output length = a * input length + b.", min=0.0)
    max_len_b: int = _knob(50, "See --max-len-a.", min=0)
    nbest: int = _knob(1, "Hypotheses per sentence (with --format jsonl).", min=1)
    allow_unk: bool = _knob(False, "Let the search emit <unk>.")
    sampling: bool = _knob(False, "Sample each token instead of searching (back-translation); --nbest N gives N "
                           "independent samples.")
    sampling_topk: int | None = _knob(None, "With --sampling: only among the K most probable tokens.", min=1)
    sampling_topp: float | None = _knob(None, "With --sampling: only among the most probable tokens whose "
                                        "probabilities add up to P (nucleus sampling).", min=0.0, max=1.0,
                                        exclusive_min=True)
    temperature: float = _knob(1.0, "With --sampling: divide the logits by this (< 1 sharper, > 1 flatter).",
                               min=0.0, exclusive_min=True)
    seed: int | None = _knob(None, "With --sampling: the same seed, input and batch options give the same samples "
                             "[default: a random seed].", min=0)

    def __post_init__(self) -> None:
        check_knobs(self)
        if self.nbest > self.beam and not self.sampling:
            raise ValueError(f"--nbest {self.nbest} is larger than --beam {self.beam}")


@dataclass(frozen=True)
class TrainConfig:
    """The training regime of §5. Defaults are the paper's (Adam 0.9/0.98/1e-9, eq. 3, warmup 4000).

    `max_tokens` is per process and per micro-batch; one update sees
    max_tokens x processes x update_freq tokens (the paper: ~25,000 source + 25,000 target).
    """

    max_tokens: int = _knob(4096, "Tokens per micro-batch and process (longer side, padding included).", min=1)
    max_sentences: int | None = _knob(None, "At most this many sentence pairs per micro-batch.", min=1)
    update_freq: int = _knob(1, "Accumulate gradients of this many micro-batches per update.", min=1)
    lr_schedule: str = _knob("noam", "noam: eq. 3 (x --lr-scale); inverse-sqrt: linear warmup to --lr, then "
                             "1/sqrt(step) (fairseq).", choices=LR_SCHEDULES)
    lr_scale: float = _knob(1.0, "Multiplier of the noam rate (eq. 3).", min=0.0, exclusive_min=True)
    lr: float = _knob(5e-4, "Peak rate of the inverse-sqrt schedule.", min=0.0, exclusive_min=True)
    warmup: int = _knob(4000, "Warmup updates (§5.3: 4000).", min=1)
    adam_beta1: float = _knob(0.9, "Adam beta1 (§5.3).", min=0.0, max=1.0)
    adam_beta2: float = _knob(0.98, "Adam beta2 (§5.3).", min=0.0, max=1.0)
    adam_eps: float = _knob(1e-9, "Adam epsilon (§5.3).", min=0.0, exclusive_min=True)
    weight_decay: float = _knob(0.0, "Decoupled weight decay (AdamW); 0 = the paper's Adam.", min=0.0)
    clip_norm: float = _knob(0.0, "Clip the gradient norm to this (0 = off, as in the paper).", min=0.0)
    max_updates: int | None = _knob(None, "Stop after this many updates in total (absolute, also on resume).", min=1)
    max_epochs: int | None = _knob(None, "Stop after this many epochs in total.", min=1)
    max_time: float | None = _knob(None, "Stop after this many minutes of training in total.", min=0.0,
                                   exclusive_min=True)
    patience: int | None = _knob(None, "Stop after this many validations without a better result.", min=1)
    validate_interval_updates: int = _knob(0, "Validate every N updates too (0: at epoch ends only).", min=0)
    save_interval_updates: int = _knob(0, "Save a checkpoint every N updates (0: off).", min=0)
    save_interval_minutes: float = _knob(10.0, "Save a checkpoint every this many minutes (the paper: 10).",
                                         min=0.0, exclusive_min=True)
    keep_last: int = _knob(5, "Keep the newest N numbered checkpoints (0: keep all).", min=0)
    log_interval: int = _knob(50, "Log every N updates.", min=1)
    tensorboard: bool = _knob(False, "Also write TensorBoard events to SAVE_DIR/tensorboard (needs tensorboard).")
    eval_bleu: bool = _knob(False, "At each validation, also translate the valid split and report sacreBLEU, "
                            "chrF and TER.")
    eval_bleu_beam: int = _knob(SearchConfig.beam, "Beam size for --eval-bleu.", min=1)
    eval_bleu_lenpen: float = _knob(SearchConfig.lenpen, "Length penalty for --eval-bleu.", min=0.0)
    best_checkpoint_metric: str = _knob("ppl", "Select checkpoint_best.pt (and --patience) by validation "
                                        "perplexity, or by BLEU, chrF or TER (these need --eval-bleu).",
                                        choices=VALID_METRICS)
    ema_decay: float = _knob(0.0, "Keep an exponential moving average of the weights with this decay (e.g. "
                             "0.9999; 0: off): validated, and saved as checkpoint_ema.pt.", min=0.0, max=1.0)
    seed: int = _knob(1, "Seed of initialization, dropout and batch order.", min=0)
    precision: str = _precision_knob()
    device: str = _device_knob()
    compile: bool = _knob(False, "torch.compile the model.")
    threads: int | None = _threads_knob()

    def __post_init__(self) -> None:
        check_knobs(self)
        if self.best_checkpoint_metric != "ppl" and not self.eval_bleu:
            raise ValueError(f"best_checkpoint_metric={self.best_checkpoint_metric} needs eval_bleu (--eval-bleu)")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class TextConfig:
    """How raw text becomes tokens (text.py); saved in the data directory and every checkpoint.
    `tokenizer="none"` splits on whitespace only (any seq2seq task)."""

    source_lang: str = _knob(MISSING, "Source suffix: PREFIX.SRC (or PREFIX.SRC.gz).", flags=("-s", "--source-lang"))
    target_lang: str = _knob(MISSING, "Target suffix.", flags=("-t", "--target-lang"))
    subword: str = _knob("bpe", "bpe: --tokenizer, then joint BPE (subword-nmt); sentencepiece: raw text to the "
                         "pieces of a joint SentencePiece model (the Moses options and tag protection do not apply).",
                         choices=SUBWORDS)
    tokenizer: str = _knob("moses", "Moses (sacremoses) or plain whitespace splitting.", choices=TOKENIZERS)
    normalize_punctuation: bool = _knob(True, "Moses punctuation normalization before tokenizing.",
                                        negation="--no-normalize-punctuation")
    lowercase: bool = _knob(False, "Lowercase after tokenizing.")
    aggressive_dash_splits: bool = _knob(False, "Split hyphens (Moses -a): fore@-@runner.")
    protect_tags: bool = _knob(True, "Keep tags such as <2de> whole through tokenization, lowercasing and BPE.",
                               negation="--no-protect-tags")
    protect: tuple[str, ...] = _knob((), "Also keep words matching this regular expression whole (repeatable).")

    def __post_init__(self) -> None:
        check_knobs(self)
        object.__setattr__(self, "protect", tuple(self.protect))  # a list when read back from JSON
        for pattern in self.protect:
            try:
                re.compile(pattern)
            except re.error as e:
                raise ValueError(f"--protect {pattern!r}: not a regular expression ({e})") from None

    @property
    def protected(self) -> list[str]:
        """The patterns of words that pass through tokenization and BPE whole."""
        return ([TAG] if self.protect_tags else []) + list(self.protect)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TextConfig:
        """Settings saved in a data directory or checkpoint; those saved before tags were protected
        keep tokenizing tags as they did."""
        return cls(**{"protect_tags": False, **d})

    @property
    def sentencepiece(self) -> bool:
        return self.subword == "sentencepiece"


def _cores() -> int:
    return len(os.sched_getaffinity(0))


_EXISTING_FILE = {"exists": True, "dir_okay": False}


@dataclass(frozen=True)
class PreprocessConfig:
    """`nmt preprocess` (preprocess.py): what to read, the BPE and vocabulary, the filter."""

    text: TextConfig
    destdir: Path = _knob(MISSING, "Output data directory.", path={})
    trainpref: str | None = _knob(None, "Training files prefix (learns BPE and vocabulary; filtered).")
    validpref: str | None = _knob(None, "Validation files prefix (never filtered).")
    testprefs: tuple[str, ...] = _knob((), "Test files prefix (repeatable; never filtered).", flags=("--testpref",))
    bpe_merges: int = _knob(32000, "Joint BPE merge operations to learn (0: no BPE).", min=0)
    bpe_codes: Path | None = _knob(None, "Apply these BPE codes instead of learning them.", path=_EXISTING_FILE)
    sentencepiece_type: str = _knob("unigram", "With --subword sentencepiece: the model type (with --vocab-size "
                                    "pieces).", choices=("unigram", "bpe"))
    sentencepiece_model: Path | None = _knob(None, "With --subword sentencepiece: use this model instead of "
                                             "training one.", path=_EXISTING_FILE)
    sentencepiece_samples: int = _knob(0, "With --subword sentencepiece: also write N segmentations of the training "
                                       "split sampled from the model; training takes one per epoch in turn (subword "
                                       "regularization).", min=0)
    sentencepiece_alpha: float = _knob(0.1, "Smoothing of the sampled segmentations (smaller: more varied).",
                                       min=0.0, exclusive_min=True)
    joined_dictionary: bool = _knob(True, "One vocabulary for both sides (3-way tying) or one per side.",
                                    negation="--separate-dictionaries")
    srcdict: Path | None = _knob(None, "Use this source (or joint) vocabulary.", path=_EXISTING_FILE)
    tgtdict: Path | None = _knob(None, "Use this target vocabulary.", path=_EXISTING_FILE)
    vocab_min_count: int = _knob(1, "Leave out subwords seen fewer times in training.", min=1)
    vocab_size: int | None = _knob(None, "At most this many entries (with --subword sentencepiece: the pieces of "
                                   "the model to train).", min=5)
    padding_factor: int = _knob(8, "Pad built vocabularies with unused entries to a multiple of this "
                                "(fast matrix shapes).", min=1)
    max_len: int = _knob(250, "Drop training pairs with a side longer than this many BPE tokens.", min=1)
    max_len_ratio: float = _knob(1.5, "Drop training pairs whose word counts differ by more than this ratio "
                                 "(Moses clean-corpus).", min=1.0)
    workers: int = field(default_factory=_cores, metadata={
        "help": "Processes for tokenization, BPE and binarization (all usable cores by default).", "min": 1})
    force: bool = _knob(False, "Replace an earlier output of `nmt preprocess` in --destdir.")
    progress: bool = True  # progress bars on a terminal (--quiet turns them off)

    def __post_init__(self) -> None:
        check_knobs(self)


@dataclass(frozen=True)
class TranslateConfig:
    """`nmt translate` (translate.py): batching, input and output formats, attention, hardware."""

    search: SearchConfig = SearchConfig()
    max_tokens: int = _knob(8000, "Source tokens per batch.", min=1)
    batch_size: int | None = _knob(None, "Sentences per batch at most.", min=1)
    input_format: str = _knob("raw", "raw: tokenize and apply BPE; bpe: the input is already BPE tokens.",
                              choices=("raw", "bpe"))
    output_format: str = _knob("text", "text: detokenized; tokens: BPE removed; bpe: as produced.",
                               choices=("text", "tokens", "bpe"))
    format: str = _knob("text", "jsonl: one JSON object per line with scores and n-best.", choices=("text", "jsonl"))
    prefix: bool = _knob(False, "Input lines are SOURCE<TAB>TARGET-PREFIX: each translation starts with its "
                         "prefix (interactive post-editing; a line without a tab has none).")
    attention: bool = _knob(False, "With --format jsonl: add the encoder-decoder attention (heads averaged) "
                            "for alignment.")
    attention_layer: int | None = _knob(None, "Decoder layer for --attention [default: the last].", min=1)
    attention_plot: Path | None = _knob(None, "Write PNG heat maps of every attention per sentence here "
                                        "(needs matplotlib).", path={"file_okay": False})
    plot_layers: tuple[int, ...] = _knob((), "Layers to plot (repeatable) [all].", min=1, flags=("--layers",))
    plot_heads: tuple[int, ...] = _knob((), "Heads to plot (repeatable) [all].", min=1, flags=("--heads",))
    quantize: str | None = _knob(None, "CPU: run the linear layers as dynamic int8 matmuls (tests/benchmarks/"
                                 "PERFORMANCE.md: speed and BLEU).", choices=("int8",))
    cuda_graphs: bool = _knob(False, "GPU: replay beam search's decoder steps as CUDA graphs (batches padded to "
                              "fixed shapes).")
    device: str = _device_knob()
    precision: str = _precision_knob()
    threads: int | None = _threads_knob()

    def __post_init__(self) -> None:
        check_knobs(self)
        if self.search.nbest > 1 and self.format == "text":
            raise ValueError(f"--nbest {self.search.nbest} needs --format jsonl: text output has one line per "
                             "input line (the best translation)")


@dataclass(frozen=True)
class ServeConfig:
    """`nmt serve` (serve.py): where to listen, what a request may hold, how requests are batched."""

    host: str = _knob("127.0.0.1", "Address to listen on (0.0.0.0: every interface).")
    port: int = _knob(8080, "Port to listen on.", min=1)
    max_sentences: int = _knob(1000, "Most sentences in one request.", min=1)
    max_chars: int = _knob(10000, "Most characters in one sentence.", min=1)
    batch_window_ms: float = _knob(5.0, "How long a request waits for others to be translated with it.", min=0.0)
    batch_tokens: int = _knob(8000, "Most source words translated together.", min=1)
    max_tokens: int = _knob(TranslateConfig.max_tokens, "Source tokens per search batch.", min=1)
    drain_seconds: int = _knob(30, "On SIGTERM, how long the requests in flight may take to finish.", min=0)
    device: str = _device_knob()
    precision: str = _precision_knob()
    threads: int | None = _threads_knob()

    def __post_init__(self) -> None:
        check_knobs(self)
