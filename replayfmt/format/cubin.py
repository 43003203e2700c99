"""What a cubin says about its kernels, read without a GPU: target architecture, and per kernel the
parameter layout (offset and size of each parameter, total size), launch bounds, registers and
static shared memory. This lets ``run-replay --dry-run`` check an executable substitution's ABI on a
machine with no GPU.

The cubin is an ELF64 file. Kernel attributes live in ``.nv.info.<kernel>`` sections as a list of
(format, attribute, value) entries; ``.nv.info`` holds per-symbol entries such as the register
count. Every offset and length is bounds-checked: a substitution file is user input.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

from replayfmt.errors import ReplayUsageError

ELF_MAGIC = b"\x7fELF"
FATBIN_MAGIC = 0xBA55ED50

_EIFMT_NVAL, _EIFMT_BVAL, _EIFMT_HVAL, _EIFMT_SVAL = 1, 2, 3, 4
_EIATTR_MAX_THREADS = 0x05
_EIATTR_PARAM_CBANK = 0x0A
_EIATTR_KPARAM_INFO = 0x17
_EIATTR_CBANK_PARAM_SIZE = 0x19
_EIATTR_REGCOUNT = 0x2F
_STT_OBJECT = 1
# Elf64_Sym
_SYMBOL = np.dtype(
    [("name", "<u4"), ("info", "u1"), ("other", "u1"), ("section", "<u2"), ("value", "<u8"), ("size", "<u8")]
)


class CubinError(ReplayUsageError):
    """A file given as a cubin is not a readable one."""


@dataclass
class KernelInfo:
    name: str
    parameters: list[tuple[int, int]] = field(default_factory=list)  # (offset, size) by ordinal
    parameter_size: int = 0
    max_threads: tuple[int, int, int] | None = None
    registers: int = 0
    static_shared_memory: int = 0


@dataclass(frozen=True)
class Variable:
    """A module global: a ``__device__`` or ``__constant__`` variable the image defines, and the
    bytes a fresh load of the image gives it (None: not kept, for one over INITIAL_BYTES)."""

    name: str
    size: int
    initial: bytes | None = None


INITIAL_BYTES = 1 << 20  # a variable's load-time bytes are kept up to this size


@dataclass
class CubinInfo:
    arch: int  # e.g. 90 for sm_90
    kernels: dict[str, KernelInfo]
    variables: list[Variable] = field(default_factory=list)
    symbols: frozenset[str] = frozenset()  # every name of its symbol table (empty: it has none)


def _u(fmt: str, data: bytes, offset: int, what: str) -> tuple[int, ...]:
    size = struct.calcsize(fmt)
    if offset < 0 or offset + size > len(data):
        raise CubinError(f"cubin: {what} at byte {offset} lies outside the file ({len(data)} bytes)")
    return struct.unpack_from(fmt, data, offset)


def _elf_sections(data: bytes) -> tuple[list[tuple[int, ...]], list[str]]:
    """The section headers (name, type, offset, size, link, info, entsize) and their names."""
    if data[:4] != ELF_MAGIC:
        raise CubinError("not a cubin (no ELF magic)")
    if len(data) < 64 or data[4] != 2 or data[5] != 1:
        raise CubinError("not a 64-bit little-endian ELF file")
    (shoff,) = _u("<Q", data, 0x28, "e_shoff")
    shentsize, shnum, shstrndx = _u("<HHH", data, 0x3A, "section header counts")
    if shentsize < 64 or shnum > 65535 or shstrndx >= shnum:
        raise CubinError("cubin: invalid section header table")
    sections = []
    for i in range(shnum):
        name, kind, _, _, offset, size, link, info, _, entsize = _u(
            "<IIQQQQIIQQ", data, shoff + i * shentsize, f"section header {i}"
        )
        if kind != 8 and offset + size > len(data):  # 8: SHT_NOBITS occupies no file bytes
            raise CubinError(f"cubin: section {i} runs past the end of the file")
        sections.append((name, kind, offset, size, link, info, entsize))
    strtab = sections[shstrndx]

    def section_name(offset: int) -> str:
        start = strtab[2] + offset
        end = data.find(b"\0", start, strtab[2] + strtab[3])
        if start >= len(data) or end < 0:
            raise CubinError("cubin: section name outside the string table")
        return data[start:end].decode("utf-8", "replace")

    return sections, [section_name(s[0]) for s in sections]


def parse_cubin(data: bytes) -> CubinInfo:
    """Read a cubin's architecture, kernels and globals; CubinError when it is not a valid ELF64 cubin."""
    sections, names = _elf_sections(data)
    (flags,) = _u("<I", data, 0x30, "e_flags")
    symbols = _symbol_names(data, sections, names)
    kernels: dict[str, KernelInfo] = {}
    for name, (_, _, offset, size, _, _, _) in zip(names, sections):
        if name.startswith(".nv.info."):
            kernel = KernelInfo(name[len(".nv.info.") :])
            _read_kernel_attributes(data[offset : offset + size], kernel)
            kernels[kernel.name] = kernel
    for name, (_, _, _, size, _, _, _) in zip(names, sections):
        if name.startswith(".nv.shared.") and name[len(".nv.shared.") :] in kernels:
            kernels[name[len(".nv.shared.") :]].static_shared_memory = size
    if ".nv.info" in names:
        i = names.index(".nv.info")
        for attr, value in _attributes(data[sections[i][2] : sections[i][2] + sections[i][3]]):
            if attr == _EIATTR_REGCOUNT and len(value) >= 8:
                symbol, registers = struct.unpack_from("<II", value)
                if symbol < len(symbols) and symbols[symbol] in kernels:
                    kernels[symbols[symbol]].registers = registers
    # CUDA's ELF ABI version 8 moved the SM number from the low byte of e_flags to the next one
    arch = (flags >> 8) & 0xFF if data[8] >= 8 else flags & 0xFF
    return CubinInfo(
        arch=arch, kernels=kernels, variables=_variables(data, sections, names), symbols=frozenset(symbols)
    )


