"""The C issue loop (replayfmt/replay/issue.c) on the CPU: a stand-in driver whose entry points
are ctypes callbacks, so the loop calls back into Python. A replay issued through it makes the
very calls, in the very order and with the very arguments, that the same replay issued from
Python makes; steps it cannot issue run from Python in their place; a failure names its
operation as before (sticky or collected with continue_on_error); an edited step is packed again."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from fake_device import DRIVER_DOORS, FakeDriver, FakeError
from test_host_pace import KERNEL, launch, write

import replayfmt
from replayfmt.errors import AbiMismatchError
from replayfmt.format import model as m
from replayfmt.replay import Replayer, ReplayOptions, issue
from replayfmt.replay.issue import DRIVER_SYMBOLS, IssueKind, IssuePlan, IssuePlanner, built_issue_library
from replayfmt.replay.plan import build_plan
from replayfmt.replay.steps import Step, StepKind

SOURCE = Path(issue.__file__).with_name("issue.c")
WIDE = m.Function(
    name="wide", parameters=(m.Parameter(offset=0, size=8, kind=m.ParameterKind.VALUE),), parameters_known=False
)
_P, _U, _Z = ctypes.c_void_p, ctypes.c_uint, ctypes.c_size_t
_SIGNATURES = {  # each kind's C signature, as issue.c calls it
    IssueKind.LAUNCH: (_P, _U, _U, _U, _U, _U, _U, _U, _P, _P, _P),
    IssueKind.LAUNCH_EX: (_P, _P, _P, _P),
    IssueKind.EVENT_RECORD: (_P, _P),
    IssueKind.STREAM_WAIT: (_P, _P, _U),
    IssueKind.COPY_HTOD: (ctypes.c_uint64, _P, _Z, _P),
    IssueKind.COPY_DTOD: (ctypes.c_uint64, ctypes.c_uint64, _Z, _P),
    IssueKind.COPY_DTOH: (_P, ctypes.c_uint64, _Z, _P),
    IssueKind.MEMSET_8: (ctypes.c_uint64, ctypes.c_ubyte, _Z, _P),
    IssueKind.MEMSET_16: (ctypes.c_uint64, ctypes.c_ushort, _Z, _P),
    IssueKind.MEMSET_32: (ctypes.c_uint64, ctypes.c_uint, _Z, _P),
}


@pytest.fixture(scope="module")
def library(tmp_path_factory) -> Path:
    """The loop setup.py built, or one built here from issue.c (CI builds it at install)."""
    built = built_issue_library()
    if built is not None:
        return built
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build replayfmt/replay/issue.c")
    target = tmp_path_factory.mktemp("issue") / "_issue.so"
    subprocess.run([cc, "-O2", "-fPIC", "-shared", "-std=gnu11", "-o", str(target), str(SOURCE)], check=True)
    return target


class _Results:
    """CUresult: success, and a result's value named (700 is sticky, as on a real driver)."""

    CUDA_SUCCESS = 0

    def __call__(self, value: int) -> object:
        return FakeError("CUDA_ERROR_ILLEGAL_ADDRESS") if value == 700 else FakeError("CUDA_ERROR_INVALID_VALUE")


class _Config:
    """A CUlaunchConfig whose struct lives in memory (getPtr), as cuda-python's does."""

    def __init__(self) -> None:
        self._struct = ctypes.create_string_buffer(64)

    def getPtr(self) -> int:
        return ctypes.addressof(self._struct)


