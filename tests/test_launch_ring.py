"""Repeated launches recorded in C (launch_ring.c), without CUPTI or a GPU: the recorder's C
library is loaded here, CUPTI's callback data is built in this process's memory, and the
library's callback is called the way CUPTI calls it. A capture recorded through the ring must be
the capture recorded without it, operation for operation."""

from __future__ import annotations

import ctypes
import struct
import threading

import numpy as np
import pytest
from test_capture_source import SAXPY, SAXPY_ARGS, FakeDriver, Keep, launch_params
from test_capture_translate import MODULE, FakeMemory

import replayfmt
from replayfmt import CaptureWriter
from replayfmt.capture import events as ev
from replayfmt.capture.c_library import injection_library
from replayfmt.capture.cupti_api import DOMAIN_DRIVER_API, CallbackType
from replayfmt.capture.cupti_source import CuptiSource
from replayfmt.capture.hostfiles import HostFiles
from replayfmt.capture.launch_ring import FLAG_COOPERATIVE, FLAG_PROGRAMMATIC, RING_DTYPE, ArmedLaunch, LaunchRing
from replayfmt.capture.nccl_log import NCCL_KERNEL
from replayfmt.capture.options import RecordOptions
from replayfmt.capture.report import KernelStats
from replayfmt.capture.translate import Translator
from replayfmt.errors import ReplayUsageError
from replayfmt.format import model as m
from replayfmt.writer import LaunchTemplate

CALL_IDS = {
    "cuLaunchKernel": 307,
    "cuLaunchKernelEx": 652,
    "cuLaunchCooperativeKernel": 351,
    "cuMemAlloc_v2": 70,
    "cuModuleLoadData": 47,
    "cuEventRecord": 184,
    "cuStreamSynchronize": 131,
}
A, B = 0x7F00_0000_0000, 0x7F00_0010_0000
ENTER, EXIT = 0, 1


@pytest.fixture(scope="module")
def library(tmp_path_factory) -> ctypes.CDLL:
    try:
        path = injection_library(cache=tmp_path_factory.mktemp("lib"))
    except ReplayUsageError as exc:  # CI builds it with pip; a machine without cc cannot
        pytest.skip(str(exc))
    return ctypes.CDLL(str(path))


class Forwarded:
    """The recorder's side of the library: what it forwards, as (cbid, site)."""

    def __init__(self, library: ctypes.CDLL, also=None) -> None:
        self.calls: list[tuple[int, int]] = []
        self.also = also
        self.c_callback = CallbackType(self._callback)
        library.replayfmt_injection_forward.argtypes = [ctypes.c_int, ctypes.c_void_p]
        library.replayfmt_injection_forward(0, ctypes.cast(self.c_callback, ctypes.c_void_p))
        self.deliver = ctypes.cast(library.replayfmt_recorder_callback, CallbackType)

    def _callback(self, userdata, domain, cbid, data) -> None:
        self.calls.append((cbid, ctypes.c_uint32.from_address(data).value))
        if self.also is not None:
            self.also(userdata, domain, cbid, data)


SYMBOL = ctypes.create_string_buffer(b"saxpy")  # the driver's name of a function stays where it is


def callback_data(keep: Keep, site: int, params: int, correlation: int = 0, symbol_name=SYMBOL) -> int:
    """A CUpti_CallbackData: site, functionName, functionParams, functionReturnValue,
    symbolName, context, contextUid, correlationData, correlationId (offset 64)."""
    returned = keep.put(struct.pack("<i", 0))
    symbol = ctypes.addressof(symbol_name)
    return keep.put(
        struct.pack(
            "<I4xQQQQQI4xQI4x",
            site,
            keep.put(b"call"),
            params,
            returned,
            symbol,
            0,
            0,
            0,
            correlation,
        )
    )


def launch_ex_params(keep: Keep, function: int, arguments: list[bytes], attributes: list[tuple[int, bytes]]) -> int:
    pointers = [keep.put(a) for a in arguments]
    array = keep.put(struct.pack(f"<{len(pointers)}Q", *pointers))
    attrs = b"".join(struct.pack("<I4x", kind) + value.ljust(64, b"\0") for kind, value in attributes)
    config = keep.put(
        struct.pack("<7I4xQQI4x", 8, 1, 1, 256, 1, 1, 0, 0x6000, keep.put(attrs) if attrs else 0, len(attributes))
    )
    return keep.put(struct.pack("<QQQQ", config, function, array, 0))


