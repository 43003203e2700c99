"""The writer's output primitives: creating the file, positioned writes, fsync, and an executor
that runs inline."""

from __future__ import annotations

import concurrent.futures as cf
import os
from pathlib import Path
from typing import Any

from replayfmt.errors import ReplayUsageError


class InlineExecutor:
    """Runs submitted work at once on the caller's thread (``threads=0``)."""

    def submit(self, fn: Any, *args: Any) -> cf.Future:
        future: cf.Future = cf.Future()
        try:
            future.set_result(fn(*args))
        except BaseException as exc:
            future.set_exception(exc)
        return future

    def shutdown(self, wait: bool = True) -> None:
        pass


def create_file(path: Path, *, overwrite: bool) -> int:
    """A new file at ``path`` open for writing; an existing one only with ``overwrite``."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if overwrite else os.O_EXCL) | getattr(os, "O_CLOEXEC", 0)
    try:
        return os.open(path, flags, 0o644)
    except FileExistsError:
        raise ReplayUsageError(f"{path} already exists; choose another path or pass overwrite=True") from None
    except OSError as exc:
        raise ReplayUsageError(f"cannot create {path}: {exc.strerror}") from None


def write_all(fd: int, parts: list[bytes | memoryview], offset: int) -> int:
    """Write ``parts`` at ``offset`` (not at the file position: a torn write is overwritten by
    the next one instead of shifting every later chunk)."""
    total = sum(len(p) for p in parts)
    views = [memoryview(p).cast("B") for p in parts if len(p)]
    while views:
        written = os.pwritev(fd, views, offset)
        offset += written
        while views and written >= len(views[0]):
            written -= len(views[0])
            views.pop(0)
        if views and written:
            views[0] = views[0][written:]
    return total


def sync_file(fd: int, directory: Path | None = None) -> None:
    """fsync ``fd`` and, when given, ``directory`` (so that a new file's name survives a power
    loss too). Raises OSError."""
    os.fsync(fd)
    if directory is not None:
        dir_fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
