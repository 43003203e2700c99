"""Module globals (format 1.4), without a GPU: their names and load-time bytes read from a real
cubin's symbol table; the CUPTI source finding where they live; the recorder restoring the ones
a fresh module load would not reproduce (with the pointers stored in them) and skipping the
rest; the plan refusing a buffer that names no global; extract keeping a launch's globals."""

from __future__ import annotations

import struct
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from fake_device import FakeDriver
from samples import compiled_cubin
from test_capture_translate import FakeMemory, record
from test_host_pace import DRIVER_DOORS

import replayfmt
from replayfmt.capture import CaptureMode, RecordOptions, Translator, events as ev
from replayfmt.capture.cupti_api import RESOURCE_MODULE_LOADED, RESOURCE_MODULE_UNLOAD_STARTING
from replayfmt.capture.hostfiles import HostFiles
from replayfmt.capture.loaded_code import LoadedCode
from replayfmt.edit import Selection, extract
from replayfmt.errors import AbiMismatchError, DeviceUnavailableError, ReplayFormatError
from replayfmt.format import model as m
from replayfmt.format.cubin import CubinError, Variable, module_variables, parse_cubin
from replayfmt.replay import Replayer, ReplayOptions
from replayfmt.replay.plan import PlanOptions, build_plan
from replayfmt.writer import CaptureWriter

MODULE = ("module", 0x1234)
DATA, OUT = 0x7F00_0000_0000, 0x7F00_0010_0000
BASE, SCALE, CALLS = 0x7E00_0000_0100, 0x7E00_0001_0000, 0x7E00_0000_0200  # where the "driver" put them
TAG = 0x7E00_0000_0300  # a one-byte constant no one writes (CUB's and libcu++'s kind)
GATHER = ((0, 8), (8, 4))  # float* out, int n


@pytest.fixture
def globals_cubin() -> bytes:
    data = compiled_cubin("module_globals.cu")
    assert data is not None, "tests/fixtures/cubins lacks module_globals.sm_90.cubin"
    return data


def test_a_cubin_names_its_globals_with_the_bytes_a_load_gives_them(globals_cubin, cubin):
    variables = module_variables(globals_cubin)
    assert variables == [
        Variable("base", 8, bytes(8)),
        Variable("scale", 16, bytes(16)),
        Variable("calls", 4, bytes(4)),
    ]
    assert parse_cubin(globals_cubin).variables == variables and list(parse_cubin(globals_cubin).kernels) == ["gather"]
    assert module_variables(cubin) == []  # kernels alone: no globals
    with pytest.raises(CubinError):
        module_variables(b".version 8.0\n.target sm_90\n")  # PTX: the recorder names none


def test_damaged_cubins_give_a_cubin_error_or_globals_never_a_crash(globals_cubin):
    rng = np.random.default_rng(7)
    for _ in range(300):
        data = bytearray(globals_cubin)
        if rng.random() < 0.3:
            data = data[: int(rng.integers(0, len(data)))]
        for _ in range(int(rng.integers(1, 8))):
            if data:
                data[int(rng.integers(0, len(data)))] = int(rng.integers(0, 256))
        try:
            found = module_variables(bytes(data))
        except CubinError:
            continue
        assert all(isinstance(v, Variable) and v.size > 0 for v in found)
        assert all(v.initial is None or len(v.initial) == v.size for v in found)


