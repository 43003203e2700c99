"""Host pace of a replay: how many operations a second the host gets through around the device's
time, on the CPU (no GPU needed), measured side by side in one run (issue 29, part 2).

    python benchmarks/host_pace_bench.py [--launches 256000] [--check] [--capture FILE] [--profile PHASE]
                                         [--rounds 3]
    python benchmarks/host_pace_bench.py --device --capture FILE [--check]

A capture shaped like Triton's persistent-matmul tutorial capture (per launch: most create an
event and record it, as its 256,507 launches, 225,850 event records and 226,008 creates do) is
written with the real writer, then taken through each host phase of `run-replay`:

- open: ``replayfmt.open``, every record batch decoded and verified (cached, as run-replay's
  reader keeps them) and the capture's objects gathered by id (``Capture.object_table``: its
  events as columns, as the plan takes them);
- plan: ``build_plan`` (every check that needs no GPU);
- setup: the Replayer's setup phases (streams and events, buffers, packed launches, steps) over
  a stand-in driver (tests/fake_device.py's FakeDriver: every call answers at once);
- issue: one run of the prepared steps through the same stand-in driver;

each as operations a second, beside a bare baseline: the same number of calls of the stand-in
driver's launch from a plain Python loop over pre-built argument tuples (the least any Python
replay can do). ``--check`` exits 1 unless every phase reaches 100,000 operations a second
(the goal: host work under 10% of the device time of such a capture on an H100).

``--device`` (needs a GPU and ``--capture``) measures what a user waits for instead: the capture
replayed and verified on the GPU as ``run-replay --verify`` does it, in a fresh process each
time (the command's imports; open; plan; setup, phase by phase; one verified run; close), wall
time against the device time of a run whose steps were built at setup (CUDA events), side by
side: every step built at setup, and the steps built as the first run issues them
(``build_while_running``, what run-replay does), alternating for ``--rounds``. Host work is the
wall time that is not device time: every phase but the run, and the run's time past the device
time of the run whose steps were built at setup (a run that comes out shorter, by the device's
own variation between processes, earns nothing); ``--check`` exits 1 unless it is under 10% of
the device time.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))  # the stand-in driver lives with the tests

from fake_device import FakeDriver  # noqa: E402

import replayfmt  # noqa: E402
import replayfmt.cuda.driver as driver_module  # noqa: E402
import replayfmt.replay.devices as devices_module  # noqa: E402
import replayfmt.replay.replayer as replayer_module  # noqa: E402
from replayfmt.format import model as m  # noqa: E402
from replayfmt.replay import Replayer, ReplayOptions  # noqa: E402
from replayfmt.replay.plan import build_plan  # noqa: E402

GOAL = 100_000  # operations a second, every phase
HOST_SHARE_GOAL = 0.10  # --device: host work under this share of the device time
WALL_PHASES = ("imports", "open and plan", "setup", "run", "close")
MATMUL = m.Function(
    name="matmul_kernel_persistent",
    parameters=(
        m.Parameter(offset=0, size=8, kind=m.ParameterKind.POINTER, name="a"),
        m.Parameter(offset=8, size=8, kind=m.ParameterKind.POINTER, name="b"),
        m.Parameter(offset=16, size=8, kind=m.ParameterKind.POINTER, name="c"),
        m.Parameter(offset=24, size=4, kind=m.ParameterKind.VALUE, name="M", dtype=m.DType.INT32),
        m.Parameter(offset=28, size=4, kind=m.ParameterKind.VALUE, name="N", dtype=m.DType.INT32),
        m.Parameter(offset=32, size=4, kind=m.ParameterKind.VALUE, name="K", dtype=m.DType.INT32),
    ),
    parameters_known=True,
)
LAYOUT = [(p.offset, p.size) for p in MATMUL.parameters]


def write_capture(path: Path, launches: int) -> int:
    """A persistent-matmul-like capture: ``launches`` launches on two streams, 88% of them
    followed by a new event recorded after it (a create and a record). Returns its operations."""
    with replayfmt.CaptureWriter(path) as w:
        dev = w.add_object(m.Device(name="NVIDIA H100", compute_capability=(9, 0)))
        streams = [w.add_object(m.Stream(device=dev)) for _ in range(2)]
        a, b, c = (w.add_object(m.Buffer(size=1 << 20, device=dev)) for _ in range(3))
        exe = w.add_object(
            m.Executable(format=m.ExecutableFormat.CUBIN, functions=(MATMUL,), payload=w.add_payload(b"not a cubin"))
        )
        parameters = bytes(24) + (512).to_bytes(4, "little") * 3 + bytes(4)
        relocations = tuple(m.Relocation(0, t, 8 * k, 0) for k, t in enumerate((a, b, c)))
        for i in range(launches):
            stream = streams[i & 1]
            w.launch(
                executable=exe,
                function=0,
                grid=(132, 1, 1),
                block=(128, 1, 1),
                parameters=parameters,
                relocations=relocations,
                stream=stream,
                shared_memory=0,
            )
            if i % 100 < 88:
                event = w.add_object(m.Event(device=dev))
                w.event_record(event, stream)
        return w.operation_count


def use_fake_driver(fake: FakeDriver) -> None:
    """Route the replay's driver door to the stand-in (the process never loads cuda-python)."""
    driver_module.driver = lambda: fake  # check() and compute_capability() look it up here
    replayer_module.driver = lambda: fake
    devices_module.driver = lambda: fake


