"""The recorder's C library, built from ``inject.c`` (CUDA's injection entry point, for programs
that are not Python) and ``launch_ring.c`` (repeated launches answered in C): the one pip built
beside this package, its interface version, and a build with the C compiler on first use where
pip built none.

It imports nothing of CUPTI: both the CUPTI side (:mod:`replayfmt.capture.cupti_api`, through
:mod:`replayfmt.capture.launch_ring`) and the injection side (:mod:`replayfmt.capture.injection`)
find the library here.
"""

from __future__ import annotations

import ctypes
import glob
import hashlib
import os
import shlex
import shutil
import subprocess
from pathlib import Path

from replayfmt.errors import ReplayUsageError

INJECTION_ABI = 5  # inject.c's REPLAYFMT_INJECTION_ABI: bump both together
_SOURCES = (Path(__file__).with_name("inject.c"), Path(__file__).with_name("launch_ring.c"))


def injection_library(*, cache: Path | None = None) -> Path:
    """The injection library: the one pip built beside this module, or else (none built, or one
    of another interface version) one built now from ``inject.c`` with the C compiler into
    ``cache`` (default ``~/.cache/replayfmt``); a one-line error says what is missing when
    neither can be had."""
    built = built_library()
    if built is not None:
        return built
    missing = [source for source in _SOURCES if not source.is_file()]
    if missing:
        raise ReplayUsageError(f"the injection library was not built and its source {missing[0]} is missing: reinstall")
    folder = cache or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "replayfmt"
    digest = hashlib.sha256(b"".join(source.read_bytes() for source in _SOURCES)).hexdigest()[:16]
    target = folder / f"inject-{digest}.so"
    if target.is_file() and library_abi(target) == INJECTION_ABI:
        return target
    return build_injection_library(target)


def built_library() -> Path | None:
    """The library pip built beside this module, of this interface version (None: none)."""
    for built in sorted(glob.glob(str(Path(__file__).with_name("_inject")) + "*.so")):
        if library_abi(Path(built)) == INJECTION_ABI:
            return Path(built)
    return None


def build_injection_library(target: Path, *, compiler: str | None = None) -> Path:
    """Compile ``inject.c`` and ``launch_ring.c`` into ``target`` (written whole or not at all) with ``compiler``
    (default: $CC, else cc, gcc or clang); a one-line error when there is none or it fails."""
    cc = compiler or os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        raise ReplayUsageError(
            "recording a program that is not Python needs the injection library, which was not built: "
            "install a C compiler (cc) and reinstall replayfmt, or set CC"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        result = subprocess.run(
            [*shlex.split(cc), *compile_flags(), "-o", str(partial), *map(str, _SOURCES), "-ldl", "-lpthread"],
            capture_output=True,
            text=True,
        )
    except OSError as exc:
        raise ReplayUsageError(f"cannot run the C compiler {cc}: {exc.strerror}") from None
    if result.returncode != 0:
        first = (result.stderr.strip().splitlines() or ["no message"])[0]
        partial.unlink(missing_ok=True)
        raise ReplayUsageError(f"cannot build the injection library with {cc}: {first}")
    os.replace(partial, target)
    return target


def library_abi(path: Path) -> int | None:
    """The interface version an injection library was built with; None when it cannot load."""
    try:
        return int(ctypes.CDLL(str(path)).replayfmt_injection_abi())
    except (OSError, AttributeError):
        return None


def compile_flags() -> list[str]:
    """The C compiler's flags for the injection library (setup.py builds it with the same)."""
    return ["-O2", "-fPIC", "-shared", "-std=gnu11", "-fvisibility=hidden", "-Wall"]
