"""Bugs planted in a kernel's PTX, and the PTX built into a cubin, for benchmarks/reduce_demo.py.

* :func:`off_by_one`: every global load reads one access further than it should (the element, or
  the vector of elements, after its own: ``out[i]`` computed from ``x[i + 1]``). Every output
  changes unless the inputs are constant along the index. A bounds check made ``i < n - 1`` is
  no such bug in Triton's code: its masks test the first element of a vector, or a row index the
  grid never exceeds, so the last element stayed written and the planting did not show.
* :func:`far_load`: the first global load reads 1 TiB past its address (an illegal address).
* :func:`assemble`: ``ptxas`` for the architecture the PTX's ``.target`` names (Triton targets
  ``sm_90a`` on Hopper, which ``-arch=sm_90`` refuses). Each ptxas found is tried in turn until
  one assembles the file, the CUDA toolkit's first: Triton's PTX ``.version`` follows the CUDA
  Triton was built against, not the ptxas it ships (Triton 3.5's bundled ptxas, PTX ISA 8.7,
  refuses its own ``.version 9.0``), and a toolkit's ptxas takes every older ISA. Where every
  ptxas fails, their messages are returned and the PTX itself is the substitute (the driver
  JIT-compiles it).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path

_TARGET = re.compile(rb"^\s*\.target\s+(sm_\d+[af]?)", re.M)
# a global load and its address operand: [%rdN], [%rdN+K] or Triton's [ %rdN + K ]
_LOAD = re.compile(rb"(ld\.global[\w.:]*)(\s[^\[;]*)\[\s*(%rd\d+)\s*(?:\+\s*(-?\d+)\s*)?\]")
_VECTOR = re.compile(rb"\.v(\d+)\b")
_TYPE = re.compile(rb"\.[bsuf](8|16|32|64)\b")
_FIRST_LOAD = re.compile(rb"^(\s*)(@!?%p\d+\s+)?ld\.global[^\[]*\[\s*(%rd\d+)", re.M)


def access_bytes(instruction: bytes) -> int | None:
    """Bytes one load instruction reads (``ld.global.v4.b32``: 16), or None when its type is not
    written in its name."""
    types = _TYPE.findall(instruction)
    if not types:
        return None
    vector = _VECTOR.search(instruction)
    return (int(vector[1]) if vector else 1) * int(types[-1]) // 8


def off_by_one(ptx: bytes) -> bytes | None:
    """Every global load of ``ptx`` moved one access further (see the module docstring), or None
    when it has none to move. The offset grows by the access's own width, so a vector load stays
    aligned."""
    moved = 0

    def shift(found: re.Match[bytes]) -> bytes:
        nonlocal moved
        width = access_bytes(found[1])
        if width is None:
            return found[0]
        moved += 1
        offset = int(found[4] or 0) + width
        return found[1] + found[2] + b"[ " + found[3] + b" + " + str(offset).encode() + b" ]"

    out = _LOAD.sub(shift, ptx)
    return out if moved else None


def far_load(ptx: bytes) -> bytes | None:
    """The first global load's address register moved 1 TiB on just before it, or None."""
    found = _FIRST_LOAD.search(ptx)
    if found is None:
        return None
    reg = found[3]
    line = found[1] + b"add.s64 " + reg + b", " + reg + b", 1099511627776;\n"
    return ptx[: found.start()] + line + ptx[found.start() :]


def ptx_arch(ptx: bytes) -> str | None:
    """The architecture the PTX targets (``sm_90a``), from its ``.target`` directive."""
    found = _TARGET.search(ptx)
    return found[1].decode() if found else None


def ptxas_candidates() -> list[str]:
    """Every ptxas found, in the order :func:`assemble` tries them: TRITON_PTXAS_PATH (named on
    purpose), the CUDA toolkit's (CUDA_HOME, /usr/local/cuda), the one on PATH, the one Triton
    ships; each file once."""
    named = [os.environ.get("TRITON_PTXAS_PATH")]
    named += [str(Path(home) / "bin" / "ptxas") for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda") if home]
    named.append(shutil.which("ptxas"))
    spec = importlib.util.find_spec("triton")
    if spec is not None and spec.origin:
        named.append(str(Path(spec.origin).parent / "backends" / "nvidia" / "bin" / "ptxas"))
    found: dict[str, str] = {}
    for path in named:
        if path and Path(path).is_file():
            found.setdefault(os.path.realpath(path), path)
    return list(found.values())


def assemble(ptx: bytes, work: Path, stem: str, ptxas: str | list[str] | None = None) -> tuple[Path, str, str]:
    """(the file, its --executable-substitution format, why ptxas failed or ''): ``stem.cubin``
    built for the PTX's own target by the first of ``ptxas`` (default :func:`ptxas_candidates`)
    that assembles it, else ``stem.ptx`` itself."""
    src = work / f"{stem}.ptx"
    src.write_bytes(ptx.rstrip(b"\0") + b"\n")
    tried = ptxas_candidates() if ptxas is None else [ptxas] if isinstance(ptxas, str) else list(ptxas)
    arch = ptx_arch(ptx)
    if not tried or arch is None:
        return src, "ptx", "no ptxas found" if not tried else "the PTX names no .target"
    cubin = work / f"{stem}.cubin"
    failures = []
    for exe in tried:
        res = subprocess.run([exe, f"-arch={arch}", "-o", str(cubin), str(src)], capture_output=True, text=True)
        if res.returncode == 0:
            return cubin, "cubin", ""
        why = (res.stderr or res.stdout).strip() or f"exit {res.returncode}"
        failures.append(f"{exe} -arch={arch} exited {res.returncode}: {why[:500]}")
    return src, "ptx", "; ".join(failures)
