"""Which 8-byte words of a kernel's parameter block can be pointers.

Kernels take structs by value (cuBLAS's and CUTLASS's parameter structs hold pointers among
integer fields; PyTorch's foreach kernels take a TensorListMetadata of up to 110 tensor
addresses), so every aligned word that points into a device allocation is a relocation
candidate. Three kinds of word inside a struct are not taken at face value:

- **Two integers.** A word whose low half is a small signed 32-bit integer (or INT32_MIN) and
  whose high half is under 2**12 (an address under 16 TiB) is two integer fields: XLA's arena of
  tens of GB spans many 4 GiB boundaries from 0x3_0000_0000 up, and holds the address of every
  pair (small int, boundary >> 32); relocating such a pair corrupts the struct.
- **Maybe data beside a stale half.** Up at the driver's ordinary addresses (0x7fxx_xxxx_xxxx) a
  word may be a 4-byte field whose other half (padding, or an unused neighbour) still holds the
  high half of a pointer the caller's stack held before: an int32 (TensorListMetadata's last
  field ``int start_tensor_this_launch``, and the unused tail of its block_to_chunk array, read
  as (1, 0x7f28)), or a float (dropout's backward takes its scale 1/(1-p) = 0x3f8e38e4 beside
  padding that reads 0x7f04). Where an allocation happens to cover the value, relocating it
  corrupts the field, and the replay faults or computes every result wrong. Such a word is also
  often a real pointer: a tensor within 64 KiB of a 4 GiB boundary has a small low half (a
  foreach optimizer step's tensors on a segment just below one; a GEMM's output at the start of
  a segment on one), and a tensor's address may read as a float. So a small int up high is
  relocated as a pointer into device memory all the same: it lands within 64 KiB of a 4 GiB
  boundary, and replay places every device buffer there at its recorded address modulo 4 GiB
  (replay/buffers.py), so relocating it moves only the stale half and a field keeps its value.
  A word that may be data (:func:`maybe_data`: a low half that reads as a plausible float and is
  not 8-byte aligned, or a small low half into host memory or a module's globals, which replay
  does not place) is a pointer only into an allocation the capture already holds or that the
  same launch reaches through another word; the translator decides. An 8-byte aligned word that
  reads as a float is a pointer wherever it lands: tensors start on round addresses (1.0, 2.0
  read as 0x3f80_0000, 0x4000_0000).
- **Unaligned in an arena.** A word into an arena (4 GiB or more) that is not 8-byte aligned is
  data: cuDNN's sm_90 convolution kernels take a 2.9 KB struct holding 64-bit division magic
  numbers (0x4_9249_2493, 0x3_E38E_38E4) and TMA descriptor fields (0x4_0005_63c3) that fall
  inside a tens-of-GB arena, and relocating them makes the kernel run an illegal instruction.
  The tensors a struct points at in an arena are 8-byte aligned (XLA aligns its buffers); the
  rule asks no more than 8, because a 16-byte rule leaves real pointers of JAX's optimizer steps
  unrelocated.

The price: a pointer inside a struct within 64 KiB of a 4 GiB boundary below 16 TiB, or 2 GiB
past one, or into an arena and not 8-byte aligned, or one that may be data (as above) into an
allocation nothing else reaches, stays as captured unless it is an allocation's start (a
pointer-sized parameter is always relocated). A float field beside a stale half is still
taken for a pointer where it lands in an allocation: an unaligned one where the capture holds
that allocation (likeliest in large ones: expandable segments, arenas high up), an aligned one
(dropout's scale 2.0 at p = 0.5, 1.25 at p = 0.2) wherever it lands; so is an integer of 2**16
or more beside one: the recorder's self-check replays and verifies the file, and says so when
that goes wrong. A small int beside a stale half makes the capture hold the allocation it lands
in (a snapshot of its live bytes, refused like any other over ``--max-snapshot-gib`` where no
framework says which bytes are live), though nothing else may use it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from replayfmt.capture.allocations import Allocation
from replayfmt.format import model as m
from replayfmt.format.boundaries import small_low_half  # the window is the format's (replay places buffers by it)

# A high half under this reads as a count or a dimension (an address under 16 TiB, where XLA's
# arena lies); the driver's own allocations lie far above it.
SMALL_HIGH_HALF = 1 << 12
_WORD = 8


def integer_pair(word: int) -> bool:
    """Whether ``word`` reads as two 32-bit integer fields: a small low half
    (:func:`small_low_half`) and a high half under :data:`SMALL_HIGH_HALF`."""
    return word >> 32 < SMALL_HIGH_HALF and small_low_half(word)


def start_is_pointer(word: int) -> bool:
    """Whether a word equal to an allocation's start is a pointer, whatever else it may read as:
    all but a zero low half up high (an int32 zero beside a stale half, where an allocation starts
    on a 4 GiB boundary)."""
    return bool(word & 0xFFFFFFFF) or word >> 32 < SMALL_HIGH_HALF


_STRUCT_POINTER_ALIGNMENT = 8
_FLOAT_EXPONENTS = (127 - 20, 127 + 20)  # biased exponents of a plausible float's magnitude


def plausible_float(low: int) -> bool:
    """Whether 32 bits read as a float of magnitude in [2**-20, 2**21): a scale or a constant
    (a pointer's low half falls there about one time in six)."""
    return _FLOAT_EXPONENTS[0] <= (low >> 23) & 0xFF <= _FLOAT_EXPONENTS[1]


def maybe_data(word: int, *, low_half_kept: bool) -> bool:
    """Whether a struct word that is no integer pair may still be a 4-byte field beside the stale
    high half of a pointer, and relocating it would change that field: a low half that reads as
    a plausible float (:func:`plausible_float`) and is not 8-byte aligned, as a tensor's address
    usually is; or a small low half, unless ``low_half_kept``: it lies within 64 KiB of a 4 GiB
    boundary, where replay places each device buffer (not host memory, nor a module's globals)
    at its recorded address modulo 4 GiB (replay/buffers.py), so that relocating the word into
    one moves only its stale half and a field keeps its value. A round float (1.0, 2.0: low 16
    bits zero) is no evidence: tensors start on such addresses, and leaving a kernel's output
    unrelocated because it lies in an allocation nothing reached yet makes the replay fault
    (cuDNN's convolution structs hold such outputs)."""
    if small_low_half(word):
        return not low_half_kept
    return plausible_float(word & 0xFFFFFFFF) and word % _STRUCT_POINTER_ALIGNMENT != 0


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


class ParameterPointers(NamedTuple):
    """The pointers a launch's parameter block holds: ``relocations``, the allocations they
    reach (``targets``), and the allocations of words that may be data left as captured
    because nothing else reached them (``unsettled``: once the capture holds one, the same
    arguments resolve otherwise)."""

    relocations: tuple[m.Relocation, ...]
    targets: list[Allocation]
    unsettled: tuple[Allocation, ...] = ()
