"""The other processes of a run: the rank map, and the heartbeat that names a lost process
(here in one process, against a store of its own; tests/test_faults.py loses a node of a real
two-node torchrun run)."""

import datetime
import time

import pytest
import torch.distributed as dist
from conftest import free_port

from nmt_cli.errors import NmtError
from nmt_cli.train.peers import Heartbeat, Place, rank_map

PLACES = [Place(0, 0, 0, "a", "cuda:0"), Place(1, 0, 1, "a", "cuda:1"), Place(2, 1, 0, "b", "cuda:0")]


def test_the_rank_map_groups_ranks_by_node():
    assert rank_map(PLACES) == ("node 0 (a): rank 0 = local 0 on cuda:0, rank 1 = local 1 on cuda:1; "
                                "node 1 (b): rank 2 = local 0 on cuda:0")


def beating(timeout_s: float = 0.6):
    """Heartbeats of ranks 0-2 in one store; losses are collected, not ended."""
    server = dist.TCPStore("127.0.0.1", free_port(), is_master=True, wait_for_workers=False,
                           timeout=datetime.timedelta(seconds=1))
    losses: list[tuple[int, str]] = []
    for place in PLACES:
        server.add(f"beat/{place.rank}", 1)
    beats = [Heartbeat(server, place, PLACES, timeout_s, beat_s=0.05,
                       on_loss=lambda line, rank=place.rank: losses.append((rank, line))) for place in PLACES]
    return server, beats, losses


def wait_for(condition, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)


@pytest.mark.slow  # waits out time-outs
def test_a_process_that_stops_beating_is_named_by_the_others_after_the_timeout():
    _, beats, losses = beating()
    time.sleep(0.3)
    assert losses == [] and all(beat.verdict() is None for beat in beats)
    beats[2].update = 7
    beats[2].stopped.set()  # rank 2 stops beating without ending its run: lost
    started = time.monotonic()
    wait_for(lambda: len(losses) == 2)
    assert 0.5 <= time.monotonic() - started <= 3.0
    assert sorted(rank for rank, _ in losses) == [0, 1]
    for rank, line in losses:
        assert line.startswith("rank 2 (node 1 on b, local rank 0) stopped answering (no sign for 0.6 s")
        assert f"ending rank {rank} (node 0 on a, local rank {rank}) at update 0" in line
    for beat in beats:
        beat.close()


@pytest.mark.slow  # waits out time-outs
def test_a_process_that_ends_its_run_is_not_lost():
    _, beats, losses = beating()
    beats[2].close()
    time.sleep(1.2)  # twice the timeout
    assert losses == []
    for beat in beats[:2]:
        beat.close()


@pytest.mark.slow  # waits out time-outs
def test_a_store_that_stops_answering_means_node_0_is_gone(monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    server, beats, losses = beating()
    for beat in beats:
        beat.store = dist.TCPStore("127.0.0.1", free_port(), is_master=True, wait_for_workers=False,
                                   timeout=datetime.timedelta(milliseconds=50))  # an empty store: reads time out
    wait_for(lambda: len(losses) == 3)
    assert len(losses) == 3 and all(line.startswith("the run's store at 10.0.0.1:29500 (node 0) has not answered "
                                                    "for 0.6 s (--dist-timeout): node 0 is gone") for _, line in losses)


@pytest.mark.slow  # waits out time-outs
def test_a_failed_collective_ends_with_the_verdict_or_says_none_is_silent():
    _, beats, losses = beating()
    beats[1].stopped.set()
    with pytest.raises(NmtError, match=r"^rank 1 \(node 0 on a, local rank 1\) stopped answering"):
        with beats[0].ending_on_loss():
            raise RuntimeError("[gloo/transport/tcp/pair.cc:537] Read error: Connection reset by peer")
    for beat in beats:
        beat.close()
    _, beats, _ = beating()  # all answer
    with pytest.raises(NmtError, match=r"^a collective failed at update 0 on rank 2 .*one may be stuck\): "
                                       r"\[gloo.*Timed out"), beats[2].ending_on_loss():
        raise RuntimeError("[gloo/unbound_buffer.cc:78] Timed out waiting 15000ms for recv")
    with pytest.raises(ValueError, match="a bug"), beats[2].ending_on_loss():
        raise ValueError("a bug")  # not a collective's failure: as it is
    for beat in beats:
        beat.close()
