"""`nmt train`: the training regime of §5, resumable, on one CPU or many GPUs (torchrun).

One update = `update_freq` micro-batches on each of `world` processes. The batches of an epoch
are a seeded permutation of length-grouped token batches (data.py); update u of an epoch takes
batches [u*W*K, (u+1)*W*K) and process r the K of them starting at u*W*K + r*K. The loss of an
update is the sum over its target tokens divided by their number, whatever W and K are, so
W processes with K micro-batches give the same update as one process with W*K.

Resume: a checkpoint stores the update count, the epoch and the updates done in it, the optimizer,
the scaler and every RNG state, so stop + resume gives the same parameters as one run.
"""

from __future__ import annotations

import contextlib
import datetime
import enum
import json
import math
import os
import random
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from nmt_cli import NmtError
from nmt_cli import checkpoint as ckpt
from nmt_cli.config import ModelConfig, TrainConfig
from nmt_cli.data import Batch, ParallelData, Prefetcher, shuffled, token_batches
from nmt_cli.device import select as select_device
from nmt_cli.files import DirectoryLock, reason, remove_stale_temporaries, write_text
from nmt_cli.kernels import SmoothedCrossEntropy
from nmt_cli.model import Transformer
from nmt_cli.preprocess import load_meta
from nmt_cli.text import TextConfig
from nmt_cli.vocab import PAD_ID, Vocabulary

DIST_TIMEOUT = datetime.timedelta(minutes=5)
MAX_NONFINITE_IN_A_ROW = 5


# ---------------------------------------------------------------------------- the paper's pieces

def learning_rate(step: int, d_model: int, config: TrainConfig) -> float:
    """Rate for update `step` (1-based).

    noam, eq. 3: lr_scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5).
    inverse-sqrt: lr * step / warmup during warmup, then lr * sqrt(warmup / step).
    """
    if config.lr_schedule == "noam":
        return config.lr_scale * d_model ** -0.5 * min(step ** -0.5, step * config.warmup ** -1.5)
    return config.lr * min(step / config.warmup, math.sqrt(config.warmup / step))


def label_smoothed_loss(logits: Tensor, target: Tensor, epsilon: float) -> tuple[Tensor, Tensor]:
    """Sums of the label-smoothed loss and of the true NLL over the targets (§5.4).

    `logits` (..., V) and `target` (...) hold real tokens only, or padding marked by PAD_ID.
    Smoothing follows Szegedy et al.: the target distribution is (1 - eps) on the reference
    plus eps / V on every class, so loss = (1 - eps) * NLL + eps * mean_v(-log p_v).
    """
    loss, nll = SmoothedCrossEntropy.apply(logits.flatten(0, -2), target.flatten(), epsilon)
    return loss.sum(), nll.sum()


# ---------------------------------------------------------------------------- set-up

class Stop(enum.Enum):
    """Why a training run stops."""

    MAX_UPDATES = enum.auto()
    MAX_EPOCHS = enum.auto()
    MAX_TIME = enum.auto()
    PATIENCE = enum.auto()
    INTERRUPTED = enum.auto()

    def describe(self, c: TrainConfig, signals: Sequence[int] = ()) -> str:
        if self is Stop.MAX_UPDATES:
            return f"reached --max-updates {c.max_updates}"
        if self is Stop.MAX_EPOCHS:
            return f"reached --max-epochs {c.max_epochs}"
        if self is Stop.MAX_TIME:
            return f"reached --max-time {c.max_time:g} minutes"
        if self is Stop.PATIENCE:
            return f"no better validation {c.best_checkpoint_metric} in {c.patience} validations (--patience)"
        return f"interrupted by signal {signals[0] if signals else ''}".strip()


@dataclass
class Progress:
    """Where training stands; saved in every checkpoint."""

    updates: int = 0
    epoch: int = 1
    epoch_updates: int = 0
    elapsed_s: float = 0.0
    best_valid_nll: float = math.inf
    best_valid_bleu: float = -1.0
    bad_validations: int = 0
    nonfinite_skips: int = 0
    oom_skips: int = 0


@dataclass
class Runtime:
    device: torch.device
    dtype: torch.dtype
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0


