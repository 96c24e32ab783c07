"""`nmt score`: corpus BLEU, chrF and TER through sacreBLEU, with its signature.

The paper's figure (§6.1, PAPER.md) is tokenized BLEU with hyphenated compounds split
("##AT##-##AT##"); `paper_bleu` computes it, labelled, because it is not comparable to sacreBLEU.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from sacrebleu.metrics import BLEU, CHRF, TER

from nmt_cli.errors import NmtError

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


def bpe_warning(hypotheses: Sequence[str], hyp_name: str) -> str | None:
    """A warning when the hypotheses still hold subword-nmt's joining markers (`@@ `): BLEU of
    subwords is not BLEU of words."""
    marked = next((n for n, line in enumerate(hypotheses, 1) if "@@ " in line or line.endswith("@@")), None)
    if marked is None:
        return None
    return (f"warning: {hyp_name} line {marked} holds BPE markers ('@@ '): this scores subwords, not words; "
            "score nmt translate's output, or remove them first: sed -r 's/(@@ )|(@@ ?$)//g'")


def corpus_scores(hypotheses: Sequence[str], references: Sequence[Sequence[str]], metrics: Sequence[str] = ("bleu",),
                  tokenize: str | None = None, lowercase: bool = False) -> list[Score]:
    """sacreBLEU's corpus scores of detokenized `hypotheses` against one or more reference streams."""
    scores = []
    for name in metrics:
        if name == "bleu":
            metric = BLEU(tokenize=tokenize, lowercase=lowercase)
        elif name == "chrf":
            metric = CHRF(lowercase=lowercase)
        elif name == "ter":
            metric = TER()  # sacreBLEU's default TER is case-insensitive
        else:
            raise NmtError(f"unknown metric {name!r}; expected one of {', '.join(METRICS)}")
        result = metric.corpus_score(list(hypotheses), [list(r) for r in references])
        signature = str(metric.get_signature())
        scores.append(Score(name, result.score, signature, f"{result} {signature}".strip()))
    return scores


def split_compounds(line: str) -> str:
    """The paper's en-de scoring: "well-known" -> "well ##AT##-##AT## known" (tensor2tensor's get_ende_bleu)."""
    return COMPOUND.sub(" ##AT##-##AT## ", line)


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
