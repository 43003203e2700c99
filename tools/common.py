"""What every replayfmt command shares: the --agents-md option, and the one place that maps
library exceptions to exit codes and one-line messages (no tracebacks for errors we raise).

Exit codes: 0 success; 1 the work cannot be reproduced or found a problem (unsupported operation,
file or ABI mismatch, CUDA error, failed verification, damaged capture while dumping); 2 usage,
format or environment error (bad flag, unreadable or malformed file, no GPU or driver).
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from replayfmt.errors import DeviceUnavailableError, ReplayError, ReplayFormatError, ReplayUsageError
from replayfmt_tools.playbook import playbook

F = TypeVar("F", bound=Callable[..., Any])

EXIT_OK, EXIT_PROBLEM, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED = 130  # a shell's status for a process ended by Ctrl-C (128 + SIGINT)


class ToolExit(Exception):
    """Raised by a command to end with a message on stderr and a given exit code."""

    def __init__(self, code: int, message: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def agents_md_option(tool: str) -> Callable[[F], F]:
    """``--agents-md``: print the Markdown playbook for ``tool`` and exit."""

    def show(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
        if value and not ctx.resilient_parsing:
            click.echo(playbook(tool))
            ctx.exit(0)

    return click.option(
        "--agents-md",
        is_flag=True,
        expose_value=False,
        is_eager=True,
        callback=show,
        help="Print a Markdown playbook for people and coding agents, then exit.",
    )


def check_new_file(path: Path, flag: str, *, overwrite_flag: str | None = None, overwrite: bool = False) -> None:
    """Fail before any work when ``path`` could not take the command's result: it exists (it is
    never replaced unless ``overwrite``, which ``overwrite_flag`` asks for), it is a directory, or
    its directory is missing or cannot take a new file (read-only file system, no permission: a
    file is created there and removed, which is what the work would do)."""
    if path.is_dir():
        raise ReplayUsageError(f"{flag} {path}: is a directory; give a file name")
    if path.exists() or path.is_symlink():
        if not overwrite:
            how = f"pass {overwrite_flag} to replace it" if overwrite_flag else "choose another file"
            raise ReplayUsageError(f"{flag} {path}: the file already exists; {how}")
        if not os.access(path, os.W_OK):
            raise ReplayUsageError(f"{flag} {path}: the file is not writable")
    parent = path.parent
    if not parent.is_dir():
        what = "is not a directory" if parent.exists() else "does not exist"
        raise ReplayUsageError(f"{flag} {path}: the directory {parent} {what}")
    probe = parent / f".{path.name}.{os.getpid()}.probe"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except OSError as exc:
        raise ReplayUsageError(f"{flag} {path}: cannot create a file in {parent} ({exc.strerror})") from None
    probe.unlink()


def check_output_directory(path: Path, flag: str) -> None:
    """Fail before any work when ``path`` could not take the files a command writes into it: it
    is a file, or it (or, when it does not exist yet, the nearest directory above it, where it
    would be made) cannot take a new file (a file is created there and removed, as the work would)."""
    if path.exists() and not path.is_dir():
        raise ReplayUsageError(f"{flag} {path}: not a directory")
    where = path
    while not where.exists():
        where = where.parent
    if not where.is_dir():
        raise ReplayUsageError(f"{flag} {path}: {where} is not a directory")
    probe = where / f".{flag.strip('-')}.{os.getpid()}.probe"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except OSError as exc:
        raise ReplayUsageError(f"{flag} {path}: cannot write in {where} ({exc.strerror})") from None
    probe.unlink()


def invoked_name(tool: str, aliases: tuple[str, ...] = ()) -> str:
    """The name the user typed for ``tool``: one of its ``aliases`` (``python -m replayfmt.capture``)
    when it was started by that name, else ``tool``."""
    ctx = click.get_current_context(silent=True)
    name = ctx.find_root().info_name if ctx is not None else None
    return name if name in aliases else tool


def reports_errors(tool: str, *, output_is_the_work: bool = False, aliases: tuple[str, ...] = ()) -> Callable[[F], F]:
    """Turn library errors into one stderr line and an exit code, under the name the user typed
    (``tool``, or one of its ``aliases``).

    A closed pipe on stdout (``| head -1``): where the output is the work (dump-replay's views),
    the reader took what it wanted and the command ends quietly with exit 0. Elsewhere (a replay, a
    search, a benchmark) the output only reports the work: the rest of it is dropped and the work
    goes on, so its outcome (an error on stderr, the exit code) is never hidden behind a reader that
    stopped reading."""

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            stdout = sys.stdout
            name = invoked_name(tool, aliases)
            if not output_is_the_work:
                sys.stdout = _DroppedWhenClosed(stdout)  # type: ignore[assignment]
            try:
                code = fn(*args, **kwargs)
            except BrokenPipeError:
                _silence_stdout()
                sys.exit(EXIT_OK)
            except ToolExit as exc:
                if exc.message:
                    click.echo(f"{name}: {exc.message}", err=True)
                sys.exit(exc.code)
            except (ReplayUsageError, ReplayFormatError, DeviceUnavailableError) as exc:
                click.echo(f"{name}: error: {exc}", err=True)
                sys.exit(EXIT_USAGE)
            except ReplayError as exc:  # the work ran, or was planned, and cannot be reproduced
                click.echo(f"{name}: error: {exc}", err=True)
                sys.exit(EXIT_PROBLEM)
            except KeyboardInterrupt:
                click.echo(f"{name}: interrupted", err=True)
                sys.exit(EXIT_INTERRUPTED)
            finally:
                sys.stdout = stdout
            try:
                sys.stdout.flush()
            except BrokenPipeError:
                _silence_stdout()
            sys.exit(code or EXIT_OK)

        return wrapper  # type: ignore[return-value]

    return decorate


class _DroppedWhenClosed:
    """stdout that, once its reader has gone, drops what is written instead of raising."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            _silence_stdout()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            _silence_stdout()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _silence_stdout() -> None:
    """After the reader of our stdout went away, stop Python from complaining at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
