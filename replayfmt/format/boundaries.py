"""Where a 4-byte field beside the stale high half of an old pointer lands, as an address.

A struct passed by value may hold a small int (or INT32_MIN) in the low half of an 8-byte word
whose high half is padding that still holds a pointer's high half: read as one word, it is an
address within 64 KiB of a 4 GiB boundary (or 2 GiB past one). A recorder cannot always tell
such a word from a pointer, and relocates both into device memory; a replayer places each
device buffer whose recorded range comes that close to a boundary at its recorded address
modulo 4 GiB (docs/FORMAT.md, "Relocations"), so that patching the word changes only its high
half. The recorder's rule (capture/parameter_words.py) and the replayer's placement
(replay/buffers.py) both read the window from here.
"""

from __future__ import annotations

import numpy as np

SMALL_INT = 1 << 16  # an integer of smaller magnitude is "small"
INT32_MIN = 0x80000000  # a sentinel: cuBLAS's sm_90 GEMMs hold (INT32_MIN, n) pairs
BOUNDARY = 1 << 32  # a pointer's high half changes every 4 GiB


def small_low_half(word: int) -> bool:
    """Whether ``word``'s low 32 bits read as a signed integer of magnitude under 2**16, or as
    INT32_MIN."""
    low = word & 0xFFFFFFFF
    signed = low - BOUNDARY if low >= INT32_MIN else low
    return -SMALL_INT < signed < SMALL_INT or low == INT32_MIN


def small_low_halves(words: np.ndarray) -> np.ndarray:
    """:func:`small_low_half` of each of ``words`` (uint64)."""
    low = (words & np.uint64(0xFFFFFFFF)).astype(np.int64)
    signed = np.where(low >= INT32_MIN, low - BOUNDARY, low)
    return ((signed > -SMALL_INT) & (signed < SMALL_INT)) | (low == INT32_MIN)


def near_boundary(address: int, size: int) -> bool:
    """Whether the recorded range [address, address + size) holds an address whose low half is
    small (:func:`small_low_half`): one within 64 KiB of a 4 GiB boundary, or INT32_MIN's place
    2 GiB past one. False for a buffer without a recorded address."""
    if not address:
        return False
    # a small int n lands at boundary + n, |n| < 64 KiB: the window [boundary - 65535, boundary + 65536)
    boundary = ((address - SMALL_INT) // BOUNDARY + 1) * BOUNDARY  # the first one whose window ends past address
    # INT32_MIN lands at boundary + 2 GiB: the first such address at or after ``address``
    sentinel = -(-(address - INT32_MIN) // BOUNDARY) * BOUNDARY + INT32_MIN
    return address + size > boundary - SMALL_INT + 1 or address + size > sentinel
