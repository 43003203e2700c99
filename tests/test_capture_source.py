"""The CUPTI source's decoding, without CUPTI or a GPU: driver parameter structs and callback
data are built in this process's memory, a stand-in plays the driver, and the source's
callback is called the way CUPTI calls it."""

from __future__ import annotations

import ctypes
import struct
import sys
import threading
from types import SimpleNamespace

import pytest
from samples import compiled_cubin

from replayfmt.capture import events as ev
from replayfmt.capture.cupti_api import DOMAIN_DRIVER_API, DOMAIN_RESOURCE, RESOURCE_MODULE_LOADED
from replayfmt.capture.cupti_source import CuptiSource
from replayfmt.capture.process_memory import c_string, image_bytes, read, u64

CALL_IDS = {
    "cuLaunchKernel": 307,
    "cuLaunchKernelEx": 652,
    "cuMemAlloc_v2": 70,
    "cuModuleLoadData": 47,
    "cuMemsetD32Async": 170,
}
SUCCESS = 0


class Keep:
    """Owns ctypes buffers for a test, handing out their addresses."""

    def __init__(self) -> None:
        self.buffers: list[ctypes.Array] = []

    def put(self, data: bytes) -> int:
        buffer = ctypes.create_string_buffer(data, len(data) + 1)
        self.buffers.append(buffer)
        return ctypes.addressof(buffer)


class FakeDriver:
    """Answers the source's driver queries for CUfunctions (module handle 0 = unknown)."""

    CUresult = SimpleNamespace(CUDA_SUCCESS=SUCCESS)

    def __init__(self, layout: list[tuple[int, int]], module: int) -> None:
        self.layout, self.module = layout, module

    def cuFuncGetModule(self, handle):
        return SUCCESS, self.module

    def cuFuncGetParamInfo(self, handle, index):
        if index < len(self.layout):
            return (SUCCESS, *self.layout[index])
        return 1, 0, 0

    def cuLibraryGetModule(self, library):
        return 1, 0


def callback_data(keep: Keep, site: int, params: int, result: int = SUCCESS, symbol: str = "") -> int:
    """A CUpti_CallbackData: site, functionName, functionParams, functionReturnValue, symbolName."""
    returned = keep.put(struct.pack("<i", result))
    name = keep.put(symbol.encode()) if symbol else 0
    return keep.put(struct.pack("<I4xQQQQ", site, keep.put(b"call"), params, returned, name))


def source_with(driver: FakeDriver, launch_results: bool = False) -> tuple[CuptiSource, list[ev.Event]]:
    seen: list[ev.Event] = []
    source = CuptiSource(None, seen.append, threading.local(), launch_results=launch_results, cu=driver)
    source.route(CALL_IDS)
    return source, seen


def launch_params(keep: Keep, function: int, arguments: list[bytes], grid=(4, 2, 1), block=(128, 1, 1)) -> int:
    pointers = [keep.put(a) for a in arguments]
    array = keep.put(struct.pack(f"<{len(pointers)}Q", *pointers))
    return keep.put(struct.pack("<Q7I4xQQQ", function, *grid, *block, 96, 0x5000, array, 0))


SAXPY = [(0, 4), (8, 8), (16, 8), (24, 4)]
SAXPY_ARGS = [
    struct.pack("<f", 2.0),
    struct.pack("<Q", 0x7F00_0000_0000),
    struct.pack("<Q", 0x7F00_0010_0000),
    struct.pack("<i", 1024),
]


def test_process_memory_reads_words_strings_and_images():
    keep = Keep()
    address = keep.put(struct.pack("<QQ", 7, 1 << 40) + b"name\0")
    assert u64(address) == 7 and u64(address + 8) == 1 << 40
    assert read(address, 8) == struct.pack("<Q", 7) and c_string(address + 16) == "name" and c_string(0) == ""
    assert image_bytes(keep.put(b".version 8.0\n.target sm_90\n")) == b".version 8.0\n.target sm_90\n"
    fatbin = struct.pack("<IHHQ", 0xBA55ED50, 1, 16, 32) + bytes(range(32)) + b"trailing"
    assert image_bytes(keep.put(fatbin)) == fatbin[:48]
    wrapper = struct.pack("<IIQQ", 0x466243B1, 1, keep.put(fatbin), 0)
    assert image_bytes(keep.put(wrapper)) == fatbin[:48]


