"""The replay's host work on large captures, on the CPU through a stand-in driver: launches alike
packed once, captured events sharing CUDA events only where their spans allow, the runner naming
the launches since the last synchronisation when a sticky error surfaces, and the plan's checks
counting launches alike that it checks once."""

from __future__ import annotations

import ctypes
import gc
import itertools

import pytest
from fake_device import DRIVER_DOORS, FakeDriver, FakeError

import replayfmt
from replayfmt.format import model as m
from replayfmt.replay import Replayer, ReplayOptions
from replayfmt.replay.plan import LaunchOverride, PlanOptions, build_plan
from replayfmt.replay.steps import StepKind

KERNEL = m.Function(
    name="k",
    parameters=(m.Parameter(offset=0, size=8, kind=m.ParameterKind.POINTER),),
    parameters_known=True,
)


@pytest.fixture
def fake(monkeypatch) -> FakeDriver:
    driver = FakeDriver({"k": [(0, 8)]})
    for door in DRIVER_DOORS:
        monkeypatch.setattr(f"{door}.driver", lambda: driver)
    return driver


def write(path, body) -> dict[str, int]:
    ids: dict[str, int] = {}
    with replayfmt.CaptureWriter(path) as w:
        ids["device"] = dev = w.add_object(m.Device(name="NVIDIA H100", compute_capability=(9, 0)))
        ids["s1"], ids["s2"] = (w.add_object(m.Stream(device=dev)) for _ in range(2))
        ids["x"] = w.add_object(m.Buffer(size=4096, device=dev))
        ids["exe"] = w.add_object(m.Executable(functions=(KERNEL,), payload=w.add_payload(b"image")))
        body(w, ids)
    return ids


def launch(w, ids, stream="s1", offset=0, buffer="x", cluster=(0, 0, 0)):
    """Kernel ``k`` on ``buffer`` + ``offset`` (in clusters of ``cluster``: a grid of two of them)."""
    return w.launch(
        executable=ids["exe"],
        function=0,
        grid=(2 * cluster[0], 1, 1) if any(cluster) else (1, 1, 1),
        block=(32, 1, 1),
        parameters=bytes(8),
        relocations=[m.Relocation(0, ids[buffer], 0, offset)],
        stream=ids[stream],
        cluster=cluster,
    )


def test_launches_alike_are_packed_once_and_relocated(tmp_path, fake):
    def body(w, ids):
        for k in range(6):
            launch(w, ids, offset=64 * (k % 2))

    write(tmp_path / "c.kreplay", body)
    with replayfmt.open(tmp_path / "c.kreplay") as cap, Replayer(build_plan(cap), ReplayOptions()) as r:
        launches = [s for s in r.steps if s.kind is StepKind.LAUNCH]
        assert len(launches) == 6
        params = [s.args[-2] for s in launches]
        assert len(set(params)) == 2 and params[0] == params[2] == params[4] and params[1] == params[3]
        base = r.addresses[4]  # buffer x
        pointers = [ctypes.c_uint64.from_address(ctypes.c_uint64.from_address(p).value).value for p in params[:2]]
        assert pointers == [base, base + 64]
        r.set_launch_shape(launches[2].operation, (2, 1, 1), (64, 1, 1), 0)  # one launch: the others keep theirs
        shapes = [s.args[1:8] for s in r.steps if s.kind is StepKind.LAUNCH]
        assert shapes[2] == (2, 1, 1, 64, 1, 1, 0) and shapes[0] == shapes[4] == (1, 1, 1, 32, 1, 1, 0)
        assert r.run(2).device_ms == [0.0, 0.0]


def test_cluster_launches_alike_share_one_config_and_a_reshape_copies_it(tmp_path, fake):
    def body(w, ids):
        for _ in range(4):  # cuBLAS's sm_90 kernels run in clusters: one config for all four
            launch(w, ids, cluster=(2, 1, 1))

    write(tmp_path / "c.kreplay", body)
    with replayfmt.open(tmp_path / "c.kreplay") as cap, Replayer(build_plan(cap), ReplayOptions()) as r:
        launches = [s for s in r.steps if s.kind is StepKind.LAUNCH_EX]
        configs = {id(s.args[0]) for s in launches}
        assert len(launches) == 4 and len(configs) == 1
        shared = launches[0].args[0]
        assert (shared.gridDimX, shared.attrs[0].value.clusterDim.x) == (4, 2)
        r.set_launch_shape(launches[1].operation, (8, 1, 1), (64, 1, 1), 128)
        after = [s.args[0] for s in r.steps if s.kind is StepKind.LAUNCH_EX]
        assert (after[1].gridDimX, after[1].blockDimX, after[1].sharedMemBytes) == (8, 64, 128)
        assert after[1].attrs is shared.attrs and after[1].hStream is shared.hStream
        assert all(c is shared for k, c in enumerate(after) if k != 1) and shared.gridDimX == 4
        assert r.run(1).device_ms == [0.0]


