"""Where a training process runs: its device and compute dtype and, under torchrun, its place
among the processes (the process group and the heartbeat that notices a lost one)."""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist

from nmt_cli.config import TrainConfig
from nmt_cli.device import select as select_device
from nmt_cli.device import tune
from nmt_cli.errors import NmtError
from nmt_cli.train.peers import Heartbeat, Place


@dataclass
class Runtime:
    """Where this process runs: device, compute dtype, and its place among torchrun's processes."""

    device: torch.device
    dtype: torch.dtype
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    peers: Heartbeat | None = None  # with several processes

    @property
    def main(self) -> bool:
        return self.rank == 0

    def agree(self, *values: float) -> list[float]:
        """Each value's maximum over the processes, in one all-reduce: a stop, save or time-out seen
        by any process is seen by all, and all train by one clock (the longest elapsed time)."""
        if self.world == 1:
            return [float(v) for v in values]
        value = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self.device)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return value.tolist()


    @contextlib.contextmanager
    def closed_on_failure(self) -> Iterator[None]:
        """`close` when the block fails (a run that could not start)."""
        try:
            yield
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Leave the run: stop beating, marked done, and leave the process group (a process that
        ends with its group and heartbeat still up is aborted by them at exit)."""
        if self.peers is not None:
            self.peers.close()
        if self.world > 1 and dist.is_initialized():
            dist.destroy_process_group()


def set_up_runtime(config: TrainConfig) -> Runtime:
    """Device, precision and, under torchrun, the process group (NCCL on GPU, gloo on CPU) whose
    collectives wait at most --dist-timeout, and the heartbeat that ends the run when a process
    is lost."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    device, dtype = select_device(config.device, config.precision, local_rank)
    tune(device, config.threads)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if world == 1:
        return Runtime(device, dtype)
    # NCCL: a collective past its time-out raises and tears the communicator down instead of hanging
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    if not dist.is_initialized():
        # the heartbeat names a lost process at --dist-timeout; the collectives' own limit is the backstop
        timeout = datetime.timedelta(seconds=config.dist_timeout + min(10.0, config.dist_timeout))
        try:
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=timeout)
        except dist.DistError as e:
            raise NmtError(f"rank {rank} of {world}: the processes did not all start within --dist-timeout "
                           f"{config.dist_timeout:g} s (is every node's torchrun running, with the same "
                           f"--nnodes and rendezvous?): {str(e).splitlines()[0]}") from None
    place = Place.here(rank, local_rank, str(device))
    peers = Heartbeat.joined(place, config.dist_timeout) if "MASTER_ADDR" in os.environ else None
    return Runtime(device, dtype, rank, world, local_rank, peers)
