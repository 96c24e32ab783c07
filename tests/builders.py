"""What several test modules build: tiny random Transformers (for the model's tests and for the
search's), token batches, the search's source and prefix tensors, a tiny training run, an
engine of a checkpoint, `nmt translate` run in this process, and the search written out plainly
(`reference_beam_search`, the oracle of search.py's batched one), and an ONNX export's graphs
in onnxruntime with greedy search over them as a caller writes it (`OnnxGraphs`)."""

import math
from pathlib import Path

import numpy as np
import torch
from click.testing import CliRunner

from nmt_cli.cli import main
from nmt_cli.config import SearchConfig, TrainConfig
from nmt_cli.decode.engine import Engine
from nmt_cli.decode.search import length_penalty, max_lengths
from nmt_cli.model.architecture import PRESETS
from nmt_cli.model.checkpoint import load_bundle
from nmt_cli.model.transformer import Transformer
from nmt_cli.run_config import RunConfig
from nmt_cli.text.vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from nmt_cli.train.run import TrainingRun

# ---------------------------------------------------------------------------- models

PAD = PAD_ID
TINY = PRESETS["small"].replace(encoder_layers=2, decoder_layers=2, d_model=32, d_ff=64, heads=4, dropout=0.0)
SEARCH_TINY = TINY.replace(max_positions=64)


def tiny_model(seed: int = 0, shared: bool = True, **overrides) -> Transformer:
    """TINY with `overrides`, a source vocabulary of 23 (and a target one of 31 unless `shared`)."""
    torch.manual_seed(seed)
    tgt_vocab = 23 if shared else 31
    return Transformer(TINY.replace(**overrides), 23, tgt_vocab, PAD, shared).eval()


def random_tokens(batch: int, length: int, vocab: int = 23) -> torch.Tensor:
    return torch.randint(4, vocab, (batch, length))


def random_model(vocab: int, seed: int = 0, scale: float = 1.0, **variant) -> Transformer:
    """SEARCH_TINY, or it with `variant`'s fields, its embeddings (learned positions too) times `scale`."""
    torch.manual_seed(seed)
    model = Transformer(SEARCH_TINY.replace(**variant), vocab, vocab, PAD_ID, True).eval()
    with torch.no_grad():
        model.tgt_embed.tokens.weight.mul_(scale)  # sharper distributions
        if model.tgt_embed.learned is not None:
            model.tgt_embed.learned.weight.mul_(scale)  # positions that matter
    return model


def averaged_log_probs(models, src, tgt_in: list[int], columns: list[int] | None = None) -> torch.Tensor:
    """An ensemble's log-probabilities written out: the log of the mean of the models'
    probabilities, at each position of `tgt_in` (in float64, then float32); with a shortlist's
    `columns`, each model's softmax over those tokens alone, and every other token at -inf."""
    logits = [model(src, torch.tensor([tgt_in]))[0].double() for model in models]
    if columns is not None:
        outside = torch.ones(logits[0].size(-1), dtype=torch.bool)
        outside[columns] = False
        logits = [x.masked_fill(outside, -math.inf) for x in logits]
    return torch.stack([torch.softmax(x, -1) for x in logits]).mean(0).log().float()


def sources(rows, vocab):
    """Token rows as the search takes them: each ended by </s>, padded."""
    longest = max(len(r) for r in rows) + 1
    return torch.tensor([r + [EOS_ID] + [PAD_ID] * (longest - len(r) - 1) for r in rows])


def prefix_tensor(prefixes):
    """Forced prefixes as the search takes them: padded with -1."""
    longest = max(len(p) for p in prefixes)
    return torch.tensor([p + [-1] * (longest - len(p)) for p in prefixes])


def whole_shortlist(source_tokens, target_tokens):
    """A shortlist whose frequent tokens are the whole target vocabulary: it leaves every output as it is."""
    import numpy as np

    from nmt_cli.decode.shortlist import Shortlist, vocabulary_digest

    return Shortlist(np.full((len(source_tokens), 0), -1), np.arange(len(target_tokens)),
                     vocabulary_digest(source_tokens), vocabulary_digest(target_tokens), len(target_tokens))


# ---------------------------------------------------------------------------- training

TRAIN_TINY = PRESETS["small"].replace(encoder_layers=1, decoder_layers=1, d_model=32, d_ff=64, heads=2,
                                      max_positions=64)
