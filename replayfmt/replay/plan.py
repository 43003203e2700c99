"""A replay plan: everything about a capture that can be decided without a GPU.

``build_plan`` reads a capture once, checks that every operation can be reproduced (strict: an
unsupported or unknown operation, a dangling id, an out-of-range copy, a missing or changed file,
an executable substitution with another ABI, an invalid launch override are all refused here,
before anything runs) and gathers what the executor needs. ``run-replay --dry-run`` stops after
this step, so CI can exercise all of it without a GPU.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np

from replayfmt.container.batches import collector_paused
from replayfmt.container.files import ResolvedFile, resolve_file
from replayfmt.errors import (
    AbiMismatchError,
    FileMismatchError,
    ReplayError,
    ReplayFormatError,
    ReplayUsageError,
    UnsupportedOperationError,
)
from replayfmt.format import model as m
from replayfmt.format.host_waits import released_counts
from replayfmt.format.names import demangle
from replayfmt.format.object_columns import EventTable
from replayfmt.reader import Capture, EventUses
from replayfmt.replay.executables import ExecutableImage, ExecutableSources, plan_executables
from replayfmt.replay.graph_plan import GraphSize, check_graph, graph_references
from replayfmt.replay.host_releases import host_released
from replayfmt.replay.plan_checks import (
    QUICK_CHECKS,
    FrameChecks,
    LiveObjects,
    check_data_relocations,
    check_flags,
    check_global_symbol,
    check_graph_lifetimes,
    check_object_payloads,
    check_range,
    device_work_problem,
    event_uses_pass,
    need,
    payloads_of,
    plan_warnings,
    repeat_key,
    unfolded,
)
from replayfmt.replay.plan_options import (
    MAX_BLOCK,
    MAX_GRID,
    MAX_SHARED_MEMORY,
    MAX_THREADS_PER_BLOCK,
    LaunchOverride,
    PlanOptions,
    captured_file_range,
    check_substitutions,
    launch_shape,
)
from replayfmt.replay.plan_scan import EVENT_OPERATIONS, EventSpans, RegionTracker

_K = m.OperationKind


# ------------------------------------------------------------------------------------------
# The plan

UploadKey = tuple[str, int, int]


def upload_key(op: m.Copy) -> UploadKey:
    """What a host-to-device copy reads: a payload, or a file from an offset (staged once each);
    bytes holding stored pointers (1.3) are staged apart for each operation, relocated once."""
    if op.relocations:
        return ("relocated", op.index, op.payload)
    return ("file", op.src_file, op.src_offset) if op.src_file else ("payload", op.payload, 0)


@dataclass
class Plan:
    capture: Capture
    options: PlanOptions
    devices: list[m.Device] = field(default_factory=list)
    streams: dict[int, m.Stream] = field(default_factory=dict)
    events: EventTable = field(default_factory=EventTable.empty)  # as columns (a program may make 200k)
    buffers: dict[int, m.Buffer] = field(default_factory=dict)
    globals: dict[int, m.Global] = field(default_factory=dict)
    images: dict[int, ExecutableImage] = field(default_factory=dict)
    files: dict[int, ResolvedFile] = field(default_factory=dict)
    overrides: dict[int, LaunchOverride] = field(default_factory=dict)
    host_waits: dict[int, str] = field(default_factory=dict)  # launches skipped: waits for the host (host_releases)
    operation_counts: dict[str, int] = field(default_factory=dict)
    launches_of: dict[tuple[int, int], int] = field(default_factory=dict)  # (exe, fn) -> launch count
    max_shared_memory: dict[tuple[int, int], int] = field(default_factory=dict)
    max_block_threads: dict[tuple[int, int], int] = field(default_factory=dict)
    max_cluster_blocks: dict[tuple[int, int], int] = field(default_factory=dict)  # blocks per cluster
    problems: list[str] = field(default_factory=list)  # collected under --continue-on-error
    warnings: list[str] = field(default_factory=list)  # what the replay goes on without (a dropped TIMINGS chunk)
    uploads: dict[UploadKey, tuple[m.Copy, int]] = field(default_factory=dict)  # first copy of each source, bytes
    needs_fixed_addresses: bool = False
    programmatic: bool = False  # (1.7) a launch or a graph edge is programmatic (see replay.launches)
    # the replay writes device addresses into memory: pointers stored in uploads and state (1.3)
    # or written by launches into buffers (relocation sites), so integers there are no data to poison
    stores_pointers: bool = False
    # starting state, hoisted: operation index a region begins at -> the state to apply before it,
    # as host-to-device copies (stream 0) that are staged like uploads but are not the program's work
    state: dict[int, list[m.Copy]] = field(default_factory=dict)
    # (1.6) the state operations flagged STATE_FLAG_UNDEFINED (their copies' index): ranges that held
    # none of the program's data when their region began, which verification may poison whatever their type
    undefined_state: set[int] = field(default_factory=set)
    graphs: dict[int, m.Graph] = field(default_factory=dict)  # launched graphs (and their children), checked
    # checkpoint operation index -> where its region begins (the key of its region's state)
    checkpoint_regions: dict[int, int] = field(default_factory=dict)
    graph_sizes: dict[int, GraphSize] = field(default_factory=dict)  # each checked graph, expanded
    graph_uses: dict[int, set[int]] = field(default_factory=dict)  # each launched graph's objects (its children's too)
    # event id -> [first, last, first is a record]: the operations that record, wait on or
    # synchronise with it (events first recorded whose spans do not overlap share a CUDA event)
    event_spans: EventSpans = field(default_factory=EventSpans)
    # (payloads, logical bytes) read and checked against their hashes (options.verify_payloads)
    payloads_verified: tuple[int, int] | None = None

    @property
    def state_bytes(self) -> int:
        return sum(c.size for copies in self.state.values() for c in copies)

    @property
    def buffer_bytes(self) -> int:
        return sum(b.size for b in self.buffers.values())

    def function(self, executable: int, index: int) -> m.Function:
        return self.images[executable].executable.functions[index]

    def module_global(self, buffer: m.Buffer) -> m.Global | None:
        """The global whose storage ``buffer`` is (format 1.4), when the replay loads it; None
        for an allocation, or for one the plan refused (it is then allocated like one)."""
        glob = self.globals.get(buffer.module_global) if buffer.module_global else None
        return glob if glob is not None and glob.executable in self.images and buffer.size <= glob.size else None

    def describe(self) -> list[str]:
        """Human-readable lines: what the replay will do."""
        lines = [
            f"capture       {self.capture.path}",
            f"devices       {len(self.devices)} captured: "
            + ", ".join(
                f"#{d.id} {d.name or '?'} sm_{d.compute_capability[0]}{d.compute_capability[1]}" for d in self.devices
            ),
            f"buffers       {len(self.buffers)}, {self.buffer_bytes} bytes"
            + (" at fixed addresses" if self.options.fixed_addresses else ""),
            f"streams       {len(self.streams)}   events {len(self.events)}",
            "operations    " + ", ".join(f"{k} {v}" for k, v in sorted(self.operation_counts.items())),
        ]
        for eid, image in sorted(self.images.items()):
            names = ", ".join(demangle(fn.name) for fn in image.executable.functions)
            abi = "ABI checked from cubin metadata" if image.abi_checked else "ABI checked at load"
            lines.append(f"executable    #{eid} {image.format.name.lower()} from {image.source} ({abi}): {names}")
        for fid, resolved in sorted(self.files.items()):
            where = resolved.path or "stored in the capture"
            lines.append(f"file          #{fid} {resolved.reference.path} -> {where}")
        if self.state:
            ranges = sum(len(c) for c in self.state.values())
            lines.append(
                f"state         {ranges} range(s), {self.state_bytes} bytes, in {len(self.state)} region(s): "
                "applied before each region begins, outside any timing"
            )
        if self.host_waits:
            released = released_counts(list(self.host_waits.values()))
            lines.append(f"host waits    {released}: not run (each waits for a host write no replay makes)")
        if self.payloads_verified is not None:
            count, size = self.payloads_verified
            lines.append(f"payloads      {count} used, {size} bytes read and checked against their hashes")
        for op, o in sorted(self.overrides.items()):
            if o.skip:
                lines.append(f"override      operation {op}: skipped (not run; its results are left as they start)")
            else:
                lines.append(f"override      operation {op}: grid={o.grid} block={o.block} smem={o.shared_memory}")
        return lines


class _Checker:
    """Collects problems; raises the first at once unless --continue-on-error."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan

    def fail(self, error: ReplayError) -> None:
        if not self.plan.options.continue_on_error:
            raise error
        self.plan.problems.append(str(error))