def armed(function: int = 0xF00, parameters: bytes | None = None) -> ArmedLaunch:
    kernel = ev.Kernel(function, "saxpy", MODULE, tuple(SAXPY))
    block = parameters if parameters is not None else arguments_block(SAXPY_ARGS)
    return ArmedLaunch(kernel, LaunchTemplate(1, 0, block), KernelStats())


def arguments_block(arguments: list[bytes]) -> bytes:
    block = bytearray(28)
    for (offset, size), value in zip(SAXPY, arguments, strict=True):
        block[offset : offset + size] = value
    return bytes(block)


def test_a_launch_is_recorded_in_c_only_while_armed_with_its_exact_arguments(library):
    keep = Keep()
    forwarded = Forwarded(library)
    ring = LaunchRing(library, CALL_IDS)
    ring.take(disarm=True)
    launch = callback_data(keep, ENTER, launch_params(keep, 0xF00, SAXPY_ARGS), correlation=41)
    forwarded.deliver(None, DOMAIN_DRIVER_API, CALL_IDS["cuLaunchKernel"], launch)
    assert forwarded.calls == [(CALL_IDS["cuLaunchKernel"], ENTER)] and not ring.pending()  # nothing armed yet

    assert ring.arm(armed())
    for correlation in (42, 43):
        data = callback_data(keep, ENTER, launch_params(keep, 0xF00, SAXPY_ARGS), correlation=correlation)
        forwarded.deliver(None, DOMAIN_DRIVER_API, CALL_IDS["cuLaunchKernel"], data)
    other = [*SAXPY_ARGS[:3], struct.pack("<i", 1023)]  # one argument changed: the recorder must see it
    forwarded.deliver(
        None,
        DOMAIN_DRIVER_API,
        CALL_IDS["cuLaunchKernel"],
        callback_data(keep, ENTER, launch_params(keep, 0xF00, other)),
    )
    forwarded.deliver(
        None,
        DOMAIN_DRIVER_API,
        CALL_IDS["cuLaunchKernel"],
        callback_data(keep, EXIT, launch_params(keep, 0xF00, SAXPY_ARGS)),
    )
    assert forwarded.calls[1:] == [(CALL_IDS["cuLaunchKernel"], ENTER), (CALL_IDS["cuLaunchKernel"], EXIT)]
    assert ring.pending()
    repeats = ring.take(disarm=False)
    assert repeats is not None and len(repeats.launches) == 2
    first = repeats.launches[0]
    assert (int(first["function"]), int(first["stream"]), int(first["correlation"])) == (0xF00, 0x5000, 42)
    assert first["grid"].tolist() == [4, 2, 1] and first["block"].tolist() == [128, 1, 1]
    assert int(first["shared_memory"]) == 96 and repeats.launches["correlation"].tolist() == [42, 43]
    assert repeats.armed[int(first["armed"])].kernel.handle == 0xF00

    assert ring.take(disarm=True) is None  # withdrawn: the next repeat goes through the recorder
    forwarded.deliver(None, DOMAIN_DRIVER_API, CALL_IDS["cuLaunchKernel"], launch)
    assert forwarded.calls[-1] == (CALL_IDS["cuLaunchKernel"], ENTER) and not ring.pending()


def test_launches_with_attributes_keep_their_cluster_and_cooperation(library):
    keep = Keep()
    forwarded = Forwarded(library)
    ring = LaunchRing(library, CALL_IDS)
    ring.take(disarm=True)
    assert ring.arm(armed(0xE00))
    cluster = (4, struct.pack("<III", 2, 1, 1))
    cooperative = (2, struct.pack("<i", 1))
    params = launch_ex_params(keep, 0xE00, SAXPY_ARGS, [cluster, cooperative])
    forwarded.deliver(None, DOMAIN_DRIVER_API, CALL_IDS["cuLaunchKernelEx"], callback_data(keep, ENTER, params))
    repeats = ring.take(disarm=True)
    assert not forwarded.calls and repeats is not None
    (launch,) = repeats.launches
    assert launch["cluster"].tolist() == [2, 1, 1] and int(launch["flags"]) & FLAG_COOPERATIVE
    assert launch["grid"].tolist() == [8, 1, 1] and int(launch["stream"]) == 0x6000


