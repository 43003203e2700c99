"""External file references: prefix remapping and identity/digest validation.

A capture may refer to files the program read (weights, modules) instead of storing them. On
replay their captured paths are remapped (``--file-remap=CAPTURED_PREFIX=NEW_PREFIX``, longest
prefix wins) and then validated before any byte is used: by identity (size, device, inode,
mtime) or by digest (XXH3-128 of the whole file).

A capture names host paths, and a capture is not trusted (docs/FORMAT.md §5.3): only regular
files are opened (never a device, FIFO or socket, checked on the open descriptor), reads stop at
the recorded size, a remapped path must stay inside the remap's target after normalisation, and
messages name what the capture recorded, never the size, digest or identity of the file found
on this host.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import xxhash

from replayfmt.errors import FileMismatchError, ReplayError, ReplayUsageError
from replayfmt.format.model import FilePolicy, FileReference, FileValidation
from replayfmt.format.payloads import hash_hex

_DIGEST_BLOCK = 8 << 20


@dataclass(frozen=True, slots=True)
class FileRemap:
    """Replace ``captured_prefix`` at the start of a captured path by ``new_prefix``."""

    captured_prefix: str
    new_prefix: str

    @classmethod
    def parse(cls, spec: str) -> FileRemap:
        """Parse ``CAPTURED_PREFIX=NEW_PREFIX`` (the ``--file-remap`` syntax)."""
        captured, sep, new = spec.partition("=")
        if not sep or not captured:
            raise ReplayUsageError(f"--file-remap {spec!r}: expected CAPTURED_PREFIX=NEW_PREFIX")
        return cls(captured, new)

    def matches(self, path: str) -> bool:
        prefix = self.captured_prefix
        if not path.startswith(prefix):
            return False
        # whole path components only: /data must not remap /database
        return len(path) == len(prefix) or prefix.endswith("/") or path[len(prefix)] == "/"


def remap_path(path: str, remaps: Iterable[FileRemap]) -> str:
    """Apply the remap whose captured prefix is the longest match (or none). A remapped path
    is normalised and must stay inside the remap's target: ``/data/../../etc/passwd`` under
    ``/data=/safe`` is refused (ReplayUsageError naming the flag)."""
    best: FileRemap | None = None
    for remap in remaps:
        if remap.matches(path) and (best is None or len(remap.captured_prefix) > len(best.captured_prefix)):
            best = remap
    if best is None:
        return path
    remapped = best.new_prefix + path[len(best.captured_prefix) :]
    normal = os.path.normpath(remapped)
    root = os.path.abspath(best.new_prefix or "/")  # compared absolute: NEW may be relative
    target = os.path.abspath(normal)
    if target != root and not target.startswith(root.rstrip("/") + "/"):
        raise ReplayUsageError(
            f"--file-remap {best.captured_prefix}={best.new_prefix}: the captured path {path} would leave "
            f"{os.path.normpath(best.new_prefix)} (it normalises to {normal}); refused"
        )
    return normal


def open_regular(path: str) -> int:
    """A read-only descriptor of ``path`` if it is a regular file (checked on the descriptor,
    so that nothing swapped in between counts); OSError otherwise. Opening a FIFO never blocks."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise IsADirectoryError(0, "not a regular file (a directory, device, FIFO or socket)")
        os.set_blocking(fd, True)
        return fd
    except BaseException:
        os.close(fd)
        raise


def read_blocks(path: str, size: int, block: int = _DIGEST_BLOCK) -> Iterator[bytes]:
    """The first ``size`` bytes of a regular file, block by block (never more, whatever the file
    holds now); fewer when the file is shorter. Raises OSError."""
    fd = open_regular(path)
    try:
        offset = 0
        while offset < size and (data := os.pread(fd, min(block, size - offset), offset)):
            offset += len(data)
            yield data
    finally:
        os.close(fd)


