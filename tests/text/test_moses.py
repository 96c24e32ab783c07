"""Moses normalization and tokenization: ours gives sacremoses' results; the module loads only when used."""

import subprocess
import sys

import sacremoses
from conftest import head

from nmt_cli.text.moses import MosesPunctNormalizer, MosesTokenizer


def test_moses_tokenizer_gives_sacremoses_results(multi30k):
    """Our MosesTokenizer only makes two character-class tests cheaper: same tokens as sacremoses,
    on lines with periods inside (which exercise both tests)."""
    crafted = ["Mr. Smith met Dr. Who in the U.S. today. then he left.", "z.B. das ist gut. ärger. Ölfarbe.",
               "No. 5 and p. 12. a. b. c.", "Ein Mann. ein Hund. 3. Platz."]
    for lang in ("en", "de"):
        ours, reference = MosesTokenizer(lang=lang), sacremoses.MosesTokenizer(lang=lang)
        lines = head(multi30k / f"train.{lang}", 300)
        rotated = [" ".join(line.split()[1:] + line.split()[:1]) for line in lines]  # periods inside
        for line in crafted + lines + rotated:
            assert ours.tokenize(line, escape=False) == reference.tokenize(line, escape=False), line
        for text in ("abc", "aBc", "", "ä", "1", "é.", ".", "A.B"):
            assert ours.islower(text) == reference.islower(text)
            assert ours.isanyalpha(text) == reference.isanyalpha(text)


def test_punctuation_normalizer_gives_sacremoses_results(multi30k):
    """Our MosesPunctNormalizer only prepares sacremoses' substitutions once: same text out, on
    real lines and on lines holding what every substitution looks for."""
    crafted = ["„Hallo“ – sagte er… «\u00a0oui\u00a0» , ( a ) ; : ''x'' ´´ ‚b‘ don’t L‘a 5 % 1\u00a0000",
               "nº\u00a01 \u00a0ºC 3\u00a0cm \u00a0? \u00a0! \u00a0; ,\u00a0x \u00a0% \u00a0: »\u00a0« \u00a0» ",
               'He said "yes", then "no". `quoted` — dash\r  spaces   here (x) .', "", "   "]
    for lang in ("en", "de", "fr", "cs", "es"):
        ours, reference = MosesPunctNormalizer(lang=lang), sacremoses.MosesPunctNormalizer(lang=lang)
        assert any(compiled is None for _, compiled, _ in ours.steps)  # some steps are plain replacements
        lines = head(multi30k / f"train.{lang if lang in ('en', 'de', 'fr') else 'en'}", 500)
        for line in crafted + lines:
            assert ours.normalize(line) == reference.normalize(line), (lang, line)
    # sacremoses' optional passes before and after the substitutions go through the same methods
    options = {"pre_replace_unicode_punct": True, "post_remove_control_chars": True}
    ours, reference = MosesPunctNormalizer(lang="en", **options), sacremoses.MosesPunctNormalizer(lang="en", **options)
    for line in crafted + ["，。！？：；（）１２ 【x】 ％ a\u200bb\x07c"]:
        assert ours.normalize(line) == reference.normalize(line), line


def test_a_pipeline_without_moses_does_not_import_sacremoses(tmp_path):
    """A SentencePiece or whitespace pipeline (or `--input-format bpe`) never waits for sacremoses."""
    code = ("import sys; from nmt_cli.config import TextConfig; from nmt_cli.text.processor import TextProcessor; "
            "TextProcessor(TextConfig('en', 'de', tokenizer='none'), 'en', 'a b\\n'); "
            "assert 'sacremoses' not in sys.modules; "
            "TextProcessor(TextConfig('en', 'de'), 'en'); assert 'sacremoses' in sys.modules")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
