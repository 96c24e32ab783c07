"""What the benchmarks share (imported by the scripts beside it)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from nmt_cli.checkpoint import ModelBundle
from nmt_cli.translate import Translator
from nmt_cli.vocab import BOS_ID, EOS_ID

SHARED = Path(os.environ.get("NMT_SHARED_DATA", Path(__file__).resolve().parents[3] / "shared" / "data"))


@torch.inference_mode()
def reference_log_probs(bundle: ModelBundle, translator: Translator, sources: list[list[int]],
                        refs: list[str]) -> list[tuple[list[int], np.ndarray]]:
    """Per reference: its target ids (BPE, EOS last) and our model's log-probability of each,
    teacher-forced, with no search. A converted model must give the same numbers."""
    out = []
    for source, ref in zip(sources, refs):
        target = bundle.tgt_vocab.encode(translator.target.encode(ref)) + [EOS_ID]
        src = torch.tensor([source + [EOS_ID]])
        lprobs = bundle.model(src, torch.tensor([[BOS_ID] + target[:-1]])).log_softmax(-1)[0]
        out.append((target, lprobs.gather(-1, torch.tensor(target)[:, None]).squeeze(-1).numpy()))
    return out