def read_reference(path: str, size: int) -> bytes:
    """Exactly ``size`` bytes of the regular file ``path`` (ReplayError when it is shorter)."""
    try:
        data = b"".join(read_blocks(path, size))
    except OSError as exc:
        raise ReplayError(f"cannot read {path}: {exc.strerror}") from None
    if len(data) != size:
        raise ReplayError(f"{path} is shorter than the {size} bytes the capture recorded")
    return data


def file_digest(path: str, size: int | None = None) -> bytes:
    """XXH3-128 of a regular file (of its first ``size`` bytes when given), as 16 little-endian
    bytes (streamed: memory stays flat). Raises OSError."""
    h = xxhash.xxh3_128()
    for data in read_blocks(path, os.stat(path).st_size if size is None else size):
        h.update(data)
    return h.intdigest().to_bytes(16, "little")


@dataclass(frozen=True, slots=True)
class ResolvedFile:
    """Where a file reference's bytes come from on this machine."""

    reference: FileReference
    path: str | None  # the validated local path (None when the bytes are stored in the capture)


def _remap_hint(ref: FileReference, path: str) -> str:
    if path != ref.path:
        return f"{path} (captured as {ref.path})"
    return f"{path}; if the files moved, use --file-remap=CAPTURED_PREFIX=NEW_PREFIX"


def resolve_file(ref: FileReference, remaps: Iterable[FileRemap] = ()) -> ResolvedFile:
    """Remap and validate one file reference; raise FileMismatchError naming the reference, both
    paths and the captured values (not the found file's) when the file is missing, is not a
    regular file or differs from the captured one."""
    who = f"file reference {ref.id}"
    if ref.policy == FilePolicy.FAIL:
        raise FileMismatchError(
            f"{who} ({ref.path}): the capture refused to record this file (policy fail); "
            "recapture with --file-policy=reference, capture-ranges or capture-all"
        )
    if ref.policy in (FilePolicy.CAPTURE_ALL, FilePolicy.CAPTURE_RANGES):
        return ResolvedFile(ref, None)
    try:
        path = remap_path(ref.path, remaps)
    except ReplayUsageError as exc:
        raise FileMismatchError(f"{who}: {exc}") from None
    try:
        fd = open_regular(path)
        try:
            st = os.fstat(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise FileMismatchError(f"{who}: cannot read {_remap_hint(ref, path)}: {exc.strerror}") from None
    if ref.validation == FileValidation.IDENTITY:
        captured = (ref.size, ref.device, ref.inode, ref.mtime_ns)
        actual = (st.st_size, st.st_dev, st.st_ino, st.st_mtime_ns)
        if captured != actual:
            names = ("size", "device", "inode", "mtime_ns")
            diffs = ", ".join(f"{n} captured={c}" for n, c, a in zip(names, captured, actual) if c != a)
            raise FileMismatchError(
                f"{who}: {_remap_hint(ref, path)} is not the captured file ({diffs}); a copied file "
                "never matches by identity: recapture with --file-validation=digest"
            )
    elif ref.validation == FileValidation.DIGEST:
        if ref.digest is None:
            raise FileMismatchError(f"{who}: validation is digest but the capture holds no digest")
        if st.st_size != ref.size:
            raise FileMismatchError(f"{who}: {_remap_hint(ref, path)} is not the captured {ref.size} bytes long")
        try:
            digest = file_digest(path, ref.size)
        except OSError as exc:
            raise FileMismatchError(f"{who}: cannot read {_remap_hint(ref, path)}: {exc.strerror}") from None
        if digest != ref.digest:
            raise FileMismatchError(
                f"{who}: {_remap_hint(ref, path)}: its digest differs from the captured {hash_hex(ref.digest)}"
            )
    return ResolvedFile(ref, path)


def identity_of(path: str) -> dict[str, int]:
    """The identity fields a writer stores for ``path`` (size, device, inode, mtime_ns)."""
    st = os.stat(path)
    return {"size": st.st_size, "device": st.st_dev, "inode": st.st_ino, "mtime_ns": st.st_mtime_ns}
