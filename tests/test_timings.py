"""Timing without a GPU: CUPTI activity records parsed from bytes, the original's times in the
file (TIMINGS chunk), JSONL original_ns, the recorder's binding, benchmark's side-by-side text."""

import json
import struct

import numpy as np
import pytest
from samples import SAXPY

import replayfmt
from replayfmt.capture import events as ev
from replayfmt.capture.original_times import OriginalTimes, graph_times, operation_times, runtime_call_times
from replayfmt.capture.report import Report
from replayfmt.cuda.activity import RECORD_SIZES, ActivityBatch, ActivityKind, ActivityRecord, parse_records
from replayfmt.dump import Dumper
from replayfmt.format import model as m
from replayfmt.format.layout import ChunkFlags, ChunkKind, unpack_chunk_header
from replayfmt.format.timings import OperationTime, OriginalTimes as Times, busy_ns
from replayfmt.measure import kernel_times as kt
from replayfmt.measure.benchmark import BenchmarkResult, KernelTiming, Stats
from replayfmt_tools.benchmark_replay import _text

# -- CUPTI activity records, built at the offsets of CUPTI 13's structs -----------------------


def kernel_record(start, end, correlation, name_ptr, *, device=0, stream=7, node=0) -> bytes:
    b = bytearray(RECORD_SIZES[ActivityKind.CONCURRENT_KERNEL])
    struct.pack_into("<I", b, 0, ActivityKind.CONCURRENT_KERNEL)
    struct.pack_into("<QQ", b, 16, start, end)
    struct.pack_into("<III", b, 40, device, 1, stream)
    struct.pack_into("<I", b, 92, correlation)
    struct.pack_into("<Q", b, 104, name_ptr)
    struct.pack_into("<Q", b, 144, node)
    return bytes(b)


def copy_record(kind, start, end, correlation, *, size=4096, copy_kind=1, stream=7) -> bytes:
    b = bytearray(RECORD_SIZES[kind])
    struct.pack_into("<I", b, 0, kind)
    if kind == ActivityKind.MEMCPY:
        struct.pack_into("<B", b, 4, copy_kind)
    struct.pack_into("<QQQ", b, 8, size, start, end)
    struct.pack_into("<IIII", b, 32, 0, 1, stream, correlation)
    return bytes(b)


def external_record(kind, external_id, correlation) -> bytes:
    return struct.pack("<IIQII", ActivityKind.EXTERNAL_CORRELATION, kind, external_id, correlation, 0)


def buffer_of(*records: bytes) -> tuple[bytes, list[int]]:
    offsets, at = [], 0
    for r in records:
        offsets.append(at)
        at += len(r)
    return b"".join(records), offsets


def test_parse_records_reads_kernels_copies_memsets_and_external_ids():
    names = {0x1000: "softmax_kernel", 0x2000: "gemm"}
    looked_up = []

    def name_at(ptr):
        looked_up.append(ptr)
        return names[ptr]

    data, offsets = buffer_of(
        external_record(3, 5, 41),
        kernel_record(1_000, 3_000, 41, 0x1000, node=9),
        copy_record(ActivityKind.MEMCPY, 3_500, 4_000, 42, size=256, copy_kind=8),
        copy_record(ActivityKind.MEMSET, 4_000, 4_200, 43, size=64),
        struct.pack("<I", ActivityKind.DRIVER) + bytes(36),  # other kinds are skipped
        kernel_record(5_000, 5_500, 44, 0x1000),
        kernel_record(6_000, 7_000, 45, 0x2000),
    )
    batch = parse_records(data, offsets, name_at)
    assert batch.records == [
        ActivityRecord(ActivityKind.CONCURRENT_KERNEL, "softmax_kernel", 1_000, 3_000, 0, 7, 41, 9),
        ActivityRecord(ActivityKind.MEMCPY, "memcpy DtoD", 3_500, 4_000, 0, 7, 42, 0, 256),
        ActivityRecord(ActivityKind.MEMSET, "memset", 4_000, 4_200, 0, 7, 43, 0, 64),
        ActivityRecord(ActivityKind.CONCURRENT_KERNEL, "softmax_kernel", 5_000, 5_500, 0, 7, 44, 0),
        ActivityRecord(ActivityKind.CONCURRENT_KERNEL, "gemm", 6_000, 7_000, 0, 7, 45, 0),
    ]
    assert looked_up == [0x1000, 0x2000]  # one look-up per name pointer
    assert batch.external_id(kt.ExternalKind.CUSTOM0, 41) == 5 and batch.records[0].duration_ns == 2_000


