"""Recording programs that are not Python: the parent's side of CUDA's injection entry point.

A program that is not a Python script (an ELF binary, a shell script) runs as a child process
with ``CUDA_INJECTION64_PATH`` naming the small library built from ``inject.c``; CUDA calls its
``InitializeInjection`` inside the program's first ``cuInit``, and the library hosts the same
recorder in an embedded interpreter (:mod:`replayfmt.capture.hosted`). This module decides what
a target is (:func:`classify`), finds what the child needs (the library, from
:mod:`replayfmt.capture.c_library`; the shared libpython; libcupti), hands the recorder's settings
over in a session directory (:class:`InjectionConfig`, ``config.json``), runs the child, and
collects its report (:class:`ProgramRun`).
Why the recorder is hosted rather than rewritten in C, and what it costs: docs/INJECTION.md.
"""

from __future__ import annotations

import enum
import json
import mmap
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from replayfmt.capture.c_library import injection_library
from replayfmt.capture.options import CaptureMode, RecordOptions
from replayfmt.errors import DeviceUnavailableError, ReplayUsageError
from replayfmt.format import model as m

CONFIG_VERSION = 1
_ELF_MAGIC = b"\x7fELF"
_ELFCLASS64 = 2
_PYTHON_NAMES = ("python", "pypy")  # interpreter names a shebang may give (python3, python3.12, ...)


class TargetKind(enum.Enum):
    PYTHON = "python"  # run in this process with runpy
    NATIVE = "native"  # run as a child process with the injection library


@dataclass(frozen=True)
class Target:
    """What ``capture-replay`` was asked to run: ``path`` as given, ``resolved`` as found."""

    path: str
    resolved: str
    kind: TargetKind


def classify(program: str) -> Target:
    """A Python script or a native program (ELF, or a script for another interpreter), by its
    first bytes: the ELF magic, a shebang naming python, or Python source. One-line errors for a
    missing, unreadable, non-executable or unrecognisable program."""
    path = program
    if not os.path.exists(path) and os.sep not in program:
        found = shutil.which(program)
        if found is None:
            raise ReplayUsageError(f"{program}: no such file, and no program of that name on PATH")
        path = found
    if not os.path.exists(path):
        raise ReplayUsageError(f"{program}: no such file")
    if os.path.isdir(path):
        raise ReplayUsageError(f"{program}: is a directory, not a program or a Python script")
    try:
        with open(path, "rb") as f:
            head = f.read(256)
    except OSError as exc:
        raise ReplayUsageError(f"{program}: cannot read it ({exc.strerror})") from None
    resolved = os.path.abspath(path)
    if head.startswith(_ELF_MAGIC):
        if len(head) > 4 and head[4] != _ELFCLASS64:
            raise ReplayUsageError(f"{program}: a 32-bit ELF program; CUDA's injection entry point is 64-bit only")
        _must_execute(program, path)
        return Target(program, resolved, TargetKind.NATIVE)
    if head.startswith(b"#!"):
        if _python_shebang(head):
            return Target(program, resolved, TargetKind.PYTHON)
        _must_execute(program, path)
        return Target(program, resolved, TargetKind.NATIVE)
    if path.endswith((".py", ".pyw")) or _looks_like_text(head):
        return Target(program, resolved, TargetKind.PYTHON)
    raise ReplayUsageError(f"{program}: neither a Python script nor an executable program (no ELF header, no #! line)")


def _must_execute(program: str, path: str) -> None:
    if not os.access(path, os.X_OK):
        raise ReplayUsageError(f"{program}: not executable (chmod +x {shlex.quote(program)})")


def _python_shebang(head: bytes) -> bool:
    """Whether a ``#!`` line runs a Python interpreter (``/usr/bin/python3``, ``env python3``...)."""
    words = head[2:].split(b"\n", 1)[0].decode(errors="replace").split()
    if not words:
        return False
    if os.path.basename(words[0]) == "env":
        words = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
    return bool(words) and os.path.basename(words[0]).startswith(_PYTHON_NAMES)


def _looks_like_text(head: bytes) -> bool:
    try:
        head.decode()
    except UnicodeDecodeError:
        return False
    return b"\0" not in head


