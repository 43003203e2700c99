"""Rebuild a capture on one or several CUDA devices and execute it.

A :class:`Replayer` takes a :class:`~replayfmt.replay.plan.Plan` and does the cold work once,
phase by phase (each in its own module: devices, buffers, modules, streams, staging, steps),
turning the capture into a list of steps; :meth:`Replayer.run` then executes the steps (as many
times as asked), each on its own captured stream, so that concurrency and event edges are kept.
With ``ReplayOptions(build_while_running=True)`` (run-replay) the steps of a single-device
capture are built by the first run, a stretch at a time just before it issues them, so the
device starts at once and building overlaps its work.
Captured device k runs on ``options.devices[k]``; a step that changes device first makes that
device's context current (single-device captures never switch).

Strict: a CUDA error stops the replay with an error naming the operation, object and kernel and
the driver's error; a sticky error found at a synchronisation also names the launches issued since
the last one that succeeded. Ownership: the Replayer owns every device resource it creates and
frees them in :meth:`close` (idempotent; also a context manager).

:func:`replayfmt.execute.open_replay` opens a capture and plans it into a session that starts the
Replayer: the sequence every tool follows.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from replayfmt.container.batches import collector_paused
from replayfmt.cuda.driver import check, driver
from replayfmt.cuda.nvtx import Nvtx
from replayfmt.errors import ReplayUsageError
from replayfmt.format import model as m
from replayfmt.replay.buffers import allocate_buffers, steer_fixed_arena
from replayfmt.replay.collectives import CollectiveRuntime
from replayfmt.replay.devices import Devices, ReplayDevice
from replayfmt.replay.graphs import PreparedGraph
from replayfmt.replay.modules import Modules
from replayfmt.replay.options import ReplayOptions, RunResult
from replayfmt.replay.plan import Plan
from replayfmt.replay.running import StepRunner
from replayfmt.replay.staging import Staging, StagingStats, stage_uploads
from replayfmt.replay.state import PoisonWrite, StateSetter
from replayfmt.replay.steps import (
    BuiltSteps,
    Step,
    StepBuilder,
    reshape_graph_node,
    retarget_functions,
    set_launch_shape,
    wrap_with_events,
)
from replayfmt.replay.stored_pointers import relocate_staged
from replayfmt.replay.streams import Streams
from replayfmt.replay.verify import RangeObserver, Verifier

_BUILT_AT_A_TIME = 1024  # operations whose steps a first run builds before issuing them (a few ms)


class Replayer:
    """Executes a plan on CUDA devices. Create, call :meth:`run`, then :meth:`close`."""

    def __init__(self, plan: Plan, options: ReplayOptions | None = None) -> None:
        self.plan = plan
        self.options = options or ReplayOptions()
        self.setup_seconds: dict[str, float] = {}  # setup phase -> seconds it took
        arena_problem = steer_fixed_arena(plan, self.options.devices)  # before CUDA starts here
        self._devices: Devices = self._phase("load_driver", lambda: Devices(driver()))
        try:
            with collector_paused():  # setup makes a record per operation, and no cycles (see batches)
                self._setup(arena_problem)
        except BaseException:
            self.close()
            raise

    def _setup(self, arena_problem: str | None) -> None:
        plan, options, devices = self.plan, self.options, self._devices
        self._phase("open_devices", lambda: devices.open(plan, options.devices))
        self._phase("check_device_fits", lambda: devices.check_fit(plan))
        self.addresses: dict[int, int] = self._phase(
            "allocate_buffers", lambda: allocate_buffers(devices, plan, arena_problem)
        )
        self._modules = Modules(devices, plan)
        self._phase("load_modules", self._modules.load)
        # (1.4) module globals live in the modules
        self.addresses.update(self._phase("find_module_globals", self._modules.global_storage))
        self._streams = Streams(devices)
        self._phase("create_streams_and_events", lambda: self._streams.create(plan))
        self._staging: Staging = self._phase(
            "stage_inputs",
            lambda: stage_uploads(
                devices, plan, from_host=options.uploads_from_host, check_payloads=options.check_payloads
            ),
        )
        self.stored_pointers: int = self._phase(  # (1.3) pointers the program stored in memory
            "relocate_stored_pointers", lambda: relocate_staged(devices, plan, self._staging, self.addresses)
        )
        self._verifier = Verifier(devices, plan, self.addresses, options.tolerance, options.save_output)
        self._state = StateSetter(devices, self._streams, self._staging.staged, self.addresses)
        # a rank's device made current as NCCL makes its communicator (several ranks in one capture)
        self.collectives = CollectiveRuntime(
            options.peers, use_device=lambda device: devices.use(devices.index(device))
        )
        self.own(self.collectives.close)
        self._builder: StepBuilder = self._phase("build_steps", self._step_builder)
        self._runner = StepRunner(
            devices, plan, self._builder.built.kernel_names, continue_on_error=options.continue_on_error
        )

    def _phase(self, name: str, work: Callable[[], Any]) -> Any:
        started = time.perf_counter()
        out = work()
        self.setup_seconds[name] = time.perf_counter() - started
        return out

    def _step_builder(self) -> StepBuilder:
        """The steps' builder, done unless the first run may build them as it issues them (one
        device, no CUDA graphs: graphs are instantiated as they are built)."""
        options = self.options
        builder = StepBuilder(
            self._devices,
            self.plan,
            modules=self._modules,
            addresses=self.addresses,
            streams=self._streams,
            staged=self._staging.staged,
            verifier=self._verifier,
            state=self._state,
            verify=options.verify,
            save_output=options.save_output is not None,
            nvtx=Nvtx.load() if options.nvtx else None,
            collectives=self.collectives,
        )
        streamed = options.build_while_running and not self._devices.several and not self.plan.graphs
        if not streamed:
            builder.finish()
        return builder

    @property
    def _built(self) -> BuiltSteps:
        """Every step, built (what was left for the first run to build is built now)."""
        return self._builder.finish()

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> Replayer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def own(self, release: Callable[[], Any]) -> None:
        """Register the release of a resource made for this replay (freed by :meth:`close`)."""
        self._devices.own(release)

    def close(self) -> None:
        """Free every resource this replayer created (in reverse order). Idempotent."""
        self._devices.close()

    # -- what was set up ---------------------------------------------------------------------

    @property
    def observer(self) -> RangeObserver | None:
        """Watches every verified range across runs (nondeterminism), or None."""
        return self._verifier.observer

    @observer.setter
    def observer(self, value: RangeObserver | None) -> None:
        self._verifier.observer = value

    def poison(self, writes: dict[int, list[PoisonWrite]] | None) -> None:
        """Write these bytes over buffer ranges right after the starting state of the region that
        begins at each key is set, in every following run (None: stop); docs/VERIFY.md."""
        self._state.poison = dict(writes or {})

    def verify_only(self, ranges: set[tuple[int, int, int]] | None) -> None:
        """Compare only these (operation, buffer, offset) ranges in the following runs (None: all)."""
        self._verifier.only = None if ranges is None else set(ranges)

    @property
    def cu(self) -> Any:
        """The CUDA driver bindings."""
        return self._devices.cu

    @property
    def gpus(self) -> list[ReplayDevice]:
        """The devices, in captured-device order."""
        return self._devices.gpus

    # the first device: where tuning, benchmarks and single-device captures run
    @property
    def device(self) -> Any:
        return self.gpus[0].handle

    @property
    def device_name(self) -> str:
        return self.gpus[0].name

    @property
    def compute_capability(self) -> tuple[int, int]:
        return self.gpus[0].compute_capability

    @property
    def max_shared_optin(self) -> int:
        return self.gpus[0].max_shared_optin

    @property
    def functions(self) -> dict[tuple[int, int], Any]:
        """(executable, function index) -> function handle, on the first device."""
        return self._modules.functions

    @property
    def layouts(self) -> dict[tuple[int, int], list[tuple[int, int]]]:
        """(executable, function index) -> the loaded function's (offset, size) per parameter."""
        return self._modules.layouts

    @property
    def streams(self) -> dict[int, Any]:
        """Captured stream id -> stream (0: the first device's default stream, the timing stream)."""
        return self._streams.handles

    @property
    def events(self) -> dict[int, Any]:
        return self._streams.events

    @property
    def op_streams(self) -> dict[int, Any]:
        """Operation index -> the stream its steps run on."""
        return self._built.op_streams

    @property
    def staging(self) -> StagingStats:
        return self._staging.stats

    @property
    def pristine_on_device(self) -> bool:
        return self._staging.stats.on_device

    @property
    def steps(self) -> list[Step]:
        """The prepared steps, in capture order."""
        return self._built.steps

    @property
    def state(self) -> StateSetter:
        """What sets starting state; its ``begin``/``elapsed_ms`` say how long setting it took (a
        benchmark leaves that time out of a region that spans several captured regions)."""
        return self._state

    def graph(self, index: int) -> PreparedGraph | None:
        """The graph that graph launch operation ``index`` runs (None for other operations)."""
        return self._built.graphs.get(index)

    def kernel_name(self, index: int) -> str | None:
        """The kernel a launch operation runs (None for other operations)."""
        return self._built.kernel_names.get(index)

    # -- changing steps (tuning, timing) -----------------------------------------------------

    def set_launch_shape(self, index: int, grid: m.Dims, block: m.Dims, shared_memory: int) -> None:
        """Change the shape of launch operation ``index`` in the prepared steps (for tuning)."""
        set_launch_shape(self.cu, self._built.steps, index, grid, block, shared_memory)

    def set_graph_node_shape(self, graph: int, node: int, grid: m.Dims, block: m.Dims, shared_memory: int) -> None:
        """Change the shape of kernel node ``node`` of Graph object ``graph`` (for tuning)."""
        reshape_graph_node(self._built, graph, node, grid, block, shared_memory)

    def load_with_register_cap(self, executable: int, max_registers: int | None, threads_per_block: int = 0) -> None:
        """Re-JIT a PTX executable with a register cap and a threads-per-block hint (None: back to
        the image as loaded at setup) and point its launches at the new functions."""
        old_to_new = self._modules.load_with_register_cap(executable, max_registers, threads_per_block)
        retarget_functions(self._built.steps, old_to_new)

    def opt_in_shared_memory(self, executable: int, function: int, size: int) -> None:
        """Allow a function ``size`` bytes of dynamic shared memory (over 48 KiB needs opting in)."""
        self._modules.opt_in_shared_memory(executable, function, size)

    def wrap_with_events(self, index: int, before: Any, after: Any) -> None:
        """Record ``before``/``after`` on the operation's stream around its steps (for timing)."""
        steps = self._built.steps
        if not any(step.operation == index for step in steps):
            raise ReplayUsageError(f"operation {index} has no device work to time")
        wrap_with_events(steps, index, self.op_streams[index], before, after, self.cu.cuEventRecord)

    # -- running -----------------------------------------------------------------------------

    @property
    def issue_compiled(self) -> bool:
        """Whether steps go through the C issue loop (replayfmt/replay/issue.c), not Python alone."""
        return self._runner.compiled is not None

    def execute_steps(self, steps: Sequence[Step]) -> list[str]:
        """Issue steps; raise on the first failure (or collect them with continue_on_error)."""
        return self._runner.execute(steps)

    def fork(self, event: Any) -> None:
        """Record ``event`` on the timing stream and make every captured stream wait for it."""
        self._streams.fork(event)

    def join(self, event: Any) -> None:
        """Make the timing stream wait for every captured stream, then record ``event`` on it."""
        self._streams.join(event)

    def synchronize(self) -> None:
        """Wait for all work; a failure names the launches issued since the last good sync."""
        self._runner.synchronize()

    def _build_more(self) -> bool:
        return self._builder.extend(_BUILT_AT_A_TIME)

    def read_back(self, buffer: int, offset: int, size: int) -> bytes:
        """The current bytes of a range of a captured buffer (after all work is done)."""
        return self._verifier.read_back(buffer, offset, size)

    def run(self, repetitions: int = 1, *, verify: bool | None = None) -> RunResult:
        """Execute the capture ``repetitions`` times; device time per repetition (CUDA events).

        Each repetition re-runs the captured uploads, so inputs are restored between repetitions;
        device time leaves out the setting of starting state (it is not the program's work).
        ``verify`` chooses whether this run compares checkpoints and expected downloads (None: as
        ``options.verify`` says); verifying needs a replayer set up with ``verify=True``.
        """
        if verify is None:
            verify = self.options.verify
        elif verify and not self.options.verify:
            raise ReplayUsageError("run(verify=True) needs a Replayer made with ReplayOptions(verify=True)")
        cu = self.cu
        start, end = self._streams.timing
        result = RunResult()
        for repetition in range(repetitions):
            self._builder.check()  # a build that failed in an earlier run: raised before anything is issued
            self._verifier.begin(result, repetition, verify=verify)
            self._state.begin()
            self.fork(start)
            if self._builder.done:
                result.errors += self.execute_steps(self._built.steps)
            else:  # the first run: steps issued as they are built, the device working meanwhile
                result.built_while_running = True
                # the collector paused for the whole run: re-enabled between stretches, it would walk
                # the records built so far again and again while the device waits
                with collector_paused():
                    result.errors += self._runner.execute(self._builder.built.steps, grow=self._build_more)
                self.setup_seconds["build_steps (during the first run)"] = self._builder.seconds
            self.join(end)
            self.synchronize()
            total = check(cu.cuEventElapsedTime(start, end), "cuEventElapsedTime")
            state = self._state.elapsed_ms()
            result.device_ms.append(total - state)
            result.state_ms.append(state)
        return result
