"""Which bytes of a large allocation hold live framework buffers, so that a snapshot covers those
and not the whole allocation.

Frameworks allocate device memory in large pieces and place their buffers inside them: XLA
preallocates most of the device's memory as one arena (75% by default), PyTorch's caching
allocator keeps segments holding free blocks as well as tensors. A step that uses a few
megabytes of such a piece must not snapshot all of it. A :class:`LiveBufferSource` reports what
one framework knows (:class:`JaxLiveArrays`, :class:`TorchCachingAllocator`); a
:class:`LiveBuffers` asks its sources lazily, at most once per step (a region, a kernel instance,
a checkpoint), and answers for one allocation the sub-ranges worth snapshotting, or None when no
framework speaks for it (then it is snapshotted whole, within the recorder's bound).

A source never imports its framework: it answers only when the program has imported it already
(``sys.modules``), so recording a program that never uses JAX costs nothing here.

JAX in any program shape: XLA's arena is known by its size (``memory_stats()``: the pool it
preallocated) before any array lives in it, so a region that starts with the program (no
``--scope``) still bounds it; arrays a step donates are deleted before the step's kernels run,
so the view taken when the region begins (:meth:`LiveBuffers.hold`) counts too. XLA's temporaries are no live arrays: a
step writes them before it reads them, so their starting bytes are not needed.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

LIVE_VIEW_MIN = 16 << 20  # allocations smaller than this are snapshotted whole (no framework query)
MERGE_GAP = 1 << 20  # live ranges closer than this are snapshotted as one (fewer, larger payloads)
ALIGN = 256  # live ranges are widened to this (the alignment of cuMemAlloc and of every framework's buffers)


@dataclass(frozen=True, slots=True, order=True)
class ByteRange:
    """Device addresses [start, stop)."""

    start: int
    stop: int

    @property
    def size(self) -> int:
        return self.stop - self.start


def merge(ranges: Iterable[ByteRange], gap: int = 0) -> list[ByteRange]:
    """Sorted, disjoint ranges covering ``ranges``; ranges less than ``gap`` bytes apart become one."""
    out: list[ByteRange] = []
    for r in sorted(r for r in ranges if r.stop > r.start):
        if out and r.start - out[-1].stop <= gap:
            if r.stop > out[-1].stop:
                out[-1] = ByteRange(out[-1].start, r.stop)
        else:
            out.append(r)
    return out


def clip(ranges: Sequence[ByteRange], start: int, stop: int) -> list[ByteRange]:
    """The parts of sorted, disjoint ``ranges`` inside [start, stop)."""
    out = []
    for r in ranges:
        low, high = max(r.start, start), min(r.stop, stop)
        if low < high:
            out.append(ByteRange(low, high))
    return out


def widen(r: ByteRange, align: int = ALIGN) -> ByteRange:
    """``r`` grown to ``align``-byte boundaries (frame hashing on the device wants aligned starts)."""
    return ByteRange(r.start // align * align, -(-r.stop // align) * align)


@dataclass(frozen=True)
class LiveView:
    """What one framework says about device memory at one moment."""

    source: str  # the framework, for the report
    live: tuple[ByteRange, ...]  # its live buffers (sorted, disjoint)
    # the memory it manages (PyTorch's segments), sorted and disjoint; empty when it cannot say
    # (JAX): then it speaks for an allocation only where one of its live buffers lies inside it
    managed: tuple[ByteRange, ...] = ()
    # (smallest, largest) sizes of the arenas it preallocated (XLA's pool), whose addresses it does
    # not say: an allocation of such a size is its own even before any live buffer lies inside it
    arena_sizes: tuple[tuple[int, int], ...] = ()
    # the bytes its buffers hold, without the allocator's padding after each (sorted, disjoint); empty:
    # ``live``. Padding holds what earlier work left there: starting state may carry it, a checkpoint
    # must not compare it (a step writes its outputs, never their padding)
    exact: tuple[ByteRange, ...] = ()
    # the buffers whose type can hold a device address (64-bit integers, untyped bytes), sorted and
    # disjoint; None: every live buffer may (the framework does not say what they hold)
    addresses: tuple[ByteRange, ...] | None = None

    def speaks_for(self, start: int, stop: int) -> bool:
        """Whether this framework manages [start, stop), so that bytes it does not call live are free."""
        if self.managed:
            return bool(clip(self.managed, start, stop))
        if any(low <= stop - start <= high for low, high in self.arena_sizes):
            return True
        return bool(clip(self.live, start, stop))


class LiveBufferSource(Protocol):
    """One framework's view of its live device buffers."""

    name: str

    def view(self) -> LiveView | None:
        """The framework's live buffers now, or None when the program does not use it."""


