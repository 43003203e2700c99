"""benchmark-replay without a GPU: region selection, statistics and usage errors."""

import json

import pytest
from click.testing import CliRunner

import replayfmt
from replayfmt.measure.benchmark import BenchmarkResult, KernelTiming, Region, Stats, find_region
from replayfmt_tools.benchmark_replay import _compare, _csv, main


def scoped(path, markers) -> None:
    with replayfmt.CaptureWriter(path) as w:
        for kind, name in markers:
            (w.scope_begin if kind == "begin" else w.scope_end)(name)


@pytest.mark.parametrize(
    ("markers", "scope", "region"),
    [
        ([("begin", "a"), ("end", "a")], "a", Region("a", 1, 1)),
        (
            [("begin", "a"), ("begin", "b"), ("end", "b"), ("end", "a"), ("begin", "b"), ("end", "b")],
            "b",
            Region("b", 2, 2),
        ),
        ([("begin", "a"), ("begin", "a"), ("end", "a"), ("end", "a")], "a", Region("a", 1, 3)),
        ([("begin", "a"), ("end", "a")], None, Region(None, 0, 2)),
    ],
)
def test_find_region(tmp_path, markers, scope, region):
    path = tmp_path / "s.kreplay"
    scoped(path, markers)
    with replayfmt.open(path) as cap:
        assert find_region(cap, scope) == region


@pytest.mark.parametrize(
    ("markers", "error", "message"),
    [
        ([("begin", "a"), ("end", "b")], replayfmt.ReplayError, "scope end 'b' matches no open scope ('a' is open)"),
        ([("end", "a")], replayfmt.ReplayError, "no scope is open"),
        ([("begin", "a")], replayfmt.ReplayError, "scope 'a' is never closed"),
        ([("begin", "a"), ("end", "a")], replayfmt.ReplayUsageError, "no such scope (scopes: a)"),
    ],
)
def test_find_region_rejects(tmp_path, markers, error, message):
    path = tmp_path / "s.kreplay"
    scoped(path, markers)
    with replayfmt.open(path) as cap, pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
        find_region(cap, "zzz" if "no such" in message else "a")


def test_stats():
    s = Stats.of([1.0, 2.0, 3.0, 4.0, 10.0])
    assert (s.min, s.median, s.mean) == (1.0, 3.0, 4.0) and s.p90 == pytest.approx(7.6) and s.stddev > 0
    assert Stats.of([]).median == 0.0 and Stats.of([2.0]).stddev == 0.0


def _result(median: float) -> BenchmarkResult:
    s = Stats(median, median, median, 0.0, median)
    return BenchmarkResult("c", "gpu", "step", (1, 5), "eager", 10, 3, False, s, s, [KernelTiming(2, "k", 1, s)])


def test_compare_and_csv(tmp_path):
    baseline = tmp_path / "base.json"
    baseline.write_text(json.dumps(_result(2.0).to_json()))
    lines = _compare(_result(1.0), baseline)
    assert "2.000x" in lines[1] and "op       2 k" in lines[2] and "2.000x" in lines[2]
    assert _csv(_result(1.0)).splitlines()[0].startswith("what,name,operation,min_ms")
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    with pytest.raises(replayfmt.ReplayUsageError, match="not a benchmark-replay JSON result"):
        _compare(_result(1.0), bad)


def test_cli_usage_errors_need_no_gpu(tmp_path):
    path = tmp_path / "s.kreplay"
    scoped(path, [("begin", "step"), ("end", "step")])
    result = CliRunner().invoke(main, ["--scope=nope", str(path)])
    assert result.exit_code == 2 and "no such scope (scopes: step)" in result.stderr
    existing = tmp_path / "t.json"
    existing.write_text("{}")
    result = CliRunner().invoke(main, [f"--trace={existing}", str(path)])
    assert result.exit_code == 2 and "already exists" in result.stderr
    unbalanced = tmp_path / "u.kreplay"
    scoped(unbalanced, [("begin", "step")])
    result = CliRunner().invoke(main, [str(unbalanced)])
    assert result.exit_code == 1 and "never closed" in result.stderr


def test_agents_md_has_the_benchmark_notes():
    result = CliRunner().invoke(main, ["--agents-md"])
    assert result.exit_code == 0 and "## benchmark-replay notes" in result.stdout