class ProcDriver(FakeDriver):
    """A FakeDriver with one function per driver call and entry points for the C loop: both log
    each call as (symbol, its arguments as integers: :func:`comparable`), and ``fail`` makes the
    n-th call of one symbol since the log was cleared return a result."""

    CUresult = _Results()
    CUlaunchConfig = _Config

    def __init__(self, layouts, *, entry_points: bool) -> None:
        super().__init__(layouts)
        self.log: list[tuple[object, ...]] = []
        self.fail: tuple[str, int, int] | None = None  # (a call, which one of them from 1, its result)
        self.entry_points = entry_points
        self._callbacks = {}
        for kind, symbol in DRIVER_SYMBOLS.items():
            setattr(self, symbol, self._python(symbol))
            kind_type = ctypes.CFUNCTYPE(ctypes.c_int, *_SIGNATURES[kind])
            self._callbacks[kind] = kind_type(self._native(symbol))

    def _answer(self, symbol: str, args: tuple) -> int:
        self.log.append(comparable((symbol, *args)))  # read while its memory is the replay's
        failing = self.fail is not None and symbol == self.fail[0]
        if failing and sum(call[0] == symbol for call in self.log) == self.fail[1]:
            return self.fail[2]
        return 0

    def _python(self, symbol):
        def call(*args):
            ints = tuple(
                a.getPtr() if isinstance(a, _Config) else a if isinstance(a, str) else int(a or 0) for a in args
            )
            result = self._answer(symbol, ints)
            return (self.CUresult(result),) if result else (0,)

        call.__name__ = symbol
        return call

    def _native(self, symbol):
        return lambda *args: self._answer(symbol, tuple(int(a or 0) for a in args))

    def cuModuleGetFunction(self, module, name):
        self.functions = getattr(self, "functions", [])
        self.functions.append(name.decode())
        return 0, 0xF000 + len(self.functions) - 1

    def cuFuncGetParamInfo(self, function, index):
        return super().cuFuncGetParamInfo(self.functions[function - 0xF000], index)

    def cuDriverGetVersion(self):
        return 0, 13000

    def cuGetProcAddress(self, symbol, version, flags):
        if not self.entry_points:
            return (1, 0, 0)
        kind = next(k for k, s in DRIVER_SYMBOLS.items() if s.encode() == symbol)
        return 0, ctypes.cast(self._callbacks[kind], ctypes.c_void_p).value, 0

    CUdriverProcAddress_flags = type("Flags", (), {"CU_GET_PROC_ADDRESS_DEFAULT": 0})


def mixed(w, ids) -> None:
    """Launches on two streams (some in clusters), an upload, copies, memsets of each width, events,
    a wait and synchronisations."""
    dev = ids["device"]
    ids["e"] = w.add_object(m.Event(device=dev))
    ids["y"] = w.add_object(m.Buffer(size=4096, device=dev))
    w.copy_h2d(dst_buffer=ids["y"], data=np.arange(256, dtype=np.float32).tobytes(), stream=ids["s1"])
    for k in range(3):
        launch(w, ids, offset=64 * k)
        w.event_record(ids["e"], ids["s1"])
        w.stream_wait_event(ids["s2"], ids["e"])
        launch(w, ids, stream="s2")
    w.copy_d2d(src_buffer=ids["y"], dst_buffer=ids["x"], size=512, stream=ids["s2"])
    w.memset(buffer=ids["x"], value=7, count=64, element_size=4, stream=ids["s1"])
    w.memset(buffer=ids["x"], value=3, count=8, element_size=1, stream=ids["s1"])
    w.memset(buffer=ids["x"], value=0xBEEF, count=8, element_size=2, stream=ids["s2"])
    for _ in range(2):  # in clusters: cuLaunchKernelEx, one shared config
        launch(w, ids, stream="s2", buffer="y", cluster=(2, 1, 1))
    w.stream_synchronize(ids["s1"])
    w.copy_d2h(src_buffer=ids["x"], size=256, stream=ids["s1"])
    launch(w, ids)


def comparable(call: tuple) -> tuple:
    """A logged call with what differs between two replays by itself (host memory: a launch's
    packed parameters, a download's pinned destination) replaced by what it holds: the relocated
    pointer a launch passes (device addresses are the stand-in's counter, alike in both)."""
    if call[0] == "cuLaunchKernel":
        params = call[10]
        block = ctypes.c_uint64.from_address(params).value
        return (*call[:10], ctypes.c_uint64.from_address(block).value, *call[11:])
    if call[0] == "cuLaunchKernelEx":  # the config's address, then the pointer the launch passes
        block = ctypes.c_uint64.from_address(call[3]).value
        return (call[0], "config", call[2], ctypes.c_uint64.from_address(block).value, call[4])
    if call[0] == "cuMemcpyDtoHAsync":
        return (call[0], "host", *call[2:])
    return call


def replayed(
    path: Path, monkeypatch, library: Path, *, compiled: bool, layouts: dict | None = None, **options
) -> tuple[ProcDriver, Replayer]:
    driver = ProcDriver({"k": [(0, 8)], **(layouts or {})}, entry_points=compiled)
    for door in DRIVER_DOORS:
        monkeypatch.setattr(f"{door}.driver", lambda: driver)
    monkeypatch.setattr(issue, "built_issue_library", lambda: library)
    cap = replayfmt.open(path)
    return driver, Replayer(build_plan(cap), ReplayOptions(check_payloads=False, **options))