def build_plan(capture: Capture, options: PlanOptions = PlanOptions()) -> Plan:
    """Read and check the whole capture; raise the first problem (or collect them all)."""
    # with Python's cyclic collector paused: the plan keeps a record or two per event and makes
    # no cycles, and the full passes the collector makes over a heap of 200k decoded objects
    # would cost 0.1 to 0.5 s of a 0.7 s plan (see container.batches)
    with collector_paused():
        return _build_plan(capture, options)


def _build_plan(capture: Capture, options: PlanOptions) -> Plan:
    check_substitutions(list(options.substitutions))
    plan = Plan(capture, options)
    checker = _Checker(plan)
    objects = capture.object_table()  # its events as columns: a program may make 200k
    plan.events = objects.events
    executables: dict[int, m.Executable] = {}
    for obj in objects.others.values():
        if isinstance(obj, m.Executable):
            executables[obj.id] = obj
        elif isinstance(obj, m.Device):
            plan.devices.append(obj)
        elif isinstance(obj, m.Stream):
            plan.streams[obj.id] = obj
        elif isinstance(obj, m.Buffer):
            plan.buffers[obj.id] = obj
            plan.needs_fixed_addresses |= obj.requires_fixed_address
        elif isinstance(obj, m.Global):
            plan.globals[obj.id] = obj
        elif isinstance(obj, m.FileReference):
            try:
                plan.files[obj.id] = resolve_file(obj, options.remaps)
            except ReplayError as exc:
                checker.fail(exc)
        elif isinstance(obj, m.UnknownObject):
            checker.fail(
                UnsupportedOperationError(
                    f"object {obj.id} has kind {obj.type_code}, unknown to this replayfmt: upgrade replayfmt"
                )
            )
    if capture.partial:
        checker.fail(
            UnsupportedOperationError(
                f"the capture is partial: it stopped before its program did ({capture.partial}); capture again"
            )
        )
    if plan.needs_fixed_addresses and not options.fixed_addresses:
        checker.fail(
            UnsupportedOperationError(
                "the capture has buffers whose pointers cannot all be relocated (requires_fixed_address): "
                "replay it with --fixed-addresses"
            )
        )
    overrides = {o.operation: o for o in options.launch_overrides}
    if len(overrides) != len(options.launch_overrides):
        raise ReplayUsageError("--launch: an operation is overridden twice")
    kinds: dict[m.OperationKind | int, int] = {}
    regions = RegionTracker()
    live = LiveObjects(objects)  # what each operation may use: nothing after its DestroyObject
    frames = FrameChecks(capture, verify=options.verify_payloads)
    passed: set[tuple[object, ...]] = set()  # repeat_key of what was checked already (all but the index)
    # operations equal but for their index come folded (the reader's distinct_operations): checked once
    for op, n in _bulk_checked(unfolded(capture, bool(overrides)), plan, live, regions, kinds):
        cls = type(op)
        kind = op.kind if not isinstance(op, m.UnknownOperation) else -1
        kinds[kind] = kinds.get(kind, 0) + n
        if cls in EVENT_OPERATIONS:  # never folded: each use extends its event's span
            plan.event_spans.add(op)
        quick = QUICK_CHECKS.get(cls)  # creates, events, synchronisations: one lookup or two (the hot path)
        if quick is not None and quick(live, op) and op.index not in overrides:
            regions.note(op.index)
            continue
        key = repeat_key(op) if op.index not in overrides else None
        if key is not None and key in passed:  # a repeat: the same checks, the same outcome (the hot path)
            regions.step(op)
            if kind == _K.LAUNCH:
                plan.launches_of[(op.executable, op.function)] += n
            continue
        hoist = regions.step(op)
        try:
            if isinstance(op, m.State):
                _plan_state(plan, live, op, hoist)
                frames.check(op, op.payload)  # the starting state the replay uploads
            elif isinstance(op, m.DestroyObject):
                live.destroy(op)
                passed.clear()  # what passed before may use what is gone now
            else:
                if isinstance(op, m.Checkpoint):
                    plan.checkpoint_regions[op.index] = hoist
                _check_operation(plan, live, op, overrides.pop(op.index, None))
                if n > 1 and kind == _K.LAUNCH:
                    plan.launches_of[(op.executable, op.function)] += n - 1
                for payload in payloads_of(op):
                    frames.check(op, payload)
                if key is not None:
                    passed.add(key)
        except ReplayError as exc:
            checker.fail(exc)
    counts = {(k.label if k != -1 else "unknown"): n for k, n in kinds.items()}  # type: ignore[union-attr]
    nothing = device_work_problem(capture, counts)
    if nothing:  # the whole capture's verdict, not one operation's: listed, whatever --continue-on-error
        plan.problems.append(nothing)
    plan.warnings = plan_warnings(capture)
    for op_index in overrides:
        checker.fail(ReplayUsageError(f"--launch {op_index}: operation {op_index} is not in the capture"))
    plan.operation_counts = counts
    launched: dict[int, set[int]] = {}
    for eid, index in plan.launches_of:
        launched.setdefault(eid, set()).add(index)
    check_object_payloads(capture, objects.others, frames, checker.fail)
    plan.payloads_verified = (len(frames.checked), frames.verified_bytes) if frames.verify else None
    plan.images = plan_executables(
        ExecutableSources(capture, options, plan.devices, plan.files), objects, executables, checker.fail, launched
    )
    plan.host_waits = host_released(capture, objects, plan.buffers, plan.launches_of)
    for gid, glob in plan.globals.items():
        image = plan.images.get(glob.executable)
        if image is not None:
            check_global_symbol(gid, glob, image.cubin, image.source, checker.fail)
    for (eid, fn), threads in plan.max_block_threads.items():
        _check_function_limits(plan, eid, fn, threads, checker)
    for bid, buffer in plan.buffers.items():
        if buffer.module_global:
            _check_module_global(plan, objects, bid, buffer, checker)
    return plan