class Phases:
    """Each host phase of a replay of ``path``, timed (seconds) and optionally profiled."""

    def __init__(self, path: Path, profile: str | None) -> None:
        self.path = path
        self.profile = profile
        self.seconds: dict[str, float] = {}
        self.profiles: dict[str, pstats.Stats] = {}

    def timed(self, name: str, work):
        profiler = cProfile.Profile() if self.profile in (name, "all") and name not in self.profiles else None
        gc.collect()
        started = time.perf_counter()
        if profiler is not None:
            profiler.enable()
        out = work()
        if profiler is not None:
            profiler.disable()
        seconds = time.perf_counter() - started
        if profiler is not None:
            self.profiles[name] = pstats.Stats(profiler)
        else:  # the best of the rounds (a profiled round is slower: not counted)
            self.seconds[name] = min(seconds, self.seconds.get(name, seconds))
        return out

    def run_rounds(self, rounds: int) -> int:
        """The phases ``rounds`` times (the first one profiled, when asked, and then run again)."""
        count = 0
        for _ in range(rounds + (1 if self.profile else 0)):
            count = self.run()
        return count

    def run(self) -> int:
        with replayfmt.open(self.path) as cap:  # each function's parameter layout, as the driver reports it
            layouts = {
                f.name: [(p.offset, p.size) for p in f.parameters]
                for o in cap.objects()
                if isinstance(o, m.Executable)
                for f in o.functions
            }
        fake = FakeDriver(layouts)
        use_fake_driver(fake)

        def open_all():  # as run-replay opens: every record batch decoded (and cached), and its objects
            cap = replayfmt.open(self.path)  # (events kept as columns: the plan asks for no event object)
            cap.operation_kinds()
            cap.object_table()
            return cap

        cap = self.timed("open", open_all)
        with cap:
            plan = self.timed("plan", lambda: build_plan(cap))
            options = ReplayOptions(check_payloads=False)
            replayer = self.timed("setup", lambda: Replayer(plan, options))
            with replayer:
                self.timed("issue", lambda: replayer.run(1))
                steps = len(replayer.steps)
            launch = fake.cuLaunchKernel
            args = [(i, 132, 1, 1, 128, 1, 1, 0, 7, 0, 0) for i in range(steps)]

            def bare():
                for a in args:
                    launch(*a)

            self.timed("bare loop", bare)
            self.events_created = fake.calls.get("cuEventCreate", 0)
            return cap.operation_count


DEVICE_CHILD = """
import json, sys, time
started = time.perf_counter()
import tools.run_replay  # what the command imports
seconds = {"imports": time.perf_counter() - started}
from benchmarks.host_pace_bench import device_phases
seconds.update(device_phases(sys.argv[1], sys.argv[2] == "as-it-runs"))
print(json.dumps(seconds))
"""


def device_phases(path: str, build_while_running: bool) -> dict[str, float]:
    """run-replay --verify's work on ``path`` on the GPU, phase by phase (seconds of wall time;
    setup's own phases prefixed "  ", the steps' building included where the first run does it),
    the verified run's device time ("device", its starting state's included) and the number of
    ranges it compared."""
    from replayfmt.execute import open_replay

    seconds: dict[str, float] = {}
    started = time.perf_counter()
    session = open_replay(path, warm_devices=(0,))  # as run-replay opens it
    seconds["open and plan"] = time.perf_counter() - started
    with session:
        started = time.perf_counter()
        replayer = session.start(ReplayOptions(verify=True, build_while_running=build_while_running))
        seconds["setup"] = time.perf_counter() - started
        started = time.perf_counter()
        result = replayer.run(1)
        run = time.perf_counter() - started
        # setup's phases, and the steps' building where the run did it (inside the run's time)
        seconds.update({f"  {name}": value for name, value in replayer.setup_seconds.items()})
        seconds["run"] = run
        if result.mismatches:
            raise SystemExit(f"{path}: the replay did not verify ({len(result.mismatches)} ranges differ)")
        seconds["device"] = (result.device_ms[0] + result.state_ms[0]) / 1e3  # starting state is device work too
        seconds["ranges compared"] = len(result.reports)
        started = time.perf_counter()
    seconds["close"] = time.perf_counter() - started
    return seconds


