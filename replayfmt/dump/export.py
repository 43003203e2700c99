"""``--payloads=files:DIR``: each payload written once to ``DIR/<hash>.bin``, safely.

DIR is the user's, and may hold files already (an earlier export, or something planted there):

* every byte goes to a fresh temporary created in DIR with ``O_CREAT | O_EXCL | O_NOFOLLOW``
  (never an existing file, never through a symlink), then linked to ``<hash>.bin`` with a
  no-clobber ``link`` (``rename`` where links are unsupported, after checking again), and removed
  on any failure: a failed export leaves no partial file;
* an existing ``<hash>.bin`` is verified: same content (same size and frame hashes) is skipped,
  anything else (other content, a symlink, a directory) is an error naming the file and the flag;
* payloads stream frame by frame (memory stays at one frame however large the payload), and one
  larger than the space left in DIR is refused before a byte is written;
* DIR is checked writable when the dump starts, so a read-only DIR is one line, not a traceback
  after the first rows; a missing DIR is created only under an existing directory (one level,
  as ``mkdir`` does: a mistyped path never grows a tree), and a file in its place is named as one.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from pathlib import Path

from replayfmt.errors import ReplayUsageError
from replayfmt.format import model as m
from replayfmt.format.payloads import frame_hash
from replayfmt.reader import Capture

_FLAG = "--payloads=files:"
_OPEN_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def _fail(directory: Path, what: str) -> ReplayUsageError:
    return ReplayUsageError(f"{_FLAG}{directory}: {what}")


def _open_dir(directory: Path) -> int:
    try:
        return os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise _fail(directory, f"cannot open the directory ({exc.strerror})") from None


def _new_temporary(directory: Path, dir_fd: int, stem: str) -> tuple[str, int]:
    name = f".{stem}.{secrets.token_hex(6)}.tmp"
    try:
        return name, os.open(name, _OPEN_NEW, 0o644, dir_fd=dir_fd)
    except OSError as exc:
        raise _fail(directory, f"cannot write in the directory ({exc.strerror}); choose a writable one") from None


def prepare_directory(directory: Path) -> bool:
    """Make ``directory`` ready to take payload files; True when it was created here.

    Only the last level is ever created (as ``mkdir`` does), and only under an existing
    directory: a mistyped path fails with its reason instead of growing a tree of new directories.
    """
    if directory.is_symlink() or directory.exists():
        if not directory.is_dir():
            what = "a file" if directory.is_file() else "not a directory"
            raise _fail(directory, f"{directory} is {what}, not a directory to write payload files into")
        check_directory_writable(directory)
        return False
    parent = directory.absolute().parent
    if not parent.is_dir():
        why = "is not a directory" if parent.exists() else "does not exist"
        raise _fail(
            directory, f"its parent {parent} {why}; only the last level is created (make the others with mkdir -p)"
        )
    try:
        directory.mkdir()
    except OSError as exc:
        raise _fail(directory, f"cannot create the directory ({exc.strerror})") from None
    check_directory_writable(directory)
    return True


def check_directory_writable(directory: Path) -> None:
    """Create and remove a temporary in ``directory``: a read-only one fails here, at once."""
    dir_fd = _open_dir(directory)
    try:
        name, fd = _new_temporary(directory, dir_fd, "check")
        os.close(fd)
        os.unlink(name, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)


def _same_content(cap: Capture, info: m.PayloadInfo, dir_fd: int, name: str) -> bool:
    """Whether the regular file ``name`` holds exactly the payload (compared frame by frame)."""
    fd = os.open(name, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != info.size:
            return False
        for k, (start, length) in enumerate(cap.frame_ranges(info.id)):
            if frame_hash(os.pread(fd, length, start)) != info.frames[k]:
                return False
        return True
    finally:
        os.close(fd)


def _existing(cap: Capture, info: m.PayloadInfo, directory: Path, dir_fd: int, name: str) -> bool:
    """True when ``name`` already holds this payload; False when absent; an error otherwise."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise _fail(directory, f"cannot check {name} ({exc.strerror})") from None
    if stat.S_ISREG(st.st_mode):
        try:
            if _same_content(cap, info, dir_fd, name):
                return True
        except OSError as exc:
            raise _fail(directory, f"cannot check {name} ({exc.strerror})") from None
        what = "exists with other content"
    else:
        what = "exists and is not a regular file (a symlink?)"
    raise _fail(directory, f"{name} {what}; it is left alone: remove it, or export to another {_FLAG}DIR")


def _write_payload(cap: Capture, info: m.PayloadInfo, fd: int) -> None:
    buffer = bytearray(info.frame_size if info.size else 0)
    view = memoryview(buffer)
    for k, (start, length) in enumerate(cap.frame_ranges(info.id)):
        part = view[:length]
        cap.read_frame_into(info.id, k, part)
        done = 0
        while done < length:
            done += os.pwrite(fd, part[done:], start + done)


def export_payload(cap: Capture, info: m.PayloadInfo, directory: Path) -> Path:
    """Write payload ``info`` to ``directory/<hash>.bin`` (see the module docstring) and return
    the path. Errors are one-line ReplayUsageErrors naming the file and the flag."""
    name = f"{info.hash_hex}.bin"
    dir_fd = _open_dir(directory)
    try:
        if _existing(cap, info, directory, dir_fd, name):
            return directory / name
        try:
            free = os.statvfs(dir_fd).f_bavail * os.statvfs(dir_fd).f_frsize
        except OSError:
            free = None
        if free is not None and info.size > free:
            raise _fail(directory, f"payload {info.id} needs {info.size} bytes, the directory has {free} free")
        temporary, fd = _new_temporary(directory, dir_fd, info.hash_hex)
        try:
            try:
                _write_payload(cap, info, fd)
            finally:
                os.close(fd)
            try:
                os.link(temporary, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
            except FileExistsError:  # appeared meanwhile: verified like any existing file
                _existing(cap, info, directory, dir_fd, name)
            except OSError as exc:
                if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
                    raise
                if not _existing(cap, info, directory, dir_fd, name):
                    os.rename(temporary, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except OSError as exc:
            raise _fail(directory, f"cannot write {name} ({exc.strerror})") from None
        finally:
            try:
                os.unlink(temporary, dir_fd=dir_fd)
            except FileNotFoundError:
                pass
        return directory / name
    finally:
        os.close(dir_fd)
