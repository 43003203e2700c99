"""Timing replayed work: a scope (or the whole capture), from the same starting state every time.

A :class:`Benchmark` works on a prepared :class:`~replayfmt.replay.replayer.Replayer`. Cold work happens
once: the operations before the region run once, and so does its starting state (any captured
state set before the region's first device work, also when the region is the whole capture), and
what the region starts from gets a pristine device copy (``restore``: the state ranges of a buffer nothing
before the region writes, such as a framework's arena; whole buffers otherwise). Each iteration
then restores those bytes with device-to-device copies (and optionally flushes the L2 cache)
outside the timed region, and times the region with CUDA events on the timing stream, joined with
every captured stream. Starting state is never timed: a region that spans several captured
regions sets the later ones' state every iteration, and leaves it out of the elapsed time (the
interval between the events around it) and of CUPTI's busy time (its copies carry no iteration tag).

In graph mode the region is captured once as a CUDA graph (host synchronisations inside it become
event edges, which keep the same device-side ordering) and each iteration launches the graph.
Events inside a graph cannot be timed, so per-operation times (and traces) then come from as many
extra eager iterations (at most 50), run after the graph's.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from replayfmt.cuda.driver import check
from replayfmt.errors import ReplayError, ReplayUsageError
from replayfmt.format import model as m
from replayfmt.format.host_waits import released_counts
from replayfmt.format.names import demangle
from replayfmt.format.uses import ModuleGlobals, uses
from replayfmt.measure import kernel_times as kt
from replayfmt.measure.graph_nodes import NodeKey, node_name, unroll_graph_launches
from replayfmt.measure.restore import Span, buffers_of, restore_spans
from replayfmt.reader import Capture
from replayfmt.replay.graph_plan import buffers_used_by_graph, kernel_nodes
from replayfmt.replay.graphs import launch_into_capture
from replayfmt.replay.launches import launch_config_copy
from replayfmt.replay.replayer import Replayer
from replayfmt.replay.steps import Step, StepKind, bracket_with_events

_K = m.OperationKind


@dataclass(frozen=True)
class Region:
    """Operations ``[start, stop)`` of a capture; ``scope`` names it (None: the whole capture)."""

    scope: str | None
    start: int
    stop: int


def find_region(capture: Capture, scope: str | None) -> Region:
    """The first occurrence of scope ``scope`` (outermost when nested), checking that every scope
    marker in the capture is balanced; the whole capture when ``scope`` is None."""
    stack: list[tuple[str, int]] = []
    found: Region | None = None
    open_candidate: int | None = None
    names: list[str] = []
    for op in capture.iter_operations():
        if isinstance(op, m.ScopeBegin):
            stack.append((op.name, op.index))
            if op.name not in names:
                names.append(op.name)
            if op.name == scope and found is None and open_candidate is None:
                open_candidate = len(stack) - 1
        elif isinstance(op, m.ScopeEnd):
            if not stack or stack[-1][0] != op.name:
                opened = f"'{stack[-1][0]}' is open" if stack else "no scope is open"
                raise ReplayError(f"operation {op.index}: scope end '{op.name}' matches no open scope ({opened})")
            name, begin = stack.pop()
            if open_candidate == len(stack):
                found, open_candidate = Region(name, begin + 1, op.index), None
    if stack:
        name, begin = stack[-1]
        raise ReplayError(f"operation {begin}: scope '{name}' is never closed")
    if scope is None:
        return Region(None, 0, capture.operation_count)
    if found is None:
        known = ", ".join(names) or "none"
        raise ReplayUsageError(f"--scope {scope!r}: the capture has no such scope (scopes: {known})")
    return found


@dataclass(frozen=True)
class Stats:
    """Summary of a list of times, in milliseconds."""

    min: float
    median: float
    mean: float
    stddev: float
    p90: float

    @classmethod
    def of(cls, values: list[float]) -> Stats:
        if not values:
            return cls(0.0, 0.0, 0.0, 0.0, 0.0)
        return cls(
            min(values),
            statistics.median(values),
            statistics.fmean(values),
            statistics.stdev(values) if len(values) > 1 else 0.0,
            float(np.percentile(values, 90)),
        )


@dataclass
class KernelTiming:
    operation: int
    name: str
    stream: int
    device_ms: Stats
    original_ns: int | None = None  # the original program's device time (the capture's), if recorded


@dataclass
class BenchmarkResult:
    capture: str
    device: str
    scope: str | None
    operations: tuple[int, int]
    mode: str
    iterations: int
    warmup: int
    flush_l2: bool
    device_ms: Stats
    host_ms: Stats
    kernels: list[KernelTiming] = field(default_factory=list)
    clock: str = kt.EVENTS  # what timed the operations (and the busy time): cupti or events
    clock_note: str = ""  # why CUPTI was not used, when it was asked for and is absent
    busy_ms: Stats | None = None  # region GPU busy time: union of its device work (CUPTI only)
    kernel_busy_ms: Stats | None = None  # the same, over its kernels alone
    original: kt.OriginalSide | None = None  # the original program's times for the region
    released: str = ""  # launches not run nor timed, on either side: "2 XLA autotuner delay kernels released"
    collectives: str = ""  # how the collectives of a capture holding several ranks ran (verbs.with_local_peers)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class BenchmarkOptions:
    scope: str | None = None
    warmup: int = 3
    repetitions: int | None = None  # None: as many as fit in min_time
    min_time: float = 1.0  # seconds of timed iterations, when repetitions is None
    mode: str = "eager"  # or "graph"
    flush_l2: bool = False
    per_kernel: bool = False
    trace: Path | None = None
    clock: str = "auto"  # per-operation and busy times: auto (CUPTI when present), cupti or events


@dataclass(frozen=True)
class RegionSteps:
    """A region's steps, split for timing. ``setup`` runs once, untimed: the operations before the
    region and the region's own starting state (every state step before its first device work,
    wherever the region begins: the whole capture of a kernel-mode recording starts with a scope
    whose state comes first). ``body`` runs every iteration; state steps left in it set the starting
    state of later captured regions inside it, and are applied every iteration but never timed.
    With --nvtx, a scope's own range opens and closes in ``body``, every iteration."""

    setup: list[Step]
    body: list[Step]

    @property
    def inner_state(self) -> list[Step]:
        return [s for s in self.body if s.kind is StepKind.STATE]


