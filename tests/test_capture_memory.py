"""Every allocation API a framework uses, and host functions, through the translator (synthetic
events, no GPU) and the CUPTI source's decoders (parameter structs built in this process)."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from test_capture_source import SAXPY, FakeDriver, Keep, callback_data, source_with
from test_capture_translate import MODULE, FakeMemory, kernel, record, saxpy_params

import replayfmt
from replayfmt.capture import events as ev
from replayfmt.capture.allocations import MappedRanges
from replayfmt.capture.cupti_api import DOMAIN_DRIVER_API
from replayfmt.dump import views
from replayfmt.format import model as m
from replayfmt.replay.plan import PlanOptions, build_plan

MiB = 1 << 20
BASE = 0x7F10_0000_0000
HOST = 0x7F20_0000_0000


def buffers_of(cap) -> list[m.Buffer]:
    return [o for o in cap.objects() if isinstance(o, m.Buffer)]


def test_mapped_pieces_merge_into_extents_and_split_when_unmapped():
    vmm = MappedRanges()
    vmm.reserve(BASE, 64 * MiB)
    assert vmm.map(BASE, 20 * MiB) == ([], [(BASE, 20 * MiB)])
    assert vmm.map(BASE + 20 * MiB, 20 * MiB) == ([(BASE, 20 * MiB)], [(BASE, 40 * MiB)])  # it grows
    assert vmm.map(BASE + 50 * MiB, 2 * MiB) == ([], [(BASE + 50 * MiB, 2 * MiB)])  # a gap: its own extent
    assert vmm.unmap(BASE + 30 * MiB, 10 * MiB) == ([(BASE, 40 * MiB)], [(BASE, 30 * MiB)])  # cut a piece
    assert vmm.unmap(BASE, 30 * MiB) == ([(BASE, 30 * MiB)], [])
    other = BASE + 64 * MiB  # an adjacent reservation never merges with this one
    vmm.reserve(other, 8 * MiB)
    vmm.map(BASE + 62 * MiB, 2 * MiB)
    assert vmm.map(other, 2 * MiB) == ([], [(other, 2 * MiB)])


def test_an_expandable_segment_that_grows_replays_in_one_buffer(tmp_path):
    """PyTorch's expandable segments: 20 MiB mapped, written, then 20 MiB more mapped and a
    copy that spans both pieces (run-replay refused this before: 'lies outside buffer 2')."""
    mem = FakeMemory()
    mem.device[BASE] = bytearray(40 * MiB)
    mem.host[0x1000] = b"\x01" * (16 * MiB)
    events = [
        ev.AddressReserved(BASE, 1 << 30),
        ev.Mapped(BASE, 20 * MiB),
        ev.Memset(BASE + 4096, 0, 4, 16),  # touches the first piece: a 20 MiB buffer is written
        ev.Mapped(BASE + 20 * MiB, 20 * MiB),
        ev.Copy(ev.CopyDirection.H2D, BASE + 16 * MiB, 0x1000, 16 * MiB, 0, True, "cuMemcpyHtoDAsync_v2"),
        ev.Unmapped(BASE + 20 * MiB, 20 * MiB),
        ev.Unmapped(BASE, 20 * MiB),
        ev.AddressFreed(BASE, 1 << 30),
    ]
    path, t = record(tmp_path, events, mem)
    assert not t.report.errors and not t.report.unsupported
    with replayfmt.open(path) as cap:
        first, grown = buffers_of(cap)
        assert (first.size, grown.size) == (20 * MiB, 40 * MiB) and first.address == grown.address == BASE
        ops = list(cap.iter_operations())
        copy = next(op for op in ops if op.kind == m.OperationKind.COPY_HOST_TO_DEVICE and op.dst_offset)
        assert (copy.dst_buffer, copy.dst_offset, copy.size) == (grown.id, 16 * MiB, 16 * MiB)
        destroyed = [op.object for op in ops if op.kind == m.OperationKind.DESTROY_OBJECT]
        assert destroyed == [first.id, grown.id]
        assert not build_plan(cap, PlanOptions()).problems
    assert t.allocations.find(BASE) is None


def test_stream_ordered_allocations_from_a_pool_reuse_addresses(tmp_path, cubin):
    mem = FakeMemory()
    a = 0x7F30_0000_0000
    mem.device[a] = bytearray(np.arange(64, dtype=np.float32).tobytes())
    launch = ev.LaunchBegin(kernel(), (1, 1, 1), (16, 1, 1), 0, 0x10, saxpy_params(2.0, a, a, 16))
    events = [
        ev.ModuleImage(MODULE, cubin, None),
        ev.StreamCreated(0x10),
        ev.Allocation(a, 256, ev.MemoryApi.DEVICE, "cuMemAllocFromPoolAsync"),
        launch,
        ev.Free(a, "cuMemFreeAsync"),
        ev.Allocation(a, 128, ev.MemoryApi.DEVICE, "cuMemAllocAsync"),
        launch,  # the pool hands it out again
    ]
    path, _ = record(tmp_path, events, mem)
    with replayfmt.open(path) as cap:
        pooled, again = buffers_of(cap)
        assert (pooled.size, pooled.label, again.size, again.label) == (
            256,
            "cuMemAllocFromPoolAsync",
            128,
            "cuMemAllocAsync",
        )
        launches = [op for op in cap.iter_operations() if op.kind == m.OperationKind.LAUNCH]
        assert [{r.target_buffer for r in op.relocations} for op in launches] == [{pooled.id}, {again.id}]
        assert not build_plan(cap, PlanOptions()).problems


@pytest.mark.parametrize("api", [ev.MemoryApi.HOST_PINNED, ev.MemoryApi.MANAGED])
def test_host_visible_memory_kernels_read_is_uploaded_again_when_the_host_changed_it(tmp_path, cubin, api):
    mem = FakeMemory()
    out = 0x7F40_0000_0000
    mem.device[HOST] = bytearray(np.full(16, 1, np.float32).tobytes())  # the host writes it directly
    mem.device[out] = bytearray(64)
    launch = ev.LaunchBegin(kernel(), (1, 1, 1), (16, 1, 1), 0, 0, saxpy_params(1.0, HOST, out, 16))

    def host_writes():
        mem.device[HOST][:] = np.full(16, 5, np.float32).tobytes()
        return ev.StreamSynchronized(0)

    call = {ev.MemoryApi.HOST_PINNED: "cuMemHostRegister_v2", ev.MemoryApi.MANAGED: "cuMemAllocManaged"}[api]
    events = [
        ev.ModuleImage(MODULE, cubin, None),
        ev.Allocation(HOST, 64, api, call),
        ev.Allocation(out, 64),
        launch,
        launch,
        host_writes,
        launch,
    ]
    path, t = record(tmp_path, events, mem)
    assert not t.report.unsupported
    with replayfmt.open(path) as cap:
        host = next(b for b in buffers_of(cap) if b.address == HOST)
        assert (
            host.memory
            == {ev.MemoryApi.HOST_PINNED: m.MemoryKind.HOST_PINNED, ev.MemoryApi.MANAGED: m.MemoryKind.MANAGED}[api]
        )
        kinds = [op.kind.label for op in cap.iter_operations() if op.kind.label in ("launch", "copy_h2d", "state")]
        # the first touch is starting state; what the host wrote later is uploaded as the program's work
        writes = [
            op for op in cap.iter_operations() if isinstance(op, m.State | m.Copy) and op.kind.label != "copy_d2h"
        ]
        host_writes = [op for op in writes if getattr(op, "buffer", getattr(op, "dst_buffer", 0)) == host.id]
        assert kinds == ["state", "state", "launch", "launch", "copy_h2d", "launch"]
        values = [np.frombuffer(cap.read_payload(w.payload), np.float32)[0] for w in host_writes]
        assert [w.kind.label for w in host_writes] == ["state", "copy_h2d"] and values == [1.0, 5.0]
        assert not build_plan(cap, PlanOptions()).problems


def test_registered_memory_kernels_reach_at_another_device_address(tmp_path, cubin):
    mem = FakeMemory()
    device_view, out = 0x7F50_0000_0000, 0x7F40_0000_0000
    mem.device[device_view] = bytearray(np.full(1024, 3, np.float32).tobytes())
    mem.device[out] = bytearray(64)
    events = [
        ev.ModuleImage(MODULE, cubin, None),
        ev.Allocation(HOST, 4096, ev.MemoryApi.HOST_PINNED, "cuMemHostRegister_v2"),
        ev.HostDevicePointer(HOST + 64, device_view + 64),
        ev.Allocation(out, 64),
        ev.LaunchBegin(kernel(), (1, 1, 1), (16, 1, 1), 0, 0, saxpy_params(1.0, device_view, out, 16)),
        ev.Free(HOST, "cuMemHostUnregister"),
    ]
    path, t = record(tmp_path, events, mem)
    with replayfmt.open(path) as cap:
        view = next(b for b in buffers_of(cap) if b.address == device_view)
        assert view.memory == m.MemoryKind.HOST_PINNED and view.size == 4096
        launch = next(op for op in cap.iter_operations() if op.kind == m.OperationKind.LAUNCH)
        assert view.id in {r.target_buffer for r in launch.relocations}
        assert not build_plan(cap, PlanOptions()).problems
    assert t.allocations.find(device_view) is None and t.allocations.find(HOST) is None  # both gone


def test_registered_memory_below_4_gib_is_still_found(tmp_path, cubin):
    """A non-PIE interpreter's heap lies below 4 GiB; a small word there is a number unless host
    memory kernels read lies there (numba's cuda.mapped registers a NumPy array on that heap)."""
    mem = FakeMemory()
    heap, out = 0x0260_0000, 0x7F40_0000_0000
    mem.device[heap] = bytearray(np.full(16, 3, np.float32).tobytes())
    mem.device[out] = bytearray(64)
    launch = ev.LaunchBegin(kernel(), (1, 1, 1), (16, 1, 1), 0, 0, saxpy_params(1.0, heap, out, 16))
    events = [
        ev.ModuleImage(MODULE, cubin, None),
        ev.Allocation(heap, 64, ev.MemoryApi.HOST_PINNED, "cuMemHostRegister_v2"),
        ev.Allocation(out, 64),
        launch,
    ]
    path, t = record(tmp_path, events, mem)
    with replayfmt.open(path) as cap:
        registered = next(b for b in buffers_of(cap) if b.address == heap)
        op = next(op for op in cap.iter_operations() if op.kind == m.OperationKind.LAUNCH)
        assert (8, registered.id) in {(r.site_offset, r.target_buffer) for r in op.relocations}
    assert t.allocations.pointer_low == heap
    t.handle(ev.Free(heap, "cuMemHostUnregister"))
    assert t.allocations.pointer_low == 1 << 32  # numbers below 4 GiB are numbers again


def test_host_functions_keep_their_place_in_the_stream(tmp_path):
    mem = FakeMemory()
    path, _ = record(
        tmp_path,
        [
            ev.StreamCreated(0x10),
            ev.EventCreated(0x30),
            ev.EventRecorded(0x30, 0x10),
            ev.HostFunction(0x10, "cuLaunchHostFunc"),
            ev.StreamSynchronized(0x10),
        ],
        mem,
    )
    with replayfmt.open(path) as cap:
        ops = [op for op in cap.iter_operations() if op.kind.label not in ("create", "scope_begin", "scope_end")]
        stream = next(o for o in cap.objects() if isinstance(o, m.Stream))
        assert [op.kind.label for op in ops][:3] == ["event_record", "host_function", "stream_synchronize"]
        assert ops[1] == m.HostFunction(ops[1].index, stream.id)
        assert not build_plan(cap, PlanOptions()).problems
        row = views.Dumper(cap).operation_row(ops[1])
        assert row == {"kind": "host_function", "index": ops[1].index, "stream": stream.id}


IDS = {
    "cuMemAddressReserve": 900,
    "cuMemAddressFree": 901,
    "cuMemMap": 902,
    "cuMemUnmap": 903,
    "cuMemHostRegister_v2": 904,
    "cuMemHostUnregister": 905,
    "cuLaunchHostFunc": 906,
    "cuStreamAddCallback_ptsz": 907,
    "cuMemAllocAsync": 908,
    "cuMemFreeAsync": 909,
    "cuMemHostGetDevicePointer_v2": 910,
}


def test_the_source_decodes_vmm_host_memory_pools_and_host_functions():
    keep = Keep()
    source, seen = source_with(FakeDriver(SAXPY, module=1))
    source.route(IDS)

    def call(name: str, site: int, params: bytes) -> None:
        source._callback(None, DOMAIN_DRIVER_API, IDS[name], callback_data(keep, site, keep.put(params)))

    out = keep.put(struct.pack("<Q", BASE))
    call("cuMemAddressReserve", 1, struct.pack("<QQQQQ", out, 1 << 30, 0, 0, 0))
    call("cuMemMap", 1, struct.pack("<QQQQQ", BASE, 2 * MiB, 0, 0xAB, 0))
    call("cuMemUnmap", 0, struct.pack("<QQ", BASE, 2 * MiB))
    call("cuMemAddressFree", 0, struct.pack("<QQ", BASE, 1 << 30))
    call("cuMemHostRegister_v2", 1, struct.pack("<QQI4x", HOST, 4096, 2))
    call("cuMemHostGetDevicePointer_v2", 1, struct.pack("<QQI4x", keep.put(struct.pack("<Q", BASE)), HOST, 0))
    call("cuMemHostUnregister", 0, struct.pack("<Q", HOST))
    call("cuLaunchHostFunc", 0, struct.pack("<QQQ", 0x10, 0xF00, 0))
    call("cuStreamAddCallback_ptsz", 0, struct.pack("<QQQI4x", 0x20, 0xF00, 0, 0))
    call("cuMemAllocAsync", 1, struct.pack("<QQQ", out, 512, 0x10))
    call("cuMemFreeAsync", 0, struct.pack("<QQ", BASE, 0x10))
    assert seen == [
        ev.AddressReserved(BASE, 1 << 30, "cuMemAddressReserve"),
        ev.Mapped(BASE, 2 * MiB, "cuMemMap"),
        ev.Unmapped(BASE, 2 * MiB, "cuMemUnmap"),
        ev.AddressFreed(BASE, 1 << 30, "cuMemAddressFree"),
        ev.Allocation(HOST, 4096, ev.MemoryApi.HOST_PINNED, "cuMemHostRegister_v2"),
        ev.HostDevicePointer(HOST, BASE, "cuMemHostGetDevicePointer_v2"),
        ev.Free(HOST, "cuMemHostUnregister"),
        ev.HostFunction(0x10, "cuLaunchHostFunc"),
        ev.HostFunction(0x20, "cuStreamAddCallback_ptsz"),
        ev.Allocation(BASE, 512, ev.MemoryApi.DEVICE, "cuMemAllocAsync"),
        ev.Free(BASE, "cuMemFreeAsync"),
    ]


def test_a_device_to_host_copy_from_pinned_memory_is_recorded(tmp_path):
    """XLA memsets small pinned host buffers on a stream and copies them to the host: the copy
    reads memory the program pinned while the recorder listened, so it is recorded, not refused."""
    mem = FakeMemory()
    mem.device[HOST] = bytearray(b"\x07" * 8)  # what the host left in it before the region
    events = [
        ev.Allocation(HOST, 8, ev.MemoryApi.HOST_PINNED, "cuMemHostAlloc"),
        ev.Memset(HOST, 0, 4, 1, 0x10, "cuMemsetD32Async"),  # half of it: the rest is starting state
        ev.Copy(ev.CopyDirection.D2H, 0x1000, HOST, 8, 0x10, True, "cuMemcpyDtoHAsync_v2"),
    ]
    path, t = record(tmp_path, events, mem)
    assert not t.report.unsupported and not t.report.errors
    with replayfmt.open(path) as cap:
        ops = [op for op in cap.iter_operations() if op.kind.label in ("state", "memset", "copy_d2h", "unsupported")]
        pinned = next(b for b in buffers_of(cap) if b.memory == m.MemoryKind.HOST_PINNED)
        assert [op.kind.label for op in ops] == ["state", "memset", "copy_d2h"]
        assert ops[2].src_buffer == pinned.id and ops[2].size == 8
        assert not build_plan(cap, PlanOptions()).problems
