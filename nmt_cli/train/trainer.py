"""One update of §5's regime: the optimizer (Adam, eq. 3's rate), the label-smoothed loss, mixed
precision, gradient accumulation over micro-batches and, under torchrun, over processes.

One update = `update_freq` micro-batches on each of `world` processes. The loss of an update is the
sum over its target tokens divided by their number, whatever W and K are, so W processes with K
micro-batches give the same update as one process with W*K.

An update is queued without the host waiting for the device: its loss sums stay on the device
until the caller reads them (a GPU runs one update while the host queues the next), and a
non-finite loss skips the optimizer step on the device (fused Adam's `found_inf`). `SkipGuard`
runs the updates of a training: it reads their losses, and skips the faulty ones.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from nmt_cli.config import TrainConfig
from nmt_cli.corpus.data import Batch, ParallelData
from nmt_cli.device import out_of_memory
from nmt_cli.errors import NmtError
from nmt_cli.model.kernels import smoothed_cross_entropy, use_fast_paths
from nmt_cli.model.transformer import Transformer
from nmt_cli.text.vocab import PAD_ID
from nmt_cli.train.progress import Progress
from nmt_cli.train.runlog import RunLog
from nmt_cli.train.runtime import Runtime
from nmt_cli.train.schedule import learning_rate, lesser

MAX_SKIPS_IN_A_ROW = 5


def label_smoothed_loss(logits: Tensor, target: Tensor, epsilon: float) -> tuple[Tensor, Tensor]:
    """Sums of the label-smoothed loss and of the true NLL over the targets (§5.4).

    `logits` (..., V) and `target` (...) hold real tokens only, or padding marked by PAD_ID.
    Smoothing follows Szegedy et al.: the target distribution is (1 - eps) on the reference
    plus eps / V on every class, so loss = (1 - eps) * NLL + eps * mean_v(-log p_v). Inside
    torch.compile it is that definition, which the compiler fuses into a few passes over the
    logits; elsewhere kernels.smoothed_cross_entropy, the same numbers in blocks of rows (on a GPU
    in two fused passes).
    """
    logits, target = logits.flatten(0, -2), target.flatten()
    if torch.compiler.is_compiling():
        log_probs = logits.float().log_softmax(-1)
        real = target != PAD_ID
        nll = -log_probs.gather(-1, target[:, None]).squeeze(-1).masked_fill(~real, 0.0)
        uniform = -log_probs.mean(-1).masked_fill(~real, 0.0)
        return ((1 - epsilon) * nll + epsilon * uniform).sum(), nll.detach().sum()
    loss, nll = smoothed_cross_entropy(logits, target, epsilon)
    return loss.sum(), nll.sum()


class WeightAverage:
    """An exponential moving average of the weights (--ema-decay), kept in fp32 beside them: after
    update t, average = d * average + (1 - d) * weights with d = min(decay, (1 + t) / (10 + t)),
    so that the first updates are not held back by the initial weights."""

    def __init__(self, model: Transformer, decay: float) -> None:
        self.decay = decay
        self.names, self.params = zip(*model.named_parameters())
        self.average = [p.detach().float().clone() for p in self.params]

    @torch.no_grad()
    def update(self, step: int | Tensor, applied: Tensor) -> None:
        """Move the average toward the weights after update `step`; `applied` (a device flag, 1 or 0)
        says whether the optimizer changed them, so a skipped update leaves the average as it was."""
        keep = torch.as_tensor(lesser(self.decay, (1 + step) / (10 + step)), dtype=torch.float32, device=applied.device)
        weight = (1.0 - keep) * applied.float()
        # average += weight * (weights - average) as three multi-tensor kernels: lerp takes a device
        # weight only as one tensor per parameter, one kernel each
        step_to_weights = torch._foreach_sub(list(self.params), self.average)
        torch._foreach_mul_(step_to_weights, weight)
        torch._foreach_add_(self.average, step_to_weights)

    @contextlib.contextmanager
    def swapped_in(self) -> Iterator[None]:
        """The model holds the averaged weights inside the block, its own ones again after it."""
        own = [p.detach().clone() for p in self.params]
        with torch.no_grad():
            for param, average in zip(self.params, self.average):
                param.copy_(average)
            try:
                yield
            finally:
                for param, saved in zip(self.params, own):
                    param.copy_(saved)

    def state(self) -> dict[str, Tensor]:
        return dict(zip(self.names, self.average))

    def load_state(self, state: dict[str, Tensor]) -> None:
        self.average = [state[name].to(average.device) for name, average in zip(self.names, self.average)]


class LossSums(torch.nn.Module):
    """The label-smoothed loss and NLL sums of a batch: what the trainer, and DDP or torch.compile
    around it, run, so that a compiled update holds the loss too. With `project_real_only`, only
    the real target positions go through the vocabulary projection (a boolean index: its size is
    known only to the device, so not on a GPU nor inside torch.compile)."""

    def __init__(self, model: Transformer, epsilon: float, project_real_only: bool, dtype: torch.dtype) -> None:
        super().__init__()
        self.model, self.epsilon, self.project_real_only, self.dtype = model, epsilon, project_real_only, dtype

    def autocast(self, device: torch.device) -> contextlib.AbstractContextManager:
        """Mixed precision in the compute dtype; nothing in float32 (nor on devices autocast lacks)."""
        if self.dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=self.dtype)

    def forward(self, src: Tensor, tgt_in: Tensor, tgt_out: Tensor) -> tuple[Tensor, Tensor]:
        with self.autocast(src.device):
            features = self.model.features(src, tgt_in)
            if self.project_real_only:
                keep = tgt_out != PAD_ID
                features, tgt_out = features[keep], tgt_out[keep]
            logits = self.model.output_projection(features)
        return label_smoothed_loss(logits, tgt_out, self.epsilon)


def compiled(net: torch.nn.Module, length_buckets: int, mode: str) -> torch.nn.Module:
    """torch.compile(net, mode=mode). With length buckets, one static graph per batch shape (as
    CUDA graphs need) and room in dynamo's cache for all 2N; without, one dynamic graph for all
    shapes from the start (the parameters' stay static), not a static one for the first."""
    if length_buckets:
        import torch._dynamo.config as dynamo

        dynamo.recompile_limit = max(dynamo.recompile_limit, 2 * length_buckets)
    return torch.compile(net, mode=mode, dynamic=not length_buckets)


# The parameters of each part --freeze names, by the beginning of their names (a tied output
# projection is the target embedding: --freeze embeddings).
PARTS = {"embeddings": ("src_embed.", "tgt_embed."), "output": ("output_projection.",),
         "encoder": ("encoder_layers.", "encoder_norm."), "decoder": ("decoder_layers.", "decoder_norm.")}


def freeze(model: Transformer, parts: tuple[str, ...]) -> None:
    """--freeze: the parameters of `parts` take no gradient (nor an optimizer's state); a part
    this model does not have, or one that holds no parameter of its own, is refused naming it."""
    layers = {"encoder": model.config.encoder_layers, "decoder": model.config.decoder_layers}
    for part in parts:
        side, _, index = part.partition(".")
        if part in PARTS:
            prefixes = PARTS[part]
        elif side in layers and index.isdigit() and int(index) < layers[side]:
            prefixes = (f"{side}_layers.{int(index)}.",)
        else:
            raise NmtError(f"--freeze {part}: expected embeddings, output, encoder, decoder, encoder.N (N from 0 to "
                           f"{layers['encoder'] - 1}) or decoder.N (to {layers['decoder'] - 1})")
        frozen = [p.requires_grad_(False) for name, p in model.named_parameters() if name.startswith(prefixes)]
        if not frozen:
            raise NmtError(f"--freeze {part}: this model has no parameter of its own there (a tied output projection "
                           "is the embeddings': --freeze embeddings)")
    if parts and not any(p.requires_grad for p in model.parameters()):
        raise NmtError(f"--freeze {' '.join(parts)}: nothing is left to train")


class Trainer:
    """Model, optimizer and one update: forward/backward over this process's micro-batches, then step."""

    def __init__(self, model: Transformer, config: TrainConfig, runtime: Runtime) -> None:
        freeze(model, config.freeze)
        self.model, self.config, self.runtime = use_fast_paths(model), config, runtime
        self.d_model = model.config.d_model
        # On the CPU only the real target positions go through the vocabulary projection, the
        # largest matmul. On a GPU that selection would make the host wait for the device at every
        # batch and split a compiled graph, so there, and wherever the model is compiled, every
        # position is projected and the loss masks the padding.
        real_only = runtime.device.type == "cpu" and not config.compile
        self.losses = LossSums(model, model.config.label_smoothing, real_only, runtime.dtype)
        self.net: torch.nn.Module = self.losses
        if runtime.world > 1:
            ids = [runtime.local_rank] if runtime.device.type == "cuda" else None
            self.net = torch.nn.parallel.DistributedDataParallel(self.losses, device_ids=ids)
        if config.compile:
            self.net = compiled(self.net, config.length_buckets, config.compile_mode)
        adam = torch.optim.AdamW if config.weight_decay else torch.optim.Adam
        options = {"lr": 0.0, "betas": (config.adam_beta1, config.adam_beta2), "eps": config.adam_eps,
                   **({"weight_decay": config.weight_decay} if config.weight_decay else {})}
        self.trained = [name for name, p in model.named_parameters() if p.requires_grad]  # all but --freeze's
        trained = [p for p in model.parameters() if p.requires_grad]
        try:  # one fused kernel for all parameters (CUDA; CPU since torch 2.4)
            self.optimizer = adam(trained, fused=True, **options)
        except RuntimeError:
            self.optimizer = adam(trained, **options)
        self.scaler = torch.amp.GradScaler(runtime.device.type, enabled=runtime.dtype == torch.float16)
        # Fused Adam skips a step on the device (found_inf); otherwise, and under fp16's GradScaler
        # (which sets found_inf itself), the host reads whether the loss is finite at every update.
        self.skips_on_device = bool(self.optimizer.defaults.get("fused")) and not self.scaler.is_enabled()
        self.loss_scale_changes: list[tuple[int, float, float]] = []  # fp16: (update, before, after)
        self.average = WeightAverage(model, config.ema_decay) if config.ema_decay else None
        self.time_spent = 0.0  # share of --max-time trained, agreed by all processes (the linear schedule)

    def update(self, batches: list[Batch], update_tokens: int, step: int | Tensor, counted: bool = True) -> Tensor:
        """One optimizer step over `batches`, queued: returns the (loss sum, NLL sum, target tokens)
        of the update on the device, read by the caller when it chooses. A non-finite loss sum means
        the step was skipped (the weights, Adam's state and the weight average are as before).
        `step`: the update's number if it applies (its rate), a device tensor where the host has
        not read whether the updates before it applied.
        Not `counted`: this process has no share of an epoch's short last update; it runs `batches`
        with weight 0 so that it still takes part in the processes' sum of gradients."""
        self.net.train()
        if not self.skips_on_device:  # the host reads whether the loss is finite anyway
            step = int(step)
        if self.config.compile:  # a new update: reduce-overhead's CUDA graphs may reuse the last one's memory
            torch.compiler.cudagraph_mark_step_begin()
        # DDP averages gradients over processes; scaling by `world` makes them sums over all tokens.
        weight = self.runtime.world / update_tokens if counted else 0.0
        totals = torch.zeros(3, dtype=torch.float64, device=self.runtime.device)
        for i, batch in enumerate(batches):
            last = i == len(batches) - 1
            sync = contextlib.nullcontext() if last or self.runtime.world == 1 else self.net.no_sync()
            with sync:
                loss, nll, tokens = self.loss(self.net, batch)
                self.scaler.scale(loss * weight).backward()
            # a stand-in's sums count nothing, but its NaN does (0 * NaN): its gradients are NaN too
            totals += torch.stack([loss.detach(), nll.detach(), tokens]).double() * counted
        finite = self._finite_everywhere(totals)
        if not self.skips_on_device and not bool(finite):  # a host wait, where the device cannot skip
            self.optimizer.zero_grad(set_to_none=True)
            return totals
        rate = learning_rate(step, self.d_model, self.config, self.time_spent)
        if isinstance(rate, Tensor):  # fused Adam reads a tensor rate as float32, on the parameters' device
            rate = rate.float()
        for group in self.optimizer.param_groups:
            group["lr"] = rate
        if self.config.clip_norm > 0:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.clip_norm)
        if self.skips_on_device:
            self.optimizer.found_inf = (~finite).float()
        loss_scale = self.scaler.get_scale() if self.scaler.is_enabled() else 1.0
        self.scaler.step(self.optimizer)
        if self.average is not None:
            self.average.update(step, finite)
        self.scaler.update()  # fp16: halves the scale (and skipped the step) on overflow, grows it when stable
        self.optimizer.zero_grad(set_to_none=True)
        if self.scaler.is_enabled() and self.scaler.get_scale() != loss_scale:
            self.loss_scale_changes.append((step, loss_scale, self.scaler.get_scale()))
        return totals

    def _finite_everywhere(self, totals: Tensor) -> Tensor:
        """Whether every process's loss sum is finite (a NaN on one reaches all through the summed
        gradients, so all skip the step); where one is not, this one's loss sum is marked NaN too,
        so that every process counts the skip."""
        finite = totals[0].isfinite()
        if self.runtime.world > 1:
            flag = finite.float()
            dist.all_reduce(flag, op=dist.ReduceOp.MIN)
            finite = flag.bool()
            totals[0] = torch.where(finite, totals[0], torch.nan)
        return finite

    def loss(self, net: torch.nn.Module, batch: Batch) -> tuple[Tensor, Tensor, Tensor]:
        """Label-smoothed loss and NLL sums and the token count of one batch (padding excluded)."""
        batch = batch.to(self.runtime.device)
        loss, nll = net(batch.src, batch.tgt_in, batch.tgt_out)
        return loss, nll, (batch.tgt_out != PAD_ID).sum().float()

    @torch.inference_mode()
    def validate(self, data: ParallelData, batches: list[np.ndarray], pad_multiple: int) -> dict[str, float]:
        """Label-smoothed loss, NLL and perplexity per target token over a whole split."""
        self.model.eval()
        totals = torch.zeros(3, dtype=torch.float64, device=self.runtime.device)
        for indices in batches:
            totals += torch.stack(self.loss(self.losses, data.collate(indices, pad_multiple))).double()
        loss, nll, tokens = totals.tolist()
        return {"loss": loss / tokens, "nll": nll / tokens, "ppl": math.exp(nll / tokens)}

    def averaged(self) -> contextlib.AbstractContextManager:
        """With --ema-decay, the model holds the averaged weights inside the block."""
        return self.average.swapped_in() if self.average is not None else contextlib.nullcontext()

    def state(self) -> dict[str, Any]:
        average = {"ema": self.average.state()} if self.average is not None else {}
        return {"optimizer": self.optimizer.state_dict(), "scaler": self.scaler.state_dict(), "trained": self.trained,
                **average}

    def load_state(self, state: dict[str, Any]) -> None:
        """The states of a checkpoint (a run that turns --ema-decay on starts the average here).
        Its optimizer's state is refused for other parameters than this run trains (another
        --freeze): by their names where the checkpoint lists them (a set of the same shapes loads
        without complaint, each state on another weight), else by their number and shapes."""
        other = state.get("trained", self.trained) != self.trained
        try:
            if not other:
                self.optimizer.load_state_dict(state["optimizer"])
        except ValueError:  # its parameter groups are not this run's
            other = True
        if other:
            raise NmtError(f"the checkpoint's optimizer trained other parameters than this run would (--freeze "
                           f"{' '.join(self.config.freeze) or '(none)'} now): resume with the --freeze it was "
                           "saved with, or fine-tune from it with --init-from")
        self.scaler.load_state_dict(state["scaler"])
        if self.average is not None and "ema" in state:
            self.average.load_state(state["ema"])