LEARNER = TRAIN_TINY.replace(encoder_layers=2, decoder_layers=2, d_model=64, d_ff=128, heads=4, dropout=0.0)
LEARNER_RECIPE = {"lr_schedule": "inverse-sqrt", "lr": 3e-3, "warmup": 50, "max_tokens": 400}


def run_training(data, save_dir, model=TRAIN_TINY, init_from=None, **overrides):
    config = TrainConfig(**{"max_tokens": 200, "warmup": 20, "lr_scale": 2.0, "log_interval": 10, "device": "cpu",
                            "threads": 1, "save_interval_minutes": 1000.0, **overrides})
    return TrainingRun(data, save_dir, model, config, init_from=init_from, progress_bar=False)


# ---------------------------------------------------------------------------- translation

LINES = ["a b c d", "", "p o n m l k", "e", "   ", "f g h i j k l m n o p a b c", "c c c", "h a"]


def engine(path, warnings=None, **options):
    """An Engine of the checkpoint at `path` on the CPU (beam 3, short outputs unless `search`)."""
    search = options.pop("search", SearchConfig(beam=3, max_len_a=1, max_len_b=3))
    return Engine([load_bundle(path)], RunConfig(search=search, **options), torch.device("cpu"),
                      warn=(warnings.append if warnings is not None else None))


def run_translate(*args, **kwargs):
    """`nmt translate ARGS` in this process."""
    return CliRunner().invoke(main, ["translate", *map(str, args)], **kwargs)


# ---------------------------------------------------------------------------- search oracles

def seeded(seed):
    return torch.Generator().manual_seed(seed)


def greedy(model, src, limit):
    """Straightforward greedy decoding with the full (uncached) forward pass."""
    out = [BOS_ID]
    for _ in range(limit + 1):
        logits = model(src, torch.tensor([out]))[0, -1]
        logits[[PAD_ID, BOS_ID, UNK_ID]] = -math.inf
        if len(out) - 1 == limit:
            return out[1:]
        token = int(logits.argmax())
        if token == EOS_ID:
            return out[1:]
        out.append(token)
    return out[1:]


def sequence_log_prob(model, src, tokens):
    tgt_in = torch.tensor([[BOS_ID] + tokens])
    lprobs = torch.log_softmax(model(src, tgt_in)[0].float(), dim=-1)
    return sum(lprobs[t, y].item() for t, y in enumerate(tokens + [EOS_ID]))


def reference_beam_search(models, src, config, columns=None, max_positions=SEARCH_TINY.max_positions):
    """The search written out plainly for one sentence: full forward passes, one hypothesis at
    the start, every candidate scored; `models`: a model, or several whose probabilities are
    averaged (an ensemble); `columns`: the only tokens of a shortlist. Same finishing rules
    (search module docstring): with the heuristic stopping, the `beam` best finished are kept,
    and the sentence goes on while the best live hypothesis over the penalty of its present
    length beats the worst of them. With the onmt stopping, written as OpenNMT-py's beam search
    does it: a step's `beam` best candidates, those ending in EOS finished and the rest live, every
    finished one kept, done once the step's best candidate is EOS. At the length limit, EOS at
    its own log-probability, at none (`at_limit` "free"), or every top candidate finished as it is
    ("cut"). `models` are any callables of (source, target prefix) to logits: the exported graphs
    too (test_export_onnx.py)."""
    def penalty(length):
        return length_penalty(length + config.lenpen_start, config.lenpen, config.lenpen_form)

    members = models if isinstance(models, list) else [models]
    heuristic = config.stopping == "heuristic" and config.beam > 1
    onmt = config.stopping == "onmt"
    banned = [PAD_ID, BOS_ID] + ([] if config.allow_unk else [UNK_ID])
    limit = int(max_lengths((src != PAD_ID).sum(1) - 1, config, max_positions)[0])
    live, finished = [(0.0, [])], []
    for step in range(limit + 1):
        candidates = []
        for score, tokens in live:
            lprobs = averaged_log_probs(members, src, [BOS_ID] + tokens, columns)[-1]
            for t in set(tokens):  # --repetition-penalty
                lprobs[t] *= config.repetition_penalty
            eos = lprobs[EOS_ID].item()
            lprobs[banned] = -math.inf
            if step < config.min_len:
                lprobs[EOS_ID] = -math.inf
            n = config.no_repeat_ngram_size
            for start in range(len(tokens) - n + 1 if n else 0):  # every earlier n-gram's last token is banned
                if tokens[start:start + n - 1] == tokens[len(tokens) - n + 1:]:  # after the output's last n - 1
                    lprobs[tokens[start + n - 1]] = -math.inf
            if step == limit:  # </s> at the length limit, at its own log-probability or free
                lprobs[:] = -math.inf
                lprobs[EOS_ID] = 0.0 if config.at_limit == "free" else eos
            candidates += [(score + lp, tokens + [t]) for t, lp in enumerate(lprobs.tolist())]
        candidates = sorted(candidates, key=lambda c: -c[0])[: config.beam if onmt else 2 * config.beam]
        finished += [(lp / penalty(step + 1), lp, tokens[:-1])
                     for lp, tokens in candidates[: config.beam] if tokens[-1] == EOS_ID and lp > -math.inf]
        if config.at_limit == "cut" and step == limit - 1:
            finished += [(lp / penalty(step + 1), lp, tokens) for lp, tokens in candidates[: config.beam]
                         if tokens[-1] != EOS_ID and lp > -math.inf]
            break
        if onmt:
            live = [c for c in candidates if c[1][-1] != EOS_ID]
            if candidates[0][1][-1] == EOS_ID and len(finished) >= config.nbest:
                break
            continue
        if heuristic:
            finished = sorted(finished, key=lambda f: -f[0])[: config.beam]
        live = [c for c in candidates if c[1][-1] != EOS_ID][: config.beam]
        best = sorted(f[0] for f in finished)
        full = len(finished) >= config.beam and (not heuristic or live[0][0] / penalty(step + 1) <= best[0])
        if step >= limit or full or (
                len(finished) >= config.nbest and live[0][0] / penalty(limit + 1) <= best[-config.nbest]):
            break
    return sorted(finished, key=lambda f: -f[0])[: config.nbest]