def test_a_launch_is_decoded_with_its_arguments_laid_out():
    keep = Keep()
    source, seen = source_with(FakeDriver(SAXPY, module=0xABC))
    ptx = b".version 8.0\n.target sm_90\n.visible .entry saxpy()\n{\n}\n"
    load = keep.put(struct.pack("<QQ", keep.put(struct.pack("<Q", 0xABC)), keep.put(ptx)))
    source._callback(None, DOMAIN_DRIVER_API, CALL_IDS["cuModuleLoadData"], callback_data(keep, 1, load))
    params = launch_params(keep, 0xF00, SAXPY_ARGS)
    for site in (0, 1):
        source._callback(
            None, DOMAIN_DRIVER_API, CALL_IDS["cuLaunchKernel"], callback_data(keep, site, params, symbol="saxpy")
        )
    image, launch = seen
    assert image == ev.ModuleImage(("module", 0xABC), ptx, None, "cuModuleLoadData")
    assert isinstance(launch, ev.LaunchBegin) and launch.call == "cuLaunchKernel"
    assert launch.kernel == ev.Kernel(0xF00, "saxpy", ("module", 0xABC), tuple(SAXPY))
    assert (launch.grid, launch.block, launch.shared_memory, launch.stream) == ((4, 2, 1), (128, 1, 1), 96, 0x5000)
    expected = SAXPY_ARGS[0] + b"\0" * 4 + SAXPY_ARGS[1] + SAXPY_ARGS[2] + SAXPY_ARGS[3]
    assert launch.parameters == expected  # padding between a (4 bytes) and x (8-aligned) is zero


def test_a_launch_ex_carries_its_cluster_and_cooperative_attributes():
    keep = Keep()
    source, seen = source_with(FakeDriver(SAXPY, module=0xABC))
    cluster = struct.pack("<I4xIII", 4, 2, 1, 1).ljust(72, b"\0")  # CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    cooperative = struct.pack("<I4xi", 2, 1).ljust(72, b"\0")
    attributes = keep.put(cluster + cooperative)
    config = keep.put(struct.pack("<7I4xQQI", 8, 1, 1, 64, 1, 1, 1024, 0x6000, attributes, 2))
    pointers = keep.put(struct.pack("<4Q", *[keep.put(a) for a in SAXPY_ARGS]))
    params = keep.put(struct.pack("<QQQQ", config, 0xF00, pointers, 0))
    data = callback_data(keep, 0, params, symbol="saxpy")
    source._callback(None, DOMAIN_DRIVER_API, CALL_IDS["cuLaunchKernelEx"], data)
    (launch,) = seen
    assert isinstance(launch, ev.LaunchBegin), launch
    assert (launch.grid, launch.block, launch.shared_memory, launch.stream) == ((8, 1, 1), (64, 1, 1), 1024, 0x6000)
    assert launch.cluster == (2, 1, 1) and launch.cooperative and launch.kernel.name == "saxpy"


def test_a_decoding_failure_is_recorded_not_raised():
    class BrokenDriver(FakeDriver):
        def cuFuncGetModule(self, handle):
            raise RuntimeError("driver went away")

    keep = Keep()
    source, seen = source_with(BrokenDriver(SAXPY, module=0xABC))
    params = launch_params(keep, 0xF00, SAXPY_ARGS)
    source._callback(None, DOMAIN_DRIVER_API, CALL_IDS["cuLaunchKernel"], callback_data(keep, 0, params, symbol="k"))
    (problem,) = seen
    assert isinstance(problem, ev.NotReproducible) and problem.call == "cuLaunchKernel"
    assert "failed to decode it (RuntimeError: driver went away, test_capture_source.py:" in problem.reason


def test_launch_results_are_reported_only_when_asked():
    keep = Keep()
    source, seen = source_with(FakeDriver(SAXPY, module=0xABC), launch_results=True)
    params = launch_params(keep, 0xF00, SAXPY_ARGS)
    source._callback(None, DOMAIN_DRIVER_API, CALL_IDS["cuLaunchKernel"], callback_data(keep, 1, params, result=700))
    assert seen == [ev.LaunchEnd(0x5000, 1)]


def test_an_nccl_kernel_s_launch_result_is_reported_in_region_mode_too():
    """The recorder copies an NCCL call's results aside after its kernel, once the launch returned."""
    keep = Keep()
    source, seen = source_with(FakeDriver(SAXPY, module=0xABC))
    params = launch_params(keep, 0xF00, SAXPY_ARGS)
    launch = CALL_IDS["cuLaunchKernel"]
    nccl = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
    for site, symbol in ((0, "saxpy"), (1, "saxpy")):
        source._callback(None, DOMAIN_DRIVER_API, launch, callback_data(keep, site, params, symbol=symbol))
    assert [type(e) for e in seen] == [ev.LaunchBegin]  # a plain kernel's return: nothing
    source, seen = source_with(FakeDriver(SAXPY, module=0xABC))
    for site in (0, 1):
        source._callback(None, DOMAIN_DRIVER_API, launch, callback_data(keep, site, params, symbol=nccl))
    assert [type(e) for e in seen] == [ev.LaunchBegin, ev.LaunchEnd] and seen[1] == ev.LaunchEnd(0x5000, 0)