def test_events_share_cuda_events_only_where_their_spans_do_not_overlap(tmp_path, fake):
    def body(w, ids):
        dev = ids["device"]
        for k in range(3):  # one event per record, as Triton's persistent matmul makes them
            ids[f"e{k}"] = w.add_object(m.Event(device=dev))
            launch(w, ids)
            w.event_record(ids[f"e{k}"], ids["s1"])
        ids["a"], ids["b"] = w.add_object(m.Event(device=dev)), w.add_object(m.Event(device=dev))
        w.event_record(ids["a"], ids["s1"])
        w.event_record(ids["b"], ids["s2"])  # recorded while a's span is still open
        w.stream_wait_event(ids["s2"], ids["a"])
        ids["waited"] = w.add_object(m.Event(device=dev))
        w.stream_wait_event(ids["s1"], ids["waited"])  # waited on before any record: its own
        w.event_record(ids["waited"], ids["s1"])
        ids["unused"], ids["unused2"] = w.add_object(m.Event(device=dev)), w.add_object(m.Event(device=dev))

    ids = write(tmp_path / "e.kreplay", body)
    with replayfmt.open(tmp_path / "e.kreplay") as cap:
        plan = build_plan(cap)
        assert plan.event_spans[ids["a"]][:2] == [plan.event_spans[ids["a"]][0], plan.event_spans[ids["a"]][0] + 2]
        with Replayer(plan, ReplayOptions()) as r:
            events = r.events
            assert events[ids["e0"]] == events[ids["e1"]] == events[ids["e2"]]
            assert events[ids["a"]] != events[ids["b"]]  # overlapping spans: two CUDA events
            assert events[ids["a"]] == events[ids["e0"]]  # a begins after e2's span ended
            assert events[ids["waited"]] not in {events[ids[k]] for k in ("e0", "a", "b", "unused")}
            assert events[ids["unused"]] == events[ids["unused2"]]
            records = [s.args[0] for s in r.steps if s.kind is StepKind.EVENT_RECORD]
            waits = [s.args[1] for s in r.steps if s.kind is StepKind.STREAM_WAIT]
            assert waits[0] == records[3] == events[ids["a"]]
    # 3 shared by e0-e2 and a, b, waited, the unused ones, 2 timing and 2 join events
    assert fake.calls["cuEventCreate"] == 4 + 2 + 2


def test_a_sticky_error_names_the_launches_since_the_last_synchronisation(tmp_path, fake):
    def body(w, ids):
        launch(w, ids)
        w.stream_synchronize(ids["s1"])
        for _ in range(3):
            launch(w, ids, stream="s2")

    write(tmp_path / "s.kreplay", body)
    fake.cuCtxSynchronize = lambda: (FakeError("CUDA_ERROR_ILLEGAL_ADDRESS"),)
    with (
        replayfmt.open(tmp_path / "s.kreplay") as cap,
        Replayer(build_plan(cap), ReplayOptions()) as r,
        pytest.raises(replayfmt.DeviceError) as caught,
    ):
        r.run(1)
    message = str(caught.value)
    assert "launches since the last successful synchronisation: operation 7 (k), operation 8 (k), operation 9 (k)" in (
        message
    )
    assert "operation 5" not in message and caught.value.sticky


