"""The verbs: one library function per thing the tools do, typed options in, a typed result out.

The console scripts in ``tools/`` parse flags into these options, call the function and print
its result; a program calls the same function and gets the same answer::

    from replayfmt.verbs import verify, VerifyOptions

    result = verify("step.kreplay", VerifyOptions())
    if not result.verified:
        print(result.outcome.value, result.detail)

``verify`` is ``run-replay`` (``--verify`` and without it), and the recorder's self-check runs it
in a child process (``python -m replayfmt.verbs``): the same function with the same options, so
both give the same verdict on the same file. ``run_and_record`` is ``capture-replay``: run a
program, record it, judge and self-check the file, keep or remove it. ``tune`` is
``tune-replay``: launch shapes searched on a replayed kernel, every candidate verified. ``benchmark`` is
``benchmark-replay``: a scope timed from the same starting state every time. ``corpus`` is
``corpus-replay``: every capture of a directory verified on a fan-out of workers, each row by
``verify``. ``verify_ranks`` is ``run-replay`` given every rank's capture of a job: the ranks
replayed together, one process and one GPU each, their collectives run among them
(``benchmark_ranks`` times them so: ``benchmark-replay`` given every rank's capture). ``extract``
is ``extract-replay`` (it lives in ``replayfmt.edit``, exported here) and ``diff`` is
``diff-replay``.

The modules are named for the work (``verifying``, ``recording``, ``tuning``, ...) so that the
functions this package exports never shadow them.
"""

from replayfmt.edit import ExtractOptions, ExtractResult, Selection, extract
from replayfmt.replay.verify_types import EvidencePolicy, Outcome, VerifyOptions, VerifyResult
from replayfmt.verbs.benchmarking import BenchmarkReplayOptions, benchmark
from replayfmt.verbs.comparing import DiffOptions, DiffResult, diff
from replayfmt.verbs.corpus_runs import CorpusOptions, CorpusResult, corpus
from replayfmt.verbs.ranks import (
    PlantedReduction,
    RankBenchmark,
    RanksOptions,
    RanksResult,
    benchmark_ranks,
    verify_ranks,
)
from replayfmt.verbs.recording import RecordResult, RunAndRecordOptions, run_and_record
from replayfmt.verbs.tuning import TuneOptions, TuneResult, tune
from replayfmt.verbs.verifying import verify

__all__ = [
    "BenchmarkReplayOptions",
    "CorpusOptions",
    "CorpusResult",
    "DiffOptions",
    "DiffResult",
    "EvidencePolicy",
    "ExtractOptions",
    "ExtractResult",
    "Outcome",
    "PlantedReduction",
    "RankBenchmark",
    "RanksOptions",
    "RanksResult",
    "RecordResult",
    "RunAndRecordOptions",
    "Selection",
    "TuneOptions",
    "TuneResult",
    "VerifyOptions",
    "VerifyResult",
    "benchmark",
    "benchmark_ranks",
    "corpus",
    "diff",
    "extract",
    "run_and_record",
    "tune",
    "verify",
    "verify_ranks",
]
