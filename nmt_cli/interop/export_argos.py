"""`nmt export --format argos`: an Argos Translate package (`NAME.argosmodel`), which argostranslate
and LibreTranslate install and run as they are (`argospm install`, `install_from_path`,
LibreTranslate's packages folder): a zip of one folder holding
- `metadata.json`: the pair (codes and names), the package's version, its type;
- `model/`: the CTranslate2 export (export_ctranslate2.py: int8 by default, as published packages
  are), with nmt-cli.json, so that `nmt import` of the package gives this model back;
- `sentencepiece.model`: the text pipeline Argos runs (one SentencePiece model for both sides;
  or `bpe.model`, subword-nmt codes after sacremoses' normalizer and tokenizer with their defaults,
  where the model was trained on exactly that);
- `minisbd/<code>.onnx`: a sentence splitter trained on source text (sentence_splitter.py), so that
  argostranslate splits paragraphs with no network;
- `README.md`: what the model is and how Argos searches with it.

Argos searches with beam 4 and a length penalty of 0.2 (|Y|^0.2), at most 256 tokens:
ARGOS_SEARCH, which `nmt import` of a package takes as its search and the README spells as flags."""

from __future__ import annotations

import tempfile
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nmt_cli.config import SearchConfig
from nmt_cli.errors import NmtError
from nmt_cli.files import reason, replacing
from nmt_cli.interop.export_ctranslate2 import write_ctranslate2
from nmt_cli.interop.formats import is_argos_package
from nmt_cli.interop.writing import write_json
from nmt_cli.lines import read_lines
from nmt_cli.model.checkpoint import ModelBundle, load_bundle
from nmt_cli.options import flag_name

if TYPE_CHECKING:
    from nmt_cli.interop.exporter import ExportRequest

ARGOS_VERSION = "1.9.0"
# argostranslate's translate_batch: beam 4 (ARGOS_BEAM_SIZE), length_penalty 0.2, CTranslate2's
# defaults otherwise (at most 256 tokens, cut there; no </s> first), <unk> kept (replace_unknowns).
ARGOS_SEARCH = {"beam": 4, "lenpen": 0.2, "lenpen_form": "length", "stopping": "early", "at_limit": "cut",
                "max_len_a": 0.0, "max_len_b": 256, "min_len": 1, "allow_unk": True}


def as_flags(search: dict[str, Any]) -> str:
    """Search settings (numbers, words, flags that are on) as `nmt translate`'s flags."""
    fields = SearchConfig.__dataclass_fields__
    words = []
    for key, value in search.items():
        words.append(flag_name(fields[key]).split("/")[0])  # an on/off flag's first name
        if value is not True:
            words.append(f"{value:g}" if isinstance(value, float) else str(value))
    return " ".join(words)


ARGOS_FLAGS = as_flags(ARGOS_SEARCH)
# The text settings of Argos' BPETokenizer (sacremoses' defaults, then subword-nmt): what a Moses
# and BPE model must have been trained with to go out as bpe.model, and what one comes in with.
ARGOS_MOSES = {"tokenizer": "moses", "normalize_punctuation": True, "lowercase": False, "aggressive_dash_splits": False,
               "escape": True, "protect_tags": False, "protect": (), "language_codes": False}
LANGUAGE_NAMES = {"ar": "Arabic", "bg": "Bulgarian", "ca": "Catalan", "cs": "Czech", "da": "Danish", "de": "German",
                  "el": "Greek", "en": "English", "eo": "Esperanto", "es": "Spanish", "et": "Estonian",
                  "fa": "Persian", "fi": "Finnish", "fr": "French", "ga": "Irish", "he": "Hebrew", "hi": "Hindi",
                  "hu": "Hungarian", "id": "Indonesian", "it": "Italian", "ja": "Japanese", "ko": "Korean",
                  "lt": "Lithuanian", "lv": "Latvian", "mg": "Malagasy", "nb": "Norwegian", "nl": "Dutch",
                  "pl": "Polish", "pt": "Portuguese", "ro": "Romanian", "ru": "Russian", "sk": "Slovak",
                  "sl": "Slovenian", "sq": "Albanian", "sv": "Swedish", "th": "Thai", "tr": "Turkish",
                  "uk": "Ukrainian", "ur": "Urdu", "vi": "Vietnamese", "zh": "Chinese"}


