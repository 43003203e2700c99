"""Options shared by run-replay and benchmark-replay, defined once (as click decorators) and
turned into the library's option objects in one place."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, TypeVar

import click

from replayfmt.container.files import FileRemap
from replayfmt.errors import ReplayUsageError
from replayfmt.replay.plan import LaunchOverride, PlanOptions, Substitution

F = TypeVar("F", bound=Callable[..., Any])


def parse_device(spec: str) -> int:
    match = re.fullmatch(r"(?:cuda:)?(\d+)", spec)
    if not match:
        raise ReplayUsageError(f"--device {spec!r}: expected cuda:N")
    return int(match.group(1))


def replay_options(fn: F) -> F:
    """--device, --executable-substitution, --file-remap, --launch, --fixed-addresses, --nvtx."""
    decorators = [
        click.option("--device", "devices", multiple=True, metavar="cuda:N",
                     help="Device for each captured device, in order (repeatable; default cuda:0)."),
        click.option("--executable-substitution", "substitutions", multiple=True, metavar="ID=PATH",
                     help="Load PATH instead of executable ID (ID@FORMAT=PATH with cubin|ptx|fatbin; all=PATH alone "
                          "replaces every executable). The ABI must match. Repeatable."),
        click.option("--file-remap", "remaps", multiple=True, metavar="CAPTURED_PREFIX=NEW_PREFIX",
                     help="Rewrite captured file paths (longest prefix wins; the result must stay inside "
                          "NEW_PREFIX), then validate. Repeatable."),
        click.option("--launch", "launches", multiple=True, metavar="OP:grid=X,Y,Z,block=X,Y,Z,smem=N",
                     help="Override one launch's shape, validated against the function's limits. Repeatable."),
        click.option("--fixed-addresses", is_flag=True,
                     help="Allocate every buffer at its recorded device address, or fail."),
        click.option("--nvtx", is_flag=True,
                     help="Emit NVTX ranges around scopes and launches (for nsys, and ncu --nvtx)."),
    ]  # fmt: skip
    for decorate in reversed(decorators):
        fn = decorate(fn)
    return fn


def plan_options(
    *,
    substitutions: tuple[str, ...],
    remaps: tuple[str, ...],
    launches: tuple[str, ...],
    fixed_addresses: bool,
    continue_on_error: bool = False,
) -> PlanOptions:
    return PlanOptions(
        substitutions=tuple(Substitution.parse(s) for s in substitutions),
        remaps=tuple(FileRemap.parse(r) for r in remaps),
        launch_overrides=tuple(LaunchOverride.parse(spec) for spec in launches),
        fixed_addresses=fixed_addresses,
        continue_on_error=continue_on_error,
    )
