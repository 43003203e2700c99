"""A job's ranks replayed together (replayfmt.verbs.ranks, replayfmt.replay.collectives), on the CPU:
the captures of the ranks matched before any GPU work (every communicator held by as many captures
as it has ranks, each rank once), a planted reduction found in every rank, the collectives issued
among the peers through NCCL's entry points (a fake library here) or, replayed alone, what each
received put in place; a wrong range a collective wrote names it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import replayfmt
from replayfmt.errors import DeviceError, ReplayUsageError
from replayfmt.format import model as m
from replayfmt.replay.collectives import REDUCTIONS, CollectiveRuntime, Peers
from replayfmt.replay.plan import PlanOptions, build_plan
from replayfmt.replay.verify_types import Outcome, VerifyOptions, VerifyResult
from replayfmt.verbs.ranks import (
    PlantedReduction,
    RankCapture,
    _planted_by_rank,
    _with_suspects,
    read_ranks,
    verify_ranks,
)

SUM = m.Collective(0, m.CollectiveOperation.ALL_REDUCE, 7, 0, 0, 64, -1, 2, 0, "nccl-0x1")


def write_rank(
    path, rank: int, *, communicator: str = "nccl-0x1", ranks: int = 2, calls: int = 2, reduction: int = 0
) -> str:
    """A rank's capture: a gradient all-reduced ``calls`` times in place, then a gather."""
    grad = np.arange(64, dtype=np.float32) + rank
    metadata = m.CaptureMetadata(properties=(("rank", str(rank)), ("world_size", str(ranks))))
    with replayfmt.CaptureWriter(path, metadata=metadata) as w:
        dev = w.add_object(m.Device(name="NVIDIA H200", compute_capability=(9, 0)))
        buf = w.add_object(m.Buffer(size=1024, device=dev))
        gathered = w.add_object(m.Buffer(size=64 * 4 * ranks, device=dev))
        with w.scope("step"):
            w.state(buffer=buf, data=grad)
            for _ in range(calls):
                call = dataclasses.replace(SUM, rank=rank, ranks=ranks, communicator=communicator, reduction=reduction)
                call = dataclasses.replace(call, send_buffer=buf, recv_buffer=buf)
                w.collective(call, received=(grad * ranks).astype(np.float32))
            gather = m.Collective(0, m.CollectiveOperation.ALL_GATHER, 7, 0, 0, 64, -1, ranks, rank, communicator)
            gather = dataclasses.replace(gather, send_buffer=buf, recv_buffer=gathered)
            w.collective(gather, received=np.zeros(64 * ranks, np.float32))
            w.checkpoint({buf: grad}, name="step")
    return str(path)


def test_a_collective_round_trips_with_its_sizes(tmp_path):
    path = write_rank(tmp_path / "r0.kreplay", 0)
    with replayfmt.open(path) as cap:
        calls = [op for op in cap.iter_operations() if isinstance(op, m.Collective)]
        assert [c.operation.label for c in calls] == ["AllReduce", "AllReduce", "AllGather"]
        assert (calls[0].send_size, calls[0].recv_size) == (256, 256)
        assert (calls[2].send_size, calls[2].recv_size) == (256, 512)  # a count per rank, from 2 ranks
        assert len(cap.read_payload(calls[2].received)) == 512
        plan = build_plan(cap, PlanOptions())
        assert not plan.problems and ("payload", calls[0].received, 0) in plan.uploads


def test_the_writer_refuses_received_bytes_of_another_size(tmp_path):
    call = dataclasses.replace(SUM, send_buffer=1, recv_buffer=1)
    with (
        replayfmt.CaptureWriter(tmp_path / "c.kreplay") as w,
        pytest.raises(ReplayUsageError, match="3 bytes received"),
    ):
        w.collective(call, received=b"abc")