def module_variables(data: bytes) -> list[Variable]:
    """The globals a cubin defines (``__device__`` and ``__constant__`` variables), read from its
    symbol table alone: the recorder asks this of every image the driver loads, so a library's
    large cubins cost one vectorised pass over their symbols. CubinError when it is no cubin."""
    sections, names = _elf_sections(data)
    return _variables(data, sections, names)


def _is_variable_section(name: str) -> bool:
    """Whether a section holds module globals: ``.nv.global`` (``__device__``, zeroed),
    ``.nv.global.init`` (initialised) and the user's constant bank ``.nv.constant3``
    (``__constant__``); the other banks hold parameters and the compiler's own constants."""
    return name.startswith(".nv.global") or name == ".nv.constant3"


def _symbol_table(sections: list[tuple[int, ...]], names: list[str]) -> tuple[int, int, tuple[int, ...]] | None:
    """(offset, entry count, string table section) of ``.symtab``, or None."""
    if ".symtab" not in names:
        return None
    _, kind, offset, size, link, _, entsize = sections[names.index(".symtab")]
    if kind == 8 or entsize != _SYMBOL.itemsize or link >= len(sections):  # (_elf_sections bounded the others)
        return None
    return offset, size // entsize, sections[link]


def _symbol_name(data: bytes, strings: tuple[int, ...], name: int) -> str:
    start = strings[2] + name
    end = data.find(b"\0", start, strings[2] + strings[3])
    return data[start:end].decode("utf-8", "replace") if 0 <= start < len(data) and end >= 0 else ""