class SkipGuard:
    """Runs Trainer.update, skipping a batch that runs out of memory (one process) or an update
    with a non-finite loss. The updates' loss sums stay on the device until `read`, which reads
    all the pending ones in one host wait. MAX_SKIPS_IN_A_ROW of one kind in a row stop the run
    with advice: the memory cannot hold such batches, or training diverged.

    It owns the count of applied updates (Progress.updates): an update queued counts as applied
    until the read, which numbers the applied ones in order, so that no number serves twice. The
    rate of an update comes from the device's own count of those applied before it: the same
    rates, and the same run, whether the host reads after each update or every few."""

    def __init__(self, trainer: Trainer, progress: Progress, log: RunLog) -> None:
        self.trainer, self.progress, self.log = trainer, progress, log
        self.in_a_row = {"oom": 0, "nonfinite": 0}
        self.read_count = progress.updates  # applied updates as of the last read
        self.applied = torch.tensor(float(progress.updates), dtype=torch.float64, device=trainer.runtime.device)
        self.pending: list[tuple[Tensor, float | Tensor]] = []  # (an update's loss sums on the device, its rate)

    def update(self, batches: list[Batch], update_tokens: int, counted: bool = True) -> bool:
        """Queue the next update (Trainer.update); False when its batch ran out of memory
        (skipped, nothing pending)."""
        try:
            totals = self.trainer.update(batches, update_tokens, self.applied + 1, counted)
        except RuntimeError as e:  # CUDA's OutOfMemoryError is one
            if not out_of_memory(e):
                raise
            self._out_of_memory(self.progress.updates + 1, "CUDA out of memory"
                                if isinstance(e, torch.cuda.OutOfMemoryError) else "out of memory")
            return False
        self.in_a_row["oom"] = 0
        self.applied += totals[0].isfinite()
        self.pending.append((totals, self.trainer.optimizer.param_groups[0]["lr"]))  # the rate applied
        self.progress.updates += 1
        return True

    def read(self) -> list[tuple[int, dict[str, float]]]:
        """The pending updates' (update, loss/nll/tokens sums and rate), in one host wait. Those
        with a non-finite loss were skipped on the device: they are logged, counted as skips and
        left out of Progress.updates."""
        pending, self.pending = self.pending, []
        device = self.trainer.runtime.device
        values = torch.stack([torch.cat([totals, torch.as_tensor(rate, dtype=totals.dtype, device=device)[None]])
                              for totals, rate in pending]).tolist() if pending else []
        for step, before, after in self.trainer.loss_scale_changes:
            change = "overflow, step skipped" if after < before else "stable, grown"
            self.log.log(f"fp16 loss scale {before:g} -> {after:g} at update {step} ({change})")
            self.log.record({"kind": "loss_scale", "update": step, "before": before, "after": after})
        self.trainer.loss_scale_changes.clear()
        done = []
        for loss, nll, tokens, rate in values:
            if math.isfinite(loss):
                self.in_a_row["nonfinite"] = 0
                self.read_count += 1
                done.append((self.read_count, {"loss": loss, "nll": nll, "tokens": tokens, "lr": rate}))
                continue
            self.progress.updates -= 1
            self.progress.nonfinite_skips += 1
            self._skipped("nonfinite", self.progress.nonfinite_skips, self.read_count + 1, "non-finite loss",
                          "update", "training diverged; lower the learning rate (--lr-scale/--lr), or use "
                          "--precision bf16/fp32")
        return done

    def _out_of_memory(self, step: int, what: str) -> None:
        runtime, advice = self.trainer.runtime, "lower --max-tokens (and raise --update-freq to keep the update size)"
        if runtime.world > 1:
            raise NmtError(f"{what} at update {step} on process {runtime.rank}; {advice}") from None
        self.trainer.optimizer.zero_grad(set_to_none=True)
        if runtime.device.type == "cuda":
            torch.cuda.empty_cache()
        self.progress.oom_skips += 1
        self._skipped("oom", self.progress.oom_skips, step, what, "batch", f"such batches do not fit; {advice}")

    def _skipped(self, kind: str, total: int, step: int, what: str, skipped: str, advice: str) -> None:
        """Log a skip (`kind`: oom or nonfinite, `total` so far); the MAX_SKIPS_IN_A_ROW-th of a
        kind in a row stops the run."""
        self.in_a_row[kind] += 1
        self.log.log(f"{what} at update {step}: {skipped} skipped ({total} so far)")
        if self.in_a_row[kind] >= MAX_SKIPS_IN_A_ROW:
            raise NmtError(f"{what} {MAX_SKIPS_IN_A_ROW} times in a row (update {step}): {advice}")