class GlobalsDriver:
    """The driver as LoadedCode asks it: a runtime kernel (CUkernel) of a library whose module
    the driver loads lazily, and that module's globals."""

    CUresult = SimpleNamespace(CUDA_SUCCESS=0)

    def __init__(self, loads: list) -> None:
        self.loads = loads  # called by cuKernelGetFunction: the lazy load the resource domain reports
        self.addresses = {b"base": (BASE, 8), b"scale": (SCALE, 16), b"calls": (CALLS, 4)}

    def cuFuncGetModule(self, handle):
        return (0, 0x5000) if handle == 0xF0F0 else (1, 0)  # only the kernel's function has a module

    def cuKernelGetLibrary(self, handle):
        return 0, 0x4000

    def cuKernelGetFunction(self, handle):
        for load in self.loads:
            load()
        self.loads.clear()
        return 0, 0xF0F0

    def cuKernelGetParamInfo(self, handle, index):
        return (0, *GATHER[index]) if index < len(GATHER) else (1, 0, 0)

    cuFuncGetParamInfo = cuKernelGetParamInfo

    def cuLibraryGetModule(self, library):
        return 1, 0

    def cuModuleGetGlobal(self, module, name):
        assert module == 0x5000
        return (0, *self.addresses[name]) if name in self.addresses else (1, 0, 0)


def test_the_source_finds_a_lazily_loaded_modules_globals_once_before_its_first_launch(globals_cubin):
    seen: list[ev.Event] = []
    driver = GlobalsDriver([])
    code = LoadedCode(driver, seen.append)
    driver.loads.append(lambda: code.resource(RESOURCE_MODULE_LOADED, 9, lambda: globals_cubin))
    key, _ = code.module_of(0xABC, "gather")
    assert key == ("loaded", 9)
    image, found = seen
    assert isinstance(image, ev.ModuleImage) and image.key == key and image.data == globals_cubin
    assert found == ev.ModuleGlobals(
        key,
        (
            ev.GlobalVariable("base", BASE, 8, bytes(8)),
            ev.GlobalVariable("scale", SCALE, 16, bytes(16)),
            ev.GlobalVariable("calls", CALLS, 4, bytes(4)),
        ),
    )
    code.module_of(0xABD, "gather")  # another kernel of the same module: told once
    assert len(seen) == 2
    code.looked_up(("module", 0x5000), "base")  # the host asks (cudaMemcpyToSymbol): told again, bytes unknown
    assert seen[-1] == ev.ModuleGlobals(key, (ev.GlobalVariable("base", BASE, 8, None),))
    code.resource(RESOURCE_MODULE_UNLOAD_STARTING, 9, None)  # inside the driver's unload: told later
    assert len(seen) == 3 and code.take_unloads() == [key] and seen[-1] == ev.ModuleUnload(key)
    code.looked_up(("module", 0x5000), "base")  # unloaded: no module to name
    assert len(seen) == 4


def test_a_lookup_in_a_module_no_kernel_ran_from_yet_names_no_other_modules_global(globals_cubin):
    """Two cubins the driver loaded lazily both define ``base``: a lookup in a module handle the
    source cannot tie to one of them is not guessed at by symbol (the kernel's first launch
    lists the right module's globals then)."""
    seen: list[ev.Event] = []
    driver = GlobalsDriver([])
    code = LoadedCode(driver, seen.append)
    code.resource(RESOURCE_MODULE_LOADED, 9, lambda: globals_cubin)
    code.resource(RESOURCE_MODULE_LOADED, 10, lambda: globals_cubin)
    code.looked_up(("module", 0x5000), "base")
    assert seen == []


def loaded(cubin: bytes) -> list[ev.Event]:
    """The module loaded and the kernel's two allocations made (before its globals are found)."""
    return [ev.ModuleImage(MODULE, cubin, None, "cuModuleLoadData"), ev.Allocation(DATA, 256), ev.Allocation(OUT, 256)]


def launch(n: int = 64) -> ev.LaunchBegin:
    kernel = ev.Kernel(0xF00, "gather", MODULE, GATHER)
    return ev.LaunchBegin(kernel, (1, 1, 1), (n, 1, 1), 0, 0, struct.pack("<Qi4x", OUT, n))