def test_busy_time_is_the_union_of_intervals():
    assert busy_ns([]) == 0
    assert busy_ns([(0, 10), (5, 15), (20, 30), (21, 22)]) == 25
    assert busy_ns([(100, 200), (0, 50)]) == 150


def test_records_are_attributed_to_iterations_and_operations():
    rec = ActivityRecord
    k = ActivityKind.CONCURRENT_KERNEL
    batch = ActivityBatch(
        records=[
            rec(k, "a", 0, 10, 0, 1, 1),
            rec(k, "b", 5, 20, 0, 2, 2),
            rec(k, "c", 30, 40, 0, 1, 3),
            rec(k, "restore", 0, 100, 0, 1, 4),
        ],
        external={kt.ExternalKind.CUSTOM0: {1: 1, 2: 1, 3: 2}, kt.ExternalKind.CUSTOM1: {1: 10, 2: 11, 3: 10}},
    )
    into: dict[int, kt.IterationTimes] = {}
    kt.attribute(batch, into)
    assert into[1].busy_ns == 20 and into[1].span_ns == 20 and into[1].operations == {10: (0, 10), 11: (5, 20)}
    assert into[2].busy_ns == 10 and into[2].operations == {10: (30, 40)}
    assert set(into) == {1, 2}  # the untagged record (a restore) belongs to no iteration


# -- the TIMINGS chunk ---------------------------------------------------------------------------


def timed_capture(path, *, with_times=True, close=True):
    w = replayfmt.CaptureWriter(path, threads=0)
    dev = w.add_object(m.Device(name="NVIDIA H100"))
    x = w.add_object(m.Buffer(size=4096, device=dev))
    exe = w.add_object(
        m.Executable(format=m.ExecutableFormat.CUBIN, payload=w.add_payload(b"\x7fELF" + bytes(60)), functions=(SAXPY,))
    )
    snapshot = w.copy_h2d(dst_buffer=x, data=np.zeros(1024, np.float32))
    w.scope_begin("step")
    params = np.float32(2.0).tobytes() + bytes(4) + bytes(16) + np.int32(1024).tobytes() + bytes(4)
    relocations = [m.Relocation(0, x, 8, 0), m.Relocation(0, x, 16, 0)]
    launches = [
        w.launch(
            executable=exe, function=0, grid=(4, 1, 1), block=(256, 1, 1), parameters=params, relocations=relocations
        )
        for _ in range(3)
    ]
    fill = w.memset(buffer=x, value=0, count=64)
    w.scope_end("step")
    if with_times:
        w.set_original_times(
            [
                OperationTime(launches[0], 10_000, 4_000),
                OperationTime(launches[1], 12_000, 5_000),
                OperationTime(launches[2], 30_000, 2_000),
                OperationTime(fill, 40_000, 500),
            ]
        )
    if close:
        w.close()
    return w, snapshot, launches, fill


