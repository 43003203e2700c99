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
from typing import Any, TypeVar

import click

from replayfmt.errors import DeviceUnavailableError, ReplayError, ReplayFormatError, ReplayUsageError
from replayfmt_tools.playbook import playbook

F = TypeVar("F", bound=Callable[..., Any])

EXIT_OK, EXIT_PROBLEM, EXIT_USAGE = 0, 1, 2


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


def reports_errors(tool: str) -> Callable[[F], F]:
    """Turn library errors into one stderr line and an exit code; end quietly on a closed pipe."""

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                code = fn(*args, **kwargs)
            except BrokenPipeError:
                _silence_stdout()
                sys.exit(EXIT_OK)
            except ToolExit as exc:
                if exc.message:
                    click.echo(f"{tool}: {exc.message}", err=True)
                sys.exit(exc.code)
            except (ReplayUsageError, ReplayFormatError, DeviceUnavailableError) as exc:
                click.echo(f"{tool}: error: {exc}", err=True)
                sys.exit(EXIT_USAGE)
            except ReplayError as exc:  # the work ran, or was planned, and cannot be reproduced
                click.echo(f"{tool}: error: {exc}", err=True)
                sys.exit(EXIT_PROBLEM)
            except KeyboardInterrupt:
                click.echo(f"{tool}: interrupted", err=True)
                sys.exit(130)
            try:
                sys.stdout.flush()
            except BrokenPipeError:
                _silence_stdout()
            sys.exit(code or EXIT_OK)

        return wrapper  # type: ignore[return-value]

    return decorate


def _silence_stdout() -> None:
    """After the reader of our stdout went away, stop Python from complaining at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
