"""Bounded snapshots (issue 16, item 3): the range arithmetic, the framework views (PyTorch's
memory_snapshot format, JAX-like views without managed ranges), the per-step cache, and the
translator's state and checkpoints over live ranges only, on a fake device (no GPU)."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, strategies as st
from test_capture_translate import FakeMemory

import replayfmt
from replayfmt.capture import RecordOptions, Translator, events as ev
from replayfmt.capture.hostfiles import HostFiles
from replayfmt.capture.live_buffers import (
    ByteRange,
    LiveBuffers,
    LiveRanges,
    LiveView,
    TorchCachingAllocator,
    clip,
    may_hold_addresses,
    merge,
    torch_view,
    widen,
)
from replayfmt.cuda.driver import CudaCallError
from replayfmt.errors import ReplayError
from replayfmt.format import model as m
from replayfmt.replay.plan import PlanOptions, build_plan
from replayfmt.writer import CaptureWriter

ARENA = 0x7F10_0000_0000
MiB = 1 << 20


def test_merge_sorts_joins_overlaps_and_near_neighbours():
    ranges = [ByteRange(300, 400), ByteRange(0, 100), ByteRange(50, 120), ByteRange(130, 200), ByteRange(5, 5)]
    assert merge(ranges) == [ByteRange(0, 120), ByteRange(130, 200), ByteRange(300, 400)]
    assert merge(ranges, gap=10) == [ByteRange(0, 200), ByteRange(300, 400)]
    assert merge(ranges, gap=100) == [ByteRange(0, 400)]


def test_clip_and_widen():
    ranges = [ByteRange(0, 100), ByteRange(200, 300), ByteRange(400, 500)]
    assert clip(ranges, 50, 450) == [ByteRange(50, 100), ByteRange(200, 300), ByteRange(400, 450)]
    assert clip(ranges, 100, 200) == []
    assert widen(ByteRange(300, 513)) == ByteRange(256, 768)
    assert widen(ByteRange(512, 768)) == ByteRange(512, 768)


@given(st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 500)), max_size=30), st.integers(0, 64))
def test_merge_covers_exactly_the_same_bytes(pairs, gap):
    ranges = [ByteRange(a, a + n) for a, n in pairs]
    merged = merge(ranges, gap)
    assert all(a.stop + gap < b.start for a, b in itertools.pairwise(merged))  # disjoint, apart
    covered = {i for r in ranges for i in range(r.start, r.stop)}
    in_merged = {i for r in merged for i in range(r.start, r.stop)}
    assert covered <= in_merged
    if gap == 0:
        assert covered == in_merged


def torch_segments() -> list[dict]:
    """Two segments as torch.cuda.memory_snapshot() gives them (keys it has, frames left out)."""
    return [
        {
            "device": 0,
            "address": ARENA,
            "total_size": 256 * MiB,
            "segment_type": "large",
            "blocks": [
                {"address": ARENA, "size": 64 * MiB, "requested_size": 64 * MiB, "state": "active_allocated"},
                {"address": ARENA + 64 * MiB, "size": 192 * MiB, "requested_size": 0, "state": "inactive"},
            ],
        },
        {
            "device": 0,
            "address": ARENA + 512 * MiB,
            "total_size": 2 * MiB,
            "segment_type": "small",
            "blocks": [
                {"address": ARENA + 512 * MiB, "size": 512, "requested_size": 4, "state": "active_pending_free"},
                {"address": ARENA + 512 * MiB + 512, "size": 2 * MiB - 512, "requested_size": 0, "state": "inactive"},
            ],
        },
    ]


def test_torch_view_takes_active_blocks_and_manages_every_segment():
    view = torch_view(torch_segments())
    assert view.source == "torch"
    assert view.live == (ByteRange(ARENA, ARENA + 64 * MiB), ByteRange(ARENA + 512 * MiB, ARENA + 512 * MiB + 512))
    assert view.managed == (ByteRange(ARENA, ARENA + 256 * MiB), ByteRange(ARENA + 512 * MiB, ARENA + 514 * MiB))
    assert view.speaks_for(ARENA + 100 * MiB, ARENA + 101 * MiB)  # free bytes of a segment: torch's
    assert not view.speaks_for(ARENA + 300 * MiB, ARENA + 400 * MiB)  # between segments: nobody's


def test_torch_view_leaves_expandable_segments_whole():
    marked = torch_segments()
    marked[0]["is_expandable"] = True
    view = torch_view(marked)
    assert view.managed == (ByteRange(ARENA + 512 * MiB, ARENA + 514 * MiB),)
    assert not view.speaks_for(ARENA, ARENA + 256 * MiB)  # snapshotted whole, as before bounding
    assert torch_view(torch_segments(), expandable=True) == LiveView("torch", (), ())


def test_torch_source_is_silent_where_the_program_did_not_import_torch(monkeypatch):
    import sys

    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert TorchCachingAllocator().view() is None


class FakeSource:
    """A framework whose live buffers the test sets; counts how often it was asked."""

    def __init__(self, name: str = "fake", live=(), managed=()) -> None:
        self.name, self.live, self.managed = name, list(live), list(managed)
        self.calls = 0

    def view(self) -> LiveView | None:
        self.calls += 1
        return LiveView(self.name, tuple(merge(self.live)), tuple(merge(self.managed)))


class BrokenSource:
    name = "broken"

    def view(self) -> LiveView | None:
        raise AttributeError("module 'jax' has no attribute 'live_arrays'")


def test_ranges_are_asked_once_per_step_for_large_allocations_only():
    source = FakeSource(live=[ByteRange(ARENA + 1000, ARENA + 3000), ByteRange(ARENA + 3100, ARENA + 5000)])
    live = LiveBuffers([source], min_size=64 * 1024, gap=0)
    assert live.ranges(ARENA, 4096, step=1) is None and source.calls == 0  # small: whole, nothing asked
    first = live.ranges(ARENA, MiB, step=1)
    assert first is not None and first.source == "fake"
    assert first.ranges == [ByteRange(ARENA + 768, ARENA + 5120)]  # widened to 256 bytes, then joined
    assert live.ranges(ARENA, MiB, step=1) == first and source.calls == 1  # cached within the step
    source.live = []
    assert live.ranges(ARENA, MiB, step=2) is None and source.calls == 2  # no live buffer inside: not its memory
    assert live.queries == 2


def test_a_source_that_fails_is_dropped_and_reported():
    good = FakeSource(live=[ByteRange(ARENA, ARENA + 4096)])
    live = LiveBuffers([BrokenSource(), good], min_size=0)
    assert live.ranges(ARENA, MiB, step=1).ranges == [ByteRange(ARENA, ARENA + 4096)]
    assert live.problems == ["broken live buffers: AttributeError: module 'jax' has no attribute 'live_arrays'"]
    assert [s.name for s in live.sources] == ["fake"]


def record(tmp_path: Path, events, memory: FakeMemory, live: LiveBuffers | None, options=RecordOptions()):
    path = tmp_path / "c.kreplay"
    with CaptureWriter(path) as writer:
        t = Translator(writer, options, memory, host_files=HostFiles(tmp_path / "no-maps"), live_buffers=live)
        t.start("step")
        for e in events:
            t.handle(e() if callable(e) else e)
        t.stop()
    return path, t


def arena_memory(size: int = 4 * MiB) -> FakeMemory:
    memory = FakeMemory()
    memory.device[ARENA] = bytearray((i * 7 + 3) % 251 for i in range(size))
    return memory


def test_state_and_checkpoints_cover_live_buffers_only(tmp_path):
    memory = arena_memory()
    source = FakeSource(
        "jax", live=[ByteRange(ARENA + MiB, ARENA + MiB + 8192), ByteRange(ARENA + 3 * MiB, ARENA + 3 * MiB + 1000)]
    )
    live = LiveBuffers([source], min_size=MiB, gap=0)

    def write_output():  # the step writes its output into a buffer it did not read
        memory.device[ARENA][3 * MiB : 3 * MiB + 16] = b"\xff" * 16
        return ev.StreamSynchronized(0)

    events = [
        ev.Allocation(ARENA, 4 * MiB, call="cuMemAlloc_v2"),
        ev.Memset(ARENA + MiB + 64, 0, 4, 16),  # a partial write: the first touch snapshots the arena
        write_output,
    ]
    path, t = record(tmp_path, events, memory, live)
    assert not t.report.errors
    spans = [(MiB, 8192), (3 * MiB, 1024)]  # the state: live buffers widened to 256 bytes
    exact = [(MiB, 8192), (3 * MiB, 1000)]  # the checkpoint: the buffers' own bytes
    assert t.report.snapshot_bytes == sum(size for _, size in spans + exact)  # state, then the checkpoint
    assert t.report.skipped_bytes == 2 * 4 * MiB - sum(size for _, size in spans + exact)
    assert t.report.live_sources == {"jax"}
    assert "snapshots skipped 8370200 bytes outside live buffers (jax)" in "\n".join(t.report.lines())
    assert source.calls == 2  # once for the region's state, once for its checkpoint
    with replayfmt.open(path) as cap:
        ops = list(cap.iter_operations())
        states = [op for op in ops if op.kind == m.OperationKind.STATE]
        assert [(s.offset, s.size) for s in states] == spans
        original = bytes(arena_memory().device[ARENA])
        for state in states:
            assert cap.read_payload(state.payload) == original[state.offset : state.offset + state.size]
        checkpoint = next(op for op in ops if op.kind == m.OperationKind.CHECKPOINT)
        assert [(e.offset, e.size) for e in checkpoint.entries] == exact
        after = cap.read_payload(checkpoint.entries[1].payload)
        assert after[:16] == b"\xff" * 16 and after[16:] == original[3 * MiB + 16 : 3 * MiB + 1000]
        build_plan(cap, PlanOptions())  # replayable


def test_small_or_undescribed_allocations_are_snapshotted_whole(tmp_path):
    memory = arena_memory()
    live = LiveBuffers(
        [FakeSource("torch", live=[], managed=[ByteRange(ARENA + 8 * MiB, ARENA + 9 * MiB)])], min_size=0
    )
    path, t = record(tmp_path, [ev.Allocation(ARENA, 4 * MiB), ev.Memset(ARENA + 64, 0, 4, 16)], memory, live)
    assert t.report.skipped_bytes == 0 and t.report.snapshot_bytes == 2 * 4 * MiB
    with replayfmt.open(path) as cap:
        assert [(s.offset, s.size) for s in cap.iter_operations() if s.kind == m.OperationKind.STATE] == [(0, 4 * MiB)]


def test_whole_allocations_option_ignores_the_frameworks(tmp_path):
    source = FakeSource(live=[ByteRange(ARENA, ARENA + 4096)])
    options = RecordOptions(live_buffers=False)
    _, t = record(
        tmp_path,
        [ev.Allocation(ARENA, 4 * MiB), ev.Memset(ARENA + 64, 0, 4, 16)],
        arena_memory(),
        LiveBuffers([source], min_size=0),
        options,
    )
    assert t.report.snapshot_bytes == 2 * 4 * MiB and source.calls == 0


def test_a_snapshot_over_the_bound_with_no_view_is_refused_never_attempted(tmp_path):
    memory = arena_memory()
    options = RecordOptions(max_snapshot=MiB)
    events = [ev.Allocation(ARENA, 4 * MiB), ev.Memset(ARENA + 64, 0, 4, 16)]
    path, t = record(tmp_path, events, memory, LiveBuffers([], min_size=0), options)
    assert memory.reads == [] and t.report.snapshot_bytes == 0  # nothing read from the device
    reason = (
        f"buffer 2 (4194304 bytes at {ARENA:#x}, cuMemAlloc_v2) is larger than --max-snapshot-gib=0.000976562 "
        "and no framework says which of its bytes are live; raise --max-snapshot-gib"
    )
    assert t.report.unsupported == {"snapshot": 1} and t.report.errors == [reason]
    with replayfmt.open(path) as cap:
        refused = [op for op in cap.iter_operations() if op.kind == m.OperationKind.UNSUPPORTED]
        assert [(op.call, op.reason) for op in refused] == [("snapshot", reason)]
        with pytest.raises(ReplayError, match="snapshot"):
            build_plan(cap, PlanOptions())


def test_max_snapshot_must_not_be_negative():
    with pytest.raises(ReplayError, match="max_snapshot must be >= 0, not -1"):
        RecordOptions(max_snapshot=-1)


def test_frameworks_sharing_an_allocation_each_keep_their_live_buffers():
    torch = FakeSource("torch", live=[ByteRange(ARENA, ARENA + 4096)], managed=[ByteRange(ARENA, ARENA + 64 * MiB)])
    jax = FakeSource("jax", live=[ByteRange(ARENA + 8 * MiB, ARENA + 8 * MiB + 512)])  # imported through DLPack
    ranges = LiveBuffers([jax, torch], min_size=0, gap=0).ranges(ARENA, 64 * MiB, step=1)
    assert ranges.source == "jax+torch"
    assert ranges.ranges == [ByteRange(ARENA, ARENA + 4096), ByteRange(ARENA + 8 * MiB, ARENA + 8 * MiB + 512)]


class DonatingSource(FakeSource):
    """JAX as a donating step sees it: asked at the region's start, then after the step deleted
    the arrays it donated (``after``), with its arena known by size."""

    donates = True

    def __init__(self, live, after, arena_sizes=()) -> None:
        super().__init__("jax", live)
        self.after, self.arena_sizes = list(after), tuple(arena_sizes)

    def view(self) -> LiveView | None:
        self.calls += 1
        live = self.live if self.calls == 1 else self.after
        return LiveView(self.name, tuple(merge(live)), arena_sizes=self.arena_sizes)


def test_an_arena_known_by_size_speaks_before_any_array_lives_in_it():
    """A region that starts with the program (no --scope): XLA's arena holds no array yet, and its
    size says it is JAX's, so nothing of it is snapshotted rather than all of it refused."""
    jax = DonatingSource([], [], arena_sizes=[(4 * MiB - 64, 4 * MiB + 64)])
    live = LiveBuffers([jax], min_size=0)
    assert live.ranges(ARENA, 4 * MiB, step=1) == LiveRanges("jax", [])
    assert live.ranges(ARENA, 8 * MiB, step=1) is None  # another size, no array inside: not JAX's