def _bulk_checked(
    items: Iterator[tuple[m.Operation | EventUses, int]],
    plan: Plan,
    live: LiveObjects,
    regions: RegionTracker,
    kinds: dict[m.OperationKind | int, int],
) -> Iterator[tuple[m.Operation, int]]:
    """``items`` with each batch's uses of events checked, counted and tracked in bulk; a batch
    whose uses do not all pass comes one use at a time, each in its place in capture order among
    the batch's other operations, for the general path to name the first that fails."""
    apart: deque[m.Operation] = deque()  # a failing batch's uses, waiting for their places
    for item, n in items:
        while apart and apart[0].index < item.index:
            yield apart.popleft(), 1
        if type(item) is not EventUses:
            yield item, n  # type: ignore[misc]
        elif event_uses_pass(live, item):
            for code, count in zip(*np.unique(item.kinds, return_counts=True), strict=True):
                kind = m.OperationKind(int(code))
                kinds[kind] = kinds.get(kind, 0) + int(count)
            plan.event_spans.add_uses(item)
            regions.note(item.index)
        else:
            apart.extend(item.operations())
    yield from ((use, 1) for use in apart)


def _check_module_global(
    plan: Plan, objects: Mapping[int, m.ObjectDef], bid: int, buffer: m.Buffer, checker: _Checker
) -> None:
    """A module global's storage must name a Global of an executable the replay loads, and fit it."""
    glob = objects.get(buffer.module_global)
    if not isinstance(glob, m.Global):
        what = f"a {glob.kind.label}" if glob is not None else "no object"
        checker.fail(
            ReplayFormatError(f"buffer {bid}: its module global {buffer.module_global} is {what}, not a global")
        )
    elif glob.executable not in plan.images:
        checker.fail(
            ReplayFormatError(
                f"buffer {bid}: global {buffer.module_global} ({glob.symbol}) names executable {glob.executable}, "
                "which is not in the capture"
            )
        )
    elif buffer.size > glob.size:
        checker.fail(
            ReplayFormatError(
                f"buffer {bid}: {buffer.size} bytes, larger than its global {buffer.module_global} "
                f"({glob.symbol}, {glob.size} bytes)"
            )
        )


