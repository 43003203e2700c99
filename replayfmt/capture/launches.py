"""Kernel launches in the translator: which parameter words are pointers into the program's
allocations (relocations), and each launch written with the starting state of what it reaches.

* region mode: a launch in the open region touches every allocation its parameters point into,
  the module globals a replay must restore and what their stored pointers reach, and is written;
  a launch that repeats the one before it on the same buffers is armed for the C ring
  (:mod:`repeat_events`); an NCCL kernel is a collective (:mod:`collective_events`);
* kernel mode: each selected launch becomes a scope holding its starting state, the launch and a
  checkpoint of what it changed. Snapshots synchronise only the launching stream.
"""

from __future__ import annotations

import re
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from replayfmt.capture import events as ev
from replayfmt.capture.allocations import POINTER_HIGH
from replayfmt.capture.host_releases import host_released
from replayfmt.capture.nccl_log import NCCL_KERNEL
from replayfmt.capture.options import CaptureMode
from replayfmt.capture.parameter_words import (
    ParameterPointers,
    maybe_data,
    not_a_struct_pointer,
    start_is_pointer,
    struct_words,
)
from replayfmt.format import model as m
from replayfmt.format.names import matches_kernel

if TYPE_CHECKING:
    from replayfmt.capture.allocations import Allocation, AllocationTable
    from replayfmt.capture.buffers import BufferObjects
    from replayfmt.capture.checkpoints import Checkpoints
    from replayfmt.capture.labels import KernelAnnotations
    from replayfmt.capture.modules import Modules
    from replayfmt.capture.options import RecordOptions
    from replayfmt.capture.regions import Region
    from replayfmt.capture.repeat_events import LaunchRepeats
    from replayfmt.capture.report import KernelStats, Report
    from replayfmt.capture.starting_state import StartingState
    from replayfmt.capture.stream_events import Streams
    from replayfmt.writer import CaptureWriter


@dataclass(slots=True)
class KernelShape:
    """What every launch of one kernel shares, worked out at its first launch."""

    stats: KernelStats
    collective: bool  # an NCCL kernel: never reproducible alone
    tensor_maps: frozenset[int]  # offsets of its tensor-map parameters
    struct_words: frozenset[int]  # offsets of the 8-byte words inside parameters larger than a pointer
    words: struct.Struct  # its parameter block as 8-byte words
    layout: tuple[tuple[int, int], ...]  # the layout these were worked out from
    # the last launch's arguments and what they resolved to, while no allocation changed since
    last: tuple[bytes, int, ParameterPointers] | None = None


