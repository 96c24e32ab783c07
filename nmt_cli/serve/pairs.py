"""The language pairs of `nmt serve`: its `-m [SRC-TGT=]CHECKPOINT` values (a checkpoint without a
pair serves its own, the languages it was preprocessed with; several checkpoints of one pair are
an ensemble), the pair a request names, and the pairs as LibreTranslate's `/languages` lists them."""

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nmt_cli.decode.shortlist import Shortlist
from nmt_cli.errors import NmtError
from nmt_cli.model.checkpoint import ModelBundle, load_bundle

Pair = tuple[str, str]
NAMED = re.compile(r"([A-Za-z0-9_]+)-([A-Za-z0-9_]+)=(.+)")


class NoSuchPair(ValueError):
    """A request whose language pair the server does not serve (or names ambiguously)."""


def named_pair(value: str) -> tuple[Pair | None, Path]:
    """A `[SRC-TGT=]FILE` value as (its pair, or None without one; its file). A file that exists
    is a file, whatever its name looks like."""
    named = None if Path(value).exists() else NAMED.fullmatch(value)
    return ((named[1], named[2]), Path(named[3])) if named else (None, Path(value))


def load_pairs(values: Sequence[str]) -> dict[Pair, list[ModelBundle]]:
    """The models of each pair, in the order given."""
    pairs: dict[Pair, list[ModelBundle]] = {}
    for value in values:
        pair, path = named_pair(value)
        bundle = load_bundle(path)
        pairs.setdefault(pair or (bundle.text.source_lang, bundle.text.target_lang), []).append(bundle)
    return pairs


def load_shortlists(values: Sequence[str], pairs: dict[Pair, list[ModelBundle]]) -> dict[Pair, Shortlist]:
    """The shortlist of each pair from `--shortlist [SRC-TGT=]FILE` values (a file without a pair:
    that of the one pair served), each checked against its pair's vocabularies."""
    shortlists: dict[Pair, Shortlist] = {}
    for value in values:
        pair, path = named_pair(value)
        if pair is None and len(pairs) > 1:
            raise NmtError(f"--shortlist {value}: this server translates {len(pairs)} language pairs; name the pair "
                           "(--shortlist SRC-TGT=FILE)")
        pair = pair or next(iter(pairs))
        if pair not in pairs:
            raise NmtError(f"--shortlist {value}: no model for {pair[0]}-{pair[1]} is served")
        shortlists[pair] = Shortlist.load(path, pairs[pair][0])
    return shortlists


def choose(pairs: Sequence[Pair], source: str | None, target: str | None) -> Pair:
    """The pair a request names: `source` and `target` (either may be left out, and the source may
    be "auto", where one pair fits); NoSuchPair names the pairs served."""
    fitting = [(s, t) for s, t in pairs if source in (None, "auto", s) and target in (None, t)]
    if len(fitting) == 1:
        return fitting[0]
    served = ", ".join(f"{s}-{t}" for s, t in pairs)
    asked = f"{source or 'any'}-{target or 'any'}"
    if not fitting:
        raise NoSuchPair(f"no model for {asked} (this server translates {served})")
    raise NoSuchPair(f"{asked} fits {len(fitting)} language pairs ({served}): name the source and the target")


def languages(pairs: Sequence[Pair]) -> list[dict[str, Any]]:
    """LibreTranslate's list: each source language, with the targets it is translated into."""
    sources: dict[str, list[str]] = {}
    for source, target in pairs:
        sources.setdefault(source, []).append(target)
    return [{"code": source, "name": source, "targets": targets} for source, targets in sources.items()]