def _plan_state(plan: Plan, objects: Mapping[int, m.ObjectDef], op: m.State, hoist: int) -> None:
    """Check a state operation and schedule it before its region begins."""
    buffer = need(objects, op.buffer, m.Buffer, op, "buffer")
    check_range(op, buffer, op.offset, op.size, "state")
    if not 1 <= op.payload <= plan.capture.payload_count or plan.capture.payload(op.payload).size < op.size:
        raise ReplayFormatError(f"operation {op.index} (state): payload {op.payload} is missing or too small")
    check_data_relocations(objects, op, op.relocations, op.offset, op.size)
    check_flags(op, op.flags, m.STATE_FLAG_UNDEFINED, "state")
    if op.undefined:
        plan.undefined_state.add(op.index)
    plan.stores_pointers |= bool(op.relocations)
    copy = m.Copy(
        op.index, _K.COPY_HOST_TO_DEVICE, 0, 0, op.buffer, op.payload, 0, 0, 0, op.offset, op.size, op.relocations
    )
    plan.state.setdefault(hoist, []).append(copy)
    key = upload_key(copy)
    if key not in plan.uploads:
        plan.uploads[key] = (copy, plan.capture.payload(op.payload).size)


def collective_upload(op: m.Collective) -> m.Copy:
    """What a collective replayed without its peers does: its received bytes put in place on its
    stream, as an upload of payload ``received`` (staged like one)."""
    kind, size = _K.COPY_HOST_TO_DEVICE, op.recv_size
    return m.Copy(op.index, kind, op.stream, 0, op.recv_buffer, op.received, 0, 0, 0, op.recv_offset, size)