def test_buffers_donated_by_the_step_count_from_the_regions_start(tmp_path):
    """The step deletes what it donates before its kernels run: the view held at the region's start
    keeps those bytes in the state (they are what the step reads)."""
    memory = arena_memory()
    donated, kept = ByteRange(ARENA + MiB, ARENA + MiB + 4096), ByteRange(ARENA + 2 * MiB, ARENA + 2 * MiB + 512)
    jax = DonatingSource([donated, kept], [kept])
    events = [ev.Allocation(ARENA, 4 * MiB, call="cuMemMap"), ev.Memset(ARENA + 3 * MiB, 0, 4, 16)]
    path, t = record(tmp_path, events, memory, LiveBuffers([jax], min_size=MiB, gap=0))
    assert not t.report.errors
    with replayfmt.open(path) as cap:
        states = [op for op in cap.iter_operations() if op.kind == m.OperationKind.STATE]
        assert [(s.offset, s.size) for s in states] == [(MiB, 4096), (2 * MiB, 512)]


class RefusingMemory(FakeMemory):
    """A device whose copies of one range fail, as cuMemcpyDtoHAsync answers for memory that is not
    (or no longer) mapped."""

    def snapshot(self, address: int, size: int, stream, writer, *, frames=None) -> int:
        if address == ARENA:
            raise CudaCallError(
                "cuMemcpyDtoHAsync (snapshot) failed: CUDA_ERROR_INVALID_VALUE", "CUDA_ERROR_INVALID_VALUE"
            )
        return super().snapshot(address, size, stream, writer, frames=frames)