@pytest.mark.parametrize("stretch", [4096, 3])
def test_a_replay_issued_from_c_makes_the_calls_python_makes(tmp_path, monkeypatch, library, stretch):
    """Also when a first issue cuts its steps into runs a few at a time (``stretch``), and again
    from the plan kept (the second repetition)."""
    monkeypatch.setattr("replayfmt.replay.running._STRETCH", stretch)
    write(tmp_path / "c.kreplay", mixed)
    logs = []
    for compiled in (False, True):
        driver, r = replayed(tmp_path / "c.kreplay", monkeypatch, library, compiled=compiled)
        with r:
            assert (r.issue_compiled, r.run(2).device_ms) == (compiled, [0.0, 0.0])
            logs.append(driver.log)
            runs = IssuePlanner(driver).runs(r.steps, 0, len(r.steps))
            in_c = {int(k) for run in runs if run.calls is not None for k in run.calls["kind"]}
    assert in_c == {int(k) for k in IssueKind} - {IssueKind.COPY_HTOD}  # (the uploads are staged on the device)
    python, native = logs
    kinds = {call[0] for call in python}
    assert {"cuLaunchKernel", "cuEventRecord", "cuStreamWaitEvent", "cuMemcpyDtoDAsync", "cuMemsetD8Async"} <= kinds
    assert {"cuMemsetD32Async", "cuMemsetD16Async", "cuMemcpyDtoHAsync", "cuLaunchKernelEx"} <= kinds
    assert native == python and len(native) > 30


@pytest.mark.parametrize("compiled", [False, True])
def test_a_first_run_issues_the_steps_built_so_far_while_it_builds_the_next(tmp_path, monkeypatch, library, compiled):
    """ReplayOptions(build_while_running=True) (run-replay): the steps are built a few operations
    at a time as the first run issues them, so calls go out before the last steps exist (the
    download's pinned memory, taken when its step is built, comes after launches were issued),
    and both runs make the very calls of a replay whose steps were all built at setup."""
    monkeypatch.setattr("replayfmt.replay.replayer._BUILT_AT_A_TIME", 2)
    allocate = ProcDriver.cuMemHostAlloc

    def logged_allocate(self, size, flags=0):
        self.log.append(("pinned",))
        return allocate(self, size, flags)

    monkeypatch.setattr(ProcDriver, "cuMemHostAlloc", logged_allocate)
    write(tmp_path / "c.kreplay", mixed)
    logs = []
    for streamed in (False, True):
        driver, r = replayed(
            tmp_path / "c.kreplay", monkeypatch, library, compiled=compiled, build_while_running=streamed
        )
        with r:
            result = r.run(2)
            assert (result.built_while_running, r.issue_compiled) == (streamed, compiled)
            assert not r.run(1).built_while_running
            logs.append(driver.log)
    at_setup, as_it_runs = logs
    first_launch = [c[0] for c in at_setup].index("cuLaunchKernel")
    assert ("pinned",) in at_setup[:first_launch] and ("pinned",) not in at_setup[first_launch:]
    first_launch = [c[0] for c in as_it_runs].index("cuLaunchKernel")
    assert ("pinned",) in as_it_runs[first_launch:]
    assert [c for c in as_it_runs if c != ("pinned",)] == [c for c in at_setup if c != ("pinned",)]
    assert len(at_setup) > 80  # three runs of some thirty calls


def test_a_failure_while_building_as_it_runs_names_its_operation_and_stays(tmp_path, monkeypatch, library):
    """A step that cannot be built (the loaded function takes more parameter bytes than were
    captured) stops the first run with the error that setup would have raised, and every later
    use of the steps raises it again."""
    monkeypatch.setattr("replayfmt.replay.replayer._BUILT_AT_A_TIME", 2)

    def body(w, ids):
        for k in range(4):
            launch(w, ids, offset=64 * k)
        exe = w.add_object(m.Executable(functions=(WIDE,), payload=w.add_payload(b"wide")))
        w.launch(executable=exe, function=0, grid=(1, 1, 1), block=(32, 1, 1), parameters=bytes(8), stream=ids["s1"])

    write(tmp_path / "c.kreplay", body)
    wide = {"wide": [(0, 8), (8, 8)]}
    driver, r = replayed(
        tmp_path / "c.kreplay", monkeypatch, library, compiled=True, layouts=wide, build_while_running=True
    )
    with r:
        with pytest.raises(AbiMismatchError, match=r"operation 10 \(wide\): 8 parameter bytes captured"):
            r.run(1)
        assert sum(call[0] == "cuLaunchKernel" for call in driver.log) == 4  # the launches built before it ran
        with pytest.raises(AbiMismatchError, match="operation 10"):
            r.run(1)  # raised before anything is issued again
        assert sum(call[0] == "cuLaunchKernel" for call in driver.log) == 4
        with pytest.raises(AbiMismatchError, match="operation 10"):
            r.kernel_name(10)  # any use of the steps builds the rest: the failure again


