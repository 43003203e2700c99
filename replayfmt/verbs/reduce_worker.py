"""One candidate of a reduction put to one test, in a process of its own:

    python -m replayfmt.verbs.reduce_worker TEST_JSON CAPTURE

prints one JSON object on stdout (:class:`~replayfmt.edit.reduce_tests.Answer`: ``failing``,
``detail``, ``error``) and exits 0 whatever the verdict; a non-zero exit means the worker itself
broke. The replay runs on the process's first visible device (the parent pins it with
``CUDA_VISIBLE_DEVICES``). A candidate that cannot be replayed for a reason other than the one
tested (no GPU, a plan problem) answers "not failing", with the reason in ``detail``. Verification
is the verify verb's, with run-replay --verify's options: what reduce-replay calls failing
verification is what run-replay --verify calls it.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import time

from replayfmt.edit.reduce_tests import Answer, AsCaptured, FailsVerify, Faults, Slower, Test, decode_test
from replayfmt.errors import DeviceError, DeviceUnavailableError, ReplayError
from replayfmt.replay.verify_types import Outcome, VerifyOptions

_CUDA_ERROR = re.compile(r"CUDA_ERROR_[A-Z_]+")


def _plan_options(substitutions: tuple[str, ...]):  # type: ignore[no-untyped-def]
    from replayfmt.replay.plan_options import PlanOptions, Substitution, check_substitutions

    subs = [Substitution.parse(s) for s in substitutions]
    check_substitutions(subs)
    return PlanOptions(substitutions=tuple(subs))


def verification_failed(path: str, substitutions: tuple[str, ...], replays: int) -> tuple[bool, str]:
    """(a range was wrong, why) of ``run-replay --verify`` with ``substitutions``: the verify verb."""
    from replayfmt.verbs.verifying import verify

    result = verify(path, VerifyOptions(plan=_plan_options(substitutions), replays=replays))
    if result.outcome is Outcome.FAILED:  # an operation failed or the plan refused: not a wrong answer
        raise ReplayError(result.detail)
    return result.outcome is Outcome.MISMATCH, result.detail or result.summary


def _fails_verify(path: str, test: FailsVerify) -> Answer:
    wrong, detail = verification_failed(path, test.substitutions, test.replays)
    if not wrong:
        return Answer(False, detail)
    if test.substitutions:  # the captured kernels must compute what the capture says on this candidate
        reference_wrong, reference = verification_failed(path, (), test.replays)
        if reference_wrong:
            return Answer(False, f"fails without the substitution too: {reference}")
    return Answer(True, detail)


def _as_captured(path: str) -> Answer:
    """Failing: replayed as captured, the candidate is not verified (a wrong range, an operation
    that fails, or nothing left to compare it by): whatever keeps run-replay --verify from passing,
    short of a missing device."""
    from replayfmt.verbs.verifying import verify

    try:
        result = verify(path, VerifyOptions())
    except DeviceUnavailableError:
        raise
    except ReplayError as exc:
        return Answer(True, f"{type(exc).__name__}: {exc}"[:500])
    if result.outcome is not Outcome.VERIFIED:
        return Answer(True, (result.detail or result.outcome.value)[:500])
    return Answer(False, result.summary)


def _faults(path: str, test: Faults) -> Answer:
    from replayfmt.execute import execute

    try:
        execute(path, _plan_options(test.substitutions))
    except DeviceUnavailableError:
        raise
    except DeviceError as exc:
        found = _CUDA_ERROR.search(str(exc))
        if found is None:  # the device refused the capture (no code for it, too little memory): no fault
            return Answer(False, f"not a CUDA error: {exc}"[:500])
        wanted = not test.error or test.error == found.group(0)
        return Answer(wanted, str(exc)[:500], found.group(0))
    return Answer(False, "replayed without a fault")


def _device_ms(path: str, substitutions: tuple[str, ...], min_time: float) -> float:
    from replayfmt.execute import open_replay
    from replayfmt.measure.benchmark import Benchmark, BenchmarkOptions, find_region
    from replayfmt.replay.options import ReplayOptions

    with open_replay(path, _plan_options(substitutions)) as session:
        region = find_region(session.capture, None)
        bench = Benchmark(
            session.start(ReplayOptions(uploads_from_host=True)),
            region,
            BenchmarkOptions(min_time=min_time, clock="events"),
        )
        return bench.run().device_ms.median


def _slower(path: str, test: Slower) -> Answer:
    base = _device_ms(path, (), test.min_time)
    changed = _device_ms(path, test.substitutions, test.min_time)
    ratio = changed / base if base > 0 else float("inf")
    detail = f"{changed:.4f} ms with the substitution, {base:.4f} ms as captured ({ratio:.3f}x)"
    return Answer(ratio > test.threshold, detail)


def answer(test: Test, path: str) -> Answer:
    """The test's verdict on the capture at ``path`` (in this process)."""
    started = time.monotonic()
    try:
        if isinstance(test, FailsVerify):
            out = _fails_verify(path, test)
        elif isinstance(test, Faults):
            out = _faults(path, test)
        elif isinstance(test, Slower):
            out = _slower(path, test)
        elif isinstance(test, AsCaptured):
            out = _as_captured(path)
        else:
            raise ReplayError(f"the {test.kind} test runs no replay")
    except DeviceUnavailableError as exc:
        out = Answer(False, f"no device: {exc}", "unavailable")
    except ReplayError as exc:
        out = Answer(False, f"{type(exc).__name__}: {exc}"[:500])
    return dataclasses.replace(out, seconds=time.monotonic() - started)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m replayfmt.verbs.reduce_worker TEST_JSON CAPTURE", file=sys.stderr)
        return 2
    try:
        test = decode_test(argv[0])
    except ReplayError as exc:
        print(f"reduce_worker: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(answer(test, argv[1]).to_json()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
