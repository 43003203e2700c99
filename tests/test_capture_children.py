"""A child process that initialises CUDA while a program is recorded in-process is listed in the
report, not recorded and not disturbed: the children inherit an injection session this process
already holds, so the recorder's C library only notes them (exercised here by calling the
library's entry point in a child, as the CUDA driver would inside its cuInit)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from replayfmt.capture.c_library import built_library
from replayfmt.capture.children import ChildWatch
from replayfmt.capture.report import Report

pytestmark = pytest.mark.skipif(built_library() is None, reason="the recorder's C library is not built")

CHILD = "import ctypes, os; print(ctypes.CDLL(os.environ['CUDA_INJECTION64_PATH']).InitializeInjection())"


def test_children_that_use_cuda_are_listed_and_the_environment_restored(monkeypatch):
    monkeypatch.delenv("CUDA_INJECTION64_PATH", raising=False)
    monkeypatch.delenv("REPLAYFMT_INJECTION_DIR", raising=False)
    watch = ChildWatch()
    assert watch.start()
    child = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True)
    assert child.stdout.strip() == "1"  # the program goes on whatever the library does
    children = watch.stop()
    assert len(children) == 1
    pid, program = children[0].split(maxsplit=1)
    assert pid.isdigit() and int(pid) != os.getpid() and "python" in program
    assert "CUDA_INJECTION64_PATH" not in os.environ and "REPLAYFMT_INJECTION_DIR" not in os.environ
    report = Report(path="x.kreplay", children=children)
    assert any("not recorded: process" in line for line in report.lines())


def test_another_injecting_tool_is_left_alone(monkeypatch):
    monkeypatch.setenv("CUDA_INJECTION64_PATH", "/opt/other/tool.so")
    watch = ChildWatch()
    assert not watch.start()
    assert watch.stop() == [] and os.environ["CUDA_INJECTION64_PATH"] == "/opt/other/tool.so"


def test_a_capture_without_device_work_whose_children_used_cuda_is_not_replayable(tmp_path):
    """`python -m replayfmt.capture -o x $(which torchrun) ...` records torchrun alone: its ranks'
    work is in none of the file, which must not say `replayable: yes`."""
    import replayfmt
    from replayfmt.capture.verdict import check_capture, without_child_work
    from replayfmt.format import model as m

    empty = tmp_path / "launcher.kreplay"
    with replayfmt.CaptureWriter(empty) as w:
        w.add_object(m.Device(name="gpu0"))
    work = tmp_path / "work.kreplay"
    with replayfmt.CaptureWriter(work) as w:
        device = w.add_object(m.Device(name="gpu0"))
        buffer = w.add_object(m.Buffer(size=64, device=device))
        w.memset(buffer=buffer, value=0, count=64)
    children = ["4242 python3"]
    alone = check_capture(empty)
    assert alone.replayable and alone.device_work == 0
    judged = without_child_work(alone, children)
    assert not judged.replayable and "none of the program's GPU work" in judged.reason and "4242" in judged.reason
    assert without_child_work(alone, []).replayable  # no child used CUDA: nothing more to say
    assert without_child_work(check_capture(work), children).replayable  # its own work is there
