"""The PTX a loaded cubin was compiled from, where the program's compiler keeps it beside the cubin.

Images the program loads are stored as given (``capture/modules.py``): a fatbin keeps its PTX
entries, PTX stays PTX. A cubin loaded alone carries no PTX, so a capture of it runs only on the
GPU it was built for. Triton (and PyTorch Inductor, which compiles through Triton) loads a cubin
from memory but keeps, in its cache directory, ``<key>/<name>.cubin`` beside ``<key>/<name>.ptx``:
:class:`PtxFinder` finds the cached cubin with the very same bytes and returns its PTX, and the
recorder then stores a fatbin of both (:func:`replayfmt.format.targets.build_fatbin`), which the
driver loads as it loaded the cubin, and ``run-replay --jit-from-ptx`` (or a newer GPU) from the PTX.

Cache directories: ``$TRITON_CACHE_DIR``, Triton's configured one, ``~/.triton/cache`` and
Inductor's ``<tmp>/torchinductor_<user>/triton``; each looked at when a lookup misses, entering only
directories not seen holding a cubin before (the cache grows as the program compiles), and at most
``max_entries`` directory entries per look.
"""

from __future__ import annotations

import getpass
import os
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

MAX_PTX_BYTES = 64 << 20  # a cached PTX file over this is not read


def default_roots() -> list[Path]:
    """The cache directories a Triton or Inductor program may keep its compiles in, now."""
    roots = []
    env = os.environ.get("TRITON_CACHE_DIR")
    if env:
        roots.append(Path(env))
    triton = sys.modules.get("triton")
    configured = getattr(getattr(getattr(triton, "knobs", None), "cache", None), "dir", None)
    if isinstance(configured, str) and configured:
        roots.append(Path(configured))
    roots.append(Path.home() / ".triton" / "cache")
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    roots.append(Path(tempfile.gettempdir()) / f"torchinductor_{user}" / "triton")
    return list(dict.fromkeys(roots))


class PtxFinder:
    """Finds the PTX of a cubin in compiler caches (see the module docstring)."""

    def __init__(self, roots: Callable[[], Iterable[Path]] = default_roots, *, max_entries: int = 200_000) -> None:
        self._roots = roots
        self.max_entries = max_entries
        self._by_size: dict[int, list[tuple[Path, Path]]] = {}  # cubin size -> (cubin, ptx) paths
        self._indexed: set[Path] = set()  # directories whose cubins are in the index

    def find(self, cubin: bytes) -> bytes | None:
        """The PTX cached beside a cubin of exactly these bytes, or None."""
        found = self._lookup(cubin)
        if found is None:
            self._scan()
            found = self._lookup(cubin)
        return found

    def _lookup(self, cubin: bytes) -> bytes | None:
        for cubin_path, ptx_path in self._by_size.get(len(cubin), ()):
            try:
                if cubin_path.read_bytes() == cubin and ptx_path.stat().st_size <= MAX_PTX_BYTES:
                    return ptx_path.read_bytes()
            except OSError:  # the cache was cleaned meanwhile
                continue
        return None

    def _scan(self) -> None:
        budget = self.max_entries
        for root in self._roots():
            if budget <= 0:
                return
            budget = self._scan_dir(root, 3, budget)

    def _scan_dir(self, directory: Path, depth: int, budget: int) -> int:
        if directory in self._indexed:
            return budget
        try:
            entries = list(os.scandir(directory))
        except OSError:
            return budget
        budget -= len(entries)
        names = {e.name for e in entries}
        cubins = [e for e in entries if e.name.endswith(".cubin") and e.is_file()]
        for e in cubins:
            ptx = e.name[: -len(".cubin")] + ".ptx"
            if ptx in names:
                self._by_size.setdefault(e.stat().st_size, []).append((Path(e.path), directory / ptx))
        if cubins:
            self._indexed.add(directory)
            return budget
        if depth > 0:
            for e in entries:
                if budget <= 0:
                    break
                if e.is_dir(follow_symlinks=False):
                    budget = self._scan_dir(Path(e.path), depth - 1, budget)
        return budget
