"""Issue 46: two captures of one unchanged PyTorch step diff as the same, from the real parameter
bytes of two captures of tests/gpu/capture_scripts/moe_step.py taken on an H200
(tests/fixtures/moe_rerun: every launch's function, shape, parameter bytes and relocations, and
the buffers' addresses). Their bytes differ in 68 of 133 launches (addresses of the host's stack,
heap and libraries, stack canaries, parts of addresses, small integers left in the unused entries
of PyTorch's TensorInfo and OffsetCalculator arrays, empty classes), none of it a change; a real
change made to the same bytes is still one."""

from __future__ import annotations

import gzip
import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import replayfmt
from replayfmt.edit.diff import diff_captures
from replayfmt.edit.parameter_meaning import UNKNOWN_LAYOUT, BufferAddresses, ParameterLayout, Side, compare
from replayfmt.format import model as m
from replayfmt.format.names import parameter_types, type_kind
from replayfmt_tools import diff_replay

FIXTURE = Path(__file__).parent / "fixtures" / "moe_rerun"
Launch = dict[str, Any]


def load(side: str) -> dict[str, Any]:
    with gzip.open(FIXTURE / f"{side}.json.gz", "rt") as fh:
        return json.load(fh)


def write(path: Path, doc: dict[str, Any], change: Callable[[Launch], None] | None = None) -> Path:
    """``doc``'s launches as a capture (buffers at their recorded addresses, one executable per
    recorded one); ``change`` edits each launch first."""
    with replayfmt.CaptureWriter(path, threads=0) as w:
        device = w.add_object(m.Device(name="NVIDIA H200", compute_capability=(9, 0)))
        buffers = {b: w.add_object(m.Buffer(size=size, device=device, address=at)) for b, at, size in doc["buffers"]}
        image = w.add_payload(b"\x7fELF not a cubin")
        executables = {}
        for key, fn in sorted(doc["functions"].items()):
            declared = tuple(m.Parameter(offset=o, size=s) for o, s in fn["parameters"])
            function = m.Function(name=fn["name"], parameters=declared, parameters_known=fn["parameters_known"])
            executable = m.Executable(format=m.ExecutableFormat.CUBIN, payload=image, functions=(function,))
            executables[key] = w.add_object(executable)
        for launch in doc["launches"]:
            launch = json.loads(json.dumps(launch))
            if change is not None:
                change(launch)
            w.launch(
                executable=executables[launch["function"]],
                function=0,
                grid=tuple(launch["grid"]),
                block=tuple(launch["block"]),
                shared_memory=launch["shared_memory"],
                parameters=bytes.fromhex(launch["parameters"]),
                relocations=[m.Relocation(s, buffers[t], so, to, k) for s, t, so, to, k in launch["relocations"]],
            )
    return path


def diff(a: Path, b: Path):
    with replayfmt.open(a) as ca, replayfmt.open(b) as cb:
        return diff_captures(ca, cb)


def pair_of(a: Path, b: Path, index: int):
    """The pair of the launch that was operation ``index`` of the captures the fixture holds."""
    k = next(k for k, launch in enumerate(load("a")["launches"]) if launch["index"] == index)
    return diff(a, b).pairs[k]


@pytest.fixture(scope="module")
def captures(tmp_path_factory) -> tuple[Path, Path]:
    where = tmp_path_factory.mktemp("moe")
    return write(where / "a.kreplay", load("a")), write(where / "b.kreplay", load("b"))


def test_the_two_captures_differ_in_their_bytes(captures):
    a, b = (load(s)["launches"] for s in "ab")
    assert sum(x["parameters"] != y["parameters"] for x, y in zip(a, b)) > 100  # addresses, garbage
    assert len(a) == len(b) == 133


def test_two_captures_of_one_step_are_the_same(captures):
    d = diff(*captures)
    assert len(d.pairs) == 133 and not d.damage
    assert [p for p in d.pairs if set(p.changes) - {"struct-bytes"}] == []
    assert 0 < d.count("struct-bytes") < 68  # shown, not counted: the bytes no declaration reads


def test_diff_replay_says_same_and_exits_0_unless_struct_bytes_are_asked_for(captures):
    a, b = map(str, captures)
    done = CliRunner().invoke(diff_replay.main, [a, b])
    assert done.exit_code == 0, done.output
    assert ", 0 parameters," in done.output
    assert done.output.rstrip().endswith("verdict: same within the thresholds")
    strict = CliRunner().invoke(diff_replay.main, ["--fail-on", "any,struct-bytes", a, b])
    assert strict.exit_code == 1 and "struct-bytes: " in strict.output


