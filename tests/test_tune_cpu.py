"""tune-replay without a GPU: the space, pruning, targets, CSV and resume, the plot, usage errors."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import replayfmt
from replayfmt.container.files import FileRemap
from replayfmt.format import model as m
from replayfmt.measure.tune import (
    Candidate,
    CandidateResult,
    CsvLog,
    SearchSpace,
    capture_identity,
    find_targets,
    order,
    override_flags,
    parse_dims_list,
    parse_int_list,
    prune,
    read_csv,
    search,
)
from replayfmt.measure.tune_plot import plot
from replayfmt.replay.plan import build_plan
from replayfmt.replay.plan_options import LaunchOverride, PlanOptions, Substitution
from replayfmt_tools.tune_replay import main

SCALE = m.Function(name="scale", max_threads_per_block=512, max_dynamic_shared_memory=64 * 1024)
OTHER = m.Function(name="other")


def capture(path: Path) -> Path:
    with replayfmt.CaptureWriter(path) as w:
        exe = w.add_object(m.Executable(functions=(SCALE, OTHER)))
        for _ in range(3):
            w.launch(executable=exe, function=0, grid=(64, 1, 1), block=(256, 1, 1))
        w.launch(executable=exe, function=1, grid=(1, 1, 1), block=(32, 1, 1))
    return path


def test_parse_lists():
    assert parse_dims_list(("64;128", "32,4,1", "64"), "--block") == [(64, 1, 1), (128, 1, 1), (32, 4, 1)]
    assert parse_int_list(("0;1024", "2048"), "--smem") == [0, 1024, 2048]
    for bad in ("0", "1,2", "a"):
        with pytest.raises(replayfmt.ReplayUsageError, match="--block"):
            parse_dims_list((bad,), "--block")


def test_space_keeps_absent_axes():
    points = SearchSpace(blocks=[(64, 1, 1), (128, 1, 1)], smems=[0, 4096]).points()
    assert len(points) == 4 and all(p.grid is None for p in points)


def test_targets_and_pruning(tmp_path):
    with replayfmt.open(capture(tmp_path / "t.kreplay")) as cap:
        plan = build_plan(cap)
        targets = find_targets(plan, launch=None, kernel="^sca")
        assert targets.operations == (1, 2, 3) and targets.kernel == "scale" and targets.block == (256, 1, 1)
        assert find_targets(plan, launch=4, kernel=None).kernel == "other"
        with pytest.raises(replayfmt.ReplayUsageError, match="several kernels"):
            find_targets(plan, launch=None, kernel=".")
        with pytest.raises(replayfmt.ReplayUsageError, match="exactly one"):
            find_targets(plan, launch=None, kernel=None)
        with pytest.raises(replayfmt.ReplayUsageError, match="operation 0 is not a launch"):
            find_targets(plan, launch=0, kernel=None)
        space = SearchSpace(
            grids=[(1, 1, 1), (70000, 70000, 1)], blocks=[(256, 1, 1), (1024, 1, 1)], smems=[0, 1 << 20]
        )
        valid, pruned = prune(plan, targets, space.points())
    assert valid == [Candidate((1, 1, 1), (256, 1, 1), 0)]
    reasons = " ".join(r for _, r in pruned)
    assert "over scale's limit of 512" in reasons and "over the limit of 65536" in reasons and "grid" in reasons
    assert override_flags(targets, valid[0]) == " ".join(
        f"--launch={op}:grid=1,1,1,block=256,1,1,smem=0" for op in (1, 2, 3)
    )


class FakeWorker:
    """Times a candidate as grid * block (smaller is faster); block 512 'faults'."""

    def __init__(self) -> None:
        self.seen: list[Candidate] = []

    def evaluate(self, candidate: Candidate, timeout: float) -> CandidateResult:
        self.seen.append(candidate)
        if candidate.block == (512, 1, 1):
            return CandidateResult(candidate, error="CUDA_ERROR_ILLEGAL_ADDRESS")
        g = (candidate.grid or (64, 1, 1))[0]
        return CandidateResult(candidate, float(g), 0.01, True)


def test_csv_streams_results_and_resumes(tmp_path):
    with replayfmt.open(capture(tmp_path / "t.kreplay")) as cap:
        targets = find_targets(build_plan(cap), launch=1, kernel=None)
    points = SearchSpace(grids=[(1, 1, 1), (2, 1, 1)], blocks=[(128, 1, 1), (512, 1, 1)]).points()
    path = tmp_path / "tune.csv"
    log = CsvLog(path, targets)
    worker = FakeWorker()
    first = list(search(worker, points[:2], done={}, log=log, timeout=1))
    log.close()
    assert first[0].baseline and [r.candidate for r in first[1:]] == points[:2]
    done = read_csv(path)
    assert len(done) == 3 and done[Candidate().key()].baseline
    assert done[points[1].key()].error == "CUDA_ERROR_ILLEGAL_ADDRESS"
    log = CsvLog(path, targets)
    worker = FakeWorker()
    rest = list(search(worker, points, done=done, log=log, timeout=1))
    log.close()
    assert worker.seen == points[2:] and len(rest) == 2 and len(read_csv(path)) == 5
    bad = tmp_path / "bad.csv"
    bad.write_text("something,else\n1,2\n")
    with pytest.raises(replayfmt.ReplayUsageError, match="not a tune-replay CSV"):
        read_csv(bad)


def test_csv_of_another_kernel_or_capture_is_refused(tmp_path):
    """Resuming ranks the CSV's rows with this search's: rows of another kernel, other
    operations or another capture are refused with one line naming --csv."""
    with replayfmt.open(capture(tmp_path / "t.kreplay")) as cap:
        plan = build_plan(cap)
        scale, other = find_targets(plan, launch=1, kernel=None), find_targets(plan, launch=None, kernel="other")
        identity = capture_identity(cap)
    path = tmp_path / "tune.csv"
    log = CsvLog(path, scale, identity)
    list(search(FakeWorker(), [Candidate(grid=(2, 1, 1))], done={}, log=log, timeout=1))
    log.close()
    assert len(read_csv(path, scale, identity)) == 2
    with pytest.raises(replayfmt.ReplayUsageError) as info:
        read_csv(path, other, identity)
    assert str(info.value) == (
        f"--csv {path}: line 2 is for kernel scale (operations 1), not this search's other (operations 4); "
        "choose another --csv file"
    )
    with replayfmt.open(capture(tmp_path / "same.kreplay")) as cap:  # the same content: its results apply
        assert capture_identity(cap) == identity
    with replayfmt.CaptureWriter(tmp_path / "u.kreplay") as w:  # the same program on other data
        exe = w.add_object(m.Executable(functions=(SCALE, OTHER)))
        w.add_payload(b"other input")
        for _ in range(3):
            w.launch(executable=exe, function=0, grid=(64, 1, 1), block=(256, 1, 1))
        w.launch(executable=exe, function=1, grid=(1, 1, 1), block=(32, 1, 1))
    with replayfmt.open(tmp_path / "u.kreplay") as cap:
        again = capture_identity(cap)
    assert again != identity
    with pytest.raises(replayfmt.ReplayUsageError, match=rf"line 2 was measured on another capture \({identity}"):
        read_csv(path, scale, again)


def test_order_random_with_budget():
    points = SearchSpace(blocks=[(b, 1, 1) for b in (32, 64, 128, 256, 512)]).points()
    picked = order(points, "random", 3)
    assert len(picked) == 3 and set(picked) <= set(points) and order(points, "grid", None) == points


def test_plot_draws_a_heatmap(tmp_path):
    pytest.importorskip("matplotlib")
    with replayfmt.open(capture(tmp_path / "t.kreplay")) as cap:
        targets = find_targets(build_plan(cap), launch=1, kernel=None)
    results = [CandidateResult(Candidate(), 1.0, 0.0, True, baseline=True)]
    results += [
        CandidateResult(Candidate((g, 1, 1), (b, 1, 1)), float(g * b), 0.0, True) for g in (1, 2, 4) for b in (64, 128)
    ]
    results.append(CandidateResult(Candidate((8, 1, 1), (64, 1, 1)), error="fault"))
    out = tmp_path / "t.png"
    plot(results, targets, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 2000


def test_register_caps_are_an_axis_and_need_ptx(tmp_path):
    path = capture(tmp_path / "t.kreplay")
    points = SearchSpace(blocks=[(64, 1, 1)], max_registers=[8, 32]).points()
    with replayfmt.open(path) as cap:
        plan = build_plan(cap)
        targets = find_targets(plan, launch=1, kernel=None)
        valid, pruned = prune(plan, targets, points)
    assert valid == [Candidate(None, (64, 1, 1), None, 32)] and "outside [16, 255]" in pruned[0][1]
    assert "re-JIT executable" in override_flags(targets, valid[0])
    log = CsvLog(tmp_path / "r.csv", targets)
    log.write(CandidateResult(valid[0], 1.0, 0.0, True))
    log.close()
    assert list(read_csv(tmp_path / "r.csv")) == [valid[0].key()]
    result = CliRunner().invoke(main, ["--launch=1", "--max-registers=32", str(path)])
    assert result.exit_code == 2 and "only PTX can be re-JITted" in result.stderr


def test_cli_usage_errors(tmp_path):
    path = capture(tmp_path / "t.kreplay")
    result = CliRunner().invoke(main, ["--launch=1", str(path)])
    assert result.exit_code == 2 and "give a search space" in result.stderr
    result = CliRunner().invoke(main, ["--launch=1", "--kernel=x", "--block=64", str(path)])
    assert result.exit_code == 2 and "exactly one" in result.stderr
    existing = tmp_path / "p.png"
    existing.write_bytes(b"")
    result = CliRunner().invoke(main, ["--launch=1", "--block=64", f"--plot={existing}", str(path)])
    assert result.exit_code == 2 and "already exists" in result.stderr


def test_tools_share_the_replay_and_tolerance_options_with_their_help():
    from replayfmt_tools.run_replay import main as run_main

    helps = {}
    for tool in (main, run_main):
        params = {p.name: p for p in tool.params}
        helps[tool] = {
            name: params[name].help
            for name in ("substitutions", "remaps", "fixed_addresses", "use_tolerance", "rtol", "atol")
        }
    assert helps[main] == helps[run_main] and all(helps[main].values())
    text = " ".join(CliRunner().invoke(main, ["--help"]).stdout.split())
    assert "Relative tolerance (implies --tolerance)." in text and "The ABI must match." in text


def test_the_tune_verb_searches_resumes_and_names_the_winner(tmp_path, monkeypatch):
    import replayfmt.verbs.tuning as tuning
    from replayfmt.verbs import TuneOptions, tune

    class Worker(FakeWorker):
        restarts = 0

        def __init__(self, config) -> None:
            super().__init__()
            assert config.operations == (1, 2, 3)

        def close(self) -> None:
            pass

    monkeypatch.setattr(tuning, "Worker", Worker)
    path = capture(tmp_path / "t.kreplay")
    space = SearchSpace(grids=[(1, 1, 1), (2, 1, 1)], blocks=[(128, 1, 1), (512, 1, 1)])
    options = TuneOptions(space=space, kernel="^sca", csv=tmp_path / "t.csv")
    lines: list[str] = []
    result = tune(path, options, progress=lines.append)
    assert lines[0].startswith("tuning scale (operations 1, 2, 3)") and "4 to evaluate" in lines[1]
    assert result.good[0].candidate == Candidate((1, 1, 1), (128, 1, 1)) and len(result.failed) == 2
    assert result.baseline is not None and result.baseline.ok
    assert result.best_flags == " ".join(f"--launch={op}:grid=1,1,1,block=128,1,1,smem=0" for op in (1, 2, 3))
    again = tune(path, options)  # resumed from the CSV: nothing evaluated twice
    assert {r.candidate for r in again.results} == {r.candidate for r in result.results}
    with pytest.raises(replayfmt.ReplayUsageError, match="give a search space"):
        TuneOptions(space=SearchSpace(), launch=1)
    # the workers are told the plan's options whole, as one JSON object
    plan = PlanOptions(
        substitutions=(Substitution.parse("7@ptx=/k.ptx"), Substitution.parse("all=/x.cubin")),
        remaps=(FileRemap.parse("/a=/b"),),
        launch_overrides=(LaunchOverride.parse("3:grid=2,block=64,smem=128"), LaunchOverride.parse("4:skip")),
        fixed_addresses=True,
    )
    config = tuning.worker_config(str(path), result.targets, TuneOptions(space=space, launch=1, plan=plan))
    assert PlanOptions.from_dict(json.loads(json.dumps(config.plan))) == plan
    assert PlanOptions.from_dict({}) == PlanOptions()
    with pytest.raises(replayfmt.ReplayUsageError, match="plan options"):
        PlanOptions.from_dict({"substitutions": [{"path": "/x"}]})


def test_a_candidate_reshapes_a_launch_as_run_replay_launch_does(tmp_path):
    import json

    from replayfmt.measure.tune import candidate_request
    from replayfmt.replay.plan_options import LaunchOverride, ShapeOverride

    with replayfmt.open(capture(tmp_path / "t.kreplay")) as cap:
        op = cap.operation(1)
    candidate = Candidate(block=(128, 1, 1), smem=4096)
    sent = json.loads(json.dumps(candidate_request(candidate)))  # the worker's line
    reshape = ShapeOverride.from_dict(sent["reshape"])
    flag = LaunchOverride.parse("1:block=128,smem=4096")
    assert reshape == candidate.reshape == flag.reshape
    assert reshape.apply(op) == flag.shape(op) and reshape.apply(op).grid == (64, 1, 1)
    for bad, field in [({"grid": [0, 1, 1]}, "grid"), ({"block": [2, 2]}, "block"), ({"shared_memory": -1}, "shared")]:
        with pytest.raises(replayfmt.ReplayUsageError, match=field):
            ShapeOverride.from_dict(bad)
