"""A new user's first hour (issue 17): every mistake ends in one line and the right exit code, no
flag is silently ignored, and kernel names read demangled. GPU-free; each test failed before."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner
from samples import compiled_cubin

import replayfmt
from replayfmt.capture.report import KernelStats, Report
from replayfmt.dump import Dumper, summarize
from replayfmt.format import model as m, names
from replayfmt.format.names import demangle
from replayfmt.measure.benchmark import BenchmarkResult, KernelTiming, Stats
from replayfmt.measure.tune import Candidate, CandidateResult, Targets, find_targets
from replayfmt.replay.plan import build_plan
from replayfmt.replay.replayable import plan_verdict
from replayfmt_tools import benchmark_replay, capture_replay, dump_replay, run_replay, tune_replay

ROOT = Path(__file__).resolve().parent.parent
SAXPY = ROOT / "examples" / "saxpy.kreplay"
FILL = "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEENS_6detail5ArrayIPcLi1EEEEEviT0_T1_"
FILL_READ = (
    "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
    "at::detail::Array<char*, 1> >(int, at::native::FillFunctor<float>, at::detail::Array<char*, 1>)"
)


def invoke(main, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exc_info
    return result.exit_code, result.stdout, result.stderr


def one_line(err: str, tool: str) -> str:
    """The single error line a tool printed (and never a traceback or a doubled prefix)."""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"{tool}: error: ") and f"error: {tool}:" not in lines[0], err
    return lines[0]


@pytest.fixture
def cap(tmp_path) -> Path:
    path = tmp_path / "cap.kreplay"
    shutil.copy(SAXPY, path)
    return path


def mangled_capture(path: Path) -> Path:
    """Two kernels, one of them a mangled C++ symbol (as PyTorch's are)."""
    with replayfmt.CaptureWriter(path) as w:
        exe = w.add_object(m.Executable(functions=(m.Function(name=FILL), m.Function(name="add_kernel"))))
        w.launch(executable=exe, function=0, grid=(8, 1, 1), block=(128, 1, 1))
        w.launch(executable=exe, function=1, grid=(1, 1, 1), block=(32, 1, 1))
    return path


# -- tracebacks --------------------------------------------------------------------------------


def test_capture_without_a_driver_is_one_line(tmp_path):
    """cupti-python raising its own NotSupportedError (no driver) used to print 35 lines."""
    fake = tmp_path / "fake" / "cupti"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "cupti.py").write_text(
        "class NotSupportedError(RuntimeError):\n    pass\n\n\n"
        "def get_callback_name(domain, cbid):\n    raise NotSupportedError('CUPTI_ERROR_NOT_INITIALIZED')\n"
    )
    script = tmp_path / "prog.py"
    script.write_text("print('ran')\n")
    env = {**os.environ, "PYTHONPATH": f"{fake.parent}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run(
        [sys.executable, "-m", "replayfmt.capture", "-o", str(tmp_path / "o.kreplay"), str(script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    line = one_line(done.stderr, "python -m replayfmt.capture")  # the name typed, not capture-replay
    assert done.returncode == 2 and "NotSupportedError: CUPTI_ERROR_NOT_INITIALIZED" in line and "driver" in line
    assert not (tmp_path / "o.kreplay").exists() and "ran" not in done.stdout


def test_tune_bad_kernel_regex(cap):
    code, _, err = invoke(tune_replay.main, "--kernel=[", "--block=64", str(cap))
    assert code == 2 and "--kernel '[': not a regular expression (unterminated character set" in one_line(
        err, "tune-replay"
    )


def test_tune_kernel_regex_matches_demangled_names(tmp_path):
    path = mangled_capture(tmp_path / "t.kreplay")
    with replayfmt.open(path) as c:
        targets = find_targets(build_plan(c), launch=None, kernel=r"^void at::native::vectorized_elementwise")
    assert targets.kernel == FILL and targets.operations == (1,)


@pytest.mark.parametrize("where", ["missing", "file", "read-only"])
def test_tune_csv_in_a_directory_that_cannot_take_it(cap, tmp_path, monkeypatch, where):
    if where == "missing":
        csv, expected = tmp_path / "nope" / "t.csv", f"{tmp_path / 'nope'} does not exist"
    elif where == "file":
        (tmp_path / "f").write_text("")
        csv, expected = tmp_path / "f" / "t.csv", "is not a directory"
    else:  # root writes anywhere: ask the same question the tool asks, answered "no"
        ro = tmp_path / "ro"
        ro.mkdir()
        real = os.access
        monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == ro else real(p, mode))
        csv, expected = ro / "t.csv", "the directory is not writable"
    code, out, err = invoke(tune_replay.main, "--launch=9", "--block=64", f"--csv={csv}", str(cap))
    assert code == 2 and expected in one_line(err, "tune-replay") and out == ""


def test_tune_without_a_gpu_exits_2_and_leaves_no_csv(cap, tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no device, whether or not this machine has one
    csv = tmp_path / "t.csv"
    code, _, err = invoke(tune_replay.main, "--launch=9", "--block=64;128", f"--csv={csv}", str(cap))
    assert code == 2 and "the worker did not start" in one_line(err, "tune-replay")
    assert not csv.exists()  # no header-only CSV: the file is made with the first result


def test_make_saxpy_capture_refuses_to_overwrite(tmp_path):
    out = tmp_path / "s.kreplay"
    out.write_bytes(b"mine")
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "make_saxpy_capture.py"), "--output", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip() == f"make_saxpy_capture.py: error: {out} already exists; pass --force to replace it"
    assert out.read_bytes() == b"mine"


# -- silent no-ops and wrong answers --------------------------------------------------------------


def test_payloads_without_jsonl_is_an_error(cap, tmp_path):
    code, out, err = invoke(dump_replay.main, f"--payloads=files:{tmp_path / 'p'}", str(cap))
    assert code == 2 and out == "" and "add --format=jsonl" in one_line(err, "dump-replay")
    code, _, err = invoke(dump_replay.main, "--format=json", "--payloads=hex", str(cap))
    assert code == 2 and "--payloads=hex applies to JSONL rows" in err
    code, out, _ = invoke(dump_replay.main, "--format=jsonl", "--kind=copy_h2d", "--payloads=hex", str(cap))
    assert code == 0 and out.count('"kind":"copy_h2d"') == 2


def test_object_the_capture_lacks(cap):
    code, out, err = invoke(dump_replay.main, "--object=999", str(cap))
    assert code == 2 and out == ""
    assert one_line(err, "dump-replay") == "dump-replay: error: --object 999: the capture has objects 1 to 5"


@pytest.mark.parametrize("value", ["-1", "nan", "inf"])
def test_tolerances_must_be_finite_and_non_negative(cap, value):
    for main in (run_replay.main, tune_replay.main):
        extra = ["--dry-run"] if main is run_replay.main else ["--launch=9", "--block=64"]
        code, _, err = invoke(main, *extra, f"--rtol={value}", str(cap))
        assert code == 2 and "is not a finite number >= 0" in err
    code, out, _ = invoke(run_replay.main, "--dry-run", "--rtol=1e-3", "--atol=0", str(cap))
    assert code == 0 and "plan OK" in out


def test_a_cut_file_says_it_was_recovered_and_cannot_replay(cap, tmp_path):
    cut = tmp_path / "cut.kreplay"
    cut.write_bytes(cap.read_bytes()[:20_000])
    code, out, err = invoke(dump_replay.main, "--summary", str(cut))
    assert code == 1 and "replayable    yes" not in out
    assert "  - the file was recovered and no operation survived (9520 bytes at its end were discarded)" in out
    code, out, err = invoke(run_replay.main, "--dry-run", str(cut))
    assert code == 1 and "plan OK" not in out and "dry run: plan has problems" in out
    assert "recovered     yes: the file was not closed properly; 9520 bytes at its end were discarded" in out
    assert err.strip() == (
        "run-replay: error: the file was recovered and no operation survived (9520 bytes at its "
        "end were discarded): not replayable as captured"
    )


def test_a_recovered_prefix_replays_and_says_so(tmp_path):
    path = tmp_path / "torn.kreplay"
    with replayfmt.CaptureWriter(tmp_path / "live.kreplay", threads=0, batch_operations=4) as w:
        buf = w.add_object(m.Buffer(size=64))
        for _ in range(12):
            w.memset(buffer=buf, value=1, count=16)
        w.flush()
        path.write_bytes((tmp_path / "live.kreplay").read_bytes())  # as a crashed writer leaves it: no footer
    with replayfmt.open(path) as c:
        kept = c.operation_count
        assert c.recovered and kept > 0
        assert plan_verdict(c).replayable
        summary = summarize(c, problems=plan_verdict(c).problems)
    assert summary.replayable
    code, out, _ = invoke(run_replay.main, "--dry-run", str(path))
    assert code == 0 and f"only the {kept} recovered operations replay" in out and "plan OK" in out


@pytest.fixture
def sm80_and_sm90() -> tuple[bytes, bytes]:
    source = ROOT / "examples" / "kernels" / "saxpy.cu"
    return compiled_cubin(source, "sm_80"), compiled_cubin(source, "sm_90")  # checked-in fixtures


def test_a_cubin_for_another_architecture_fails_the_dry_run(cap, tmp_path, sm80_and_sm90):
    (tmp_path / "s80.cubin").write_bytes(sm80_and_sm90[0])
    (tmp_path / "s90.cubin").write_bytes(sm80_and_sm90[1])
    code, out, err = invoke(
        run_replay.main, "--dry-run", f"--executable-substitution=5={tmp_path / 's80.cubin'}", str(cap)
    )
    assert code == 1 and "plan OK" not in out
    expected = (
        f"run-replay: error: executable 5: {tmp_path / 's80.cubin'} is a cubin for sm_80, but the "
        "captured executable targets sm_90: it cannot run it (rebuild it with -arch=sm_90)"
    )
    assert err.strip() == expected
    code, out, _ = invoke(
        run_replay.main, "--dry-run", f"--executable-substitution=5={tmp_path / 's90.cubin'}", str(cap)
    )
    assert code == 0 and "plan OK" in out


def test_substitution_messages_name_flag_and_path(cap, tmp_path):
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"hello")
    code, _, err = invoke(run_replay.main, "--dry-run", f"--executable-substitution=5={junk}", str(cap))
    assert code == 2 and one_line(err, "run-replay") == (
        f"run-replay: error: --executable-substitution 5: {junk}: unrecognised executable format "
        "(expected a cubin, fatbin or PTX file)"
    )
    code, _, err = invoke(run_replay.main, "--dry-run", f"--executable-substitution=99={junk}", str(cap))
    assert code == 2 and "--executable-substitution 99: the capture has no object 99; executables: 5" in err
    code, _, err = invoke(run_replay.main, "--dry-run", f"--executable-substitution=3={junk}", str(cap))
    assert code == 2 and "object 3 is a buffer, not an executable" in err


# -- consistency ------------------------------------------------------------------------------------


def test_every_option_of_every_tool_has_help():
    for main in (tune_replay.main, run_replay.main, benchmark_replay.main, dump_replay.main, capture_replay.main):
        bare = [p.name for p in main.params if p.param_type_name == "option" and not p.help]
        assert bare == [], f"{main.name}: options without help: {bare}"


def test_benchmark_output_is_written_only_on_success(cap, tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    out = tmp_path / "base.json"
    code, stdout, err = invoke(benchmark_replay.main, "--format=json", f"--output={out}", str(cap))
    assert code == 2 and not out.exists() and stdout == "" and list(tmp_path.iterdir()) == [cap]
    out.write_text("{}")
    code, _, err = invoke(benchmark_replay.main, f"--output={out}", str(cap))
    assert code == 2 and f"--output {out}: " in err and "already exists" in err
    code, _, err = invoke(benchmark_replay.main, f"--output={tmp_path / 'no' / 'b.json'}", str(cap))
    assert code == 2 and "does not exist" in err
    target = tmp_path / "atomic.json"
    benchmark_replay.write_atomically(target, '{"ok": 1}\n')
    assert target.read_text() == '{"ok": 1}\n' and sorted(p.name for p in tmp_path.iterdir()) == [
        "atomic.json",
        "base.json",
        "cap.kreplay",
    ]


def test_pyproject_packages_every_directory_and_uses_an_spdx_license():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["license"] == "Apache-2.0"
    listed = set(project["tool"]["setuptools"]["packages"])
    on_disk = {
        ".".join(d.relative_to(ROOT).parts)
        for d in (ROOT / "replayfmt").rglob("*")
        if d.is_dir() and d.name != "__pycache__" and any(f.is_file() for f in d.iterdir())
    } | {"replayfmt", "replayfmt_tools"}  # replayfmt_tools: the top-level tools/ folder (package-dir)
    assert project["tool"]["setuptools"]["package-dir"] == {"replayfmt_tools": "tools"}
    assert on_disk == listed  # setuptools warns about (and drops from wheels) importable dirs not listed
    for package, files in project["tool"]["setuptools"]["package-data"].items():
        for name in files:
            assert (ROOT / package.replace(".", "/") / name).is_file(), (package, name)


def test_skips_are_summarised_once_per_reason(tmp_path):
    """With the project's own pytest configuration and conftest, skips sharing a reason print once
    (-ra printed one line per skipping test: 47 identical "no GPU" lines)."""
    shutil.copy(ROOT / "tests" / "conftest.py", tmp_path / "conftest.py")
    tests = "import pytest\n" + "".join(f"\n\ndef test_{i}():\n    pytest.skip('no GPU here')\n" for i in range(5))
    (tmp_path / "test_x.py").write_text(tests)
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'tests'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-c",
            str(ROOT / "pyproject.toml"),
            "--rootdir",
            str(tmp_path),
            "-p",
            "no:cacheprovider",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert "5 skipped" in done.stdout and done.stdout.count("no GPU here") == 1, done.stdout
    assert "5 skipped: no GPU here" in done.stdout


# -- names ------------------------------------------------------------------------------------------


def test_demangle():
    assert demangle("_Z5saxpyfPKfPfi") == "saxpy(float, float const*, float*, int)"
    assert demangle(FILL) == FILL_READ
    for raw in ("saxpy", "add_kernel", "_Zbad", "", "_Z" + "x" * (names.MAX_MANGLED + 1)):
        assert demangle(raw) == raw


def test_demangle_falls_back_to_cxxfilt(monkeypatch):
    if shutil.which("c++filt") is None:
        pytest.skip("c++filt not installed")
    monkeypatch.setattr(names, "_cxa_demangle", lambda: None)
    names._demangle_cached.cache_clear()
    try:
        assert demangle(FILL) == FILL_READ and demangle("_Zbad") == "_Zbad"
    finally:
        names._demangle_cached.cache_clear()


def test_dump_shows_demangled_names_and_keeps_raw_ones(tmp_path):
    path = mangled_capture(tmp_path / "t.kreplay")
    code, out, _ = invoke(dump_replay.main, str(path))
    assert code == 0 and FILL_READ in out and FILL not in out
    code, out, _ = invoke(
        dump_replay.main, "--jq", 'select(.kind=="launch") | [.function, .function_demangled]', str(path)
    )
    rows = [line for line in out.split("\n") if line.strip()]
    assert code == 0 and f'"{FILL}"' in out and f'"{FILL_READ}"' in out and rows[1] == '["add_kernel", null]'
    code, out, _ = invoke(dump_replay.main, "--format=jsonl", "--kind=executable", str(path))
    assert f'"name":"{FILL}","demangled":"{FILL_READ}"' in out and '"name":"add_kernel","parameters_known"' in out
    code, out, _ = invoke(dump_replay.main, "--kind=launch", "--grep=FillFunctor<float>", str(path))
    assert code == 0 and out.count("\nop ") == 1
    with replayfmt.open(path) as c:
        assert any(FILL_READ in line for line in Dumper(c).text_lines())


def test_capture_report_benchmark_and_tune_show_demangled_names(tmp_path):
    report = Report(path="x.kreplay", operations=3, kernels={FILL: KernelStats(2, 1, 64), "add_kernel": KernelStats(1)})
    text = "\n".join(report.lines())
    assert "void at::native::vectorized_elementwise_kernel<4, at::nat..." in text and FILL not in text
    stats = Stats(1.0, 1.0, 1.0, 0.0, 1.0)
    result = BenchmarkResult(
        "c", "H100", None, (0, 2), "eager", 10, 1, False, stats, stats, [KernelTiming(1, FILL, 0, stats)]
    )
    assert FILL_READ in "\n".join(benchmark_replay._text(result))
    row = benchmark_replay.result_json(result)
    assert row["kernels"][0]["name"] == FILL and row["kernels"][0]["name_demangled"] == FILL_READ
    assert FILL_READ in benchmark_replay._csv(result)
    path = mangled_capture(tmp_path / "t.kreplay")
    _, out, _ = invoke(tune_replay.main, "--kernel=FillFunctor", "--block=64", "--budget=1", str(path))
    assert out.startswith(f"tuning {FILL_READ} (operations 1)")
    code, out, _ = invoke(run_replay.main, "--dry-run", str(path))
    assert code == 0 and f"(ABI checked at load): {FILL_READ}, add_kernel" in out


# -- plots ------------------------------------------------------------------------------------------


def _targets(kernel: str = FILL) -> Targets:
    return Targets((3,), 1, 0, kernel, (64, 1, 1), (256, 1, 1), 0)


def _inside(inner, outer) -> bool:
    return (
        inner.x0 >= outer.x0 - 1 and inner.y0 >= outer.y0 - 1 and inner.x1 <= outer.x1 + 1 and inner.y1 <= outer.y1 + 1
    )


def _rendered(fig):
    fig.canvas.draw()
    return fig.canvas.get_renderer()


def test_a_one_axis_sweep_is_a_line_chart(tmp_path):
    pytest.importorskip("matplotlib")
    from replayfmt.measure.tune_plot import figure, plot

    results = [CandidateResult(Candidate(), 0.02, 0.001, True, baseline=True)]
    results += [CandidateResult(Candidate(block=(b, 1, 1)), 0.3 / b, 0.0, True) for b in (64, 128, 256, 512)]
    results.append(CandidateResult(Candidate(block=(1024, 1, 1)), error="fault"))
    fig = figure(results, _targets())
    ax = fig.axes[0]
    assert len(fig.axes) == 1 and not ax.images  # no one-column heatmap, no colour bar
    assert [t.get_text() for t in ax.get_xticklabels()] == ["64", "128", "256", "512", "1024"]
    labels = [line.get_label() for line in ax.get_lines()]
    assert any(label.startswith("captured shape") for label in labels) and any("failed" in lb for lb in labels)
    assert ax.get_xlabel() == "block (threads)" and "void at::native::vectorized_elementwise_kernel" in ax.get_title()
    renderer = _rendered(fig)
    assert _inside(ax.title.get_window_extent(renderer), fig.bbox)  # the title is not cut
    out = tmp_path / "line.png"
    plot(results, _targets(), out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_two_axis_sweep_is_a_heatmap_with_its_colour_bar_beside_it():
    pytest.importorskip("matplotlib")
    from replayfmt.measure.tune_plot import figure

    results = [CandidateResult(Candidate(), 0.02, 0.0, True, baseline=True)]
    results += [
        CandidateResult(Candidate((g, 1, 1), (b, 1, 1)), 1.0 / (g * b), 0.0, True)
        for g in (16, 32, 64, 128)
        for b in (64, 128, 256)
    ]
    results.append(CandidateResult(Candidate((128, 1, 1), (512, 1, 1)), error="timed out"))
    fig = figure(results, _targets())
    ax, bar = fig.axes
    assert len(ax.images) == 1 and ax.get_ylabel() == "grid" and ax.get_xlabel() == "block (threads)"
    renderer = _rendered(fig)
    main_box, bar_box = ax.get_window_extent(renderer), bar.get_window_extent(renderer)
    assert bar_box.x0 >= main_box.x1  # the colour bar does not cover data
    assert _inside(ax.title.get_window_extent(renderer), fig.bbox)
    assert "x" in [t.get_text() for t in ax.texts]  # the failed cell is marked
    assert ax.patches and ax.patches[0].get_edgecolor()[:3] == (1.0, 0.0, 0.0)  # the captured cell outlined


def test_json_rows_keep_one_line_each(tmp_path):
    """Demangled names with spaces and angle brackets stay valid JSONL."""
    import json

    path = mangled_capture(tmp_path / "t.kreplay")
    code, out, _ = invoke(dump_replay.main, "--format=jsonl", str(path))
    rows = [json.loads(line) for line in out.splitlines()]
    launch = next(r for r in rows if r["kind"] == "launch")
    assert code == 0 and launch["function"] == FILL and launch["function_demangled"] == FILL_READ
    assert "function_demangled" not in next(r for r in rows if r["kind"] == "launch" and r["function"] == "add_kernel")


def test_capture_kernels_pattern_matches_demangled_names_too():
    import re

    from replayfmt.format.names import matches_kernel

    symbol = "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEEEEviT0_"
    assert matches_kernel(re.compile(r"^_ZN2at"), symbol)
    assert matches_kernel(re.compile(r"at::native::vectorized_elementwise_kernel"), symbol)
    assert not matches_kernel(re.compile(r"softmax"), symbol)
