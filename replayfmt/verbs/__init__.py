"""The verbs: one library function per thing the tools do, typed options in, a typed result out.

The console scripts in ``tools/`` parse flags into these options, call the function and print
its result; a program calls the same function and gets the same answer::

    from replayfmt.verbs import verify, VerifyOptions

    result = verify("step.kreplay", VerifyOptions())
    if not result.verified:
        print(result.outcome.value, result.detail)

``run_and_record`` is ``capture-replay``: run a program, record it, judge and self-check the
file, keep or remove it. ``verify`` is ``run-replay`` (``--verify`` and without it), and the
recorder's self-check runs it in a child process (``python -m replayfmt.verbs``): the same
function with the same options, so both give the same verdict on the same file.
"""

from replayfmt.replay.verify_types import EvidencePolicy, Outcome, VerifyOptions, VerifyResult
from replayfmt.verbs.record import RecordResult, RunAndRecordOptions, run_and_record
from replayfmt.verbs.verify import verify

__all__ = [
    "EvidencePolicy",
    "Outcome",
    "RecordResult",
    "RunAndRecordOptions",
    "VerifyOptions",
    "VerifyResult",
    "run_and_record",
    "verify",
]
