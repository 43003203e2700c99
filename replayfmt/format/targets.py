"""Which GPUs an executable image can load on, read without a GPU: the SM targets of its cubins and
the virtual architectures of its PTX.

An image is a cubin (one SM target, from its ELF header), PTX text (``.target sm_XY``) or a fatbin:
a header (magic ``0xBA55ED50``, version u16, header size u16, size u64) then entries, each with a
header of its own (kind u16: 1 PTX, 2 ELF; header size u32 at byte 4; payload size u64 at 8; SM
number u32 at 28; flags u64 at 40: ``0x8000`` zstd-compressed, ``0x2000`` compressed the older way,
``0x100000`` an arch-specific ``a`` target, ``0x200000`` a family ``f`` target; decompressed size
u64 at 56). Several fatbins may follow one another.

Loading rules (the CUDA driver's): a cubin for ``sm_XY`` loads on compute capability ``X.Z`` with
``Z >= Y``; ``sm_XYa`` only on ``X.Y``; PTX for ``compute_XY`` is compiled by the driver for any GPU
of capability ``X.Y`` or newer (``compute_XYa`` only for ``X.Y``; an ``f`` target, on its major
family from ``X.Y`` up).
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from dataclasses import dataclass

from replayfmt.format import model as m
from replayfmt.format.cubin import ELF_MAGIC, FATBIN_MAGIC, CubinError, parse_cubin

_KIND_PTX, _KIND_ELF = 1, 2
_FLAG_ZSTD, _FLAG_OLD_COMPRESSION = 0x8000, 0x2000
_FLAG_ARCH_SPECIFIC, _FLAG_FAMILY = 0x100000, 0x200000
_PTX_TARGET = re.compile(rb"^\s*\.target\s+sm_(\d+)([af]?)", re.M)
MAX_PTX = 256 << 20  # decompressed PTX read from a fatbin, at most (a hostile size field)


@dataclass(frozen=True, order=True)
class Target:
    """One compiled target: ``sm`` (e.g. 90), ``suffix`` ('', 'a' or 'f'), ``ptx`` (virtual: PTX)."""

    sm: int
    suffix: str = ""
    ptx: bool = False

    def label(self) -> str:
        return f"{'compute' if self.ptx else 'sm'}_{self.sm}{self.suffix}"

    def loads_on(self, capability: tuple[int, int]) -> bool:
        major, minor = divmod(self.sm, 10)
        have = capability[0] * 10 + capability[1]
        if self.suffix == "a":
            return have == self.sm
        if self.ptx:
            return have >= self.sm if self.suffix != "f" else capability[0] == major and capability[1] >= minor
        return capability[0] == major and capability[1] >= minor


@dataclass(frozen=True)
class FatbinEntry:
    kind: int  # 1 PTX, 2 ELF
    target: Target
    start: int  # the entry's header, in the image
    header_size: int
    size: int
    flags: int
    decompressed_size: int


@dataclass(frozen=True)
class CodeTargets:
    """What an executable image holds code for; ``unreadable`` says why nothing could be read."""

    targets: tuple[Target, ...] = ()
    unreadable: str = ""

    @property
    def cubins(self) -> tuple[Target, ...]:
        return tuple(t for t in self.targets if not t.ptx)

    @property
    def ptx(self) -> tuple[Target, ...]:
        return tuple(t for t in self.targets if t.ptx)

    def loads_on(self, capability: tuple[int, int]) -> bool | None:
        """Whether the image loads on a GPU of ``capability`` (None: the image could not be read)."""
        if self.unreadable:
            return None
        return any(t.loads_on(capability) for t in self.targets)

    def describe(self) -> str:
        """e.g. ``sm_80 sm_90, PTX compute_90`` or ``sm_90, no PTX``."""
        if self.unreadable:
            return f"unknown ({self.unreadable})"
        cubins = " ".join(t.label() for t in self.cubins) or "no cubin"
        ptx = ("PTX " + " ".join(t.label() for t in self.ptx)) if self.ptx else "no PTX"
        return f"{cubins}, {ptx}"

    def to_json(self) -> dict[str, object]:
        return {
            "cubin_targets": [t.label() for t in self.cubins],
            "ptx_targets": [t.label() for t in self.ptx],
            "has_ptx": bool(self.ptx),
            **({"unreadable": self.unreadable} if self.unreadable else {}),
        }


Read = Callable[[int, int], bytes]  # (offset, size) -> those bytes of an image


def fatbin_entries(data: bytes) -> list[FatbinEntry]:
    """The entries of a fatbin (several fatbins one after another too); CubinError when malformed."""
    return _walk_fatbin(lambda at, n: data[at : at + n], len(data))


def _walk_fatbin(read: Read, total: int) -> list[FatbinEntry]:
    """The entries of the fatbin(s) of ``total`` bytes, reading only their headers."""
    out: list[FatbinEntry] = []
    at = 0
    while at + 16 <= total:
        magic, _version, header_size, size = struct.unpack("<IHHQ", read(at, 16))
        if magic != FATBIN_MAGIC:
            if out and not any(read(at, min(total - at, 4096))):  # zero padding after the last fatbin
                break
            raise CubinError(f"fatbin: no fatbin header at byte {at}")
        end = at + header_size + size
        if header_size < 16 or end > total:
            raise CubinError(
                f"fatbin: the fatbin at byte {at} claims {size} bytes past its header; the file ends first"
            )
        entry = at + header_size
        while entry + 64 <= end:
            head = read(entry, 64)
            kind, _, entry_header, payload = struct.unpack_from("<HHIQ", head)
            (sm,) = struct.unpack_from("<I", head, 28)
            (flags,) = struct.unpack_from("<Q", head, 40)
            (decompressed,) = struct.unpack_from("<Q", head, 56)
            if entry_header < 64 or entry + entry_header + payload > end:
                raise CubinError(f"fatbin: entry at byte {entry} runs past its fatbin's end")
            suffix = "a" if flags & _FLAG_ARCH_SPECIFIC else "f" if flags & _FLAG_FAMILY else ""
            if kind in (_KIND_PTX, _KIND_ELF):
                target = Target(sm, suffix, kind == _KIND_PTX)
                out.append(FatbinEntry(kind, target, entry, entry_header, payload, flags, decompressed))
            entry += entry_header + payload
        at = end
    return out


def code_targets_at(read: Read, total: int, fmt: m.ExecutableFormat) -> CodeTargets:
    """:func:`code_targets` of an image of ``total`` bytes read piece by piece: a cubin's ELF
    header, a fatbin's headers, PTX's first MiB (a large image is not read whole)."""
    try:
        head = read(0, min(total, 64))
        if head[:4] == ELF_MAGIC:
            if len(head) < 0x34:
                raise CubinError("not a 64-bit little-endian ELF file")
            (flags,) = struct.unpack_from("<I", head, 0x30)
            return CodeTargets((Target((flags >> 8) & 0xFF if head[8] >= 8 else flags & 0xFF),))
        if len(head) >= 4 and struct.unpack_from("<I", head)[0] == FATBIN_MAGIC:
            return CodeTargets(tuple(sorted({e.target for e in _walk_fatbin(read, total)})))
        found = _PTX_TARGET.search(read(0, min(total, 1 << 20)))
        if found:
            return CodeTargets((Target(int(found[1]), found[2].decode(), ptx=True),))
    except CubinError as exc:
        return CodeTargets(unreadable=str(exc))
    what = fmt.name.lower() if fmt != m.ExecutableFormat.UNKNOWN else "an image"
    return CodeTargets(unreadable=f"{what} this reader cannot read")


def code_targets(data: bytes, fmt: m.ExecutableFormat) -> CodeTargets:
    """What ``data`` (an executable's image, of format ``fmt``) holds code for."""
    try:
        if data[:4] == ELF_MAGIC:
            return CodeTargets((Target(parse_cubin(data).arch),))
        if len(data) >= 4 and struct.unpack_from("<I", data)[0] == FATBIN_MAGIC:
            return CodeTargets(tuple(sorted({e.target for e in fatbin_entries(data)})))
        found = _PTX_TARGET.search(data[: 1 << 20])
        if found:
            return CodeTargets((Target(int(found[1]), found[2].decode(), ptx=True),))
    except CubinError as exc:
        return CodeTargets(unreadable=str(exc))
    what = fmt.name.lower() if fmt != m.ExecutableFormat.UNKNOWN else "an image"
    return CodeTargets(unreadable=f"{what} this reader cannot read")


def ptx_image(data: bytes) -> bytes | None:
    """The PTX of an image, as the driver can load it: PTX text itself, or a fatbin of the image's
    PTX entries alone (copied as they are, compressed or not, so the driver JIT-compiles them);
    None when the image holds no PTX."""
    if data[:4] == ELF_MAGIC:
        return None
    if len(data) >= 4 and struct.unpack_from("<I", data)[0] == FATBIN_MAGIC:
        entries = [e for e in fatbin_entries(data) if e.kind == _KIND_PTX]
        if not entries:
            return None
        body = b"".join(data[e.start : e.start + e.header_size + e.size] for e in entries)
        return struct.pack("<IHHQ", FATBIN_MAGIC, 1, 16, len(body)) + body
    if _PTX_TARGET.search(data[: 1 << 20]):
        return data
    return None


def ptx_text(data: bytes) -> list[tuple[Target, bytes]]:
    """The PTX text of each PTX entry of a fatbin (zstd-compressed ones decompressed; the older
    compression is not read) or of PTX itself."""
    if data[:4] == ELF_MAGIC:
        return []
    if len(data) < 4 or struct.unpack_from("<I", data)[0] != FATBIN_MAGIC:
        found = _PTX_TARGET.search(data[: 1 << 20])
        return [(Target(int(found[1]), found[2].decode(), ptx=True), data)] if found else []
    out = []
    for e in fatbin_entries(data):
        if e.kind != _KIND_PTX:
            continue
        body = data[e.start + e.header_size : e.start + e.header_size + e.size]
        (compressed,) = struct.unpack_from("<I", data, e.start + 16)
        if e.flags & _FLAG_ZSTD:
            body = body[:compressed] if 0 < compressed <= len(body) else body
            import zstandard

            if e.decompressed_size > MAX_PTX:
                raise CubinError(f"fatbin: a PTX entry claims {e.decompressed_size} bytes decompressed")
            body = zstandard.ZstdDecompressor().decompress(body, max_output_size=e.decompressed_size or MAX_PTX)
        elif e.flags & _FLAG_OLD_COMPRESSION:
            continue
        out.append((e.target, body.rstrip(b"\0")))
    return out


def cannot_load(images: dict[int, CodeTargets], capability: tuple[int, int]) -> dict[int, CodeTargets]:
    """The executables (id -> targets) whose code does not load on a GPU of ``capability``; an
    image whose targets could not be read is left to the driver to judge."""
    return {eid: t for eid, t in sorted(images.items()) if t.loads_on(capability) is False}


def refusal(images: dict[int, CodeTargets], capability: tuple[int, int], device: str) -> str | None:
    """Why ``device`` (of ``capability``) cannot run these executables, naming them, or None."""
    bad = cannot_load(images, capability)
    if not bad:
        return None
    groups: dict[str, list[int]] = {}
    for eid, t in bad.items():
        groups.setdefault(t.describe(), []).append(eid)
    shown = "; ".join(
        f"executable{'s' if len(ids) > 1 else ''} {', '.join(map(str, ids[:8]))}{' and more' if len(ids) > 8 else ''}"
        f" ({what})"
        for what, ids in groups.items()
    )
    return (
        f"{device} (sm_{capability[0]}{capability[1]}) cannot run {len(bad)} of the capture's {len(images)} "
        f"executable(s): {shown}; replay on a GPU they were built for, or substitute builds for "
        f"sm_{capability[0]}{capability[1]} with --executable-substitution"
    )


_PTX_VERSION = re.compile(rb"^\s*\.version\s+(\d+)\.(\d+)", re.M)
_PTX_ADDRESS_SIZE = re.compile(rb"^\s*\.address_size\s+(\d+)", re.M)


def _padded(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % 8)


def build_fatbin(cubin: bytes, ptx: bytes) -> bytes:
    """A fatbin of one cubin and the PTX it was compiled from, laid out as CUDA's ``fatbinary
    --compress=false`` lays them out (the driver loads the cubin where it can run, else JIT-compiles
    the PTX); CubinError when ``cubin`` is not one or ``ptx`` names no target or version."""
    sm = parse_cubin(cubin).arch
    version = _PTX_VERSION.search(ptx)
    target = _PTX_TARGET.search(ptx)
    if version is None or target is None:
        raise CubinError("PTX without a .version or .target directive")
    address = _PTX_ADDRESS_SIZE.search(ptx)
    elf_body = _padded(cubin)
    elf = struct.pack("<HHIQIIHHIIIQQQ", _KIND_ELF, 0x0101, 64, len(elf_body), 0, 0, cubin[8], 1, sm, 0, 0, 0x11, 0, 0)
    text = ptx.rstrip(b"\0") + b"\0"
    ptx_body = _padded(text)
    flags = 0x11 | (_FLAG_ARCH_SPECIFIC if target[2] == b"a" else 0)
    ptx_header = struct.pack(
        "<HHIQIIHHIIIQQQ",
        _KIND_PTX,
        0x0101,
        80,
        len(ptx_body),
        0,
        int(address[1]) if address else 64,
        int(version[2]),
        int(version[1]),
        int(target[1]),
        0,
        0,
        flags,
        0,
        0,
    ) + struct.pack("<Q8x", 0x48)
    body = elf + elf_body + ptx_header + ptx_body
    return struct.pack("<IHHQ", FATBIN_MAGIC, 1, 16, len(body)) + body
