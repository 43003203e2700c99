"""External file references: prefix remapping and identity/digest validation.

A capture may refer to files the program read (weights, modules) instead of storing them. On
replay their captured paths are remapped (``--file-remap=CAPTURED_PREFIX=NEW_PREFIX``, longest
prefix wins) and then validated before any byte is used: by identity (size, device, inode,
mtime) or by digest (XXH3-128 of the whole file).

A capture names host paths, and a capture is not trusted (docs/FORMAT.md §5.3): a path is
looked at with ``lstat`` before anything is opened (a device, FIFO, socket, directory or symlink
is refused without being opened: opening ``/dev/ptmx`` allocates a terminal), then opened with
``O_NOFOLLOW | O_NONBLOCK`` and ``fstat`` must say it is the same regular file before a byte is
read; the host's pseudo-file trees (``/proc``, ``/sys``) are never read; reads stop at
the recorded size; a remapped path must stay inside the remap's target, after normalisation and
after following every symlink on the way; and messages name what the capture recorded, never the
size, digest or identity of the file found on this host (a mismatch reads the same whatever
differs: no oracle).
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
# kernel interfaces whose entries say they are regular files (/dev's devices are not: lstat refuses them)
_PSEUDO_TREES = ("/proc", "/sys")


@dataclass(frozen=True, slots=True)
class FileRemap:
    """Replace ``captured_prefix`` at the start of a captured path by ``new_prefix``."""

    captured_prefix: str
    new_prefix: str

    @classmethod
    def parse(cls, spec: str) -> FileRemap:
        """Parse ``CAPTURED_PREFIX=NEW_PREFIX`` (the ``--file-remap`` syntax)."""
        captured, sep, new = spec.partition("=")
        if not sep or not captured or not new:  # an empty target would put the rest of a path at the root
            raise ReplayUsageError(f"--file-remap {spec!r}: expected CAPTURED_PREFIX=NEW_PREFIX, both non-empty")
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
    escape = f"--file-remap {best.captured_prefix}={best.new_prefix}: the captured path {path} would leave "
    if not _inside(os.path.abspath(normal), root):
        raise ReplayUsageError(f"{escape}{os.path.normpath(best.new_prefix)} (it normalises to {normal}); refused")
    # and through symlinks: a link inside the new prefix must not lead out of it
    if not _inside(os.path.realpath(normal), os.path.realpath(root)):
        raise ReplayUsageError(f"{escape}{os.path.normpath(best.new_prefix)} through a symlink; refused")
    return normal


def _inside(target: str, root: str) -> bool:
    return target == root or target.startswith(root.rstrip("/") + "/")


_NOT_REGULAR = "not a regular file (a directory, device, FIFO, socket or symlink)"
_OPEN_FLAGS = (
    os.O_RDONLY
    | os.O_NONBLOCK
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_NOCTTY", 0)
    | getattr(os, "O_CLOEXEC", 0)
)


def open_regular(path: str) -> int:
    """A read-only descriptor of ``path`` if it is a regular file; OSError otherwise. The path is
    looked at with ``lstat`` first (nothing else is ever opened, not even a device: opening one
    can have effects), opened without following a final symlink and without blocking, and
    ``fstat`` on the descriptor must show the same regular file (nothing swapped in between
    counts). Files in the host's pseudo-file trees (/proc, /sys) are refused."""
    real = os.path.realpath(path)
    if any(_inside(real, tree) for tree in _PSEUDO_TREES):
        raise PermissionError(0, "a kernel pseudo-file (under /proc or /sys), never read for a capture")
    before = os.lstat(path)
    if not stat.S_ISREG(before.st_mode):
        raise IsADirectoryError(0, _NOT_REGULAR)
    fd = os.open(path, _OPEN_FLAGS)
    try:
        after = os.fstat(fd)
        if not stat.S_ISREG(after.st_mode) or (after.st_dev, after.st_ino) != (before.st_dev, before.st_ino):
            raise IsADirectoryError(0, _NOT_REGULAR + ", or swapped while it was opened")
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


def read_reference(path: str, size: int, *, exact: bool = False) -> bytes:
    """The first ``size`` bytes of the regular file ``path`` (never more, whatever it holds now);
    ``exact``: the file must hold exactly that many. FileMismatchError when it is shorter (or,
    ``exact``, longer), in words that do not say what the file holds instead; ReplayError when
    it cannot be read."""
    mismatch = FileMismatchError(f"{path} is not the file the capture recorded ({size} bytes)")
    try:
        fd = open_regular(path)
        try:
            if exact and os.fstat(fd).st_size != size:
                raise mismatch
            parts, offset = [], 0
            while offset < size and (data := os.pread(fd, min(_DIGEST_BLOCK, size - offset), offset)):
                parts.append(data)
                offset += len(data)
        finally:
            os.close(fd)
    except OSError as exc:
        raise ReplayError(f"cannot read {path}: {exc.strerror}") from None
    if offset != size:
        raise mismatch
    return b"".join(parts)


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
    if not ref.path.startswith("/") or os.path.normpath(ref.path) != ref.path or ref.path.startswith("//"):
        # a recorder writes absolute paths as the kernel reports them: anything else was made up
        raise FileMismatchError(f"{who}: its path {ref.path!r} is not absolute and normalised; refused")
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
    # one message whatever differs (size, identity or content): which one would tell a capture's
    # author something about a file on this host
    if ref.validation == FileValidation.IDENTITY:
        captured = (ref.size, ref.device, ref.inode, ref.mtime_ns)
        if captured != (st.st_size, st.st_dev, st.st_ino, st.st_mtime_ns):
            raise FileMismatchError(
                f"{who}: {_remap_hint(ref, path)} is not the captured file (identity validation: size, device, "
                "inode and mtime must all match the recorded ones); a copied file never matches by identity: "
                "recapture with --file-validation=digest"
            )
    elif ref.validation == FileValidation.DIGEST:
        if ref.digest is None:
            raise FileMismatchError(f"{who}: validation is digest but the capture holds no digest")
        mismatch = FileMismatchError(
            f"{who}: {_remap_hint(ref, path)} is not the captured file (digest validation: its size and content "
            f"must match the recorded {hash_hex(ref.digest)})"
        )
        if st.st_size != ref.size:
            raise mismatch
        try:
            digest = file_digest(path, ref.size)
        except OSError as exc:
            raise FileMismatchError(f"{who}: cannot read {_remap_hint(ref, path)}: {exc.strerror}") from None
        if digest != ref.digest:
            raise mismatch
    return ResolvedFile(ref, path)


def identity_of(path: str) -> dict[str, int]:
    """The identity fields a writer stores for ``path`` (size, device, inode, mtime_ns)."""
    st = os.stat(path)
    return {"size": st.st_size, "device": st.st_dev, "inode": st.st_ino, "mtime_ns": st.st_mtime_ns}