def test_a_refused_snapshot_names_the_buffer_and_the_capture_refuses_to_replay(tmp_path):
    memory = RefusingMemory()
    memory.device[ARENA] = bytearray(4096)
    events = [ev.Allocation(ARENA, 4096, call="cuMemAlloc_v2"), ev.Memset(ARENA + 64, 0, 4, 16)]
    path, t = record(tmp_path, events, memory, LiveBuffers([], min_size=MiB))
    reason = (
        f"snapshot of buffer 2 failed: 4096 bytes at offset 0 of 4096 bytes at {ARENA:#x} (cuMemAlloc_v2): "
        "cuMemcpyDtoHAsync (snapshot) failed: CUDA_ERROR_INVALID_VALUE"
    )
    assert t.report.errors[0] == reason and t.report.unsupported == {"snapshot": 1}
    with replayfmt.open(path) as cap, pytest.raises(ReplayError, match="snapshot of buffer 2 failed"):
        build_plan(cap, PlanOptions())


class PaddedSource(FakeSource):
    """A framework whose buffers are padded by its allocator (XLA rounds each to 256 bytes)."""

    def __init__(self, exact) -> None:
        super().__init__("jax", [widen(r) for r in exact])
        self.exact = list(exact)

    def view(self) -> LiveView | None:
        self.calls += 1
        return LiveView(self.name, tuple(merge(self.live)), exact=tuple(merge(self.exact)))


