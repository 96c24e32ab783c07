"""How a trained model runs, as frozen dataclasses like config.py's: `RunConfig`, what a
Translator runs with (the search, batching, the text's forms, hardware: `nmt translate`, `nmt
serve` and the Python API alike); `TranslateConfig`, `nmt translate`'s (a RunConfig, and what its
input and output lines hold); `ServeConfig`, `nmt serve`'s; `ExportConfig`, `nmt export`'s."""

from __future__ import annotations

from dataclasses import MISSING, dataclass
from pathlib import Path

from nmt_cli.config import (
    BEAM_MAX,
    EXISTING_FILE,
    SEARCHING,
    SearchConfig,
    device_for,
    device_knob,
    precision_knob,
    quantize_knob,
    threads_knob,
)
from nmt_cli.options import Options, knob


@dataclass(frozen=True)
class RunConfig(Options):
    """A Translator's (translator.py): the search, batching, the text's forms, hardware."""

    search: SearchConfig = SearchConfig()
    max_tokens: int = knob(8000, "Source tokens per batch.", min=1)
    batch_size: int | None = knob(None, "Sentences per batch at most.", min=1)
    input_format: str = knob("raw", "raw: tokenize and apply BPE; bpe: the input is already BPE tokens.",
                              choices=("raw", "bpe"))
    output_format: str = knob("text", "text: detokenized; tokens: BPE removed; bpe: as produced.",
                               choices=("text", "tokens", "bpe"))
    quantize: str | None = quantize_knob()
    cuda_graphs: bool = knob(False, "GPU: replay beam search's decoder steps as CUDA graphs (batches padded to "
                              "fixed shapes).", only_if=(lambda c: not c.search.samples, SEARCHING[1]))
    device: str = device_knob()
    precision: str = precision_knob()
    threads: int | None = threads_knob()

    @property
    def run_on(self) -> str:
        return device_for(self.device, self.quantize)


_PLOT = (lambda c: c.attention_plot is not None, "with --attention-plot")


@dataclass(frozen=True)
class TranslateConfig(Options):
    """`nmt translate` (translate.py): its Translator's `run`, and what input and output lines hold
    (prefixes, constraints, references to score; text or JSON lines, attention)."""

    run: RunConfig = RunConfig()
    format: str = knob("text", "jsonl: one JSON object per line with scores and n-best.", choices=("text", "jsonl"))
    prefix: bool = knob(False, "Input lines are SOURCE<TAB>TARGET-PREFIX: each translation starts with its "
                         "prefix (interactive post-editing; a line without a tab has none).")
    constraints: bool = knob(False, "Input lines are SOURCE<TAB>PHRASE<TAB>PHRASE...: each translation holds "
                             "every phrase, in any order (terminology; --beam 4 or more places them best).",
                             only_if=(lambda c: not (c.prefix or c.run.search.samples),
                                      "without --prefix, --sampling and --mbr-candidates sample"))
    avoid: tuple[str, ...] = knob((), "A phrase that no translation may hold (repeatable).",
                                  only_if=(lambda c: not c.run.search.samples,
                                           "without --sampling and --mbr-candidates sample"))
    score_reference: bool = knob(False, "Input lines are SOURCE<TAB>TARGET: print the log-probability of each "
                                 "target under the model instead of a translation (--format jsonl: also its score "
                                 "and each token's), to filter a corpus or rerank.", only_if=(
                                     lambda c: not (c.prefix or c.run.search.samples or c.attention or c.constraints
                                                    or c.avoid or c.attention_plot is not None),
                                     "without --prefix, --sampling, constraints and attention"))
    attention: bool = knob(False, "With --format jsonl: add the encoder-decoder attention (heads averaged) "
                            "for alignment.", only_if=(lambda c: c.format == "jsonl", "with --format jsonl"))
    attention_layer: int | None = knob(None, "Decoder layer for --attention [default: the last].", min=1,
                                        only_if=(lambda c: c.attention, "with --attention"))
    attention_plot: Path | None = knob(None, "Write PNG heat maps of every attention per sentence here "
                                        "(needs matplotlib).", path={"file_okay": False})
    plot_layers: tuple[int, ...] = knob((), "Layers to plot (repeatable) [all].", min=1, flags=("--layers",),
                                         only_if=_PLOT)
    plot_heads: tuple[int, ...] = knob((), "Heads to plot (repeatable) [all].", min=1, flags=("--heads",),
                                        only_if=_PLOT)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.run.search.nbest > 1 and self.format == "text":
            raise ValueError(f"--nbest {self.run.search.nbest} needs --format jsonl: text output has one line per "
                             "input line (the best translation)")