def module_globals(calls_initial: bytes | None = bytes(4)) -> ev.ModuleGlobals:
    return ev.ModuleGlobals(
        MODULE,
        (
            ev.GlobalVariable("base", BASE, 8, bytes(8)),
            ev.GlobalVariable("scale", SCALE, 16, bytes(16)),
            ev.GlobalVariable("calls", CALLS, 4, calls_initial),
            ev.GlobalVariable("tag", TAG, 1, b"\x01"),
        ),
    )


def memory_with_globals(scale: np.ndarray) -> FakeMemory:
    mem = FakeMemory()
    mem.device[DATA] = bytearray(np.arange(64, dtype=np.float32).tobytes())
    mem.device[OUT] = bytearray(256)
    mem.device[BASE] = bytearray(struct.pack("<Q", DATA))  # what the host wrote: a pointer to DATA
    mem.device[SCALE] = bytearray(scale.tobytes())
    mem.device[CALLS] = bytearray(4)  # as loaded: nothing to restore
    mem.device[TAG] = bytearray(b"\x01")
    return mem


def test_the_recorder_restores_written_globals_relocating_their_pointers_and_skips_pristine_ones(
    tmp_path, globals_cubin
):
    mem = memory_with_globals(np.array([0.5, 1.5, 2.5, 3.5], np.float32))
    events = [
        *loaded(globals_cubin),
        module_globals(),
        launch(),
        ev.LaunchEnd(0),
    ]
    path, t = record(tmp_path, events, mem)
    assert not t.report.errors
    with replayfmt.open(path) as cap:
        objects = list(cap.objects())
        globals_ = {o.id: o for o in objects if isinstance(o, m.Global)}
        buffers = {o.address: o for o in objects if isinstance(o, m.Buffer)}
        exe = next(o for o in objects if isinstance(o, m.Executable))
        # calls and tag hold their load-time bytes, and the kernel left them so
        assert sorted(g.symbol for g in globals_.values()) == ["base", "scale"]
        assert all(g.executable == exe.id for g in globals_.values())
        assert globals_[buffers[BASE].module_global].symbol == "base" and buffers[BASE].size == 8
        assert globals_[buffers[SCALE].module_global].symbol == "scale"
        assert CALLS not in buffers and TAG not in buffers and buffers[DATA].module_global == 0
        ops = list(cap.iter_operations())
        states = {op.buffer: op for op in ops if isinstance(op, m.State)}
        (pointer,) = states[buffers[BASE].id].relocations  # the stored pointer, relocated to DATA
        assert (pointer.site_offset, pointer.target_buffer, pointer.target_offset) == (0, buffers[DATA].id, 0)
        assert buffers[DATA].id in states  # reached through the pointer: its starting state too
        assert np.frombuffer(cap.read_payload(states[buffers[SCALE].id].payload), np.float32).tolist() == [
            0.5,
            1.5,
            2.5,
            3.5,
        ]
        checkpoint = next(op for op in ops if isinstance(op, m.Checkpoint))
        assert {buffers[BASE].id, buffers[SCALE].id} <= {e.buffer for e in checkpoint.entries}
        plan = build_plan(cap, PlanOptions())
        assert not plan.problems and plan.buffers[buffers[BASE].id].module_global
        assert "global=" in replayfmt_dump(path)


def replayfmt_dump(path: Path) -> str:
    from click.testing import CliRunner

    from replayfmt_tools.dump_replay import main as dump_main

    result = CliRunner().invoke(dump_main, [str(path)])
    assert result.exit_code == 0, result.output
    return result.output