def test_original_times_round_trip_with_scope_times(tmp_path):
    path = tmp_path / "t.kreplay"
    _, snapshot, launches, fill = timed_capture(path)
    with replayfmt.open(path) as cap:
        times = cap.original_times()
        assert times.clock == "cupti-activity"
        assert [times.duration_ns(i) for i in launches] == [4_000, 5_000, 2_000]
        assert times.duration_ns(snapshot) is None and times.duration_ns(fill) == 500
        begin = launches[0] - 1
        assert times.scopes == (m_scope := times.scope(begin),) and m_scope is not None
        assert (m_scope.end, m_scope.busy_ns, m_scope.span_ns) == (fill + 1, 7_000 + 2_000 + 500, 30_500)
        region = times.region(0, cap.operation_count)
        assert (region.operations, region.busy_ns, region.span_ns) == (4, 9_500, 30_500)


def test_the_times_are_checked_whole_without_a_row_object_and_scopes_alone_are_kept(tmp_path, monkeypatch):
    """Found in review: the row count shadowed ``rows``, so a check built every row, and a chunk of
    scope times alone lost them."""
    from replayfmt.format import timings
    from replayfmt.format.decoder import StructVector
    from replayfmt.format.schema import load_schema

    path = tmp_path / "t.kreplay"
    timed_capture(path)
    built = []
    monkeypatch.setattr(timings, "OperationTime", lambda *row: built.append(row))
    with replayfmt.open(path) as cap:
        assert cap.check_original_times() == "" and built == []
    scope = np.array([(1, 5, 700, 900)], load_schema().numpy_dtype("ScopeTime"))
    table = {"clock": "cupti-activity", "operations": None, "scopes": StructVector("ScopeTime", scope.tobytes(), 1)}
    assert timings.decode_timings(table, 8).scopes == (timings.ScopeTime(1, 5, 700, 900),)
    assert timings.decode_timings(table, 8, rows=False).scopes == ()


def test_a_capture_without_times_has_none_and_no_chunk(tmp_path, sample):
    with replayfmt.open(sample) as cap:
        assert not cap.original_times() and cap.original_times().duration_ns(0) is None
    path = tmp_path / "t.kreplay"
    timed_capture(path, with_times=False)
    assert ChunkKind.TIMINGS.to_bytes(2, "little") not in _chunk_kinds(path)


def _chunk_kinds(path) -> list[bytes]:
    data = path.read_bytes()
    kinds, at = [], 32
    while at + 64 <= len(data) - 32 and data[at : at + 4] == b"KRCK":
        header = unpack_chunk_header(data[at : at + 64], at)
        kinds.append(header.kind.to_bytes(2, "little"))
        if header.kind == ChunkKind.TIMINGS:
            assert header.flags == ChunkFlags.OPTIONAL  # older readers skip it
        at = header.end
    return kinds


def test_times_are_found_again_when_the_file_is_recovered(tmp_path):
    path = tmp_path / "t.kreplay"
    timed_capture(path)
    data = path.read_bytes()
    (tmp_path / "cut.kreplay").write_bytes(data[:-40])  # footer and the index's tail gone
    with replayfmt.open(tmp_path / "cut.kreplay") as cap:
        assert cap.recovered and cap.original_times().duration_ns(cap.operation_count - 2) == 500


def test_set_original_times_refuses_an_operation_not_recorded(tmp_path):
    w, *_ = timed_capture(tmp_path / "t.kreplay", with_times=False, close=False)
    with pytest.raises(replayfmt.ReplayUsageError, match="a time for operation 99, which is not recorded yet"):
        w.set_original_times([OperationTime(99, 0, 1)])
    w.close()


def test_jsonl_rows_carry_original_ns(tmp_path, sample):
    path = tmp_path / "t.kreplay"
    _, snapshot, launches, fill = timed_capture(path)
    with replayfmt.open(path) as cap:
        rows = {r["index"]: r for r in map(json.loads, Dumper(cap).jsonl_rows()) if "index" in r}
        text = list(Dumper(cap).text_lines())
    assert [rows[i]["original_ns"] for i in launches] == [4_000, 5_000, 2_000]
    assert rows[fill]["original_ns"] == 500 and rows[snapshot]["original_ns"] is None
    assert any(line.startswith(f"op {launches[1]:>7} launch") and line.endswith(" original=5.000us") for line in text)
    with replayfmt.open(sample) as cap:  # no times: the key is absent, as in format 1.0 files
        assert all("original_ns" not in json.loads(r) for r in Dumper(cap).jsonl_rows())