class KernelParameters:
    """Which words of a kernel's parameters point into the program's allocations. Owns each
    kernel's shape (by handle, name and module), worked out at its first launch."""

    def __init__(
        self, annotations: KernelAnnotations, report: Report, allocations: AllocationTable, buffers: BufferObjects
    ) -> None:
        self._annotations = annotations
        self._report = report
        self._allocations = allocations
        self._buffers = buffers
        self._shapes: dict[tuple[int, str, tuple[str, int] | None], KernelShape] = {}

    def forget(self) -> None:
        """Work shapes out again (an annotation may say which parameters are tensor maps now)."""
        self._shapes.clear()

    def shape(self, kernel: ev.Kernel) -> KernelShape:
        key = (kernel.handle, kernel.name, kernel.module)
        shape = self._shapes.get(key)
        # a new layout under the same key: a module unloaded and another loaded at its handle (XLA's autotuner)
        if shape is None or shape.layout is not kernel.layout:
            maps = frozenset(o for o, size in kernel.layout if self._annotations.tensor_map(kernel, o, size))
            end = max((o + size for o, size in kernel.layout), default=0)
            shape = self._shapes[key] = KernelShape(
                self._report.kernel(kernel.name),
                bool(NCCL_KERNEL.search(kernel.name)),
                maps,
                struct_words(kernel.layout),
                struct.Struct(f"<{end // 8}Q"),
                kernel.layout,
            )
        return shape

    def pointers(self, parameters: bytes, shape: KernelShape) -> ParameterPointers:
        """Every 8-byte-aligned parameter word that points into a device allocation becomes a
        relocation (structs passed by value hold pointers too; see :mod:`parameter_words`); in a
        tensor map parameter only the first word, its global address, is one (a tensor-map
        relocation). A struct word that may be data beside a stale half is one only into an
        allocation the capture holds or this launch reaches through another word."""
        relocations: list[m.Relocation] = []
        targets: list[Allocation] = []
        undecided: list[tuple[int, int, Allocation]] = []
        words = shape.words.unpack_from(parameters) if len(parameters) >= shape.words.size else ()
        maps, low = shape.tensor_maps, self._allocations.pointer_low
        skip_until = -1
        for i, value in enumerate(words):
            site = i * 8
            if site < skip_until:
                continue
            allocation = self._allocations.kernel_allocation(value) if low <= value < POINTER_HIGH else None
            if allocation is None:
                # (a 128-byte parameter whose first word is no address is a struct, not a tensor
                # map: its other words are struct words, as cuDNN's winograd kernels need)
                continue
            kind = m.RelocationKind.POINTER
            if site in maps:
                kind = m.RelocationKind.TENSOR_MAP
                skip_until = site + 128
            elif site in shape.struct_words and not (value == allocation.address and start_is_pointer(value)):
                if not_a_struct_pointer(value, allocation.size):
                    continue
                # replay keeps device buffers' low halves near a 4 GiB boundary (placed modulo 4 GiB:
                # near_boundary), never host memory's or a module's globals' (maybe_data)
                kept = allocation.api == ev.MemoryApi.DEVICE and allocation.module_global is None
                if maybe_data(value, low_half_kept=kept):
                    undecided.append((site, value, allocation))
                    continue
            relocations.append(m.Relocation(0, self._buffers.of(allocation), site, value - allocation.address, kind))
            if allocation not in targets:
                targets.append(allocation)
        # every target has its buffer by now (BufferObjects.of): "held" covers what this launch reaches
        decided = [(site, value, a) for site, value, a in undecided if a.buffer]
        for site, value, allocation in decided:
            relocations.append(m.Relocation(0, allocation.buffer, site, value - allocation.address))
            if allocation not in targets:
                targets.append(allocation)
        if decided:
            relocations.sort(key=lambda r: r.site_offset)
        unsettled = tuple({id(a): a for _, _, a in undecided if not a.buffer}.values())
        return ParameterPointers(tuple(relocations), targets, unsettled)


@dataclass
class _Instance:
    """A kernel-mode launch waiting for its call to return."""

    scope: str
    stream: int
    targets: list[Allocation]
    region: int  # the instance's own region (state and checkpoint are per instance)


