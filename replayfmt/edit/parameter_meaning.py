"""What the bytes of a launch's parameters mean, for comparing two runs of one program.

Two runs of one unchanged program give a kernel the same arguments, yet their parameter bytes
differ: buffers lie at other addresses, and a by-value struct holds whatever the host's stack held
where the program left it unwritten (padding, the unused entries of fixed-size arrays, empty
classes: two captures of one PyTorch mixture-of-experts step differ so in 68 of 133 launches, in
host addresses, stack canaries, parts of addresses and small integers alike). No rule on the
values alone tells such bytes from a field, so the bytes are read by what the function declares:

- **pointers** (a declared pointer or reference, and every site the recorder relocated, inside
  a struct too) are compared as the buffer and offset they point to; an 8-byte word, 4-byte
  aligned, that falls inside a buffer on both sides likewise. A declared pointer that points at
  nothing either capture holds (host memory: a host scalar's address, a functor passed by
  reference) has no target to compare: two such are the same; a null one is not.
- **scalars** (a fundamental type by the demangled signature; without one, a parameter of at
  most 8 bytes: a C or Triton kernel's) are compared by value.
- **known layouts**: PyTorch's ``at::cuda::detail::TensorInfo<T, I>`` (data pointer, 25 sizes,
  25 strides, dims) is compared up to its ``dims``; the entries past it are never read.
- **other bytes of a class** passed by value (a functor, a lambda's captures, a parameter struct;
  without a signature, a parameter of more than 8 bytes) are *struct bytes*: a difference there
  is reported apart and counts only where the caller asks (``--fail-on struct-bytes``).

Bytes outside every declared parameter (alignment gaps) are not compared at all.
"""

from __future__ import annotations

import functools
import re
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from replayfmt.format import model as m
from replayfmt.format.names import parameter_types, type_kind

_POINTER_BYTES = {m.RelocationKind.POINTER: 8, m.RelocationKind.TENSOR_MAP: 128}
_OFFSET_MASK = (1 << 40) - 1  # a relocated site compared as (buffer id: 24 bits, offset: 40 bits)
_TENSOR_INFO = re.compile(r"^at::cuda::detail::TensorInfo<.*, (?P<index>(?:unsigned )?(?:int|long|long long))>$")
TENSOR_INFO_DIMS = 25  # PyTorch's MAX_TENSORINFO_DIMS: the capacity of TensorInfo's arrays
_EVERYTHING = 1 << 62

Range = tuple[int, int]  # [start, end) in the parameter block


@dataclass(frozen=True, slots=True)
class TensorInfoAt:
    """A ``TensorInfo`` parameter at ``offset`` whose index type is ``index_bytes`` wide."""

    offset: int
    index_bytes: int

    @property
    def dims_at(self) -> int:
        return self.offset + 8 + 2 * TENSOR_INFO_DIMS * self.index_bytes

    def unused(self, params: bytes) -> list[Range]:
        """The entries past ``dims`` and the padding after it, as ``params`` holds them (none where
        ``dims`` is out of range: then every byte is compared)."""
        at = self.dims_at
        dims = int.from_bytes(params[at : at + 4], "little", signed=True) if at + 4 <= len(params) else -1
        if not 0 <= dims <= TENSOR_INFO_DIMS:
            return []
        sizes, strides, w = self.offset + 8, self.offset + 8 + TENSOR_INFO_DIMS * self.index_bytes, self.index_bytes
        end = self.offset + _tensor_info_size(w)
        return [(sizes + dims * w, strides), (strides + dims * w, at), (at + 4, end)]