def test_a_launch_allowing_pdl_keeps_it_and_one_triggering_an_event_goes_to_the_recorder(library):
    keep = Keep()
    forwarded = Forwarded(library)
    ring = LaunchRing(library, CALL_IDS)
    ring.take(disarm=True)
    assert ring.arm(armed(0xE00))
    pdl = (6, struct.pack("<i", 1))  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    cbid = CALL_IDS["cuLaunchKernelEx"]
    forwarded.deliver(
        None, DOMAIN_DRIVER_API, cbid, callback_data(keep, ENTER, launch_ex_params(keep, 0xE00, SAXPY_ARGS, [pdl]))
    )
    for kind in (7, 12):  # the programmatic and launch completion events: the recorder writes their records
        event = (kind, struct.pack("<Qii", 0xE7, 0, 0))
        params = launch_ex_params(keep, 0xE00, SAXPY_ARGS, [pdl, event])
        forwarded.deliver(None, DOMAIN_DRIVER_API, cbid, callback_data(keep, ENTER, params))
    repeats = ring.take(disarm=True)
    assert forwarded.calls == [(cbid, ENTER)] * 2 and repeats is not None
    (launch,) = repeats.launches
    assert int(launch["flags"]) == FLAG_PROGRAMMATIC


def test_the_ring_never_overflows_and_arguments_in_one_buffer_go_to_the_recorder(library):
    keep = Keep()
    forwarded = Forwarded(library)
    ring = LaunchRing(library, CALL_IDS)
    ring.take(disarm=True)
    assert ring.arm(armed())
    data = callback_data(keep, ENTER, launch_params(keep, 0xF00, SAXPY_ARGS))
    capacity = library.replayfmt_launches_capacity()
    for _ in range(capacity + 3):
        forwarded.deliver(None, DOMAIN_DRIVER_API, CALL_IDS["cuLaunchKernel"], data)
    assert len(forwarded.calls) == 3  # the ring full: the recorder takes the rest
    repeats = ring.take(disarm=False)
    assert repeats is not None and len(repeats.launches) == capacity
    extra = launch_params(keep, 0xF00, SAXPY_ARGS)
    ctypes.c_uint64.from_address(extra + 56).value = keep.put(b"\0" * 16)  # a CU_LAUNCH_PARAM list
    forwarded.deliver(None, DOMAIN_DRIVER_API, CALL_IDS["cuLaunchKernel"], callback_data(keep, ENTER, extra))
    assert len(forwarded.calls) == 4 and not ring.pending()
    ring.take(disarm=True)


def test_launch_exits_are_dropped_only_while_a_recorder_says_so(library):
    keep = Keep()
    forwarded = Forwarded(library)
    cbid = CALL_IDS["cuLaunchKernel"]
    exit_data = callback_data(keep, EXIT, launch_params(keep, 0xF00, SAXPY_ARGS))
    library.replayfmt_injection_skip_exit(cbid, 1)  # region mode: the recorder ignores exits
    forwarded.deliver(None, DOMAIN_DRIVER_API, cbid, exit_data)
    library.replayfmt_injection_skip_exit(cbid, 0)  # a kernel-mode recorder after it needs them
    forwarded.deliver(None, DOMAIN_DRIVER_API, cbid, exit_data)
    assert forwarded.calls == [(cbid, EXIT)]


NCCL = ctypes.create_string_buffer(b"ncclDevKernel_AllReduce_Sum_f32_RING_LL")


def test_an_nccl_kernel_s_exit_reaches_the_recorder_in_region_mode_too(library):
    keep = Keep()
    forwarded = Forwarded(library)
    cbid = CALL_IDS["cuLaunchKernel"]
    params = launch_params(keep, 0xF00, SAXPY_ARGS)
    library.replayfmt_injection_skip_exit(cbid, 1)
    forwarded.deliver(None, DOMAIN_DRIVER_API, cbid, callback_data(keep, EXIT, params))  # saxpy's: dropped
    forwarded.deliver(None, DOMAIN_DRIVER_API, cbid, callback_data(keep, EXIT, params, symbol_name=NCCL))
    library.replayfmt_injection_skip_exit(cbid, 0)
    assert forwarded.calls == [(cbid, EXIT)]  # its results are copied aside after it (collective_events)


