"""Reading a capture's bytes without trusting the file to stay put.

The reader reads through ``pread`` into buffers it owns instead of touching a memory mapping: a
mapped file that another process truncates kills the reader with SIGBUS (exit 135, no message),
while a short ``pread`` is an ordinary one-line ReplayFormatError naming the offset. Every read is
bounded by a size the caller has already checked against ``Limits``.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable

import numpy as np

from replayfmt.errors import ReplayFormatError, ReplayUsageError
from replayfmt.format.layout import (
    ALIGNMENT,
    CHUNK_HEADER_SIZE,
    FILE_HEADER_SIZE,
    KNOWN_CHUNK_KINDS,
    ChunkFlags,
    ChunkHeader,
    Limits,
)


class BoundedFile:
    """A regular file opened read-only, read by offset; ``size`` is its size when opened."""

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            raise ReplayUsageError(f"{path}: no such file") from None
        except IsADirectoryError:
            raise ReplayUsageError(f"{path}: is a directory, not a .kreplay file") from None
        except OSError as exc:
            raise ReplayUsageError(f"{path}: cannot open ({exc.strerror})") from None
        try:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                raise ReplayUsageError(f"{path}: is a directory, not a .kreplay file")
            if not stat.S_ISREG(st.st_mode):
                raise ReplayUsageError(f"{path}: not a regular file")
            if st.st_size < FILE_HEADER_SIZE:
                raise ReplayFormatError(
                    f"file is {st.st_size} bytes, too short for a .kreplay header", path=path, offset=0
                )
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        self.size = st.st_size

    def read(self, offset: int, size: int, record: str | None = None) -> bytes:
        """Exactly ``size`` bytes from ``offset`` (inside the size seen at open), or a one-line
        error when the file has shrunk since."""
        if size <= 0:
            return b""
        parts, done = [], 0
        while done < size:
            try:
                part = os.pread(self.fd, size - done, offset + done)
            except OSError as exc:
                raise ReplayFormatError(
                    f"cannot read {size} bytes ({exc.strerror})", path=self.path, offset=offset + done, record=record
                ) from None
            if not part:
                raise self._shrunk(offset, done, size, record)
            parts.append(part)
            done += len(part)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _shrunk(self, offset: int, done: int, want: int, record: str | None) -> ReplayFormatError:
        return ReplayFormatError(
            f"the file ends at offset {offset + done}, short of {want - done} bytes it held when opened "
            "(it shrank while it was read)",
            path=self.path,
            offset=offset,
            record=record,
        )

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class ChunkGaps:
    """The chunks an index does not list, checked as FORMAT.md §3.2 demands: a strict reader
    fails on an unknown kind without the OPTIONAL flag, wherever it lies.

    The index gives every chunk's start, and the end of frames; an end that is not the start of
    a listed chunk opens a gap, walked header by header (each chunk at least 64 bytes, each
    offset walked once) to the next listed start. A writer of this version leaves no gaps.
    """

    def __init__(
        self,
        frames: np.ndarray,
        batch_offsets: list[int],
        metadata_offset: int,
        index_offset: int,
        file_size: int,
        header_at: Callable[[int, str], ChunkHeader],
        path: str,
    ) -> None:
        self.path = path
        offsets = frames["offset"].astype(np.int64)
        self.starts = np.unique(
            np.concatenate((offsets, batch_offsets, [metadata_offset, index_offset])).astype(np.int64)
        )
        ends = offsets + CHUNK_HEADER_SIZE + frames["stored_size"].astype(np.int64)
        self.frame_ends = (ends + ALIGNMENT - 1) & ~(ALIGNMENT - 1)
        self.size = file_size
        self.header_at = header_at
        self.walked: set[int] = set()

    def check(self, *known_ends: int) -> None:
        """Walk every gap after a frame and after the given chunk ends."""
        ends = np.concatenate((self.frame_ends, np.array(known_ends, dtype=np.int64)))
        for end in ends[~np.isin(ends, self.starts)].tolist():
            self.walk(end)

    def walk(self, offset: int) -> None:
        """Walk the unlisted chunks from ``offset`` to the next listed one."""
        while offset < self.size and offset not in self.walked:
            i = int(np.searchsorted(self.starts, offset))
            if i < len(self.starts) and self.starts[i] == offset:
                return
            self.walked.add(offset)
            header = self.header_at(offset, "chunk not in the index")
            if header.kind not in KNOWN_CHUNK_KINDS and not header.flags & ChunkFlags.OPTIONAL:
                raise ReplayFormatError(
                    f"unknown chunk kind {header.kind} is not optional (a newer writer's; upgrade replayfmt)",
                    path=self.path,
                    offset=offset,
                )
            offset = header.end


class ExpansionBudget:
    """How far zstd may expand a file's FlatBuffers chunks (METADATA, RECORDS, INDEX), per chunk
    and per file: each chunk may declare at most ``max_expansion`` x its stored bytes +
    ``expansion_slack``, and all distinct chunks together at most ``max_expansion`` x the file's
    size + ``expansion_slack``, so that many small chunks each within the slack cannot add up to
    a bomb. Re-reading a chunk (the batch cache is small) costs nothing more."""

    def __init__(self, limits: Limits, file_size: int) -> None:
        self.limits = limits
        self.left = limits.max_expansion * file_size + limits.expansion_slack
        self.file_size = file_size
        self.seen: set[int] = set()
        self.lock = threading.Lock()

    def admit(self, offset: int, stored: int, logical: int) -> str | None:
        """None when the chunk at ``offset`` may be decompressed, else why not."""
        why = self.limits.check_expansion(stored, logical)
        if why:
            return why
        with self.lock:
            if offset in self.seen:
                return None
            if logical > self.left:
                return (
                    f"the file's compressed chunks declare more than max_expansion x its {self.file_size} bytes "
                    "in all (a decompression bomb spread over many chunks?)"
                )
            self.left -= logical
            self.seen.add(offset)
        return None
