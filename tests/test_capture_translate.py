"""The recorder's translation from driver events to capture records, on synthetic event streams
(no GPU): a fake device memory stands in for the driver."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from fake_device import FakeDevice

import replayfmt
from replayfmt.capture import CaptureMode, RecordOptions, TensorLabel, Translator, events as ev
from replayfmt.capture.enrich import triton_annotation
from replayfmt.capture.hostfiles import HostFiles, parse_maps
from replayfmt.capture.snapshots import Snapshotter
from replayfmt.format import model as m
from replayfmt.replay.plan import PlanOptions, build_plan
from replayfmt.writer import CaptureWriter

A, B, C = 0x7F00_0000_0000, 0x7F00_0010_0000, 0x7F00_0020_0000
SAXPY = ((0, 4), (8, 8), (16, 8), (24, 4))  # float a, const float* x, float* y, int n
MODULE = ("module", 0x1234)


class FakeMemory:
    """Device memory as a dict of allocations; host memory as a dict of address -> bytes."""

    def __init__(self) -> None:
        self.device: dict[int, bytearray] = {}
        self.host: dict[int, bytes] = {}
        self.reads: list[tuple[int, int, int | None]] = []
        self.before_allocation: dict[int, int] = {}
        self.devices: dict[int, int] = {}  # allocation base -> the ordinal of its device, where not the first

    def read(self, address: int, size: int, stream: int | None) -> bytes:
        self.reads.append((address, size, stream))
        for base, data in self.device.items():
            if base <= address < base + len(data):
                return bytes(data[address - base : address - base + size])
        raise AssertionError(f"read of unknown memory {address:#x}")

    def snapshot(self, address: int, size: int, stream: int | None, writer, *, frames=None) -> int:
        """Through the real snapshot pipeline, on a fake device over the same memory."""
        self.reads.append((address, size, stream))
        device = FakeDevice()
        device.memory = self.device
        snapshots = Snapshotter(device, slot_size=writer.frame_size, slots=2)
        try:
            return snapshots.snapshot(address, size, stream, writer, frames=frames)
        finally:
            snapshots.close()

    def host_bytes(self, address: int, size: int) -> bytes:
        return self.host[address][:size]

    def find_allocation(self, address: int) -> tuple[int, int] | None:
        for base, size in self.before_allocation.items():
            if base <= address < base + size:
                return base, size
        return None

    def device_of(self, address: int) -> int | None:
        return self.devices.get(address)


def saxpy_params(a: float, x: int, y: int, n: int) -> bytes:
    return struct.pack("<f4xQQi4x", a, x, y, n)


def kernel(layout=SAXPY, name="saxpy") -> ev.Kernel:
    return ev.Kernel(0xF00, name, MODULE, layout)


def record(
    tmp_path: Path, events, memory: FakeMemory, options=RecordOptions(), region=True, collectives=None
) -> tuple[Path, Translator]:
    path = tmp_path / "c.kreplay"
    with CaptureWriter(path) as writer:
        t = Translator(writer, options, memory, host_files=HostFiles(tmp_path / "no-maps"), collectives=collectives)
        if region:
            t.start("step")
        for e in events:
            t.handle(e() if callable(e) else e)
        t.stop()
    return path, t


def test_region_snapshots_first_touch_and_checkpoints_what_changed(tmp_path, cubin):
    mem = FakeMemory()
    x = np.arange(256, dtype=np.float32)
    y = np.ones(256, dtype=np.float32)
    mem.device[A] = bytearray(x.tobytes())
    mem.device[B] = bytearray(y.tobytes())

    def run_kernel():  # the "device" computes y = 2x + y when the launch is enqueued
        mem.device[B][:] = (2 * x + y).astype(np.float32).tobytes()
        return ev.LaunchEnd(0)

    events = [
        ev.ModuleImage(MODULE, cubin, None, "cuModuleLoadData"),
        ev.Allocation(A, x.nbytes),
        ev.Allocation(B, y.nbytes),
        ev.LaunchBegin(kernel(), (1, 1, 1), (256, 1, 1), 0, 0, saxpy_params(2.0, A, B, 256)),
        run_kernel,
    ]
    path, t = record(tmp_path, events, mem)
    assert not t.report.errors
    with replayfmt.open(path) as cap:
        ops = list(cap.iter_operations())
        kinds = [op.kind.label for op in ops]
        assert kinds.count("state") == 2 and "copy_h2d" not in kinds  # x and y: starting state, not copies
        assert kinds.index("state") > kinds.index("scope_begin")  # found in the region, hoisted by replay
        launch = next(op for op in ops if op.kind == m.OperationKind.LAUNCH)
        buffers = {o.address: o for o in cap.objects() if isinstance(o, m.Buffer)}
        assert {(r.site_offset, r.target_buffer, r.target_offset) for r in launch.relocations} == {
            (8, buffers[A].id, 0),
            (16, buffers[B].id, 0),
        }
        checkpoint = next(op for op in ops if op.kind == m.OperationKind.CHECKPOINT)
        entries = {e.buffer: e for e in checkpoint.entries}
        assert sorted(entries) == [buffers[A].id, buffers[B].id]  # every buffer the region touched
        states = {op.buffer: op.payload for op in ops if isinstance(op, m.State)}
        assert entries[buffers[A].id].payload == states[buffers[A].id]  # x did not change: its state's bytes
        assert np.array_equal(np.frombuffer(cap.read_payload(entries[buffers[B].id].payload), np.float32), 2 * x + y)
        exe = next(o for o in cap.objects() if isinstance(o, m.Executable))
        assert exe.format == m.ExecutableFormat.CUBIN and exe.target_arch == "sm_90"
        assert exe.functions[0].name == "saxpy" and exe.functions[0].parameters_known
        plan = build_plan(cap, PlanOptions())
        assert not plan.problems and plan.images[exe.id].abi_checked
    assert t.report.kernels["saxpy"].captured == 1


def test_launches_keep_their_cooperative_and_programmatic_attributes_as_flags(tmp_path, cubin):
    mem = FakeMemory()
    mem.device[A], mem.device[B] = bytearray(1024), bytearray(1024)
    params = saxpy_params(2.0, A, B, 256)

    def launch(**attributes) -> ev.LaunchBegin:
        return ev.LaunchBegin(kernel(), (1, 1, 1), (256, 1, 1), 0, 0, params, **attributes)

    events = [
        ev.ModuleImage(MODULE, cubin, None, "cuModuleLoadData"),
        ev.Allocation(A, 1024),
        ev.Allocation(B, 1024),
        launch(programmatic=True),
        launch(cooperative=True, programmatic=True),
        launch(),
    ]
    path, t = record(tmp_path, events, mem)
    assert not t.report.errors
    with replayfmt.open(path) as cap:
        flags = [op.flags for op in cap if isinstance(op, m.Launch)]
    assert flags == [m.LAUNCH_FLAG_PROGRAMMATIC, m.LAUNCH_FLAG_COOPERATIVE | m.LAUNCH_FLAG_PROGRAMMATIC, 0]


def test_outside_region_nothing_is_written_but_allocations_are_tracked(tmp_path, cubin):
    mem = FakeMemory()
    mem.device[A] = bytearray(64)
    path, t = record(
        tmp_path,
        [
            ev.ModuleImage(MODULE, cubin, None),
            ev.Allocation(A, 64),
            ev.LaunchBegin(kernel(), (1, 1, 1), (1, 1, 1), 0, 0, saxpy_params(1.0, A, A, 16)),
        ],
        mem,
        region=False,
    )
    with replayfmt.open(path) as cap:
        assert [op.kind.label for op in cap.iter_operations()] == []  # not even a device: none was worked on
    assert t.report.kernels["saxpy"].occurrences == 1 and t.report.kernels["saxpy"].captured == 0


def test_kernel_mode_instances_are_self_contained(tmp_path, cubin):
    mem = FakeMemory()
    mem.device[A] = bytearray(np.arange(4, dtype=np.float32).tobytes())
    mem.device[B] = bytearray(16)
    options = RecordOptions(mode=CaptureMode.KERNEL, kernels="sax", skip_first=1, max_per_kernel=2)
    launch = ev.LaunchBegin(kernel(), (1, 1, 1), (4, 1, 1), 0, 0x77, saxpy_params(1.0, A, B, 4))
    other = ev.LaunchBegin(kernel(name="other"), (1, 1, 1), (4, 1, 1), 0, 0, saxpy_params(1.0, A, B, 4))

    def bump():
        mem.device[B][0] += 1
        return ev.LaunchEnd(0x77)

    events = (
        [ev.ModuleImage(MODULE, cubin, None), ev.Allocation(A, 16), ev.Allocation(B, 16), ev.StreamCreated(0x77, 1)]
        + [launch, bump] * 4
        + [other, ev.LaunchEnd(0)]
    )
    path, t = record(tmp_path, events, mem, options, region=False)
    assert t.report.kernels["saxpy"].occurrences == 4 and t.report.kernels["saxpy"].captured == 2
    assert t.report.kernels["other"].captured == 0  # seen, not selected
    with replayfmt.open(path) as cap:
        ops = list(cap.iter_operations())
        scopes = [op.name for op in ops if op.kind == m.OperationKind.SCOPE_BEGIN]
        assert scopes == ["saxpy#1", "saxpy#2"]
        checkpoints = [op for op in ops if op.kind == m.OperationKind.CHECKPOINT]
        assert len(checkpoints) == 2 and all(len(c.entries) == 2 for c in checkpoints)  # A and B, B changed
        assert not any(op.kind == m.OperationKind.COPY_HOST_TO_DEVICE for op in ops)
        states = [op for op in ops if op.kind == m.OperationKind.STATE]
        assert len(states) == 4  # A and B: each instance's starting state
        stream = next(o for o in cap.objects() if isinstance(o, m.Stream))
        assert stream.captured_handle == 0x77 and stream.flags == 1
        plan = build_plan(cap, PlanOptions())
        assert not plan.problems
        begins = [op.index for op in ops if op.kind == m.OperationKind.SCOPE_BEGIN]
        assert sorted(plan.state) == begins  # each instance's state is applied before it begins
        assert [len(plan.state[b]) for b in begins] == [2, 2]
    assert {stream for _, _, stream in mem.reads} == {0x77}  # only the launching stream is waited for


def test_copies_memsets_events_and_partial_writes(tmp_path, cubin):
    mem = FakeMemory()
    mem.device[A] = bytearray(b"\x05" * 64)
    mem.device[B] = bytearray(64)
    mem.host[0x1000] = b"\x01" * 64
    mem.host[0x2000] = b"\x05" * 16
    events = [
        ev.Allocation(A, 64),
        ev.Allocation(B, 64),
        ev.StreamCreated(0x10),
        ev.StreamCreated(0x20),
        ev.EventCreated(0x30, 2),
        ev.Copy(ev.CopyDirection.H2D, A, 0x1000, 64, 0x10, True, "cuMemcpyHtoDAsync_v2"),  # whole: no snapshot
        ev.Memset(B + 16, 7, 1, 16, 0x10),  # partial: B is snapshotted first
        ev.EventRecorded(0x30, 0x10),
        ev.StreamWaited(0x20, 0x30),
        ev.Copy(ev.CopyDirection.DEFAULT, B, A, 32, 0x20, True, "cuMemcpyAsync"),
        ev.Copy(ev.CopyDirection.D2H, 0x2000, A, 16, 0, False, "cuMemcpyDtoH_v2"),
        ev.CopyDone(0x2000, 16),
        ev.StreamSynchronized(0x20),
        ev.ContextSynchronized(),
        ev.Copy(ev.CopyDirection.H2D, 0x9999_0000_0000, 0x1000, 8, 0, False, "cuMemcpyHtoD_v2"),
    ]
    path, t = record(tmp_path, events, mem)
    with replayfmt.open(path) as cap:
        labels = [op.kind.label for op in cap.iter_operations() if op.kind.label != "create"]
        assert labels == [
            "scope_begin",
            "copy_h2d",
            "state",
            "memset",
            "event_record",
            "stream_wait_event",
            "copy_d2d",
            "copy_d2h",
            "stream_synchronize",
            "device_synchronize",
            "unsupported",
            "checkpoint",
            "scope_end",
        ]
        d2h = next(op for op in cap.iter_operations() if op.kind == m.OperationKind.COPY_DEVICE_TO_HOST)
        assert cap.read_payload(d2h.payload) == b"\x05" * 16
        event = next(o for o in cap.objects() if isinstance(o, m.Event))
        assert event.flags == 2
    assert t.report.unsupported == {"cuMemcpyHtoD_v2": 1}
    assert next(r[0] for r in mem.reads) == B  # the partial memset's snapshot


def test_unknown_module_and_nccl_are_unsupported(tmp_path, cubin):
    mem = FakeMemory()
    events = [
        ev.LaunchBegin(ev.Kernel(1, "mystery", ("library", 9), ()), (1, 1, 1), (1, 1, 1), 0, 0, b""),
        ev.ModuleImage(MODULE, cubin, None),
        ev.LaunchBegin(
            ev.Kernel(2, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", MODULE, ()), (1, 1, 1), (1, 1, 1), 0, 0, b""
        ),
        ev.NotReproducible("cuIpcOpenMemHandle", "memory shared between processes (IPC)"),
    ]
    path, t = record(tmp_path, events, mem)
    assert set(t.report.unsupported) == {"cuLaunchKernel", "cuIpcOpenMemHandle"}
    with replayfmt.open(path) as cap:
        reasons = [op.reason for op in cap.iter_operations() if op.kind == m.OperationKind.UNSUPPORTED]
        assert "loaded before recording started" in reasons[0] and "collective" in reasons[1]
        plan = build_plan(cap, PlanOptions(continue_on_error=True))
        assert any("cuIpcOpenMemHandle cannot be replayed" in p for p in plan.problems)


def test_allocations_made_before_recording_are_found_through_the_driver(tmp_path, cubin):
    mem = FakeMemory()
    mem.device[C] = bytearray(128)
    mem.before_allocation[C] = 128
    path, _t = record(
        tmp_path,
        [
            ev.ModuleImage(MODULE, cubin, None),
            ev.LaunchBegin(kernel(), (1, 1, 1), (1, 1, 1), 0, 0, saxpy_params(1.0, C + 64, C, 16)),
        ],
        mem,
    )
    with replayfmt.open(path) as cap:
        buffers = [o for o in cap.objects() if isinstance(o, m.Buffer)]
        assert [(b.address, b.size) for b in buffers] == [(C, 128)]
        launch = next(op for op in cap.iter_operations() if op.kind == m.OperationKind.LAUNCH)
        assert sorted(r.target_offset for r in launch.relocations) == [0, 64]


def test_tensor_maps_become_tensor_map_relocations(tmp_path, cubin):
    mem = FakeMemory()
    mem.device[A] = bytearray(4096)
    layout = ((0, 128), (128, 8))
    tensor_map = struct.pack("<Q", A + 256) + bytes(120)
    params = tensor_map + struct.pack("<Q", A)
    path, _ = record(
        tmp_path,
        [
            ev.ModuleImage(MODULE, cubin, None),
            ev.Allocation(A, 4096),
            ev.LaunchBegin(ev.Kernel(5, "tma", MODULE, layout), (1, 1, 1), (1, 1, 1), 0, 0, params),
        ],
        mem,
    )
    with replayfmt.open(path) as cap:
        launch = next(op for op in cap.iter_operations() if op.kind == m.OperationKind.LAUNCH)
        assert [(r.site_offset, r.kind, r.target_offset) for r in launch.relocations] == [
            (0, m.RelocationKind.TENSOR_MAP, 256),
            (128, m.RelocationKind.POINTER, 0),
        ]
        exe = next(o for o in cap.objects() if isinstance(o, m.Executable))
        assert exe.functions[0].parameters[0].kind == m.ParameterKind.TENSOR_MAP


def test_integer_pairs_inside_structs_are_not_pointers(tmp_path, cubin):
    """An allocation across a 4 GiB boundary (XLA's arena spans many) holds every address whose
    high half is that boundary's: inside a struct parameter (cuBLAS's, CUTLASS's), a word whose
    low half is a small integer is two integer fields and stays as captured; a word that looks
    like an address is relocated, and so is a pointer-sized parameter of any value."""
    mem = FakeMemory()
    arena, size = 0x3_FFF0_0000, 2 << 20  # across 4 GiB boundaries, as an arena of tens of GB is
    other = 0x4_7FF0_0000  # and across 0x4_8000_0000
    mem.device[arena], mem.device[other] = bytearray(size), bytearray(size)
    pair, minus_one_three, int_min_four, real = 0x4_0000_0100, 0x3_FFFF_FFFF, 0x4_8000_0000, arena + 0x400
    params = struct.pack("<4Q", pair, real, minus_one_three, int_min_four) + struct.pack("<Q", pair)
    params = params[:24] + struct.pack("<Q", 0x4_0000_0000) + params[32:]  # (0, 4): another pair
    boundary = 0x5_0000_0000  # an allocation starting on a 4 GiB boundary: its start is a pointer
    mem.device[boundary] = bytearray(size)
    params += struct.pack("<2Q", boundary, boundary + 0x100)
    path, _ = record(
        tmp_path,
        [
            ev.ModuleImage(MODULE, cubin, None),
            ev.Allocation(arena, size),
            ev.Allocation(other, size),
            ev.Allocation(boundary, size),
            ev.LaunchBegin(
                ev.Kernel(5, "gemm", MODULE, ((0, 32), (32, 8), (40, 16))), (1, 1, 1), (1, 1, 1), 0, 0, params
            ),
        ],
        mem,
    )
    with replayfmt.open(path) as cap:
        launch = next(op for op in cap.iter_operations() if op.kind == m.OperationKind.LAUNCH)
        found = [(r.site_offset, r.target_offset) for r in launch.relocations]
        assert found == [(8, 0x400), (32, pair - arena), (40, 0)]


def test_struct_words_that_may_be_data_are_pointers_where_the_capture_reaches(tmp_path, cubin):
    """At 0x7fxx addresses a struct word may be a 4-byte field beside the stale high half of an
    old pointer: a float (dropout's scale, unaligned) is relocated only into an allocation this
    launch reaches otherwise or the capture already holds, and left as captured into one nothing
    else reaches. A small int (TensorListMetadata's last field), a zero on a 4 GiB boundary and
    a tensor address within 64 KiB of one (PyTorch's foreach kernels, on segments just below
    one) are relocated into device memory wherever they land (replay keeps such buffers' low
    halves); so are a 4-byte aligned view that reads as no float and an 8-byte aligned word that
    reads as a round float (a kernel's output at the start of a block)."""
    mem = FakeMemory()
    segment, size = 0x7FD1_FFE0_0000, 4 << 20  # across 0x7fd2_0000_0000
    unused = 0x7F27_FFE0_0000  # across 0x7f28_0000_0000, reached by no pointer of its own
    floats = 0x7F27_3F80_0000  # where (a float near 1, 0x7f27) lands
    on_boundary = 0x7F30_0000_0000  # starts on a 4 GiB boundary: (0, 0x7f30) is its start
    output = 0x7F26_4000_0000  # a kernel's output, nothing else reaches it: 2.0 as a float
    for base in (segment, unused, floats, on_boundary, output):
        mem.device[base] = bytearray(size)
    below, past = 0x7FD1_FFFF_0E00, 0x7FD2_0000_0200  # low halves: -61952 and 512
    stale = 0x7F28_0000_0001  # (1, 0x7f28)
    scale, rounded = floats + 0xE38E4, output + 0x100000  # (1.1111, 0x7f27), (2.25, 0x7f26)
    view = segment + 0x2004  # 4-byte aligned, and its low half reads as no float
    kernel = ev.Kernel(5, "gemm", MODULE, ((0, 64),))
    first = struct.pack("<8Q", stale, below, segment + 0x1000, past, scale, rounded, view, on_boundary)
    reaches = struct.pack("<8Q", floats + 0x100, 0, 0, 0, 0, 0, 0, 0)
    path, _ = record(
        tmp_path,
        [
            ev.ModuleImage(MODULE, cubin, None),
            *(ev.Allocation(base, size) for base in (segment, unused, floats, on_boundary, output)),
            ev.LaunchBegin(kernel, (1, 1, 1), (1, 1, 1), 0, 0, first),
            ev.LaunchBegin(kernel, (1, 1, 1), (1, 1, 1), 0, 0, reaches),
            ev.LaunchBegin(kernel, (1, 1, 1), (1, 1, 1), 0, 0, first),
        ],
        mem,
    )
    with replayfmt.open(path) as cap:
        launches = [op for op in cap.iter_operations() if op.kind == m.OperationKind.LAUNCH]
        buffers = {o.id: o.address for o in cap.objects() if isinstance(o, m.Buffer)}
        found = [
            [(r.site_offset, buffers[r.target_buffer] + r.target_offset) for r in op.relocations] for op in launches
        ]
    pointers = [(0, stale), (8, below), (16, segment + 0x1000), (24, past), (40, rounded), (48, view)]
    assert found[0] == [*pointers, (56, on_boundary)]  # the float stays
    assert found[1] == [(0, floats + 0x100)]
    assert found[2] == sorted([*pointers, (32, scale), (56, on_boundary)])  # now the capture holds its allocation


def test_a_small_int_beside_a_stale_half_stays_as_captured_in_memory_replay_cannot_place(tmp_path, cubin):
    """Replay keeps the low half of addresses into device buffers near a 4 GiB boundary, never into
    pinned host memory: there a small int beside a stale half is relocated only where the
    capture reaches that memory otherwise, as a float beside one is."""
    mem = FakeMemory()
    pinned, size = 0x7F28_0000_0000 - (2 << 20), 4 << 20  # across 0x7f28_0000_0000
    mem.device[pinned] = bytearray(size)
    stale = 0x7F28_0000_0001  # (1, 0x7f28)
    kernel = ev.Kernel(5, "gemm", MODULE, ((0, 16),))
    path, _ = record(
        tmp_path,
        [
            ev.ModuleImage(MODULE, cubin, None),
            ev.Allocation(pinned, size, ev.MemoryApi.HOST_PINNED, "cuMemHostAlloc"),
            ev.LaunchBegin(kernel, (1, 1, 1), (1, 1, 1), 0, 0, struct.pack("<2Q", stale, 0)),
            ev.LaunchBegin(kernel, (1, 1, 1), (1, 1, 1), 0, 0, struct.pack("<2Q", stale, pinned + 64)),
        ],
        mem,
    )
    with replayfmt.open(path) as cap:
        launches = [op for op in cap.iter_operations() if op.kind == m.OperationKind.LAUNCH]
        assert [[r.site_offset for r in op.relocations] for op in launches] == [[], [0, 8]]


def test_a_repeated_launch_resolves_again_once_the_capture_holds_what_it_left(tmp_path, cubin):
    """A launch whose word that may be data was left as captured (nothing reached its allocation)
    is worked out again when repeated after another kernel reached that allocation: the last
    launch's resolution is reused only while it left nothing unsettled."""
    mem = FakeMemory()
    unused, size = 0x7F27_3F80_0000, 4 << 20
    mem.device[unused] = bytearray(size)
    scale = unused + 0xE38E4  # (1.1111, 0x7f27): a float beside a stale half
    a, b = ev.Kernel(5, "gemm", MODULE, ((0, 16),)), ev.Kernel(6, "gemm", MODULE, ((0, 16),))
    path, _ = record(
        tmp_path,
        [
            ev.ModuleImage(MODULE, cubin, None),
            ev.Allocation(unused, size),
            ev.LaunchBegin(a, (1, 1, 1), (1, 1, 1), 0, 0, struct.pack("<2Q", scale, 0)),
            ev.LaunchBegin(b, (1, 1, 1), (1, 1, 1), 0, 0, struct.pack("<2Q", unused + 64, 0)),
            ev.LaunchBegin(a, (1, 1, 1), (1, 1, 1), 0, 0, struct.pack("<2Q", scale, 0)),
        ],
        mem,
    )
    with replayfmt.open(path) as cap:
        launches = [op for op in cap.iter_operations() if op.kind == m.OperationKind.LAUNCH]
        assert [[r.site_offset for r in op.relocations] for op in launches] == [[], [0], [0]]


def one_launch(tmp_path, cubin, base: int, size: int, kernel: ev.Kernel, params: bytes, held: int = 64):
    """The relocations the recorder writes for one launch of ``kernel`` on an allocation of
    ``size`` bytes at ``base`` (the fake holds its first ``held`` bytes)."""
    mem = FakeMemory()
    mem.device[base] = bytearray(held)
    events = [ev.ModuleImage(MODULE, cubin, None), ev.Allocation(base, size)]
    path, _ = record(tmp_path, [*events, ev.LaunchBegin(kernel, (1, 1, 1), (1, 1, 1), 0, 0, params)], mem)
    with replayfmt.open(path) as cap:
        return next(op for op in cap.iter_operations() if op.kind == m.OperationKind.LAUNCH).relocations


def test_unaligned_words_inside_structs_are_not_pointers(tmp_path, cubin):
    """cuDNN's sm_90 convolutions take a 2.9 KB struct holding 64-bit division magic numbers and
    TMA descriptor fields that fall inside a JAX arena of 38 GB (from 0x3_0200_0000): relocated,
    they made the replay fault on the H100. A struct word is a pointer only when 8-byte aligned
    (or an allocation's start); a pointer-sized parameter is relocated whatever its alignment."""
    arena = 0x3_0200_0000
    tensor, scratch = arena + 0x4D_F400, arena + 0x1C_F320
    words = [tensor, 0x4_9249_2493, 0x8_A72F_053A, 0x3_E38E_38E4, scratch + 8, 0x4_0005_63C3, tensor + 4]
    params = struct.pack(f"<{len(words)}Q", *words) + struct.pack("<Q", tensor + 4)
    layout = ((0, 8 * len(words)), (8 * len(words), 8))
    found = one_launch(tmp_path, cubin, arena, 0x8_E800_0000, ev.Kernel(5, "conv", MODULE, layout), params)
    assert [(r.site_offset, r.target_offset) for r in found] == [(0, 0x4D_F400), (32, 0x1C_F328), (56, 0x4D_F404)]


def test_a_128_byte_struct_whose_first_word_is_no_address_is_no_tensor_map(tmp_path, cubin):
    """cuDNN's winograd kernels take a 128-byte struct at offset 0, the size and alignment of a
    CUtensorMap: its first word is no address, so it is a struct, and only its aligned words that
    point into the arena are pointers (its magic numbers were relocated, and the replay wrote
    out of bounds on the H100)."""
    arena = 0x3_0200_0000
    words = [0x1_0000_0020, 0x1C_0000_001C, arena + 0x500, arena + 0x35_7640, 0x7_0000_0007, 0x9_A72F_053A]
    params = struct.pack("<16Q", *words, *([0] * 10))
    kernel = ev.Kernel(6, "winograd", MODULE, ((0, 128),))
    found = [
        (r.site_offset, r.target_offset, r.kind)
        for r in one_launch(tmp_path, cubin, arena, 0x8_E800_0000, kernel, params)
    ]
    assert found == [(16, 0x500, m.RelocationKind.POINTER), (24, 0x35_7640, m.RelocationKind.POINTER)]


def test_labels_and_annotations_type_buffers_and_parameters(tmp_path, cubin):
    mem = FakeMemory()
    mem.device[A] = bytearray(64)
    mem.device[B] = bytearray(64)
    path = tmp_path / "c.kreplay"
    with CaptureWriter(path) as writer:
        t = Translator(writer, RecordOptions(), mem)
        t.handle(ev.ModuleImage(MODULE, cubin, None))
        t.handle(ev.Allocation(A, 64))
        t.handle(ev.Allocation(B, 64))
        t.label_tensor(TensorLabel(A, 64, m.DType.FLOAT32, (16,), (1,), "x"))
        t.annotate_kernel(
            None,
            "saxpy",
            triton_annotation(
                {"a": "fp32", "x": "*fp32", "y": "*fp32", "n": "i32", "BLOCK": "constexpr"},
                ["a", "x", "y", "n", "BLOCK"],
            ),
        )
        t.start()
        t.handle(ev.LaunchBegin(kernel(), (1, 1, 1), (1, 1, 1), 0, 0, saxpy_params(1.0, A, B, 16)))
        t.stop()
    with replayfmt.open(path) as cap:
        buffers = {o.address: o for o in cap.objects() if isinstance(o, m.Buffer)}
        assert buffers[A].dtype == m.DType.FLOAT32 and buffers[A].shape == (16,) and buffers[A].label == "x"
        assert buffers[B].dtype == m.DType.UNKNOWN
        fn = next(o for o in cap.objects() if isinstance(o, m.Executable)).functions[0]
        assert [p.name for p in fn.parameters] == ["a", "x", "y", "n"]
        assert fn.parameters[1].kind == m.ParameterKind.POINTER and fn.parameters[1].dtype == m.DType.FLOAT32


def test_file_backed_host_copies_follow_the_file_policy(tmp_path, cubin):
    weights = tmp_path / "w.bin"
    weights.write_bytes(bytes(range(256)) * 16)
    maps = tmp_path / "maps"
    maps.write_text(
        f"10000-11000 r--p 00000000 08:01 {weights.stat().st_ino} {weights}\n20000-21000 rw-p 00000000 00:00 0 \n"
    )
    mem = FakeMemory()
    mem.device[A] = bytearray(4096)
    mem.host[0x10100] = (bytes(range(256)) * 16)[0x100 : 0x100 + 512]
    for policy in (m.FilePolicy.REFERENCE, m.FilePolicy.CAPTURE_RANGES):
        path = tmp_path / f"{policy.label}.kreplay"
        with CaptureWriter(path) as writer:
            t = Translator(writer, RecordOptions(file_policy=policy), mem, host_files=HostFiles(maps))
            t.handle(ev.Allocation(A, 4096))
            t.start()
            t.handle(ev.Copy(ev.CopyDirection.H2D, A + 64, 0x10100, 512, 0, False, "cuMemcpyHtoD_v2"))
            t.stop()
        with replayfmt.open(path) as cap:
            copy = next(
                op for op in cap.iter_operations() if op.kind == m.OperationKind.COPY_HOST_TO_DEVICE and op.src_file
            )
            ref = next(o for o in cap.objects() if isinstance(o, m.FileReference))
            assert copy.src_offset == 0x100 and ref.path == str(weights) and ref.policy == policy
            if policy == m.FilePolicy.CAPTURE_RANGES:
                assert cap.read_payload(ref.ranges[0].payload) == mem.host[0x10100]
            assert not build_plan(cap, PlanOptions()).problems


def test_maps_parsing_and_lookup(tmp_path):
    text = (
        "00400000-00452000 r-xp 00000000 08:02 173521 /usr/bin/python\n"
        "7f00000000-7f00100000 r--p 00010000 08:02 99 /data/model.safetensors\n"
        "7f00200000-7f00300000 rw-p 00000000 00:00 0 \n"
        "7f00400000-7f00500000 r--p 00000000 08:02 77 /tmp/gone (deleted)\n"
        "7f00600000-7f00700000 rw-s 00000000 00:05 451 /dev/nvidiactl\n"
        "7f00800000-7f00900000 rw-s 00000000 00:19 12 /dev/shm/torch_1_2\n"
    )
    mappings = parse_maps(text)
    assert [mp.file_backed for mp in mappings] == [True, True, False, False, False, True]  # never a device
    maps = tmp_path / "maps"
    maps.write_text(text)
    files = HostFiles(maps)
    assert files.file_range(0x7F00000010, 16) == ("/data/model.safetensors", 0x10010)
    assert files.file_range(0x7F000FFFF8, 16) is None  # runs past the mapping
    assert files.file_range(0x7F00200000, 16) is None  # anonymous
    assert files.file_range(0x7F00400000, 16) is None  # deleted file


def test_callback_errors_are_reported_not_raised(tmp_path):
    mem = FakeMemory()
    _path, t = record(tmp_path, [ev.Copy(ev.CopyDirection.D2H, 0x1000, A, 8, 0, True, "cuMemcpyDtoHAsync_v2")], mem)
    assert t.report.unsupported == {"cuMemcpyDtoHAsync_v2": 1}
    bad = ev.LaunchBegin(kernel(), (1, 1, 1), (1, 1, 1), 0, 0, b"\x01")  # no module: unsupported, no raise
    with CaptureWriter(tmp_path / "d.kreplay") as writer:
        t2 = Translator(writer, RecordOptions(), mem)
        t2.start()
        t2.handle(ev.ModuleImage(MODULE, None, None))  # an image with no bytes
        t2.handle(bad)
        t2.stop()
    assert t2.report.errors and "no image" in t2.report.errors[0]
    assert any("unsupported: cuMemcpyDtoHAsync_v2 x1" in line for line in t.report.lines())


def test_options_reject_bad_values():
    with pytest.raises(replayfmt.ReplayUsageError, match="regular expression"):
        RecordOptions(mode=CaptureMode.KERNEL, kernels="(")
    with pytest.raises(replayfmt.ReplayUsageError, match="max_per_kernel"):
        RecordOptions(max_per_kernel=0)


def test_triton_tensor_descriptors_mark_unaligned_tensor_maps(tmp_path, cubin):
    mem = FakeMemory()
    mem.device[A] = bytearray(4096)
    layout = ((0, 8), (16, 128), (144, 4))  # Triton lays descriptors out 16-aligned
    params = struct.pack("<Q8x", 7) + struct.pack("<Q", A) + bytes(120) + struct.pack("<i4x", 3)
    path = tmp_path / "c.kreplay"
    with CaptureWriter(path) as writer:
        t = Translator(writer, RecordOptions(), mem)
        t.handle(ev.ModuleImage(MODULE, cubin, None))
        t.handle(ev.Allocation(A, 4096))
        t.annotate_kernel(None, "tma", triton_annotation({"d": "tensordesc<fp32[64, 64]>", "n": "i32"}, ["d", "n"]))
        t.start()
        t.handle(ev.LaunchBegin(ev.Kernel(5, "tma", MODULE, layout), (1, 1, 1), (1, 1, 1), 0, 0, params))
        t.stop()
    with replayfmt.open(path) as cap:
        launch = next(op for op in cap.iter_operations() if op.kind == m.OperationKind.LAUNCH)
        assert [(r.site_offset, r.kind) for r in launch.relocations] == [(16, m.RelocationKind.TENSOR_MAP)]


def test_scopes_inside_a_region_checkpoint_what_they_wrote(tmp_path, cubin):
    """A whole-program region with the program's own scope inside: the scope's end checkpoints
    the allocations it touched that changed, so a scope of a longer capture verifies alone."""
    mem = FakeMemory()
    mem.device[A] = bytearray(np.arange(4, dtype=np.float32).tobytes())
    mem.device[B] = bytearray(16)
    mem.device[C] = bytearray(16)

    def write(base, value):
        def done():
            mem.device[base][0] = value
            return ev.LaunchEnd(0)

        return done

    path = tmp_path / "c.kreplay"
    with CaptureWriter(path) as writer:
        t = Translator(writer, RecordOptions(), mem, host_files=HostFiles(tmp_path / "no-maps"))
        t.start()
        for e in (
            ev.ModuleImage(MODULE, cubin, None),
            ev.Allocation(A, 16),
            ev.Allocation(B, 16),
            ev.Allocation(C, 16),
        ):
            t.handle(e)
        t.handle(ev.LaunchBegin(kernel(), (1, 1, 1), (4, 1, 1), 0, 0, saxpy_params(1.0, A, C, 4)))
        t.handle(write(C, 9)())
        t.scope_begin("step")
        t.handle(ev.LaunchBegin(kernel(), (1, 1, 1), (4, 1, 1), 0, 0, saxpy_params(1.0, A, B, 4)))
        t.handle(write(B, 7)())
        t.scope_end("step")
        t.scope_begin("open")  # left open by the program: closed (and checkpointed) with the region
        t.stop()
    with replayfmt.open(path) as cap:
        ops = list(cap.iter_operations())
        buffers = {o.address: o.id for o in cap.objects() if isinstance(o, m.Buffer)}
        checkpoints = [op for op in ops if isinstance(op, m.Checkpoint)]
        assert [c.name for c in checkpoints] == ["step", "open", "region"]
        assert [e.buffer for e in checkpoints[0].entries] == [buffers[A], buffers[B]]  # not C: not in the scope
        assert read(cap, checkpoints[0], buffers[B])[0] == 7
        assert {e.buffer for e in checkpoints[2].entries} == {buffers[A], buffers[B], buffers[C]}
        labels = [op.kind.label for op in ops]
        assert labels.index("checkpoint") == labels.index("scope_end") - 1  # inside the scope
        assert labels[-2:] == ["scope_end", "checkpoint"]
        assert not build_plan(cap, PlanOptions()).problems


def read(cap, checkpoint: m.Checkpoint, buffer: int) -> bytes:
    return cap.read_payload(next(e.payload for e in checkpoint.entries if e.buffer == buffer))


def test_a_second_unnamed_region_is_a_scope_of_its_own(tmp_path, cubin):
    mem = FakeMemory()
    mem.device[A] = bytearray(16)
    path = tmp_path / "c.kreplay"
    with CaptureWriter(path) as writer:
        t = Translator(writer, RecordOptions(), mem, host_files=HostFiles(tmp_path / "no-maps"))
        t.handle(ev.ModuleImage(MODULE, cubin, None))
        t.handle(ev.Allocation(A, 16))
        for _ in range(2):
            t.start()
            t.handle(ev.LaunchBegin(kernel(), (1, 1, 1), (4, 1, 1), 0, 0, saxpy_params(1.0, A, A, 4)))
            t.stop()
    with replayfmt.open(path) as cap:
        ops = list(cap.iter_operations())
        assert [op.name for op in ops if isinstance(op, m.ScopeBegin)] == ["region#2"]
        plan = build_plan(cap, PlanOptions())
        second = next(op.index for op in ops if isinstance(op, m.ScopeBegin))
        assert sorted(plan.state) == [0, second]  # each region's snapshot applies where it begins


def test_tensors_of_several_dtypes_type_sub_ranges(tmp_path, cubin):
    mem = FakeMemory()
    mem.device[A] = bytearray(1024)
    path = tmp_path / "c.kreplay"
    with CaptureWriter(path) as writer:
        t = Translator(writer, RecordOptions(), mem, host_files=HostFiles(tmp_path / "no-maps"))
        t.handle(ev.ModuleImage(MODULE, cubin, None))
        t.handle(ev.Allocation(A, 1024))  # a caching-allocator segment
        t.label_tensor(TensorLabel(A + 512, 256, m.DType.INT32, (64,), (1,), "index"))
        t.label_tensor(TensorLabel(A, 512, m.DType.FLOAT16, (256,), (1,), "h"))
        t.label_tensor(TensorLabel(A + 600, 64, m.DType.FLOAT32, (16,), (1,), "overlapping view"))
        t.start()
        t.handle(ev.LaunchBegin(kernel(), (1, 1, 1), (4, 1, 1), 0, 0, saxpy_params(1.0, A, A, 4)))
        t.stop()
    with replayfmt.open(path) as cap:
        buffer = next(o for o in cap.objects() if isinstance(o, m.Buffer))
        assert buffer.dtype == m.DType.UNKNOWN
        assert buffer.ranges == (m.TypedRange(0, 512, m.DType.FLOAT16), m.TypedRange(512, 256, m.DType.INT32))


def test_framework_hooks_install_once_the_program_imports_the_framework(tmp_path, monkeypatch):
    """Under python -m replayfmt.capture the program imports torch and triton after the recorder
    started: their hooks install right after the import (a finder on sys.meta_path)."""
    import sys

    from replayfmt.capture.enrich import _AfterImport

    (tmp_path / "late_framework_f14.py").write_text("VALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    hook = _AfterImport("late_framework_f14", lambda: seen.append(sys.modules["late_framework_f14"].VALUE))
    sys.meta_path.insert(0, hook)
    try:
        import late_framework_f14  # noqa: F401

        assert seen == [42] and hook not in sys.meta_path
    finally:
        hook.remove()
        sys.modules.pop("late_framework_f14", None)


def test_a_kernel_reloaded_at_the_same_handles_with_another_layout_is_read_by_its_new_layout(tmp_path, cubin):
    """XLA's autotuner loads and unloads modules whose kernels share names: the driver reuses the
    module and function handles, so what the translator worked out for the old kernel (its words,
    its tensor-map parameters) must not be used for the new one."""
    mem = FakeMemory()
    mem.device[A] = bytearray(1024)
    mem.device[B] = bytearray(1024)
    wide = ((0, 48), (48, 8), (56, 8), (64, 4))  # 48 bytes of scalars first, then x and y
    events = [
        ev.ModuleImage(MODULE, cubin, None, "cuModuleLoadData"),
        ev.Allocation(A, 1024),
        ev.Allocation(B, 1024),
        ev.LaunchBegin(kernel(), (1, 1, 1), (256, 1, 1), 0, 0, saxpy_params(2.0, A, B, 256)),
        ev.ModuleUnload(MODULE),
        ev.ModuleImage(MODULE, cubin, None, "cuModuleLoadData"),  # the same handle again
        ev.LaunchBegin(kernel(wide), (1, 1, 1), (256, 1, 1), 0, 0, bytes(48) + struct.pack("<QQi4x", B, A, 256)),
    ]
    path, t = record(tmp_path, events, mem)
    assert not t.report.errors
    with replayfmt.open(path) as cap:
        launches = [op for op in cap.iter_operations() if op.kind == m.OperationKind.LAUNCH]
        buffers = {o.address: o.id for o in cap.objects() if isinstance(o, m.Buffer)}
        assert [(r.site_offset, r.target_buffer) for r in launches[0].relocations] == [
            (8, buffers[A]),
            (16, buffers[B]),
        ]
        assert [(r.site_offset, r.target_buffer) for r in launches[1].relocations] == [
            (48, buffers[B]),
            (56, buffers[A]),
        ]


def test_a_view_pointer_inside_a_small_struct_is_relocated(tmp_path, cubin):
    """PyTorch's elementwise kernels take Array<char*, N> by value; a view's data pointer is often
    8 bytes into its storage (found in review: the arena's alignment rule must not reach them)."""
    segment = 0x7FBC_0760_0000  # in a caching-allocator segment, as CuPy's and PyTorch's are
    params = struct.pack("<2Q", segment + 0x200, segment + 0x408)
    found = one_launch(tmp_path, cubin, segment, 4096, ev.Kernel(7, "add", MODULE, ((0, 16),)), params, held=4096)
    assert [(r.site_offset, r.target_offset) for r in found] == [(0, 0x200), (8, 0x408)]