# -- the recorder's binding of correlation ids to operations -----------------------------------


class _Activity:
    def __init__(self, records, clock=()):
        self.records = records
        self.started = self.stopped = False
        self.clock = iter(clock)

    def timestamp(self):
        return next(self.clock, 0)

    def start(self):
        self.started = True

    def stop(self):
        self.stopped = True

    def take(self):
        return ActivityBatch(records=self.records)


def _recording(tmp_path, activity):
    """A writer with one 64-byte buffer, and OriginalTimes started over ``activity``."""
    writer = replayfmt.CaptureWriter(tmp_path / "r.kreplay", threads=0)
    buf = writer.add_object(m.Buffer(size=64, device=writer.add_object(m.Device())))
    report = Report()
    times = OriginalTimes(writer, report, activity=activity)
    times.start()
    return writer, buf, report, times


def test_recorder_binds_the_program_operation_not_the_snapshot(tmp_path):
    k = ActivityKind
    activity = _Activity(
        [
            ActivityRecord(k.MEMSET, "memset", 100, 130, 0, 1, 7, bytes=64),
            ActivityRecord(k.MEMCPY, "memcpy DtoH", 150, 190, 0, 1, 8, bytes=64),  # a snapshot read
            ActivityRecord(k.CONCURRENT_KERNEL, "k", 200, 260, 0, 1, 8),
            ActivityRecord(k.CONCURRENT_KERNEL, "digest", 300, 310, 0, 1, 8),  # the recorder's
            ActivityRecord(k.MEMCPY, "memcpy DtoH", 500, 900, 0, 1, 99),
        ]
    )
    writer, buf, report, times = _recording(tmp_path, activity)
    correlation = iter([7, 8])
    times.correlation = lambda: next(correlation)

    def translator(event):
        if isinstance(event, ev.Memset):
            writer.copy_h2d(dst_buffer=buf, data=bytes(64))  # a first-touch snapshot, then the program's memset
            writer.memset(buffer=buf, value=0, count=64)
        else:
            writer.scope_begin("k#0")
            report.kernel("k").captured += 1
            writer.memset(buffer=buf, value=1, count=64)  # stands for the launch

    sink = times.wrap(translator)
    sink(ev.Memset(0x1000, 0, 1, 64, 0, "cuMemsetD8_v2"))
    sink(
        ev.LaunchBegin(ev.Kernel(1, "k", None, ()), (1, 1, 1), (1, 1, 1), 0, 0, b"", (0, 0, 0), False, "cuLaunchKernel")
    )
    times.close()
    writer.close()
    assert activity.started and activity.stopped
    assert report.timing == "original device times: 2 operations timed with CUPTI"
    with replayfmt.open(tmp_path / "r.kreplay") as cap:
        got = cap.original_times()
        assert {i: (t.start_ns, t.duration_ns) for i, t in got.operations.items()} == {3: (100, 30), 5: (200, 60)}


def test_recorder_binds_the_runtime_call_around_the_driver_call(tmp_path):
    # a program recorded through the injection library: CUPTI's record of a kernel that
    # cudaLaunchKernel issued carries the runtime call's id (40), not the driver call's (9)
    activity = _Activity([ActivityRecord(ActivityKind.CONCURRENT_KERNEL, "k", 200, 260, 0, 1, 40)])
    writer, buf, report, times = _recording(tmp_path, activity)
    times.correlation = lambda: 9
    times.outer_correlation = lambda: 40

    def translator(event):
        report.kernel("k").captured += 1
        writer.memset(buffer=buf, value=1, count=64)  # stands for the launch

    times.wrap(translator)(
        ev.LaunchBegin(ev.Kernel(1, "k", None, ()), (1, 1, 1), (1, 1, 1), 0, 0, b"", (0, 0, 0), False, "cuLaunchKernel")
    )
    times.close()
    writer.close()
    with replayfmt.open(tmp_path / "r.kreplay") as cap:
        got = cap.original_times()
        assert {i: (t.start_ns, t.duration_ns) for i, t in got.operations.items()} == {2: (200, 60)}