def test_launches_alike_are_checked_once_and_counted_each(tmp_path):
    """The plan checks a launch like one already checked only once, but counts it, and a launch
    that differs in anything its checks read (here its grid) is checked and refused."""

    def body(w, ids):
        for _ in range(3):
            launch(w, ids)
        w.launch(executable=ids["exe"], function=0, grid=(0, 1, 1), block=(32, 1, 1), parameters=bytes(8))

    write(tmp_path / "d.kreplay", body)
    with replayfmt.open(tmp_path / "d.kreplay") as cap:
        with pytest.raises(replayfmt.UnsupportedOperationError, match="operation 8 \\(k\\): grid dimension 0 is 0"):
            build_plan(cap)
        plan = build_plan(cap, replayfmt.replay.plan.PlanOptions(continue_on_error=True))
    assert plan.launches_of[(5, 0)] == 3 and plan.operation_counts["launch"] == 4 and len(plan.problems) == 1


def test_the_plan_of_many_events_runs_no_collection_and_leaves_the_collector_as_it_was(tmp_path):
    """Full passes of Python's collector over a heap of decoded events cost more than the plan's
    own checks (measured on the H100 machine): the plan pauses it, and restores it, even when it
    raises."""

    def body(w, ids):
        for _ in range(20_000):
            launch(w, ids)
            w.event_record(w.add_object(m.Event(device=ids["device"])), ids["s1"])
        w.launch(executable=ids["exe"], function=0, grid=(0, 1, 1), block=(32, 1, 1), parameters=bytes(8))

    write(tmp_path / "e.kreplay", body)
    passes: list[int] = []

    def count(phase: str, info: dict) -> None:
        if phase == "start":
            passes.append(info["generation"])

    try:
        with replayfmt.open(tmp_path / "e.kreplay") as cap:
            gc.collect()
            gc.callbacks.append(count)
            plan = build_plan(cap, PlanOptions(continue_on_error=True))
            # none while it ran: at most the young pass that follows once the collector is back
            assert gc.isenabled() and passes in ([], [0])
            assert len(plan.event_spans) == 20_000 and len(plan.problems) == 1
            gc.disable()
            with pytest.raises(replayfmt.UnsupportedOperationError):
                build_plan(cap)
            assert not gc.isenabled()  # left as the caller had it
            gc.enable()
            with pytest.raises(replayfmt.UnsupportedOperationError):
                build_plan(cap)
            assert gc.isenabled()
    finally:
        if count in gc.callbacks:
            gc.callbacks.remove(count)
        gc.enable()


def test_identical_uploads_holding_stored_pointers_are_each_planned_and_staged(tmp_path, fake):
    """Uploads that hold stored pointers (1.3) are staged one by one, relocated in place: ten alike
    were checked once by the plan, which then knew only the first's staging (a KeyError at setup)."""

    def body(w, ids):
        table = w.add_payload(bytes(64))
        for _ in range(10):
            w.copy_h2d(
                dst_buffer=ids["x"], payload=table, size=64, relocations=[m.Relocation(ids["x"], ids["x"], 0, 128)]
            )
        launch(w, ids)

    write(tmp_path / "c.kreplay", body)
    with replayfmt.open(tmp_path / "c.kreplay") as cap:
        plan = build_plan(cap)
        assert sum(1 for key in plan.uploads if key[0] == "relocated") == 10
        with Replayer(plan, ReplayOptions()) as r:
            assert sum(s.kind == StepKind.UPLOAD for s in r.steps) == 10


def test_an_overridden_launch_is_not_packed_with_its_equals(tmp_path, fake):
    """Three launches alike, the second overridden (--launch OP:grid=...): it keeps its own shape."""

    def body(w, ids):
        for _ in range(3):
            launch(w, ids)

    write(tmp_path / "c.kreplay", body)
    with replayfmt.open(tmp_path / "c.kreplay") as cap:
        launches = [op.index for op in cap.iter_operations() if isinstance(op, m.Launch)]
        override = LaunchOverride.parse(f"{launches[1]}:grid=4,1,1")
        plan = build_plan(cap, PlanOptions(launch_overrides=(override,)))
        with Replayer(plan, ReplayOptions()) as r:
            grids = {s.operation: s.args[1:4] for s in r.steps if s.kind == StepKind.LAUNCH}
    assert grids == {launches[0]: (1, 1, 1), launches[1]: (4, 1, 1), launches[2]: (1, 1, 1)}


