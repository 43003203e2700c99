"""What each operation kind reads, writes and needs: one table (:data:`USES`), so that the plan,
extract's closure, the benchmark's restore, dump and diff answer "what does this operation touch"
the same way, and a new operation kind is one row here (``tests/test_uses.py`` checks every kind
has one).

A launch names its buffers through its relocations only (what a kernel does with the bytes is
not known byte by byte: every buffer it names may be written), and it reads, and may write, the
module globals (format 1.4) of its executable's image without naming them: :func:`module_globals`
finds those. A graph launch's buffers and executables are its graph's nodes' (the caller walks
the graph: it holds the graph objects and the walk's limits).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from replayfmt.format import model as m
from replayfmt.format.enums import OperationKind

_K = OperationKind
_NONE: frozenset[int] = frozenset()


@dataclass(frozen=True, slots=True)
class Uses:
    """What one operation touches, by object id."""

    buffers: frozenset[int] = _NONE  # buffers its device work reads or writes
    writes: frozenset[int] = _NONE  # of those, the ones it may write
    checked: frozenset[int] = _NONE  # buffers a checkpoint reads back to compare (no device work)
    executables: frozenset[int] = _NONE
    events: frozenset[int] = _NONE
    streams: frozenset[int] = _NONE
    graphs: frozenset[int] = _NONE  # a graph launch's graph: its nodes touch more (walk it)
    objects: frozenset[int] = _NONE  # created or destroyed
    devices: frozenset[int] = _NONE  # a module load's device, a device synchronisation's
    files: frozenset[int] = _NONE  # a copy's source file (a FileReference)
    pointed: frozenset[int] = _NONE  # buffers whose replayed addresses it stores (pointers in data, 1.3)
    module_globals: bool = False  # reads, and may write, the module globals of its executables' images

    def ids(self) -> frozenset[int]:
        """Every object it refers to (dump-replay --object)."""
        return (
            self.buffers
            | self.checked
            | self.executables
            | self.events
            | self.streams
            | self.graphs
            | self.objects
            | self.devices
            | self.files
            | self.pointed
        ) - {0}


def _ids(*values: int) -> frozenset[int]:
    return frozenset(v for v in values if v)  # 0: none (the host, the default stream, the parameters)


def _launch(op: Any) -> Uses:
    named = _ids(*(b for r in op.relocations for b in (r.target_buffer, r.site_buffer)))
    return Uses(named, named, executables=_ids(op.executable), streams=frozenset({op.stream}), module_globals=True)


def _copy(op: Any) -> Uses:
    touched = _ids(op.src_buffer, op.dst_buffer)
    pointed = _ids(*(r.target_buffer for r in op.relocations))
    return Uses(touched, _ids(op.dst_buffer), streams=frozenset({op.stream}), files=_ids(op.src_file), pointed=pointed)


def _memset(op: Any) -> Uses:
    return Uses(_ids(op.buffer), _ids(op.buffer), streams=frozenset({op.stream}))


def _state(op: Any) -> Uses:
    return Uses(_ids(op.buffer), _ids(op.buffer), pointed=_ids(*(r.target_buffer for r in op.relocations)))


def _checkpoint(op: Any) -> Uses:
    return Uses(checked=_ids(*(e.buffer for e in op.entries)))


def _module_load(op: Any) -> Uses:
    # a load sets its image's globals to the bytes the image gives them
    return Uses(executables=_ids(op.executable), devices=_ids(op.device), module_globals=True)


def _collective(op: Any) -> Uses:
    # replayed alone it only writes its receive range; among its peers it reads its send range too
    return Uses(_ids(op.send_buffer, op.recv_buffer), _ids(op.recv_buffer), streams=frozenset({op.stream}))


def _stream_only(op: Any) -> Uses:
    return Uses(streams=frozenset({op.stream}))


# every operation kind, by what it touches (OperationKind.NONE: an operation this reader does not know)
USES: dict[OperationKind, Callable[[Any], Uses]] = {
    _K.NONE: lambda op: Uses(),
    _K.CREATE_OBJECT: lambda op: Uses(objects=_ids(op.object)),
    _K.DESTROY_OBJECT: lambda op: Uses(objects=_ids(op.object)),
    _K.COPY_HOST_TO_DEVICE: _copy,
    _K.COPY_DEVICE_TO_HOST: _copy,
    _K.COPY_DEVICE_TO_DEVICE: _copy,
    _K.MEMSET: _memset,
    _K.MODULE_LOAD: _module_load,
    _K.LAUNCH: _launch,
    _K.EVENT_RECORD: lambda op: Uses(events=_ids(op.event), streams=frozenset({op.stream})),
    _K.STREAM_WAIT_EVENT: lambda op: Uses(events=_ids(op.event), streams=frozenset({op.stream})),
    _K.STREAM_SYNCHRONIZE: _stream_only,
    _K.DEVICE_SYNCHRONIZE: lambda op: Uses(devices=_ids(op.device)),
    _K.EVENT_SYNCHRONIZE: lambda op: Uses(events=_ids(op.event)),
    _K.SCOPE_BEGIN: lambda op: Uses(),
    _K.SCOPE_END: lambda op: Uses(),
    _K.CHECKPOINT: _checkpoint,
    _K.UNSUPPORTED: _stream_only,
    _K.STATE: _state,
    _K.HOST_FUNCTION: _stream_only,
    _K.GRAPH_LAUNCH: lambda op: Uses(graphs=_ids(op.graph), streams=frozenset({op.stream})),
    _K.COLLECTIVE: _collective,
}


def uses(op: m.Operation) -> Uses:
    """What ``op`` touches (:data:`USES`)."""
    return USES[op.kind](op)


Image = tuple[int, int]  # (payload, file): a module, which the executables of its kernels share


def image_of(executable: int, lookup: Callable[[int], m.ObjectDef | None]) -> Image | None:
    """The module image an executable was loaded from (None: not an executable)."""
    exe = lookup(executable)
    return (exe.payload, exe.file) if isinstance(exe, m.Executable) else None


def globals_by_image(buffers: Iterable[int], lookup: Callable[[int], m.ObjectDef | None]) -> dict[Image, set[int]]:
    """The buffers among ``buffers`` that are module globals (format 1.4), by the image whose
    kernels read (and may write) them without naming them."""
    out: dict[Image, set[int]] = {}
    for bid in buffers:
        buf = lookup(bid)
        if isinstance(buf, m.Buffer) and buf.module_global:
            glob = lookup(buf.module_global)
            image = image_of(glob.executable, lookup) if isinstance(glob, m.Global) else None
            if image is not None:
                out.setdefault(image, set()).add(bid)
    return out


class ModuleGlobals:
    """The module globals (format 1.4) among ``buffers``, by the executables whose kernels read
    and may write them unnamed; found once, then looked up per executable."""

    def __init__(self, buffers: Iterable[int], lookup: Callable[[int], m.ObjectDef | None]) -> None:
        self._lookup = lookup
        self._by_image = globals_by_image(buffers, lookup)
        self._of: dict[int, frozenset[int]] = {}

    def of(self, executables: Iterable[int]) -> set[int]:
        """The globals the kernels of ``executables`` may touch."""
        out: set[int] = set()
        for executable in executables:
            found = self._of.get(executable)
            if found is None:
                image = image_of(executable, self._lookup) if self._by_image else None
                found = self._of[executable] = frozenset(self._by_image.get(image, ())) if image else frozenset()
            out |= found
        return out


def module_globals(
    executables: Iterable[int], buffers: Iterable[int], lookup: Callable[[int], m.ObjectDef | None]
) -> set[int]:
    """The buffers among ``buffers`` that are module globals of the images of ``executables``:
    what their kernels read and may write unnamed."""
    return ModuleGlobals(buffers, lookup).of(executables)
