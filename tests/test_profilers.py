"""The program's own CUPTI clients under the recorder (no GPU): proton's start and sessions turned
off and said once, torch.profiler run without its CUDA activities, and a program's CUPTI failure
traced to the conflict in one line. Stand-ins take the frameworks' module names and call shapes."""

from __future__ import annotations

import enum
import sys
import types

from replayfmt.capture.profilers import conflict_line, install_proton, install_torch_profiler


def fake_proton(monkeypatch) -> tuple[types.ModuleType, list[str]]:
    """triton.profiler as proton lays it out: functions in .profile, re-exported by the package."""
    calls: list[str] = []
    module = types.ModuleType("triton.profiler.profile")

    def start(name=None, *, hook=None):
        calls.append(f"start {name}")
        raise RuntimeError("Failed to execute cuptiSubscribe with error 39")

    for name in ("activate", "deactivate", "finalize"):
        setattr(module, name, lambda session=None, name=name: calls.append(name))
    module.start = start
    package = types.ModuleType("triton.profiler")
    for name in ("start", "activate", "deactivate", "finalize"):
        setattr(package, name, getattr(module, name))
    monkeypatch.setitem(sys.modules, "triton.profiler", package)
    monkeypatch.setitem(sys.modules, "triton.profiler.profile", module)
    return package, calls


def test_proton_runs_with_its_profiler_off_and_says_so_once(monkeypatch):
    proton, calls = fake_proton(monkeypatch)
    notes: list[str] = []
    restore = install_proton(notes)
    assert proton.start("matmul", hook="triton") is None
    proton.activate(0)
    proton.deactivate(0)
    proton.start("again")
    proton.finalize()
    assert calls == []  # nothing reached libproton: no cuptiSubscribe
    assert len(notes) == 1 and notes[0].startswith("the program's proton.start('matmul') was turned off: CUPTI takes")
    restore()
    proton.activate(0)
    assert calls == ["activate"]


def test_proton_is_left_alone_where_the_program_did_not_import_it(monkeypatch):
    monkeypatch.delitem(sys.modules, "triton.profiler", raising=False)
    monkeypatch.delitem(sys.modules, "triton.profiler.profile", raising=False)
    assert install_proton([]) is None


def test_torch_profiler_runs_without_its_cuda_activities(monkeypatch):
    class ProfilerActivity(enum.Enum):
        CPU = 0
        CUDA = 1

    seen = []

    class profile:
        def __init__(self, *, activities=None, record_shapes=False):
            seen.append((activities, record_shapes))

    module = types.ModuleType("torch.profiler")
    module.profile, module.ProfilerActivity = profile, ProfilerActivity
    monkeypatch.setitem(sys.modules, "torch.profiler", module)
    notes: list[str] = []
    restore = install_torch_profiler(notes)
    profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True)
    profile()  # the default asks for CUDA too
    profile(activities=[ProfilerActivity.CPU])
    assert seen == [([ProfilerActivity.CPU], True), ([ProfilerActivity.CPU], False), ([ProfilerActivity.CPU], False)]
    assert len(notes) == 1 and "ran without ProfilerActivity.CUDA" in notes[0]
    restore()
    profile(activities=[ProfilerActivity.CUDA])
    assert seen[-1] == ([ProfilerActivity.CUDA], False)


def test_a_cupti_failure_is_traced_to_the_conflict_in_one_line():
    line = conflict_line(RuntimeError("Failed to execute cuptiSubscribe with error 39\nmore"))
    assert line is not None and "\n" not in line
    assert line.startswith("the program failed in its own CUPTI client (RuntimeError: Failed to execute cuptiSubscribe")
    assert "turn off the program's profiler" in line
    assert conflict_line(ValueError("shapes do not match")) is None
