"""Options shared by the tools (run-replay, benchmark-replay and tune-replay above all), defined
once (as click decorators, with their help) and turned into the library's option objects in one
place."""

from __future__ import annotations

import dataclasses
import math
import re
import socket
from collections.abc import Callable
from typing import Any, TypeVar

import click

from replayfmt.container.files import FileRemap
from replayfmt.errors import ReplayUsageError
from replayfmt.format.layout import DEFAULT_LIMITS, Limits, parse_limit
from replayfmt.replay.collectives import REDUCTIONS
from replayfmt.replay.compare import Tolerance
from replayfmt.replay.plan_options import LaunchOverride, PlanOptions, Substitution
from replayfmt.verbs import PlantedReduction

F = TypeVar("F", bound=Callable[..., Any])


class FiniteFloatRange(click.FloatRange):
    """A float option that must be a finite number within the range: ``inf`` and ``nan`` are
    refused where the flag is parsed (``nan`` passes every comparison a range makes)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


class SchedulerAddress(click.ParamType):
    """``--scheduler``: a Dask scheduler's address, ``[PROTOCOL://]HOST:PORT`` (tcp, tls, ws, wss,
    ucx, inproc), checked where it is parsed; a TCP address is also tried (a few seconds) so that
    an unreachable one is one line at once, not an error after the client's own long wait."""

    name = "address"
    PROTOCOLS = ("tcp", "tls", "ws", "wss", "ucx", "inproc")
    PROBE_SECONDS = 3.0

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        text = str(value)
        protocol, sep, rest = text.partition("://")
        if not sep:
            protocol, rest = "tcp", text
        if protocol not in self.PROTOCOLS:
            self.fail(f"{text!r}: unknown protocol {protocol!r} (expected {', '.join(self.PROTOCOLS)})", param, ctx)
        if protocol == "inproc":
            return text
        host, colon, port = rest.rpartition(":")
        host = host.strip("[]")
        if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            self.fail(f"{text!r}: expected [PROTOCOL://]HOST:PORT, e.g. tcp://head:8786", param, ctx)
        if protocol in ("tcp", "tls"):
            try:
                socket.create_connection((host, int(port)), timeout=self.PROBE_SECONDS).close()
            except OSError as exc:
                why = exc.strerror or str(exc) or type(exc).__name__
                self.fail(f"{text!r}: no scheduler answers there ({why})", param, ctx)
        return text


def _apply(fn: F, decorators: list[Callable[[F], F]]) -> F:
    for decorate in reversed(decorators):
        fn = decorate(fn)
    return fn


def exactly_one(flags: list[tuple[str, bool]], ask: str) -> None:
    """A usage error (``ask``, then the flags given) unless exactly one of ``flags`` is given."""
    given = [name for name, on in flags if on]
    if len(given) != 1:
        raise click.UsageError(ask + (f" (got {', '.join(given)})" if given else ""))


def parse_device(spec: str) -> int:
    match = re.fullmatch(r"(?:cuda:)?(\d+)", spec)
    if not match:
        raise ReplayUsageError(f"--device {spec!r}: expected cuda:N")
    return int(match.group(1))


def parse_devices(specs: tuple[str, ...]) -> tuple[int, ...]:
    """``--device`` flags (one per captured device, in order) as ordinals; cuda:0 when none."""
    ordinals = tuple(parse_device(d) for d in specs) or (0,)
    if len(set(ordinals)) != len(ordinals):
        raise ReplayUsageError("--device: the same device is given twice")
    return ordinals


def parse_planted(specs: tuple[str, ...]) -> tuple[PlantedReduction, ...]:
    """``--collective-reduction OP=REDUCTION`` flags."""
    planted = []
    for spec in specs:
        operation, _, name = spec.partition("=")
        if not operation.strip().isdigit() or name not in REDUCTIONS:
            raise ReplayUsageError(
                f"--collective-reduction {spec!r}: expected OP=REDUCTION, OP an operation index and REDUCTION one "
                f"of {', '.join(REDUCTIONS)}"
            )
        planted.append(PlantedReduction(int(operation), REDUCTIONS[name]))
    return tuple(planted)


def source_options(fn: F) -> F:
    """--executable-substitution, --file-remap, --fixed-addresses: what the replay is built from."""
    return _apply(
        fn,
        [
            click.option(
                "--executable-substitution",
                "substitutions",
                multiple=True,
                metavar="ID=PATH",
                help="Load PATH instead of executable ID (ID@FORMAT=PATH with cubin|ptx|fatbin; all=PATH alone "
                "replaces every executable). The ABI must match. Repeatable.",
            ),
            click.option(
                "--file-remap",
                "remaps",
                multiple=True,
                metavar="CAPTURED_PREFIX=NEW_PREFIX",
                help="Rewrite captured file paths (longest prefix wins; the result must stay inside NEW_PREFIX), "
                "then validate. Repeatable.",
            ),
            click.option(
                "--fixed-addresses",
                is_flag=True,
                help="Allocate every device buffer at its recorded address, or fail (pinned host memory is relocated).",
            ),
        ],
    )