def _tensor_info_size(index_bytes: int) -> int:
    return -(-(8 + 2 * TENSOR_INFO_DIMS * index_bytes + 4) // 8) * 8


@dataclass(frozen=True, slots=True)
class ParameterLayout:
    """How a function's parameter bytes are compared (see the module docstring)."""

    gaps: tuple[Range, ...] = ()  # outside every declared parameter
    pointers: tuple[Range, ...] = ()  # declared pointers and references
    struct_bytes: tuple[Range, ...] = ()  # classes passed by value, known layouts excepted
    tensor_infos: tuple[TensorInfoAt, ...] = ()


UNKNOWN_LAYOUT = ParameterLayout()  # a function whose parameters are not declared: every byte a scalar


def layout_of(fn: m.Function | None, demangled: str) -> ParameterLayout:
    """The layout of ``fn``'s parameters; ``demangled``: its demangled name, whose signature gives
    each parameter's type where its parameter count matches the function's."""
    if fn is None or not fn.parameters_known:
        return UNKNOWN_LAYOUT
    params = sorted(fn.parameters, key=lambda p: p.offset)
    types = parameter_types(demangled)
    if types is not None and len(types) != len(params):
        types = None
    gaps, pointers, structs, infos, at = [], [], [], [], 0
    for i, p in enumerate(params):
        if p.offset > at:
            gaps.append((at, p.offset))
        at = max(at, p.offset + p.size)
        span = (p.offset, p.offset + p.size)
        declared = types[i] if types is not None else ""
        kind = type_kind(declared) if declared else ""
        if p.kind == m.ParameterKind.POINTER or kind == "pointer":
            pointers.append(span)
        elif (info := _tensor_info(declared, p)) is not None:
            infos.append(info)
        elif kind == "class" or (not kind and p.kind != m.ParameterKind.TENSOR_MAP and p.size > 8):
            structs.append(span)
    gaps.append((at, _EVERYTHING))
    return ParameterLayout(tuple(gaps), tuple(pointers), tuple(structs), tuple(infos))


def _tensor_info(declared: str, p: m.Parameter) -> TensorInfoAt | None:
    match = _TENSOR_INFO.match(declared)
    if match is None:
        return None
    width = 4 if match["index"] in ("int", "unsigned int") else 8
    return TensorInfoAt(p.offset, width) if p.size == _tensor_info_size(width) else None


Sites = dict[int, tuple[int, int, int]]  # relocated site offset -> (its bytes, target buffer, target offset)


def canonical(op: m.Launch, layout: ParameterLayout) -> tuple[bytes, Sites]:
    """``op``'s parameter bytes as two runs of one program agree on them, and its relocated sites:
    each site holds its target buffer's id and offset; gaps and unused TensorInfo entries are
    zeroed (a site there, a stale address the recorder took for a pointer, is dropped)."""
    params = bytearray(op.parameters)
    unused = [*layout.gaps, *(r for info in layout.tensor_infos for r in info.unused(op.parameters))]
    sites: Sites = {}
    for r in op.relocations:
        if r.site_buffer == 0 and 0 <= r.site_offset < len(params):
            width = min(_POINTER_BYTES.get(r.kind, 8), len(params) - r.site_offset)
            if not any(s < r.site_offset + width and r.site_offset < e for s, e in unused):
                sites[r.site_offset] = (width, r.target_buffer, r.target_offset)
    for site, (width, buffer, offset) in sites.items():
        what = struct.pack("<Q", (buffer & 0xFFFFFF) << 40 | (offset & _OFFSET_MASK))
        params[site : site + width] = (what + bytes(128))[:width]
    for start, end in unused:
        end = min(end, len(params))
        if start < end:
            params[start:end] = bytes(end - start)
    return bytes(params), sites


class BufferAddresses:
    """Which buffer of a capture an address falls in (its recorded ``address``), for pointers the
    recorder did not relocate; ``buffers`` is asked on first use (most diffs never need it)."""

    def __init__(self, buffers: Callable[[], Iterable[m.Buffer]]) -> None:
        self._buffers: Callable[[], Iterable[m.Buffer]] | None = buffers
        self.starts = self.ends = np.zeros(0, np.uint64)
        self.ids = np.zeros(0, np.int64)

    def resolve(self, addresses: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The buffer id (-1: none) and offset of each of ``addresses`` (uint64)."""
        if self._buffers is not None:
            spans = sorted((b.address, b.size, b.id) for b in self._buffers() if b.address and b.size > 0)
            self._buffers = None
            self.starts = np.array([s for s, _, _ in spans], np.uint64)
            self.ends = np.array([s + z for s, z, _ in spans], np.uint64)
            self.ids = np.array([i for _, _, i in spans], np.int64)
        if not len(self.starts):
            return np.full(len(addresses), -1, np.int64), np.zeros(len(addresses), np.uint64)
        k = np.searchsorted(self.starts, addresses, side="right").astype(np.int64) - 1
        k0 = np.maximum(k, 0)
        inside = (k >= 0) & (addresses < self.ends[k0])
        return np.where(inside, self.ids[k0], -1), np.where(inside, addresses - self.starts[k0], np.uint64(0))


class Side:
    """One launch's parameters as :func:`compare` reads them, with what each of its 8-byte words
    (4-byte aligned, word ``k`` at byte ``4 * k``) points to, worked out on first use."""

    def __init__(self, parameters: bytes, sites: Sites, buffers: BufferAddresses) -> None:
        self.parameters = parameters  # canonical (see :func:`canonical`)
        self.sites = sites
        self.buffers = buffers
        self._targets: tuple[np.ndarray, np.ndarray] | None = None

    def targets(self) -> tuple[np.ndarray, np.ndarray]:
        """(buffer id, offset) per word: a relocated site's target where one starts there, else
        the buffer the word falls in; buffer -1 where neither, or the word overlaps a site."""
        if self._targets is None:
            count = max(0, (len(self.parameters) - 8) // 4 + 1)
            halves = np.frombuffer(self.parameters[: 4 * (count + 1)] if count else b"", "<u4").astype(np.uint64)
            buffer, offset = self.buffers.resolve(halves[:count] | (halves[1 : count + 1] << np.uint64(32)))
            for site, (width, target, at) in self.sites.items():
                buffer[max(0, (site - 4) // 4) : (site + width + 3) // 4] = -1
                if width == 8 and site % 4 == 0 and site // 4 < count:
                    buffer[site // 4], offset[site // 4] = target, at
            self._targets = (buffer, offset)
        return self._targets

    def nowhere(self, start: int) -> bool:
        """Whether the 8 bytes at ``start`` are an address no buffer of the capture holds (host
        memory): not null, not relocated, not into a buffer."""
        word = int.from_bytes(self.parameters[start : start + 8], "little")
        touched = any(s < start + 8 and start < s + w for s, (w, _, _) in self.sites.items())
        return bool(word) and not touched and self.buffers.resolve(np.array([word], np.uint64))[0][0] < 0


_SCALAR, _STRUCT, _HOST = 0, 1, -1  # a byte's region in regions() (a declared pointer j: 2 + j); _HOST: see compare


@functools.lru_cache(maxsize=1024)
def regions(layout: ParameterLayout, size: int) -> np.ndarray:
    """Per byte of a ``size``-byte block: _SCALAR, _STRUCT, or 2 + j inside declared pointer j."""
    out = np.full(size, _SCALAR, np.int32)
    for start, end in layout.struct_bytes:
        out[start:end] = _STRUCT
    for j, (start, end) in enumerate(layout.pointers):
        out[start:end] = 2 + j
    return out


def compare(x: Side, y: Side, layout: ParameterLayout) -> str | None:
    """How two launches' parameters differ: None (the same, as the module docstring reads them),
    ``"parameters"`` (a value, a pointer's target or a known field differs) or ``"struct-bytes"``
    (only bytes of a class the diff cannot read differ)."""
    px, py = x.parameters, y.parameters
    if px == py:
        return None
    n = len(px)
    if len(py) != n:
        return "parameters"
    for site in x.sites.keys() & y.sites.keys():
        width = min(x.sites[site][0], y.sites[site][0])
        if px[site : site + width] != py[site : site + width]:
            return "parameters"  # relocated on both sides, to other targets
    differing = np.flatnonzero(np.frombuffer(px, np.uint8) != np.frombuffer(py, np.uint8))
    (bx, ox), (by, oy) = x.targets(), y.targets()
    both = (bx >= 0) & (by >= 0)
    if both.any():  # the first 8-byte word holding a differing byte (aligned first) that points into a
        # buffer on both sides decides for that byte
        another = both & ((bx != by) | (ox != oy))
        decided = np.full(len(differing), -1, np.int8)
        for k in (differing // 8 * 2, differing // 4, differing // 4 - 1):
            usable = np.flatnonzero((decided < 0) & (k >= 0) & (k < len(both)))
            usable = usable[both[k[usable]]]
            decided[usable] = another[k[usable]]
        if (decided == 1).any():
            return "parameters"  # a pointer to another buffer or offset
        differing = differing[decided < 0]
    where = regions(layout, n)[differing]
    for j in np.unique(where[where >= 2]):
        start, end = layout.pointers[j - 2]
        if end - start == 8 and x.nowhere(start) and y.nowhere(start):
            where[where == j] = _HOST  # a pointer into host memory on both sides: nothing to compare
    if (where == _SCALAR).any() or (where >= 2).any():
        return "parameters"
    return "struct-bytes" if (where == _STRUCT).any() else None