@pytest.mark.parametrize("inside", [False, True])
def test_stored_addresses_are_looked_for_in_the_buffers_own_bytes_only(tmp_path, inside):
    """Padding after a scalar holds what earlier work left (a pointer table of another step): it is
    state, but no sign that the step reads stored addresses; inside the buffer it is one."""
    memory = arena_memory()
    other = ARENA + 8 * MiB
    memory.device[other] = bytearray(4096)
    scalar = ARENA + MiB
    where = MiB + (0 if inside else 64)
    memory.device[ARENA][where : where + 8] = other.to_bytes(8, "little")
    source = PaddedSource([ByteRange(scalar, scalar + (16 if inside else 4))])
    events = [ev.Allocation(ARENA, 4 * MiB), ev.Allocation(other, 4096), ev.Memset(ARENA + 3 * MiB, 0, 4, 16)]
    path, t = record(tmp_path, events, memory, LiveBuffers([source], min_size=MiB, gap=0))
    assert bool(t.report.stored_pointers or t.report.ambiguous_pointers) == inside
    with replayfmt.open(path) as cap:
        ops = list(cap.iter_operations())
        assert next((s.offset, s.size) for s in ops if s.kind == m.OperationKind.STATE) == (MiB, 256)
        checkpoint = next(op for op in ops if op.kind == m.OperationKind.CHECKPOINT)
        assert next((e.offset, e.size) for e in checkpoint.entries) == (MiB, 16 if inside else 4)


