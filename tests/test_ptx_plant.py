"""benchmarks/ptx_plant.py, the bugs reduce_demo.py plants in a Triton kernel's PTX, on a
hand-written PTX in Triton's shape (tests/fixtures/ptx): the off-by-one moves every global load by
its own width (so it shows, and vector loads stay aligned), ptxas is run for the PTX's own target
(sm_90a: the demo's -arch=sm_90 exited 255 on every kernel) and its message reaches the caller."""

from __future__ import annotations

import re
import shutil
import stat
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from ptx_plant import (  # noqa: E402 - beside the benchmarks
    access_bytes,
    assemble,
    far_load,
    off_by_one,
    ptx_arch,
    ptxas_candidates,
)

PTX = (ROOT / "tests" / "fixtures" / "ptx" / "triton_like_red_sm90a.ptx").read_bytes()
ADDRESS = re.compile(rb"ld\.global[^\[]*\[\s*(%rd\d+)\s*(?:\+\s*(\d+)\s*)?\]")


def loads(ptx: bytes) -> list[tuple[bytes, int]]:
    return [(reg, int(offset or 0)) for reg, offset in ADDRESS.findall(ptx)]


def test_the_off_by_one_moves_every_global_load_one_access_on():
    planted = off_by_one(PTX)
    assert planted is not None
    # the v4.b32 load 16 bytes on, the b32 load 4, the f32 load at +4 to +8
    assert loads(PTX) == [(b"%rd1", 0), (b"%rd2", 0), (b"%rd7", 4)]
    assert loads(planted) == [(b"%rd1", 16), (b"%rd2", 4), (b"%rd7", 8)]
    # nothing else changed: parameters, the store, the cache-policy operand
    assert ADDRESS.sub(b"", planted) == ADDRESS.sub(b"", PTX)
    assert planted.count(b"ld.param") == PTX.count(b"ld.param") and b"[ %rd1 + 16 ], %rd9;" in planted
    assert off_by_one(PTX.replace(b"ld.global", b"ld.shared")) is None


@pytest.mark.parametrize(
    ("instruction", "width"),
    [
        (b"ld.global.L1::evict_last.v4.b32", 16),
        (b"ld.global.b16", 2),
        (b"ld.global.nc.v2.f32", 8),
        (b"ld.global", None),
    ],
)
def test_an_access_is_as_wide_as_its_vector_of_its_type(instruction, width):
    assert access_bytes(instruction) == width


def test_the_far_load_moves_the_first_load_1_tib():
    planted = far_load(PTX)
    assert planted is not None
    before = planted.index(b"add.s64 %rd1, %rd1, 1099511627776;")
    assert before < planted.index(b"ld.global") and planted.count(b"1099511627776") == 1


def fake_ptxas(tmp_path: Path, *, fails: bool, name: str = "ptxas", message: str = "") -> Path:
    """A ptxas that logs its arguments; it writes the -o file, or fails as ptxas fails."""
    script = tmp_path / name
    message = message or "ptxas fatal   : PTX with .target 'sm_90a' cannot be compiled for architecture 'sm_90'"
    body = f'echo "{message}" >&2; exit 255'
    script.write_text(
        f'#!/bin/sh\necho "$@" > "$(dirname "$0")/{name}.args"\n'
        + (body if fails else 'while [ "$1" != -o ]; do shift; done; echo cubin > "$2"')
        + "\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def test_ptxas_is_asked_for_the_target_the_ptx_names(tmp_path):
    assert ptx_arch(PTX) == "sm_90a"
    path, fmt, why = assemble(off_by_one(PTX), tmp_path, "obo", str(fake_ptxas(tmp_path, fails=False)))
    assert (path.name, fmt, why) == ("obo.cubin", "cubin", "") and path.read_text() == "cubin\n"
    assert (tmp_path / "ptxas.args").read_text().split()[0] == "-arch=sm_90a"


def test_a_ptxas_failure_says_why_and_leaves_the_ptx_as_the_substitute(tmp_path):
    path, fmt, why = assemble(PTX, tmp_path, "obo", str(fake_ptxas(tmp_path, fails=True)))
    assert (path.name, fmt) == ("obo.ptx", "ptx") and path.read_bytes().startswith(b"//")
    assert "exited 255" in why and "cannot be compiled for architecture" in why


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas is not on PATH (CUDA's toolkit)")
def test_the_planted_ptx_assembles_with_the_real_ptxas(tmp_path):
    for stem, ptx in (("obo", off_by_one(PTX)), ("far", far_load(PTX))):
        path, fmt, why = assemble(ptx, tmp_path, stem, shutil.which("ptxas"))
        assert fmt == "cubin" and why == "" and path.read_bytes()[:4] == b"\x7fELF", why


OLD_ISA = "ptxas /tmp/x.ptx, line 5; fatal   : Unsupported .version 9.0; current version is '8.7'"


def test_a_ptxas_too_old_for_the_version_gives_way_to_the_next(tmp_path):
    old = fake_ptxas(tmp_path, fails=True, name="old", message=OLD_ISA)
    new = fake_ptxas(tmp_path, fails=False, name="new")
    path, fmt, why = assemble(PTX, tmp_path, "obo", [str(old), str(new)])
    assert (path.name, fmt, why) == ("obo.cubin", "cubin", "") and (tmp_path / "old.args").exists()
    # every ptxas failing: each one's message, and the PTX is the substitute
    path, fmt, why = assemble(PTX, tmp_path, "obo", [str(old), str(old)])
    assert fmt == "ptx" and why.count("Unsupported .version 9.0") == 2


def test_the_toolkits_ptxas_is_tried_before_the_one_triton_ships(tmp_path, monkeypatch):
    home = tmp_path / "cuda"
    (home / "bin").mkdir(parents=True)
    toolkit = fake_ptxas(home / "bin", fails=False)
    monkeypatch.setenv("CUDA_HOME", str(home))
    monkeypatch.delenv("TRITON_PTXAS_PATH", raising=False)
    found = ptxas_candidates()
    assert found[0] == str(toolkit)
    shipped = [i for i, path in enumerate(found) if "triton" in path]
    assert all(i == len(found) - 1 for i in shipped)  # Triton's own, if installed, comes last
    assert len({Path(path).resolve() for path in found}) == len(found)


@pytest.mark.skipif(not ptxas_candidates(), reason="no ptxas here (CUDA's toolkit)")
def test_a_newer_ptx_version_assembles_past_a_refusing_ptxas(tmp_path):
    """Triton 3.5 writes .version 9.0, which its own ptxas (ISA 8.7) refuses: the demo's failure."""
    newer = PTX.replace(b".version 8.7", b".version 9.0")
    old = fake_ptxas(tmp_path, fails=True, name="old", message=OLD_ISA)
    real = [path for path in ptxas_candidates() if "triton" not in path]
    if not real:
        pytest.skip("only Triton's ptxas here")
    path, fmt, why = assemble(off_by_one(newer), tmp_path, "obo", [str(old), *real])
    assert fmt == "cubin" and why == "" and path.read_bytes()[:4] == b"\x7fELF", why