def export(request: ExportRequest) -> None:
    """`nmt export --format argos`, with --quantize, --sentences and the package's names."""
    config = request.config
    if config.sentences is None:
        raise NmtError("--format argos trains the package's sentence splitter: give --sentences FILE (source-language "
                       "text, a sentence a line, such as the training data's source side)")
    bundle = load_bundle(request.model)
    text_file = argos_text(bundle)
    from nmt_cli.interop.sentence_splitter import training_lines

    lines = training_lines(read_lines(config.sentences))
    if not lines:
        raise NmtError(f"{config.sentences}: no text to train the sentence splitter on")
    source, target = bundle.text.source_lang, bundle.text.target_lang
    metadata = {"package_version": config.package_version, "argos_version": ARGOS_VERSION,
                "from_code": source, "from_name": config.from_name or LANGUAGE_NAMES.get(source, source),
                "to_code": target, "to_name": config.to_name or LANGUAGE_NAMES.get(target, target),
                "type": "translate", "links": []}
    name = f"translate-{source}_{target}-{config.package_version.replace('.', '_')}"
    check_destination(request.output)
    try:
        request.output.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=request.output.parent, prefix=".nmt-argos-") as tmp:
            folder = Path(tmp) / name
            folder.mkdir()
            write_package(bundle, folder, metadata, text_file, config.quantization or "int8", lines)
            with replacing(request.output, "the package") as out, \
                    zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
                for path in sorted(folder.rglob("*")):
                    z.write(path, path.relative_to(tmp))
    except OSError as e:
        raise NmtError(f"{request.output}: cannot write the package ({reason(e)}); nothing was written") from None


def argos_text(bundle: ModelBundle) -> str:
    """The text pipeline's file Argos reads (sentencepiece.model or bpe.model), or a one-line refusal
    naming what Argos cannot run."""
    text, positions = bundle.text, bundle.model.config.max_positions
    if positions <= ARGOS_SEARCH["max_len_b"]:
        raise NmtError(f"--format argos: Argos outputs up to {ARGOS_SEARCH['max_len_b']} tokens, and this model's "
                       f"positions end at {positions - 1}")
    if text.language_codes:
        raise NmtError("--format argos: an Argos package translates one pair, and this model takes a >>code<< "
                       "before each line")
    if text.sentencepiece:
        if bundle.target_sentencepiece is not None:
            raise NmtError("--format argos: Argos runs one SentencePiece model for both sides, and this model has "
                           "one per side")
        if text.lowercase:
            raise NmtError("--format argos: Argos does not lowercase; train without --lowercase")
        return "sentencepiece.model"
    differ = [key for key, value in ARGOS_MOSES.items() if getattr(text, key) != value]
    if bundle.bpe_codes is None or differ:
        what = f"its {', '.join(differ)} differ from sacremoses' defaults" if differ else "it has no BPE codes"
        raise NmtError(f"--format argos: Argos reads SentencePiece models, or Moses tokens and BPE as sacremoses' "
                       f"defaults make them, and {what}: train on `nmt preprocess --subword sentencepiece` data")
    return "bpe.model"


def check_destination(out: Path) -> None:
    """Replace only an earlier package, and only at a name Argos installs."""
    if out.suffix != ".argosmodel":
        raise NmtError(f"{out}: an Argos package's name ends in .argosmodel")
    if out.exists() and not (out.is_file() and is_argos_package(out)):
        raise NmtError(f"{out}: exists and is not an Argos package; choose another --output")


def write_package(bundle: ModelBundle, folder: Path, metadata: dict, text_file: str, quantization: str,
                  lines: list[str]) -> None:
    """The package's files into `folder`."""
    from nmt_cli.interop.sentence_splitter import save_splitter, train_splitter

    write_json(folder / "metadata.json", metadata)
    (folder / "model").mkdir()
    write_ctranslate2(bundle, folder / "model", quantization)
    if text_file == "sentencepiece.model":
        assert bundle.sentencepiece is not None
        (folder / text_file).write_bytes(bundle.sentencepiece)
    else:
        assert bundle.bpe_codes is not None
        (folder / text_file).write_text(bundle.bpe_codes, encoding="utf-8")
    (folder / "minisbd").mkdir()
    model, characters = train_splitter(lines)
    save_splitter(model, characters, metadata["from_code"], folder / "minisbd" / f"{metadata['from_code']}.onnx")
    (folder / "README.md").write_text(readme(bundle, metadata, quantization), encoding="utf-8")


def readme(bundle: ModelBundle, metadata: dict, quantization: str) -> str:
    """The package's model card."""
    about = bundle.summary()
    pair = f"{metadata['from_name']} → {metadata['to_name']}"
    return f"""# {pair}

An Argos Translate package made by `nmt export --format argos` (nmt-cli) from a model {about['origin']}:
{about['parameters']:,} parameters, {about['layers']} layers, vocabulary {about['vocabulary']}, subwords
{about['subwords']}; weights stored as {quantization} (CTranslate2).

- Install: `argostranslate.package.install_from_path(PATH)`, into the packages folder that argostranslate and
  LibreTranslate read (`ARGOS_PACKAGES_DIR`).
- Sentences: `minisbd/{metadata['from_code']}.onnx` splits paragraphs, trained on the model's source text.
- Search: Argos translates with beam 4 and a length penalty of 0.2; `nmt translate {ARGOS_FLAGS}` searches as
  it does. `nmt import` of this package gives the model back, to translate, fine-tune and export again.

Architecture: {about['architecture']}.
"""