def _check_collective(plan: Plan, objects: Mapping[int, m.ObjectDef], op: m.Collective) -> None:
    if op.operation == m.CollectiveOperation.UNKNOWN or not op.element_size:
        raise UnsupportedOperationError(
            f"operation {op.index} (collective): operation {int(op.operation)} with data type {op.datatype} "
            "is unknown to this replayfmt: upgrade"
        )
    if not 0 <= op.rank < op.ranks:
        raise ReplayFormatError(f"operation {op.index} (collective): rank {op.rank} of a communicator of {op.ranks}")
    for buffer_id, offset, size, role in (
        (op.send_buffer, op.send_offset, op.send_size, "send"),
        (op.recv_buffer, op.recv_offset, op.recv_size, "receive"),
    ):
        if size:
            check_range(op, need(objects, buffer_id, m.Buffer, op, f"{role} buffer"), offset, size, role)
    if op.recv_size:
        if not 1 <= op.received <= plan.capture.payload_count or plan.capture.payload(op.received).size < op.recv_size:
            raise ReplayFormatError(
                f"operation {op.index} (collective): payload {op.received} (its received bytes) is missing or too small"
            )
        copy = collective_upload(op)
        key = upload_key(copy)
        if key not in plan.uploads:
            plan.uploads[key] = (copy, plan.capture.payload(op.received).size)