def test_a_cubin_a_library_loads_lazily_is_found_by_the_kernel_name():
    cubin = compiled_cubin("container_kernels.cu")  # the checked-in fixture
    keep = Keep()
    source, seen = source_with(FakeDriver(SAXPY, module=0x999))  # module 0x999: never loaded by a visible call
    for module_id, image in [(3, b"\x7fELF unrelated"), (5, cubin)]:
        descriptor = keep.put(struct.pack("<I4xQQ", module_id, len(image), keep.put(image)))
        resource = keep.put(struct.pack("<QQQ", 0, 0, descriptor))
        source._callback(None, DOMAIN_RESOURCE, RESOURCE_MODULE_LOADED, resource)
    params = launch_params(keep, 0xF00, SAXPY_ARGS)
    source._callback(
        None, DOMAIN_DRIVER_API, CALL_IDS["cuLaunchKernel"], callback_data(keep, 0, params, symbol="saxpy")
    )
    image, launch = seen
    assert image == ev.ModuleImage(("loaded", 5), cubin, None, "module loaded lazily by a library")
    assert launch.kernel.module == ("loaded", 5)


def test_an_unknown_module_stays_unknown():
    keep = Keep()
    source, seen = source_with(FakeDriver(SAXPY, module=0x999))
    params = launch_params(keep, 0xF00, SAXPY_ARGS)
    source._callback(
        None, DOMAIN_DRIVER_API, CALL_IDS["cuLaunchKernel"], callback_data(keep, 0, params, symbol="saxpy")
    )
    assert [type(e) for e in seen] == [ev.LaunchBegin] and seen[0].kernel.module is None


def test_allocations_memsets_and_decoding_errors():
    keep = Keep()
    source, seen = source_with(FakeDriver(SAXPY, module=1))
    out = keep.put(struct.pack("<Q", 0x7F00_0000_0000))
    alloc = keep.put(struct.pack("<QQ", out, 4096))
    source._callback(None, DOMAIN_DRIVER_API, CALL_IDS["cuMemAlloc_v2"], callback_data(keep, 1, alloc))
    source._callback(None, DOMAIN_DRIVER_API, CALL_IDS["cuMemAlloc_v2"], callback_data(keep, 1, alloc, result=2))
    memset = keep.put(struct.pack("<QI4xQQ", 0x7F00_0000_0010, 0xDEADBEEF, 16, 0x77))
    source._callback(None, DOMAIN_DRIVER_API, CALL_IDS["cuMemsetD32Async"], callback_data(keep, 0, memset))
    assert seen == [
        ev.Allocation(0x7F00_0000_0000, 4096, ev.MemoryApi.DEVICE, "cuMemAlloc_v2"),
        ev.Memset(0x7F00_0000_0010, 0xDEADBEEF, 4, 16, 0x77, "cuMemsetD32Async"),
    ]


def test_without_cupti_python_the_recorder_says_how_to_get_it(monkeypatch):
    from replayfmt.capture.cupti_api import load_cupti
    from replayfmt.errors import ReplayUsageError

    monkeypatch.setitem(sys.modules, "cupti", None)  # as if it were not installed
    with pytest.raises(ReplayUsageError, match=r"pip install 'replayfmt\[capture\]'"):
        load_cupti()


def launch_ex(keep: Keep, attributes: list[bytes]) -> int:
    """cuLaunchKernelEx's parameters: saxpy on stream 0x6000 with these 72-byte CUlaunchAttributes."""
    table = keep.put(b"".join(a.ljust(72, b"\0") for a in attributes)) if attributes else 0
    config = keep.put(struct.pack("<7I4xQQI", 8, 1, 1, 64, 1, 1, 0, 0x6000, table, len(attributes)))
    pointers = keep.put(struct.pack("<4Q", *[keep.put(a) for a in SAXPY_ARGS]))
    return keep.put(struct.pack("<QQQQ", config, 0xF00, pointers, 0))


@pytest.mark.parametrize("value", [1, 0])
def test_a_launch_ex_allowing_programmatic_dependent_launch_is_marked_so(value):
    keep = Keep()
    source, seen = source_with(FakeDriver(SAXPY, module=0xABC))
    pdl = struct.pack("<I4xi", 6, value)  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    data = callback_data(keep, 0, launch_ex(keep, [pdl]), symbol="saxpy")
    source._callback(None, DOMAIN_DRIVER_API, CALL_IDS["cuLaunchKernelEx"], data)
    (launch,) = seen
    assert isinstance(launch, ev.LaunchBegin) and launch.programmatic == bool(value)
    assert not launch.cooperative and launch.cluster == (0, 0, 0)


@pytest.mark.parametrize("attribute", [7, 12])  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT, _LAUNCH_COMPLETION_EVENT
def test_an_event_a_launch_triggers_is_recorded_after_it_on_its_stream(attribute):
    keep = Keep()
    source, seen = source_with(FakeDriver(SAXPY, module=0xABC), launch_results=True)
    event = struct.pack("<I4xQii", attribute, 0xE7E7, 0, 1)  # event, flags, triggerAtBlockStart
    pdl = struct.pack("<I4xi", 6, 1)
    params = launch_ex(keep, [pdl, event])
    for site in (0, 1):
        source._callback(
            None, DOMAIN_DRIVER_API, CALL_IDS["cuLaunchKernelEx"], callback_data(keep, site, params, symbol="saxpy")
        )
    launch, record, end = seen
    assert isinstance(launch, ev.LaunchBegin) and launch.programmatic
    assert record == ev.EventRecorded(0xE7E7, 0x6000) and isinstance(end, ev.LaunchEnd)