def test_a_plan_refuses_a_collective_it_cannot_issue(tmp_path):
    with replayfmt.CaptureWriter(tmp_path / "c.kreplay") as w:
        dev = w.add_object(m.Device(name="gpu", compute_capability=(9, 0)))
        buf = w.add_object(m.Buffer(size=128, device=dev))
        w.collective(dataclasses.replace(SUM, send_buffer=buf, recv_buffer=buf, rank=2), received=bytes(256))
        w.collective(dataclasses.replace(SUM, send_buffer=buf, recv_buffer=buf), received=bytes(256))
    with replayfmt.open(tmp_path / "c.kreplay") as cap:
        problems = build_plan(cap, PlanOptions(continue_on_error=True)).problems
    assert any("rank 2 of a communicator of 2" in p for p in problems)
    assert any("send range [0, 256) lies outside buffer 2 (128 bytes)" in p for p in problems)


def test_the_ranks_of_a_job_are_matched_before_any_replay(tmp_path):
    paths = [write_rank(tmp_path / f"r{k}.kreplay", k) for k in (0, 1)]
    ranks = read_ranks(paths, VerifyOptions())
    assert [r.rank for r in ranks] == [0, 1] and ranks[1].communicators == {"nccl-0x1": (1, 2)}
    assert len(ranks[0].collectives) == 3 and ranks[0].devices == 1
    with pytest.raises(ReplayUsageError, match=r"has 2 ranks, but the captures given hold 1 of them \(missing rank"):
        read_ranks([paths[0], write_rank(tmp_path / "other.kreplay", 1, communicator="nccl-0x2")], VerifyOptions())
    with pytest.raises(ReplayUsageError, match="two of the captures given are rank 0"):
        read_ranks([paths[0], paths[0]], VerifyOptions())
    with pytest.raises(ReplayUsageError, match="needs the capture of every rank"):
        verify_ranks(paths[:1])
    premul = write_rank(tmp_path / "premul.kreplay", 1, reduction=5)
    with pytest.raises(ReplayUsageError, match="reduces with NCCL operation 5, one the program made"):
        read_ranks([paths[0], premul], VerifyOptions())


def test_a_planted_reduction_is_found_in_every_rank_by_its_place():
    first = RankCapture("a", 0, 1, {}, ((3, "c1"), (7, "c2"), (9, "c1")))
    second = RankCapture("b", 1, 1, {}, ((4, "c1"), (5, "c2"), (12, "c1")))
    planted = _planted_by_rank([first, second], [PlantedReduction(9, REDUCTIONS["max"])])
    assert planted == [{9: 2}, {12: 2}]  # the second call on c1 in each rank
    with pytest.raises(ReplayUsageError, match="operation 8 of a is no collective"):
        _planted_by_rank([first, second], [PlantedReduction(8, 2)])


