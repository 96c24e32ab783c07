"""The sentence splitter an Argos package carries (`minisbd/<code>.onnx`), trained from source text:
argostranslate splits a paragraph into sentences with MiniSBD before translating them, and uses
the package's own model where it has one, else downloads one (which fails with no network, and
exists for some 80 languages only).

MiniSBD runs Stanza's tokenizer as an ONNX graph: inputs `units` (character ids, [batch, length])
and `features` ([batch, length, 5]: a space, a capital, a digit, the paragraph's last character,
its first), one output of each character's class scores (0 inside a token, 1 a token's last
character, 2 a sentence's last; 3 and 4 are multi-word tokens', unused here); the graph's metadata
hold its `config`, the character vocabulary (`vocab`, Stanza's Vocab state) and a `lexicon` (none).

The network here is small: each character's embedding and features, two convolutions of width 5
(each class sees four characters on either side), and a linear layer. It learns from lines that
are sentences: paragraphs of one to four consecutive lines joined by a space, each word's last
character a token's end and each line's last a sentence's end."""

from __future__ import annotations

import collections
import itertools
import json
import random
import re
from collections.abc import Iterable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

FEATURES = ["space_before", "capitalized", "numeric", "end_of_para", "start_of_para"]  # Stanza's names
CLASSES = 5
PAD, UNK = "<PAD>", "<UNK>"
MOST_CHARACTERS = 2000
MOST_LINES = 100_000  # what it learns from: the first lines (paragraph breaks need no more)
WHITESPACE = re.compile(r"\s+")
NUMERIC = re.compile(r"^[\d]+([,\.]+[\d]+)*[,\.]*$")  # Stanza's test of a numeric unit
SEED = 0


class SentenceSplitter(nn.Module):
    """Class scores of each character from its neighbours within four either side."""

    def __init__(self, characters: int, width: int = 48) -> None:
        super().__init__()
        self.units = nn.Embedding(characters, width, padding_idx=0)
        self.features = nn.Linear(len(FEATURES), width)
        self.conv1 = nn.Conv1d(width, width, 5, padding=2)
        self.conv2 = nn.Conv1d(width, width, 5, padding=2)
        self.out = nn.Linear(width, CLASSES)

    def forward(self, units: Tensor, features: Tensor) -> Tensor:
        x = (self.units(units) + self.features(features)).transpose(1, 2)
        x = F.relu(self.conv2(F.relu(self.conv1(x)))).transpose(1, 2)
        return self.out(x)


def paragraph(lines: list[str]) -> tuple[str, list[int]]:
    """`lines` joined by a space and each character's class."""
    text, labels = "", []
    for line in lines:
        if text:
            text, labels = text + " ", labels + [0]
        words = line.split(" ")
        for k, word in enumerate(words):
            if k:
                text, labels = text + " ", labels + [0]
            text += word
            labels += [0] * (len(word) - 1) + [2 if k == len(words) - 1 else 1]
    return text, labels


def features(text: str) -> list[list[float]]:
    """Stanza's features of each character (as MiniSBD computes them)."""
    last = len(text) - 1
    return [[float(c == " "), float(c.isupper()), float(NUMERIC.match(c) is not None), float(i == last),
             float(i == 0)] for i, c in enumerate(text)]


def examples(lines: list[str], rng: random.Random) -> list[tuple[str, list[int]]]:
    """Paragraphs of 1 to 4 consecutive lines, each line once."""
    out, i = [], 0
    while i < len(lines):
        n = rng.randint(1, 4)
        out.append(paragraph(lines[i:i + n]))
        i += n
    return out


def batch(items: list[tuple[str, list[int]]], ids: dict[str, int]) -> tuple[Tensor, Tensor, Tensor]:
    length = max(len(text) for text, _ in items)
    units = torch.zeros(len(items), length, dtype=torch.long)
    feats = torch.zeros(len(items), length, len(FEATURES))
    labels = torch.full((len(items), length), -100, dtype=torch.long)
    for row, (text, classes) in enumerate(items):
        units[row, :len(text)] = torch.tensor([ids.get(c, 1) for c in text])
        feats[row, :len(text)] = torch.tensor(features(text))
        labels[row, :len(text)] = torch.tensor(classes)
    return units, feats, labels


def training_lines(lines: Iterable[str]) -> list[str]:
    """The first MOST_LINES sentences of `lines` that are not empty, whitespace made single spaces
    (read no further: a training corpus may be millions of lines)."""
    cleaned = (WHITESPACE.sub(" ", line).strip() for line in lines)
    return list(itertools.islice((line for line in cleaned if line), MOST_LINES))


def train_splitter(lines: list[str], steps: int = 300, batch_size: int = 32) -> tuple[SentenceSplitter, list[str]]:
    """A splitter trained on `lines` (sentences, as training_lines gives them) and its characters
    by id (PAD, UNK, then by frequency); the same lines give the same network."""
    counts = collections.Counter(c for line in lines for c in line + " ")
    characters = [PAD, UNK] + sorted(counts, key=lambda c: (-counts[c], c))[:MOST_CHARACTERS]
    ids = {c: i for i, c in enumerate(characters)}
    rng = random.Random(SEED)
    data = examples(lines, rng)
    with torch.random.fork_rng():
        torch.manual_seed(SEED)
        model = SentenceSplitter(len(characters))
        optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
        for _ in range(steps):
            units, feats, labels = batch(rng.sample(data, min(batch_size, len(data))), ids)
            loss = F.cross_entropy(model(units, feats).reshape(-1, CLASSES), labels.reshape(-1), ignore_index=-100)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return model.eval(), characters


def save_splitter(model: SentenceSplitter, characters: list[str], lang: str, path: Path) -> None:
    """The splitter as MiniSBD loads it: the ONNX graph with its config, vocabulary and lexicon."""
    import onnx

    from nmt_cli.interop.export_onnx import export_graph

    batch_dim, length = torch.export.Dim("batch", min=1), torch.export.Dim("length", min=1)
    export_graph(model, (torch.zeros(2, 7, dtype=torch.long), torch.zeros(2, 7, len(FEATURES))), path,
                 ["units", "features"], ["scores"], {"units": {0: batch_dim, 1: length},
                                                     "features": {0: batch_dim, 1: length}})
    graph = onnx.load(str(path))
    config = {"feat_funcs": FEATURES, "max_seqlen": 1000, "skip_newline": False, "no_ssplit": False,
              "batch_size": 32, "use_dictionary": False, "num_dict_feat": 0}
    vocab = {"lang": lang, "idx": 0, "cutoff": 0, "lower": False, "_id2unit": characters,
             "_unit2id": {c: i for i, c in enumerate(characters)}}
    for key, value in (("lang_code", lang), ("config", json.dumps(config)),
                       ("vocab", json.dumps(vocab, ensure_ascii=False)), ("lexicon", "null")):
        entry = graph.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.save(graph, str(path))
