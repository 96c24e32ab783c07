"""Every option of nmt-cli as a frozen dataclass: training, the text pipeline, preprocessing and
search here, how a trained model runs in run_config.py (the model's architecture is
architecture.py's).

The fields (options.knob: default, range, help) generate the command-line flags (flags.py), so
an option has one name, one default and one check everywhere: the field `d_ff` is the flag
`--d-ff` and the key `d_ff` inside every checkpoint.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import MISSING, dataclass, field
from pathlib import Path
from typing import Any

from nmt_cli.options import Options, knob

LR_SCHEDULES = ("noam", "inverse-sqrt", "linear")
VALID_METRICS = ("ppl", "bleu", "chrf", "ter")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
DEVICE = (r"auto|cpu|cuda(:[0-9]+)?|mps", "auto, cpu, cuda, cuda:N or mps")
TOKENIZERS = ("moses", "none")
SUBWORDS = ("bpe", "sentencepiece")
LENPEN_FORMS = ("gnmt", "length")
STOPPING = ("early", "heuristic", "onmt")
LIMIT_ENDS = ("scored", "free", "cut")
TAG = r"<[^<>\s]+>"  # a tag such as <2de> or <BT>: tagged back-translation, multilingual models


SEED_MAX = 2**63 - 1
BEAM_MAX = 1024


def device_knob() -> Any:
    return knob("auto", "auto, cpu, cuda, cuda:N or mps (Apple GPU); auto: CUDA when available.", pattern=DEVICE)


PRECISION_HELP = ("auto: bf16 on a CUDA GPU that supports it, else fp32. bf16 runs on a CPU too, faster than fp32 "
                  "on some with AVX512-BF16 or AMX, slower on others; fp16 needs CUDA.")


def precision_knob() -> Any:
    return knob("auto", PRECISION_HELP, choices=PRECISIONS)


def threads_knob() -> Any:
    return knob(None, "CPU threads for PyTorch [default: PyTorch's].", min=1, max=1024)


def quantize_knob() -> Any:
    return knob(None, "CPU: run the linear layers as dynamic int8 matmuls (tests/benchmarks/PERFORMANCE.md: speed and "
                "BLEU); --device auto then means the CPU.", choices=("int8",))


def device_for(device: str, quantize: str | None) -> str:
    """--device, where auto means the CPU under --quantize (int8 matmuls are a CPU kernel)."""
    return "cpu" if quantize and device == "auto" else device


_SAMPLING = (lambda c: c.samples, "with --sampling or --mbr-candidates sample")
SEARCHING = (lambda c: not c.samples, "to beam search, not with --sampling or --mbr-candidates sample (--nbest N: N "
             "samples)")
_MBR = (lambda c: c.mbr is not None, "with --mbr")
MBR_UTILITIES = ("chrf", "bleu")
MBR_CANDIDATES = ("beam", "sample")


@dataclass(frozen=True)
class SearchConfig(Options):
    """Beam search (search.py, sampling.py, mbr.py; §6.1: beam 4, length penalty 0.6, max output length input
    + 50)."""

    beam: int = knob(4, "Beam size (1: greedy).", min=1, max=BEAM_MAX, only_if=(
        lambda c: not c.samples and c.mbr is None, SEARCHING[1] + " or --mbr (a beam of --mbr N)"))
    lenpen: float = knob(0.6, "Length penalty alpha: score / ((5 + |Y|) / 6)^alpha (see --lenpen-form).", min=0.0,
                         max=10.0)
    lenpen_form: str = knob("gnmt", "How --lenpen divides a hypothesis' log-probability: gnmt by ((5 + |Y|) / 6)^alpha "
                            "(Wu et al., 2016; the paper's §6.1), length by |Y|^alpha (Marian, transformers, "
                            "CTranslate2); |Y| counts </s>.", choices=LENPEN_FORMS)
    lenpen_start: bool = knob(False, "The length penalty's |Y| counts <s> as well (OpenNMT-py's does).")
    stopping: str = knob("early", "early: a sentence is done once --beam hypotheses have finished; heuristic: it then "
                         "goes on while its best live hypothesis, scored at its present length, beats the worst of "
                         "the --beam best finished ones (transformers' default; the imported models' own); onmt: "
                         "a step's --beam best candidates include those that finish, and a sentence is done once the "
                         "best of them is </s> (OpenNMT-py's).", choices=STOPPING, only_if=SEARCHING)
    at_limit: str = knob("scored", "How an output that reaches the length limit ends: scored: with </s> at its own "
                         "log-probability (fairseq's); free: with </s> at no cost (transformers' forced </s>); cut: "
                         "with its last token, no </s> (OpenNMT-py's).", choices=LIMIT_ENDS, only_if=SEARCHING)
    max_len_a: float = knob(1.0, "Max output length = a * input length + b (within the model's positions).",
                             min=0.0)
    max_len_b: int = knob(50, "See --max-len-a.", min=0)
    max_len: int | None = knob(None, "Most output tokens of any sentence [default: the model's positions].", min=1)
    nbest: int = knob(1, "Hypotheses per sentence (with --format jsonl).", min=1, max=BEAM_MAX)
    allow_unk: bool = knob(False, "Let the search emit <unk>.")
    min_len: int = knob(0, "No </s> before this many target tokens (subwords, not words).", min=0)
    no_repeat_ngram_size: int = knob(0, "No n-gram of target tokens twice in an output (0: off).", min=0)
    repetition_penalty: float = knob(1.0, "Multiply the log-probability of a token already in the output by this "
                                     "(above 1: fewer repeats; as transformers' beam search does).", min=0.0,
                                     exclusive_min=True, max=100.0)
    plain_first: bool = knob(False, "With phrases to hold or avoid: search each line without them first and keep "
                             "that translation where it already holds its phrases and none to avoid; search only the "
                             "others with them. A phrase a translation holds anyway then changes nothing, at up to "
                             "the two searches' time where most translations lack theirs.", only_if=(
                                 lambda c: not c.sampling and c.mbr is None and c.nbest == 1,
                                 "to beam search with --nbest 1, without --mbr"))
    sampling: bool = knob(False, "Sample each token instead of searching (back-translation); --nbest N gives N "
                           "independent samples.")
    sampling_topk: int | None = knob(None, "With --sampling: only among the K most probable tokens.", min=1,
                                      only_if=_SAMPLING)
    sampling_topp: float | None = knob(None, "With --sampling: only among the most probable tokens whose "
                                        "probabilities add up to P (nucleus sampling).", min=0.0, max=1.0,
                                        exclusive_min=True, only_if=_SAMPLING)
    temperature: float = knob(1.0, "With --sampling: divide the logits by this (< 1 sharper, > 1 flatter).",
                               min=0.0, exclusive_min=True, only_if=_SAMPLING)
    seed: int | None = knob(None, "With --sampling: the same seed, input and batch options give the same samples "
                             "[default: a random seed, printed].", min=0, max=SEED_MAX, only_if=_SAMPLING)
    mbr: int | None = knob(None, "Minimum Bayes risk decoding: of N candidates (--mbr-candidates), output the one "
                           "whose mean --mbr-utility against the others is highest (--nbest: the first by it), at "
                           "about the cost of a beam of N and N(N-1) sentence scores a line.", min=2, max=BEAM_MAX,
                           only_if=(lambda c: not c.sampling,
                                    "without --sampling (--mbr-candidates sample draws the candidates)"))
    mbr_utility: str = knob("chrf", "How --mbr scores a candidate against another: sentence-level chrF or BLEU, "
                            "as sacreBLEU computes them.", choices=MBR_UTILITIES, only_if=_MBR)
    mbr_candidates: str = knob("beam", "--mbr's candidates: beam: the N-best of a beam of N; sample: N samples "
                               "(--temperature, --sampling-topk, --sampling-topp and --seed apply).",
                               choices=MBR_CANDIDATES, only_if=_MBR)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.mbr is not None and self.nbest > self.mbr:
            raise ValueError(f"--nbest {self.nbest} is larger than --mbr {self.mbr}")
        if self.nbest > self.beam and not self.sampling and self.mbr is None:
            raise ValueError(f"--nbest {self.nbest} is larger than --beam {self.beam}")

    @property
    def samples(self) -> bool:
        """Whether the search draws samples (--sampling, or --mbr's candidates) rather than a beam's."""
        return self.sampling or (self.mbr is not None and self.mbr_candidates == "sample")

    def candidates(self) -> SearchConfig:
        """The search that draws the hypotheses: with --mbr N, a beam of N and its N-best, or N
        samples, among which --mbr then chooses; else this one."""
        if self.mbr is None:
            return self
        beam = self.mbr if self.mbr_candidates == "beam" else self.beam
        return dataclasses.replace(self, mbr=None, beam=beam, nbest=self.mbr, sampling=self.samples)


_EVAL_BLEU = (lambda c: c.eval_bleu, "with --eval-bleu")


@dataclass(frozen=True)
class TrainConfig(Options):
    """The training regime of §5. Defaults are the paper's (Adam 0.9/0.98/1e-9, eq. 3, warmup 4000).

    `max_tokens` is per process and per micro-batch; one update sees
    max_tokens x processes x update_freq tokens (the paper: ~25,000 source + 25,000 target).
    """

    max_tokens: int = knob(4096, "Tokens per micro-batch and process (longer side, padding included).", min=1)
    max_sentences: int | None = knob(None, "At most this many sentence pairs per micro-batch.", min=1)
    update_freq: int = knob(1, "Accumulate gradients of this many micro-batches per update.", min=1)
    lr_schedule: str = knob("noam", "noam: eq. 3 (x --lr-scale); inverse-sqrt: linear warmup to --lr, then "
                             "1/sqrt(step) (fairseq); linear: warmup, then down to 0 in a straight line at the end "
                             "of --max-updates or --max-time, whichever comes first.", choices=LR_SCHEDULES)
    lr_scale: float = knob(1.0, "Multiplier of the noam rate (eq. 3).", min=0.0, exclusive_min=True, only_if=(
        lambda c: c.lr_schedule == "noam", "to the noam schedule (eq. 3); inverse-sqrt and linear peak at --lr"))
    lr: float = knob(5e-4, "Peak rate of the inverse-sqrt and linear schedules.", min=0.0, exclusive_min=True,
                     only_if=(lambda c: c.lr_schedule != "noam", "with --lr-schedule inverse-sqrt or linear (the "
                              "default noam schedule, eq. 3, is scaled by --lr-scale)"))
    warmup: int = knob(4000, "Warmup updates (§5.3: 4000).", min=1)
    adam_beta1: float = knob(0.9, "Adam beta1 (§5.3).", min=0.0, max=1.0, exclusive_max=True)
    adam_beta2: float = knob(0.98, "Adam beta2 (§5.3).", min=0.0, max=1.0, exclusive_max=True)
    adam_eps: float = knob(1e-9, "Adam epsilon (§5.3).", min=0.0, exclusive_min=True)
    weight_decay: float = knob(0.0, "Decoupled weight decay (AdamW); 0 = the paper's Adam.", min=0.0)
    clip_norm: float = knob(0.0, "Clip the gradient norm to this (0 = off, as in the paper).", min=0.0)
    max_updates: int | None = knob(None, "Stop after this many updates in total (absolute, also on resume).", min=1)
    max_epochs: int | None = knob(None, "Stop after this many epochs in total.", min=1)
    max_time: float | None = knob(None, "Stop after this many minutes of training in total.", min=0.0,
                                   exclusive_min=True)
    patience: int | None = knob(None, "Stop after this many validations without a better result.", min=1)
    validate_interval_updates: int = knob(0, "Validate every N updates too (0: at epoch ends only).", min=0)
    save_interval_updates: int = knob(0, "Save a checkpoint every N updates (0: off).", min=0)
    save_interval_minutes: float = knob(10.0, "Save a checkpoint every this many minutes, and at each epoch's end "
                                         "(the paper: 10).", min=0.0, exclusive_min=True)
    keep_last: int = knob(5, "Keep the newest N numbered checkpoints (0: keep all).", min=0)
    freeze: tuple[str, ...] = knob((), "Keep a part of the model as it is (repeatable): embeddings, output, encoder, "
                                   "decoder, or a layer, encoder.N or decoder.N (from 0); the rest is trained "
                                   "(adaptation to little data, a large model on a CPU).")
    save_optimizer_state: str = knob("last", "last: the optimizer's state (with Adam, twice the weights) in "
                                      "checkpoint_last.pt alone, the numbered checkpoints holding the weights (what "
                                      "averaging and fine-tuning read); all: in every checkpoint.",
                                      choices=("last", "all"))
    log_interval: int = knob(50, "Log every N updates (and after the first, and at least once a minute).", min=1)
    tensorboard: bool = knob(False, "Also write TensorBoard events to SAVE_DIR/tensorboard (the tensorboard extra).")
    eval_bleu: bool = knob(False, "At each validation, also translate the valid split and report sacreBLEU, "
                            "chrF and TER.")
    eval_bleu_beam: int = knob(SearchConfig.beam, "Beam size for --eval-bleu.", min=1, max=BEAM_MAX,
                                only_if=_EVAL_BLEU)
    eval_bleu_lenpen: float = knob(SearchConfig.lenpen, "Length penalty for --eval-bleu.", min=0.0, max=10.0,
                                    only_if=_EVAL_BLEU)
    best_checkpoint_metric: str = knob("ppl", "Select checkpoint_best.pt (and --patience) by validation "
                                        "perplexity, or by BLEU, chrF or TER (these need --eval-bleu).",
                                        choices=VALID_METRICS)
    ema_decay: float = knob(0.0, "Keep an exponential moving average of the weights with this decay (e.g. "
                             "0.9999; 0: off): validated, and saved as checkpoint_ema.pt.", min=0.0, max=1.0,
                             exclusive_max=True)
    seed: int = knob(1, "Seed of initialization, dropout and batch order.", min=0, max=SEED_MAX)
    precision: str = knob("auto", PRECISION_HELP + " fastest: where the hardware multiplies bf16, the faster of "
                          "fp32 and bf16 over a few updates of this model on this data.",
                          choices=(*PRECISIONS, "fastest"))
    device: str = device_knob()
    compile: bool = knob(False, "torch.compile the model and its loss (forward and backward).")
    compile_mode: str = knob("default", "torch.compile's mode; reduce-overhead also replays each compiled graph as "
                             "a CUDA graph (one per batch shape: use it with --length-buckets).",
                             choices=("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"),
                             only_if=(lambda c: c.compile, "with --compile"))
    length_buckets: int = knob(0, "Pad every batch, both sides, to one of at most N lengths chosen for the "
                               "least padding: at most 2N batch shapes, so --compile compiles each once "
                               "(0: each batch padded to its own longest side).", min=0, max=256)
    threads: int | None = threads_knob()
    dist_timeout: float = knob(300.0, "Under torchrun: a process silent this many seconds ends the run.", min=1.0)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.lr_schedule == "linear" and self.max_updates is None and self.max_time is None:
            raise ValueError("--lr-schedule linear decays to 0 at the end of training: give --max-updates or "
                             "--max-time")
        if self.best_checkpoint_metric != "ppl" and not self.eval_bleu:
            raise ValueError(f"best_checkpoint_metric={self.best_checkpoint_metric} needs eval_bleu (--eval-bleu)")
        if self.compile and self.compile_mode in ("reduce-overhead", "max-autotune") and not self.length_buckets:
            raise ValueError(f"--compile-mode {self.compile_mode} records a CUDA graph for each batch shape: give "
                             "--length-buckets N (at most 2N shapes)")


_WORDS = (lambda c: not c.sentencepiece, "to --subword bpe (SentencePiece reads the raw text)")


@dataclass(frozen=True)
class TextConfig(Options):
    """How raw text becomes tokens (text/processor.py); saved in the data directory and every checkpoint.
    `tokenizer="none"` splits on whitespace only (any seq2seq task)."""

    source_lang: str = knob(MISSING, "Source suffix: PREFIX.SRC (or PREFIX.SRC.gz).", flags=("-s", "--source-lang"))
    target_lang: str = knob(MISSING, "Target suffix.", flags=("-t", "--target-lang"))
    subword: str = knob("bpe", "bpe: --tokenizer, then joint BPE (subword-nmt); sentencepiece: raw text to the "
                         "pieces of a joint SentencePiece model (the Moses options and tag protection do not apply).",
                         choices=SUBWORDS)
    tokenizer: str = knob("moses", "Moses (sacremoses) or plain whitespace splitting.", choices=TOKENIZERS,
                           only_if=_WORDS)
    normalize_punctuation: bool = knob(True, "Moses punctuation normalization before tokenizing.",
                                        negation="--no-normalize-punctuation", only_if=_WORDS)
    lowercase: bool = knob(False, "Lowercase after tokenizing.")
    aggressive_dash_splits: bool = knob(False, "Split hyphens (Moses -a): fore@-@runner.", only_if=_WORDS)
    escape: bool = knob(False, "Moses' XML escaping: & < > ' \" [ ] | as entities (&amp; ...), as fairseq's "
                        "--tokenizer moses does.", only_if=_WORDS)
    protect_tags: bool = knob(True, "Keep tags such as <2de> whole through tokenization, lowercasing and BPE.",
                               negation="--no-protect-tags", only_if=_WORDS)
    protect: tuple[str, ...] = knob((), "Also keep words matching this regular expression whole (repeatable).",
                                     only_if=_WORDS)
    language_codes: bool = knob(False, "A line's leading >>code<< (the target-language token of Marian's "
                                "multilingual models) stays one token, as MarianTokenizer keeps it.", only_if=(
                                    lambda c: c.sentencepiece, "with --subword sentencepiece"))

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "protect", tuple(self.protect))  # a list when read back from JSON
        for pattern in self.protect:
            try:
                re.compile(pattern)
            except re.error as e:
                raise ValueError(f"--protect {pattern!r}: not a regular expression ({e})") from None
            if can_match_empty(pattern):
                raise ValueError(f"--protect {pattern!r}: can match an empty string (a word has at least one "
                                 "character: write + for *, and no pattern of lookarounds or \\b alone)")

    @property
    def protected(self) -> list[str]:
        """The patterns of words that pass through tokenization and BPE whole."""
        return ([TAG] if self.protect_tags else []) + list(self.protect)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TextConfig:
        """Settings saved in a data directory or checkpoint; those saved before tags were protected
        keep tokenizing tags as they did."""
        return cls(**{"protect_tags": False, **d})

    @property
    def sentencepiece(self) -> bool:
        return self.subword == "sentencepiece"


def can_match_empty(pattern: str) -> bool:
    """Whether a regular expression can match an empty string somewhere (`a*`, but also `\\b`,
    `(?=a)`): its shortest match has no character (the parser's width of the pattern)."""
    try:
        from re import _parser as parser  # Python >= 3.11
    except ImportError:  # pragma: no cover (Python 3.10)
        import sre_parse as parser
    return parser.parse(pattern).getwidth()[0] == 0


def _cores() -> int:
    return len(os.sched_getaffinity(0))


EXISTING_FILE = {"exists": True, "dir_okay": False}


_BPE = (lambda c: not c.text.sentencepiece, "to --subword bpe")
_PIECES = (lambda c: c.text.sentencepiece, "with --subword sentencepiece")
_BUILT_VOCABULARY = (lambda c: c.srcdict is None, "without --srcdict (a given vocabulary is used as it is)")
_LEARNED_PIECES = (lambda c: c.text.sentencepiece and c.sentencepiece_model is None,
                   "when --subword sentencepiece learns a model (a given --sentencepiece-model has its type)")


# The PreprocessConfig fields that `nmt preprocess --from-data` (or --from-model) takes from the
# data directory (or checkpoint), besides its text settings: given with it, they are refused.
FROM_DATA_DECIDES = ("bpe_codes", "bpe_merges", "sentencepiece_model", "target_sentencepiece_model",
                     "sentencepiece_type", "srcdict", "tgtdict", "vocab_size", "vocab_min_count", "padding_factor",
                     "joined_dictionary")


@dataclass(frozen=True)
class PreprocessConfig(Options):
    """`nmt preprocess` (preprocess.py): what to read, the BPE and vocabulary, the filter."""

    text: TextConfig
    destdir: Path = knob(MISSING, "Output data directory.", path={})
    trainpref: str | None = knob(None, "Training files prefix (learns BPE and vocabulary; filtered).")
    validpref: str | None = knob(None, "Validation files prefix (never filtered).")
    testprefs: tuple[str, ...] = knob((), "Test files prefix (repeatable; never filtered).", flags=("--testpref",))
    bpe_merges: int = knob(32000, "Joint BPE merge operations to learn (0: no BPE).", min=0, only_if=_BPE)
    bpe_codes: Path | None = knob(None, "Apply these BPE codes instead of learning them.", path=EXISTING_FILE,
                                   only_if=_BPE)
    sentencepiece_type: str = knob("unigram", "With --subword sentencepiece: the model type (with --vocab-size "
                                    "pieces).", choices=("unigram", "bpe"), only_if=_LEARNED_PIECES)
    sentencepiece_model: Path | None = knob(None, "With --subword sentencepiece: use this model instead of "
                                             "training one.", path=EXISTING_FILE, only_if=_PIECES)
    target_sentencepiece_model: Path | None = knob(None, "With --sentencepiece-model: the target side's own "
                                                    "model (as released Marian models have).", path=EXISTING_FILE,
                                                    only_if=(lambda c: c.sentencepiece_model is not None,
                                                             "with --sentencepiece-model"))
    sentencepiece_samples: int = knob(0, "With --subword sentencepiece: also write N segmentations of the training "
                                       "split sampled from the model; training takes one per epoch in turn (subword "
                                       "regularization).", min=0, max=100, only_if=_PIECES)
    sentencepiece_alpha: float = knob(0.1, "Smoothing of the sampled segmentations (smaller: more varied).",
                                       min=0.0, exclusive_min=True, only_if=(
                                           lambda c: c.sentencepiece_samples > 0, "with --sentencepiece-samples"))
    joined_dictionary: bool = knob(True, "One vocabulary for both sides (3-way tying) or one per side.",
                                    negation="--separate-dictionaries", only_if=_BUILT_VOCABULARY)
    srcdict: Path | None = knob(None, "Use this source (or joint) vocabulary.", path=EXISTING_FILE)
    tgtdict: Path | None = knob(None, "Use this target vocabulary.", path=EXISTING_FILE)
    vocab_min_count: int = knob(1, "Leave out subwords seen fewer times in training.", min=1,
                                 only_if=_BUILT_VOCABULARY)
    vocab_size: int | None = knob(None, "At most this many entries (with --subword sentencepiece: the pieces of "
                                   "the model to train).", min=5, only_if=(
                                       lambda c: c.sentencepiece_model is None and (
                                           c.srcdict is None or c.text.sentencepiece),
                                       "without --sentencepiece-model or --srcdict (a given model or vocabulary "
                                       "decides the vocabulary)"))
    padding_factor: int = knob(8, "Pad built vocabularies with unused entries to a multiple of this "
                                "(fast matrix shapes).", min=1, max=1024, only_if=_BUILT_VOCABULARY)
    max_len: int = knob(250, "Drop training pairs with a side longer than this many tokens (Moses' words, then "
                              "BPE's subwords; or SentencePiece's pieces).", min=1)
    max_len_ratio: float = knob(1.5, "Drop training pairs whose sides' token counts (Moses' words, or SentencePiece's "
                                 "pieces) differ by more than this ratio (Moses clean-corpus); more than a tenth "
                                 "dropped is warned of.", min=1.0)
    workers: int = field(default_factory=_cores, metadata={
        "help": "Processes for tokenization, BPE and binarization (all usable cores by default).", "min": 1,
        "max": 1024})
    force: bool = knob(False, "Replace an earlier output of `nmt preprocess` in --destdir.")
    progress: bool = True  # progress bars on a terminal (--quiet turns them off)