class FakeNccl:
    """NCCL's entry points as the runtime calls them, recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.fail = 0

    def unique_id(self) -> bytes:
        return bytes(128)

    def communicator(self, ranks: int, unique_id: bytes, rank: int) -> int:
        self.calls.append(("comm", ranks, rank))
        return 0xC0

    def group(self, start: bool) -> None:
        self.calls.append(("group", start))

    def issue(self, op, send, recv, reduction, communicator, stream) -> int:
        self.calls.append((op.operation.label, send, recv, reduction, communicator, stream))
        return self.fail

    def check(self, result: int, what: str) -> None:
        if result:
            raise DeviceError(f"{what}: NCCL error {result}")

    def destroy(self, communicator: int) -> None:
        self.calls.append(("destroy", communicator))


def test_among_the_peers_each_call_is_issued_on_a_communicator_made_once():
    nccl = FakeNccl()
    runtime = CollectiveRuntime(Peers({"nccl-0x1": bytes(128)}, {5: REDUCTIONS["max"]}), nccl=lambda: nccl)
    call = dataclasses.replace(SUM, index=4, send_buffer=1, recv_buffer=1)
    assert runtime.issue(call, 0x1000, 0x1000, 0x5EED, None, ()) is None
    runtime.group(True)
    runtime.issue(dataclasses.replace(call, index=5), 0x1000, 0x2000, 0x5EED, None, ())
    runtime.group(False)
    runtime.close()
    assert nccl.calls == [
        ("comm", 2, 0),
        ("AllReduce", 0x1000, 0x1000, 0, 0xC0, 0x5EED),
        ("group", True),
        ("AllReduce", 0x1000, 0x2000, 2, 0xC0, 0x5EED),  # the planted reduction
        ("group", False),
        ("destroy", 0xC0),
    ]
    assert runtime.issued == 2
    nccl.fail = 5
    with pytest.raises(DeviceError, match=r"operation 4 \(AllReduce of 64 elements .* rank 0 of 2\): NCCL error 5"):
        runtime.issue(call, 0x1000, 0x1000, 0, None, ())


def test_alone_or_in_the_verifications_own_replays_what_each_received_is_put_in_place():
    uploads = []
    runtime = CollectiveRuntime(None, nccl=lambda: pytest.fail("no NCCL when alone"))
    assert not runtime.live
    assert runtime.issue(SUM, 1, 2, 3, lambda *args: uploads.append(args) or (0,), (2, 0xAB, 256, 3)) == (0,)
    runtime.group(True)  # no group alone
    assert uploads == [(2, 0xAB, 256, 3)]
    peers = CollectiveRuntime(Peers({}), nccl=lambda: pytest.fail("not while off"))
    peers.live = False  # what the verify verb does before a rank's own poisoned replays
    peers.issue(SUM, 1, 2, 3, None, ())
    with pytest.raises(ReplayUsageError, match="communicator nccl-0x1 is in none of the other captures given"):
        CollectiveRuntime(Peers({}), nccl=FakeNccl).issue(SUM, 1, 2, 3, None, ())


def test_a_wrong_range_a_collective_wrote_names_the_rank_and_the_collective():
    capture = RankCapture("a", 1, 1, {}, ((5, "c"),), ((5, 2, 0, 256, "AllReduce"), (9, 3, 0, 64, "AllGather")))
    ranges = [{"passed": True, "buffer": 3, "offset": 0, "size": 64, "operation": 20}]
    ranges.append({"passed": False, "buffer": 2, "offset": 128, "size": 512, "operation": 20})
    wrong = VerifyResult("a", Outcome.MISMATCH, detail="1 of 2 compared range(s) failed", report={"ranges": ranges})
    named = _with_suspects(capture, wrong)
    assert named.detail == (
        "rank 1: 1 of 2 compared range(s) failed; the range was last written by collective operation 5 (AllReduce)"
    )
    assert _with_suspects(capture, VerifyResult("a", Outcome.VERIFIED)).detail == ""


def test_a_format_1_4_file_means_what_it_meant(tmp_path):
    """A 1.4 file (the sample as 1.4 wrote it) reads as today's sample without its collective."""
    from pathlib import Path

    from samples import write_sample

    write_sample(tmp_path / "now.kreplay", n=64)
    golden = Path(__file__).parent / "golden" / "sample-1.4.kreplay"
    with replayfmt.open(golden) as old, replayfmt.open(tmp_path / "now.kreplay") as now:
        assert (old.header.minor, now.header.minor) == (4, replayfmt.FORMAT_MINOR)
        kinds = [op.kind for op in now.iter_operations() if op.kind != m.OperationKind.COLLECTIVE]
        assert [op.kind for op in old.iter_operations()] == kinds
        assert build_plan(old, PlanOptions(continue_on_error=True)).state


def test_an_nccl_unique_id_keeps_every_byte_across_processes():
    """The id is a socket address and more: NUL bytes inside it must survive the trip (a c_char
    array would cut it at the first; ncclCommInitRank then fails with a network error)."""
    from replayfmt.replay.collectives import UNIQUE_ID_BYTES, _UniqueId

    data = bytes([2, 0, 0x9C, 0x41, 0, 0, 0, 0, *range(UNIQUE_ID_BYTES - 8)])
    assert _UniqueId.of(data).data() == data
    with pytest.raises(ReplayUsageError, match="128 bytes, not 3"):
        _UniqueId.of(b"abc")
