"""Collectives (format 1.5) issued through NCCL by a replay, on one GPU: a job of one rank, whose
communicator the replay makes from a unique id as it would for every rank of a larger job. The
calls go through NCCL's entry points on the replay's streams (a group of two among them), what
they leave is verified, and replayed alone the same capture puts what each received in place.
Two-rank jobs: tests/gpu/test_multi_gpu_capture_gpu.py."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import replayfmt
from replayfmt.execute import open_replay
from replayfmt.format import model as m
from replayfmt.replay.collectives import Nccl, Peers
from replayfmt.replay.options import ReplayOptions
from replayfmt.replay.plan import PlanOptions


@pytest.fixture(scope="module")
def nccl(gpu_arch) -> Nccl:
    try:
        return Nccl()
    except replayfmt.ReplayError as exc:
        pytest.skip(str(exc))


def one_rank_job(path) -> np.ndarray:
    grad = np.arange(256, dtype=np.float32)
    with replayfmt.CaptureWriter(path) as w:
        dev = w.add_object(m.Device(name="gpu", compute_capability=(9, 0)))
        stream = w.add_object(m.Stream(device=dev))
        summed = w.add_object(m.Buffer(size=grad.nbytes, device=dev, dtype=m.DType.FLOAT32))
        gathered = w.add_object(m.Buffer(size=grad.nbytes, device=dev, dtype=m.DType.FLOAT32))
        with w.scope("step"):
            w.state(buffer=summed, data=grad)
            w.memset(buffer=gathered, value=0, count=grad.nbytes, stream=stream)
            call = m.Collective(0, m.CollectiveOperation.ALL_REDUCE, 7, 0, stream, 256, -1, 1, 0, "nccl-one", 1)
            w.collective(dataclasses.replace(call, send_buffer=summed, recv_buffer=summed), received=grad)
            gather = dataclasses.replace(call, operation=m.CollectiveOperation.ALL_GATHER)
            w.collective(dataclasses.replace(gather, send_buffer=summed, recv_buffer=gathered), received=grad)
            w.stream_synchronize(stream)
        w.checkpoint({summed: grad, gathered: grad}, name="step")
    return grad


def test_a_replay_issues_its_collectives_through_nccl_and_verifies(tmp_path, nccl):
    path = tmp_path / "one.kreplay"
    one_rank_job(path)
    peers = Peers({"nccl-one": nccl.unique_id()})
    with open_replay(path, PlanOptions()) as session:
        replayer = session.start(ReplayOptions(verify=True, peers=peers))
        result = replayer.run(2)
        assert not result.errors and result.verified, result.mismatches
        assert replayer.collectives.issued == 4  # two calls, two runs, among the peers
    with open_replay(path, PlanOptions()) as session:
        alone = session.start(ReplayOptions(verify=True))
        assert alone.run().verified and alone.collectives.issued == 0  # what each received, put in place
