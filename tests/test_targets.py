"""Which GPUs a capture's code loads on, without a GPU: the targets of the checked-in cubins and of a
fatbin nvcc built (sm_80 and sm_90 cubins, compute_90 PTX, zstd-compressed as nvcc writes it),
the loading rules, dump-replay's per-executable and whole-capture report, the device refusal
run-replay makes before loading, and --jit-from-ptx's plan."""

from __future__ import annotations

import json
import struct

import pytest
from click.testing import CliRunner
from samples import FIXTURES, SAXPY

import replayfmt
from replayfmt.errors import ReplayUsageError
from replayfmt.execute import open_replay
from replayfmt.format import model as m
from replayfmt.format.cubin import CubinError
from replayfmt.format.targets import (
    Target,
    cannot_load,
    code_targets,
    code_targets_at,
    fatbin_entries,
    ptx_image,
    ptx_text,
    refusal,
)
from replayfmt.replay.executables import image_targets
from replayfmt.replay.plan_options import PlanOptions
from replayfmt_tools.dump_replay import main as dump_main
from replayfmt_tools.run_replay import main as run_main

SM80 = (FIXTURES / "saxpy.sm_80.cubin").read_bytes()
SM90 = (FIXTURES / "saxpy.sm_90.cubin").read_bytes()
FATBIN = (FIXTURES / "saxpy.sm_80.sm_90.compute_90.fatbin").read_bytes()
UNKNOWN = m.ExecutableFormat.UNKNOWN


def test_a_cubin_loads_on_its_major_architecture_from_its_minor_up():
    t80, t90 = code_targets(SM80, UNKNOWN), code_targets(SM90, UNKNOWN)
    assert t80.describe() == "sm_80, no PTX" and t90.describe() == "sm_90, no PTX"
    assert [t80.loads_on(cc) for cc in ((8, 0), (8, 6), (8, 9), (9, 0), (7, 5))] == [True, True, True, False, False]
    assert [t90.loads_on(cc) for cc in ((9, 0), (10, 0), (12, 0))] == [True, False, False]


def test_every_checked_in_cubin_names_its_manifest_architecture():
    manifest = json.loads((FIXTURES / "MANIFEST.json").read_text())["outputs"]
    for path, entry in manifest.items():
        if entry["kind"] == "cubin":
            data = (FIXTURES.parent.parent.parent / path).read_bytes()
            assert code_targets(data, UNKNOWN).describe() == f"{entry['arch']}, no PTX", path


def test_a_fatbin_lists_its_cubins_and_ptx_and_loads_newer_gpus_through_ptx():
    t = code_targets(FATBIN, m.ExecutableFormat.FATBIN)
    assert t.describe() == "sm_80 sm_90, PTX compute_90"
    assert t.to_json() == {"cubin_targets": ["sm_80", "sm_90"], "ptx_targets": ["compute_90"], "has_ptx": True}
    assert t.loads_on((8, 6)) and t.loads_on((9, 0)) and t.loads_on((10, 0)) and t.loads_on((12, 0))
    assert not t.loads_on((7, 5))
    assert sorted(e.target.label() for e in fatbin_entries(FATBIN)) == ["compute_90", "sm_80", "sm_90"]


def test_ptx_is_read_out_of_a_fatbin_and_alone_makes_a_fatbin():
    [(target, text)] = ptx_text(FATBIN)  # nvcc compresses it with zstd
    assert target == Target(90, ptx=True) and b".target sm_90" in text and b".entry saxpy" in text
    only = ptx_image(FATBIN)
    assert only is not None and code_targets(only, m.ExecutableFormat.FATBIN).describe() == "no cubin, PTX compute_90"
    assert ptx_text(only) == ptx_text(FATBIN)  # the entry copied as it was
    assert ptx_image(SM90) is None
    assert (
        ptx_image(text) is text and code_targets(text, m.ExecutableFormat.PTX).describe() == "no cubin, PTX compute_90"
    )


def test_arch_specific_and_family_targets():
    assert Target(90, "a").loads_on((9, 0)) and not Target(90, "a").loads_on((10, 0))
    assert not Target(90, "a", ptx=True).loads_on((10, 0)) and Target(90, ptx=True).loads_on((10, 0))
    assert Target(100, "f").loads_on((10, 3)) and not Target(100, "f").loads_on((12, 0))


@pytest.mark.parametrize("cut", [20, 100, len(FATBIN) - 8])
def test_a_truncated_fatbin_is_unreadable_not_a_crash(cut):
    with pytest.raises(CubinError, match="fatbin"):
        fatbin_entries(FATBIN[:cut])
    assert code_targets(FATBIN[:cut], m.ExecutableFormat.FATBIN).unreadable
    assert code_targets(FATBIN[:cut], m.ExecutableFormat.FATBIN).loads_on((9, 0)) is None


def test_an_entry_claiming_more_than_its_fatbin_is_refused():
    bad = bytearray(FATBIN)
    struct.pack_into("<Q", bad, 16 + 8, 1 << 40)  # the first entry's payload size
    with pytest.raises(CubinError, match="runs past"):
        fatbin_entries(bytes(bad))


def test_the_device_refusal_names_the_executables():
    images = {3: code_targets(SM80, UNKNOWN), 4: code_targets(SM90, UNKNOWN), 5: code_targets(FATBIN, UNKNOWN)}
    assert sorted(cannot_load(images, (9, 0))) == [3]
    why = refusal(images, (9, 0), "cuda:0 (NVIDIA H200)")
    assert why is not None and "cuda:0 (NVIDIA H200) (sm_90) cannot run 1 of the capture's 3" in why
    assert "executable 3 (sm_80, no PTX)" in why
    assert "executables 3, 4 (" not in why and "executable 4 (sm_90, no PTX)" in refusal(images, (10, 0), "x")
    assert refusal({5: images[5]}, (12, 0), "x") is None  # PTX JIT reaches it