ARENA_SLACK = 64 << 20  # an arena's mapped size may differ from XLA's pool size by its rounding
ARENA_MIN = 1 << 30  # smaller pools (XLA_PYTHON_CLIENT_PREALLOCATE=false) are no arena: known by their arrays only
_ARENA_STATS = ("pool_bytes", "bytes_limit", "bytes_reservable_limit")  # memory_stats() keys naming the arena


class JaxLiveArrays:
    """JAX (XLA): ``jax.live_arrays()``, each addressable shard's buffer pointer and its size on
    the device, and the size of the arena XLA preallocated (each GPU's ``memory_stats()``). XLA's
    temporaries inside a step are no live arrays: their starting bytes are not needed (the step
    writes them before reading them). Arrays a step donates are deleted once it is dispatched:
    ``donates`` asks :class:`LiveBuffers` to keep the view from the region's start as well."""

    name = "jax"
    donates = True

    def view(self) -> LiveView | None:
        jax = sys.modules.get("jax")
        if jax is None or not hasattr(jax, "live_arrays") or not _gpu_started(jax):
            return None  # (asking would start JAX's GPU client, and its arena, inside the program's call)
        live, exact, addresses = [], [], []
        for array in jax.live_arrays():
            if array.is_deleted():
                continue
            wide = may_hold_addresses(array.dtype)
            for shard in array.addressable_shards:
                if shard.device.platform != "gpu":
                    continue
                data = shard.data
                pointer = data.unsafe_buffer_pointer()
                live.append(ByteRange(pointer, pointer + max(data.nbytes, _on_device_size(data))))
                exact.append(ByteRange(pointer, pointer + data.nbytes))
                if wide:
                    addresses.append(exact[-1])
        return LiveView(
            self.name,
            tuple(merge(live)),
            arena_sizes=_arena_sizes(jax),
            exact=tuple(merge(exact)),
            addresses=tuple(merge(addresses)),
        )


def _arena_sizes(jax: Any) -> tuple[tuple[int, int], ...]:
    """The (smallest, largest) size of each GPU's XLA arena (its pool, as ``memory_stats()`` says),
    for those of ARENA_MIN bytes or more (a size that large is no other allocator's by chance)."""
    sizes = set()
    for device in jax.local_devices(backend="gpu"):
        stats = device.memory_stats() or {}
        for key in _ARENA_STATS:
            value = int(stats.get(key, 0) or 0)
            if value >= ARENA_MIN:
                sizes.add((max(0, value - ARENA_SLACK), value + ARENA_SLACK))
    return tuple(sorted(sizes))


def _gpu_started(jax: Any) -> bool:
    """Whether the program has started JAX's GPU client (JAX's own table of started backends:
    asking a JAX that has not would start it, and its arena, from inside a driver callback)."""
    bridge = getattr(getattr(jax, "_src", None), "xla_bridge", None)
    started = getattr(bridge, "_backends", None)
    if started is None:  # a JAX without that table: taken as started (asking is what could start it)
        return True
    return any(name in started for name in ("cuda", "gpu", "rocm"))


def may_hold_addresses(dtype: Any) -> bool:
    """Whether an array of ``dtype`` can hold a device address: 64-bit integers or raw bytes (an
    int32 array's pairs of small numbers look like addresses inside an arena at a low address)."""
    kind, size = getattr(dtype, "kind", "V"), getattr(dtype, "itemsize", 8)
    return kind == "V" or (kind in "iu" and size == 8)


def _on_device_size(data: Any) -> int:
    size = getattr(data, "on_device_size_in_bytes", None)
    return int(size()) if callable(size) else 0


class TorchCachingAllocator:
    """PyTorch's caching allocator: ``torch.cuda.memory_snapshot()``'s segments (what it manages)
    and their active blocks (tensors, and blocks freed while a stream still uses them)."""

    name = "torch"

    def view(self) -> LiveView | None:
        torch = sys.modules.get("torch")
        if torch is None or not torch.cuda.is_initialized():
            return None
        segments = torch.cuda.memory_snapshot()
        expandable = (
            "expandable_segments:true" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "").replace(" ", "").lower()
        )
        return torch_view(segments, expandable=expandable)


