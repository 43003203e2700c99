"""Fan-out on a real local Dask cluster (one shared by this module: it starts in a few seconds)
and on local processes, without a GPU: tasks spread over one worker per "GPU" (each pinned with
CUDA_VISIBLE_DEVICES), a worker killed mid-sweep replaced and reported, a poisoned worker
replaced, a hung task timed out; tune-replay's search and corpus-replay through it."""

from __future__ import annotations

import shutil
from pathlib import Path

import fanout_tasks as tasks
import pytest
from click.testing import CliRunner

import replayfmt
from replayfmt.format import model as m
from replayfmt.measure.corpus import compare, read_csv, run_corpus, write_csv
from replayfmt.measure.fanout import Task, open_fanout
from replayfmt.measure.tune import (
    Candidate,
    CsvLog,
    SearchSpace,
    WorkerConfig,
    fan_out_search,
    find_targets,
    read_csv as tune_csv,
)
from replayfmt.replay.plan import build_plan
from replayfmt_tools.corpus_replay import main as corpus_main

pytest.importorskip("distributed")
EXAMPLES = Path(__file__).parent.parent / "examples"


@pytest.fixture(scope="module")
def dask_fanout():
    with open_fanout([0, 1], engine="dask") as fanout:
        yield fanout


@pytest.fixture(scope="module")
def local_fanout():
    with open_fanout([0, 1], engine="local") as fanout:
        yield fanout


def test_a_worker_killed_mid_sweep_is_replaced_and_reported(dask_fanout):
    assert dask_fanout.engine.startswith("dask") and dask_fanout.workers == ["gpu0", "gpu1"]
    before = dask_fanout.replaced
    sweep = [Task(k, tasks.pinned_to) for k in range(4)]
    sweep += [Task("die", tasks.die, (3,))] + [Task(f"after{k}", tasks.pinned_to) for k in range(6)]
    results = {r.key: r for r in dask_fanout.run(sweep, timeout=60)}
    assert len(results) == 11
    died = results["die"]
    assert died.error == "the worker died (its process ended during the task)" and died.worker_replaced
    assert dask_fanout.replaced == before + 1
    pinned = {r.worker: r.value[0] for r in results.values() if r.key != "die"}
    assert pinned == {"gpu0": "0", "gpu1": "1"}  # each worker sees its own GPU only
    on_dead = {r.value[1] for r in results.values() if r.worker == died.worker and r.key != "die"}
    assert len(on_dead) == 2  # that worker's process before, and its replacement after
    assert all(not r.error for k, r in results.items() if k != "die")


def test_poisoned_workers_are_replaced_failing_tasks_are_not_and_hung_ones_time_out(dask_fanout):
    before = dask_fanout.replaced
    sweep = [Task("poison", tasks.poison, (7,)), Task("fail", tasks.fail, ("boom",))]
    results = {r.key: r for r in dask_fanout.run(sweep)}
    results.update((r.key, r) for r in dask_fanout.run([Task("slow", tasks.sleep, (30,))], timeout=2))
    assert results["poison"].value == 7 and results["poison"].worker_replaced and not results["poison"].error
    assert results["fail"].error == "ValueError: boom" and not results["fail"].worker_replaced
    assert results["slow"].error == "timed out after 2 s" and results["slow"].worker_replaced
    assert dask_fanout.replaced == before + 2
    assert sorted(r.value for r in dask_fanout.run([Task(k, tasks.square, (k,)) for k in range(4)])) == [0, 1, 4, 9]


def test_local_processes_replace_a_dead_worker(local_fanout):
    sweep = [Task("die", tasks.die, (5,))] + [Task(k, tasks.pinned_to) for k in range(4)]
    results = {r.key: r for r in local_fanout.run(sweep, timeout=60)}
    assert results["die"].error == "the worker died (its process ended with exit status 5)"
    assert results["die"].worker_replaced and local_fanout.replaced == 1
    assert {r.value[0] for k, r in results.items() if k != "die"} <= {"0", "1"}


def tune_capture(path: Path) -> Path:
    fn = m.Function(name="scale", max_threads_per_block=1024)
    with replayfmt.CaptureWriter(path) as w:
        exe = w.add_object(m.Executable(functions=(fn,)))
        w.launch(executable=exe, function=0, grid=(64, 1, 1), block=(256, 1, 1))
    return path