@pytest.mark.parametrize(
    ("name", "reaches"),
    [
        (b"_Z29ncclDevKernel_AllReduce_Sum_f32_RING_LLP24ncclDevKernelArgsStorageILm4096EE", True),
        (b"ncclKernel_AllReduce_RING_LL_Sum_float", True),
        (b"_Z17fused_nccl_helperPf", False),  # "nccl" inside a program kernel's name
        (b"saxpy_nccl", False),
    ],
)
def test_only_a_name_that_starts_as_nccl_s_kernels_do_reaches_the_recorder(library, name, reaches):
    keep = Keep()
    forwarded = Forwarded(library)
    cbid = CALL_IDS["cuLaunchKernel"]
    symbol = ctypes.create_string_buffer(name)
    library.replayfmt_injection_skip_exit(cbid, 1)
    forwarded.deliver(
        None,
        DOMAIN_DRIVER_API,
        cbid,
        callback_data(keep, EXIT, launch_params(keep, 0xF00, SAXPY_ARGS), symbol_name=symbol),
    )
    library.replayfmt_injection_skip_exit(cbid, 0)
    assert forwarded.calls == ([(cbid, EXIT)] if reaches else [])
    assert bool(NCCL_KERNEL.search(name.decode())) == reaches  # the recorder reads it alike


def test_a_stream_capture_arms_nothing(library):
    ring = LaunchRing(library, CALL_IDS)
    ring.enabled = False
    assert not ring.arm(armed())


# -- a capture through the ring is the capture without it --------------------------------------


def record(tmp_path, name: str, library: ctypes.CDLL | None, steps) -> tuple:
    """Record ``steps`` (callables given (deliver, keep)) into a capture; with ``library``
    through its callback and ring, else straight into the source's callback. Returns the
    operations, the report and how many launch entries reached the source."""
    entries = [0]
    memory = FakeMemory()
    memory.device[A] = bytearray(np.arange(1024, dtype=np.float32).tobytes())
    memory.device[B] = bytearray(np.ones(1024, dtype=np.float32).tobytes())
    path = tmp_path / f"{name}.kreplay"
    keep = Keep()
    with CaptureWriter(path) as writer:
        ring = LaunchRing(library, CALL_IDS) if library is not None else None
        if ring is not None:
            ring.take(disarm=True)
        translator = Translator(writer, RecordOptions(), memory, host_files=HostFiles(tmp_path / "maps"), ring=ring)
        source = CuptiSource(
            None, translator.handle, threading.local(), launch_results=False, cu=FakeDriver(SAXPY, 0x1234), ring=ring
        )
        source.route(CALL_IDS)

        def counted(userdata, domain, cbid, data) -> None:
            launches = (CALL_IDS["cuLaunchKernel"], CALL_IDS["cuLaunchKernelEx"])
            if cbid in launches and ctypes.c_uint32.from_address(data).value == ENTER:
                entries[0] += 1
            source._callback(userdata, domain, cbid, data)

        # the Forwarded is kept until the recording ends: the library calls its callback, which a
        # collected Forwarded would free under it (a crash, whenever the cycle collector ran)
        forwarded = Forwarded(library, counted) if library is not None else None
        deliver = forwarded.deliver if forwarded is not None else counted
        from samples import compiled_cubin

        load = keep.put(struct.pack("<QQ", keep.put(struct.pack("<Q", 0x1234)), keep.put(compiled_cubin())))
        deliver(None, DOMAIN_DRIVER_API, CALL_IDS["cuModuleLoadData"], callback_data(keep, EXIT, load))
        translator.handle(ev.Allocation(A, 4096))
        translator.handle(ev.Allocation(B, 4096))
        translator.handle(ev.StreamCreated(0x5000))
        translator.start("step")
        for step in steps:
            step(deliver, keep)
        source.settle()
        translator.stop()
        del forwarded
    with replayfmt.open(path) as capture:
        operations = [
            (op.kind, getattr(op, "grid", None), getattr(op, "parameters", None), getattr(op, "stream", None))
            + ((op.flags,) if isinstance(op, m.Launch) else ())
            for op in capture.iter_operations()
        ]
    return operations, translator.report, entries[0]