def test_a_global_the_host_writes_before_any_kernel_of_its_module_runs_is_an_upload(tmp_path, globals_cubin):
    """Whole-program capture: cudaMemcpyToSymbol looks the global up and copies into it before
    the module's first launch; the copy lands in the global's buffer, named by an executable
    of the image alone until a kernel of it is recorded."""
    mem = memory_with_globals(np.zeros(4, np.float32))
    mem.device[SCALE] = bytearray(16)
    table = np.array([1, 2, 3, 4], np.float32).tobytes()
    mem.host[0x1000] = table
    events = [
        *loaded(globals_cubin),
        ev.ModuleGlobals(MODULE, (ev.GlobalVariable("scale", SCALE, 16, None),)),  # the host's lookup
        ev.Copy(ev.CopyDirection.H2D, SCALE, 0x1000, 16, 0, False, "cuMemcpyHtoD_v2"),
        module_globals(),
        launch(),
        ev.LaunchEnd(0),
    ]
    path, t = record(tmp_path, events, mem)
    assert not t.report.errors and not t.report.unsupported, (t.report.errors, t.report.unsupported)
    with replayfmt.open(path) as cap:
        objects = list(cap.objects())
        buffers = {o.address: o for o in objects if isinstance(o, m.Buffer)}
        copy = next(op for op in cap.iter_operations() if op.kind == m.OperationKind.COPY_HOST_TO_DEVICE)
        assert copy.dst_buffer == buffers[SCALE].id and cap.read_payload(copy.payload) == table
        anchor = next(o for o in objects if isinstance(o, m.Global) and o.symbol == "scale").executable
        assert next(o for o in objects if o.id == anchor).functions == ()  # the image alone, no kernel yet
        assert sum(isinstance(o, m.Buffer) and o.address == SCALE for o in objects) == 1  # one storage
        assert not build_plan(cap, PlanOptions()).problems


def test_extract_keeps_the_globals_a_launch_reads(tmp_path, globals_cubin):
    mem = memory_with_globals(np.array([0.5, 1.5, 2.5, 3.5], np.float32))
    mem.device[BASE] = bytearray(struct.pack("<Q", 12345))  # no pointer this time: extract refuses stored ones
    events = [
        *loaded(globals_cubin),
        module_globals(),
        launch(),
        ev.LaunchEnd(0),
    ]
    path, _ = record(tmp_path, events, mem)
    with replayfmt.open(path) as cap:
        (first,) = [op.index for op in cap.iter_operations() if op.kind == m.OperationKind.LAUNCH]
    out = tmp_path / "one.kreplay"
    extract(path, Selection.operation(first), out)
    with replayfmt.open(out) as cap:
        objects = list(cap.objects())
        symbols = {o.id: o.symbol for o in objects if isinstance(o, m.Global)}
        storage = {symbols[o.module_global] for o in objects if isinstance(o, m.Buffer) and o.module_global}
        assert storage == {"base", "scale"}
        stated = {op.buffer for op in cap.iter_operations() if isinstance(op, m.State)}
        assert {o.id for o in objects if isinstance(o, m.Buffer) and o.module_global} <= stated
        assert not build_plan(cap, PlanOptions()).problems


def test_the_plan_refuses_a_buffer_whose_global_is_missing_or_too_small(tmp_path, globals_cubin):
    for storage, size, message in [
        (99, 8, "its module global 99 is no object, not a global"),
        (4, 8, "its module global 4 is a buffer, not a global"),
        (3, 64, "64 bytes, larger than its global 3"),
    ]:
        path = tmp_path / f"g{storage}-{size}.kreplay"
        with CaptureWriter(path) as w:
            device = w.add_object(m.Device(name="NVIDIA H100", compute_capability=(9, 0)))
            exe = w.add_object(
                m.Executable(format=m.ExecutableFormat.CUBIN, target_arch="sm_90", payload=w.add_payload(globals_cubin))
            )
            w.add_object(m.Global(executable=exe, symbol="base", size=8))
            w.add_object(m.Buffer(size=size, device=device, module_global=storage))
        with replayfmt.open(path) as cap, pytest.raises(ReplayFormatError, match=message):
            build_plan(cap, PlanOptions())