def capture(path, images: list[tuple[m.ExecutableFormat, bytes]]) -> list[int]:
    """A capture launching saxpy from each image; the executables' ids."""
    ids = []
    with replayfmt.CaptureWriter(path, threads=0) as w:
        dev = w.add_object(m.Device(name="NVIDIA H100", compute_capability=(9, 0)))
        x = w.add_object(m.Buffer(size=4096, device=dev))
        y = w.add_object(m.Buffer(size=4096, device=dev))
        for fmt, data in images:
            exe = w.add_object(m.Executable(format=fmt, payload=w.add_payload(data), functions=(SAXPY,)))
            ids.append(exe)
            params = struct.pack("<f4x", 2.0) + bytes(16) + struct.pack("<i4x", 1024)
            relocs = [m.Relocation(0, x, 8, 0), m.Relocation(0, y, 16, 0)]
            w.launch(
                executable=exe, function=0, grid=(4, 1, 1), block=(256, 1, 1), parameters=params, relocations=relocs
            )
        w.checkpoint({y: bytes(4096)})
    return ids


def test_dump_replay_says_where_each_executable_and_the_capture_load(tmp_path):
    path = tmp_path / "c.kreplay"
    a, b = capture(path, [(m.ExecutableFormat.CUBIN, SM80), (m.ExecutableFormat.FATBIN, FATBIN)])
    text = CliRunner().invoke(dump_main, [str(path)]).output
    assert f"obj {a:>6} executable         cubin  payload#" in text
    assert "loads on: sm_80, no PTX" in text and "loads on: sm_80 sm_90, PTX compute_90" in text
    runs = next(line for line in text.splitlines() if line.startswith("runs on"))
    assert (
        runs == f"runs on       sm_80 sm_86 sm_87 sm_89 (cubins); none (PTX JIT); no PTX in 1 of 2 executable(s): {a}"
    )
    rows = [
        json.loads(line) for line in CliRunner().invoke(dump_main, ["--format=jsonl", str(path)]).output.splitlines()
    ]
    summary = next(r for r in rows if r["kind"] == "summary")
    assert summary["executables_without_ptx"] == [a] and summary["runs_on_by_ptx"] == []
    exe = next(r for r in rows if r["kind"] == "executable" and r["id"] == b)
    assert exe["cubin_targets"] == ["sm_80", "sm_90"] and exe["ptx_targets"] == ["compute_90"] and exe["has_ptx"]


def test_a_capture_with_ptx_everywhere_reaches_newer_gpus(tmp_path):
    path = tmp_path / "c.kreplay"
    capture(path, [(m.ExecutableFormat.FATBIN, FATBIN)])
    text = CliRunner().invoke(dump_main, ["--summary", str(path)]).output
    assert (
        "runs on       sm_80 sm_86 sm_87 sm_89 sm_90 (cubins); sm_100 sm_103 sm_110 sm_120 sm_121 (PTX JIT); every"
        in text
    )


def test_jit_from_ptx_plans_each_executable_from_its_ptx(tmp_path):
    path = tmp_path / "c.kreplay"
    [exe] = capture(path, [(m.ExecutableFormat.FATBIN, FATBIN)])
    with open_replay(path, PlanOptions(jit_from_ptx=True)) as session:
        image = session.plan.images[exe]
        assert image.format == m.ExecutableFormat.FATBIN and not session.plan.problems
        assert image_targets(session.plan.images)[exe].describe() == "no cubin, PTX compute_90"
    res = CliRunner().invoke(run_main, ["--dry-run", "--jit-from-ptx", str(path)])
    assert res.exit_code == 0, res.output


def test_jit_from_ptx_refuses_naming_executables_without_ptx(tmp_path):
    path = tmp_path / "c.kreplay"
    a, _, c = capture(
        path,
        [(m.ExecutableFormat.CUBIN, SM90), (m.ExecutableFormat.FATBIN, FATBIN), (m.ExecutableFormat.CUBIN, SM80)],
    )
    with pytest.raises(
        ReplayUsageError, match=rf"--jit-from-ptx: 2 executable\(s\) hold no PTX \(only cubins\): {a}, {c};"
    ):
        open_replay(path, PlanOptions(jit_from_ptx=True))
    res = CliRunner().invoke(run_main, ["--dry-run", "--jit-from-ptx", str(path)])
    assert res.exit_code == 2 and f"hold no PTX (only cubins): {a}, {c}" in res.output


@pytest.mark.parametrize("image", [SM80, SM90, FATBIN, FATBIN + bytes(64)])
def test_targets_read_piece_by_piece_agree_with_the_whole_image(image):
    reads = []

    def read(at, n):
        reads.append(n)
        return image[at : at + n]

    assert code_targets_at(read, len(image), UNKNOWN) == code_targets(image, UNKNOWN)
    assert sum(reads) < len(image)  # headers only


def test_dump_reads_a_large_image_by_its_headers(tmp_path):
    path = tmp_path / "c.kreplay"
    capture(path, [(m.ExecutableFormat.FATBIN, FATBIN + bytes(3 << 20))])  # over the whole-read size
    text = CliRunner().invoke(dump_main, [str(path)]).output
    assert "loads on: sm_80 sm_90, PTX compute_90" in text
