"""External file references: prefix remapping and identity/digest validation.

A capture may refer to files the program read (weights, modules) instead of storing them. On
replay their captured paths are remapped (``--file-remap=CAPTURED_PREFIX=NEW_PREFIX``, longest
prefix wins) and then validated before any byte is used: by identity (size, device, inode,
mtime) or by digest (XXH3-128 of the whole file).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

import xxhash

from replayfmt.errors import FileMismatchError, ReplayUsageError
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
    """Apply the remap whose captured prefix is the longest match (or none)."""
    best: FileRemap | None = None
    for remap in remaps:
        if remap.matches(path) and (best is None or len(remap.captured_prefix) > len(best.captured_prefix)):
            best = remap
    return path if best is None else best.new_prefix + path[len(best.captured_prefix) :]


def file_digest(path: str) -> bytes:
    """XXH3-128 of a whole file, as 16 little-endian bytes (streamed: memory stays flat)."""
    h = xxhash.xxh3_128()
    with open(path, "rb") as f:
        while block := f.read(_DIGEST_BLOCK):
            h.update(block)
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
    """Remap and validate one file reference; raise FileMismatchError naming the reference,
    both paths and both values when the file is missing or differs from the captured one."""
    who = f"file reference {ref.id}"
    if ref.policy == FilePolicy.FAIL:
        raise FileMismatchError(
            f"{who} ({ref.path}): the capture refused to record this file (policy fail); "
            "recapture with --file-policy=reference, capture-ranges or capture-all"
        )
    if ref.policy in (FilePolicy.CAPTURE_ALL, FilePolicy.CAPTURE_RANGES):
        return ResolvedFile(ref, None)
    path = remap_path(ref.path, remaps)
    try:
        st = os.stat(path)
    except OSError as exc:
        raise FileMismatchError(f"{who}: cannot read {_remap_hint(ref, path)}: {exc.strerror}") from None
    if ref.validation == FileValidation.IDENTITY:
        captured = (ref.size, ref.device, ref.inode, ref.mtime_ns)
        actual = (st.st_size, st.st_dev, st.st_ino, st.st_mtime_ns)
        if captured != actual:
            names = ("size", "device", "inode", "mtime_ns")
            diffs = ", ".join(f"{n} captured={c} actual={a}" for n, c, a in zip(names, captured, actual) if c != a)
            raise FileMismatchError(
                f"{who}: {_remap_hint(ref, path)} is not the captured file ({diffs}); a copied file "
                "never matches by identity: recapture with --file-validation=digest"
            )
    elif ref.validation == FileValidation.DIGEST:
        if ref.digest is None:
            raise FileMismatchError(f"{who}: validation is digest but the capture holds no digest")
        if st.st_size != ref.size:
            raise FileMismatchError(
                f"{who}: {_remap_hint(ref, path)} has {st.st_size} bytes, the captured file {ref.size}"
            )
        digest = file_digest(path)
        if digest != ref.digest:
            raise FileMismatchError(
                f"{who}: {_remap_hint(ref, path)} digest {hash_hex(digest)} differs from the "
                f"captured {hash_hex(ref.digest)}"
            )
    return ResolvedFile(ref, path)


def identity_of(path: str) -> dict[str, int]:
    """The identity fields a writer stores for ``path`` (size, device, inode, mtime_ns)."""
    st = os.stat(path)
    return {"size": st.st_size, "device": st.st_dev, "inode": st.st_ino, "mtime_ns": st.st_mtime_ns}
