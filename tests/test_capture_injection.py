"""Recording programs that are not Python (issue 28), on the CPU: what a target is, the child's
environment, the injection library (built, exporting its entry points, hosting an interpreter
that reads the recorder's configuration back), the session directory's results, and the NVTX
range names the hosted recorder decodes. The recordings themselves: tests/gpu/test_capture_native_gpu.py."""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import replayfmt
import replayfmt.verbs.recording as record_verb
from replayfmt.capture import CaptureMode, RecordOptions
from replayfmt.capture.c_library import INJECTION_ABI, build_injection_library, injection_library, library_abi
from replayfmt.capture.hosted import (
    NVTX_DOMAIN_PUSH_EX,
    NVTX_PUSH_A,
    NVTX_PUSH_EX,
    NVTX_PUSH_W,
    range_name,
)
from replayfmt.capture.injection import (
    ChildSettings,
    InjectionConfig,
    ProgramRun,
    TargetKind,
    classify,
    collect,
    record_program,
    shared_libpython,
)
from replayfmt.errors import ReplayUsageError
from replayfmt.format import model as m
from replayfmt_tools.capture_replay import main as capture_main

TRUE = shutil.which("true")
needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")


def executable(path: Path, text: str | bytes, mode: int = 0o755) -> Path:
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    path.chmod(mode)
    return path


# -- what a target is ------------------------------------------------------------------------------


def test_python_script_by_suffix_and_source(tmp_path):
    assert classify(str(executable(tmp_path / "a.py", "print(1)\n", 0o644))).kind == TargetKind.PYTHON
    assert classify(str(executable(tmp_path / "noext", "import os\n", 0o644))).kind == TargetKind.PYTHON


@pytest.mark.parametrize(
    "line", ["#!/usr/bin/env python3", "#!/usr/bin/python3.12 -u", "#!/usr/bin/env -S python3 -X dev"]
)
def test_python_shebang_is_python(tmp_path, line):
    assert classify(str(executable(tmp_path / "tool", f"{line}\nprint(1)\n"))).kind == TargetKind.PYTHON


def test_other_shebang_is_native(tmp_path):
    target = classify(str(executable(tmp_path / "run.sh", "#!/bin/sh\nexec ./a.out\n")))
    assert target.kind == TargetKind.NATIVE and target.resolved == str(tmp_path / "run.sh")


@pytest.mark.skipif(TRUE is None, reason="no true(1)")
def test_elf_is_native_and_found_on_path():
    assert classify(TRUE).kind == TargetKind.NATIVE
    target = classify("true")  # no slash: looked up on PATH, as a shell would
    assert target.kind == TargetKind.NATIVE and os.path.isabs(target.resolved)


@pytest.mark.skipif(TRUE is None, reason="no true(1)")
def test_rejects_non_executable_elf(tmp_path):
    copy = executable(tmp_path / "prog", Path(TRUE).read_bytes(), 0o644)
    with pytest.raises(ReplayUsageError, match=r"prog: not executable \(chmod \+x"):
        classify(str(copy))


def test_rejects_non_executable_shell_script(tmp_path):
    with pytest.raises(ReplayUsageError, match="not executable"):
        classify(str(executable(tmp_path / "run.sh", "#!/bin/sh\n", 0o644)))


def test_rejects_missing_program(tmp_path):
    with pytest.raises(ReplayUsageError, match="no such file"):
        classify(str(tmp_path / "absent"))
    with pytest.raises(ReplayUsageError, match="no program of that name on PATH"):
        classify("replayfmt-no-such-program-anywhere")


def test_rejects_directory(tmp_path):
    with pytest.raises(ReplayUsageError, match="is a directory"):
        classify(str(tmp_path))


def test_rejects_32_bit_elf(tmp_path):
    with pytest.raises(ReplayUsageError, match="32-bit"):
        classify(str(executable(tmp_path / "old", b"\x7fELF\x01\x01\x01" + bytes(64))))