def region_steps(steps: list[Step], region: Region, device_operations: list[int]) -> RegionSteps:
    """Split a replay's ``steps`` (capture order) for timing ``region``; ``device_operations``: the
    indices of the region's operations that run on the device."""
    first_work = min((i for i in device_operations if region.start <= i < region.stop), default=region.stop)
    setup: list[Step] = []
    body: list[Step] = []
    # a scope's own NVTX range opens and closes every iteration, around its work (the markers sit
    # just outside the region: set up once, the range would open once and never close)
    nvtx = (StepKind.NVTX_PUSH, StepKind.NVTX_POP)
    marker = {region.start - 1: StepKind.NVTX_PUSH, region.stop: StepKind.NVTX_POP} if region.scope else {}
    tail: list[Step] = []
    for step in steps:
        if step.kind in nvtx and marker.get(step.operation) is step.kind:
            (body if step.kind is StepKind.NVTX_PUSH else tail).append(step)
        elif step.operation < region.start:
            setup.append(step)
        elif step.operation >= region.stop or step.kind is StepKind.CHECKPOINT:
            continue
        elif step.kind is StepKind.STATE and step.operation <= first_work:
            setup.append(step)  # a state step precedes the steps of its own operation
        else:
            body.append(step)
    return RegionSteps(setup, body + tail)