def test_a_replay_allocates_nothing_for_a_global_and_uses_the_loaded_modules(tmp_path, monkeypatch):
    fake = FakeDriver({"k": [(0, 8)]})
    for door in DRIVER_DOORS:
        monkeypatch.setattr(f"{door}.driver", lambda: fake)
    fake.module_globals = {"base": 8, "scale": 16}
    path = tmp_path / "g.kreplay"
    with CaptureWriter(path) as w:
        device = w.add_object(m.Device(name="NVIDIA H100", compute_capability=(9, 0)))
        kernel = m.Function(name="k", parameters=(m.Parameter(offset=0, size=8, kind=m.ParameterKind.POINTER),))
        exe = w.add_object(m.Executable(functions=(kernel,), payload=w.add_payload(b"image")))
        scale = w.add_object(m.Global(executable=exe, symbol="scale", size=16))
        storage = w.add_object(m.Buffer(size=16, device=device, address=0x7E00_0000_0000, module_global=scale))
        out = w.add_object(m.Buffer(size=256, device=device))
        w.state(buffer=storage, payload=w.add_payload(np.arange(4, dtype=np.float32).tobytes()), size=16)
        w.launch(
            executable=exe,
            function=0,
            grid=(1, 1, 1),
            block=(32, 1, 1),
            parameters=bytes(8),
            relocations=[m.Relocation(0, out, 0, 0)],
        )
    with replayfmt.open(path) as cap, Replayer(build_plan(cap), ReplayOptions()) as replayer:
        assert replayer.addresses[storage] == 0x6000_0000_1000  # "scale", where the module keeps it
        assert replayer.addresses[out] == 0x7F00_0000_0000  # the only allocation
        replayer.run()
    fake.module_globals = {"base": 8}  # a build without the global
    with replayfmt.open(path) as cap, pytest.raises(AbiMismatchError, match="defines no global scale"):
        Replayer(build_plan(cap), ReplayOptions())
    fake.module_globals = {"base": 8, "scale": 8}  # a build whose global is smaller than the capture's
    with (
        replayfmt.open(path) as cap,
        pytest.raises(
            AbiMismatchError,
            match=r"buffer 4: global scale of executable 2 \(capture\) holds 8 bytes; the capture's held 16",
        ),
    ):
        Replayer(build_plan(cap), ReplayOptions())


def test_a_pristine_global_the_region_changes_starts_each_replay_from_its_load_time_bytes(tmp_path, globals_cubin):
    """The kernel's counter held its load-time zero when the region began, and the region
    counted: its zero becomes state (so a replay repeated in one process starts from it each
    time) and what the region left is checkpointed; the constant no one wrote stays out."""
    mem = memory_with_globals(np.array([0.5, 1.5, 2.5, 3.5], np.float32))

    def counted():
        mem.device[CALLS][:] = struct.pack("<I", 1)
        return ev.LaunchEnd(0)

    events = [
        *loaded(globals_cubin),
        module_globals(),
        launch(),
        counted,
    ]
    path, t = record(tmp_path, events, mem)
    assert not t.report.errors
    with replayfmt.open(path) as cap:
        objects = list(cap.objects())
        assert sorted(o.symbol for o in objects if isinstance(o, m.Global)) == ["base", "calls", "scale"]
        calls = next(o for o in objects if isinstance(o, m.Buffer) and o.address == CALLS)
        ops = list(cap.iter_operations())
        (state,) = [op for op in ops if isinstance(op, m.State) and op.buffer == calls.id]
        assert cap.read_payload(state.payload) == bytes(4)  # where the region started
        checkpoint = next(op for op in ops if isinstance(op, m.Checkpoint))
        (entry,) = [e for e in checkpoint.entries if e.buffer == calls.id]
        assert cap.read_payload(entry.payload) == struct.pack("<I", 1)  # what it left
        assert not build_plan(cap, PlanOptions()).problems


