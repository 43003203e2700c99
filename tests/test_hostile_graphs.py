"""Hostile input, round two (issue 26): the forged 1.2 files of tests/hostile_graphs.py through
the real tools, ``dump-replay`` (text, JSONL, JSONL with hex payloads) and ``run-replay
--dry-run``, in capped subprocesses (tests/test_hostile.py's driver): every run ends in 10 s and
1 GiB with exit 0 or a one-line refusal (exit 1 or 2), no traceback; and dump-replay's verdict is
the dry run's on every file. Then the pieces in-process: graph walks, totals, host files."""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import time
from pathlib import Path

import hostile_graphs as hg
import pytest
import test_hostile as th

import replayfmt
from replayfmt.container.files import FileRemap, open_regular, remap_path
from replayfmt.errors import ReplayError, ReplayFormatError, ReplayUsageError
from replayfmt.format import model as m
from replayfmt.format.layout import Limits
from replayfmt.replay import graph_plan
from replayfmt.replay.graph_plan import buffers_used_by_graph, children_first, kernel_nodes
from replayfmt.replay.plan import PlanOptions, build_plan
from replayfmt.replay.replayable import plan_verdict

COMMANDS = (
    ("dump-replay",),
    ("dump-replay", "--format=jsonl"),
    ("dump-replay", "--format=jsonl", "--payloads=hex"),
    ("run-replay", "--dry-run"),
)
# what a replay takes as it is: handled, and replayable (every other file is refused)
REPLAYABLE = {
    "graph_of_20k_nodes",
    "diamond_2x6_every",
    "legal_graphs",
    "empty_parameter_kernel",
    "timings_declare_10m_rows",
    "timings_name_missing_operations",
    "timings_not_a_flatbuffer",
    "timings_scope_out_of_range",
}


@pytest.fixture(scope="module")
def forged(tmp_path_factory) -> dict[str, tuple[Path, list[th.Outcome]]]:
    """Every forged file built, and the four commands run on each: the files split over two
    interpreters (imports paid once each), run side by side."""
    built = {}
    for build in hg.BUILDERS:
        built[build.__name__] = build(tmp_path_factory.mktemp(build.__name__))
    names = list(built)
    groups = [names[0::2], names[1::2]]

    def run(group: list[str]) -> list[th.Outcome]:
        commands = [[*c, str(built[name])] for name in group for c in COMMANDS]
        return th.run_tools(commands, built[group[0]].parent)

    started = time.perf_counter()
    with cf.ThreadPoolExecutor(2) as pool:
        ran = list(pool.map(run, groups))
    print(f"\nforged 1.2 files: {len(names)} files, {sum(map(len, ran))} runs in {time.perf_counter() - started:.1f} s")
    results = {}
    for group, outcomes in zip(groups, ran, strict=True):
        for k, name in enumerate(group):
            results[name] = (built[name], outcomes[k * len(COMMANDS) : (k + 1) * len(COMMANDS)])
    return results


def _dump_verdict(outcome: th.Outcome) -> bool:
    """dump-replay's text verdict: replayable or not (a file it cannot open is not)."""
    return "\nreplayable    yes" in outcome.stdout


def _jsonl_verdict(outcome: th.Outcome) -> bool | None:
    for line in outcome.stdout.splitlines():
        row = json.loads(line)
        if row["kind"] == "summary":
            return row["replayable"]
    return None


@pytest.mark.parametrize("build", hg.BUILDERS, ids=lambda b: b.__name__)
def test_forged_file_is_handled_or_refused_in_one_line(build, forged):
    path, runs = forged[build.__name__]
    assert len(runs) == len(COMMANDS), [(o.command, o.code, o.stderr[-300:]) for o in runs]
    report = [f"{' '.join(o.command)}: {'; '.join(p)}" for o in runs if (p := th.check(o, ()))]
    assert not report, f"{path.name}:\n" + "\n".join(report)


@pytest.mark.parametrize("build", hg.BUILDERS, ids=lambda b: b.__name__)
def test_dump_verdict_is_the_dry_run_verdict(build, forged):
    _, (text, jsonl, jsonl_hex, dry_run) = forged[build.__name__]
    planned = dry_run.code == 0 and "dry run: plan OK" in dry_run.stdout
    assert _dump_verdict(text) == planned, (text.stdout[-800:], text.stderr, dry_run.stdout[-400:], dry_run.stderr)
    for rows in (jsonl, jsonl_hex):
        assert _jsonl_verdict(rows) in (planned, None if rows.code else planned)
    assert planned == (build.__name__ in REPLAYABLE), (dry_run.stdout[-400:], dry_run.stderr)
    if not planned and text.code == 0:  # the summary says why, in the plan's words
        reasons = text.stdout.split("replayable    no:\n", 1)[1]
        first = (dry_run.stderr.strip().splitlines() or [""])[0].removeprefix("run-replay: error: ")
        assert f"  - {first}" in reasons, (reasons[:600], first)


def test_a_dropped_timings_chunk_is_a_warning_not_a_blank_dump(forged):
    for name in sorted(n for n in REPLAYABLE if n.startswith("timings_")):
        _, (text, jsonl, _, dry_run) = forged[name]
        warning = "the original program's times (TIMINGS chunk) were dropped"
        assert text.code == 0 and warning in text.stdout and "op       4 memset" in text.stdout
        assert jsonl.code == 0 and sum('"kind":"memset"' in row for row in jsonl.stdout.splitlines()) == 4
        assert dry_run.code == 0 and warning in dry_run.stdout and dry_run.stderr == ""


