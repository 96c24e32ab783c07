"""`nmt score`: corpus BLEU, chrF and TER through sacreBLEU, with its signature; each line's
scores (`--sentence`, sacreBLEU's sentence level: BLEU with effective order); two systems compared
by paired bootstrap resampling (`--compare`, sacreBLEU's own test: each one's mean and 95%
confidence interval, the second's p-value).

The paper's figure (§6.1, PAPER.md) is tokenized BLEU with hyphenated compounds split
("##AT##-##AT##"); `paper_bleu` computes it, labelled, because it is not comparable to sacreBLEU.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sacrebleu.metrics import BLEU, CHRF, TER

from nmt_cli.errors import NmtError
from nmt_cli.lines import decode_lines

METRICS = ("bleu", "chrf", "ter")
COMPOUND = re.compile(r"(?<=\S)-(?=\S)")


@dataclass
class Score:
    metric: str
    score: float
    signature: str
    text: str  # sacreBLEU's own one-line rendering

    def to_dict(self) -> dict[str, object]:
        return {"metric": self.metric, "score": round(self.score, 4), "signature": self.signature, "text": self.text}


def check_lengths(hypotheses: Sequence[str], hyp_name: str, references: Sequence[Sequence[str]],
                  ref_names: Sequence[str]) -> None:
    """Every reference must have as many lines as the hypothesis, and they must have some."""
    if not hypotheses and all(not ref for ref in references):
        raise NmtError(f"{hyp_name} and {', '.join(ref_names)}: no lines to score")
    for name, ref in zip(ref_names, references):
        if len(ref) != len(hypotheses):
            raise NmtError(f"{hyp_name} has {len(hypotheses)} lines but {name} has {len(ref)}: line counts differ")


def read_lines_of(path: Path | None, warn: Callable[[str], None] | None = None) -> tuple[str, list[str]]:
    """The name and lines of a file of `path` (stdin: None); with `warn`, hypotheses whose BPE
    markers are left in them are warned of."""
    name = str(path) if path else "<stdin>"
    with open(path, "rb") if path else sys.stdin.buffer as stream:
        lines = list(decode_lines(stream, name))
    if warn is not None and (warning := bpe_warning(lines, name)) is not None:
        warn(warning)
    return name, lines


def bpe_warning(hypotheses: Sequence[str], hyp_name: str) -> str | None:
    """A warning when the hypotheses still hold subword-nmt's joining markers (`@@ `): BLEU of
    subwords is not BLEU of words."""
    marked = next((n for n, line in enumerate(hypotheses, 1) if "@@ " in line or line.endswith("@@")), None)
    if marked is None:
        return None
    return (f"warning: {hyp_name} line {marked} holds BPE markers ('@@ '): this scores subwords, not words; "
            "score nmt translate's output, or remove them first: sed -r 's/(@@ )|(@@ ?$)//g'")


def metric(name: str, tokenize: str | None = None, lowercase: bool = False, sentence: bool = False) -> Any:
    """sacreBLEU's metric `name` (BLEU with effective order for single sentences, as its
    --sentence-level); TER is case-insensitive as sacreBLEU's default is."""
    if name == "bleu":
        try:
            return BLEU(tokenize=tokenize, lowercase=lowercase, effective_order=sentence)
        except (ImportError, RuntimeError) as e:  # mecab's tokenizers without their packages
            extra = {"ja-mecab": "ja", "ko-mecab": "ko"}.get(str(tokenize), "")
            first = next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)
            raise NmtError(f"--tokenize {tokenize}: {first[:120]}"
                           + (f" (pip install 'sacrebleu[{extra}]')" if extra else "")) from None
    if name == "chrf":
        return CHRF(lowercase=lowercase)
    if name == "ter":
        return TER()
    raise NmtError(f"unknown metric {name!r}; expected one of {', '.join(METRICS)}")


def corpus_scores(hypotheses: Sequence[str], references: Sequence[Sequence[str]], metrics: Sequence[str] = ("bleu",),
                  tokenize: str | None = None, lowercase: bool = False) -> list[Score]:
    """sacreBLEU's corpus scores of detokenized `hypotheses` against one or more reference streams."""
    scores = []
    for name in metrics:
        scorer = metric(name, tokenize, lowercase)
        result = scorer.corpus_score(list(hypotheses), [list(r) for r in references])
        signature = str(scorer.get_signature())
        scores.append(Score(name, result.score, signature, f"{result} {signature}".strip()))
    return scores


def sentence_scores(hypotheses: Sequence[str], references: Sequence[Sequence[str]], metrics: Sequence[str] = ("bleu",),
                    tokenize: str | None = None, lowercase: bool = False) -> list[dict[str, float]]:
    """Each line's score by each metric (sacreBLEU's sentence_score)."""
    scorers = {name: metric(name, tokenize, lowercase, sentence=True) for name in metrics}
    return [{name: scorer.sentence_score(hyp, [ref[k] for ref in references]).score
             for name, scorer in scorers.items()} for k, hyp in enumerate(hypotheses)]


