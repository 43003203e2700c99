"""Processes the recorded program starts that use CUDA themselves (a launcher's ranks, a
``multiprocessing`` worker, a subprocess): not recorded by this process's recorder, so they are
listed in its report, never passed over in silence.

While a Python program is recorded in-process, its children inherit an environment that points
CUDA's injection entry point (``CUDA_INJECTION64_PATH``) at the recorder's C library with a session
this process has already claimed: a child that initialises CUDA then only notes itself there
(``inject.c``'s claim) and runs on untouched. Nothing is set where the library is not built, or
where another tool (nsys, ncu, a sanitizer) injects already."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from replayfmt.capture.c_library import built_library

_VARIABLES = ("CUDA_INJECTION64_PATH", "REPLAYFMT_INJECTION_DIR")


class ChildWatch:
    """Lists the child processes that use CUDA between :meth:`start` and :meth:`stop`."""

    def __init__(self) -> None:
        self._session: str | None = None
        self._saved: dict[str, str | None] = {}
        self.children: list[str] = []  # "pid program", one a child (the report words why it was not recorded)

    def start(self) -> bool:
        """Point the children's CUDA at the claimed session; False where nothing could be set."""
        library = built_library()
        if library is None or os.environ.get("CUDA_INJECTION64_PATH") or self._session is not None:
            return False
        session = tempfile.mkdtemp(prefix="replayfmt-children-")
        Path(session, "claim").write_text(f"{os.getpid()}\n")  # this process records; children list themselves
        self._saved = {name: os.environ.get(name) for name in _VARIABLES}
        os.environ.update(CUDA_INJECTION64_PATH=str(library), REPLAYFMT_INJECTION_DIR=session)
        self._session = session
        return True

    def stop(self) -> list[str]:
        """Restore the environment; the children that used CUDA meanwhile."""
        if self._session is None:
            return self.children
        for name, value in self._saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        try:
            text = Path(self._session, "others").read_text(encoding="utf-8", errors="replace")
        except OSError:
            text = ""
        self.children = [" ".join(line.split("\t")[:2]) for line in text.splitlines() if line.strip()]
        shutil.rmtree(self._session, ignore_errors=True)
        self._session = None
        return self.children