@dataclass(frozen=True)
class ServeConfig(Options):
    """`nmt serve` (serve/app.py): where to listen, what a request may hold, how requests are batched."""

    host: str = knob("127.0.0.1", "Address to listen on (0.0.0.0: every interface).")
    port: int = knob(8080, "Port to listen on.", min=1, max=65535)
    max_sentences: int = knob(1000, "Most sentences in one request.", min=1)
    max_chars: int = knob(10000, "Most characters in one sentence.", min=1)
    max_beam: int = knob(16, "Largest beam (and n-best) a request may ask for.", min=1, max=BEAM_MAX)
    max_hypotheses: int = knob(8192, "Most sentences x beam in one request.", min=1)
    max_output_tokens: int = knob(256, "Most output tokens of a sentence: every search stops there, and a request "
                                   "may not ask for a larger max_len_b.", min=1)
    max_source_tokens: int = knob(50000, "Most source tokens (after subword segmentation) in one request.", min=1)
    max_connections: int = knob(512, "Most connections open at once (kept below the open-file limit); the next "
                                "are answered 503.", min=1)
    read_timeout: float = knob(10.0, "Seconds a client has to send a whole request, from connecting or from its last "
                               "answer; then its connection is closed (408 if a request had begun).", min=0.0,
                               exclusive_min=True, max=3600.0)
    cors_origin: tuple[str, ...] = knob((), "Let the pages of this origin (https://example.com; *: any) call the "
                                        "server from a browser (repeatable).")
    api_keys: Path | None = knob(None, "A file of API keys, one per line (read again on SIGHUP): requests other than "
                                 "/, /health, /languages and the API's description then need `Authorization: "
                                 "Bearer KEY` (or LibreTranslate's api_key).", path=EXISTING_FILE)
    rate_limit: int | None = knob(None, "Requests a minute per API key (without keys: per client address); the next "
                                  "are answered 429 with Retry-After.", min=1)
    failed_key_limit: int = knob(10, "With --api-keys: missing or wrong keys a minute per client address; past it, "
                                 "that address is answered 429 with Retry-After, whatever key it sends.", min=1)
    forwarded_allow_ips: tuple[str, ...] = knob((), "Take the client's address (for the rate limits and the access "
                                                "log) from X-Forwarded-For when the request comes from this proxy "
                                                "address (repeatable; *: any). Off by default: a client reaching the "
                                                "server through a local tunnel cannot choose its address.")
    max_body_bytes: int = knob(4 * 2**20, "Most bytes in a request's body: a larger one is answered 413 before more "
                               "of it is read.", min=1)
    access_log: bool = knob(False, "Log a line per request: client, method, path, status, milliseconds.")
    batch_window_ms: float = knob(5.0, "How long a request waits for others to be translated with it.", min=0.0,
                                   max=10000.0)
    max_tokens: int = knob(2048, "Source tokens per search (padding included): a request with more is cut into "
                                 "several, and waiting requests take turns, so none waits for more than about "
                                 "one search.", min=1)
    shortlist: tuple[str, ...] = knob((), "[SRC-TGT=]FILE: a lexical shortlist of `nmt shortlist` for the model of "
                                      "a pair (of the one pair served, without SRC-TGT=); repeatable.")
    drain_seconds: int = knob(30, "On SIGTERM, how long the requests in flight may take to finish; those that "
                               "cannot are answered 503.", min=0, max=3600)
    metrics_key: Path | None = knob(None, "A file of keys, one per line as --api-keys' (read again on SIGHUP; a "
                                     "file keeps a key out of the process list): /metrics then asks for one "
                                     "(Authorization: Bearer KEY), wrong guesses counted with --failed-key-limit's; "
                                     "it is open otherwise (Prometheus scrapes without --api-keys' keys).",
                                     path=EXISTING_FILE)
    quantize: str | None = quantize_knob()
    device: str = device_knob()
    precision: str = precision_knob()
    threads: int | None = threads_knob()


EXPORT_FORMATS = ("ctranslate2", "argos", "transformers", "onnx", "web", "safetensors")
CT2_QUANTIZATIONS = ("float32", "int8", "int8_float16", "int8_float32", "int8_bfloat16", "float16", "bfloat16")
_CTRANSLATE2 = (lambda c: c.format == "ctranslate2", "to --format ctranslate2")
_QUANTIZED = (lambda c: c.format in ("ctranslate2", "argos", "onnx", "web"),
              "to --format ctranslate2, argos, onnx or web")