# ---------------------------------------------------------------------------- ONNX


class OnnxGraphs:
    """Graphs of an `nmt export --format onnx` folder in onnxruntime on the CPU: `names` (by default
    those greedy search runs), `suffix` "_quantized" for the int8 copies, `threads` its threads (by
    default its own choice)."""

    GREEDY = ("encoder_model", "decoder_model", "decoder_with_past_model")

    def __init__(self, folder: Path, suffix: str = "", threads: int | None = None, names: tuple[str, ...] = GREEDY):
        import onnxruntime

        options = onnxruntime.SessionOptions()
        if threads is not None:
            options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        self.folder = folder
        self.sessions = {name: onnxruntime.InferenceSession(str(folder / "onnx" / f"{name}{suffix}.onnx"), options,
                                                            providers=["CPUExecutionProvider"]) for name in names}

    def run(self, name: str, **feeds: np.ndarray) -> dict[str, np.ndarray]:
        """Graph `name`'s outputs by name."""
        session = self.sessions[name]
        return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))

    def encode(self, src: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The encoder's output and the attention mask of padded sources (with </s> where the model's end with it)."""
        mask = (src != PAD_ID).astype(np.int64)
        return self.run("encoder_model", input_ids=src, attention_mask=mask)["last_hidden_state"], mask

    def greedy(self, src: np.ndarray, limits: list[int], banned: list[int]) -> list[list[int]]:
        """Each source's greedy output, </s> left out, at most its limit of tokens, never a `banned`
        one: the first step, then each from the last step's presents."""
        memory, mask = self.encode(src)
        tokens = np.full((src.shape[0], 1), BOS_ID, np.int64)
        out = self.run("decoder_model", input_ids=tokens, encoder_attention_mask=mask, encoder_hidden_states=memory)
        outputs, done, limit = [[] for _ in limits], np.zeros(len(limits), bool), np.array(limits)
        for step in range(max(limits)):
            logits = out["logits"][:, -1]
            logits[:, banned] = -np.inf
            tokens = logits.argmax(-1)[:, None]
            for k in np.flatnonzero(~done & (tokens[:, 0] != EOS_ID)):
                outputs[k].append(int(tokens[k, 0]))
            done |= (tokens[:, 0] == EOS_ID) | (step + 1 >= limit)
            if done.all():
                break
            past = {name.replace("present", "past_key_values"): value for name, value in out.items()
                    if name.startswith("present")}
            out = {**out, **self.run("decoder_with_past_model", input_ids=tokens, encoder_attention_mask=mask,
                                     **past)}
        return outputs
