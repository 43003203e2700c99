"""Module images the program loaded, as the recorder keeps them: each image is stored once, its
bytes as a payload, the first time a kernel of it runs, and every launched kernel of it becomes
an executable sharing that payload.

Images are always stored, whatever the file policy: a module loaded from a file (Triton's and
Inductor's cubins in their compile caches) is small, and a capture that references it stops
replaying as soon as the cache moves. File references are for large data files (mapped weights).

A module's globals (format 1.4, :class:`ModuleEvents`) are allocations of their own once the
CUPTI source says where they live (:mod:`loaded_code`): restored with their stored pointers when
a region starts from bytes a fresh load would not give them, skipped (one read) when it would
not, and given their load-time bytes as state if the region's kernels change them after all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from replayfmt.capture import events as ev
from replayfmt.capture.allocations import Allocation, AllocationTable, ModuleGlobal
from replayfmt.capture.ptx_sources import PtxFinder
from replayfmt.errors import DeviceError
from replayfmt.format import model as m
from replayfmt.format.cubin import CubinError, detect_format, parse_cubin
from replayfmt.format.targets import build_fatbin
from replayfmt.writer import CaptureWriter

if TYPE_CHECKING:
    from replayfmt.capture.device_memory import DeviceMemory
    from replayfmt.capture.labels import KernelAnnotation

_PAGE = 4096  # the smallest page of device memory: globals closer than this are read together


_LOADED_BEFORE = "the module of {} was loaded before recording started; start the recorder first (python -m replayfmt.capture, or replayfmt.capture.record(..., start=False) at the top of the program)"  # noqa: E501


@dataclass
class Module:
    """A loaded module image and what the capture holds of it."""

    image: ev.ModuleImage
    payload: int = 0
    file: int = 0
    format: m.ExecutableFormat = m.ExecutableFormat.UNKNOWN
    arch: str = ""
    executables: dict[str, int] = field(default_factory=dict)  # function name -> executable id
    globals: list[Allocation] = field(default_factory=list)  # its globals' storage, once a kernel of it ran
    ran: bool = False  # a kernel of it ran since its skipped globals were last looked at
    # the globals its launches touch, as worked out in (region, allocation epoch); a launch is
    # a hot path, and a library's module has hundreds of globals
    needed: tuple[Allocation, ...] = ()
    needed_at: tuple[int, int] = (-1, -1)

    @property
    def stored(self) -> bool:
        return bool(self.payload or self.file)


_PTX_FINDER = PtxFinder()  # one per process: its index of the compiler caches is reused


def store_module(module: Module, writer: CaptureWriter, ptx_of: Callable[[bytes], bytes | None] | None = None) -> None:
    """Write the module's image into the capture as a payload (once, whatever the file policy);
    its format and architecture read from the bytes. A cubin the program loaded whose PTX a
    compiler cache holds (``ptx_of``; default :mod:`ptx_sources`: Triton's, Inductor's) is stored
    as a fatbin of both, so the capture can be JIT-compiled for other GPUs."""
    if module.stored:
        return
    image = module.image
    data = image.data
    if data is None and image.path is not None:
        with open(image.path, "rb") as f:
            data = f.read()
    if data is None:
        raise ValueError(f"module {image.key} has no image")
    try:
        module.format = m.EXECUTABLE_FORMATS[detect_format(data)]
    except CubinError:
        module.format = m.ExecutableFormat.UNKNOWN
    if module.format == m.ExecutableFormat.CUBIN:
        try:
            module.arch = f"sm_{parse_cubin(data).arch}"
        except CubinError:
            pass
    if module.arch and image.key[0] == "module":  # a cubin the program loaded (a library's carry no PTX)
        data = _with_ptx(module, data, ptx_of or _PTX_FINDER.find)
    module.payload = writer.add_payload(data)
    module.image = ev.ModuleImage(image.key, None, image.path, image.call)  # the bytes are stored now


def _with_ptx(module: Module, cubin: bytes, ptx_of: Callable[[bytes], bytes | None]) -> bytes:
    try:
        ptx = ptx_of(cubin)
        if ptx is None:
            return cubin
        fatbin = build_fatbin(cubin, ptx)
    except (CubinError, OSError):  # keep the cubin as it was loaded
        return cubin
    module.format = m.ExecutableFormat.FATBIN
    return fatbin


def _module_executable(module: Module, writer: CaptureWriter) -> int:
    """An executable of the module, for its globals to name: one of its launched kernels', or,
    when none of them was recorded yet, one of the image alone (no functions)."""
    if module.executables:
        return next(iter(module.executables.values()))
    store_module(module, writer)
    label = module.image.path or module.image.call
    eid = writer.add_object(
        m.Executable(
            format=module.format, target_arch=module.arch, payload=module.payload, file=module.file, label=label
        )
    )
    module.executables[""] = eid  # (no function has an empty name)
    return eid


class ModuleEvents:
    """Module event handlers and the executables and globals of launched kernels; a mixin of
    :class:`~replayfmt.capture.translate.Translator`, which provides the attributes declared here."""

    allocations: AllocationTable
    writer: CaptureWriter
    memory: DeviceMemory
    _modules: dict[tuple[str, int], Module]
    _region: int
    _touched: list[Allocation]  # what the region checkpoints at its end

    if TYPE_CHECKING:  # provided by the translator

        def _annotation(self, kernel: ev.Kernel) -> KernelAnnotation: ...
        def _tensor_map(self, kernel: ev.Kernel, offset: int, size: int) -> bool: ...
        def _unsupported(self, call: str, reason: str, stream: int) -> None: ...
        def _buffer(self, allocation: Allocation) -> int: ...
        def _note_scoped(self, allocation: Allocation) -> None: ...

    def _on_module(self, event: ev.ModuleImage) -> None:
        self._modules[event.key] = Module(event)

    def _on_module_unload(self, event: ev.ModuleUnload) -> None:
        module = self._modules.pop(event.key, None)
        for allocation in module.globals if module is not None else ():
            if self.allocations.is_live(allocation):
                self.allocations.remove(allocation.address)

    def _on_module_globals(self, event: ev.ModuleGlobals) -> None:
        """A module's globals become allocations of their own: first touched (their state
        snapshotted, the pointers stored in them relocated) when a kernel of the module runs in
        a region, and found by address like any allocation (a pointer parameter to one)."""
        module = self._modules.get(event.key)
        if module is None:
            return
        for variable in event.variables:
            known = self.allocations.find(variable.address)
            if (
                known is not None
                and known.address == variable.address
                and known.module_global is not None
                and (known.module_global.module, known.module_global.symbol) == (event.key, variable.symbol)
                and known in module.globals
            ):
                continue  # (the host looked it up before a kernel of the module ran)
            allocation = self.allocations.add(variable.address, variable.size, ev.MemoryApi.DEVICE, "")
            allocation.call = f"module global {variable.symbol}"
            allocation.module_global = ModuleGlobal(event.key, variable.symbol, variable.initial)
            module.globals.append(allocation)
        module.needed_at = (-1, -1)

    def _module_globals(self, kernel: ev.Kernel, stream: int | None) -> tuple[Allocation, ...]:
        """The live globals of the kernel's module that a replay must restore (it may read any
        of them): all but those that hold, when this region first runs a kernel of the module,
        what a fresh load of the module gives them, while nothing is recorded of them yet.
        Libraries' modules define hundreds of constants no one writes (CUB's and libcu++'s
        one-byte tags): those cost one read, not a buffer, a state and a checkpoint each."""
        module = self._modules.get(kernel.module) if kernel.module is not None else None
        if module is None or not module.globals:
            return ()
        region = self._region
        module.ran = True
        if module.needed_at == (region, self.allocations.epoch):
            return module.needed
        live = [a for a in module.globals if self.allocations.is_live(a) and a.pristine_in != region]
        unread = [a for a in live if not a.buffer and a.region != region and a.module_global.initial is not None]
        for allocation, data in zip(unread, self._global_bytes(unread, stream)):
            if data == allocation.module_global.initial:
                allocation.pristine_in = region
        module.needed = tuple(a for a in live if a.pristine_in != region)
        module.needed_at = (region, self.allocations.epoch)
        return module.needed

    def _restore_changed_pristine_globals(self, region: int, touched: list[Allocation]) -> None:
        """At the end of a scope, and of a region of the file (the recorder's region, an
        outermost scope or the stretch before one in a whole-program capture, a kernel
        instance): a global skipped as pristine that kernels changed since (a counter) gets the
        load-time bytes it started from as state, in that region of the file (hoisted to its
        start, as all state is), and joins ``touched`` and the open scopes (checkpointed), so
        that replays repeated in one process each start from those bytes and what the kernels
        left is checked. Only modules whose kernels ran since the last look are read."""
        skipped = []
        for module in self._modules.values():
            if module.ran:
                module.ran = False
                skipped += [a for a in module.globals if a.pristine_in == region and self.allocations.is_live(a)]
        for allocation, data in zip(skipped, self._global_bytes(skipped, None)):
            if data is not None and data != allocation.module_global.initial:
                self._state_from_load_time(allocation, region)
                self._note_scoped(allocation)
                touched.append(allocation)

    def _state_from_load_time(self, allocation: Allocation, region: int) -> None:
        """A global skipped as pristine in ``region``, touched now: kernels may have changed it
        since, but it started from its load-time bytes, which become its state. From now on it
        is recorded like any global (touched at its module's launches, checkpointed)."""
        payload = self.writer.add_payload(allocation.module_global.initial)
        self.writer.state(buffer=self._buffer(allocation), payload=payload, size=allocation.size)
        allocation.region, allocation.before, allocation.pristine_in = region, payload, -1
        self._modules[allocation.module_global.module].needed_at = (-1, -1)  # its launches touch it now

    def _global_bytes(self, globals_: list[Allocation], stream: int | None) -> list[bytes | None]:
        """The bytes of each global (None: unreadable). Globals less than a page apart are read
        in one copy from the first to the end of the last (a module's lie together, so hundreds
        cost a few copies): every byte between them then lies in a page that holds a global, so
        the copy reads only mapped memory. (The driver's address range of a global is the
        global alone: it cannot say where a module's data begins and ends.)"""
        out: dict[int, bytes | None] = {}
        ordered = sorted(globals_, key=lambda a: a.address)
        start = 0
        while start < len(ordered):
            end, high = start + 1, ordered[start].address + ordered[start].size
            while end < len(ordered) and ordered[end].address - high < _PAGE:
                high = max(high, ordered[end].address + ordered[end].size)
                end += 1
            run, low = ordered[start:end], ordered[start].address
            data = self._read_or_none(low, high - low, stream) if len(run) > 1 else None
            for a in run:  # one at a time where the run could not be read whole
                out[a.address] = (
                    data[a.address - low : a.address - low + a.size]
                    if data is not None
                    else self._read_or_none(a.address, a.size, stream)
                )
            start = end
        return [out[a.address] for a in globals_]

    def _read_or_none(self, address: int, size: int, stream: int | None) -> bytes | None:
        try:
            data = bytes(self.memory.read(address, size, stream))
        except DeviceError:
            return None
        return data if len(data) == size else None

    def _global_object(self, allocation: Allocation) -> int:
        """The Global object of a module global's storage (0 for an allocation)."""
        if allocation.module_global is None:
            return 0
        storage = allocation.module_global
        executable = _module_executable(self._modules[storage.module], self.writer)
        return self.writer.add_object(m.Global(executable=executable, symbol=storage.symbol, size=allocation.size))

    def _function(self, kernel: ev.Kernel) -> tuple[int, int] | None:
        """(executable id, 0) for a launched kernel: one executable per kernel of a module,
        sharing the module's payload (replay loads each image once)."""
        module = self._modules.get(kernel.module) if kernel.module is not None else None
        if module is None:
            self._unsupported("cuLaunchKernel", _LOADED_BEFORE.format(kernel.name), 0)
            return None
        eid = module.executables.get(kernel.name)
        if eid is None:
            store_module(module, self.writer)
            annotation = self._annotation(kernel)
            parameters = []
            for i, (offset, size) in enumerate(kernel.layout):
                tensor_map = self._tensor_map(kernel, offset, size)
                kind = m.ParameterKind.TENSOR_MAP if tensor_map else m.ParameterKind.UNKNOWN
                if i < len(annotation.kinds) and annotation.kinds[i] != m.ParameterKind.UNKNOWN:
                    kind = annotation.kinds[i]
                name = annotation.names[i] if i < len(annotation.names) else ""
                dtype = annotation.dtypes[i] if i < len(annotation.dtypes) else m.DType.UNKNOWN
                parameters.append(m.Parameter(offset=offset, size=size, kind=kind, name=name, dtype=dtype))
            eid = module.executables[kernel.name] = self.writer.add_object(
                m.Executable(
                    format=module.format,
                    target_arch=module.arch,
                    payload=module.payload,
                    file=module.file,
                    functions=(m.Function(name=kernel.name, parameters=tuple(parameters), parameters_known=True),),
                    label=module.image.path or module.image.call,
                )
            )
        return eid, 0
