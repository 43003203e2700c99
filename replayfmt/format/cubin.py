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

from replayfmt.errors import ReplayUsageError

ELF_MAGIC = b"\x7fELF"
FATBIN_MAGIC = 0xBA55ED50

_EIFMT_NVAL, _EIFMT_BVAL, _EIFMT_HVAL, _EIFMT_SVAL = 1, 2, 3, 4
_EIATTR_MAX_THREADS = 0x05
_EIATTR_PARAM_CBANK = 0x0A
_EIATTR_KPARAM_INFO = 0x17
_EIATTR_CBANK_PARAM_SIZE = 0x19
_EIATTR_REGCOUNT = 0x2F


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


@dataclass
class CubinInfo:
    arch: int  # e.g. 90 for sm_90
    kernels: dict[str, KernelInfo]


def _u(fmt: str, data: bytes, offset: int, what: str) -> tuple[int, ...]:
    size = struct.calcsize(fmt)
    if offset < 0 or offset + size > len(data):
        raise CubinError(f"cubin: {what} at byte {offset} lies outside the file ({len(data)} bytes)")
    return struct.unpack_from(fmt, data, offset)


def parse_cubin(data: bytes) -> CubinInfo:
    """Read a cubin's architecture and kernels; CubinError when it is not a valid ELF64 cubin."""
    if data[:4] != ELF_MAGIC:
        raise CubinError("not a cubin (no ELF magic)")
    if len(data) < 64 or data[4] != 2 or data[5] != 1:
        raise CubinError("not a 64-bit little-endian ELF file")
    (flags,) = _u("<I", data, 0x30, "e_flags")
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

    names = [section_name(s[0]) for s in sections]
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
    return CubinInfo(arch=arch, kernels=kernels)


def _symbol_names(data: bytes, sections: list[tuple[int, ...]], names: list[str]) -> list[str]:
    if ".symtab" not in names:
        return []
    _, _, offset, size, link, _, entsize = sections[names.index(".symtab")]
    if entsize < 24 or link >= len(sections):
        return []
    strings = sections[link]
    out = []
    for k in range(size // entsize):
        (name,) = _u("<I", data, offset + k * entsize, "symbol")
        start = strings[2] + name
        end = data.find(b"\0", start, strings[2] + strings[3])
        out.append(data[start:end].decode("utf-8", "replace") if 0 <= start < len(data) and end >= 0 else "")
    return out


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