def test_tune_candidates_fan_out_and_a_crashing_one_is_reported(tmp_path, dask_fanout):
    """The tune pipeline (targets, pruning, CSV) over the cluster, candidates evaluated by a
    stand-in for the GPU worker: block 512 takes its worker down, block 1024 poisons it."""
    path = tune_capture(tmp_path / "t.kreplay")
    with replayfmt.open(path) as cap:
        plan = build_plan(cap)
        targets = find_targets(plan, launch=1, kernel=None)
    points = SearchSpace(grids=[(8, 1, 1), (16, 1, 1)], blocks=[(128, 1, 1), (512, 1, 1), (1024, 1, 1)]).points()
    config = WorkerConfig(capture=str(path), operations=targets.operations, plan={})
    log = CsvLog(tmp_path / "tune.csv", targets)
    before = dask_fanout.replaced
    results = list(
        fan_out_search(dask_fanout, config, points, done={}, log=log, timeout=60, evaluate=tasks.fake_candidate)
    )
    log.close()
    by = {r.candidate: r for r in results}
    assert len(results) == 7 and by[Candidate()].baseline and by[Candidate()].median_ms == 64.0
    assert by[Candidate((8, 1, 1), (128, 1, 1))].median_ms == 8.0 and by[Candidate((8, 1, 1), (128, 1, 1))].ok
    crashed = [r for r in results if r.candidate.block == (512, 1, 1)]
    assert [r.error for r in crashed] == ["the worker died (its process ended during the task)"] * 2
    poisoned = [r for r in results if r.candidate.block == (1024, 1, 1)]
    assert [r.error for r in poisoned] == ["CUDA_ERROR_ILLEGAL_ADDRESS"] * 2
    assert dask_fanout.replaced == before + 4
    assert len(tune_csv(tmp_path / "tune.csv", targets)) == 7  # every result streamed to the CSV


def corpus(tmp_path: Path) -> Path:
    directory = tmp_path / "corpus"
    directory.mkdir()
    shutil.copy(EXAMPLES / "saxpy.kreplay", directory / "a.kreplay")
    tune_capture(directory / "b.kreplay")
    broken = (directory / "a.kreplay").read_bytes()
    (directory / "broken.kreplay").write_bytes(broken[:2000])  # recovered: no operation survives
    return directory


def test_a_corpus_runs_over_the_cluster_and_a_crashing_capture_loses_only_its_worker(tmp_path, dask_fanout):
    directory = corpus(tmp_path)
    shutil.copy(directory / "b.kreplay", directory / "crash.kreplay")
    paths = sorted(directory.iterdir())
    before = dask_fanout.replaced
    rows = {r.capture: r for r in run_corpus(dask_fanout, paths, {"dry_run": True}, task=tasks.replay_or_crash)}
    assert rows["a.kreplay"].verdict == "planned" and rows["a.kreplay"].operations == 13
    assert rows["b.kreplay"].verdict == "planned" and rows["b.kreplay"].operations == 2
    assert rows["broken.kreplay"].verdict == "failed" and "no operation survived" in rows["broken.kreplay"].error
    assert rows["crash.kreplay"].verdict == "lost" and "the worker died" in rows["crash.kreplay"].error
    assert dask_fanout.replaced == before + 1
    write_csv(tmp_path / "rows.csv", list(rows.values()))
    again = read_csv(tmp_path / "rows.csv")
    assert [(r.capture, r.verdict, r.operations) for r in again] == [
        (r.capture, r.verdict, r.operations) for r in rows.values()
    ]
    faster = [r for r in again if r.capture != "crash.kreplay"]
    for r in faster:
        r.device_ms = 1.0
    slower = [r for r in read_csv(tmp_path / "rows.csv") if r.capture != "crash.kreplay"]
    slower[0].device_ms, slower[1].device_ms = 1.2, 1.01
    regressions = {c.capture: c.regression for c in compare(slower, faster, 1.05) if c.regression}
    assert regressions == {slower[0].capture: "1.20x the baseline's device time (over 1.05x)"}
    missing = compare(faster[:1], faster, 1.05)
    assert sorted(c.regression for c in missing) == ["", *["missing from this run"] * (len(faster) - 1)]


def test_corpus_replay_dry_run_on_a_local_dask_cluster_compares_with_a_baseline(tmp_path):
    directory = corpus(tmp_path)
    runner = CliRunner()
    args = ["--dry-run", "--engine", "dask", "--device", "cuda:0", "--device", "cuda:1"]
    result = runner.invoke(corpus_main, [*args, "--csv", str(tmp_path / "base.csv"), str(directory)])
    assert result.exit_code == 1, result.output  # the broken capture
    assert "workers: dask (SpecCluster): 2 worker(s) (gpu0, gpu1)" in result.output
    assert "2 planned, 1 failed" in result.output
    (directory / "broken.kreplay").unlink()
    again = runner.invoke(corpus_main, [*args, "--compare-to", str(tmp_path / "base.csv"), str(directory)])
    assert again.exit_code == 1 and "broken.kreplay" in again.output and "missing from this run" in again.output
    result = runner.invoke(corpus_main, ["--dry-run", "--engine", "local", str(tmp_path / "none")])
    assert result.exit_code == 2 and f"corpus-replay: error: DIR {tmp_path / 'none'}: not a directory" in result.stderr