def counter_history(tmp_path: Path, script, options: RecordOptions = RecordOptions()) -> list[tuple[str, int]]:
    """Run ``script(translator, memory)`` after the module, its allocations and its globals are
    known; what the capture says of the kernel's counter, in order: ("state" or "checkpoint", value)."""
    path = tmp_path / "counter.kreplay"
    mem = memory_with_globals(np.array([0.5, 1.5, 2.5, 3.5], np.float32))
    with CaptureWriter(path) as writer:
        t = Translator(writer, options, mem, host_files=HostFiles(tmp_path / "no-maps"))
        for event in [*loaded(compiled_cubin("module_globals.cu")), module_globals()]:
            t.handle(event)
        script(t, mem)
    assert not t.report.errors and not t.report.unsupported, (t.report.errors, t.report.unsupported)
    history = []
    with replayfmt.open(path) as cap:
        calls = {o.id for o in cap.objects() if isinstance(o, m.Buffer) and o.address == CALLS}
        for op in cap.iter_operations():
            if isinstance(op, m.State) and op.buffer in calls:
                history.append(("state", struct.unpack("<I", cap.read_payload(op.payload))[0]))
            elif isinstance(op, m.Checkpoint):
                history += [
                    ("checkpoint", struct.unpack("<I", cap.read_payload(e.payload))[0])
                    for e in op.entries
                    if e.buffer in calls
                ]
        assert not build_plan(cap, PlanOptions()).problems
    return history


def counter_checkpoints(tmp_path: Path, script) -> list[tuple[str, int]]:
    """(checkpoint name, value) of each checkpoint of the kernel's counter, after ``script``."""
    path = tmp_path / "scoped.kreplay"
    mem = memory_with_globals(np.array([0.5, 1.5, 2.5, 3.5], np.float32))
    with CaptureWriter(path) as writer:
        t = Translator(writer, RecordOptions(), mem, host_files=HostFiles(tmp_path / "no-maps"))
        for event in [*loaded(compiled_cubin("module_globals.cu")), module_globals()]:
            t.handle(event)
        script(t, mem)
    assert not t.report.errors
    with replayfmt.open(path) as cap:
        calls = {o.id for o in cap.objects() if isinstance(o, m.Buffer) and o.address == CALLS}
        return [
            (op.name, struct.unpack("<I", cap.read_payload(e.payload))[0])
            for op in cap.iter_operations()
            if isinstance(op, m.Checkpoint)
            for e in op.entries
            if e.buffer in calls
        ]


def count(mem: FakeMemory) -> ev.LaunchEnd:
    """What the kernel does to its counter (atomicAdd), as the launch returns."""
    mem.device[CALLS][:] = struct.pack("<I", struct.unpack("<I", mem.device[CALLS])[0] + 1)
    return ev.LaunchEnd(0)


GRAPH = ev.GraphDescription(
    [
        ev.GraphNodeInfo(
            m.GraphNodeKind.KERNEL,
            handle=1,
            kernel=ev.GraphKernel(launch().kernel, (1, 1, 1), (64, 1, 1), 0, launch().parameters),
        )
    ],
    [],
)


def test_a_graph_launched_in_two_regions_asks_again_which_globals_are_pristine(tmp_path):
    def script(t, mem):
        t.handle(ev.GraphInstantiated(0xE0, GRAPH))
        t.start("one")
        t.handle(ev.GraphLaunched(0xE0, 0))
        t.stop()
        mem.device[CALLS][:] = struct.pack("<I", 7)  # the host sets it between the regions
        t.start("two")
        t.handle(ev.GraphLaunched(0xE0, 0))
        t.stop()

    assert counter_history(tmp_path, script) == [("state", 7), ("checkpoint", 7)]  # region one: pristine, unchanged


def test_a_skipped_global_the_host_reads_after_a_kernel_changed_it_starts_from_its_load_time_bytes(tmp_path):
    def script(t, mem):
        t.start("step")
        t.handle(launch())
        t.handle(count(mem))
        t.handle(ev.Copy(ev.CopyDirection.D2H, 0x2000, CALLS, 4, 0, False, "cuMemcpyDtoH_v2"))
        t.stop()

    assert counter_history(tmp_path, script) == [("state", 0), ("checkpoint", 1)]  # one state: where it began