def launch(arguments: list[bytes], grid=(4, 2, 1)):
    def step(deliver, keep) -> None:
        params = launch_params(keep, 0xF00, arguments, grid=grid)
        deliver(None, DOMAIN_DRIVER_API, CALL_IDS["cuLaunchKernel"], callback_data(keep, ENTER, params))
        deliver(None, DOMAIN_DRIVER_API, CALL_IDS["cuLaunchKernel"], callback_data(keep, EXIT, params))

    return step


def launch_ex(attributes: list[tuple[int, bytes]]):
    def step(deliver, keep) -> None:
        params = launch_ex_params(keep, 0xF00, SAXPY_ARGS, attributes)
        deliver(None, DOMAIN_DRIVER_API, CALL_IDS["cuLaunchKernelEx"], callback_data(keep, ENTER, params))

    return step


def event_record(deliver, keep) -> None:
    params = keep.put(struct.pack("<QQ", 0xE1, 0x5000))
    deliver(None, DOMAIN_DRIVER_API, CALL_IDS["cuEventRecord"], callback_data(keep, ENTER, params))


def allocation(address: int):
    def step(deliver, keep) -> None:
        params = keep.put(struct.pack("<QQ", keep.put(struct.pack("<Q", address)), 4096))
        deliver(None, DOMAIN_DRIVER_API, CALL_IDS["cuMemAlloc_v2"], callback_data(keep, EXIT, params))

    return step


def test_a_capture_through_the_ring_is_the_capture_without_it(tmp_path, library):
    swapped = [SAXPY_ARGS[0], SAXPY_ARGS[2], SAXPY_ARGS[1], SAXPY_ARGS[3]]
    steps = (
        [launch(SAXPY_ARGS)] * 5
        + [event_record, launch(SAXPY_ARGS, grid=(8, 1, 1)), event_record] * 3  # kept armed around events
        + [launch(swapped)] * 4
        + [allocation(0x7F00_0020_0000)]  # withdraws every arming
        + [launch(SAXPY_ARGS)] * 3
    )
    plain, plain_report, plain_entries = record(tmp_path, "plain", None, steps)
    ringed, ring_report, ring_entries = record(tmp_path, "ringed", library, steps)
    assert ringed == plain
    launches = sum(1 for op in plain if op[1] is not None)
    assert launches == plain_entries == 5 + 3 + 4 + 3
    # through Python: each first launch of new arguments and the repeat after it, which arms
    # them (three times: the allocation withdrew every arming); the ring took the other 9
    assert ring_entries == 6
    assert ring_report.kernels["saxpy"].captured == plain_report.kernels["saxpy"].captured == launches
    assert ring_report.kernels["saxpy"].occurrences == plain_report.kernels["saxpy"].occurrences


def test_programmatic_launches_through_the_ring_are_the_capture_without_it(tmp_path, library):
    pdl = (6, struct.pack("<i", 1))
    event = (7, struct.pack("<Qii", 0xE1, 0, 0))  # a programmatic event: its record follows the launch
    steps = [launch_ex([pdl])] * 5 + [launch_ex([pdl, event])] + [launch_ex([pdl])] * 4 + [launch_ex([])] * 3
    plain, _, entries = record(tmp_path, "plain", None, steps)
    ringed, _, ring_entries = record(tmp_path, "ringed", library, steps)
    assert ringed == plain and entries == 13 and ring_entries < entries  # the ring took repeats
    flags = [op[4] for op in plain if op[0] == m.OperationKind.LAUNCH]
    assert flags == [m.LAUNCH_FLAG_PROGRAMMATIC] * 10 + [0] * 3  # each launch's own, not its arming's
    kinds = [op[0] for op in plain if op[0] in (m.OperationKind.LAUNCH, m.OperationKind.EVENT_RECORD)]
    assert kinds.index(m.OperationKind.EVENT_RECORD) == 6  # right after the sixth launch