class Launches:
    """Launch events. Owns kernel mode's selection (how many launches of each kernel were seen)
    and its instances awaiting their call's return (by thread)."""

    def __init__(
        self,
        *,
        writer: CaptureWriter,
        options: RecordOptions,
        report: Report,
        allocations: AllocationTable,
        region: Region,
        streams: Streams,
        parameters: KernelParameters,
        modules: Modules,
        state: StartingState,
        checkpoints: Checkpoints,
        repeats: LaunchRepeats,
        collective: Callable[[ev.LaunchBegin], None],
        collective_end: Callable[[ev.LaunchEnd], None] | None = None,
    ) -> None:
        self._writer = writer
        self._options = options
        self._report = report
        self._allocations = allocations
        self._region = region
        self._streams = streams
        self._parameters = parameters
        self._modules = modules
        self._state = state
        self._checkpoints = checkpoints
        self._repeats = repeats
        self._collective = collective  # an NCCL kernel's launch
        self._collective_end = collective_end  # its call returned: the kernel is on its stream
        self._kernel_filter = re.compile(options.kernels) if options.kernels else None
        self._seen: dict[str, int] = {}
        self._instances: dict[int, _Instance] = {}  # thread id -> instance awaiting its LaunchEnd

    @property
    def awaiting_end(self) -> bool:
        """Whether a kernel-mode instance awaits its call's return."""
        return bool(self._instances)

    def on_launch(self, event: ev.LaunchBegin) -> None:
        kernel = event.kernel
        shape = self._parameters.shape(kernel)
        shape.stats.occurrences += 1
        if self._options.mode == CaptureMode.KERNEL:
            self._kernel_instance(event)
            return
        if shape.collective:
            return self._collective(event)
        if not self._region.recording:
            return
        function = self._modules.function(kernel)
        if function is None:
            return
        last = shape.last
        if repeated := (
            last is not None
            and last[0] == event.parameters
            and last[1] == self._allocations.epoch
            and not any(a.buffer for a in last[2].unsettled)
        ):
            pointers = last[2]  # a loop launching on the same buffers
        else:
            pointers = self._parameters.pointers(event.parameters, shape)
            shape.last = (event.parameters, self._allocations.epoch, pointers)
        relocations, targets = pointers.relocations, pointers.targets
        touch = self._state.touch_for_launch
        for allocation in (*targets, *self._modules.module_globals(kernel, event.stream)):
            touch(allocation, event.stream, kernel.name)
            if allocation.pointees:  # the kernel may follow the pointers stored in it
                for reached in self._state.reached(allocation):
                    touch(reached, event.stream, kernel.name)
        self._write(event, function, relocations)
        shape.stats.captured += 1
        if repeated and not pointers.unsettled:  # a loop on the same buffers: its next repeats may go into the C ring
            self._repeats.arm(kernel, function, event.parameters, relocations, targets, shape.stats)

    def _kernel_instance(self, event: ev.LaunchBegin) -> None:
        name = event.kernel.name
        if self._kernel_filter is not None and not matches_kernel(self._kernel_filter, name):
            return
        seen = self._seen[name] = self._seen.get(name, 0) + 1
        stats = self._report.kernel(name)
        if seen <= self._options.skip_first:
            return
        if self._options.max_per_kernel is not None and stats.captured >= self._options.max_per_kernel:
            return
        function = self._modules.function(event.kernel)
        if function is None:
            return
        relocations, targets, _ = self._parameters.pointers(event.parameters, self._parameters.shape(event.kernel))
        scope = f"{name}#{seen - 1}"
        self._writer.scope_begin(scope)
        region = self._region.next_instance()  # each instance uploads everything it reads
        targets += [a for a in self._modules.module_globals(event.kernel, event.stream) if a not in targets]
        for allocation in list(targets):
            self._state.touch(allocation, event.stream, name)
            for reached in self._state.reached(allocation) if allocation.pointees else ():
                if reached not in targets:  # reached through stored pointers: checkpointed too
                    targets.append(reached)
                self._state.touch(reached, event.stream, name)
        self._write(event, function, relocations)
        stats.captured += 1
        self._instances[threading.get_ident()] = _Instance(scope, event.stream, targets, region)

    def on_launch_end(self, event: ev.LaunchEnd) -> None:
        instance = self._instances.pop(threading.get_ident(), None)
        if instance is None:
            if self._collective_end is not None:
                self._collective_end(event)
            return
        if event.result == 0:
            self._state.restore_changed_pristine_globals(instance.region, instance.targets)
            self._checkpoints.checkpoint(instance.targets, stream=instance.stream, name=instance.scope)
        else:
            self._report.errors.append(f"{instance.scope}: the program's launch failed (CUresult {event.result})")
        self._writer.scope_end(instance.scope)

    def _write(self, event: ev.LaunchBegin, function: tuple[int, int], relocations: tuple[m.Relocation, ...]) -> None:
        """The launch written (marked when it waits for a host write: host_releases); in a region,
        the addresses it points at noted (a framework's block freed later may be its result)."""
        stream = self._streams.stream(event.stream)
        if self._region.recording:
            self._checkpoints.launched(event.parameters, relocations)
        flags = host_released(event.kernel.name, event.parameters, self._allocations, self._report)
        self._writer.launch(
            executable=function[0],
            function=function[1],
            grid=event.grid,
            block=event.block,
            cluster=event.cluster,
            shared_memory=event.shared_memory,
            stream=stream,
            parameters=event.parameters,
            relocations=relocations,
            flags=(m.LAUNCH_FLAG_COOPERATIVE if event.cooperative else 0)
            | (m.LAUNCH_FLAG_PROGRAMMATIC if event.programmatic else 0)
            | flags,
        )