def test_kernel_mode_instances_start_a_counter_from_where_each_began(tmp_path):
    def script(t, mem):
        for _ in range(2):
            t.handle(launch())
            t.handle(count(mem))

    history = counter_history(tmp_path, script, RecordOptions(mode=CaptureMode.KERNEL, max_per_kernel=None))
    # the first instance finds it as loaded (its zero is state at its end); the second finds it changed
    assert history == [("state", 0), ("checkpoint", 1), ("state", 1), ("checkpoint", 2)]


def test_a_modules_globals_are_read_in_one_copy_where_they_lie_together(tmp_path):
    segment = 0x7E00_0000_0000  # one piece of module memory holding all four globals
    mem = FakeMemory()
    mem.device[segment] = bytearray(0x400)
    variables = [("base", 0x100, 8), ("scale", 0x140, 16), ("calls", 0x200, 4), ("tag", 0x300, 1)]
    mem.device[segment][0x100:0x108] = struct.pack("<Q", 99)  # written by the host: not as loaded
    events = [
        ev.ModuleImage(MODULE, compiled_cubin("module_globals.cu"), None, "cuModuleLoadData"),
        ev.Allocation(OUT, 256),
        ev.ModuleGlobals(MODULE, tuple(ev.GlobalVariable(n, segment + o, s, bytes(s)) for n, o, s in variables)),
        launch(),
        ev.LaunchEnd(0),
    ]
    mem.device[OUT] = bytearray(256)
    path, t = record(tmp_path, events, mem)
    assert not t.report.errors
    global_reads = [r for r in mem.reads if segment <= r[0] < segment + 0x400]
    assert global_reads[0][:2] == (segment + 0x100, 0x201)  # one copy from base to the end of tag
    with replayfmt.open(path) as cap:
        assert [o.symbol for o in cap.objects() if isinstance(o, m.Global)] == ["base"]  # the rest are as loaded


def test_extract_knows_a_launch_may_change_its_modules_globals(tmp_path, globals_cubin):
    """calls is 5 when the region begins and each launch counts: the second launch alone starts
    from 6, which only a replay of the first can say (before, extract gave it the 5 it began at)."""
    mem = memory_with_globals(np.array([0.5, 1.5, 2.5, 3.5], np.float32))
    mem.device[BASE] = bytearray(struct.pack("<Q", 12345))  # no pointer: extract refuses stored ones
    mem.device[CALLS] = bytearray(struct.pack("<I", 5))
    other = 0x7F00_0020_0000
    mem.device[other] = bytearray(256)
    second = ev.LaunchBegin(launch().kernel, (1, 1, 1), (64, 1, 1), 0, 0, struct.pack("<Qi4x", other, 64))
    events = [
        *loaded(globals_cubin),
        ev.Allocation(other, 256),
        module_globals(),
        launch(),
        lambda: count(mem),  # as the launch returns, not when the list is made
        second,
        lambda: count(mem),
    ]
    path, _ = record(tmp_path, events, mem)
    with replayfmt.open(path) as cap:
        globals_ = sorted(o.id for o in cap.objects() if isinstance(o, m.Buffer) and o.module_global)
        first, index = [op.index for op in cap.iter_operations() if op.kind == m.OperationKind.LAUNCH]
    missing = (
        rf"buffer {globals_[0]} bytes \[0, 8\) before operation {index}; operation {first} \(launch of gather\) wrote"
    )
    with pytest.raises(DeviceUnavailableError, match=missing + r".*\(and 2 more\)"):  # base, scale and calls
        extract(path, Selection.operation(index), tmp_path / "second.kreplay")