def test_operation_times_take_the_program_record_of_a_call():
    k = ActivityKind.MEMCPY
    records = [
        ActivityRecord(k, "memcpy DtoH", 10, 20, 0, 1, 5, bytes=4096),  # the snapshot, same size
        ActivityRecord(k, "memcpy DtoH", 25, 40, 0, 1, 5, bytes=4096),  # the program's copy
        ActivityRecord(k, "memcpy DtoH", 45, 60, 0, 1, 5, bytes=1 << 20),
    ]
    assert operation_times(records, {5: (3, k, 4096)}) == [OperationTime(3, 25, 15)]


def test_a_graph_launch_is_timed_by_its_nodes_busy_time():
    """XLA runs a step as one graph launch: its nodes' records carry the launch's correlation id and
    a graph node; the recorder's snapshot work in the callback (no node) is left out, and the time
    is the union of the nodes' intervals, from the first node's start."""
    k = ActivityKind
    records = [
        ActivityRecord(k.MEMCPY, "memcpy DtoH", 10, 40, 0, 1, 5, bytes=4096),  # the snapshot of its inputs
        ActivityRecord(k.CONCURRENT_KERNEL, "a", 100, 150, 0, 1, 5, graph_node=1),
        ActivityRecord(k.CONCURRENT_KERNEL, "b", 140, 180, 0, 1, 5, graph_node=2),  # overlaps a
        ActivityRecord(k.MEMSET, "memset", 300, 310, 0, 1, 5, graph_node=3, bytes=64),  # after a gap
        ActivityRecord(k.CONCURRENT_KERNEL, "c", 100, 900, 0, 1, 6, graph_node=1),  # another launch, unbound
    ]
    assert graph_times(records, {5: 4}) == [OperationTime(4, 100, 90)]


# -- benchmark-replay's text --------------------------------------------------------------------


def _stats(v):
    return Stats(v, v, v, 0.0, v)


def test_side_by_side_text_with_the_original():
    original = kt.OriginalSide(
        busy_ns=1_500_000, span_ns=1_600_000, timed=2, untimed_device_ops=1, operations={2: 20_000}
    )
    result = BenchmarkResult(
        "c",
        "gpu",
        "step",
        (1, 5),
        "eager",
        10,
        3,
        False,
        _stats(1.7),
        _stats(1.8),
        [KernelTiming(2, "gemm", 1, _stats(0.0204), 20_000), KernelTiming(3, "copy_h2d", 1, _stats(0.5))],
        clock="cupti",
        busy_ms=_stats(1.53),
        original=original,
    )
    assert _text(result)[4:] == [
        "region          replay ms  original ms  replay/original",
        "GPU busy           1.5300       1.5000           1.020x",
        "elapsed            1.7000            -                -",
        "                   0.1700               device idle inside the region (host launch gaps, synchronisations)",
        f"note: {kt.ORIGINAL_ELAPSED_ABSENT}",
        "note: 1 device operation of the region has no original time (uploads of starting state the recorder "
        "added); the replay's busy time includes them",
        "clock: CUPTI activity records",
        "per operation (median device ms, CUPTI activity records), beside the original program's:",
        "          op name                                        replay  original    ratio",
        "  op       2 gemm                                        0.0204    0.0200   1.020x",
        "  op       3 copy_h2d                                    0.5000         -        -",
    ]