def set_up_runtime(config: TrainConfig) -> Runtime:
    """Device, precision and, under torchrun, the process group (NCCL on GPU, gloo on CPU)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    device, dtype = select_device(config.device, config.precision, config.threads, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=DIST_TIMEOUT)
    return Runtime(device, dtype, rank, world, local_rank)


def rng_state() -> dict[str, Any]:
    numpy_state = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "python": [list(x) if isinstance(x, tuple) else x for x in random.getstate()],
        "numpy": [numpy_state[0], torch.from_numpy(numpy_state[1].astype(np.int64)), *numpy_state[2:]],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))


# ---------------------------------------------------------------------------- the trainer

class Trainer:
    """Model, optimizer and one update: forward/backward over this process's micro-batches, then step."""

    def __init__(self, model: Transformer, config: TrainConfig, runtime: Runtime) -> None:
        self.model, self.config, self.runtime = model, config, runtime
        self.d_model = model.config.d_model
        self.net: torch.nn.Module = model
        if runtime.world > 1:
            ids = [runtime.local_rank] if runtime.device.type == "cuda" else None
            self.net = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)
        if config.compile:
            self.net = torch.compile(self.net)
        adam = torch.optim.AdamW if config.weight_decay else torch.optim.Adam
        options = {"lr": 0.0, "betas": (config.adam_beta1, config.adam_beta2), "eps": config.adam_eps,
                   **({"weight_decay": config.weight_decay} if config.weight_decay else {})}
        try:  # one fused kernel for all parameters (CUDA; CPU since torch 2.4): 4x less time in the step
            self.optimizer = adam(model.parameters(), fused=True, **options)
        except RuntimeError:
            self.optimizer = adam(model.parameters(), **options)
        self.scaler = torch.amp.GradScaler(runtime.device.type, enabled=runtime.dtype == torch.float16)
        self.epsilon = model.config.label_smoothing
        # On the CPU only the real target positions go through the vocabulary projection, the
        # largest matmul. On a GPU that selection (a boolean index, its size known only to the
        # device) would make the host wait for the device at every batch and split a compiled
        # graph, so every position is projected and the loss masks the padding.
        self.project_real_only = runtime.device.type == "cpu"

    def autocast(self) -> contextlib.AbstractContextManager:
        return torch.autocast(self.runtime.device.type, dtype=self.runtime.dtype,
                              enabled=self.runtime.dtype != torch.float32)

    def update(self, batches: list[Batch], update_tokens: int, step: int) -> dict[str, float] | None:
        """One optimizer step over `batches`; None when it was skipped (non-finite loss or OOM)."""
        self.net.train()
        # DDP averages gradients over processes; scaling by `world` makes them sums over all tokens.
        weight = self.runtime.world / update_tokens
        totals = torch.zeros(3, dtype=torch.float64, device=self.runtime.device)
        for i, batch in enumerate(batches):
            last = i == len(batches) - 1
            sync = contextlib.nullcontext() if last or self.runtime.world == 1 else self.net.no_sync()
            with sync:
                loss, nll, tokens = self.loss(self.net, batch)
                self.scaler.scale(loss * weight).backward()
            totals += torch.stack([loss.detach(), nll.detach(), tokens]).double()
        loss_sum, nll_sum, tokens = totals.tolist()  # one host-device sync per update
        if not math.isfinite(loss_sum):
            self.optimizer.zero_grad(set_to_none=True)
            return None
        lr = learning_rate(step, self.d_model, self.config)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        if self.config.clip_norm > 0:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.clip_norm)
        self.scaler.step(self.optimizer)
        loss_scale = self.scaler.get_scale() if self.scaler.is_enabled() else 1.0
        self.scaler.update()  # fp16: halves the scale (and skipped the step) on overflow, grows it when stable
        self.optimizer.zero_grad(set_to_none=True)
        stats = {"loss": loss_sum, "nll": nll_sum, "tokens": tokens, "lr": lr}
        if self.scaler.is_enabled() and self.scaler.get_scale() != loss_scale:
            stats["loss_scale"] = (loss_scale, self.scaler.get_scale())
        return stats

    def loss(self, net: torch.nn.Module, batch: Batch) -> tuple[Tensor, Tensor, Tensor]:
        """Label-smoothed loss and NLL sums and the token count of one batch (padding excluded)."""
        batch = batch.to(self.runtime.device)
        real = batch.tgt_out != PAD_ID
        keep = real if self.project_real_only else None
        with self.autocast():
            logits = net(batch.src, batch.tgt_in, keep)  # (real target tokens, vocab) or (batch, length, vocab)
        target = batch.tgt_out if keep is None else batch.tgt_out[keep]
        loss, nll = label_smoothed_loss(logits, target, self.epsilon)
        return loss, nll, real.sum().float()

    @torch.inference_mode()
    def validate(self, data: ParallelData, batches: list[np.ndarray], pad_multiple: int) -> dict[str, float]:
        """Label-smoothed loss, NLL and perplexity per target token over a whole split."""
        self.model.eval()
        totals = torch.zeros(3, dtype=torch.float64, device=self.runtime.device)
        for indices in batches:
            totals += torch.stack(self.loss(self.model, data.collate(indices, pad_multiple))).double()
        loss, nll, tokens = totals.tolist()
        return {"loss": loss / tokens, "nll": nll / tokens, "ppl": math.exp(nll / tokens)}

    def state(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "scaler": self.scaler.state_dict()}

    def load_state(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scaler.load_state_dict(state["scaler"])


# ---------------------------------------------------------------------------- the loop

class TrainingRun:
    """Data, model, trainer and save directory of one `nmt train` invocation."""

    def __init__(self, data_dir: Path, save_dir: Path, model_config: ModelConfig, config: TrainConfig,
                 reset: bool = False, init_from: Path | None = None, progress_bar: bool = True) -> None:
        self.config, self.save_dir, self.progress_bar = config, Path(save_dir), progress_bar
        self.runtime = set_up_runtime(config)
        meta = load_meta(data_dir, verify=True)
        self.text = TextConfig.from_dict(meta["text"])
        src, tgt = self.text.source_lang, self.text.target_lang
        self.src_vocab = Vocabulary.load(Path(data_dir) / meta["dictionaries"][src])
        self.tgt_vocab = Vocabulary.load(Path(data_dir) / meta["dictionaries"][tgt])
        self.bpe_codes = (Path(data_dir) / meta["bpe_codes"]).read_text(encoding="utf-8") if meta["bpe_codes"] else None
        dtype = np.dtype(meta["dtype"])
        self.train = ParallelData.load(Path(data_dir), "train", src, tgt, dtype)
        self.valid = ParallelData.load(Path(data_dir), "valid", src, tgt, dtype) if "valid" in meta["splits"] else None
        if self.valid is not None:  # validation never drops a pair: a batch holds at least the longest one
            longest_valid = int(max(self.valid.src_lengths.max(initial=1), self.valid.tgt_lengths.max(initial=1)))
            self.valid_batches = token_batches(self.valid.src_lengths, self.valid.tgt_lengths,
                                               max(config.max_tokens, longest_valid))
        longest = int(max(self.train.src_lengths.max(), self.train.tgt_lengths.max()))
        if longest > model_config.max_positions:
            raise NmtError(f"{data_dir}: training has a sequence of {longest} tokens (EOS included), more than "
                           f"--max-positions {model_config.max_positions}; raise it or preprocess with a "
                           "smaller --max-len")
        if self.valid is not None and longest_valid > model_config.max_positions:
            pair = int(np.maximum(self.valid.src_lengths, self.valid.tgt_lengths).argmax()) + 1
            raise NmtError(f"{data_dir}: valid pair {pair} has {longest_valid} tokens (EOS included), more than "
                           f"--max-positions {model_config.max_positions}; shorten or remove that line of the "
                           "valid split, or raise --max-positions")
        cuda = self.runtime.device.type == "cuda"
        self.pad_multiple = 8 if cuda else 1
        self.prefetcher = Prefetcher(self.train, self.pad_multiple, background=cuda)
        try:
            self.batches = token_batches(self.train.src_lengths, self.train.tgt_lengths, config.max_tokens,
                                         config.max_sentences, self.pad_multiple)
        except ValueError as e:
            raise NmtError(f"{data_dir}: {e}; raise --max-tokens") from None

        torch.manual_seed(config.seed)
        shared = meta["joined_dictionary"]
        model = Transformer(model_config, len(self.src_vocab), len(self.tgt_vocab), PAD_ID, shared)
        self.model = model.to(self.runtime.device)
        self.progress = Progress()
        resume = self.save_dir / "checkpoint_last.pt"
        if reset or not resume.exists():
            if init_from is not None:
                self._load_weights(init_from)
            state = None
        else:
            state = ckpt.load(resume)
            self._check_compatible(state, resume)
            self.model.load_state_dict(state["model"])
        self.trainer = Trainer(self.model, config, self.runtime)
        if state is not None:
            self.trainer.load_state(state)
            self.progress = Progress(**state["progress"])
            if state["batching"] != self.batching():
                self.log(f"batching changed since {resume} ({state['batching']} -> {self.batching()}): "
                         f"continuing with epoch {self.progress.epoch + 1}")
                self.progress.epoch, self.progress.epoch_updates = self.progress.epoch + 1, 0
            set_rng_state(state["rng"][min(self.runtime.rank, len(state["rng"]) - 1)])
        else:
            torch.manual_seed(config.seed + self.runtime.rank)  # dropout differs per process
        self.resumed = state is not None
        self._nonfinite_in_a_row = 0
        self.tensorboard = None
        if config.tensorboard and self.runtime.main:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise NmtError("--tensorboard needs the tensorboard package: pip install tensorboard") from None
            self.tensorboard = SummaryWriter(str(self.save_dir / "tensorboard"))

    # -- checks and bookkeeping

    def batching(self) -> dict[str, Any]:
        c = self.config
        return {"max_tokens": c.max_tokens, "max_sentences": c.max_sentences, "update_freq": c.update_freq,
                "seed": c.seed, "world": self.runtime.world, "pad_multiple": self.pad_multiple}

    def _check_compatible(self, state: dict[str, Any], path: Path) -> None:
        """Refuse a checkpoint of another model or vocabulary, naming the first difference."""
        ours = self.model.config.to_dict()
        for key, value in state["model_config"].items():
            if ours.get(key) != value:
                raise NmtError(f"{path}: model config differs ({key}: {value} in the checkpoint, {ours.get(key)} now); "
                               "use the same options, --reset to start over, or --init-from to fine-tune")
        self._check_vocabularies(state, path, "use the data the checkpoint was trained on, or --reset")

    def _check_vocabularies(self, state: dict[str, Any], path: Path, advice: str) -> None:
        for side, key, vocab in (("source", "src_vocab", self.src_vocab), ("target", "tgt_vocab", self.tgt_vocab)):
            if state[key] != vocab.tokens:
                raise NmtError(f"{path}: the {side} vocabulary differs from the data directory's; {advice}")

    def _load_weights(self, path: Path) -> None:
        state = ckpt.load(path)
        self._check_vocabularies(state, path, "--init-from needs the same vocabulary")
        try:
            self.model.load_state_dict(state["model"])
        except RuntimeError as e:
            detail = str(e).splitlines()[1].strip() if "\n" in str(e) else str(e)
            raise NmtError(f"{path}: --init-from weights do not fit this architecture ({detail})") from None

    def log(self, message: str) -> None:
        if self.runtime.main:
            print(f"nmt train: {message}", file=sys.stderr, flush=True)

    def record(self, entry: dict[str, Any]) -> None:
        """One line of train_log.jsonl (and TensorBoard scalars with --tensorboard)."""
        if not self.runtime.main:
            return
        path = self.save_dir / "train_log.jsonl"
        try:
            with open(path, "a", encoding="utf-8") as f:
                f.write(json.dumps(entry) + "\n")
        except OSError as e:
            raise NmtError(f"{path}: cannot write the training log ({reason(e)}); the checkpoints written so far "
                           "are intact: make room and run the same command to resume") from None
        if self.tensorboard is not None:
            for key, value in entry.items():
                if key not in ("kind", "update", "epoch"):
                    self.tensorboard.add_scalar(f"{entry['kind']}/{key}", value, entry["update"])

    def _truncate_log(self) -> None:
        """Drop log records newer than the checkpoint we resume from (they will be redone)."""
        path = self.save_dir / "train_log.jsonl"
        if not path.exists():
            return
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
        kept = [line for line in lines if _update_of(line) <= self.progress.updates]
        if len(kept) != len(lines):
            write_text(path, "".join(kept))

    def save(self, best: bool = False) -> None:
        """`checkpoint_N.pt`, then checkpoint_last.pt (and checkpoint_best.pt) as links to it."""
        states = [rng_state()]
        if self.runtime.world > 1:
            states = [None] * self.runtime.world
            dist.all_gather_object(states, rng_state())
        self.last_save = time.monotonic()
        if not self.runtime.main:
            return
        checkpoint = ckpt.describe(self.model, self.text, self.bpe_codes, self.src_vocab, self.tgt_vocab)
        progress = {**asdict(self.progress), "elapsed_s": self.elapsed()}
        checkpoint.update(self.trainer.state(), train_config=self.config.to_dict(), progress=progress,
                          rng=states, batching=self.batching())
        path = self.save_dir / f"checkpoint_{self.progress.updates}.pt"
        ckpt.save(checkpoint, path)
        ckpt.link(path, self.save_dir / "checkpoint_last.pt")
        if best:
            ckpt.link(path, self.save_dir / "checkpoint_best.pt")
        ckpt.prune(self.save_dir, self.config.keep_last)

    def agree(self, *flags: bool) -> list[bool]:
        """Each flag True on every process when it is True on any (time- and signal-based
        decisions), in one all-reduce."""
        if self.runtime.world == 1:
            return list(flags)
        value = torch.tensor([float(flag) for flag in flags], device=self.runtime.device)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return [bool(v) for v in value.tolist()]

    def validate(self) -> bool:
        """Validate, log, and return whether this is the best result so far (by the chosen metric)."""
        if self.valid is None:
            return False
        result = self.trainer.validate(self.valid, self.valid_batches, self.pad_multiple)
        if self.config.eval_bleu:
            result["bleu"] = self.valid_bleu()
        p = self.progress
        if self.config.best_checkpoint_metric == "bleu":
            best = result["bleu"] > p.best_valid_bleu
        else:
            best = result["nll"] < p.best_valid_nll
        p.best_valid_nll = min(p.best_valid_nll, result["nll"])
        p.best_valid_bleu = max(p.best_valid_bleu, result.get("bleu", -1.0))
        p.bad_validations = 0 if best else p.bad_validations + 1
        self.record({"kind": "valid", "update": p.updates, "epoch": p.epoch, "elapsed_s": round(self.elapsed(), 1),
                     **result})
        bleu = f", BLEU {result['bleu']:.2f}" if "bleu" in result else ""
        self.log(f"validation at update {p.updates}: loss {result['loss']:.3f}, nll {result['nll']:.3f}, "
                 f"ppl {result['ppl']:.2f}{bleu}" + (" (best)" if best else ""))
        return best

    def valid_bleu(self) -> float:
        """sacreBLEU of the valid split translated with beam search; references are the detokenized
        binarized targets (so an <unk> in a reference counts as a word)."""
        import sacrebleu

        from nmt_cli.search import SearchConfig
        from nmt_cli.translate import TranslateOptions, Translator

        self.model.eval()
        search = SearchConfig(beam=self.config.eval_bleu_beam, lenpen=self.config.eval_bleu_lenpen)
        bundle = ckpt.ModelBundle(self.model, self.text, self.bpe_codes, self.src_vocab, self.tgt_vocab)
        translator = Translator([bundle], TranslateOptions(search, max_tokens=self.config.max_tokens),
                                self.runtime.device)
        sources = [self.valid.source[i].tolist() for i in range(len(self.valid))]
        hypotheses = [translator.detokenize(h[0].tokens) if h else "" for h in translator.translate_ids(sources)]
        references = [translator.detokenize(self.valid.target[i].tolist()) for i in range(len(self.valid))]
        return sacrebleu.corpus_bleu(hypotheses, [references]).score

    def elapsed(self) -> float:
        return self.progress.elapsed_s + time.monotonic() - self.started

    # -- the loop

    def done(self) -> Stop | None:
        """Why training should stop now, if it should (the criteria that need no clock or signal)."""
        c, p = self.config, self.progress
        if c.max_updates is not None and p.updates >= c.max_updates:
            return Stop.MAX_UPDATES
        if c.max_epochs is not None and p.epoch > c.max_epochs:
            return Stop.MAX_EPOCHS
        if c.patience is not None and p.bad_validations >= c.patience:
            return Stop.PATIENCE
        return None

    def run(self) -> Progress:
        """Train until a stop criterion, holding the save directory's lock (main process)."""
        try:
            self.save_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise NmtError(f"{self.save_dir}: cannot create the save directory ({reason(e)})") from None
        lock = DirectoryLock(self.save_dir / ".nmt-train.lock", f"save directory {self.save_dir}")
        with lock if self.runtime.main else contextlib.nullcontext():
            return self._run()

    def _run(self) -> Progress:
        c, p, rt = self.config, self.progress, self.runtime
        if rt.main:
            remove_stale_temporaries(self.save_dir)
            self._truncate_log()
        self.started = self.last_save = time.monotonic()
        per_update = rt.world * c.update_freq
        params = sum(t.numel() for t in self.model.parameters())
        self.log(f"{'resuming at update ' + str(p.updates) if self.resumed else 'starting'}: {params:,} parameters, "
                 f"{rt.device} {str(rt.dtype).removeprefix('torch.')}, {rt.world} process(es), "
                 f"{len(self.train):,} training pairs in {len(self.batches):,} batches; up to "
                 f"{c.max_tokens * per_update:,} tokens per update (max-tokens {c.max_tokens} x {rt.world} "
                 f"x update-freq {c.update_freq})")
        if c.max_time is not None and p.elapsed_s >= c.max_time * 60:  # the same on every process
            self.log(f"nothing to do: {p.elapsed_s / 60:.1f} minutes trained already (--max-time {c.max_time:g})")
            return p
        if (stop := self.done()) is not None:
            self.log(f"nothing to do: {stop.describe(c)}")
            return p
        interrupted: list[int] = []  # Ctrl-C or SIGTERM: save at the current update, then stop
        handlers = {sig: signal.signal(sig, lambda n, _f: interrupted.append(n))
                    for sig in (signal.SIGINT, signal.SIGTERM)}
        bar = self._progress_bar()
        window = {"loss": 0.0, "nll": 0.0, "tokens": 0.0, "start": time.monotonic()}
        stop: Stop | None = None
        try:
            while stop is None:
                order = shuffled(self.batches, c.seed, p.epoch)
                full, rest = divmod(len(order), per_update)
                updates_in_epoch = full + (1 if rest and rt.world == 1 else 0)
                while p.epoch_updates < updates_in_epoch and stop is None:
                    group, mine = self._share(order, p.epoch_updates)
                    if p.epoch_updates + 1 < updates_in_epoch:
                        self.prefetcher.prefetch(self._share(order, p.epoch_updates + 1)[1])
                    update_tokens = int(sum(self.train.tgt_lengths[b].sum() for b in group))
                    stats = self._update(self.prefetcher.get(mine), update_tokens, p.updates + 1)
                    p.epoch_updates += 1
                    if stats is not None:
                        p.updates += 1
                        for key in ("loss", "nll", "tokens"):
                            window[key] += stats[key]
                        bar.update(1)
                        if p.updates % c.log_interval == 0:
                            self._log_window(window, stats["lr"], bar)
                    stop = self._after_update(interrupted, advanced=stats is not None)
                if stop is None:  # end of epoch
                    best = self.validate()
                    p.epoch, p.epoch_updates = p.epoch + 1, 0
                    self.save(best)
                    stop = self.done()
            if stop is Stop.INTERRUPTED:
                raise NmtError(f"{stop.describe(c, interrupted)}; checkpoint saved at update {p.updates} in "
                               f"{self.save_dir}. "
                               "Run the same command again to resume.")
            self.log(f"done: {stop.describe(c)}; {p.updates} updates, {self.elapsed() / 60:.1f} minutes")
        finally:
            bar.close()
            self.prefetcher.close()
            if self.tensorboard is not None:
                self.tensorboard.close()
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
        return p

    def _share(self, order: list[np.ndarray], update: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """The batches of update `update` of the epoch on all processes, and this process's share."""
        per_update, k = self.runtime.world * self.config.update_freq, self.config.update_freq
        group = order[update * per_update:(update + 1) * per_update]
        return group, group[self.runtime.rank * k:(self.runtime.rank + 1) * k]

    def _update(self, batches: list[Batch], update_tokens: int, step: int) -> dict[str, float] | None:
        p = self.progress
        try:
            stats = self.trainer.update(batches, update_tokens, step)
        except torch.cuda.OutOfMemoryError:
            if self.runtime.world > 1:
                raise NmtError(f"CUDA out of memory at update {step} on process {self.runtime.rank}; "
                               "lower --max-tokens (and raise --update-freq)") from None
            self.trainer.optimizer.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
            p.oom_skips += 1
            self.log(f"CUDA out of memory at update {step}: batch skipped ({p.oom_skips} so far)")
            return None
        if stats is None:
            p.nonfinite_skips += 1
            self._nonfinite_in_a_row += 1
            self.log(f"non-finite loss at update {step}: update skipped ({p.nonfinite_skips} so far)")
            if self._nonfinite_in_a_row >= MAX_NONFINITE_IN_A_ROW:
                raise NmtError(f"{MAX_NONFINITE_IN_A_ROW} non-finite losses in a row at update {step}: training "
                               "diverged; lower the learning rate (--lr-scale/--lr), or use --precision bf16/fp32")
            return None
        self._nonfinite_in_a_row = 0
        if "loss_scale" in stats:
            before, after = stats.pop("loss_scale")
            change = "overflow, step skipped" if after < before else "stable, grown"
            self.log(f"fp16 loss scale {before:g} -> {after:g} at update {step} ({change})")
            self.record({"kind": "loss_scale", "update": step, "before": before, "after": after})
        return stats

    def _after_update(self, interrupted: list[int], advanced: bool) -> Stop | None:
        """Validate and save when due; returns why to stop, if training should. After a skipped
        update (`advanced` False) the update-count intervals are not due again."""
        c, p = self.config, self.progress
        out_of_time = c.max_time is not None and self.elapsed() >= c.max_time * 60
        save_due = time.monotonic() - self.last_save >= c.save_interval_minutes * 60
        out_of_time, save_due, signalled = self.agree(out_of_time, save_due, bool(interrupted))
        stop = Stop.INTERRUPTED if signalled else Stop.MAX_TIME if out_of_time else self.done()
        best = False
        interval_due = advanced and c.validate_interval_updates and p.updates % c.validate_interval_updates == 0
        if interval_due or (stop is not None and stop is not Stop.INTERRUPTED):
            best = self.validate()
            stop = stop or self.done()
        save_interval_due = advanced and c.save_interval_updates and p.updates % c.save_interval_updates == 0
        if stop or best or save_due or save_interval_due:
            self.save(best)
        return stop

    def _progress_bar(self) -> Any:
        from tqdm import tqdm

        total = self.config.max_updates
        return tqdm(total=total, initial=self.progress.updates, unit="upd", dynamic_ncols=True,
                    disable=not (self.runtime.main and self.progress_bar and sys.stderr.isatty()), file=sys.stderr)

    def _log_window(self, window: dict[str, float], lr: float, bar: Any) -> None:
        now = time.monotonic()
        tokens = max(window["tokens"], 1.0)
        entry = {"kind": "train", "update": self.progress.updates, "epoch": self.progress.epoch,
                 "loss": window["loss"] / tokens, "nll": window["nll"] / tokens,
                 "ppl": math.exp(min(window["nll"] / tokens, 50)), "lr": lr,
                 "tokens_per_s": window["tokens"] * self.runtime.world / (now - window["start"]),
                 "elapsed_s": round(self.elapsed(), 1)}
        self.record(entry)
        summary = (f"loss {entry['loss']:.3f} ppl {entry['ppl']:.2f} lr {lr:.2e} "
                   f"{entry['tokens_per_s']:,.0f} tok/s")
        if bar.disable:
            self.log(f"update {self.progress.updates} epoch {self.progress.epoch}: {summary}")
        else:
            bar.set_postfix_str(summary)
        window.update(loss=0.0, nll=0.0, tokens=0.0, start=now)


def _update_of(log_line: str) -> float:
    """The update number of a train_log.jsonl line; a torn line (killed mid-write) counts as newest."""
    try:
        return json.loads(log_line)["update"]
    except (ValueError, KeyError, TypeError):
        return math.inf
