"""A new user's first hour, part two (issue 25): a closed pipe never hides a failure, every path
and flag is checked before any program, worker or GPU work starts, and errors carry the name the
user typed. GPU-free; each test failed before."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import replayfmt.verbs.benchmarking as benchmarking
import replayfmt.verbs.recording as record_verb
import replayfmt.verbs.tuning as tune_verb
from replayfmt_tools import benchmark_replay, capture_replay, dump_replay, tune_replay

ROOT = Path(__file__).resolve().parent.parent
SAXPY = ROOT / "examples" / "saxpy.kreplay"
NO_GPU = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}


@pytest.fixture
def cap(tmp_path) -> Path:
    path = tmp_path / "cap.kreplay"
    shutil.copy(SAXPY, path)
    return path


def invoke(main, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exc_info
    return result.exit_code, result.stdout, result.stderr


def one_error(err: str, tool: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{tool}: error: ") and "Traceback" not in err, err
    return lines[0]


class NoWork:
    """Stands for what must not start (a tune worker, the recorder): constructing it fails the test."""

    def __init__(self, *args, **kwargs) -> None:
        raise AssertionError("work started before the flags were checked")


def with_closed_stdout(args: list[str]) -> subprocess.CompletedProcess:
    """Run a command whose stdout reader has gone before its first line (``| head -1``, at its
    most hurried: in 4 runs of 5 that hid tune-replay's worker error behind exit 0)."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(args, stdout=write, stderr=subprocess.PIPE, text=True, env=NO_GPU, timeout=120)
    finally:
        os.close(write)


# -- a closed pipe -------------------------------------------------------------------------------


def test_a_closed_pipe_never_hides_the_searchs_failure(cap):
    done = with_closed_stdout(
        [sys.executable, "-m", "replayfmt_tools.tune_replay", "--launch=9", "--block=64;128", str(cap)]
    )
    assert done.returncode != 0, done.stderr
    assert "tune-replay: error: " in done.stderr and "Traceback" not in done.stderr


def test_a_closed_pipe_ends_a_dump_quietly(cap):
    """dump-replay's output is its work: the reader took what it wanted (documented: exit 0)."""
    done = with_closed_stdout([sys.executable, "-m", "replayfmt_tools.dump_replay", str(cap)])
    assert done.returncode == 0 and done.stderr == ""


# -- tune-replay ---------------------------------------------------------------------------------


def test_a_search_space_wholly_pruned_is_a_usage_error_before_any_worker(cap, monkeypatch):
    """It printed "1 pruned, 0 to evaluate", then started a worker that failed."""
    monkeypatch.setattr(tune_verb, "Worker", NoWork)
    code, out, err = invoke(tune_replay.main, "--launch=9", "--block=4096", str(cap))
    line = one_error(err, "tune-replay")
    assert code == 2 and "every point of the search space is pruned (1), none to evaluate" in line
    assert "block=4096,1,1: block 4096,1,1 outside the device's limits" in line and out == ""


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("tune.xyz", "'.xyz' is no image format matplotlib writes"),
        ("tune", "no extension names the format"),
    ],
)
def test_the_plot_path_is_checked_before_the_search(cap, tmp_path, monkeypatch, name, message):
    monkeypatch.setattr(tune_verb, "Worker", NoWork)
    code, _, err = invoke(tune_replay.main, "--launch=9", "--block=64;128", f"--plot={tmp_path / name}", str(cap))
    assert code == 2 and message in one_error(err, "tune-replay")


# -- dump-replay --payloads=files: ---------------------------------------------------------------


def test_payload_files_never_grow_a_tree_of_directories(cap, tmp_path):
    target = tmp_path / "missing" / "x"
    code, out, err = invoke(dump_replay.main, "--format=jsonl", f"--payloads=files:{target}/", str(cap))
    line = one_error(err, "dump-replay")
    assert code == 2 and out == "" and f"its parent {tmp_path / 'missing'} does not exist" in line
    assert not (tmp_path / "missing").exists()


def test_payload_files_name_a_file_in_the_directorys_place(cap, tmp_path):
    plain = tmp_path / "plain"
    plain.write_text("mine")
    code, _, err = invoke(dump_replay.main, "--format=jsonl", f"--payloads=files:{plain}", str(cap))
    line = one_error(err, "dump-replay")
    assert code == 2 and f"{plain} is a file, not a directory" in line and "File exists" not in line
    assert plain.read_text() == "mine"


