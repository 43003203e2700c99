"""diff-replay on hand-made captures (tests/edit_captures.py): an inserted launch, a changed
shape, a recompiled executable, times side by side, --fail-on thresholds and exit codes."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from edit_captures import Variant, program_capture

import replayfmt
from replayfmt.edit.diff import LaunchInfo, align, diff_captures
from replayfmt.edit.diff_view import Threshold, failures, parse_fail_on
from replayfmt.errors import ReplayUsageError
from replayfmt_tools.diff_replay import main

IMAGE = b"\x7fELF" + bytes(252)


@pytest.fixture
def pair(tmp_path):
    a, b = tmp_path / "a.kreplay", tmp_path / "b.kreplay"
    program_capture(a, IMAGE)
    program_capture(b, IMAGE, Variant(insert_gather=True, last_grid=4, gather_image=b"v2", saxpy_scale=1.1))
    return a, b


def rows(output: str) -> list[dict]:
    return [json.loads(line) for line in output.splitlines()]


def test_same_program_is_the_same(tmp_path):
    a, b = tmp_path / "a.kreplay", tmp_path / "b.kreplay"
    program_capture(a, IMAGE)
    program_capture(b, IMAGE)
    r = CliRunner().invoke(main, [str(a), str(b)])
    assert r.exit_code == 0, r.output
    assert "launches  4 matched, 0 inserted, 0 removed; changed: 0 shape, 0 parameters, 0 executable" in r.output
    assert r.output.rstrip().endswith("verdict: same within the thresholds")
    r = CliRunner().invoke(main, ["--fail-on", "time=1%", "--fail-on", "scope-time=1%", str(a), str(b)])
    assert r.exit_code == 0, r.output


def test_inserted_launch_changed_shape_and_executable(pair):
    a, b = pair
    with replayfmt.open(a) as ca, replayfmt.open(b) as cb:
        d = diff_captures(ca, cb)
    changes = [(p.a.index if p.a else None, p.b.index if p.b else None, p.name, p.changes) for p in d.pairs]
    # a: saxpy(6) gather(7) saxpy(8) saxpy(9); b: saxpy(6) gather(7) gather(8) saxpy(9) saxpy(10, grid 4).
    # Which of b's two gathers is "the inserted one" nothing can tell: the alignment pairs one
    # (the common beginning takes the first) and nothing after the insertion shifts.
    assert changes == [
        (6, 6, "saxpy", ()),
        (7, 7, "gather", ("executable",)),
        (None, 8, "gather", ("inserted",)),
        (8, 9, "saxpy", ()),
        (9, 10, "saxpy", ("shape",)),
    ]
    kernels = {k.name: k for k in d.kernels}
    assert (kernels["saxpy"].count_a, kernels["saxpy"].count_b) == (3, 3)
    assert (kernels["saxpy"].time_a_ns, kernels["saxpy"].time_b_ns) == (60_000, 66_000)
    assert kernels["saxpy"].ratio == pytest.approx(1.1)
    assert (kernels["gather"].count_a, kernels["gather"].count_b, kernels["gather"].executable_changes) == (1, 2, 1)
    assert [(s.name, s.busy_a_ns, s.busy_b_ns) for s in d.scopes] == [("step", 64_000, 74_000)]


def test_table_and_exit_codes(pair):
    a, b = pair
    r = CliRunner().invoke(main, [str(a), str(b)])
    assert r.exit_code == 1
    out = r.output
    assert "launches  4 matched, 1 inserted, 0 removed; changed: 1 shape, 0 parameters, 1 executable" in out
    saxpy = next(line for line in out.splitlines() if line.startswith("saxpy "))
    assert saxpy.split()[1:7] == ["3", "3", "60.0", "us", "66.0", "us"] and "1.100" in saxpy and "shape x1" in saxpy
    assert "shape grid=1,1,1 block=256,1,1 smem=0 -> grid=4,1,1 block=256,1,1 smem=0" in out
    assert "inserted" in out and "executable image" in out
    assert "verdict: different: shape: 1 matched launches differ (saxpy); executable: 1" in out
    # thresholds on kernels' total times: saxpy x1.1, gather x2 (one more launch)
    assert CliRunner().invoke(main, ["--fail-on", "time=150%", str(a), str(b)]).exit_code == 0
    r = CliRunner().invoke(main, ["--fail-on", "time=50%", str(a), str(b)])
    assert r.exit_code == 1 and "time=50%: 1 kernels moved (gather x2.000)" in r.output
    r = CliRunner().invoke(main, ["--fail-on", "time=5%", str(a), str(b)])
    assert r.exit_code == 1 and "time=5%: 2 kernels moved (saxpy x1.100, gather x2.000)" in r.output
    assert CliRunner().invoke(main, ["--fail-on", "time=+5%", str(b), str(a)]).exit_code == 0  # faster: fine
    assert (
        CliRunner().invoke(main, ["--fail-on", "new-kernels", str(a), str(b)]).exit_code == 0
    )  # gather is on both sides
    assert CliRunner().invoke(main, ["--fail-on", "launches", str(a), str(b)]).exit_code == 1


def test_jsonl_rows(pair):
    a, b = pair
    r = CliRunner().invoke(main, ["--format=jsonl", str(a), str(b)])
    assert r.exit_code == 1
    got = rows(r.output)
    summary = got[0]
    assert summary["kind"] == "summary" and summary["verdict"] == "different"
    assert (summary["matched"], summary["inserted"], summary["removed"]) == (4, 1, 0)
    assert (summary["changed_shape"], summary["changed_executable"], summary["time_a_ns"], summary["time_b_ns"]) == (
        1,
        1,
        64_000,
        74_000,
    )
    kernels = {row["name"]: row for row in got if row["kind"] == "kernel"}
    assert kernels["gather"]["count_b"] == 2 and kernels["gather"]["executable_changes"] == 1
    launches = [row for row in got if row["kind"] == "launch"]
    assert [row["changes"] for row in launches] == [["executable"], ["inserted"], ["shape"]]
    assert launches[2]["a"]["grid"] == [1, 1, 1] and launches[2]["b"]["grid"] == [4, 1, 1]
    assert launches[1]["a"] is None and launches[1]["b"]["operation"] == 8
    assert launches[0]["a"]["executable_hash"] != launches[0]["b"]["executable_hash"]
    assert [row for row in got if row["kind"] == "scope"] == [
        {
            "kind": "scope",
            "name": "step",
            "occurrence": 0,
            "busy_a_ns": 64_000,
            "busy_b_ns": 74_000,
            "ratio": pytest.approx(74 / 64),
        }
    ]


def test_kernels_only_on_one_side(tmp_path):
    a, b = tmp_path / "a.kreplay", tmp_path / "b.kreplay"
    program_capture(a, IMAGE)
    program_capture(b, IMAGE)
    with replayfmt.open(a) as ca, replayfmt.open(b) as cb:
        d = diff_captures(ca, cb)
    d.pairs = align(
        [LaunchInfo(0, "k1", (1, 1, 1), (1, 1, 1), (0, 0, 0), 0, b"", "h", None)],
        [LaunchInfo(0, "k2", (1, 1, 1), (1, 1, 1), (0, 0, 0), 0, b"", "h", None)],
    )
    from replayfmt.edit.diff import _kernel_rows  # the rows of those pairs

    d.kernels = _kernel_rows(d.pairs)
    failed = failures(d, [Threshold("new-kernels"), Threshold("missing-kernels")])
    assert failed == [
        "new-kernels: 1 kernels only in the second capture (k2)",
        "missing-kernels: 1 kernels only in the first capture (k1)",
    ]


def test_usage_errors_exit_2(pair, tmp_path):
    a, _ = pair
    r = CliRunner().invoke(main, [str(a), str(tmp_path / "missing.kreplay")])
    assert r.exit_code == 2 and "no such file" in r.output
    (tmp_path / "junk.kreplay").write_bytes(b"not a capture at all" * 4)
    assert CliRunner().invoke(main, [str(a), str(tmp_path / "junk.kreplay")]).exit_code == 2
    r = CliRunner().invoke(main, ["--fail-on", "speed", str(a), str(a)])
    assert r.exit_code == 2 and "expected one of shape" in r.output
    with pytest.raises(ReplayUsageError, match="takes no percentage"):
        parse_fail_on("shape=5%")
    assert [t.describe() for t in parse_fail_on("time=+2.5%,any")][:2] == ["time=+2.5%", "shape"]


def test_changed_parameters_but_not_pointers(tmp_path):
    """Pointer words differ between any two runs (they are relocated): only the other bytes count."""
    a, b, c = tmp_path / "a.kreplay", tmp_path / "b.kreplay", tmp_path / "c.kreplay"
    program_capture(a, IMAGE)
    program_capture(b, IMAGE, Variant(pointer_fill=0x7F))
    program_capture(c, IMAGE, Variant(first_a=2.5))
    assert CliRunner().invoke(main, [str(a), str(b)]).exit_code == 0
    r = CliRunner().invoke(main, ["--fail-on", "parameters", str(a), str(c)])
    assert r.exit_code == 1 and "parameters differ (byte 2)" in r.output
    assert "verdict: different: parameters: 1 matched launches differ (saxpy)" in r.output
    r = CliRunner().invoke(main, ["--all-launches", "--format=jsonl", str(a), str(c)])
    launches = [row for row in rows(r.output) if row["kind"] == "launch"]
    assert [row["changes"] for row in launches] == [["parameters"], [], [], []]


def test_the_diff_verb_says_which_thresholds_the_change_crossed(pair):
    from replayfmt.verbs import DiffOptions, diff

    a, b = pair
    result = diff(a, b)
    # which of b's two gathers is the inserted one nothing can tell (test_inserted_launch_changed_shape_and_executable)
    assert [p.changes for p in result.diff.pairs if p.changes] == [("executable",), ("inserted",), ("shape",)]
    assert result.failed and any("shape" in f for f in result.failed)
    assert diff(a, a).failed == ()
    timed = diff(a, b, DiffOptions(fail_on=tuple(parse_fail_on("time=50%"))))
    assert timed.failed == ("time=50%: 1 kernels moved (gather x2.000)",)  # saxpy's 1.1x is within 50%
    with pytest.raises(ReplayUsageError, match="at least one threshold"):
        DiffOptions(fail_on=())