def test_without_cupti_the_text_says_events_were_used(monkeypatch):
    monkeypatch.setattr(kt, "kernel_activity", lambda external: (None, "no CUPTI library here (tried libcupti.so)"))
    clock, note = kt.choose_clock("auto", per_operation=True)
    assert clock is None
    assert (
        note == "CUPTI is not available (no CUPTI library here (tried libcupti.so)): per-operation times come "
        "from CUDA events"
    )
    result = BenchmarkResult(
        "c",
        "gpu",
        None,
        (0, 5),
        "eager",
        10,
        3,
        False,
        _stats(1.0),
        _stats(1.0),
        [KernelTiming(2, "k", 1, _stats(0.006))],
        clock="events",
        clock_note=note,
    )
    assert _text(result)[4:] == [
        f"note: {note}",
        "per operation (median device ms, CUDA events):",
        "  op       2 k                                        0.0060",
    ]
    # with the original's times: its busy time alone, never its elapsed time (the recorder's work
    # between operations inflates it: a BERT step read 288 ms against the replay's 4.7)
    result.original = kt.OriginalSide(busy_ns=900_000, span_ns=288_000_000, timed=1, untimed_device_ops=0)
    assert _text(result)[4:9] == [
        f"note: {note}",
        "region          replay ms  original ms  replay/original",
        "GPU busy                -       0.9000                -",
        "elapsed            1.0000            -                -",
        f"note: {kt.ORIGINAL_ELAPSED_ABSENT}",
    ]
    assert not any("288" in line for line in _text(result))
    with pytest.raises(replayfmt.ReplayUsageError, match=r"--clock=cupti: no CUPTI library here .*use --clock=events"):
        kt.choose_clock("cupti", per_operation=False)
    assert kt.choose_clock("events", per_operation=True) == (None, "")


def test_original_side_of_a_region():
    times = Times("cupti-activity", {3: OperationTime(3, 0, 10), 4: OperationTime(4, 5, 10), 9: OperationTime(9, 0, 1)})
    side = kt.original_side(times, 2, 6, [2, 3, 4])
    assert side == kt.OriginalSide(15, 15, 2, 1, {3: 10, 4: 10})
    assert kt.original_side(Times(), 0, 5, [1]) is None


def test_cupti_clock_tags_each_operation_of_a_step_list():
    """The benchmark's body is a list of typed Step records; tagging wraps each operation's run of
    steps in one push and one pop, and running the result calls them in order."""
    from replayfmt.measure.kernel_times import CuptiClock
    from replayfmt.replay.steps import Step, StepKind

    calls = []

    class Activity:
        def push(self, kind, value):
            calls.append(("push", value))

        def pop(self, kind):
            calls.append(("pop",))

    clock = CuptiClock(Activity(), per_operation=True)
    body = [
        Step(StepKind.POINTER_SITE, lambda: calls.append(("site", 3)), (), 3),
        Step(StepKind.LAUNCH, lambda: calls.append(("launch", 3)), (), 3),
        Step(StepKind.COPY, lambda: calls.append(("copy", 4)), (), 4),
    ]
    steps = clock.instrument(body)
    assert [s.kind for s in steps] == [
        StepKind.TAG,
        StepKind.POINTER_SITE,
        StepKind.LAUNCH,
        StepKind.TAG,
        StepKind.TAG,
        StepKind.COPY,
        StepKind.TAG,
    ]
    for step in steps:
        step.fn(*step.args)
    assert calls == [("push", 3), ("site", 3), ("launch", 3), ("pop",), ("push", 4), ("copy", 4), ("pop",)]
    assert CuptiClock(Activity(), per_operation=False).instrument(body) == body