@dataclass
class Comparison:
    """Two systems under one metric by paired bootstrap resampling: each one's score, the mean
    and 95% confidence interval of its resampled scores, and the p-value of the difference."""

    metric: str
    names: tuple[str, str]
    results: tuple[Any, Any]  # sacreBLEU's significance.Result: score, mean, ci (and p_value for the second)
    signature: str

    @property
    def text(self) -> str:
        (first, second), (a, b) = self.names, self.results
        return (f"{self.metric}: {first} {a.score:.2f} ({a.mean:.2f} ± {a.ci:.2f}) | {second} {b.score:.2f} "
                f"({b.mean:.2f} ± {b.ci:.2f}), p = {b.p_value:.4f}{' *' if b.p_value < 0.05 else ''} {self.signature}")

    def to_dict(self) -> dict[str, object]:
        return {"metric": self.metric, "signature": self.signature, "systems": [
            {"name": name, "score": round(float(r.score), 4), "mean": round(float(r.mean), 4),
             "ci": round(float(r.ci), 4), **({"p_value": round(float(r.p_value), 4)} if r.p_value is not None else {})}
            for name, r in zip(self.names, self.results)]}


def paired_bootstrap(systems: Sequence[tuple[str, Sequence[str]]], references: Sequence[Sequence[str]],
                     metrics: Sequence[str] = ("bleu",), tokenize: str | None = None, lowercase: bool = False,
                     samples: int = 1000) -> list[Comparison]:
    """The second of two (name, hypotheses) `systems` against the first, by sacreBLEU's paired
    bootstrap resampling (`samples` resamples; its seed, 12345 unless SACREBLEU_SEED says)."""
    from sacrebleu.significance import PairedTest

    scorers = {name: metric(name, tokenize, lowercase) for name in metrics}
    test = PairedTest([(name, list(hyps)) for name, hyps in systems], scorers, [list(r) for r in references],
                      test_type="bs", n_samples=samples)
    signatures, results = test()
    names = (systems[0][0], systems[1][0])
    return [Comparison(label, names, (results[label][0], results[label][1]), str(signatures[label]))
            for label in signatures]


def split_compounds(line: str) -> str:
    """The paper's en-de scoring: "well-known" -> "well ##AT##-##AT## known" (tensor2tensor's get_ende_bleu)."""
    return COMPOUND.sub(" ##AT##-##AT## ", line)


def check_moses_language(lang: str) -> None:
    """Refuse a language Moses has no rules for (its non-breaking prefixes), which it would
    otherwise tokenize as English without a word."""
    from sacremoses.corpus import NonbreakingPrefixes

    known = sorted(code for code in NonbreakingPrefixes().available_langs if len(code) <= 3)
    if lang not in known:
        raise NmtError(f"--paper-bleu {lang}: not a language of the Moses tokenizer ({', '.join(known)})")


def paper_bleu(hypotheses: Sequence[str], references: Sequence[Sequence[str]], lang: str) -> Score:
    """Tokenized BLEU after Moses tokenization and compound splitting, as the paper reported it."""
    from sacremoses import MosesTokenizer

    tokenizer = MosesTokenizer(lang=lang)

    def prepare(lines: Sequence[str]) -> list[str]:
        return [split_compounds(tokenizer.tokenize(line, escape=False, return_str=True)) for line in lines]

    metric = BLEU(tokenize="none", force=True)
    result = metric.corpus_score(prepare(hypotheses), [prepare(r) for r in references])
    label = f"paper-style tokenized BLEU (Moses {lang}, compound-split; not comparable to sacreBLEU)"
    return Score("paper_bleu", result.score, label, f"{result} [{label}]")


@dataclass(frozen=True)
class Scoring:
    """What `nmt score` computes: the metrics and their settings, and in which form."""

    metrics: Sequence[str] = ("bleu",)
    tokenize: str | None = None
    lowercase: bool = False
    paper_lang: str | None = None  # also the paper's BLEU
    sentence: bool = False  # each line's scores
    as_json: bool = False


def scored_lines(refs: list[Path], hyps: list[Path | None], scoring: Scoring, warn: Callable[[str], None]
                 ) -> list[str]:
    """`nmt score`'s output: the corpus scores of one hypothesis file (stdin: None), each of its
    lines' scores (`scoring.sentence`), or two files compared (two `hyps`)."""
    s = scoring
    if s.paper_lang:
        check_moses_language(s.paper_lang)
    references = [read_lines_of(ref)[1] for ref in refs]
    systems = [read_lines_of(path, warn) for path in hyps]
    for name, hypotheses in systems:
        check_lengths(hypotheses, name, references, [str(r) for r in refs])
    if len(systems) == 2:
        return [json.dumps(c.to_dict()) if s.as_json else c.text
                for c in paired_bootstrap(systems, references, s.metrics, s.tokenize, s.lowercase)]
    hypotheses = systems[0][1]
    if s.sentence:
        return [json.dumps({"line": number, **{k: round(v, 4) for k, v in scores.items()}}) if s.as_json
                else "\t".join(f"{v:.4f}" for v in scores.values())
                for number, scores in enumerate(sentence_scores(hypotheses, references, s.metrics, s.tokenize,
                                                                s.lowercase), 1)]
    results = corpus_scores(hypotheses, references, s.metrics, s.tokenize, s.lowercase)
    if s.paper_lang:
        results.append(paper_bleu(hypotheses, references, s.paper_lang))
    return [json.dumps(result.to_dict()) if s.as_json else result.text for result in results]