@pytest.mark.parametrize("site", [False, True])
def test_the_plan_knows_when_replay_writes_pointers_into_memory(tmp_path, site):
    """A launch whose relocation site is a buffer writes a device address into memory: verification
    then poisons no integers (a poisoned address faults the replay)."""

    def body(w, ids):
        relocations = [m.Relocation(0, ids["x"], 0, 0)]
        if site:
            relocations.append(m.Relocation(ids["x"], ids["x"], 256, 64))
        w.launch(
            executable=ids["exe"],
            function=0,
            grid=(1, 1, 1),
            block=(32, 1, 1),
            parameters=bytes(8),
            relocations=relocations,
            stream=ids["s1"],
        )

    write(tmp_path / "c.kreplay", body)
    with replayfmt.open(tmp_path / "c.kreplay") as cap:
        assert build_plan(cap).stores_pointers is site


def test_a_session_warms_its_devices_while_it_plans_and_releases_them(tmp_path, fake, monkeypatch):
    """open_replay(warm_devices=...) starts CUDA and retains the devices' primary contexts on a
    thread of its own, through the driver library (ctypes); the replay starts after it is done,
    and closing the session releases every context retained (the warm-up's and the replay's
    alike). A warm-up that fails leaves the error to the setup; no driver library: no warm-up."""
    import replayfmt.replay.devices as devices_module
    from replayfmt.execute import open_replay

    held: list[object] = []

    class Library:  # libcuda's calls as ctypes makes them: out-parameters by reference
        refuse = False

        def cuInit(self, flags):
            return 0

        def cuDeviceGet(self, device, ordinal):
            device._obj.value = ordinal
            return 100 if self.refuse else 0

        def cuDevicePrimaryCtxRetain(self, context, device):
            held.append(("warm-up", device.value))
            return 0

        def cuDevicePrimaryCtxRelease_v2(self, device):
            held.remove(("warm-up", device))
            return 0

    library = Library()
    monkeypatch.setattr(devices_module, "libcuda", lambda: library)
    retain, release = fake.cuDevicePrimaryCtxRetain, fake.cuDevicePrimaryCtxRelease

    def counted_retain(device):
        held.append(("replay", device))
        return retain(device)

    def counted_release(device):
        held.remove(("replay", device))
        return release(device)

    monkeypatch.setattr(fake, "cuDevicePrimaryCtxRetain", counted_retain)
    monkeypatch.setattr(fake, "cuDevicePrimaryCtxRelease", counted_release)
    write(tmp_path / "c.kreplay", lambda w, ids: launch(w, ids))
    with open_replay(tmp_path / "c.kreplay", warm_devices=(0,)) as session:
        replayer = session.start(ReplayOptions())
        assert [who for who, _ in held] == ["warm-up", "replay"]
        replayer.run(1)
    assert held == []

    library.refuse = True  # the warm-up stops; the setup meets the error itself and names it
    monkeypatch.setattr(fake, "cuDeviceGet", lambda ordinal: (FakeError("CUDA_ERROR_INVALID_DEVICE"), 0))
    session = open_replay(tmp_path / "c.kreplay", warm_devices=(0,))
    with session, pytest.raises(replayfmt.ReplayError, match=r"cuDeviceGet\(0\)"):
        session.start(ReplayOptions())
    assert held == []

    devices_module.DeviceWarmup((0,), library=lambda: None).close()  # no driver library: nothing done


def test_downloads_take_their_pinned_memory_from_a_few_slabs(tmp_path, fake, monkeypatch):
    """Each download's destination is pinned memory of its own, taken from slabs (a page-locked
    allocation stops concurrent streams, and the first run of run-replay builds its steps while
    it runs): 300 downloads of 4 KiB make two allocations, not 300."""
    sizes: list[int] = []
    allocate = fake.cuMemHostAlloc

    def counted(size, flags=0):
        sizes.append(size)
        return allocate(size, flags)

    monkeypatch.setattr(fake, "cuMemHostAlloc", counted)

    def body(w, ids):
        for k in range(300):
            w.copy_d2h(src_buffer=ids["x"], size=4096 - k % 2, stream=ids["s1"])

    write(tmp_path / "c.kreplay", body)
    with replayfmt.open(tmp_path / "c.kreplay") as cap, Replayer(build_plan(cap), ReplayOptions()) as r:
        hosts = sorted(s.args[0] for s in r.steps if s.kind is StepKind.DOWNLOAD)
        assert len(hosts) == 300 and all(b - a >= 4096 for a, b in itertools.pairwise(hosts))
        assert r.run(1).errors == []
    assert sorted(sizes) == [1 << 20, 2 << 20]