def test_work_a_runtime_call_issued_is_timed_by_the_runtime_call_just_before_its_driver_call():
    """A C++ program's cudaLaunchKernel: the recorder bound the driver call's correlation id, the
    kernel's record carries the runtime call's, a little below it (one counter numbers both). A
    warm-up launch of the same kernel long before, and the recorder's own reads, are not taken."""
    k = ActivityKind
    records = [
        ActivityRecord(k.CONCURRENT_KERNEL, "scale", 10, 20, 0, 7, 3),  # a warm-up, outside the region
        ActivityRecord(k.CONCURRENT_KERNEL, "scale", 100, 110, 0, 7, 200),
        ActivityRecord(k.MEMCPY, "memcpy DtoH", 50, 60, 0, 1, 203, bytes=64),  # the recorder's snapshot read
        ActivityRecord(k.CONCURRENT_KERNEL, "scale", 120, 135, 0, 7, 210),
        ActivityRecord(k.MEMCPY, "memcpy HtoD", 140, 150, 0, 7, 220, bytes=64),
        ActivityRecord(k.CONCURRENT_KERNEL, "bound", 300, 330, 0, 7, 230),  # a driver-API launch, bound by id
    ]
    bound = {
        201: (0, k.CONCURRENT_KERNEL, "scale"),
        211: (1, k.CONCURRENT_KERNEL, "scale"),
        222: (2, k.MEMCPY, 64),
        230: (3, k.CONCURRENT_KERNEL, "bound"),
        240: (4, k.CONCURRENT_KERNEL, "scale"),  # its record was lost; the warm-up's is far below
    }
    by_id = operation_times(records, bound)
    assert by_id == [OperationTime(3, 300, 30)]
    got = runtime_call_times(records, bound, {3}, set())
    assert got == [OperationTime(0, 100, 10), OperationTime(1, 120, 15), OperationTime(2, 140, 10)]


def test_one_correlation_id_for_every_call_is_matched_by_issue_order_and_clock(tmp_path):
    """A C++ program recorded through CUDA's injection entry point on the H100: every CUPTI record
    carried correlation id 1, so ids bound one launch of 5,050. Each operation takes the earliest
    record of its kernel that started after its call: a warm-up launch of the same kernel before
    the region and the recorder's own reads are not taken."""
    k = ActivityKind
    records = [
        ActivityRecord(k.CONCURRENT_KERNEL, "bump", 10, 20, 0, 7, 1),  # the warm-up, before the region
        ActivityRecord(k.MEMCPY, "memcpy DtoH", 90, 95, 0, 9, 1, bytes=64),  # the recorder's snapshot read
        ActivityRecord(k.CONCURRENT_KERNEL, "bump", 120, 130, 0, 7, 1),
        ActivityRecord(k.CONCURRENT_KERNEL, "bump", 131, 145, 0, 7, 1),
        ActivityRecord(k.MEMCPY, "memcpy DtoH", 150, 160, 0, 7, 1, bytes=64),  # the program's copy
    ]
    activity = _Activity(records, clock=[100, 110, 146])  # at each launch's call, at the copy's call
    writer, buf, report, times = _recording(tmp_path, activity)
    times.correlation = lambda: 1

    def translator(event):
        if isinstance(event, ev.LaunchBegin):
            report.kernel("bump").captured += 1
            writer.memset(buffer=buf, value=1, count=64)  # stands for the launch
        elif isinstance(event, ev.CopyDone):
            writer.memset(buffer=buf, value=2, count=64)  # stands for the synchronous copy, written at its end

    sink = times.wrap(translator)
    launch = ev.LaunchBegin(
        ev.Kernel(1, "bump", None, ()), (1, 1, 1), (1, 1, 1), 0, 0, b"", (0, 0, 0), False, "cuLaunchKernel"
    )
    sink(launch)
    sink(launch)
    sink(ev.Copy(ev.CopyDirection.D2H, 0x2000, 0x1000, 64, 0, False, "cuMemcpyDtoH_v2"))
    sink(ev.CopyDone(0x2000, 64))
    times.close()
    writer.close()
    assert report.timing == "original device times: 3 operations timed with CUPTI"
    with replayfmt.open(tmp_path / "r.kreplay") as cap:
        got = cap.original_times()
        assert {i: (t.start_ns, t.duration_ns) for i, t in got.operations.items()} == {
            2: (120, 10),
            3: (131, 14),
            4: (150, 10),
        }
