"""`nmt train`: the training regime of §5, resumable, on one CPU or many GPUs (torchrun).

A run reads a data directory (datadir.py), builds the model, resumes from its save directory's
last checkpoint (savedir.py) and repeats updates (trainer.py) until a stop criterion,
validating and saving on the way; it reports through runlog.py.

Which batches each update and process take: epochs.py. A checkpoint stores the update count, the
epoch and the updates done in it, so stop + resume gives the same parameters as one run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from nmt_cli.config import SearchConfig, TrainConfig
from nmt_cli.corpus.data import ParallelData, Prefetcher, shapes_and_padding
from nmt_cli.corpus.datadir import DataDir
from nmt_cli.decode.generator import Generator
from nmt_cli.decode.pipeline import TextPipeline
from nmt_cli.device import native_bf16, out_of_memory, steps_between_reads
from nmt_cli.errors import NmtError
from nmt_cli.files import DirectoryLock, reason, remove_stale_temporaries
from nmt_cli.model import checkpoint as ckpt
from nmt_cli.model.architecture import ModelConfig
from nmt_cli.model.released import Released
from nmt_cli.model.transformer import Transformer
from nmt_cli.text.vocab import PAD_ID, model_ids
from nmt_cli.train.agreement import agree, data_facts, option_facts, start_facts
from nmt_cli.train.epochs import EpochPlan, load_splits, same_updates
from nmt_cli.train.peers import rank_map
from nmt_cli.train.progress import Progress, Stop
from nmt_cli.train.runlog import RunLog
from nmt_cli.train.runtime import set_up_runtime
from nmt_cli.train.savedir import SaveDir, set_rng_state
from nmt_cli.train.trainer import SkipGuard, Trainer

if TYPE_CHECKING:
    from nmt_cli.score import Score


def valid_scores(model: Transformer, pipeline: TextPipeline, valid: ParallelData, config: TrainConfig,
                 device: torch.device) -> list[Score]:
    """sacreBLEU, chrF and TER of the valid split translated with beam search (--eval-bleu);
    references are the detokenized binarized targets (so an <unk> in a reference counts as a word)."""
    from nmt_cli.score import METRICS, corpus_scores  # sacreBLEU: only when asked

    model.eval()
    generator = Generator([model], device, max_tokens=config.max_tokens, never=pipeline.tgt_vocab.fillers)
    search = SearchConfig(beam=config.eval_bleu_beam, lenpen=config.eval_bleu_lenpen)
    sources = [valid.source[i].tolist() for i in range(len(valid))]
    hypotheses = [pipeline.text(h[0].tokens) if h else "" for h in generator.search(sources, search)]
    references = [[pipeline.text(valid.target[i].tolist()) for i in range(len(valid))]]
    return corpus_scores(hypotheses, references, METRICS)


def averaged_checkpoint(bundle: ckpt.ModelBundle, trainer: Trainer, updates: int,
                        data: dict[str, Any]) -> dict[str, Any]:
    """An inference checkpoint of the averaged weights (--ema-decay) at update `updates`."""
    with trainer.averaged():
        checkpoint = bundle.describe()
        weights = {name: tensor.clone() for name, tensor in checkpoint["model"].items()}  # not views of the model
    return {**checkpoint, "model": weights, "progress": {"updates": updates}, "ema_decay": trainer.config.ema_decay,
            "data": data}


def starting_line(run: TrainingRun) -> str:
    """What a run says when it starts: model size, hardware, data and the tokens of an update."""
    c, p, rt = run.config, run.progress, run.runtime
    params = sum(t.numel() for t in run.model.parameters())
    trained = sum(t.numel() for t in run.model.parameters() if t.requires_grad)
    frozen = f" ({params - trained:,} frozen: {', '.join(c.freeze)})" if c.freeze else ""
    processes = f"{rt.world} processes ({rank_map(rt.peers.places)})" if rt.peers else f"{rt.world} process(es)"
    return (f"{'resuming at update ' + str(p.updates) if run.resumed else 'starting'}: {params:,} parameters{frozen}, "
            f"{rt.device} {str(rt.dtype).removeprefix('torch.')}, {processes}, "
            f"{len(run.train):,} training pairs in {len(run.batches):,} batches; up to "
            f"{c.max_tokens * rt.world * c.update_freq:,} tokens per update (max-tokens {c.max_tokens} x "
            f"{rt.world} x update-freq {c.update_freq}){bucketing(run)}")


def bucketing(run: TrainingRun) -> str:
    """With --length-buckets: the lengths, and the shapes and padding of the batches."""
    if run.buckets is None:
        return ""
    shapes, padding = shapes_and_padding(run.train, run.batches, run.pad_multiple, run.buckets)
    return (f"; {len(run.buckets)} length buckets ({', '.join(map(str, run.buckets))}): {shapes} batch shapes, "
            f"{padding:.1%} padding")


def built(config: ModelConfig, src_vocab: int, tgt_vocab: int, shared: bool) -> Transformer:
    """The model to train, or a one-line error with the memory it needs where it cannot be made."""
    try:
        return Transformer(config, src_vocab, tgt_vocab, PAD_ID, shared,
                           **model_ids(config.decoder_start, config.source_eos))
    except RuntimeError as e:
        if not out_of_memory(e):
            raise
        params = config.num_parameters(src_vocab, tgt_vocab, shared)
        raise NmtError(f"the model cannot be made: {params:,} parameters need {params * 4 / 2**30:,.1f} GiB in "
                       f"float32 (and training about 4 times that, with Adam's moments and the gradients); a "
                       f"smaller --d-model, --d-ff or vocabulary") from None


# What fine-tuning (--init-from) may set anew: regularization, nothing that shapes the weights or
# what they compute.
FINE_TUNING_FIELDS = ("dropout", "attention_dropout", "relu_dropout", "label_smoothing")


def fine_tuning_config(path: Path, given: dict[str, Any]) -> ModelConfig:
    """--init-from: the checkpoint's architecture with the `given` model flags, which may only be
    FINE_TUNING_FIELDS; another (or --arch) is refused, naming it."""
    for name in given:
        if name not in FINE_TUNING_FIELDS:
            flags = ", ".join("--" + f.replace("_", "-") for f in FINE_TUNING_FIELDS)
            raise NmtError(f"--{name.replace('_', '-')}: --init-from takes the model's architecture from {path}; "
                           f"only {flags} may be set anew")
    config = ModelConfig.from_dict(ckpt.load(path)["model_config"])
    return config.replace(**given)


PROBE_UPDATES = 10  # --precision fastest: updates timed in each precision, after as many untimed


def fastest_precision(data_dir: Path, model_config: ModelConfig, config: TrainConfig) -> str:
    """--precision fastest: bf16 where the hardware multiplies it (device.native_bf16) and this
    model trained more target tokens per second on this data in it than in fp32, else fp32. Which
    is faster depends on the machine (bf16 can be either on CPUs with AVX512-BF16), so it is
    measured: 2 x PROBE_UPDATES updates in each, from scratch in a scratch directory, the second
    half timed (train_log.jsonl's tokens_per_s)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise NmtError("--precision fastest measures in one process; under torchrun give --precision fp32 or bf16")
    if not native_bf16(config.device):
        return "fp32"
    speed = {}
    for precision in ("fp32", "bf16"):
        probe = dataclasses.replace(config, precision=precision, max_updates=2 * PROBE_UPDATES, max_time=None,
                                    max_epochs=None, log_interval=PROBE_UPDATES, tensorboard=False,
                                    eval_bleu=False, best_checkpoint_metric="ppl")  # no translating to time
        with tempfile.TemporaryDirectory() as scratch, contextlib.redirect_stderr(io.StringIO()):
            TrainingRun(data_dir, Path(scratch), model_config, probe, progress_bar=False).run()
            log = [json.loads(line) for line in (Path(scratch) / "train_log.jsonl").read_text().splitlines()]
        speed[precision] = [e["tokens_per_s"] for e in log if e["kind"] == "train"][-1]
    chosen = max(speed, key=speed.__getitem__)
    print(f"nmt train: --precision fastest: fp32 {speed['fp32']:,.0f} target tokens/s, bf16 {speed['bf16']:,.0f}: "
          f"training in {chosen}", file=sys.stderr, flush=True)
    return chosen


def resumed_progress(state: dict[str, Any], path: Path, config: TrainConfig, batching: dict[str, Any],
                     log: Callable[[str], None], rank: int) -> Progress:
    """Where the run of the checkpoint at `path` (`state`) stands, taken up by process `rank` with
    its RNG state; a new epoch where the batching changed, and a warning where the checkpoint keeps
    a weight average that this run does not continue."""
    progress = Progress(**state["progress"])
    decay = state.get("train_config", {}).get("ema_decay")
    if "ema" in state and not config.ema_decay:
        log(f"warning: {path} keeps a weight average (--ema-decay {decay:g}); this run, without --ema-decay, "
            f"stops averaging and checkpoint_ema.pt stays at update {progress.updates}: add --ema-decay {decay:g} "
            "to continue the average")
    if not same_updates(state["batching"], batching):
        log(f"batching changed since {path} ({state['batching']} -> {batching}): continuing with epoch "
            f"{progress.epoch + 1}")
        progress.epoch, progress.epoch_updates = progress.epoch + 1, 0
    states = state["rng"]
    set_rng_state(states[min(rank, len(states) - 1)])
    if rank >= len(states):  # more processes than the checkpoint's: dropout differs per process
        torch.manual_seed(config.seed + rank + progress.updates)
    return progress


def intervals_due(config: TrainConfig, updates: int, advanced: bool = True) -> tuple[bool, bool]:
    """Whether --validate-interval-updates and --save-interval-updates are due at this update
    (never again after a skipped one)."""
    return (advanced and bool(config.validate_interval_updates) and updates % config.validate_interval_updates == 0,
            advanced and bool(config.save_interval_updates) and updates % config.save_interval_updates == 0)


class TrainingRun:
    """Data, model, trainer and save directory of one `nmt train` invocation."""

    def __init__(self, data_dir: Path, save_dir: Path, model_config: ModelConfig, config: TrainConfig,
                 reset: bool = False, init_from: Path | None = None, progress_bar: bool = True) -> None:
        if config.precision == "fastest":
            config = dataclasses.replace(config, precision=fastest_precision(data_dir, model_config, config))
        self.config, self.save_dir = config, Path(save_dir)
        self.runtime = set_up_runtime(config)
        with self.runtime.closed_on_failure(), self.ending_on_loss():
            self._build(data_dir, model_config, reset, init_from, progress_bar)

    def _build(self, data_dir: Path, model_config: ModelConfig, reset: bool, init_from: Path | None,
               progress_bar: bool) -> None:
        """Data, model, trainer and the state resumed from (or started from)."""
        config = self.config
        data = DataDir.open(data_dir, verify=True)
        self.data = {"directory": str(data.path.resolve()), "inputs": data.meta.get("inputs"),
                     "pairs": {name: split["pairs_out"] for name, split in data.meta["splits"].items()}}
        src_vocab, tgt_vocab = data.vocabularies()
        agree({**option_facts(model_config, config, reset, init_from), **data_facts(data)}, self.runtime.world)
        self.pad_multiple = 8 if self.runtime.device.type == "cuda" else 1
        self.train, self.valid, self.batches, self.valid_batches, samples, self.buckets = load_splits(
            data, config, self.pad_multiple, model_config.max_positions)
        self.plan = EpochPlan(self.train, self.batches, samples, config.seed, self.runtime, config.update_freq)
        self.prefetcher = Prefetcher(self.train, self.pad_multiple, background=self.runtime.device.type == "cuda",
                                     buckets=self.buckets)
        self.log = RunLog(self.save_dir, self.runtime.main, config.tensorboard, progress_bar)

        torch.manual_seed(config.seed)
        model = built(model_config, len(src_vocab), len(tgt_vocab), data.joined_dictionary)
        self.model = model.to(self.runtime.device)
        self.bundle = ckpt.ModelBundle(self.model, data.text, data.bpe_codes(), src_vocab, tgt_vocab,
                                       data.sentencepiece(), data.target_sentencepiece())
        self.checkpoints = SaveDir(self.save_dir, self.runtime, config, (src_vocab, tgt_vocab))
        state = None if reset else self.checkpoints.resume(self.model)
        if state is None and init_from is not None:
            self.bundle.released = self.checkpoints.initialize(self.model, init_from, data.text, self.log.log)
        elif state is not None:
            self.bundle.released = Released.from_dict(state.get("released"))  # a fine-tuned model's release
        self.trainer = Trainer(self.model, config, self.runtime)
        self.progress = Progress()
        if state is not None:
            self.trainer.load_state(state)
            self.progress = resumed_progress(state, self.checkpoints.last, config, self.batching(), self.log.log,
                                             self.runtime.rank)
        else:
            torch.manual_seed(config.seed + self.runtime.rank)  # dropout differs per process
        agree(start_facts(self.model, self.progress.updates), self.runtime.world)
        self.resumed = state is not None
        self.guard, self.read_every = SkipGuard(self.trainer, self.progress, self.log), steps_between_reads(
            self.runtime.device)
        self.started = self.last_save = time.monotonic()  # again when the run starts

    def ending_on_loss(self) -> contextlib.AbstractContextManager:
        """With several processes: a lost one ends this one with a line (peers.Heartbeat)."""
        return self.runtime.peers.ending_on_loss() if self.runtime.peers else contextlib.nullcontext()

    @functools.cached_property
    def pipeline(self) -> TextPipeline:
        """The text of the valid split's translations and references (--eval-bleu)."""
        return TextPipeline(self.bundle, self.model.config.max_positions)

    def batching(self) -> dict[str, Any]:
        c = self.config
        return {"max_tokens": c.max_tokens, "max_sentences": c.max_sentences, "update_freq": c.update_freq,
                "seed": c.seed, "world": self.runtime.world, "pad_multiple": self.pad_multiple,
                "length_buckets": c.length_buckets}

    def elapsed(self) -> float:
        return self.progress.elapsed_s + time.monotonic() - self.started

    def save(self, best: bool = False) -> None:
        self.last_save, b, p = time.monotonic(), self.bundle, self.progress
        averaged = (lambda: averaged_checkpoint(b, self.trainer, p.updates, self.data)) if self.config.ema_decay \
            else None
        self.checkpoints.save(p.updates, best, lambda: {
            **b.describe(),
            **self.trainer.state(), "train_config": self.config.to_dict(),
            "progress": {**asdict(p), "elapsed_s": self.elapsed()}, "batching": self.batching(), "data": self.data},
            averaged)

    def validate(self) -> bool:
        """Validate, log, and return whether this is the best result so far (by the chosen metric)."""
        if self.valid is None:
            return False
        with self.trainer.averaged():
            result = self.trainer.validate(self.valid, self.valid_batches, self.pad_multiple)
            if self.config.eval_bleu:
                scores = {s.metric: s for s in valid_scores(self.model, self.pipeline, self.valid, self.config,
                                                            self.runtime.device)}
                result.update({metric: score.score for metric, score in scores.items()})
                self.progress.bleu_signature = scores["bleu"].signature
        p = self.progress
        best = p.validated(result, self.config.best_checkpoint_metric)
        self.log.validation(p.updates, p.epoch, self.elapsed(), result, best)
        return best

    def run(self) -> Progress:
        """Train until a stop criterion, holding the save directory's lock (main process)."""
        try:
            self.save_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise NmtError(f"{self.save_dir}: cannot create the save directory ({reason(e)})") from None
        lock = DirectoryLock(self.save_dir / ".nmt-train.lock", f"save directory {self.save_dir}")
        with lock if self.runtime.main else contextlib.nullcontext():
            try:
                if self.runtime.main:
                    remove_stale_temporaries(self.save_dir)
                self.log.truncate(self.progress.updates)
                self.started = self.last_save = time.monotonic()
                self.log.log(starting_line(self))
                if (finished := self.progress.finished(self.config)) is not None:
                    self.log.log(f"nothing to do: {finished}")
                    return self.progress
                with self.ending_on_loss():
                    return self._train()
            finally:
                self.log.close()
                self.prefetcher.close()
                if self.runtime.peers:
                    self.runtime.peers.close()

    def _train(self) -> Progress:
        """The loop: epochs of updates, each followed by what is due (validation, checkpoint, stop)."""
        c, p, rt = self.config, self.progress, self.runtime
        interrupted: list[int] = []  # Ctrl-C or SIGTERM: save at the current update, then stop
        handlers = {sig: signal.signal(sig, lambda n, _f: interrupted.append(n))
                    for sig in (signal.SIGINT, signal.SIGTERM)}
        self.log.start(c.max_updates, p.updates, c.max_time * 60 if c.max_time else None, self.elapsed())
        self._clock(p.elapsed_s)
        stop: Stop | None = None
        try:
            while stop is None:
                self.prefetcher.data = self.plan.split(p.epoch)[0]
                in_epoch = self.plan.updates(p.epoch)
                while p.epoch_updates < in_epoch and stop is None:
                    update = self.plan.update(p.epoch, p.epoch_updates)
                    if p.epoch_updates + 1 < in_epoch:
                        self.prefetcher.prefetch(self.plan.update(p.epoch, p.epoch_updates + 1).mine)
                    if rt.peers:
                        rt.peers.update = p.updates
                    advanced = self.guard.update(self.prefetcher.get(update.mine), update.tokens, update.counted)
                    p.epoch_updates += 1
                    if advanced and (p.updates % self.read_every == 0 or p.updates % c.log_interval == 0
                                     or not self.log.reported):
                        self._read()
                    stop = self._after_update(interrupted, advanced)
                if stop is None:  # end of epoch
                    self._read()
                    best = self.validate()
                    p.epoch, p.epoch_updates = p.epoch + 1, 0
                    self.save(best)
                    stop = p.done(c)
            if stop is Stop.INTERRUPTED:
                raise NmtError(f"{stop.describe(c, interrupted)}; checkpoint saved at update {p.updates} in "
                               f"{self.save_dir}. Run the same command again to resume.")
            self.log.close_bar()
            self.log.log(f"done: {stop.describe(c)}; {p.updates} updates, {self.elapsed() / 60:.1f} minutes")
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
        return p

    def _after_update(self, interrupted: list[int], advanced: bool) -> Stop | None:
        """Validate and save when due; returns why to stop, if training should. After a skipped
        update (`advanced` False) the update-count intervals are not due again. Time and signals
        are looked at every `read_every` updates (with several processes agreeing on them is an
        all-reduce, a host wait), the update-count criteria at every update."""
        c, p = self.config, self.progress
        if advanced and p.updates % self.read_every and p.done(c) is None and not any(intervals_due(c, p.updates)):
            return None
        self._read()  # what validates, saves or stops counts only the updates that were applied
        save_due = time.monotonic() - self.last_save >= c.save_interval_minutes * 60
        elapsed, save_due, signalled = self.runtime.agree(self.elapsed(), save_due, bool(interrupted))
        self._clock(elapsed)
        out_of_time = c.max_time is not None and elapsed >= c.max_time * 60
        stop = Stop.INTERRUPTED if signalled else Stop.MAX_TIME if out_of_time else p.done(c)
        best = False
        validate_due, save_interval_due = intervals_due(c, p.updates, advanced)
        if validate_due or (stop is not None and stop is not Stop.INTERRUPTED):
            best = self.validate()
            stop = stop or p.done(c)
        if stop or best or save_due or save_interval_due:
            self.save(best)
        return stop

    def _clock(self, elapsed_s: float) -> None:
        """Give the trainer the share of --max-time trained (the linear schedule's clock), from a
        time all processes agree on."""
        if self.config.max_time is not None:
            self.trainer.time_spent = elapsed_s / (self.config.max_time * 60)

    def _read(self) -> None:
        """Read the pending updates' losses (one host wait) into the log, which reports every
        --log-interval updates."""
        for update, stats in self.guard.read():
            self.log.count(stats, update, self.elapsed())
            if self.log.due(update, self.config.log_interval):
                self.log.report(update, self.progress.epoch, stats["lr"], self.elapsed(), self.runtime.world)