def test_launches_written_at_once_read_back_as_written_one_by_one(tmp_path):
    rng = np.random.default_rng(7)
    templates = [
        LaunchTemplate(1, 0, bytes(range(24)), (m.Relocation(0, 1, 8, 16, 0),)),
        LaunchTemplate(2, 1, b"\x05" * 40),
        LaunchTemplate(1, 2, b"", (m.Relocation(0, 2, 0, 0, 0), m.Relocation(0, 1, 8, 4, 0))),
    ]
    which = rng.integers(0, len(templates), 50)
    shapes = rng.integers(0, 1 << 16, (50, 12)).astype(np.uint32)
    shapes[:, 1] = 0  # flags
    written = []
    for name, at_once in (("once", True), ("each", False)):
        path = tmp_path / f"{name}.kreplay"
        with CaptureWriter(path, batch_operations=7) as writer:  # launches cross several batches
            writer.launch(executable=1, function=0, grid=(1, 1, 1), block=(1, 1, 1))
            if at_once:
                assert writer.launches(templates, which, shapes) == 1
            else:
                for i, row in zip(which.tolist(), shapes.tolist(), strict=True):
                    t = templates[i]
                    writer.launch(
                        executable=t.executable, function=t.function, stream=row[0], flags=row[1],
                        grid=tuple(row[2:5]), block=tuple(row[5:8]), cluster=tuple(row[8:11]),
                        shared_memory=row[11], parameters=t.parameters, relocations=t.relocations,
                    )  # fmt: skip
            writer.launch(executable=2, function=0, grid=(2, 1, 1), block=(1, 1, 1))
        with replayfmt.open(path) as capture:
            written.append([repr(op) for op in capture.iter_operations()])
    assert written[0] == written[1] and len(written[0]) == 52


def test_a_withdrawal_keeps_the_launches_already_in_the_ring(library):
    keep = Keep()
    forwarded = Forwarded(library)
    ring = LaunchRing(library, CALL_IDS)
    assert ring.arm(armed())
    data = callback_data(keep, ENTER, launch_params(keep, 0xF00, SAXPY_ARGS))
    forwarded.deliver(None, DOMAIN_DRIVER_API, CALL_IDS["cuLaunchKernel"], data)
    ring.withdraw()  # an annotation, a stream capture: the next launch goes through the recorder
    forwarded.deliver(None, DOMAIN_DRIVER_API, CALL_IDS["cuLaunchKernel"], data)
    assert len(forwarded.calls) == 1
    repeats = ring.take(disarm=False)
    assert repeats is not None and len(repeats.launches) == 1 and len(repeats.armed) == 1


def test_ring_launches_on_a_stream_new_to_the_region_are_bound_from_their_first_launch(tmp_path):
    memory = FakeMemory()
    with CaptureWriter(tmp_path / "c.kreplay") as writer:
        translator = Translator(writer, RecordOptions(), memory, host_files=HostFiles(tmp_path / "maps"))
        translator.start("step")
        launches = np.zeros(3, RING_DTYPE)
        launches["stream"] = 0x6000  # never seen: its object is written before the launches
        launches["grid"], launches["block"], launches["armed"] = (1, 1, 1), (32, 1, 1), 7
        event = ev.RepeatedLaunches(launches, {7: armed()})
        translator.devices.current  # noqa: B018 (the device is written when first needed: here, before the count)
        before = writer.operation_count
        translator.handle(event)
        assert writer.operation_count == before + 4 and event.first == before + 1
        translator.stop()
    with replayfmt.open(tmp_path / "c.kreplay") as capture:
        kinds = [op.kind for op in capture.iter_operations()][before : before + 4]
    assert kinds == [m.OperationKind.CREATE_OBJECT] + [m.OperationKind.LAUNCH] * 3


def test_launches_written_at_once_are_sealed_by_bytes_as_one_by_one(tmp_path):
    template = LaunchTemplate(1, 0, bytes(range(256)) * 128)  # 32 KiB of arguments each
    shapes = np.ones((600, 12), dtype=np.uint32)
    path = tmp_path / "big.kreplay"
    with CaptureWriter(path, batch_bytes=1 << 20) as writer:
        writer.launches([template], np.zeros(600, np.int64), shapes)
    with replayfmt.open(path) as capture:
        assert sum(1 for _ in capture.iter_operations()) == 600
        assert capture.batch_count >= 600 * (32 << 10) // (1 << 20)  # about 1 MiB each, not one
