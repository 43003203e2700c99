"""One capture that holds several ranks of a communicator (a process that drove two devices: a
sharded JAX step), replayed with its collectives among those ranks in one process, on the CPU with
a fake NCCL: the ranks it holds found with their devices, their communicators made in one group
from one unique id (each rank's device current, runtime connection off before NCCL starts), each
call issued on its own rank's communicator in the capture's order, and on a machine that cannot
(one GPU, no NCCL) each call's received bytes put in place, said in one line."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
from test_ranks import SUM, FakeNccl

import replayfmt
from replayfmt.errors import DeviceError, ReplayUsageError
from replayfmt.format import model as m
from replayfmt.replay.collectives import REDUCTIONS, CollectiveRuntime, Peers, local_peers, ranks_held
from replayfmt.replay.verify_types import Outcome, VerifyOptions, VerifyResult
from replayfmt.verbs import ranks as ranks_verb
from replayfmt.verbs.ranks import PlantedReduction, RanksOptions, verify_ranks

COMM = "nccl-0x7c1e9d40a5b3f211"


def write_sharded_step(path) -> str:
    """Ranks 0 and 1 of one communicator on cuda:0 and cuda:1, each all-reducing its gradient twice."""
    grads = [np.arange(64, dtype=np.float32), np.full(64, 10, dtype=np.float32)]
    total = grads[0] + grads[1]
    with replayfmt.CaptureWriter(path) as w:
        devices = [w.add_object(m.Device(ordinal=k, name="NVIDIA H200", compute_capability=(9, 0))) for k in (0, 1)]
        streams = [w.add_object(m.Stream(device=d, captured_handle=0x5A0 + k)) for k, d in enumerate(devices)]
        buffers = [w.add_object(m.Buffer(size=256, device=d)) for d in devices]
        with w.scope("step"):
            for b, g in zip(buffers, grads, strict=True):
                w.state(buffer=b, data=g)
            for _ in range(2):
                for rank in (0, 1):
                    call = dataclasses.replace(SUM, rank=rank, communicator=COMM, stream=streams[rank])
                    call = dataclasses.replace(call, send_buffer=buffers[rank], recv_buffer=buffers[rank])
                    w.collective(call, received=total)
            w.checkpoint(dict.fromkeys(buffers, total), name="step")
    return str(path)


def test_the_ranks_a_capture_holds_are_found_with_their_devices(tmp_path):
    with replayfmt.open(write_sharded_step(tmp_path / "s.kreplay")) as cap:
        devices = [o.id for o in cap.objects() if isinstance(o, m.Device)]
        assert ranks_held(cap) == {COMM: ((0, devices[0]), (1, devices[1]))}


def test_on_a_gpu_per_rank_the_ranks_are_peers_in_one_process(tmp_path):
    with replayfmt.open(write_sharded_step(tmp_path / "s.kreplay")) as cap:
        peers, note = local_peers(cap, 2, (0,), gpu_count=lambda: 2, nccl=FakeNccl, reductions={7: 2})
    assert peers is not None and list(peers.unique_ids) == [COMM] and peers.reductions == {7: 2}
    assert [rank for rank, _ in peers.local[COMM]] == [0, 1]
    assert note == f"issued among ranks 0, 1 of {COMM} in this process, on 2 GPUs"


@pytest.mark.parametrize(
    ("count", "ordinals", "nccl", "why"),
    [
        (1, (0,), FakeNccl, "this machine gives its 2 devices 1 GPU(s); NCCL needs a GPU per rank"),
        (2, (0, 0), FakeNccl, "this machine gives its 2 devices 1 GPU(s)"),
        (2, (0,), lambda: (_ for _ in ()).throw(ReplayUsageError("NCCL's library could not be loaded")), "NCCL's"),
    ],
)
def test_without_a_gpu_per_rank_or_nccl_received_bytes_are_put_in_place_saying_why(
    tmp_path, count, ordinals, nccl, why
):
    with replayfmt.open(write_sharded_step(tmp_path / "s.kreplay")) as cap:
        peers, note = local_peers(cap, 2, ordinals, gpu_count=lambda: count, nccl=nccl)
    assert peers is None and note.startswith(f"received bytes put in place (ranks 0, 1 of {COMM}: ") and why in note
    assert "\n" not in note


class DeviceNccl(FakeNccl):
    """The fake NCCL, with a handle per rank and what the process looked like at each init."""

    def unique_id(self) -> bytes:
        return b"\1" * 128

    def communicator(self, ranks: int, unique_id: bytes, rank: int) -> int:
        self.calls.append(("comm", ranks, rank, unique_id[:1], os.environ.get("NCCL_RUNTIME_CONNECT")))
        return 0xC0 + rank


def test_the_ranks_communicators_are_made_in_one_group_and_each_call_issued_on_its_own(monkeypatch):
    monkeypatch.setenv("NCCL_RUNTIME_CONNECT", "1")  # NCCL's default from 2.22, restored after the test
    nccl = DeviceNccl()
    peers = Peers({COMM: b"\1" * 128}, {}, {COMM: ((0, 11), (1, 12))})
    runtime = CollectiveRuntime(peers, nccl=lambda: nccl, use_device=lambda device: nccl.calls.append(("use", device)))
    rank0 = dataclasses.replace(SUM, index=4, communicator=COMM, rank=0)
    rank1 = dataclasses.replace(SUM, index=5, communicator=COMM, rank=1)
    runtime.issue(rank0, 0x10, 0x10, 0xA0, None, ())  # capture order: rank 0's call, then rank 1's
    runtime.issue(rank1, 0x20, 0x20, 0xA1, None, ())
    runtime.group(True)  # a group recorded on one device: still a group
    runtime.issue(dataclasses.replace(rank1, index=8), 0x20, 0x20, 0xA1, None, ())
    runtime.group(False)
    assert nccl.calls == [
        ("group", True),  # every rank's init waits for the others: one group, from one thread
        ("use", 11),
        ("comm", 2, 0, b"\1", "0"),  # connections made at init: no call waits for a later one
        ("use", 12),
        ("comm", 2, 1, b"\1", "0"),
        ("group", False),
        ("use", 11),  # the first call's device current again
        ("AllReduce", 0x10, 0x10, 0, 0xC0, 0xA0),
        ("AllReduce", 0x20, 0x20, 0, 0xC1, 0xA1),  # on rank 1's communicator and stream
        ("group", True),
        ("AllReduce", 0x20, 0x20, 0, 0xC1, 0xA1),
        ("group", False),
    ]
    assert runtime.issued == 3


def test_a_planted_reduction_in_one_capture_is_issued_by_every_rank_and_named_when_it_fails(tmp_path, monkeypatch):
    path = write_sharded_step(tmp_path / "s.kreplay")
    with replayfmt.open(path) as cap:
        calls = [op for op in cap.iter_operations() if isinstance(op, m.Collective)]
        buffers = [o.id for o in cap.objects() if isinstance(o, m.Buffer)]
    seen = {}

    def fake_verify(where, options, progress=None):
        seen["peers"] = options.peers
        ranges = [{"passed": False, "buffer": buffers[1], "offset": 0, "size": 256, "operation": 99}]
        return VerifyResult(
            where, Outcome.MISMATCH, detail="1 of 2 compared range(s) failed", report={"ranges": ranges}
        )

    monkeypatch.setattr(ranks_verb, "verify", fake_verify)
    monkeypatch.setattr(ranks_verb, "cuda_gpu_count", lambda: 2)
    planted = (PlantedReduction(calls[2].index, REDUCTIONS["max"]),)  # rank 0's second all-reduce
    result = verify_ranks([path], RanksOptions(VerifyOptions(), planted=planted), nccl=FakeNccl)
    # its counterpart in rank 1 (the second call on the communicator) is planted too
    assert seen["peers"].reductions == {calls[2].index: 2, calls[3].index: 2}
    (outcome,) = result.ranks
    assert outcome.capture.label == "ranks 0, 1" and result.collectives == 4 and result.exit_code == 1
    assert outcome.result.detail == (
        f"ranks 0, 1: 1 of 2 compared range(s) failed; the range was last written by collective operation "
        f"{calls[3].index} (AllReduce of rank 1)"
    )


def test_a_capture_of_one_rank_alone_is_not_a_job(tmp_path):
    from test_ranks import write_rank

    with pytest.raises(ReplayUsageError, match="needs the capture of every rank"):
        verify_ranks([write_rank(tmp_path / "r0.kreplay", 0)], RanksOptions(), nccl=FakeNccl)


class FailingInit(DeviceNccl):
    """Rank 1's init fails inside the group (rank 0's was queued)."""

    def communicator(self, ranks: int, unique_id: bytes, rank: int) -> int:
        if rank == 1:
            raise DeviceError("ncclCommInitRank: NCCL error 4: invalid argument")
        return super().communicator(ranks, unique_id, rank)

    def abort(self, communicator: int) -> None:
        self.calls.append(("abort", communicator))


def test_a_failed_init_in_the_group_aborts_those_made_and_never_ends_the_group():
    nccl = FailingInit()
    peers = Peers({COMM: b"\1" * 128}, {}, {COMM: ((0, 11), (1, 12))})
    runtime = CollectiveRuntime(peers, nccl=lambda: nccl, use_device=lambda device: None)
    with pytest.raises(DeviceError, match="ncclCommInitRank"):
        runtime.issue(dataclasses.replace(SUM, index=4, communicator=COMM, rank=0), 0x10, 0x10, 0xA0, None, ())
    assert nccl.calls[-1] == ("abort", 0xC0) and ("group", False) not in nccl.calls  # the end would wait for ever
    runtime.close()
    assert ("destroy", 0xC0) not in nccl.calls


def rewritten(path, tmp_path, change) -> str:
    """The sharded step with each collective changed by ``change``."""
    out = tmp_path / "changed.kreplay"
    with replayfmt.open(path) as cap, replayfmt.CaptureWriter(out) as w:
        for obj in cap.objects():
            w.add_object(obj)
        with w.scope("step"):
            for op in cap.iter_operations():
                if isinstance(op, m.Collective):
                    call = change(op)
                    w.collective(call, received=cap.read_payload(op.received) if call.recv_size else None)
    return str(out)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (lambda op: dataclasses.replace(op, ranks=4), f"{COMM} has 4 ranks; this capture holds 2"),
        (
            lambda op: dataclasses.replace(op, operation=m.CollectiveOperation.SEND, root=1 - op.rank),
            "is a send or receive among the devices of one process",
        ),
    ],
)
def test_ranks_that_cannot_be_issued_among_themselves_put_received_bytes_in_place_saying_why(tmp_path, change, why):
    path = rewritten(write_sharded_step(tmp_path / "s.kreplay"), tmp_path, change)
    with replayfmt.open(path) as cap:
        peers, note = local_peers(cap, 2, (0,), gpu_count=lambda: 2, nccl=FakeNccl)
    assert peers is None and note.startswith("received bytes put in place (ranks 0, 1 of ") and why in note
    assert "\n" not in note


def test_a_capture_without_collectives_is_not_read_again_for_peers(monkeypatch):
    from replayfmt.replay.options import ReplayOptions
    from replayfmt.verbs import verifying

    monkeypatch.setattr(verifying, "local_peers", lambda *a, **k: pytest.fail("its operations were scanned"))
    assert verifying.with_local_peers(object(), 2, ReplayOptions(), 0) == (ReplayOptions(), "")
