"""Which 8-byte words of a kernel's parameter block can be pointers.

Kernels take structs by value (cuBLAS's and CUTLASS's parameter structs hold pointers among
integer fields), so every aligned word that points into a device allocation is a relocation
candidate. Inside a struct, a word whose low half is a small signed 32-bit integer is taken for
two integer fields: an allocation that spans a 4 GiB boundary (XLA's arena of tens of GB spans
many, from 0x3_0000_0000 up) holds the address of every pair (small int, boundary >> 32), and
relocating such a pair corrupts the struct. Nor is a word into such an arena (4 GiB or more)
that is not 8-byte aligned: cuDNN's sm_90 convolution kernels take a 2.9 KB struct holding 64-bit
division magic numbers (0x4_9249_2493, 0x3_E38E_38E4) and TMA descriptor fields (0x4_0005_63c3)
that fall inside a 38 GB arena, and relocating them made the replay fault (an illegal
instruction, seen on the H100 in a flax step); the tensors a struct points at in an arena are
aligned (XLA aligns its buffers). 16 bytes was too strict: a JAX optax step's replay computed
wrong values with it, and verified with 8. The price: a pointer inside a struct to within 64 KiB
of a 4 GiB boundary, or to 2 GiB past one, or into an arena and not 8-byte aligned, stays as
captured unless it is an allocation's start (a pointer-sized parameter is always relocated).
"""

from __future__ import annotations

from collections.abc import Iterable

_SMALL_INT = 1 << 16
_INT32_MIN = 0x80000000
_WORD = 8


def integer_pair(word: int) -> bool:
    """Whether ``word``'s low 32 bits read as a signed integer of magnitude under 2**16, or as
    INT32_MIN (a sentinel: cuBLAS's sm_90 GEMMs hold (INT32_MIN, n) pairs)."""
    low = word & 0xFFFFFFFF
    signed = low - (1 << 32) if low >= _INT32_MIN else low
    return -_SMALL_INT < signed < _SMALL_INT or low == _INT32_MIN


_STRUCT_POINTER_ALIGNMENT = 8
# Allocations this large (JAX's arena: tens of GB) hold so many addresses that numbers land in
# them; a struct's pointer into one must be aligned. Into smaller ones (PyTorch's segments) any
# pointer counts: its elementwise kernels take Array<char*, N> by value, a view's pointer 8 bytes
# into its storage.
ARENA_SIZE = 1 << 32


def not_a_struct_pointer(word: int, allocation_size: int) -> bool:
    """Whether a word inside a by-value struct is taken for data even where it points into an
    allocation of ``allocation_size`` bytes: two integer fields (:func:`integer_pair`), or, in an
    arena (:data:`ARENA_SIZE` or more), not 8-byte aligned."""
    unaligned = word % _STRUCT_POINTER_ALIGNMENT != 0 and allocation_size >= ARENA_SIZE
    return unaligned or integer_pair(word)


def struct_words(layout: Iterable[tuple[int, int]]) -> frozenset[int]:
    """Offsets of the aligned words inside parameters larger than a pointer (a 128-byte one may be
    a tensor map instead, whose first word is its global address: the caller decides that from
    the word itself)."""
    return frozenset(
        site
        for offset, size in layout
        if size > _WORD
        for site in range(-(-offset // _WORD) * _WORD, offset + size - _WORD + 1, _WORD)
    )