def test_payload_files_create_the_last_level_and_say_so(cap, tmp_path):
    target = tmp_path / "payloads"
    code, out, err = invoke(dump_replay.main, "--format=jsonl", f"--payloads=files:{target}", str(cap))
    assert code == 0 and f"created the directory {target}" in err and str(target) in out
    assert sorted(p.suffix for p in target.iterdir()) == [".bin"] * len(list(target.iterdir())) != []


# -- dump-replay --jq and --format ---------------------------------------------------------------


def test_jq_with_the_json_format_runs_on_the_summary(cap):
    code, out, _ = invoke(dump_replay.main, "--format=json", "--jq=.replayable", str(cap))
    assert code == 0 and out == "true\n"
    code, out, _ = invoke(dump_replay.main, "--format=json", "--jq=.operations.launch", str(cap))
    assert code == 0 and json.loads(out) == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--format=text", "--jq=.kind"], "--jq runs on JSONL rows"),
        (["--format=json", "--summary"], "--summary shortens the text format; --format=json prints the summary"),
        (["--format=jsonl", "--summary"], "--summary shortens the text format; --format=jsonl prints one row"),
    ],
)
def test_flags_that_would_be_ignored_are_refused(cap, args, message):
    code, _, err = invoke(dump_replay.main, *args, str(cap))
    assert code == 2 and message in one_error(err, "dump-replay")


# -- benchmark-replay: paths before the GPU ------------------------------------------------------


@pytest.mark.parametrize(
    ("flag", "setup", "message"),
    [
        ("--compare-to", None, "--compare-to {p}: cannot read (No such file or directory)"),
        ("--compare-to", "not json", "--compare-to {p}: not JSON (Expecting value at line 1)"),
        ("--compare-to", "[1]", "--compare-to {p}: not a benchmark-replay --format=json result"),
        ("--compare-to", '{"kernels": []}', "--compare-to {p}: not a benchmark-replay --format=json result (no"),
        ("--trace", "dir/", "--trace {p}: the directory {p.parent} does not exist"),
        ("--trace", "{}", "--trace {p}: the file already exists"),
    ],
)
def test_benchmark_paths_are_checked_before_the_gpu(cap, tmp_path, monkeypatch, flag, setup, message):
    """Without a GPU the old code said the GPU was missing: these were read only after the run."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setattr(benchmarking, "open_replay", NoWork)
    path = tmp_path / "b.json"
    if setup == "dir/":
        path = tmp_path / "missing" / "t.json"
    elif setup is not None:
        path.write_text(setup)
    code, _, err = invoke(benchmark_replay.main, f"{flag}={path}", str(cap))
    assert code == 2 and message.format(p=path) in one_error(err, "benchmark-replay")


# -- the recorder's -o, and its name -------------------------------------------------------------


def program(tmp_path: Path) -> tuple[Path, Path]:
    marker = tmp_path / "ran"
    script = tmp_path / "prog.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    return script, marker


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("exists", "-o {o}: the file already exists; pass --overwrite to replace it"),
        ("missing", "-o {o}: the directory {o.parent} does not exist"),
        ("unwritable", "-o {o}: cannot create a file in /proc"),
        ("file-parent", "-o {o}: the directory {o.parent} is not a directory"),
    ],
)
def test_the_recorders_output_is_checked_before_the_program_runs(tmp_path, monkeypatch, where, message):
    monkeypatch.setattr(record_verb, "Recorder", NoWork)
    script, marker = program(tmp_path)
    out = {
        "exists": tmp_path / "old.kreplay",
        "missing": tmp_path / "no" / "o.kreplay",
        "unwritable": Path("/proc/o.kreplay"),
        "file-parent": script / "o.kreplay",
    }[where]
    if where == "exists":
        out.write_bytes(b"the user's")
    code, _, err = invoke(capture_replay.main, "-o", str(out), str(script))
    assert code == 2 and message.format(o=out) in one_error(err, "capture-replay")
    assert not marker.exists()
    if where == "exists":
        assert out.read_bytes() == b"the user's"


def test_python_m_capture_errors_carry_the_name_typed(tmp_path):
    """README starts the recorder as python -m replayfmt.capture; its errors said capture-replay."""
    script, marker = program(tmp_path)
    out = tmp_path / "old.kreplay"
    out.write_bytes(b"the user's")
    done = subprocess.run(
        [sys.executable, "-m", "replayfmt.capture", "-o", str(out), str(script)],
        capture_output=True,
        text=True,
        env=NO_GPU,
        timeout=120,
    )
    line = one_error(done.stderr, "python -m replayfmt.capture")
    assert done.returncode == 2 and "the file already exists; pass --overwrite" in line
    assert not marker.exists() and out.read_bytes() == b"the user's"