class TypedSource(FakeSource):
    """JAX's view with dtypes: only the buffers in ``wide`` are of a type that can hold addresses."""

    def __init__(self, exact, wide) -> None:
        super().__init__("jax", exact)
        self.wide = list(wide)

    def view(self) -> LiveView | None:
        self.calls += 1
        live = tuple(merge(self.live))
        return LiveView(self.name, live, exact=live, addresses=tuple(merge(self.wide)))


@pytest.mark.parametrize("wide", [False, True])
def test_an_int32_arrays_pairs_are_no_stored_addresses(tmp_path, wide):
    """Labels (5, 6) as two int32s read 0x500000006: inside an arena at a low address, yet no
    address; a 64-bit integer array holding the same word may be a pointer table."""
    memory = FakeMemory()
    low = 0x3_0000_0000
    memory.device[low] = bytearray(4 * MiB)
    memory.device[low][MiB : MiB + 8] = np.array([6, 5], np.int32).tobytes()
    labels = ByteRange(low + MiB, low + MiB + 4096)
    source = TypedSource([labels], [labels] if wide else [])
    events = [ev.Allocation(low, 4 * MiB), ev.Allocation(0x5_0000_0000, 4096), ev.Memset(low + 3 * MiB, 0, 4, 4)]
    _, t = record(tmp_path, events, memory, LiveBuffers([source], min_size=MiB, gap=0))
    assert bool(t.report.stored_pointers or t.report.ambiguous_pointers) == wide


