"""--limit NAME=VALUE, one flag shared by every tool that reads a capture: validated (an unknown
name, a value that is not a finite whole number > 0: a usage error, exit 2), and reaching the
reader (a limit lowered under what a real file declares refuses it, naming the flag)."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from replayfmt.errors import ReplayFormatError, ReplayUsageError
from replayfmt.format.layout import DEFAULT_LIMITS, Limits, parse_limit
from replayfmt_tools import (
    benchmark_replay,
    corpus_replay,
    diff_replay,
    dump_replay,
    extract_replay,
    run_replay,
    tune_replay,
)

SAXPY = Path(__file__).resolve().parents[1] / "examples" / "saxpy.kreplay"
LOW = "max_record_batch_size=64"  # saxpy's records batch declares 1584 bytes


def commands(tmp_path: Path) -> dict[str, tuple[object, list[str]]]:
    corpus = tmp_path / "corpus"
    corpus.mkdir(exist_ok=True)
    shutil.copy(SAXPY, corpus / "a.kreplay")
    return {
        "run-replay": (run_replay.main, ["--dry-run", str(SAXPY)]),
        "benchmark-replay": (benchmark_replay.main, [str(SAXPY)]),
        "tune-replay": (tune_replay.main, ["--launch=9", "--block=64", str(SAXPY)]),
        "corpus-replay": (corpus_replay.main, ["--dry-run", "--engine=local", str(corpus)]),
        "extract-replay": (
            extract_replay.main,
            ["--no-gpu", "--operation=9", "-o", str(tmp_path / "x.kreplay"), str(SAXPY)],
        ),
        "diff-replay": (diff_replay.main, [str(SAXPY), str(SAXPY)]),
        "dump-replay": (dump_replay.main, [str(SAXPY)]),
    }


TOOLS = [
    "run-replay",
    "benchmark-replay",
    "tune-replay",
    "corpus-replay",
    "extract-replay",
    "diff-replay",
    "dump-replay",
]


@pytest.mark.parametrize("tool", TOOLS)
@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("max_nonsense=1", "no such limit"),
        ("max_depth=0", "must be a finite whole number > 0"),
        ("max_depth=-4", "must be a finite whole number > 0"),
        ("max_depth=inf", "must be a finite whole number > 0"),
        ("max_depth=nan", "must be a finite whole number > 0"),
        ("max_depth=1.5", "must be a finite whole number > 0"),
        ("max_depth", "expected NAME=VALUE"),
    ],
)
def test_a_bad_limit_is_a_usage_error_in_every_tool(tmp_path, tool, spec, message):
    main, args = commands(tmp_path)[tool]
    result = CliRunner().invoke(main, [f"--limit={spec}", *args])
    assert result.exit_code == 2 and "--limit" in result.output and message in result.output, result.output


@pytest.mark.parametrize("tool", ["run-replay", "extract-replay", "diff-replay", "dump-replay"])
def test_a_lowered_limit_reaches_the_reader_and_the_refusal_names_the_flag(tmp_path, tool):
    main, args = commands(tmp_path)[tool]
    result = CliRunner().invoke(main, [f"--limit={LOW}", *args])
    assert result.exit_code in (1, 2) and "over the limit of 64" in result.output, result.output
    assert "--limit max_record_batch_size=N" in result.output
    raised = CliRunner().invoke(main, ["--limit=max_record_batch_size=1G", *args])
    assert "over the limit" not in raised.output


def test_the_verbs_take_the_limits_to_their_readers_and_workers(tmp_path):
    from replayfmt.measure.tune import SearchSpace
    from replayfmt.verbs import BenchmarkReplayOptions, CorpusOptions, TuneOptions, benchmark, tune
    from replayfmt.verbs.corpus_runs import verify_row

    low = DEFAULT_LIMITS.overridden(dict([parse_limit(LOW)]))
    with pytest.raises(ReplayFormatError, match="over the limit of 64"):  # before any device work
        benchmark(SAXPY, BenchmarkReplayOptions(limits=low))
    options = TuneOptions(space=SearchSpace(blocks=[(64, 1, 1)]), launch=9, limits=low)
    with pytest.raises(ReplayFormatError, match="over the limit of 64"):
        tune(SAXPY, options)
    assert DEFAULT_LIMITS.overridden(low.changes()) == low  # what a worker is told, and rebuilds
    assert CorpusOptions(limits=low).limits.changes() == {"max_record_batch_size": 64}
    row = verify_row(str(SAXPY), {"dry_run": True, "limits": low.changes()}).value
    assert row["verdict"] == "failed" and "over the limit of 64" in row["error"]
    assert verify_row(str(SAXPY), {"dry_run": True}).value["verdict"] == "planned"


def test_limits_are_overridden_by_name_and_checked():
    assert parse_limit("max_frame_size=256M") == ("max_frame_size", 256 << 20)
    assert parse_limit("max_read_size=1.5GiB") == ("max_read_size", 3 << 29)
    assert DEFAULT_LIMITS.overridden({"max_depth": 12}).max_depth == 12
    assert DEFAULT_LIMITS.overridden({}) == DEFAULT_LIMITS and DEFAULT_LIMITS.changes() == {}
    with pytest.raises(ReplayUsageError, match="no such limit"):
        DEFAULT_LIMITS.overridden({"max_depthh": 12})
    with pytest.raises(ReplayUsageError, match="whole number > 0"):
        DEFAULT_LIMITS.overridden({"max_depth": True})
    assert {f.name for f in dataclasses.fields(Limits)} >= {"max_depth", "max_frame_size"}