def tolerance_value(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    """Callback for --rtol/--atol: a finite, non-negative number (a negative one would fail every
    comparison, NaN would pass every one)."""
    if value is not None and not (math.isfinite(value) and value >= 0):
        raise click.BadParameter(f"{value:g} is not a finite number >= 0", ctx=ctx, param=param)
    return value


def replay_options(fn: F) -> F:
    """--device (repeatable), the source options, --launch, --nvtx."""
    return _apply(
        fn,
        [
            click.option(
                "--device",
                "devices",
                multiple=True,
                metavar="cuda:N",
                help="Device for each captured device, in order (repeatable; captured devices not named run "
                "on the lowest free ordinals: cuda:0, cuda:1, ...).",
            ),
            source_options,
            click.option(
                "--launch",
                "launches",
                multiple=True,
                metavar="OP:grid=X,Y,Z,block=X,Y,Z,smem=N",
                help="Override one launch's shape, validated against the function's limits; OP:skip does not run it "
                "(to see that --verify notices a missing kernel). Repeatable.",
            ),
            click.option(
                "--nvtx", is_flag=True, help="Emit NVTX ranges around scopes and launches (for nsys, and ncu --nvtx)."
            ),
        ],
    )


def tolerance_options(fn: F) -> F:
    """--tolerance, --rtol, --atol: how checkpoints are compared."""
    return _apply(
        fn,
        [
            click.option(
                "--tolerance",
                "use_tolerance",
                is_flag=True,
                help="Also accept floating-point values within per-dtype tolerances (rtol, atol) of the capture.",
            ),
            click.option(
                "--rtol", type=float, callback=tolerance_value, help="Relative tolerance (implies --tolerance)."
            ),
            click.option(
                "--atol", type=float, callback=tolerance_value, help="Absolute tolerance (implies --tolerance)."
            ),
        ],
    )


def tolerance(*, use_tolerance: bool, rtol: float | None, atol: float | None) -> Tolerance:
    """The comparison the tolerance options ask for (--rtol or --atol imply --tolerance)."""
    return Tolerance(enabled=use_tolerance or rtol is not None or atol is not None, rtol=rtol, atol=atol)


def plan_options(
    *,
    substitutions: tuple[str, ...],
    remaps: tuple[str, ...],
    launches: tuple[str, ...] = (),
    fixed_addresses: bool,
    continue_on_error: bool = False,
    jit_from_ptx: bool = False,
    verify_payloads: bool = False,
) -> PlanOptions:
    return PlanOptions(
        substitutions=tuple(Substitution.parse(s) for s in substitutions),
        remaps=tuple(FileRemap.parse(r) for r in remaps),
        launch_overrides=tuple(LaunchOverride.parse(spec) for spec in launches),
        fixed_addresses=fixed_addresses,
        continue_on_error=continue_on_error,
        jit_from_ptx=jit_from_ptx,
        verify_payloads=verify_payloads,
    )


def cluster_options(fn: F) -> F:
    """--scheduler, --engine: where fanned-out work runs (replayfmt.measure.fanout)."""
    return _apply(
        fn,
        [
            click.option(
                "--scheduler",
                type=SchedulerAddress(),
                metavar="ADDRESS",
                help="Run on the workers of this Dask cluster (e.g. tcp://head:8786; one dask-cuda-worker per GPU).",
            ),
            click.option(
                "--engine",
                type=click.Choice(["auto", "dask", "local"]),
                help="Workers, one per GPU: dask (distributed; dask-cuda's LocalCUDACluster when installed), local "
                "(spawned processes), auto (dask when installed, else local). Default: auto.",
            ),
        ],
    )


def _limits(ctx: click.Context, param: click.Parameter, specs: tuple[str, ...]) -> Limits:
    """Callback for --limit: the reader's caps with each NAME=VALUE in place (a usage error, exit
    2, for an unknown name or a value that is not a finite whole number > 0)."""
    try:
        return DEFAULT_LIMITS.overridden(dict(parse_limit(spec) for spec in specs))
    except ReplayUsageError as exc:
        raise click.BadParameter(str(exc).removeprefix("--limit "), ctx=ctx, param=param) from None


def limit_option(fn: F) -> F:
    """--limit NAME=VALUE (repeatable): raise (or lower) one of the reader's caps on what a file
    may declare (replayfmt.format.layout.Limits), for a file you trust; every tool that reads a
    capture takes it. The parameter is ``limits``, a Limits."""
    names = ", ".join(f.name for f in dataclasses.fields(Limits))
    return click.option(
        "--limit",
        "limits",
        multiple=True,
        metavar="NAME=VALUE",
        callback=_limits,
        help="Raise one of the reader's caps on what a file may declare, for a file you trust (VALUE a whole "
        f"number, K/M/G/T suffixes: powers of 1024). Repeatable. Names: {names}.",
    )(fn)