def device_main(path: Path, check: bool, rounds: int) -> int:
    """--device: the host share of run-replay --verify on the GPU, steps built at setup and as
    the run goes, each in a fresh process (as a user runs the command), alternating; the round
    of least wall time of each is shown."""
    with replayfmt.open(path) as capture:
        operations = capture.operation_count
    print(f"capture: {operations:,} operations in {path}, replayed and verified on the GPU")
    columns: dict[str, dict[str, float]] = {}
    for _ in range(rounds):
        for name in ("at setup", "as it runs"):
            child = [sys.executable, "-c", DEVICE_CHILD, str(path), name.replace(" ", "-")]
            out = subprocess.run(child, check=True, capture_output=True, text=True, cwd=HERE.parent)
            seconds = json.loads(out.stdout.strip().splitlines()[-1])
            if name not in columns or _wall(seconds) < _wall(columns[name]):
                columns[name] = seconds
    print(f"{'seconds (best of ' + str(rounds) + ')':<28}" + "".join(f"{'steps built ' + n:>26}" for n in columns))
    phases = dict.fromkeys([*columns["at setup"], *columns["as it runs"]])
    for phase in phases:
        digits = 0 if phase == "ranges compared" else 3
        print(f"{phase:<28}" + "".join(f"{c.get(phase, 0.0):>26.{digits}f}" for c in columns.values()))
    # the device time of the run whose steps were built at setup: a run that builds them as it
    # goes may leave the device waiting, which its own device time would count as device work
    device = columns["at setup"]["device"]
    shares = {}
    for name, c in columns.items():
        wall = _wall(c)
        # the host's phases, and the run's time past the reference device time; a run shorter than
        # it is the device's own variation between processes (its clocks: a few percent), not
        # host work saved, and is not counted as such
        host = wall - c["run"] + max(0.0, c["run"] - device)
        shares[name] = share = host / device
        print(
            f"steps built {name}: wall {wall:.2f} s, device {device:.2f} s, host {host:.2f} s = "
            f"{share:.1%} of the device time ({operations / host:,.0f} ops/s of host work)"
        )
    failed = shares["as it runs"] >= HOST_SHARE_GOAL
    print(f"goal: host work under {HOST_SHARE_GOAL:.0%} of the device time, steps built as it runs (as run-replay)")
    if check:
        print("FAIL" if failed else "PASS")
        return 1 if failed else 0
    return 0


def _wall(seconds: dict[str, float]) -> float:
    return sum(seconds[phase] for phase in WALL_PHASES)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--launches", type=int, default=256_000, help="launches in the capture (default 256,000)")
    parser.add_argument("--check", action="store_true", help=f"exit 1 unless every phase reaches {GOAL:,} ops/s")
    parser.add_argument(
        "--profile", choices=["open", "plan", "setup", "issue", "all"], help="print cProfile's top entries of a phase"
    )
    parser.add_argument("--capture", type=Path, help="time the phases on this capture instead of a generated one")
    parser.add_argument("--rounds", type=int, default=3, help="time each phase this many times, keep the best (3)")
    parser.add_argument(
        "--device", action="store_true", help="replay and verify --capture on the GPU: host work against device time"
    )
    args = parser.parse_args()
    if args.device:
        if args.capture is None:
            parser.error("--device needs --capture FILE (a capture recorded on this machine's GPU)")
        return device_main(args.capture, args.check, max(1, args.rounds))
    with tempfile.TemporaryDirectory() as tmp:
        path = args.capture or Path(tmp) / "persistent.kreplay"
        started = time.perf_counter()
        operations = replayfmt.open(path).operation_count if args.capture else write_capture(path, args.launches)
        written = time.perf_counter() - started
        phases = Phases(path, args.profile)
        count = phases.run_rounds(max(1, args.rounds))
    assert count == operations
    made = f"({args.launches:,} launches), written in {written:.2f} s" if not args.capture else f"in {path}"
    print(f"capture: {operations:,} operations {made}")
    print(f"stand-in driver: {phases.events_created:,} events created at setup")
    print(f"{'phase':<10} {'seconds':>8} {'ops/s':>12}  vs bare loop   (best of {max(1, args.rounds)} rounds)")
    bare = operations / phases.seconds["bare loop"]
    failed = []
    for name, seconds in phases.seconds.items():
        rate = operations / seconds
        print(f"{name:<10} {seconds:>8.3f} {rate:>12,.0f}  {rate / bare:>6.2f}x")
        if name != "bare loop" and rate < GOAL:
            failed.append(name)
    total = sum(s for n, s in phases.seconds.items() if n != "bare loop")
    print(f"host total {total:>8.3f} {operations / total:>12,.0f}")
    for name, stats in phases.profiles.items():
        print(f"\n--- cProfile: {name} ---")
        stats.sort_stats("tottime").print_stats(12)
    if args.check:
        if failed:
            print(f"FAIL: under {GOAL:,} operations a second: {', '.join(failed)}")
            return 1
        print(f"PASS: every phase at {GOAL:,} operations a second or more")
    return 0


if __name__ == "__main__":
    sys.exit(main())