def _check_operation(
    plan: Plan, objects: Mapping[int, m.ObjectDef], op: m.Operation, override: LaunchOverride | None
) -> None:
    if override is not None and not isinstance(op, m.Launch):
        raise ReplayUsageError(f"--launch {op.index}: operation {op.index} is a {op.kind.label}, not a launch")
    if isinstance(op, m.Unsupported):
        raise UnsupportedOperationError(
            f"operation {op.index}: {op.call} cannot be replayed ({op.reason}); replay is strict: "
            "recapture without it, or replay a range that excludes it"
        )
    if isinstance(op, m.UnknownOperation):
        raise UnsupportedOperationError(f"operation {op.index} has kind {op.code}, unknown to this replayfmt: upgrade")
    if isinstance(op, m.CreateObject):  # the quick check found no such object
        raise ReplayFormatError(f"operation {op.index} (create): object {op.object} does not exist")
    stream = getattr(op, "stream", 0)
    if stream and not isinstance(op, m.Unsupported):
        need(objects, stream, m.Stream, op, "stream")
    if isinstance(op, m.Launch):
        exe = need(objects, op.executable, m.Executable, op, "executable")
        if not 0 <= op.function < len(exe.functions):
            raise ReplayFormatError(
                f"operation {op.index} (launch): function {op.function} of executable {exe.id} does not exist"
            )
        fn = exe.functions[op.function]
        check_flags(op, op.flags, m.LAUNCH_FLAGS_KNOWN, "launch")
        plan.programmatic |= bool(op.flags & m.LAUNCH_FLAG_PROGRAMMATIC)
        shape = launch_shape(op, override)
        if override is not None:  # kept as the whole shape it gives (what describe prints)
            plan.overrides[op.index] = dataclasses.replace(
                override, grid=shape.grid, block=shape.block, shared_memory=shape.shared_memory
            )
        if shape.shared_memory + fn.static_shared_memory > MAX_SHARED_MEMORY:
            raise UnsupportedOperationError(
                f"operation {op.index} ({fn.name}): {shape.shared_memory} bytes of dynamic shared memory"
                + (f" and {fn.static_shared_memory} static" if fn.static_shared_memory else "")
                + f", over the {MAX_SHARED_MEMORY} any CUDA device gives a block"
            )
        for d, (g, limit) in enumerate(zip(shape.grid, MAX_GRID)):
            if not 1 <= g <= limit:
                raise UnsupportedOperationError(
                    f"operation {op.index} ({fn.name}): grid dimension {d} is {g}, outside [1, {limit}]"
                )
        for d, (b, limit) in enumerate(zip(shape.block, MAX_BLOCK)):
            if not 1 <= b <= limit:
                raise UnsupportedOperationError(
                    f"operation {op.index} ({fn.name}): block dimension {d} is {b}, outside [1, {limit}]"
                )
        key = (op.executable, op.function)
        plan.launches_of[key] = plan.launches_of.get(key, 0) + 1
        plan.max_shared_memory[key] = max(plan.max_shared_memory.get(key, 0), shape.shared_memory)
        plan.max_block_threads[key] = max(plan.max_block_threads.get(key, 0), shape.threads_per_block)
        cluster = max(1, op.cluster[0]) * max(1, op.cluster[1]) * max(1, op.cluster[2])
        plan.max_cluster_blocks[key] = max(plan.max_cluster_blocks.get(key, 1), cluster)
        if fn.parameters_known and fn.parameters:
            end = max(p.offset + p.size for p in fn.parameters)
            if len(op.parameters) < end:
                raise AbiMismatchError(
                    f"operation {op.index} ({fn.name}): {len(op.parameters)} parameter bytes, the layout needs {end}"
                )
        for r in op.relocations:
            target = need(objects, r.target_buffer, m.Buffer, op, "relocation target")
            if r.target_offset > target.size:
                raise ReplayFormatError(
                    f"operation {op.index} ({fn.name}): relocation points past the end of buffer {target.id}"
                )
            if r.site_buffer:
                plan.stores_pointers = True
                site = need(objects, r.site_buffer, m.Buffer, op, "relocation site")
                check_range(op, site, r.site_offset, 8, "relocation site")
            elif r.site_offset + (128 if r.kind == m.RelocationKind.TENSOR_MAP else 8) > len(op.parameters):
                raise ReplayFormatError(
                    f"operation {op.index} ({fn.name}): relocation at parameter offset {r.site_offset} "
                    f"lies outside its {len(op.parameters)} parameter bytes"
                )
    elif isinstance(op, m.Copy):
        if op.kind == _K.COPY_HOST_TO_DEVICE:
            dst = need(objects, op.dst_buffer, m.Buffer, op, "destination")
            check_range(op, dst, op.dst_offset, op.size, "destination")
            check_data_relocations(objects, op, op.relocations, op.dst_offset, op.size)
            plan.stores_pointers |= bool(op.relocations)
            if op.src_file:
                resolved = plan.files.get(op.src_file)
                need(objects, op.src_file, m.FileReference, op, "source file")
                if (
                    resolved is not None
                    and resolved.path is None
                    and resolved.reference.policy == m.FilePolicy.CAPTURE_RANGES
                    and captured_file_range(resolved.reference, op.src_offset, op.size) is None
                ):
                    end = op.src_offset + op.size
                    raise FileMismatchError(
                        f"operation {op.index}: file bytes [{op.src_offset}, {end}) of {resolved.reference.path} "
                        "were not captured (policy capture-ranges) and the file is not here: give it with --file-remap"
                    )
            elif not 1 <= op.payload <= plan.capture.payload_count or plan.capture.payload(op.payload).size < op.size:
                raise ReplayFormatError(
                    f"operation {op.index} (copy_h2d): payload {op.payload} is missing or too small"
                )
            key = upload_key(op)
            if key not in plan.uploads:
                plan.uploads[key] = (op, op.size if op.src_file else plan.capture.payload(op.payload).size)
        elif op.kind == _K.COPY_DEVICE_TO_HOST:
            src = need(objects, op.src_buffer, m.Buffer, op, "source")
            check_range(op, src, op.src_offset, op.size, "source")
        else:
            src = need(objects, op.src_buffer, m.Buffer, op, "source")
            dst = need(objects, op.dst_buffer, m.Buffer, op, "destination")
            check_range(op, src, op.src_offset, op.size, "source")
            check_range(op, dst, op.dst_offset, op.size, "destination")
    elif isinstance(op, m.Memset):
        if op.element_size not in (1, 2, 4):  # cuMemsetD8, D16 and D32: there is no other
            raise ReplayFormatError(
                f"operation {op.index} (memset): element size {op.element_size}; a memset sets 1, 2 or 4 bytes"
            )
        buf = need(objects, op.buffer, m.Buffer, op, "buffer")
        check_range(op, buf, op.offset, op.count * op.element_size, "memset")
    elif isinstance(op, m.Checkpoint):
        for e in op.entries:
            buf = need(objects, e.buffer, m.Buffer, op, "checkpoint buffer")
            check_range(op, buf, e.offset, e.size, "checkpoint")
            if not 1 <= e.payload <= plan.capture.payload_count:
                raise ReplayFormatError(f"operation {op.index} (checkpoint): payload {e.payload} does not exist")
        problem = m.typed_tensor_problem(op.entries, op.types)
        if problem is not None:
            raise ReplayFormatError(f"operation {op.index} (checkpoint): {problem}")
    elif isinstance(op, m.Collective):
        _check_collective(plan, objects, op)
    elif isinstance(op, m.EventRecord | m.EventSynchronize | m.StreamWaitEvent):
        need(objects, op.event, m.Event, op, "event")
    elif isinstance(op, m.ModuleLoad):
        need(objects, op.executable, m.Executable, op, "executable")
    elif isinstance(op, m.GraphLaunch):
        graph = need(objects, op.graph, m.Graph, op, "graph")
        plan.programmatic |= check_graph(
            plan.graphs,
            objects,
            graph,
            lambda launch: _check_operation(plan, objects, launch, None),
            op.index,
            limits=plan.capture.limits,
            sizes=plan.graph_sizes,
        ).programmatic
        if isinstance(objects, LiveObjects):
            used = plan.graph_uses.get(graph.id)
            if used is None:  # walked once per graph: a graph relaunched 20k times is not walked 20k times
                used = plan.graph_uses[graph.id] = graph_references(plan.graphs, graph.id, plan.capture.limits)
            check_graph_lifetimes(objects, op, used)


def _check_function_limits(plan: Plan, eid: int, index: int, threads: int, checker: _Checker) -> None:
    """Launch shapes (overrides included) must fit the function's captured or cubin limits."""
    image = plan.images.get(eid)
    if image is None:
        return
    fn = image.executable.functions[index]
    limit = fn.max_threads_per_block or MAX_THREADS_PER_BLOCK
    if image.cubin is not None and fn.name in image.cubin.kernels and image.cubin.kernels[fn.name].max_threads:
        bounds = image.cubin.kernels[fn.name].max_threads
        limit = min(limit, bounds[0] * bounds[1] * bounds[2])
    if threads > limit:
        checker.fail(
            UnsupportedOperationError(
                f"executable {eid}: {fn.name} is launched with {threads} threads per block, over its limit of {limit}"
            )
        )
    smem = plan.max_shared_memory.get((eid, index), 0)
    if fn.max_dynamic_shared_memory and smem > fn.max_dynamic_shared_memory:
        checker.fail(
            UnsupportedOperationError(
                f"executable {eid}: {fn.name} is launched with {smem} bytes of dynamic shared memory, over the "
                f"{fn.max_dynamic_shared_memory} it allows"
            )
        )