def test_steps_the_loop_cannot_issue_run_from_python_in_their_place(library):
    driver = ProcDriver({}, entry_points=True)
    record = driver.cuEventRecord
    steps = [
        Step(StepKind.EVENT_RECORD, record, (1, 2), 0),
        Step(StepKind.CHECKPOINT, print, ("op",), 1),  # a Python call
        Step(StepKind.SYNCHRONIZE, driver.cuCtxSynchronize, (), 2),
        Step(StepKind.EVENT_RECORD, record, ("not a handle", 2), 3),  # not an integer: Python
        Step(StepKind.LAUNCH_EX, driver.cuLaunchKernelEx, (_Config(), 5, 0, None), 4),
        Step(StepKind.MEMSET, driver.cuMemsetD16Async, (0x1000, 9, 4, 0), 5),
    ]
    plan = IssuePlan(IssuePlanner(driver).runs(steps, 0, len(steps)), tuple(steps))
    assert [(a, b, None if c is None else c["kind"].tolist()) for a, b, c in plan.runs] == [
        (0, 1, [IssueKind.EVENT_RECORD]),
        (1, 4, None),
        (4, 6, [IssueKind.LAUNCH_EX, IssueKind.MEMSET_16]),
    ]
    assert plan.matches(steps) and not plan.matches([*steps[:-1], steps[-1]._replace(args=(0x1000, 9, 4, 0))])


def test_a_failure_in_c_names_its_operation_and_stops_or_is_collected(tmp_path, monkeypatch, library):
    write(tmp_path / "c.kreplay", mixed)
    driver, r = replayed(tmp_path / "c.kreplay", monkeypatch, library, compiled=True)
    with r:
        launches = [s.operation for s in r.steps if s.kind is StepKind.LAUNCH]
        r.run(1)
        count = sum(call[0] == "cuLaunchKernel" for call in driver.log)
        driver.log.clear()
        driver.fail = ("cuLaunchKernel", count, 700)  # the last launch, after the download: sticky
        with pytest.raises(replayfmt.DeviceError) as caught:
            r.run(1)
    message = str(caught.value)
    assert caught.value.sticky and f"operation {launches[-1]} (launch of k): cuLaunchKernel failed" in message
    assert "CUDA_ERROR_ILLEGAL_ADDRESS" in message and driver.log[-1][0] == "cuLaunchKernel"

    driver, r = replayed(tmp_path / "c.kreplay", monkeypatch, library, compiled=True, continue_on_error=True)
    with r:
        r.run(1)  # (the first run sets the starting state too)
        driver.log.clear()
        driver.fail = ("cuEventRecord", 2, 1)  # the first of the capture's records, mid-run: not sticky
        result = r.run(1)
        assert len(result.errors) == 1 and "CUDA_ERROR_INVALID_VALUE" in result.errors[0]
        assert "(event_record): cuEventRecord failed" in result.errors[0]
        assert [call[0] for call in driver.log].count("cuLaunchKernel") == 7  # the calls after it were issued


def test_an_edited_step_is_packed_again(tmp_path, monkeypatch, library):
    write(tmp_path / "c.kreplay", lambda w, ids: [launch(w, ids) for _ in range(4)])
    driver, r = replayed(tmp_path / "c.kreplay", monkeypatch, library, compiled=True)
    with r:
        r.run(1)
        one = r.steps[[s.kind for s in r.steps].index(StepKind.LAUNCH)].operation
        r.set_launch_shape(one, (3, 1, 1), (64, 1, 1), 0)
        driver.log.clear()
        r.run(1)
    shapes = [call[2:9] for call in driver.log if call[0] == "cuLaunchKernel"]
    assert shapes[0] == (3, 1, 1, 64, 1, 1, 0) and shapes[1:] == [(1, 1, 1, 32, 1, 1, 0)] * 3
    assert KERNEL.name == "k"
