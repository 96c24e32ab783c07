"""The other processes of a torchrun run, seen from one of them: where each runs (the rank map
that the start line prints) and whether each still answers.

Every process beats: a thread adds 1 to its counter in torchrun's store (MASTER_ADDR:MASTER_PORT,
on the first node) every BEAT_SECONDS and reads the others'. A process whose counter stands still
for --dist-timeout seconds (killed, its machine gone, stopped) ends every other one with one line
naming it and the update; so does a store that stops answering (the first node is gone). A
collective that fails first (gloo sees a closed connection at once) asks the same question, so
the line names the lost process either way and no process waits for one that will never come.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch.distributed as dist

from nmt_cli.errors import NmtError

BEAT_SECONDS = 1.0
DONE = 10**12  # added to a counter by a process that ended its run: never silent after that


@dataclass(frozen=True)
class Place:
    """Where one process runs: torchrun's node (GROUP_RANK), local and global rank, host, device."""

    rank: int
    node: int
    local_rank: int
    host: str
    device: str

    @classmethod
    def here(cls, rank: int, local_rank: int, device: str) -> Place:
        return cls(rank, int(os.environ.get("GROUP_RANK", "0")), local_rank, socket.gethostname(), device)

    def describe(self) -> str:
        return f"rank {self.rank} (node {self.node} on {self.host}, local rank {self.local_rank})"


def rank_map(places: list[Place]) -> str:
    """One line: each node, its host, and the global rank, local rank and device of its processes."""
    nodes = sorted({(p.node, p.host) for p in places})
    return "; ".join(f"node {node} ({host}): " + ", ".join(
        f"rank {p.rank} = local {p.local_rank} on {p.device}" for p in places if (p.node, p.host) == (node, host))
        for node, host in nodes)


class Heartbeat:
    """This process's beat in the run's store, and the others' as it last saw them."""

    def __init__(self, store: dist.Store, me: Place, places: list[Place], timeout_s: float,
                 beat_s: float = BEAT_SECONDS, on_loss: Callable[[str], None] | None = None) -> None:
        self.store, self.me, self.places, self.timeout_s, self.beat_s = store, me, places, timeout_s, beat_s
        self.on_loss = on_loss or end_process
        self.update = 0  # the update this process is at, set by the training loop, for the line
        self.keys = [beat_key(p.rank) for p in places]
        self.seen = {p.rank: (0, time.monotonic()) for p in places}  # rank -> (counter, when it last moved)
        self.store_since: float | None = None  # when the store stopped answering
        self.stopped = threading.Event()
        self.reporting = threading.Event()  # the main thread reports a loss itself (after a failed collective)
        self.thread = threading.Thread(target=self._beat, name="nmt-heartbeat", daemon=True)
        self.thread.start()

    @classmethod
    def joined(cls, me: Place, timeout_s: float) -> Heartbeat:
        """The heartbeat of a process of an initialized process group: gathers every process's
        Place and beats into torchrun's store."""
        client = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                               timeout=datetime.timedelta(seconds=max(BEAT_SECONDS, timeout_s / 4)),
                               wait_for_workers=False)
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")  # keys of an earlier attempt are not ours
        store = dist.PrefixStore(f"nmt/{restart}/", client)
        store.add(beat_key(me.rank), 1)  # before the gather, a barrier: every counter exists after it
        places: list[Place] = [me] * dist.get_world_size()
        dist.all_gather_object(places, me)
        return cls(store, me, places, timeout_s)

    def silent(self) -> list[Place] | None:
        """The processes whose beat has stood still for --dist-timeout; None when the store itself
        has not answered for that long."""
        now = time.monotonic()
        if self.store_since is not None:  # the others cannot be seen while the store does not answer
            return None if now - self.store_since >= self.timeout_s else []
        return [p for p in self.places if p.rank != self.me.rank and self.seen[p.rank][0] < DONE
                and now - self.seen[p.rank][1] >= self.timeout_s]

    def verdict(self) -> str | None:
        """The line that ends this process when another is lost (None: all answer)."""
        silent = self.silent()
        ending = f"ending {self.me.describe()} at update {self.update}"
        if silent is None:
            return (f"the run's store at {os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')} (node 0) "
                    f"has not answered for {self.timeout_s:g} s (--dist-timeout): node 0 is gone; {ending}")
        if silent:
            who = ", ".join(p.describe() for p in silent)
            return f"{who} stopped answering (no sign for {self.timeout_s:g} s, --dist-timeout); {ending}"
        return None

    def _beat(self) -> None:
        while not self.stopped.wait(self.beat_s):
            self._look()
            if (line := self.verdict()) is not None:
                if not self.reporting.is_set():
                    self.on_loss(line)
                return

    def _look(self) -> None:
        """Beat once, and note which of the others' counters moved since the last look."""
        now = time.monotonic()
        try:
            self.store.add(self.keys[self.me.rank], 1)
            counters = self.store.multi_get(self.keys)
        except (RuntimeError, dist.DistError):  # the store on the first node is unreachable
            self.store_since = self.store_since or now
            return
        self.store_since = None
        for place, counter in zip(self.places, counters):
            if int(counter) != self.seen[place.rank][0]:
                self.seen[place.rank] = (int(counter), now)

    def wait_for_verdict(self) -> str | None:
        """After a failed collective: the verdict once the heartbeat knows (within --dist-timeout),
        None as soon as every other process has beaten since the failure (all still answer)."""
        self.reporting.set()
        at_failure = {rank: counter for rank, (counter, _) in self.seen.items() if rank != self.me.rank}
        deadline = time.monotonic() + self.timeout_s + 2 * self.beat_s
        while time.monotonic() < deadline:
            if (line := self.verdict()) is not None:
                return line
            # two beats more than at the failure (the first may have been on its way): alive
            if not self.thread.is_alive() or all(self.seen[rank][0] >= counter + 2
                                                 for rank, counter in at_failure.items()):
                break
            time.sleep(self.beat_s / 2)
        return self.verdict()

    @contextlib.contextmanager
    def ending_on_loss(self) -> Iterator[None]:
        """A collective that fails because a process is lost ends this one with the verdict's line;
        one that fails with every process answering (one stuck) says so in a line too."""
        try:
            yield
        except (RuntimeError, dist.DistError) as e:
            if not isinstance(e, dist.DistError) and "gloo" not in str(e).lower():
                raise
            line = self.wait_for_verdict() or (f"a collective failed at update {self.update} on "
                                               f"{self.me.describe()} with every process answering (one may be "
                                               f"stuck): {str(e).splitlines()[0]}")
            raise NmtError(line) from None

    def close(self) -> None:
        """Stop beating, marked done: the others do not take this process for lost."""
        self.stopped.set()
        self.thread.join()
        with contextlib.suppress(RuntimeError, dist.DistError):
            self.store.add(self.keys[self.me.rank], DONE)


def beat_key(rank: int) -> str:
    return f"beat/{rank}"


def end_process(line: str) -> None:
    """End this process from the heartbeat's thread, the main one being stuck in a collective;
    checkpoints are written whole or not at all, so the last one stays intact."""
    print(f"Error: {line}", file=sys.stderr, flush=True)
    os._exit(1)