def torch_view(segments: list[dict[str, Any]], *, expandable: bool = False) -> LiveView:
    """The :class:`LiveView` of ``torch.cuda.memory_snapshot()``'s segments. Expandable segments
    (``expandable``: the allocator's setting; or a segment marked ``is_expandable``) are left out:
    mapped piece by piece as they grow, they are snapshotted whole: bounded to their live blocks,
    captures of them did not verify (docs/LIMITATIONS.md)."""
    managed, live, exact = [], [], []
    for segment in segments:
        if expandable or segment.get("is_expandable"):
            continue
        managed.append(ByteRange(segment["address"], segment["address"] + segment["total_size"]))
        for block in segment.get("blocks", ()):
            if block["state"] != "inactive":  # active_allocated, active_pending_free
                live.append(ByteRange(block["address"], block["address"] + block["size"]))
                asked = block.get("requested_size") or block["size"]
                exact.append(ByteRange(block["address"], block["address"] + min(asked, block["size"])))
    return LiveView(TorchCachingAllocator.name, tuple(merge(live)), tuple(merge(managed)), exact=tuple(merge(exact)))


def default_sources() -> list[LiveBufferSource]:
    return [JaxLiveArrays(), TorchCachingAllocator()]


@dataclass
class LiveRanges:
    """The part of one allocation worth snapshotting: ``ranges`` (device addresses, sorted,
    disjoint) as ``source`` reported them live."""

    source: str
    ranges: list[ByteRange]
    exact: list[ByteRange] = field(default_factory=list)  # the buffers' own bytes (no padding, no gaps)
    addresses: list[ByteRange] | None = None  # the buffers that may hold device addresses (None: all of them)

    @property
    def size(self) -> int:
        return sum(r.size for r in self.ranges)


@dataclass
class LiveBuffers:
    """Asks its sources at most once per step, and only for allocations of ``min_size`` bytes or
    more. A source that fails is left out for the rest of the recording (``problems`` says why)."""

    sources: list[LiveBufferSource] = field(default_factory=default_sources)
    min_size: int = LIVE_VIEW_MIN
    gap: int = MERGE_GAP
    problems: list[str] = field(default_factory=list)
    queries: int = 0  # how often the sources were asked (once per step at most)
    _step: Hashable = None
    _views: list[LiveView] | None = None
    _held: tuple[Hashable, list[LiveView]] | None = None  # (step, views taken when it began)

    def hold(self, step: Hashable) -> None:
        """The moment ``step`` begins (a region's start): the sources whose programs donate
        buffers (``donates``: JAX) are asked now, and their live buffers count for ``step`` too,
        as a step reads what it donates after the framework has deleted it."""
        sources = [s for s in self.sources if getattr(s, "donates", False)]
        self._held = (step, self._ask(sources)) if sources else None

    def ranges(self, address: int, size: int, step: Hashable) -> LiveRanges | None:
        """The live sub-ranges of the allocation [address, address + size), merged across gaps
        under ``gap`` bytes; None when it is small or no framework manages it (snapshot it whole).
        ``step`` names the moment: views are reused while it stays the same."""
        if size < self.min_size:
            return None
        stop = address + size
        views = [v for v in self._current(step) if v.speaks_for(address, stop)]
        if not views:
            return None
        # every framework's live buffers inside it (a JAX array in a PyTorch segment, through DLPack)
        widened = [widen(r) for v in views for r in clip(v.live, address, stop)]
        names = "+".join(dict.fromkeys(v.source for v in views))
        exact = merge(r for v in views for r in clip(v.exact or v.live, address, stop))
        addresses = None
        if all(v.addresses is not None for v in views):
            addresses = merge(r for v in views for r in clip(v.addresses or (), address, stop))
        return LiveRanges(names, clip(merge(widened, self.gap), address, stop), exact, addresses)

    def _current(self, step: Hashable) -> list[LiveView]:
        if self._views is None or step != self._step:
            self._step = step
            self._views = self._ask(list(self.sources))
            if self._held is not None and self._held[0] == step:
                self._views += self._held[1]  # what the step's start held: donated buffers
        return self._views

    def _ask(self, sources: list[LiveBufferSource]) -> list[LiveView]:
        views = []
        self.queries += 1
        for source in sources:
            try:
                view = source.view()
            except Exception as exc:  # a framework's API changed: snapshot whole, say so
                if source in self.sources:
                    self.sources.remove(source)
                self.problems.append(f"{source.name} live buffers: {type(exc).__name__}: {exc}")
                continue
            if view is not None:
                views.append(view)
        return views