def test_which_dtypes_can_hold_addresses():
    assert [may_hold_addresses(np.dtype(d)) for d in ("int32", "float64", "uint64", "int64", "V8", "float16")] == [
        False,
        False,
        True,
        True,
        True,
        False,
    ]


def test_an_output_that_fills_its_segment_is_compared(tmp_path):
    """Issue 44: a compiled step's 16 MiB output in a 16 MiB segment of its own (PyTorch's caching
    allocator) was not compared: no tensor lived there when the step began (the state is none of
    it), and at the step's end its one live block covers the whole segment, which the checkpoint
    took for a framework that no longer speaks for the memory, and so compared what the state
    held: nothing."""
    memory = arena_memory()
    segment = ByteRange(ARENA, ARENA + 4 * MiB)
    source = FakeSource("torch", live=[], managed=[segment])
    live = LiveBuffers([source], min_size=MiB, gap=0)

    def compiled_step():  # the output is allocated (the whole segment) and written by the last kernel
        source.live = [segment]
        memory.device[ARENA][:] = bytes(range(256)) * (4 * MiB // 256)
        return ev.StreamSynchronized(0)

    events = [ev.Allocation(ARENA, 4 * MiB), ev.Memset(ARENA + 64, 0, 4, 16), compiled_step]
    path, t = record(tmp_path, events, memory, live)
    assert not t.report.errors
    with replayfmt.open(path) as cap:
        ops = list(cap.iter_operations())
        assert not [op for op in ops if op.kind == m.OperationKind.STATE]  # nothing of it was live at the start
        checkpoint = next(op for op in ops if op.kind == m.OperationKind.CHECKPOINT)
        assert [(e.offset, e.size) for e in checkpoint.entries] == [(0, 4 * MiB)]
        assert cap.read_payload(checkpoint.entries[0].payload) == bytes(memory.device[ARENA])


def test_memory_no_framework_speaks_for_any_more_is_compared_where_its_state_was_set(tmp_path):
    """The other side of the rule above: a framework that bounded the state and no longer speaks
    for the memory at the checkpoint (expandable segments released): only the state's ranges."""
    memory = arena_memory()
    source = FakeSource("torch", live=[ByteRange(ARENA + MiB, ARENA + MiB + 4096)], managed=[])

    def released():
        source.live = []  # no live buffer inside: the framework does not speak for it now
        return ev.StreamSynchronized(0)

    live = LiveBuffers([source], min_size=MiB, gap=0)
    path, _ = record(
        tmp_path, [ev.Allocation(ARENA, 4 * MiB), ev.Memset(ARENA + MiB + 64, 0, 4, 16), released], memory, live
    )
    with replayfmt.open(path) as cap:
        checkpoint = next(op for op in cap.iter_operations() if op.kind == m.OperationKind.CHECKPOINT)
        assert [(e.offset, e.size) for e in checkpoint.entries] == [(MiB, 4096)]
