"""Module images the program loaded, as the recorder keeps them: each image is stored once, its
bytes as a payload, the first time a kernel of it runs, and every launched kernel of it becomes
an executable sharing that payload.

Images are always stored, whatever the file policy: a module loaded from a file (Triton's and
Inductor's cubins in their compile caches) is small, and a capture that references it stops
replaying as soon as the cache moves. File references are for large data files (mapped weights).

A module's globals (format 1.4, :class:`Modules`) are allocations of their own once the
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
    from replayfmt.capture.labels import KernelAnnotations
    from replayfmt.capture.regions import Refusals, Region

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


class Modules:
    """The modules the program loaded, by key: module events, the executables of launched
    kernels, and their globals (allocations of their own in the shared table)."""

    def __init__(
        self,
        writer: CaptureWriter,
        memory: DeviceMemory,
        allocations: AllocationTable,
        annotations: KernelAnnotations,
        refusals: Refusals,
        region: Region,
    ) -> None:
        self._writer = writer
        self._memory = memory
        self._allocations = allocations
        self._annotations = annotations
        self._refusals = refusals
        self._region = region
        self._loaded: dict[tuple[str, int], Module] = {}

    def loaded(self, key: tuple[str, int] | None) -> Module | None:
        """The loaded module of that key (None: loaded before the recorder started, or unloaded)."""
        return self._loaded.get(key) if key is not None else None

    def on_module(self, event: ev.ModuleImage) -> None:
        self._loaded[event.key] = Module(event)

    def on_module_unload(self, event: ev.ModuleUnload) -> None:
        module = self._loaded.pop(event.key, None)
        for allocation in module.globals if module is not None else ():
            if self._allocations.is_live(allocation):
                self._allocations.remove(allocation.address)

    def on_module_globals(self, event: ev.ModuleGlobals) -> None:
        """A module's globals become allocations of their own: first touched (their state
        snapshotted, the pointers stored in them relocated) when a kernel of the module runs in
        a region, and found by address like any allocation (a pointer parameter to one)."""
        module = self._loaded.get(event.key)
        if module is None:
            return
        for variable in event.variables:
            known = self._allocations.find(variable.address)
            if (
                known is not None
                and known.address == variable.address
                and known.module_global is not None
                and (known.module_global.module, known.module_global.symbol) == (event.key, variable.symbol)
                and known in module.globals
            ):
                continue  # (the host looked it up before a kernel of the module ran)
            allocation = self._allocations.add(variable.address, variable.size, ev.MemoryApi.DEVICE, "")
            allocation.call = f"module global {variable.symbol}"
            allocation.module_global = ModuleGlobal(event.key, variable.symbol, variable.initial)
            module.globals.append(allocation)
        module.needed_at = (-1, -1)

    def module_globals(self, kernel: ev.Kernel, stream: int | None) -> tuple[Allocation, ...]:
        """The live globals of the kernel's module that a replay must restore (it may read any
        of them): all but those that hold, when this region first runs a kernel of the module,
        what a fresh load of the module gives them, while nothing is recorded of them yet.
        Libraries' modules define hundreds of constants no one writes (CUB's and libcu++'s
        one-byte tags): those cost one read, not a buffer, a state and a checkpoint each."""
        module = self._loaded.get(kernel.module) if kernel.module is not None else None
        if module is None or not module.globals:
            return ()
        region = self._region.number
        module.ran = True
        if module.needed_at == (region, self._allocations.epoch):
            return module.needed
        live = [a for a in module.globals if self._allocations.is_live(a) and a.pristine_in != region]
        unread = [a for a in live if not a.buffer and a.region != region and a.module_global.initial is not None]
        for allocation, data in zip(unread, self._global_bytes(unread, stream)):
            if data == allocation.module_global.initial:
                allocation.pristine_in = region
        module.needed = tuple(a for a in live if a.pristine_in != region)
        module.needed_at = (region, self._allocations.epoch)
        return module.needed

    def changed_pristine_globals(self, region: int) -> list[Allocation]:
        """The globals skipped as pristine in ``region`` that kernels changed since (a counter):
        :meth:`StartingState.restore_changed_pristine_globals
        <replayfmt.capture.starting_state.StartingState.restore_changed_pristine_globals>` gives
        them the load-time bytes they started from. Only modules whose kernels ran since the last
        look are read."""
        skipped = []
        for module in self._loaded.values():
            if module.ran:
                module.ran = False
                skipped += [a for a in module.globals if a.pristine_in == region and self._allocations.is_live(a)]
        return [
            allocation
            for allocation, data in zip(skipped, self._global_bytes(skipped, None))
            if data is not None and data != allocation.module_global.initial
        ]

    def recorded_now(self, allocation: Allocation) -> None:
        """A global skipped as pristine has state now: its module's launches touch it from now on."""
        self._loaded[allocation.module_global.module].needed_at = (-1, -1)

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
            data = bytes(self._memory.read(address, size, stream))
        except DeviceError:
            return None
        return data if len(data) == size else None

    def global_object(self, allocation: Allocation) -> int:
        """The Global object of a module global's storage (0 for an allocation)."""
        if allocation.module_global is None:
            return 0
        storage = allocation.module_global
        executable = _module_executable(self._loaded[storage.module], self._writer)
        return self._writer.add_object(m.Global(executable=executable, symbol=storage.symbol, size=allocation.size))

    def function(self, kernel: ev.Kernel) -> tuple[int, int] | None:
        """(executable id, 0) for a launched kernel: one executable per kernel of a module,
        sharing the module's payload (replay loads each image once); None, and the launch
        refused, when its module was loaded before the recorder started."""
        module = self._loaded.get(kernel.module) if kernel.module is not None else None
        if module is None:
            self._refusals.refuse("cuLaunchKernel", _LOADED_BEFORE.format(kernel.name), 0)
            return None
        eid = module.executables.get(kernel.name)
        if eid is None:
            store_module(module, self._writer)
            annotation = self._annotations.of(kernel)
            parameters = []
            for i, (offset, size) in enumerate(kernel.layout):
                tensor_map = self._annotations.tensor_map(kernel, offset, size)
                kind = m.ParameterKind.TENSOR_MAP if tensor_map else m.ParameterKind.UNKNOWN
                if i < len(annotation.kinds) and annotation.kinds[i] != m.ParameterKind.UNKNOWN:
                    kind = annotation.kinds[i]
                name = annotation.names[i] if i < len(annotation.names) else ""
                dtype = annotation.dtypes[i] if i < len(annotation.dtypes) else m.DType.UNKNOWN
                parameters.append(m.Parameter(offset=offset, size=size, kind=kind, name=name, dtype=dtype))
            eid = module.executables[kernel.name] = self._writer.add_object(
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
