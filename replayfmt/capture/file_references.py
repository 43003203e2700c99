"""File references the recorder writes for bytes the program took from host files (mapped
weights, module images on disk), by the capture's file policy and validation."""

from __future__ import annotations

from collections.abc import Callable

from replayfmt.capture.options import RecordOptions
from replayfmt.container.files import file_digest, identity_of, read_blocks
from replayfmt.format import model as m
from replayfmt.writer import CaptureWriter


class FileReferences:
    """One ``FileReference`` object per (path, policy[, captured range]) written so far."""

    def __init__(self, writer: CaptureWriter, options: RecordOptions) -> None:
        self.writer = writer
        self.options = options
        self._written: dict[tuple[str, int], int] = {}  # (path, policy << 48 | payload) -> object id

    def for_copy(self, path: str, offset: int, size: int, read: Callable[[], bytes]) -> int:
        """A reference for ``size`` bytes the program copied from ``path`` at ``offset``; with the
        capture-ranges policy the bytes themselves (``read()``) are stored as that range."""
        policy = self.options.file_policy
        if policy == m.FilePolicy.CAPTURE_RANGES:
            payload = self.writer.add_payload(read())
            ranges = (m.FileRange(offset=offset, size=size, payload=payload),)
            return self.reference(path, policy, ranges=ranges, key_extra=payload)
        return self.reference(path, policy)

    def reference(
        self, path: str, policy: m.FilePolicy, *, ranges: tuple[m.FileRange, ...] = (), key_extra: int = 0
    ) -> int:
        """The object id of the reference to ``path`` under ``policy``, written on first use."""
        key = (path, int(policy) << 48 | key_extra)
        existing = self._written.get(key)
        if existing:
            return existing
        identity = identity_of(path)
        validation = self.options.file_validation
        digest = file_digest(path) if validation == m.FileValidation.DIGEST else None
        payload = 0
        if policy == m.FilePolicy.CAPTURE_ALL:  # a regular file only, and no more than it held when looked at
            payload = self.writer.add_payload(b"".join(read_blocks(path, identity["size"])))
        ref = self.writer.add_object(
            m.FileReference(
                path=path,
                policy=policy,
                validation=validation,
                digest=digest,
                ranges=ranges,
                payload=payload,
                **identity,
            )
        )
        self._written[key] = ref
        return ref
