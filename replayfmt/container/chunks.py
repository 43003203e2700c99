"""Chunk-level access to an open .kreplay file: each chunk's header read and bounds-checked, its
body checksummed and decompressed within the file's expansion budget, and FlatBuffer bodies
decoded by the verifying decoder. Everything a damaged or hostile chunk can do ends here in one
ReplayFormatError naming the offset and the record."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from replayfmt.container.bounded import BoundedFile, ExpansionBudget
from replayfmt.errors import ReplayFormatError
from replayfmt.format.decoder import decode_buffer
from replayfmt.format.layout import (
    CHUNK_HEADER_SIZE,
    FILE_HEADER_SIZE,
    ChunkHeader,
    ChunkKind,
    Limits,
    checksum64,
    unpack_chunk_header,
)
from replayfmt.format.payloads import decompress


class ChunkReader:
    """Reads chunks of ``file`` (which it does not own) under ``limits``."""

    def __init__(self, file: BoundedFile, path: str, limits: Limits) -> None:
        self.file = file
        self.path = path
        self.limits = limits
        self.size = file.size
        self._expansion = ExpansionBudget(limits, file.size)

    def error(self, message: str, offset: int | None = None, record: str | None = None) -> ReplayFormatError:
        return ReplayFormatError(message, path=self.path, offset=offset, record=record)

    def header(self, offset: int, record: str) -> ChunkHeader:
        """The chunk header at ``offset``, its body checked to lie inside the file."""
        if offset < FILE_HEADER_SIZE or offset % 8 or offset + CHUNK_HEADER_SIZE > self.size:
            raise self.error("offset is outside the file or misaligned", offset, record)
        header = unpack_chunk_header(self.file.read(offset, CHUNK_HEADER_SIZE, record), offset, self.path)
        if header.body_offset + header.stored_size > self.size:
            raise self.error(
                f"body of {header.stored_size} bytes runs past the end of the file ({self.size} bytes)",
                offset,
                record,
            )
        return header

    def body(self, header: ChunkHeader, limit: int, record: str) -> bytes | memoryview:
        """The chunk's body, checksummed and decompressed (at most ``limit`` logical bytes)."""
        if header.logical_size > limit:
            raise self.error(
                f"declares {header.logical_size} bytes, over the limit of {limit} ({self._remedy(limit)})",
                header.offset,
                record,
            )
        if header.codec and header.kind != ChunkKind.FRAME:  # a frame goes into a buffer its payload took
            why = self._expansion.admit(header.offset, header.stored_size, header.logical_size)
            if why:
                raise self.error(f"{why} ({self._remedy(self.limits.max_expansion)})", header.offset, record)
        stored = self.file.read(header.body_offset, header.stored_size, record)
        if checksum64(stored) != header.body_checksum:
            raise self.error("body checksum mismatch (the file is corrupted)", header.offset, record)
        return decompress(
            header.codec, stored, header.logical_size, path=self.path, offset=header.offset, record=record
        )

    def check_body(self, header: ChunkHeader) -> None:
        """The body's checksum holds (frames, whose bodies are read later, when a payload is)."""
        stored = self.file.read(header.body_offset, header.stored_size, "FRAME chunk")
        if checksum64(stored) != header.body_checksum:
            raise self.error("chunk body checksum mismatch", header.offset)

    def _remedy(self, limit: int) -> str:
        """How to read a trusted file past ``limit``: the tools' flag, naming the limit where only
        one of the Limits has that value."""
        names = [f.name for f in fields(self.limits) if getattr(self.limits, f.name) == limit]
        flag = f"--limit {names[0]}=N" if len(names) == 1 else "--limit NAME=N"
        return f"to read a trusted file, raise it: {flag}, or replayfmt.Limits"

    def decode_body(self, body: bytes, root: str, offset: int, record: str) -> dict[str, Any]:
        """A chunk body decoded as the FlatBuffer table ``root`` (verified, within the budget)."""
        limits = self.limits
        return decode_buffer(
            body, root, max_depth=limits.max_depth, limits=limits, path=self.path, offset=offset, record=record
        )

    def read(self, offset: int, kind: ChunkKind, limit: int) -> bytes:
        """The body of the chunk at ``offset``, which must be of ``kind``: checksummed and
        decompressed (at most ``limit`` logical bytes)."""
        record = f"{kind.name} chunk"
        header = self.header(offset, record)
        if header.kind != kind:
            raise self.error(f"expected a {record}, found chunk kind {header.kind}", offset)
        return bytes(self.body(header, limit, record))

    def decode(self, offset: int, kind: ChunkKind, root: str, limit: int) -> dict[str, Any]:
        """The chunk at ``offset``, which must be of ``kind``, decoded as ``root``."""
        return self.decode_body(self.read(offset, kind, limit), root, offset, f"{kind.name} chunk")