def _edit(index: int, how: Callable[[Launch], None]) -> Callable[[Launch], None]:
    def change(launch: Launch) -> None:
        if launch["index"] == index:
            how(launch)

    return change


def _poke(at: int, fmt: str, value: float | int) -> Callable[[Launch], None]:
    def how(launch: Launch) -> None:
        params = bytearray.fromhex(launch["parameters"])
        struct.pack_into(fmt, params, at, value)
        launch["parameters"] = params.hex()

    return how


def _retarget(site: int, target_offset: int, buffer: int | None = None) -> Callable[[Launch], None]:
    def how(launch: Launch) -> None:
        relocation = next(r for r in launch["relocations"] if r[2] == site)
        relocation[3] = target_offset
        if buffer is not None:
            relocation[1] = buffer

    return how


def _grid(launch: Launch) -> None:
    launch["grid"][0] += 1


# Launch 88: indexFuncLargeIndex(TensorInfo<float, unsigned> dst, TensorInfo src, TensorInfo indices,
# int, int, unsigned, unsigned, long, long, ReduceAdd const&, float alpha): alpha at 688, dst's dims
# (2) at 208, its sizes from 8. Launch 10: vectorized_elementwise_kernel(int N,
# BUnaryFunctor<float,...,MulFunctor> f, std::array<char*, 2>): the functor's float at 8. Launch 16:
# cuBLAS's splitKreduce_kernel(params, float const* ...): a host scalar's address at 96.
REAL_CHANGES = {
    "a declared float": (88, _poke(688, "<f", 2.0), "parameters"),
    "a declared int": (88, _poke(648, "<i", 1), "parameters"),
    "the grid": (88, _grid, "shape"),
    "a pointer's offset": (88, _retarget(216, 0x16F100), "parameters"),
    "a pointer's buffer": (88, _retarget(0, 0x8E000, buffer=4), "parameters"),
    "a TensorInfo size it uses": (88, _poke(12, "<I", 512), "parameters"),
    "a host pointer made null": (16, _poke(96, "<Q", 0), "parameters"),
    "a float inside a functor": (10, _poke(8, "<f", 0.125), "struct-bytes"),
}


@pytest.mark.parametrize("what", list(REAL_CHANGES))
def test_a_real_change_to_the_same_bytes_is_still_one(captures, tmp_path, what):
    index, how, expected = REAL_CHANGES[what]
    changed = write(tmp_path / "b.kreplay", load("b"), _edit(index, how))
    assert expected in pair_of(captures[0], changed, index).changes


def test_an_unused_tensor_info_entry_is_not_compared(captures, tmp_path):
    changed = write(tmp_path / "b.kreplay", load("b"), _edit(88, _poke(16, "<I", 7)))  # dst.sizes[2]; dims is 2
    assert "parameters" not in pair_of(captures[0], changed, 88).changes


def test_a_signature_gives_each_parameter_its_type():
    sig = (
        "void at::native::indexFuncLargeIndex<float, long, unsigned int, 2, 2, -2, true, "
        "at::native::(anonymous namespace)::ReduceAdd>(at::cuda::detail::TensorInfo<float, unsigned int>, "
        "int, unsigned long, at::native::(anonymous namespace)::ReduceAdd const&, float const*, "
        "void (*)(int), std::array<char*, 3ul>, float)"
    )
    types = parameter_types(sig)
    assert types is not None and len(types) == 8
    assert [type_kind(t) for t in types] == [
        "class", "scalar", "scalar", "pointer", "pointer", "pointer", "class", "scalar",
    ]  # fmt: skip
    assert parameter_types("saxpy(float, float const*, float*, int)") == ("float", "float const*", "float*", "int")
    assert parameter_types("k()") == () and parameter_types("k(void)") == ()
    for no_list in ("saxpy", "triton_poi_fused_add_0", "f(int", "f(a<b, c)"):
        assert parameter_types(no_list) is None


@pytest.mark.parametrize("size", [0, 1, 3, 4, 7, 8, 9, 13])
def test_parameter_blocks_of_any_size_compare(size):
    nowhere = BufferAddresses(lambda: [])
    x, y = Side(bytes(size), {}, nowhere), Side(b"\x01" * size, {}, nowhere)
    assert compare(x, y, ParameterLayout(struct_bytes=((0, size),))) == ("struct-bytes" if size else None)
    assert compare(x, y, UNKNOWN_LAYOUT) == ("parameters" if size else None)