class Benchmark:
    """Times one region of a prepared replay. Owns the snapshots and graph it creates."""

    def __init__(self, replayer: Replayer, region: Region, options: BenchmarkOptions) -> None:
        if options.mode not in ("eager", "graph"):
            raise ReplayUsageError(f"--mode {options.mode!r}: expected eager or graph")
        several = len(replayer.gpus) > 1
        if several and options.mode == "graph":
            raise ReplayUsageError("--mode graph times single-device captures; --mode eager times this one")
        self.r = replayer
        self.cu = replayer.cu
        self.region = region
        self.options = options
        cu = self.cu
        plan = replayer.plan
        steps = replayer.steps
        self.ops = {op.index: op for op in plan.capture.iter_operations(region.start, region.stop)}
        # launches that wait for a host write are not run (replay/host_releases): nothing of theirs is timed
        self.released = {i: w for i, w in plan.host_waits.items() if region.start <= i < region.stop}
        self.timed_ops = [i for i, op in self.ops.items() if op.kind in m.DEVICE_WORK and i not in self.released]
        split = region_steps(steps, region, self.timed_ops)
        self.prefix = split.setup
        body = split.body
        self._inner_state = bool(split.inner_state)
        per_operation = options.per_kernel or options.trace is not None
        # --per-kernel times a CUDA graph's nodes one by one, between CUDA events
        graph_nodes = options.per_kernel and any(op.kind == _K.GRAPH_LAUNCH for op in self.ops.values())
        clock = kt.EVENTS if graph_nodes and options.clock == "auto" else options.clock
        self.clock, self.clock_note = kt.choose_clock(clock, per_operation=per_operation)
        if clock != options.clock:
            self.clock_note = "graph nodes are timed one by one with CUDA events (--per-kernel over CUDA graphs)"
        if self.clock is not None:
            replayer.own(self.clock.activity.stop)
        want_events = (options.per_kernel or options.trace is not None) and self.clock is None
        if several and want_events:  # a CUDA event records only on a stream of its own device
            raise ReplayUsageError("per-operation times of a capture of several devices need CUPTI (--clock cupti)")
        self._events: dict[int, tuple[Any, Any]] = {}
        self._node_events: dict[NodeKey, tuple[Any, Any]] = {}  # (graph launch, node): per-kernel
        if want_events:
            for index in self.timed_ops:
                graph = replayer.graph(index) if options.per_kernel else None
                if graph is not None and graph.calls:  # timed node by node
                    for node in range(len(graph.calls)):
                        self._node_events[(index, node)] = (self._event(), self._event())
                else:
                    self._events[index] = (self._event(), self._event())
        self.body = body
        self.instrumented = self._instrument(body) if want_events else body
        if self.clock is not None:
            self.instrumented = self.clock.instrument(body)
        self._iteration = 0  # CUPTI tags: timed iterations from 1; 0 leaves one untagged
        # the region's starting state
        replayer.execute_steps(self.prefix)
        replayer.synchronize()
        self._globals: ModuleGlobals | None = None  # found at the first launch that may touch them
        self._snapshots = self._snapshot(self._restore_spans(self._touched_buffers()))
        self._flush: tuple[int, int] | None = None
        if options.flush_l2:
            attr = cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE
            l2 = check(cu.cuDeviceGetAttribute(attr, replayer.device), "L2 size")
            size = max(2 * l2, 1 << 20)
            ptr = check(cu.cuMemAlloc(size), "L2 flush buffer")
            replayer.own(lambda: cu.cuMemFree(ptr))
            self._flush = (int(ptr), size)
        self._start, self._end = self._event(), self._event()
        self._graph_exec = self._capture_graph() if options.mode == "graph" else None

    def _event(self) -> Any:
        cu = self.cu
        event = check(cu.cuEventCreate(0), "cuEventCreate")
        self.r.own(lambda: cu.cuEventDestroy(event))
        return event

    def _instrument(self, body: list[Step]) -> list[Step]:
        """Bracket the device work of each timed operation with events on its stream."""
        steps = bracket_with_events(body, self._events, self.r.op_streams, self.cu.cuEventRecord)
        return unroll_graph_launches(steps, self.r, self._node_events, self.cu.cuEventRecord)

    def _touched_buffers(self) -> set[int]:
        if self.r.plan.options.fixed_addresses:
            return set(self.r.plan.buffers)  # raw pointers may reach any buffer
        touched: set[int] = set()
        for op in self.ops.values():
            touched |= self._buffers_of(op)
        return touched

    def _restore_spans(self, buffers: set[int]) -> list[Span]:
        """What of the buffers the region may change it starts from (replayfmt.measure.restore)."""
        plan = self.r.plan
        sizes = {b: plan.buffers[b].size for b in buffers}
        if plan.options.fixed_addresses:
            return [Span(b, 0, max(size, 1)) for b, size in sorted(sizes.items())]
        states: list[m.State] = []
        before = []  # the operations before the region, other than state
        for op in plan.capture.iter_operations():  # one pass over the file
            if isinstance(op, m.State):
                states.append(op)
            elif op.index < self.region.start:
                before.append(op)
        return restore_spans(buffers, sizes, before, states, self._buffers_of)

    def _buffers_of(self, op: m.Operation) -> set[int]:
        """The buffers an operation touches (replayfmt.format.uses): a graph launch's nodes', and
        the module globals its kernels may write unnamed."""
        plan = self.r.plan
        if self._globals is None:
            objects: dict[int, m.ObjectDef] = {**plan.buffers, **plan.globals}
            objects.update((e, image.executable) for e, image in plan.images.items())
            self._globals = ModuleGlobals(plan.buffers, objects.get)
        if isinstance(op, m.GraphLaunch):
            limits = plan.capture.limits
            kernels = {node.executable for *_, node in kernel_nodes(plan.graphs, op.graph, limits)}
            return buffers_used_by_graph(plan.graphs, op.graph, limits) | self._globals.of(kernels)
        used = uses(op)
        return buffers_of(op) | (self._globals.of(used.executables) if used.module_globals else set())

    def _snapshot(self, spans: list[Span]) -> list[tuple[int, int, int]]:
        """Pristine device copies of what the region starts from: (live, pristine, size)."""
        cu = self.cu
        need = sum(s.size for s in spans)
        free, _ = check(cu.cuMemGetInfo(), "cuMemGetInfo")
        if need > free:
            raise ReplayError(
                f"restoring the region's {len({s.buffer for s in spans})} buffers needs {need} bytes of device "
                f"memory for pristine copies; {free} are free"
            )
        out = []
        for span in spans:
            live = self.r.addresses[span.buffer] + span.offset
            ptr = check(cu.cuMemAlloc(span.size), f"pristine copy of buffer {span.buffer}")
            self.r.own(lambda p=ptr: cu.cuMemFree(p))
            check(cu.cuMemcpyDtoD(ptr, live, span.size), f"snapshot of buffer {span.buffer}")
            out.append((live, int(ptr), span.size))
        return out

    def _restore(self, stream: Any) -> None:
        """Enqueue the restore (and L2 flush) on the stream that then records the start event.

        No host synchronisation here on purpose: the device stays busy restoring while Python
        issues the region, so host launch latency never shows up as idle time inside the timing.
        """
        cu = self.cu
        for live, pristine, size in self._snapshots:
            check(cu.cuMemcpyDtoDAsync(live, pristine, size, stream), "restoring the region's buffers")
        if self._flush is not None:
            check(cu.cuMemsetD8Async(self._flush[0], 0, self._flush[1], stream), "flushing the L2 cache")

    def _graph_body(self) -> list[Step]:
        """The region's steps for stream capture: host synchronisations become event edges."""
        cu = self.cu
        r = self.r
        out = []
        for step in self.body:
            if step.kind is StepKind.GRAPH_LAUNCH:
                # stream capture refuses cuGraphLaunch: the captured graph becomes a child node instead
                prepared = r.graph(step.operation)
                if prepared is None:
                    raise ReplayError(f"operation {step.operation}: a graph launch step without its graph")
                what = f"operation {step.operation} (graph launch inside --mode graph)"
                args = (cu, prepared.graph, step.args[1], what)
                out.append(Step(StepKind.GRAPH_LAUNCH, launch_into_capture, args, step.operation))
                continue
            if step.kind is StepKind.STATE:
                raise ReplayUsageError(
                    "--mode graph: the range spans several captured regions, whose starting state is set "
                    "between them; time one of them (--scope)"
                )
            if step.kind is not StepKind.SYNCHRONIZE:
                out.append(step)
                continue
            index = step.operation
            op = self.ops[index]
            source = [r.op_streams[index]] if isinstance(op, m.StreamSynchronize) else list(r.streams.values())
            for stream in source:
                event = check(cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING), "event")
                r.own(lambda e=event: cu.cuEventDestroy(e))
                out.append(Step(StepKind.EVENT_RECORD, cu.cuEventRecord, (event, stream), index))
                out += [
                    Step(StepKind.STREAM_WAIT, cu.cuStreamWaitEvent, (other, event, 0), index)
                    for other in r.streams.values()
                    if other is not stream
                ]
        return out

    def _capture_graph(self) -> Any:
        cu = self.cu
        r = self.r
        # stream capture needs a real stream: the legacy default stream's work moves onto it
        stream = check(cu.cuStreamCreate(1), "capture stream")
        r.own(lambda: cu.cuStreamDestroy(stream))
        legacy = r.streams[0]
        body = [step.with_args(tuple(stream if a is legacy else a for a in step.args)) for step in self._graph_body()]
        # extended launches (clusters, cooperative) carry their stream inside the launch config: left on
        # the legacy stream they would run once, outside the capture, and be missing from the graph.
        # A copy of the config each (configs are shared by launches that agree but for their index, and
        # eager iterations go on launching the originals on the legacy stream).
        moved: dict[int, Any] = {}
        for k, step in enumerate(body):
            config = step.args[0] if step.kind is StepKind.LAUNCH_EX else None
            if config is not None and int(config.hStream) == int(legacy):
                if id(config) not in moved:
                    moved[id(config)] = launch_config_copy(cu, config, stream=stream)
                body[k] = step.with_args((moved[id(config)], *step.args[1:]))
        self._capture_stream = stream
        mode = cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL
        check(cu.cuStreamBeginCapture(stream, mode), "cuStreamBeginCapture")
        fork = self._event()
        try:
            check(cu.cuEventRecord(fork, stream), "capture fork")
            others = [h for h in r.streams.values() if h is not legacy]
            for h in others:
                check(cu.cuStreamWaitEvent(h, fork, 0), "capture fork")
            r.execute_steps(body)
            for h in others:
                join = self._event()
                check(cu.cuEventRecord(join, h), "capture join")
                check(cu.cuStreamWaitEvent(stream, join, 0), "capture join")
        except BaseException:
            cu.cuStreamEndCapture(stream)  # ends the capture; the step's own error is the one to report
            raise
        graph = check(cu.cuStreamEndCapture(stream), "cuStreamEndCapture")
        executable = check(cu.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
        r.own(lambda: cu.cuGraphExecDestroy(executable))
        r.own(lambda: cu.cuGraphDestroy(graph))
        return executable

    def iterate(self, eager: bool = False) -> tuple[float, float, dict[Any, float]]:
        """One iteration: restore, then time the region. (device ms, host ms, per-op device ms);
        per-operation times (keyed by operation, or (graph launch, node) for a CUDA graph's nodes
        with --per-kernel) come from eager iterations only (events inside a graph are not timed)."""
        cu = self.cu
        r = self.r
        graph = self._graph_exec is not None and not eager
        self._restore(self._capture_stream if graph else r.streams[0])
        if self._inner_state:
            r.state.begin()
        if self.clock is not None and self._iteration:
            self.clock.begin(self._iteration)
        host_start = time.perf_counter()
        if graph:
            stream = self._capture_stream
            check(cu.cuEventRecord(self._start, stream), "cuEventRecord")
            check(cu.cuGraphLaunch(self._graph_exec, stream), "cuGraphLaunch")
            check(cu.cuEventRecord(self._end, stream), "cuEventRecord")
        else:
            r.fork(self._start)
            r.execute_steps(self.instrumented)
            r.join(self._end)
        r.synchronize()
        host_ms = 1e3 * (time.perf_counter() - host_start)
        if self.clock is not None:
            self.clock.end()
        device_ms = check(cu.cuEventElapsedTime(self._start, self._end), "cuEventElapsedTime")
        if self._inner_state and not graph:
            device_ms -= r.state.elapsed_ms()  # starting state set inside the region is not its work
        if graph:
            return device_ms, host_ms, {}
        per_op: dict[Any, float] = {}
        for key, (a, b) in [*self._events.items(), *self._node_events.items()]:
            per_op[key] = check(cu.cuEventElapsedTime(a, b), "cuEventElapsedTime")
        return device_ms, host_ms, per_op

    def trace_events(self) -> list[dict[str, Any]]:
        """Chrome/Perfetto trace events of the last iteration (needs per-operation events)."""
        cu = self.cu
        events = []
        for index, (a, b) in sorted(self._events.items()):
            start = check(cu.cuEventElapsedTime(self._start, a), "trace")
            duration = check(cu.cuEventElapsedTime(a, b), "trace")
            op = self.ops[index]
            name = demangle(self.r.kernel_name(index) or op.kind.label)
            events.append(
                {
                    "name": name,
                    "cat": op.kind.label,
                    "ph": "X",
                    "ts": round(start * 1e3, 3),
                    "dur": round(duration * 1e3, 3),
                    "pid": 1,
                    "tid": getattr(op, "stream", 0),
                    "args": {"operation": index},
                }
            )
        return events

    def run(self, progress: Callable[[int, int | None, float], None] | None = None) -> BenchmarkResult:
        options = self.options
        for _ in range(options.warmup):
            self.iterate()
        device, host = [], []
        per_op: dict[Any, list[float]] = {i: [] for i in [*self._events, *self._node_events]}
        started = time.perf_counter()
        while True:
            self._iteration = len(device) + 1
            d, h, ops = self.iterate()
            device.append(d)
            host.append(h)
            for i, v in ops.items():
                per_op[i].append(v)
            elapsed = time.perf_counter() - started
            if progress is not None:
                progress(len(device), options.repetitions, elapsed)
            if options.repetitions is not None:
                if len(device) >= options.repetitions:
                    break
            elif elapsed >= options.min_time and len(device) >= 3:
                break
        graph_iterations = len(device) if self._graph_exec is not None else 0
        if self._graph_exec is not None and (self._events or self._node_events or (self.clock and options.per_kernel)):
            for k in range(min(len(device), 50)):  # per-operation times: eager iterations
                self._iteration = graph_iterations + k + 1
                for i, v in self.iterate(eager=True)[2].items():
                    per_op[i].append(v)
        self._iteration = 0
        busy, kernel_busy = self._cupti_times(per_op, len(device)) if self.clock is not None else (None, None)
        if options.trace is not None:
            events = kt.trace_events(self.clock.iterations, self._names()) if self.clock else self.trace_events()
            trace = {"traceEvents": events, "displayTimeUnit": "ms"}
            options.trace.write_text(json.dumps(trace))
        original = kt.original_side(
            self.r.plan.capture.original_times(), self.region.start, self.region.stop, self.timed_ops, self.released
        )
        kernels = []
        for key, values in sorted(per_op.items(), key=lambda kv: kv[0] if isinstance(kv[0], tuple) else (kv[0], -1)):
            if isinstance(key, tuple):  # a CUDA graph's node
                index, name, first = key[0], node_name(self.r, key), None
            else:
                index, name = key, self.r.kernel_name(key) or self.ops[key].kind.label
                first = original.operations.get(key) if original else None
            kernels.append(KernelTiming(index, name, getattr(self.ops[index], "stream", 0), Stats.of(values), first))
        return BenchmarkResult(
            capture=self.r.plan.capture.path,
            device=self.r.device_name,
            scope=self.region.scope,
            operations=(self.region.start, self.region.stop),
            mode=options.mode,
            iterations=len(device),
            warmup=options.warmup,
            flush_l2=options.flush_l2,
            device_ms=Stats.of(device),
            host_ms=Stats.of(host),
            kernels=kernels,
            clock=kt.CUPTI if self.clock is not None else kt.EVENTS,
            clock_note=self.clock_note,
            busy_ms=busy,
            kernel_busy_ms=kernel_busy,
            original=original,
            released=released_counts(list(self.released.values())),
        )

    def _names(self) -> dict[int, tuple[str, str, int]]:
        """(name, kind label, stream) of each timed operation, for traces."""
        return {
            i: (
                self.r.kernel_name(i) or self.ops[i].kind.label,
                self.ops[i].kind.label,
                getattr(self.ops[i], "stream", 0),
            )
            for i in self.timed_ops
        }

    def _cupti_times(self, per_op: dict[int, list[float]], timed: int) -> tuple[Stats, Stats]:
        """Busy times of the timed iterations (all work, kernels alone); per-operation times (ms)."""
        clock = self.clock
        assert clock is not None
        clock.stop()
        iterations = clock.iterations
        if clock.per_operation:
            per_op.update({i: [] for i in self.timed_ops})
            for n, entry in iterations.items():
                if self._graph_exec is None or n > timed:  # graph iterations do not tag operations
                    for i, (start, end) in entry.operations.items():
                        per_op.setdefault(i, []).append((end - start) / 1e6)
        timed_entries = [iterations[n] for n in range(1, timed + 1) if n in iterations]
        return Stats.of([e.busy_ns / 1e6 for e in timed_entries]), Stats.of(
            [e.kernel_busy_ns / 1e6 for e in timed_entries]
        )