def test_rejects_binary_that_is_neither(tmp_path):
    with pytest.raises(ReplayUsageError, match="neither a Python script nor an executable program"):
        classify(str(executable(tmp_path / "blob", bytes(range(256)))))


def test_rejects_unreadable_program(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root reads every file")
    with pytest.raises(ReplayUsageError, match="cannot read it"):
        classify(str(executable(tmp_path / "secret", "#!/bin/sh\n", 0o111)))


def test_cli_one_line_errors_for_bad_programs(tmp_path):
    runner = CliRunner()
    for program, expected in [(str(tmp_path / "absent"), "no such file"), (str(tmp_path), "is a directory")]:
        result = runner.invoke(capture_main, ["-o", str(tmp_path / "o.kreplay"), program])
        assert result.exit_code == 2, result.output
        lines = [line for line in result.output.splitlines() if line]
        assert len(lines) == 1 and expected in lines[0] and "Traceback" not in result.output


# -- the recorder's settings and the child's environment -----------------------------------------


def sample_config(tmp_path: Path) -> InjectionConfig:
    options = RecordOptions(
        mode=CaptureMode.REGION,
        region_scopes=("step", "decode"),
        fixed_addresses=True,
        file_policy=m.FilePolicy.CAPTURE_ALL,
        file_validation=m.FileValidation.DIGEST,
        live_buffers=False,
        max_snapshot=3 << 30,
        original_times=False,
    )
    return InjectionConfig(
        output=str(tmp_path / "out.kreplay"),
        options=options,
        overwrite=True,
        command_line=("./bench", "--n", "4"),
        sys_path=tuple(p for p in sys.path if p),
        libcupti="/opt/cupti/libcupti.so.13",
    )


def test_config_round_trip(tmp_path):
    config = sample_config(tmp_path)
    assert InjectionConfig.from_json(config.to_json()) == config
    kernel = InjectionConfig("o", RecordOptions(mode=CaptureMode.KERNEL, kernels="gemm|conv", skip_first=2))
    assert InjectionConfig.from_json(kernel.to_json()) == kernel


def test_rejects_damaged_config(tmp_path):
    data = json.loads(sample_config(tmp_path).to_json())
    with pytest.raises(ReplayUsageError, match="version 99"):
        InjectionConfig.from_json(json.dumps({**data, "version": 99}))
    del data["options"]["mode"]
    with pytest.raises(ReplayUsageError, match="damaged injection config"):
        InjectionConfig.from_json(json.dumps(data))
    data["options"]["mode"] = "sideways"
    with pytest.raises(ReplayUsageError, match="damaged injection config"):
        InjectionConfig.from_json(json.dumps(data))


def test_child_environment():
    settings = ChildSettings("/lib/inj.so", "/tmp/s", "/usr/lib/libpython3.12.so.1.0", "/usr", "/c/libcupti.so", False)
    env = settings.environment({"PATH": "/bin", "HOME": "/root"})
    assert env["CUDA_INJECTION64_PATH"] == "/lib/inj.so"
    assert env["REPLAYFMT_INJECTION_DIR"] == "/tmp/s"
    assert env["REPLAYFMT_LIBPYTHON"] == "/usr/lib/libpython3.12.so.1.0"
    assert env["REPLAYFMT_PYTHONHOME"] == "/usr"
    assert env["REPLAYFMT_LIBCUPTI"] == "/c/libcupti.so"
    assert env["PATH"] == "/bin" and env["HOME"] == "/root"
    assert "NVTX_INJECTION64_PATH" not in env  # NVTX goes through CUPTI only for --scope
    scoped = ChildSettings("/lib/inj.so", "/tmp/s", "/l.so", "/usr", "/c/libcupti.so", True).environment({})
    assert scoped["NVTX_INJECTION64_PATH"] == "/c/libcupti.so"


def test_record_program_refusals_before_running(tmp_path):
    program = classify(str(executable(tmp_path / "run.sh", "#!/bin/sh\nexit 0\n")))
    out = tmp_path / "o.kreplay"
    with pytest.raises(ReplayUsageError, match="CUDA_INJECTION64_PATH is set already"):
        record_program(program, (), out, RecordOptions(), environment={"CUDA_INJECTION64_PATH": "/x/nsys.so"})
    out.write_bytes(b"mine")
    with pytest.raises(ReplayUsageError, match="exists; pass --overwrite"):
        record_program(program, (), out, RecordOptions(), environment={})
    assert out.read_bytes() == b"mine"
    interpreter = classify(str(executable(tmp_path / "python3.12", Path(sys.executable).read_bytes())))
    with pytest.raises(ReplayUsageError, match="is a Python interpreter: pass the script itself"):
        record_program(interpreter, ("train.py",), tmp_path / "i.kreplay", RecordOptions(), environment={})
    profiler = classify(str(executable(tmp_path / "prof.sh", "#!/bin/sh\n# dlopen libcupti.so.13\n")))
    with pytest.raises(ReplayUsageError, match="loads libcupti itself"):
        record_program(profiler, (), tmp_path / "p.kreplay", RecordOptions(), environment={})


# -- the session directory ------------------------------------------------------------------------


def test_collect_report(tmp_path):
    (tmp_path / "claim").write_text("42\n")
    (tmp_path / "report.json").write_text(
        json.dumps({"lines": ["replayfmt capture: x: 3 operations"], "replayable": True, "reason": "", "operations": 3})
    )
    (tmp_path / "others").write_text("43\t/bin/child\tanother process\n")
    run = collect(tmp_path, 0)
    assert run.replayable is True and run.operations == 3 and run.report_lines[0].endswith("3 operations")
    assert run.others == ["43\t/bin/child\tanother process"] and run.errors == []


def test_collect_without_report(tmp_path):
    run = collect(tmp_path, 0)
    assert run.replayable is None and run.errors == ["the program never initialised CUDA: nothing was recorded"]
    (tmp_path / "claim").write_text("42\n")
    killed = collect(tmp_path, -9)
    assert killed.exit_code == 137 and "signal 9" in killed.errors[0]
    (tmp_path / "error").write_text("cannot subscribe to CUPTI: busy\n")
    assert collect(tmp_path, 0).errors == ["cannot subscribe to CUPTI: busy"]


# -- the injection library -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def library(tmp_path_factory) -> Path:
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    return build_injection_library(tmp_path_factory.mktemp("lib") / "inject.so")


HOST = r"""
#include <dlfcn.h>
#include <stdio.h>
int main(int argc, char **argv) {
  void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) { fprintf(stderr, "%s\n", dlerror()); return 3; }
  for (int i = 2; i < argc; ++i) {
    int (*entry)(void) = (int (*)(void))dlsym(lib, argv[i]);
    if (!entry) { fprintf(stderr, "no %s\n", argv[i]); return 4; }
    printf("%s=%d\n", argv[i], entry());
  }
  return 0;
}
"""


@pytest.fixture(scope="module")
def host(tmp_path_factory, library) -> Path:
    """A program that is not Python, standing in for one CUDA loads the library into."""
    folder = tmp_path_factory.mktemp("host")
    (folder / "host.c").write_text(HOST)
    subprocess.run(["cc", "-o", str(folder / "host"), str(folder / "host.c"), "-ldl"], check=True)
    return folder / "host"


def test_library_exports_its_entry_points(library):
    lib = ctypes.CDLL(str(library))
    for name in (
        "InitializeInjection",
        "replayfmt_injection_forward",
        "replayfmt_injection_subscriber",
        "replayfmt_injection_runtime_correlation",
        "replayfmt_injection_skip_exit",
        "replayfmt_recorder_callback",
        "replayfmt_launches_arm",
        "replayfmt_launches_take",
    ):
        assert hasattr(lib, name)
    assert library_abi(library) == INJECTION_ABI
    lib.replayfmt_injection_runtime_correlation.restype = ctypes.c_uint32
    assert lib.replayfmt_injection_runtime_correlation() == 0  # outside any runtime call
    assert lib.replayfmt_injection_skip_exit(5, 1) == 0 and lib.replayfmt_injection_skip_exit(1 << 20, 1) == -1
    assert lib.replayfmt_injection_skip_exit(5, 0) == 0
    nm = shutil.which("nm")
    if nm:
        exported = subprocess.run([nm, "-D", "--defined-only", str(library)], capture_output=True, text=True).stdout
        names = {line.split()[-1] for line in exported.splitlines() if line.strip()}
        assert "InitializeInjection" in names and "claim" not in names  # only the entry points are exported
        assert not any(name.startswith("Py") for name in names)  # libpython is opened, never linked


def test_installed_library_is_usable():
    assert library_abi(injection_library()) == INJECTION_ABI  # built by pip install, or now with cc


def test_build_failure_is_one_line(tmp_path):
    with pytest.raises(ReplayUsageError, match="cannot build the injection library with"):
        build_injection_library(tmp_path / "x.so", compiler=str(executable(tmp_path / "cc", "#!/bin/sh\nexit 1\n")))
    assert not list(tmp_path.glob("*.so*"))  # nothing half-written


def session(tmp_path: Path, library: Path, libcupti: str) -> dict[str, str]:
    folder = tmp_path / "session"
    folder.mkdir()
    (folder / "config.json").write_text(sample_config(tmp_path).to_json())
    settings = ChildSettings(str(library), str(folder), str(shared_libpython()), sys.base_prefix, libcupti, True)
    return settings.environment(dict(os.environ))


def test_embedded_interpreter_reads_the_config_back(tmp_path, library, host):
    try:
        shared_libpython()
    except ReplayUsageError as exc:
        pytest.skip(str(exc))
    env = session(tmp_path, library, "/nonexistent/libcupti.so")
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()  # the program runs elsewhere: replayfmt is found through the parent's sys.path
    result = subprocess.run(
        [str(host), str(library), "replayfmt_injection_probe"], env=env, cwd=elsewhere, capture_output=True, text=True
    )
    assert result.returncode == 0 and "replayfmt_injection_probe=0" in result.stdout, result.stderr
    probe = json.loads((tmp_path / "session" / "probe.json").read_text())
    assert InjectionConfig.from_json(json.dumps(probe["config"])) == sample_config(tmp_path)
    assert probe["version"][:2] == list(sys.version_info[:2])
    assert probe["pid"] != os.getpid()  # it ran in the host program, not here
    assert Path(probe["replayfmt"]).resolve() == Path(replayfmt.__file__).resolve().parent  # the same install
    assert not (tmp_path / "session" / "error").exists()


def test_initialize_injection_reports_and_claims(tmp_path, library, host):
    env = session(tmp_path, library, "/nonexistent/libcupti.so")
    folder = tmp_path / "session"
    first = subprocess.run([str(host), str(library), "InitializeInjection"], env=env, capture_output=True, text=True)
    assert "InitializeInjection=1" in first.stdout  # never stops the program
    assert (folder / "claim").read_text().strip().isdigit()
    assert (folder / "error").read_text().startswith("cannot load libcupti (/nonexistent/libcupti.so)")
    second = subprocess.run([str(host), str(library), "InitializeInjection"], env=env, capture_output=True, text=True)
    assert "InitializeInjection=1" in second.stdout
    others = (folder / "others").read_text().splitlines()
    assert len(others) == 1 and others[0].endswith("not recorded") and str(host) in others[0]
    run = collect(folder, 0)
    assert run.replayable is None and run.errors[0].startswith("cannot load libcupti") and len(run.others) == 1


def test_initialize_injection_without_a_session_does_nothing(tmp_path, library, host):
    env = {k: v for k, v in os.environ.items() if not k.startswith("REPLAYFMT_")}
    result = subprocess.run([str(host), str(library), "InitializeInjection"], env=env, capture_output=True, text=True)
    assert "InitializeInjection=1" in result.stdout and not any(tmp_path.iterdir())


# -- NVTX range names -------------------------------------------------------------------------------


def test_nvtx_range_names():
    message = ctypes.create_string_buffer(b"step")
    wide = ctypes.create_unicode_buffer("d\u00e9code")
    push_a = (ctypes.c_void_p * 1)(ctypes.addressof(message))
    push_w = (ctypes.c_void_p * 1)(ctypes.addressof(wide))
    assert range_name(NVTX_PUSH_A, ctypes.addressof(push_a)) == "step"
    assert range_name(NVTX_PUSH_W, ctypes.addressof(push_w)) == "d\u00e9code"
    attributes = (ctypes.c_ubyte * 48)()  # nvtxEventAttributes_t v2: messageType at 32, message at 40
    ctypes.c_int32.from_buffer(attributes, 32).value = 1  # ASCII
    ctypes.c_uint64.from_buffer(attributes, 40).value = ctypes.addressof(message)
    push_ex = (ctypes.c_void_p * 1)(ctypes.addressof(attributes))
    domain_push_ex = (ctypes.c_void_p * 2)(0x1234, ctypes.addressof(attributes))
    assert range_name(NVTX_PUSH_EX, ctypes.addressof(push_ex)) == "step"
    assert range_name(NVTX_DOMAIN_PUSH_EX, ctypes.addressof(domain_push_ex)) == "step"
    ctypes.c_int32.from_buffer(attributes, 32).value = 3  # a registered string: not resolved
    assert range_name(NVTX_PUSH_EX, ctypes.addressof(push_ex)) is None


def test_module_files_are_packaged():
    folder = Path(__file__).resolve().parents[1] / "replayfmt" / "capture"
    for name in ("inject.c", "launch_ring.c"):
        assert (folder / name).is_file() and stat.S_ISREG((folder / name).stat().st_mode)
    root = folder.parents[1]
    assert '"replayfmt.capture" = ["inject.c", "launch_ring.c"]' in (root / "pyproject.toml").read_text()
    assert '"replayfmt/capture/inject.c", "replayfmt/capture/launch_ring.c"' in (root / "setup.py").read_text()


@pytest.mark.parametrize(
    ("run", "kept", "status"),
    [
        # the program failed while recorded: partial, as a Python program's capture is
        (ProgramRun(3, ["  replayable: yes (plan only: not replayed)"], True), False, 1),
        # the recorder never closed its file: nothing that looks like a capture is left
        (ProgramRun(0, [], None, errors=["the recorder did not start"]), False, 1),
        (ProgramRun(0, ["  replayable: yes (plan only: not replayed)"], True), True, 0),
    ],
)
def test_a_native_programs_capture_is_kept_only_when_it_is_complete(tmp_path, monkeypatch, run, kept, status):
    from click.testing import CliRunner

    from replayfmt_tools import capture_replay

    out = tmp_path / "n.kreplay"

    def recorded(target, args, output, options, *, overwrite):
        Path(output).write_bytes(b"KREPLAY")  # what the child left
        return run

    monkeypatch.setattr(record_verb, "record_program", recorded)
    result = CliRunner().invoke(capture_replay.main, ["-o", str(out), "--no-self-check", "/bin/true"])
    assert (result.exit_code, out.exists()) == (status, kept), result.output
    assert "Traceback" not in result.output
    for error in run.errors:  # said once (the GPU run printed a lone error twice: as a note, then as the exit)
        assert result.output.count(error) == 1, result.output