@dataclass(frozen=True)
class InjectionConfig:
    """The recorder's settings, handed from ``capture-replay`` to the recorder inside the child
    (``config.json`` in the session directory; :meth:`to_json` and :meth:`from_json` round trip)."""

    output: str
    options: RecordOptions
    overwrite: bool = False
    command_line: tuple[str, ...] = ()
    sys_path: tuple[str, ...] = ()  # the parent's: the child's interpreter imports the same packages
    libcupti: str = ""  # the one libcupti both the library and cupti-python use

    def to_json(self) -> str:
        o = self.options
        options = {
            "mode": o.mode.value,
            "kernels": o.kernels,
            "skip_first": o.skip_first,
            "max_per_kernel": o.max_per_kernel,
            "region_scopes": list(o.region_scopes),
            "fixed_addresses": o.fixed_addresses,
            "label_tensors": o.label_tensors,
            "detect_pointers": o.detect_pointers,
            "file_policy": o.file_policy.name,
            "file_validation": o.file_validation.name,
            "original_times": o.original_times,
            "live_buffers": o.live_buffers,
            "max_snapshot": o.max_snapshot,
        }
        return json.dumps(
            {
                "version": CONFIG_VERSION,
                "output": self.output,
                "overwrite": self.overwrite,
                "command_line": list(self.command_line),
                "sys_path": list(self.sys_path),
                "libcupti": self.libcupti,
                "options": options,
            },
            indent=1,
        )

    @classmethod
    def from_json(cls, text: str) -> InjectionConfig:
        try:
            data = json.loads(text)
            if data.get("version") != CONFIG_VERSION:
                raise ReplayUsageError(
                    f"injection config version {data.get('version')!r}, expected {CONFIG_VERSION}: "
                    "the program's recorder and capture-replay come from different replayfmt installs"
                )
            o = data["options"]
            options = RecordOptions(
                mode=CaptureMode(o["mode"]),
                kernels=o["kernels"],
                skip_first=int(o["skip_first"]),
                max_per_kernel=o["max_per_kernel"],
                region_scopes=tuple(o["region_scopes"]),
                fixed_addresses=bool(o["fixed_addresses"]),
                label_tensors=bool(o["label_tensors"]),
                detect_pointers=bool(o["detect_pointers"]),
                file_policy=m.FilePolicy[o["file_policy"]],
                file_validation=m.FileValidation[o["file_validation"]],
                original_times=bool(o["original_times"]),
                live_buffers=bool(o["live_buffers"]),
                max_snapshot=int(o["max_snapshot"]),
            )
            return cls(
                output=str(data["output"]),
                options=options,
                overwrite=bool(data["overwrite"]),
                command_line=tuple(data["command_line"]),
                sys_path=tuple(data["sys_path"]),
                libcupti=str(data["libcupti"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ReplayUsageError(f"damaged injection config ({type(exc).__name__}: {exc})") from None


# -- what the child needs ------------------------------------------------------------------------


def shared_libpython() -> Path:
    """The shared libpython of the running interpreter (the embedded one must be the same
    version to import the same packages); a one-line error when this Python has none."""
    explicit = os.environ.get("REPLAYFMT_LIBPYTHON")
    if explicit:
        if not os.path.isfile(explicit):
            raise ReplayUsageError(f"REPLAYFMT_LIBPYTHON={explicit}: no such file")
        return Path(explicit)
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    names = [sysconfig.get_config_var(k) for k in ("INSTSONAME", "LDLIBRARY")]
    names += [f"libpython{version}.so.1.0", f"libpython{version}.so"]
    folders = [sysconfig.get_config_var(k) for k in ("LIBDIR", "LIBPL")]
    multiarch = sysconfig.get_config_var("MULTIARCH")
    folders += [os.path.join(sys.base_prefix, "lib")]
    if multiarch:
        folders += [f"/usr/lib/{multiarch}", f"/lib/{multiarch}"]
    folders += ["/usr/lib64", "/usr/lib", "/usr/local/lib"]
    for folder in dict.fromkeys(f for f in folders if f):
        for name in dict.fromkeys(n for n in names if n and ".so" in n):
            candidate = os.path.join(folder, name)
            if os.path.isfile(candidate):
                return Path(candidate)
    raise ReplayUsageError(
        f"recording a program that is not Python embeds this Python ({sys.executable}, {version}), which "
        f"needs its shared library libpython{version}.so.1.0, not found: install it (Debian/Ubuntu: "
        f"libpython{version}) or use a Python built with --enable-shared, or set REPLAYFMT_LIBPYTHON"
    )


def cupti_library() -> str:
    """The libcupti cupti-python loads: the library and the hosted recorder must share one."""
    from replayfmt.capture.cupti_api import load_cupti
    from replayfmt.cuda.activity import loaded_cupti_path

    load_cupti()  # a one-line error when cupti-python or the driver's CUPTI is missing
    path = loaded_cupti_path()
    if not path:
        raise DeviceUnavailableError("cupti-python loaded no libcupti into this process; reinstall cupti-python")
    return path


def uses_cupti(program: str) -> bool:
    """Whether the program names libcupti (links it, or loads it by name): it would subscribe to
    CUPTI itself, and CUPTI allows one subscriber per process."""
    try:
        with open(program, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return data.find(b"libcupti.so") >= 0
    except (OSError, ValueError):  # empty files cannot be mapped
        return False


@dataclass
class ChildSettings:
    """What the child's environment adds: the library, the session and what the library loads."""

    library: str
    session: str
    libpython: str
    python_home: str
    libcupti: str
    nvtx: bool  # NVTX_INJECTION64_PATH -> libcupti, so that CUPTI reports the program's NVTX ranges

    def environment(self, base: dict[str, str]) -> dict[str, str]:
        env = dict(base)
        env.update(
            CUDA_INJECTION64_PATH=self.library,
            REPLAYFMT_INJECTION_DIR=self.session,
            REPLAYFMT_LIBPYTHON=self.libpython,
            REPLAYFMT_PYTHONHOME=self.python_home,
            REPLAYFMT_LIBCUPTI=self.libcupti,
        )
        if self.nvtx:
            env["NVTX_INJECTION64_PATH"] = self.libcupti
        return env


@dataclass
class ProgramRun:
    """How the child ended and what its recorder reported."""

    exit_code: int  # the program's status (128 + N when signal N ended it)
    report_lines: list[str] = field(default_factory=list)
    replayable: bool | None = None  # the verdict (None: the recorder never closed)
    reason: str = ""
    operations: int = 0
    errors: list[str] = field(default_factory=list)  # the recorder could not start or finish
    others: list[str] = field(default_factory=list)  # other processes that used CUDA, not recorded


def record_program(
    target: Target,
    args: tuple[str, ...],
    output: str | os.PathLike[str],
    options: RecordOptions,
    *,
    overwrite: bool = False,
    environment: dict[str, str] | None = None,
) -> ProgramRun:
    """Run ``target`` with ``args`` as a child process recorded into ``output`` by the hosted
    recorder; returns how it ended and the recorder's report (printing is the caller's)."""
    output = os.path.abspath(output)
    base = dict(os.environ if environment is None else environment)
    if base.get("CUDA_INJECTION64_PATH"):
        raise ReplayUsageError(
            f"CUDA_INJECTION64_PATH is set already ({base['CUDA_INJECTION64_PATH']}): another tool injects "
            "into CUDA (nsys, ncu, a sanitizer); unset it to record"
        )
    if os.path.exists(output) and not overwrite:
        raise ReplayUsageError(f"{output} exists; pass --overwrite to replace it")
    if os.path.basename(target.resolved).startswith(_PYTHON_NAMES):
        raise ReplayUsageError(
            f"{target.path} is a Python interpreter: pass the script itself (capture-replay -o OUT script.py ARGS), "
            "which records in this process"
        )
    if uses_cupti(target.resolved):
        raise ReplayUsageError(
            f"{target.path} loads libcupti itself: CUPTI allows one subscriber per process, so it and the "
            "recorder cannot both listen; record a build without its own CUPTI use (profiling off)"
        )
    library = injection_library()
    libpython = shared_libpython()
    libcupti = cupti_library()
    session = tempfile.mkdtemp(prefix="replayfmt-inject-")
    try:
        config = InjectionConfig(
            output=output,
            options=options,
            overwrite=overwrite,
            command_line=(target.path, *args),
            sys_path=tuple(p for p in sys.path if p),
            libcupti=libcupti,
        )
        Path(session, "config.json").write_text(config.to_json(), encoding="utf-8")
        settings = ChildSettings(
            library=str(library),
            session=session,
            libpython=str(libpython),
            python_home=sys.base_prefix,
            libcupti=libcupti,
            nvtx=bool(options.region_scopes),
        )
        try:
            status = subprocess.call([target.resolved, *args], env=settings.environment(base))
        except OSError as exc:
            raise ReplayUsageError(f"{target.path}: cannot run it ({exc.strerror})") from None
        return collect(session, status)
    finally:
        shutil.rmtree(session, ignore_errors=True)


def collect(session: str | os.PathLike[str], status: int) -> ProgramRun:
    """The child's results from the session directory, after it ended with ``status``."""
    folder = Path(session)
    run = ProgramRun(exit_code=128 - status if status < 0 else status)
    run.errors = _lines(folder / "error")
    run.others = _lines(folder / "others")
    report = folder / "report.json"
    if report.is_file():
        try:
            data: dict[str, Any] = json.loads(report.read_text(encoding="utf-8"))
            run.report_lines = [str(x) for x in data.get("lines", [])]
            run.replayable = data.get("replayable")
            run.reason = str(data.get("reason", ""))
            run.operations = int(data.get("operations", 0))
        except (ValueError, TypeError) as exc:
            run.errors.append(f"the recorder's report is damaged ({exc})")
    elif not (folder / "claim").exists() and not run.errors:
        run.errors.append("the program never initialised CUDA: nothing was recorded")
    elif not run.errors:
        how = f"signal {-status}" if status < 0 else f"status {status} without running its exit handlers"
        run.errors.append(f"the program ended ({how}) before the recorder could close the capture")
    return run


def _lines(path: Path) -> list[str]:
    try:
        return [line for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line]
    except OSError:
        return []


def describe_failure(run: ProgramRun, program: str) -> str:
    """The one line saying why a recording produced no verdict."""
    reason = run.errors[0] if run.errors else "the recorder reported nothing"
    return f"{program}: {reason}"


__all__ = [
    "ChildSettings",
    "InjectionConfig",
    "ProgramRun",
    "Target",
    "TargetKind",
    "classify",
    "collect",
    "record_program",
    "shared_libpython",
]
