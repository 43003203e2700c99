"""reduce-replay: shrink a capture to a small one that still fails a test (delta debugging)."""

from __future__ import annotations

from pathlib import Path

import click

from replayfmt.edit.reduce import ReduceOptions, reduce
from replayfmt.edit.reduce_tests import Command, FailsVerify, Faults, Slower, Test
from replayfmt.errors import ReplayUsageError
from replayfmt_tools.common import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PROBLEM,
    agents_md_option,
    check_new_file,
    reports_errors,
)
from replayfmt_tools.options import exactly_one, parse_devices

EPILOG = """\b
Exactly one test says what "still failing" means:
  --fails-verify      run-replay --verify finds a wrong range (with the --executable-substitution
                      given, and the same candidate verifies without it)
  --faults[=NAME]     the replay stops on a CUDA error (any, or NAME: CUDA_ERROR_ILLEGAL_ADDRESS)
  --slower RATIO      with the substitution the work takes over RATIO times as long (1.1: 10%)
  --command 'CMD {}'  CMD exits non-zero; {} is the candidate capture's path

\b
First the original is put to the test (a capture that passes it is refused). Then delta debugging
over the capture's device work: each candidate is a standalone capture of a subset, its inputs
rebuilt from the capture's own data (a removed producer's output given as starting state or a
copy), tested in a child process, one at a time per --device. Then over those inputs: only the
bytes the remaining work reads are kept (a candidate there must fail the test and also verify
replayed as captured; where the captured work itself faults or computes wrong, or no GPU is
here, every input is kept). A candidate whose inputs the capture does not hold (a
removed launch wrote them and no checkpoint followed) is skipped: a kernel-mode capture
(capture-replay --mode kernel) reduces to single launches, a region capture keeps producers.

\b
The best capture so far is written to -o as soon as it is found, so an interrupt (Ctrl-C),
--max-tries or --max-seconds leave a capture that fails the test. Its metadata says where it came
from (dump-replay --format=json: reduce.source, reduce.source_digest, reduce.test,
reduce.operations_kept, reduce.result_substitutions: the substitution's ids in the result).

\b
Exit status: 0 reduced; 1 the original passes the test, the capture cannot be reduced, or a bound
stopped the search before any candidate failed (nothing written); 2 usage error, unreadable
capture, existing -o without --overwrite, no GPU for a test that replays; 130 interrupted (the best
capture so far is at -o).

\b
Examples:
  reduce-replay --fails-verify --executable-substitution 7=new.cubin -o bug.kreplay step.kreplay
  reduce-replay --faults=CUDA_ERROR_ILLEGAL_ADDRESS --device cuda:0 --device cuda:1 -o oob.kreplay step.kreplay
  reduce-replay --slower 1.2 --executable-substitution 7=tuned.cubin -o slow.kreplay step.kreplay
  reduce-replay --command 'dump-replay {} | grep -q "launch  *flash" && exit 1; exit 0' -o small.kreplay step.kreplay
  reduce-replay --command './still_wrong.sh {}' --max-tries 200 --max-seconds 3600 -o small.kreplay step.kreplay
"""


def _test(
    fails_verify: bool, faults: str | None, slower: float | None, command: str | None, subs: tuple[str, ...]
) -> Test:
    exactly_one(
        [
            ("--fails-verify", fails_verify),
            ("--faults", faults is not None),
            ("--slower", slower is not None),
            ("--command", command is not None),
        ],
        "give exactly one test: --fails-verify, --faults, --slower or --command",
    )
    if command is not None:
        if subs:
            raise ReplayUsageError("--executable-substitution means nothing with --command (put it in the command)")
        return Command(command)
    if fails_verify:
        return FailsVerify(subs)
    if faults is not None:
        return Faults("" if faults == "any" else faults, subs)
    assert slower is not None
    return Slower(slower, subs)


@click.command(epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("capture", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True, help="The reduced capture.")
@click.option("--overwrite", is_flag=True, help="Replace -o if it exists.")
@click.option("--fails-verify", is_flag=True, help="Test: verification finds a wrong range.")
@click.option(
    "--faults",
    is_flag=False,
    flag_value="any",
    default=None,
    metavar="[=NAME]",
    help="Test: the replay stops on a CUDA error (any, or the one named).",
)
@click.option("--slower", type=float, metavar="RATIO", help="Test: the substitution is over RATIO times slower.")
@click.option("--command", metavar="'CMD {}'", help="Test: CMD exits non-zero ({} is the candidate's path).")
@click.option(
    "--executable-substitution",
    "substitutions",
    multiple=True,
    metavar="ID=PATH",
    help="Replay with PATH instead of executable ID (ids of CAPTURE; renumbered for each candidate). Repeatable.",
)
@click.option(
    "--device",
    "devices",
    multiple=True,
    metavar="cuda:N",
    help="A device to test candidates on, one at a time each (repeatable; default cuda:0).",
)
@click.option("--max-tries", type=click.IntRange(min=1), help="Stop after N replays (the best so far is kept).")
@click.option("--max-seconds", type=click.FloatRange(min=0, min_open=True), help="Stop after S seconds.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=600.0,
    show_default=True,
    help="Seconds one candidate may take; one that takes longer counts as passing.",
)
@click.option("--no-state-phase", is_flag=True, help="Keep every input byte of the kept work (skip the second phase).")
@click.option("--quiet", is_flag=True, help="No progress lines on stderr.")
@agents_md_option("reduce-replay")
@reports_errors("reduce-replay")
def main(
    capture: Path,
    output: Path,
    overwrite: bool,
    fails_verify: bool,
    faults: str | None,
    slower: float | None,
    command: str | None,
    substitutions: tuple[str, ...],
    devices: tuple[str, ...],
    max_tries: int | None,
    max_seconds: float | None,
    timeout: float,
    no_state_phase: bool,
    quiet: bool,
) -> int:
    """Shrink CAPTURE to the smallest capture that still fails a test, written to -o."""
    test = _test(fails_verify, faults, slower, command, substitutions)
    check_new_file(output, "-o", overwrite_flag="--overwrite", overwrite=overwrite)
    options = ReduceOptions(
        devices=parse_devices(devices),
        max_tries=max_tries,
        max_seconds=max_seconds,
        timeout=timeout,
        overwrite=overwrite,
        state_phase=not no_state_phase,
    )

    def progress(line: str) -> None:
        if not quiet:
            click.echo(line, err=True)

    result = reduce(capture, output, test, options, progress=progress)
    for line in result.lines():
        click.echo(line)
    if result.interrupted:
        return EXIT_INTERRUPTED
    return EXIT_OK if result.written else EXIT_PROBLEM


if __name__ == "__main__":
    main()