def _symbol_names(data: bytes, sections: list[tuple[int, ...]], names: list[str]) -> list[str]:
    table = _symbol_table(sections, names)
    if table is None:
        return []
    offset, count, strings = table
    entries = np.frombuffer(data, dtype=_SYMBOL, count=count, offset=offset)
    return [_symbol_name(data, strings, int(name)) for name in entries["name"]]


def _variables(data: bytes, sections: list[tuple[int, ...]], names: list[str]) -> list[Variable]:
    table = _symbol_table(sections, names)
    if table is None:
        return []
    offset, count, strings = table
    wanted = [i for i, name in enumerate(names) if _is_variable_section(name)]
    if not wanted:
        return []
    entries = np.frombuffer(data, dtype=_SYMBOL, count=count, offset=offset)
    chosen = entries[
        ((entries["info"] & 0xF) == _STT_OBJECT) & (entries["size"] > 0) & np.isin(entries["section"], wanted)
    ]
    found = []
    for e in chosen.tolist():
        name, size = _symbol_name(data, strings, e[0]), e[5]
        if name:
            found.append(Variable(name, size, _initial(data, sections[e[3]], e[4], size)))
    return found


def _initial(data: bytes, section: tuple[int, ...], value: int, size: int) -> bytes | None:
    """The bytes a load gives a variable at ``value`` in ``section``: zeros in a NOBITS section,
    else the section's own (None past INITIAL_BYTES, or outside the section)."""
    _, kind, offset, length, _, _, _ = section
    if size > INITIAL_BYTES or value + size > length:
        return None
    return bytes(size) if kind == 8 else data[offset + value : offset + value + size]


def _attributes(body: bytes) -> list[tuple[int, bytes]]:
    out = []
    pos = 0
    while pos + 2 <= len(body):
        fmt, attr = body[pos], body[pos + 1]
        if fmt == _EIFMT_SVAL:
            (size,) = _u("<H", body, pos + 2, "attribute size")
            value, pos = body[pos + 4 : pos + 4 + size], pos + 4 + size
        elif fmt == _EIFMT_HVAL:
            value, pos = body[pos + 2 : pos + 4], pos + 4
        elif fmt == _EIFMT_BVAL:  # one byte of value, padded to two
            value, pos = body[pos + 2 : pos + 3], pos + 4
        elif fmt == _EIFMT_NVAL:  # no value, but the entry still takes four bytes
            value, pos = b"", pos + 4
        elif fmt == 0 and not any(body[pos:]):
            break  # zero padding at the end of the section
        else:
            raise CubinError(f"cubin: unknown .nv.info attribute format {fmt}")
        out.append((attr, value))
    return out


def _read_kernel_attributes(body: bytes, kernel: KernelInfo) -> None:
    params: dict[int, tuple[int, int]] = {}
    for attr, value in _attributes(body):
        if attr == _EIATTR_KPARAM_INFO and len(value) >= 12:
            _, ordinal, offset, flags = struct.unpack_from("<IHHI", value)
            params[ordinal] = (offset, flags >> 18)
        elif attr == _EIATTR_CBANK_PARAM_SIZE and len(value) >= 2:
            (kernel.parameter_size,) = struct.unpack_from("<H", value)
        elif attr == _EIATTR_MAX_THREADS and len(value) >= 12:
            kernel.max_threads = struct.unpack_from("<III", value)
    kernel.parameters = [params[k] for k in sorted(params)]


def detect_format(data: bytes) -> str:
    """'cubin', 'fatbin' or 'ptx', from the bytes themselves."""
    if data[:4] == ELF_MAGIC:
        return "cubin"
    if len(data) >= 4 and struct.unpack_from("<I", data)[0] == FATBIN_MAGIC:
        return "fatbin"
    head = data[:4096].decode("ascii", "replace")
    if ".version" in head or ".target" in head or ".entry" in data.decode("ascii", "replace"):
        return "ptx"
    raise CubinError("unrecognised executable format (expected a cubin, fatbin or PTX file)")