def test_a_cut_capture_without_device_work_is_refused_alike(forged):
    """Issue 25: the recovered part holds objects and state but no device work."""
    _, (text, _, _, dry_run) = forged["cut_without_device_work"]
    why = (
        "the file was recovered and none of the 3 operations that survived is device work "
        "(a launch, graph launch, copy or memset)"
    )
    assert why in text.stdout and "replayable    yes" not in text.stdout
    assert dry_run.code == 1 and "plan OK" not in dry_run.stdout and why in dry_run.stderr


# -- graph walks, in-process ------------------------------------------------------------------


def _plan_of(path: Path, **options: object) -> object:
    with replayfmt.open(path) as cap:
        return build_plan(cap, PlanOptions(**options))


def test_chains_and_diamonds_are_refused_fast_never_recursed(tmp_path, monkeypatch):
    checked: list[int] = []  # the graphs the plan checked, counted rather than timed (a clock measures load)
    check_one = graph_plan._check_one
    monkeypatch.setattr(
        graph_plan,
        "_check_one",
        lambda graphs, o, graph, *a: [checked.append(graph.id), check_one(graphs, o, graph, *a)],
    )
    for build in (hg.child_chain_top, hg.child_chain_every, hg.diamond_8x30, hg.diamond_4x12_every):
        path = build(tmp_path)
        with replayfmt.open(path) as cap:
            graph_count = sum(isinstance(o, m.Graph) for o in cap.objects())
        checked.clear()
        with pytest.raises(ReplayError) as info:
            _plan_of(path)
        assert len(checked) == len(set(checked)) <= graph_count, build.__name__  # each graph once, none expanded
        assert "Limits.max_graph_depth" in str(info.value) or "Limits.max_graph_visits" in str(info.value)


def test_deep_chains_walk_iteratively_when_the_limits_allow(tmp_path):
    """With the depth limit lifted, a chain of 2,000 child graphs is checked and walked without
    recursion, each graph once; a wide diamond is walked once per graph, not once per path."""
    path = hg.child_chain_top(tmp_path)
    limits = Limits(max_graph_depth=4096)
    with replayfmt.open(path, limits=limits) as cap:
        plan = build_plan(cap)
        top = max(plan.graphs)
        assert len(plan.graphs) == 2000 and plan.graph_sizes[top].depth == 2000
        assert buffers_used_by_graph(plan.graphs, top, limits) == {1}
        assert len(children_first(plan.graphs, top, {}, limits)) == 2000
    path = hg.diamond(tmp_path, wide=8, deep=6, launch_every=True)
    with replayfmt.open(path) as cap:
        plan = build_plan(cap)
        top = max(plan.graphs)
        assert plan.graph_sizes[top].nodes == 8**5  # the expansion, counted without walking it
        assert len(children_first(plan.graphs, top, {})) == 1 + 8 * 5
        assert len(kernel_nodes(plan.graphs, top)) == 0 and buffers_used_by_graph(plan.graphs, top) == {1}


def test_all_graphs_of_a_capture_are_charged_together(tmp_path):
    path = tmp_path / "many.kreplay"
    with replayfmt.CaptureWriter(path, threads=0, batch_operations=1) as w:
        buf = w.add_object(m.Buffer(size=4096))
        for _ in range(4):
            w.graph_launch(w.add_object(m.Graph(nodes=tuple(hg._memset_node(buf) for _ in range(100)))))
    with replayfmt.open(path) as cap:
        assert plan_verdict(cap).replayable
    with replayfmt.open(path, limits=Limits(max_graph_nodes_total=350)) as cap:
        for _ in range(2):  # the batch over the budget is refused again, from memory
            with pytest.raises(ReplayFormatError, match=r"more than 350 nodes in all \(Limits.max_graph_nodes_total\)"):
                list(cap.objects())


def test_the_writer_never_writes_a_graph_its_reader_refuses(tmp_path):
    with (
        replayfmt.CaptureWriter(tmp_path / "big.kreplay", threads=0) as w,
        pytest.raises(ReplayUsageError, match=r"Limits\.max_graph_nodes"),
    ):
        w.add_object(m.Graph(nodes=(m.GraphNode(),) * (Limits().max_graph_nodes + 1)))
        w.flush()


def test_a_replay_refuses_what_the_dry_run_refuses(tmp_path):
    """The replay itself: a session whose plan has problems does not start."""
    from replayfmt.execute import ReplaySession

    path = hg.cut_without_device_work(tmp_path)
    with replayfmt.open(path) as cap:
        session = ReplaySession(cap, PlanOptions())
        assert session.plan.problems
        with pytest.raises(ReplayError, match="none of the 3 operations that survived is device work"):
            session.start()


# -- host files, in-process -------------------------------------------------------------------


def test_only_regular_files_are_opened(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "real")
    (tmp_path / "real").write_bytes(b"x")
    for path in (fifo, tmp_path, link, Path("/dev/null"), Path("/proc/self/environ"), Path("/proc/self/status")):
        with pytest.raises(OSError):
            os.close(open_regular(str(path)))
    os.close(open_regular(str(tmp_path / "real")))


def test_a_remap_never_follows_a_symlink_out_of_its_prefix(tmp_path):
    new = tmp_path / "new"
    new.mkdir()
    (new / "ok.bin").write_bytes(b"ok")
    outside = tmp_path / "outside"
    outside.mkdir()
    (new / "door").symlink_to(outside)
    remap = [FileRemap("/data", str(new))]
    assert remap_path("/data/ok.bin", remap) == str(new / "ok.bin")
    with pytest.raises(ReplayUsageError, match="through a symlink; refused"):
        remap_path("/data/door/secret", remap)
