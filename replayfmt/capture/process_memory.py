"""Reads of this process's own memory by address: driver parameter structs, kernel arguments,
code images handed to the driver.

Callbacks run on the program's launch path, so reads must be cheap: one memoryview spans the
whole user address space and ``struct.unpack_from`` / slicing read it in place, about three
times faster than ``ctypes.string_at`` plus ``struct.unpack``. Like any raw read, an address that
is not mapped crashes the process: only addresses the driver was given are read.
"""

from __future__ import annotations

import ctypes
import struct

# 2**56 bytes: above any user-space address with 4- or 5-level paging. Nothing is touched until read.
MEMORY = memoryview((ctypes.c_ubyte * (1 << 56)).from_address(0)).cast("B")

_FATBIN_MAGIC = 0xBA55ED50
_FATBIN_WRAPPER_MAGIC = 0x466243B1
_MAX_IMAGE = 1 << 30
_Q = struct.Struct("<Q")
_I = struct.Struct("<I")


def u64(address: int) -> int:
    """The little-endian 8-byte word at ``address``."""
    return _Q.unpack_from(MEMORY, address)[0]


def read(address: int, size: int) -> bytes:
    """A copy of ``size`` bytes at ``address``."""
    return MEMORY[address : address + size].tobytes()


def c_string(address: int) -> str:
    """The NUL-terminated UTF-8 string at ``address`` ("" for NULL)."""
    return ctypes.string_at(address).decode("utf-8", "replace") if address else ""


def image_bytes(address: int) -> bytes:
    """The bytes of a code image given to the driver in memory: a cubin (ELF), a fatbin (or the
    runtime's fatbin wrapper around one) or NUL-terminated PTX."""
    head = read(address, 64)
    if head[:4] == b"\x7fELF":
        phoff, shoff = struct.unpack_from("<QQ", head, 0x20)
        phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", head, 0x36)
        size = max(shoff + shentsize * shnum, phoff + phentsize * phnum)
        if not 64 <= size <= _MAX_IMAGE:
            raise ValueError(f"ELF image at {address:#x} claims {size} bytes")
        return read(address, size)
    magic = _I.unpack_from(head)[0]
    if magic == _FATBIN_WRAPPER_MAGIC:
        return image_bytes(_Q.unpack_from(head, 8)[0])
    if magic == _FATBIN_MAGIC:
        header_size = struct.unpack_from("<H", head, 6)[0]
        size = header_size + _Q.unpack_from(head, 8)[0]
        if not 16 <= size <= _MAX_IMAGE:
            raise ValueError(f"fatbin image at {address:#x} claims {size} bytes")
        return read(address, size)
    return ctypes.string_at(address)  # PTX text
