"""The recorder's close-time verdict (run-replay's plan on its own file), what a capture needs
from the host, and module images stored whatever the file policy; no GPU."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from test_capture_translate import MODULE, A, FakeMemory, kernel, record, saxpy_params

import replayfmt
import replayfmt.verbs.recording as record_verb
from replayfmt.capture import RecordOptions, Translator, events as ev
from replayfmt.capture.hostfiles import HostFiles
from replayfmt.capture.self_check import Outcome, ReplayCheck
from replayfmt.capture.verdict import check_capture
from replayfmt.dump.summary import render_summary_text, summarize
from replayfmt.format import model as m
from replayfmt.replay.plan import PlanOptions, build_plan
from replayfmt.writer import CaptureWriter
from replayfmt_tools import capture_replay


def saxpy_events(image: ev.ModuleImage) -> list:
    return [
        image,
        ev.Allocation(A, 64),
        ev.LaunchBegin(kernel(), (1, 1, 1), (16, 1, 1), 0, 0, saxpy_params(1.0, A, A, 16)),
    ]


def test_a_clean_capture_is_replayable_and_needs_nothing_from_the_host(tmp_path, cubin):
    mem = FakeMemory()
    mem.device[A] = bytearray(64)
    path, t = record(tmp_path, saxpy_events(ev.ModuleImage(MODULE, cubin, None)), mem)
    verdict = check_capture(path)
    assert verdict.replayable and verdict.line() == "replayable: yes (plan only: not replayed)"
    assert verdict.host_line() == "needs nothing from the host"
    t.report.verdict = verdict
    assert t.report.lines()[-2:] == ["  needs nothing from the host", "  replayable: yes (plan only: not replayed)"]


def test_the_first_reason_is_given_when_replay_would_refuse(tmp_path, cubin):
    mem = FakeMemory()
    mem.device[A] = bytearray(64)
    events = [*saxpy_events(ev.ModuleImage(MODULE, cubin, None)), ev.NotReproducible("cuIpcOpenMemHandle", "IPC")]
    path, _ = record(tmp_path, events, mem)
    verdict = check_capture(path)
    assert not verdict.replayable
    assert verdict.line().startswith("replayable: no: ") and "cuIpcOpenMemHandle" in verdict.line()
    with replayfmt.open(path) as cap, pytest.raises(replayfmt.errors.ReplayError) as exc:
        build_plan(cap, PlanOptions())
    assert verdict.reason == str(exc.value)  # exactly what run-replay says


@pytest.mark.parametrize("policy", [m.FilePolicy.REFERENCE, m.FilePolicy.FAIL, m.FilePolicy.CAPTURE_ALL])
def test_module_images_loaded_from_files_are_stored_whatever_the_file_policy(tmp_path, cubin, policy):
    cache = tmp_path / "inductor-cache"
    cache.mkdir()
    image_file = cache / "kernel.cubin"
    image_file.write_bytes(cubin)
    mem = FakeMemory()
    mem.device[A] = bytearray(64)
    path = tmp_path / "c.kreplay"
    with CaptureWriter(path) as writer:
        t = Translator(writer, RecordOptions(file_policy=policy), mem, host_files=HostFiles(tmp_path / "no-maps"))
        t.start()
        for e in saxpy_events(ev.ModuleImage(MODULE, None, str(image_file), "cuModuleLoad")):
            t.handle(e)
        t.stop()
    image_file.unlink()
    cache.rmdir()  # the compile cache is gone, as on any other machine
    with replayfmt.open(path) as cap:
        exe = next(o for o in cap.objects() if isinstance(o, m.Executable))
        assert exe.payload and not exe.file and cap.read_payload(exe.payload) == cubin
        assert exe.label == str(image_file)  # where it came from, for the reader
        assert not [o for o in cap.objects() if isinstance(o, m.FileReference)]
        assert summarize(cap).needs_from_host == []
    assert check_capture(path).replayable


def test_referenced_data_files_are_listed_as_host_needs(tmp_path, cubin):
    weights = tmp_path / "w.bin"
    weights.write_bytes(bytes(4096))
    maps = tmp_path / "maps"
    maps.write_text(f"10000-11000 r--p 00000000 08:01 {weights.stat().st_ino} {weights}\n")
    mem = FakeMemory()
    mem.device[A] = bytearray(4096)
    mem.host[0x10000] = bytes(4096)
    path = tmp_path / "c.kreplay"
    with CaptureWriter(path) as writer:
        t = Translator(writer, RecordOptions(), mem, host_files=HostFiles(maps))
        t.handle(ev.Allocation(A, 4096))
        t.start()
        t.handle(ev.Copy(ev.CopyDirection.H2D, A, 0x10000, 4096, 0, False, "cuMemcpyHtoD_v2"))
        t.stop()
    verdict = check_capture(path)
    assert verdict.replayable and verdict.host_files == [str(weights)]
    assert verdict.host_line() == f"needs 1 file(s) from the host: {weights}"
    with replayfmt.open(path) as cap:
        assert f"host needs    {weights}" in render_summary_text(summarize(cap))
    weights.unlink()
    assert check_capture(path).reason.startswith("file reference ")


class _FakeRecorder:
    """Stands in for the CUPTI recorder: records one launch and, when asked, an unsupported call."""

    unsupported = False
    replay = None  # what the self-check's child replay earns (a ReplayCheck), or None: not asked
    fail = False  # the recorder's own first error stops the capture

    def __init__(self, output, options, *, overwrite, command_line) -> None:
        self.writer = CaptureWriter(output, overwrite=overwrite)
        mem = FakeMemory()
        mem.device[A] = bytearray(64)
        self.translator = Translator(self.writer, options, mem, host_files=HostFiles("/nonexistent-maps"))
        self.image = _FakeRecorder.image

    def start(self) -> None:
        self.translator.start()

    def close(self, *, program_failed=""):
        t = self.translator
        for e in saxpy_events(ev.ModuleImage(MODULE, self.image, None)):
            t.handle(e)
        if self.unsupported:
            t.handle(ev.NotReproducible("cuIpcOpenMemHandle", "memory shared between processes (IPC)"))
        if self.fail:
            t.handle(ev.Memset(A, 0, 3, 1))  # the writer refuses a 3-byte memset: the recorder's first error
        if program_failed and t.in_progress and not t.report.partial:
            t.report.partial = f"the program stopped while it was being recorded: {program_failed}"
        if not t.report.partial:
            t.stop()
        self.writer.close(partial=t.report.partial)
        t.report.verdict = check_capture(self.writer.path)
        return t.report

    def self_check(self, limits):
        verdict = self.translator.report.verdict
        verdict.replay = self.replay
        if self.replay is not None and self.replay.outcome == Outcome.FAILED:
            verdict.replayable, verdict.reason = False, self.replay.describe()
        return self.translator.report


@pytest.mark.parametrize("unsupported", [False, True])
@pytest.mark.parametrize("keep", [False, True])
def test_capture_replay_exits_1_and_removes_an_unreplayable_capture_unless_kept(
    tmp_path, cubin, monkeypatch, unsupported, keep
):
    script = tmp_path / "prog.py"
    script.write_text("print('hello')\n")
    out = tmp_path / "out.kreplay"
    _FakeRecorder.image = cubin
    monkeypatch.setattr(_FakeRecorder, "unsupported", unsupported)
    monkeypatch.setattr(record_verb, "Recorder", _FakeRecorder)
    args = ["-o", str(out), *(["--keep-partial"] if keep else []), str(script)]
    result = CliRunner().invoke(capture_replay.main, args)
    stderr = result.stderr if hasattr(result, "stderr") else result.output
    if not unsupported:
        assert result.exit_code == 0 and "replayable: yes (plan only: not replayed)" in stderr and out.exists()
    elif keep:
        assert result.exit_code == 0 and out.exists()
        assert "replayable: no: " in stderr and "kept" in stderr and "--keep-partial" in stderr
    else:
        assert result.exit_code == 1 and not out.exists()
        last = stderr.strip().splitlines()[-1]
        assert last.startswith(f"capture-replay: error: {out} cannot be replayed (")
        assert last.endswith("removed it (--keep-partial keeps it)") and "cuIpcOpenMemHandle" in last


def run_tool(tmp_path, monkeypatch, *, replay=None, fail=False, keep=False, script="print('hello')\n", flags=()):
    path = tmp_path / "prog.py"
    path.write_text(script)
    out = tmp_path / "out.kreplay"
    monkeypatch.setattr(_FakeRecorder, "replay", replay)
    monkeypatch.setattr(_FakeRecorder, "fail", fail)
    monkeypatch.setattr(record_verb, "Recorder", _FakeRecorder)
    args = ["-o", str(out), *(["--keep-partial"] if keep else []), *flags, str(path)]
    result = CliRunner().invoke(capture_replay.main, args)
    return result, (result.stderr if hasattr(result, "stderr") else result.output), out


def test_the_self_check_earns_replayed_and_verified(tmp_path, cubin, monkeypatch):
    _FakeRecorder.image = cubin
    result, stderr, out = run_tool(tmp_path, monkeypatch, replay=ReplayCheck(Outcome.VERIFIED, 3))
    assert result.exit_code == 0 and out.exists()
    assert "  replayable: yes (replayed and verified: 3 ranges)" in stderr.splitlines()


def test_a_capture_whose_replay_fails_is_removed_unless_kept(tmp_path, cubin, monkeypatch):
    _FakeRecorder.image = cubin
    failed = ReplayCheck(Outcome.FAILED, detail="operation 5 (saxpy): CUDA_ERROR_ILLEGAL_ADDRESS")
    result, stderr, out = run_tool(tmp_path, monkeypatch, replay=failed)
    assert result.exit_code == 1 and not out.exists()
    assert "replayable: no: the replay failed: operation 5 (saxpy): CUDA_ERROR_ILLEGAL_ADDRESS" in stderr
    result, stderr, out = run_tool(tmp_path, monkeypatch, replay=failed, keep=True, flags=("--overwrite",))
    assert result.exit_code == 0 and out.exists() and "kept" in stderr


def test_a_replay_that_verifies_differently_is_reported_and_kept(tmp_path, cubin, monkeypatch):
    _FakeRecorder.image = cubin
    mismatch = ReplayCheck(Outcome.MISMATCH, detail="op 9 buffer 2: MISMATCH 16 float32 compared")
    result, stderr, out = run_tool(tmp_path, monkeypatch, replay=mismatch)
    assert result.exit_code == 0 and out.exists()
    assert "replayable: yes (replayed, but verification failed: op 9 buffer 2: MISMATCH" in stderr
    assert stderr.strip().splitlines()[-1].startswith(f"capture-replay: warning: replaying {out} found a difference")


def test_a_capture_stopped_by_the_recorders_error_is_partial_and_removed_unless_kept(tmp_path, cubin, monkeypatch):
    _FakeRecorder.image = cubin
    result, stderr, out = run_tool(tmp_path, monkeypatch, fail=True)
    assert result.exit_code == 1 and not out.exists()
    assert "  partial: the recorder stopped at its first error: Memset: ReplayUsageError" in stderr
    assert "cannot be replayed (it is partial: " in stderr.strip().splitlines()[-1]
    result, stderr, out = run_tool(tmp_path, monkeypatch, fail=True, keep=True, flags=("--overwrite",))
    assert result.exit_code == 0 and out.exists()
    with replayfmt.open(out) as cap:
        assert cap.partial.startswith("the recorder stopped at its first error: Memset")
        summary = summarize(cap)
        assert not summary.replayable and summary.partial
        assert "partial       yes: the recorder stopped" in "\n".join(render_summary_text(summary))


def test_a_program_that_raises_while_recorded_leaves_a_partial_capture_and_its_own_error(tmp_path, cubin, monkeypatch):
    _FakeRecorder.image = cubin
    result, stderr, out = run_tool(tmp_path, monkeypatch, script="raise RuntimeError('out of memory')\n", keep=True)
    assert isinstance(result.exception, RuntimeError)  # the program's error reaches the user as it was
    with replayfmt.open(out) as cap:
        assert cap.partial == "the program stopped while it was being recorded: it raised RuntimeError: out of memory"
    result, stderr, out = run_tool(tmp_path, monkeypatch, script="import sys; sys.exit(3)\n", flags=("--overwrite",))
    assert result.exit_code == 1 and not out.exists() and "it exited with status 3" in stderr
    result, stderr, out = run_tool(tmp_path, monkeypatch, script="raise SystemExit('no GPU memory')\n", keep=True)
    assert result.exit_code == 1 and stderr.startswith("no GPU memory\n")  # said, as Python says it
    with replayfmt.open(out) as cap:
        assert cap.partial.endswith("it exited with status 1 (no GPU memory)")
    for script in ("import sys; sys.exit()\n", "import sys; sys.exit(0)\n"):  # a clean exit says nothing
        result, stderr, out = run_tool(tmp_path, monkeypatch, script=script, flags=("--overwrite",))
        assert result.exit_code == 0 and "None" not in stderr and "exited" not in stderr and out.exists()


def test_the_translator_stops_at_its_first_error(tmp_path, cubin):
    mem = FakeMemory()
    mem.device[A] = bytearray(64)
    events = [*saxpy_events(ev.ModuleImage(MODULE, cubin, None)), ev.Memset(A, 0, 3, 1), ev.Memset(A, 0, 1, 4)]
    path, t = record(tmp_path, events, mem)
    assert t.report.partial.startswith("the recorder stopped at its first error: Memset: ReplayUsageError")
    assert len(t.report.errors) == 1 and not t.recording  # nothing after the first error
    with replayfmt.open(path) as cap:
        assert not any(op.kind == m.OperationKind.MEMSET for op in cap)


def test_the_record_verb_keeps_or_removes_and_says_why(tmp_path, cubin, monkeypatch):
    _FakeRecorder.image = cubin
    monkeypatch.setattr(record_verb, "Recorder", _FakeRecorder)
    script = tmp_path / "prog.py"
    script.write_text("print('hello')\n")
    out = tmp_path / "out.kreplay"
    lines: list[str] = []
    kept = record_verb.run_and_record(str(script), (), out, say=lines.append)
    assert (kept.exit_code, kept.kept, kept.replayable, kept.error) == (0, True, True, "")
    assert "  replayable: yes (plan only: not replayed)" in lines
    monkeypatch.setattr(_FakeRecorder, "fail", True)
    options = record_verb.RunAndRecordOptions(overwrite=True, report=False)
    removed = record_verb.run_and_record(str(script), (), out, options, say=lines.append, name="rec")
    assert (removed.exit_code, removed.kept, removed.replayable) == (1, False, False) and not out.exists()
    assert removed.error.startswith(f"error: {out} cannot be replayed (it is partial: ")