def test_a_whole_program_capture_gives_a_changed_pristine_global_its_state_in_the_files_region(tmp_path):
    """Without --scope, each outermost scope of the program is a region of the file: the counter
    found as loaded before the program's "step" scope, and counted there, gets its state before
    that scope begins (state is hoisted to the start of its own region of the file: written at
    the capture's end, it would set the counter back to zero after the step had counted)."""
    path = tmp_path / "whole.kreplay"
    mem = memory_with_globals(np.array([0.5, 1.5, 2.5, 3.5], np.float32))
    with CaptureWriter(path) as writer:
        t = Translator(writer, RecordOptions(), mem, host_files=HostFiles(tmp_path / "no-maps"))
        t.start()
        for event in [*loaded(compiled_cubin("module_globals.cu")), module_globals(), launch()]:
            t.handle(event)
        t.handle(count(mem))
        t.scope_begin("step")
        t.handle(launch())
        t.handle(count(mem))
        t.scope_end("step")
        t.stop()
    assert not t.report.errors
    with replayfmt.open(path) as cap:
        calls = next(o.id for o in cap.objects() if isinstance(o, m.Buffer) and o.address == CALLS)
        ops = list(cap.iter_operations())
        step = next(op.index for op in ops if op.kind == m.OperationKind.SCOPE_BEGIN and op.name == "step")
        (state,) = [op for op in ops if isinstance(op, m.State) and op.buffer == calls]
        assert state.index < step and cap.read_payload(state.payload) == bytes(4)
        checkpoints = [
            (op.name, struct.unpack("<I", cap.read_payload(e.payload))[0])
            for op in ops
            if isinstance(op, m.Checkpoint)
            for e in op.entries
            if e.buffer == calls
        ]
        assert checkpoints == [("step", 2), ("region", 2)]  # recorded like any global once it had state


def test_a_cubin_the_program_loads_names_its_own_globals(globals_cubin):
    """cuModuleLoadData with a cubin (CuPy's, Triton's): its globals come from the image the
    program passed, with no cubin of the resource domain to search."""
    seen: list[ev.Event] = []
    code = LoadedCode(GlobalsDriver([]), seen.append)
    key = ("module", 0x5000)
    code.loaded(ev.ModuleImage(key, globals_cubin, None, "cuModuleLoadData"))
    assert code.module_of(0xF0F0, "gather")[0] == key  # a CUfunction of that module
    image, found = seen
    assert image.key == found.key == key and [v.symbol for v in found.variables] == ["base", "scale", "calls"]


def test_a_module_loaded_where_an_unloaded_one_kept_a_global_gets_its_own(tmp_path, globals_cubin):
    """Two modules define ``base`` at the same address (the first one's storage was reused):
    the second module's global is its own allocation, not the first one's."""
    other = ("module", 0x9999)
    mem = memory_with_globals(np.zeros(4, np.float32))
    events = [
        *loaded(globals_cubin),
        ev.ModuleImage(other, globals_cubin, None, "cuModuleLoadData"),
        ev.ModuleGlobals(MODULE, (ev.GlobalVariable("base", BASE, 8, bytes(8)),)),
        ev.ModuleGlobals(other, (ev.GlobalVariable("base", BASE, 8, bytes(8)),)),
    ]
    _, t = record(tmp_path, events, mem)
    (mine,) = t.modules.loaded(other).globals
    assert mine.module_global.module == other and t.allocations.find(BASE) is mine


def test_an_inner_scope_checkpoints_a_pristine_global_its_kernels_changed(tmp_path):
    def script(t, mem):
        t.start()
        t.scope_begin("outer")
        t.scope_begin("inner")
        t.handle(launch())
        t.handle(count(mem))
        t.scope_end("inner")
        t.scope_end("outer")
        t.stop()

    checkpoints = counter_checkpoints(tmp_path, script)
    assert checkpoints == [("inner", 1), ("outer", 1), ("region", 1)]
