"""Equal rows of a record batch's tables found in bulk: the plan checks each distinct operation
once (replayfmt.container.batches.distinct_operations folds the rest onto it)."""

from __future__ import annotations

import numpy as np


def distinct_launches(launches: np.ndarray, relocations: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``distinct_rows`` of a batch's launch table by everything but their index, where their
    parameter bytes lie and their values: relocations compared by content (each launch has its
    own rows in ``relocations``)."""
    words = launches.view("<u4").reshape(-1, 18)
    base = np.delete(words, [14, 16], axis=1)  # not the parameter offset, not the first relocation
    table = relocations.view(np.uint8).reshape(len(relocations), relocations.dtype.itemsize)
    counts = words[:, 17]
    firsts, sizes = [], []
    for c in np.unique(counts).tolist():  # one gather per relocation count (a few)
        rows = np.flatnonzero(counts == c)
        key = base[rows].view(np.uint8).reshape(len(rows), -1)
        if c:
            where = words[rows, 16][:, None].astype(np.int64) + np.arange(c)
            key = np.hstack([key, table[where].reshape(len(rows), -1)])
        js, n = distinct_rows(np.ascontiguousarray(key))
        firsts.append(rows[js])
        sizes.append(n)
    first, size = np.concatenate(firsts), np.concatenate(sizes)
    order = np.argsort(first)
    return first[order], size[order]


def distinct_rows(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first row of each distinct row of ``keys``, in row order; how many rows equal it).

    Rows are told apart by a 64-bit hash of their words, which numpy sorts several times faster
    than rows of bytes; every row is then compared with the first of its hash's group, and rows
    that collide (any row unequal to its group's first) are sorted as bytes instead: exact
    either way."""
    n = len(keys)
    raw = keys.view(np.uint8).reshape(n, keys.dtype.itemsize * keys.shape[1])
    if raw.shape[1] % 8:
        raw = np.hstack([raw, np.zeros((n, -raw.shape[1] % 8), np.uint8)])
    words = raw.view("<u8")
    key = np.full(n, _HASH_SEED, dtype=np.uint64)
    for j in range(words.shape[1]):  # every word mixed in on its own: rows alike in a sum or xor differ
        key ^= words[:, j]
        key *= _HASH_MULTIPLIER
        key ^= key >> np.uint64(29)
    _, first, inverse, counts = np.unique(key, return_index=True, return_inverse=True, return_counts=True)
    if not bool((words == words[first[inverse]]).all()):
        rows = raw.view(np.dtype((np.void, raw.shape[1]))).ravel()  # a collision: sorted as bytes
        _, first, counts = np.unique(rows, return_index=True, return_counts=True)
    order = np.argsort(first)
    return first[order], counts[order]


_HASH_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)  # odd: multiplying by it loses no bits
_HASH_SEED = np.uint64(0xCBF29CE484222325)