_ARGOS = (lambda c: c.format == "argos", "to --format argos")
_WEB = (lambda c: c.format == "web", "to --format web")
EXISTING_DIR = {"exists": True, "file_okay": False}


@dataclass(frozen=True)
class ExportConfig(Options):
    """`nmt export`'s format, and the options only CTranslate2's takes (the model card's, only
    transformers', are interop/card.py's CardConfig)."""

    format: str = knob(MISSING, "ctranslate2: a CTranslate2 model directory (needs ctranslate2); argos: an Argos "
                       "Translate package (NAME.argosmodel) that LibreTranslate and argostranslate install (needs "
                       "ctranslate2 and onnx; SentencePiece models); transformers: a "
                       "Hugging Face MarianMTModel directory with its tokenizer and a model card (needs transformers; "
                       "SentencePiece models); onnx: ONNX graphs of the encoder and the decoder's cached step, for "
                       "onnxruntime and transformers.js (needs onnx and onnxscript); web: a static page that "
                       "translates in the browser (SentencePiece models); safetensors: one file.",
                       choices=EXPORT_FORMATS)
    quantization: str | None = knob(None, "ctranslate2, argos: store the weights in this type (--quantize int8 as "
                                    "`nmt translate` and `nmt serve` spell it); onnx: int8 adds int8 copies of the "
                                    "graphs (*_quantized.onnx); web: the page runs those [default: float32; argos: "
                                    "int8, as published packages are].", choices=CT2_QUANTIZATIONS,
                                    only_if=_QUANTIZED, flags=["--quantize", "--quantization"])
    shortlist: Path | None = knob(None, "ctranslate2: write this shortlist of `nmt shortlist` as its vocabulary map "
                                  "(use_vmap=True).", path=EXISTING_FILE, only_if=_CTRANSLATE2)
    transformers_js: Path | None = knob(None, "web: the npm install of transformers.js to copy into the page "
                                        "(node_modules/@huggingface/transformers; default: $NMT_TRANSFORMERS_JS).",
                                        path=EXISTING_DIR, only_if=_WEB)
    sentences: Path | None = knob(None, "argos: source-language text, a sentence a line (the training data's source "
                                  "side), to train the package's sentence splitter on (minisbd/); required.",
                                  path=EXISTING_FILE, only_if=_ARGOS)
    package_version: str = knob("1.0", "argos: the package's version (metadata.json).", only_if=_ARGOS,
                                pattern=(r"[0-9]+(\.[0-9]+)*", "a version such as 1.0 or 1.2.3"))
    from_name: str | None = knob(None, "argos: the source language's name as LibreTranslate lists it [default: the "
                                 "English name of its code, where nmt-cli knows it].", only_if=_ARGOS)
    to_name: str | None = knob(None, "argos: the target language's name (see --from-name).", only_if=_ARGOS)


@dataclass(frozen=True)
class ImportConfig(Options):
    """What `nmt import` needs to know of a checkpoint file (fairseq's, OpenNMT-py's) that it does
    not say itself: its languages, dictionaries, and the text pipeline its tokens came from."""

    source_lang: str | None = knob(None, "The source language, where the checkpoint does not say it.",
                                   flags=("-s", "--source-lang"))
    target_lang: str | None = knob(None, "The target language (see -s).", flags=("-t", "--target-lang"))
    data_dir: Path | None = knob(None, "fairseq: the folder of dict.SRC.txt and dict.TGT.txt [default: the "
                                 "checkpoint's, then its data's].", path=EXISTING_DIR)
    bpe_codes: Path | None = knob(None, "The subword-nmt codes of its text (none: its tokens are words) [default: "
                                  "OpenNMT-py: a file of its options' bpe model's name beside it].",
                                  path=EXISTING_FILE)
    sentencepiece: Path | None = knob(None, "The SentencePiece model of its text (fairseq: of the raw line) "
                                      "[default: OpenNMT-py: a file of its options' sentencepiece model's name "
                                      "beside it].",
                                      path=EXISTING_FILE)
    tokenizer: str | None = knob(None, "How its text was tokenized before subwords [default: fairseq: moses, as its "
                                 "recipes; OpenNMT-py: none].", choices=("moses", "none"))
