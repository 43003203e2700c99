"""The recorder keeps the PTX of a cubin the program loaded where a compiler cache (Triton's,
Inductor's) holds it beside the cubin: the module is stored as a fatbin of both, laid out as
CUDA's fatbinary lays one out, which dump-replay then reports and --jit-from-ptx can load."""

from __future__ import annotations

import struct

from samples import FIXTURES

import replayfmt
from replayfmt.capture import events as ev
from replayfmt.capture.modules import Module, store_module
from replayfmt.capture.ptx_sources import PtxFinder
from replayfmt.format import model as m
from replayfmt.format.targets import build_fatbin, code_targets, fatbin_entries, ptx_image, ptx_text

SM90 = (FIXTURES / "saxpy.sm_90.cubin").read_bytes()
NVCC_FATBIN = (FIXTURES / "saxpy.sm_80.sm_90.compute_90.fatbin").read_bytes()
[(_, PTX)] = ptx_text(NVCC_FATBIN)


def triton_cache(root, cubin=SM90, ptx=PTX, key="c0ffee"):
    d = root / key
    d.mkdir(parents=True)
    (d / "saxpy.cubin").write_bytes(cubin)
    (d / "saxpy.ptx").write_bytes(ptx)
    (d / "saxpy.json").write_text("{}")


def test_build_fatbin_round_trips_and_matches_nvccs_entry_layout():
    fatbin = build_fatbin(SM90, PTX)
    elf, ptx = fatbin_entries(fatbin)
    assert fatbin[elf.start + elf.header_size : elf.start + elf.header_size + len(SM90)] == SM90
    assert ptx_text(fatbin) == [(ptx.target, PTX)]
    assert code_targets(fatbin, m.ExecutableFormat.FATBIN).describe() == "sm_90, PTX compute_90"
    # the ELF entry's header is nvcc's, field for field (sizes aside)
    [nvcc_elf] = [e for e in fatbin_entries(NVCC_FATBIN) if e.kind == 2 and e.target.sm == 90]
    ours = bytearray(fatbin[elf.start : elf.start + 64])
    theirs = bytearray(NVCC_FATBIN[nvcc_elf.start : nvcc_elf.start + 64])
    struct.pack_into("<Q", ours, 8, 0)
    struct.pack_into("<Q", theirs, 8, 0)
    assert ours == theirs
    assert ptx_image(fatbin) is not None


def test_the_finder_finds_the_ptx_of_the_very_same_cubin(tmp_path):
    triton_cache(tmp_path / "cache")
    triton_cache(tmp_path / "cache", cubin=SM90[:-8] + b"\1" * 8, ptx=b"other", key="beef")  # same size, other bytes
    finder = PtxFinder(lambda: [tmp_path / "cache", tmp_path / "missing"])
    assert finder.find(SM90) == PTX
    assert finder.find(SM90[:100]) is None


def test_the_finder_sees_compiles_that_land_after_its_first_look(tmp_path):
    finder = PtxFinder(lambda: [tmp_path / "cache"])
    assert finder.find(SM90) is None
    triton_cache(tmp_path / "cache" / "0")  # Inductor's per-device subdirectory
    assert finder.find(SM90) == PTX


def store(tmp_path, key, finder):
    module = Module(ev.ModuleImage(key, SM90, None, "cuModuleLoadData"))
    path = tmp_path / f"{key[0]}.kreplay"
    with replayfmt.CaptureWriter(path, threads=0) as w:
        store_module(module, w, finder.find)
        w.add_object(m.Executable(format=module.format, target_arch=module.arch, payload=module.payload))
    with replayfmt.open(path) as cap:
        return module, bytes(cap.read_payload(module.payload))


def test_a_loaded_cubin_with_cached_ptx_is_stored_as_a_fatbin_of_both(tmp_path):
    triton_cache(tmp_path / "cache")
    module, stored = store(tmp_path, ("module", 7), PtxFinder(lambda: [tmp_path / "cache"]))
    assert module.format == m.ExecutableFormat.FATBIN and module.arch == "sm_90"
    assert code_targets(stored, module.format).describe() == "sm_90, PTX compute_90"


def test_a_cubin_without_cached_ptx_and_a_librarys_cubin_stay_cubins(tmp_path):
    module, stored = store(tmp_path, ("module", 7), PtxFinder(lambda: [tmp_path / "empty"]))
    assert module.format == m.ExecutableFormat.CUBIN and stored == SM90
    triton_cache(tmp_path / "cache")
    module, stored = store(tmp_path, ("loaded", 3), PtxFinder(lambda: [tmp_path / "cache"]))
    assert module.format == m.ExecutableFormat.CUBIN and stored == SM90
