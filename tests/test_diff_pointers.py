"""diff-replay compares what parameters mean, not their bytes: two runs of one program put their
buffers at other addresses (pointers differ, in structs too), leave other garbage in padding, and
launch one kernel thousands of times; none of that is a difference. A real change still is."""

from __future__ import annotations

import random
import struct
from pathlib import Path

import pytest

import replayfmt
from replayfmt.edit.align import opcodes
from replayfmt.edit.diff import diff_captures
from replayfmt.format import model as m

# k(int n, struct {float* a; float* b;} s): n at 0, 4 bytes of padding, the struct at 8
KERNEL = m.Function(
    name="k",
    parameters=(
        m.Parameter(offset=0, size=4, kind=m.ParameterKind.VALUE, name="n", dtype=m.DType.INT32),
        m.Parameter(offset=8, size=16, kind=m.ParameterKind.VALUE, name="s"),
    ),
    parameters_known=True,
)


def capture(
    path: Path, base: int, *, padding: int, n: int = 5, unrelocated_offset: int = 128, launches: int = 1
) -> Path:
    """One buffer at ``base``; ``launches`` launches of k whose struct holds a relocated pointer
    (buffer + 64) and one the recorder left as captured (buffer + ``unrelocated_offset``)."""
    with replayfmt.CaptureWriter(path, threads=0) as w:
        device = w.add_object(m.Device(name="NVIDIA H100", compute_capability=(9, 0)))
        buffer = w.add_object(m.Buffer(size=4096, device=device, address=base))
        exe = w.add_object(
            m.Executable(format=m.ExecutableFormat.CUBIN, payload=w.add_payload(b"\x7fELF"), functions=(KERNEL,))
        )
        params = struct.pack("<iIQQ", n, padding, base + 64, base + unrelocated_offset)
        for _ in range(launches):
            w.launch(
                executable=exe,
                function=0,
                grid=(1, 1, 1),
                block=(32, 1, 1),
                parameters=params,
                relocations=(m.Relocation(0, buffer, 8, 64),),
            )
    return path


def diff(a: Path, b: Path):
    with replayfmt.open(a) as ca, replayfmt.open(b) as cb:
        return diff_captures(ca, cb)


def test_two_runs_of_one_program_are_the_same(tmp_path):
    a = capture(tmp_path / "a.kreplay", 0x7F0000000000, padding=0xAAAAAAAA)
    b = capture(tmp_path / "b.kreplay", 0x7E1234560000, padding=0x5555)
    d = diff(a, b)
    assert [p.changes for p in d.pairs] == [()]
    assert not d.damage


@pytest.mark.parametrize(
    ("change", "expected"),
    [({"n": 6}, ("parameters",)), ({"unrelocated_offset": 256}, ("parameters",)), ({}, ())],
)
def test_a_real_change_is_still_one(tmp_path, change, expected):
    a = capture(tmp_path / "a.kreplay", 0x7F0000000000, padding=1)
    b = capture(tmp_path / "b.kreplay", 0x7E0000000000, padding=2, **change)
    assert [p.changes for p in diff(a, b).pairs] == [expected]


def test_a_pointer_to_another_buffer_offset_differs_even_when_relocated(tmp_path):
    a = capture(tmp_path / "a.kreplay", 0x7F0000000000, padding=0)
    with replayfmt.CaptureWriter(tmp_path / "b.kreplay", threads=0) as w:  # the same, relocated to +72
        device = w.add_object(m.Device(name="NVIDIA H100", compute_capability=(9, 0)))
        buffer = w.add_object(m.Buffer(size=4096, device=device, address=0x7F0000000000))
        exe = w.add_object(
            m.Executable(format=m.ExecutableFormat.CUBIN, payload=w.add_payload(b"\x7fELF"), functions=(KERNEL,))
        )
        params = struct.pack("<iIQQ", 5, 0, 0x7F0000000000 + 72, 0x7F0000000000 + 128)
        w.launch(
            executable=exe,
            function=0,
            grid=(1, 1, 1),
            block=(32, 1, 1),
            parameters=params,
            relocations=(m.Relocation(0, buffer, 8, 72),),
        )
    assert [p.changes for p in diff(a, tmp_path / "b.kreplay").pairs] == [("parameters",)]


def test_twenty_thousand_launches_of_one_kernel_pair_one_to_one(tmp_path):
    a = capture(tmp_path / "a.kreplay", 0x7F0000000000, padding=0, launches=20_000)
    b = capture(tmp_path / "b.kreplay", 0x7E0000000000, padding=9, launches=20_000)
    d = diff(a, b)
    assert len(d.pairs) == 20_000 and not any(p.changes for p in d.pairs)
    assert [(p.a.index, p.b.index) for p in d.pairs[:2]] == [(3, 3), (4, 4)]


def test_alignment_covers_both_sides_in_order_and_keeps_equal_blocks_equal():
    rng = random.Random(5)
    for _ in range(2000):
        a = [rng.choice("abcde") for _ in range(rng.randint(0, 40))]
        b = list(a)
        for _ in range(rng.randint(0, 5)):
            if b and rng.random() < 0.4:
                del b[rng.randrange(len(b))]
            else:
                b.insert(rng.randint(0, len(b)), rng.choice("abcdefg"))
        i = j = 0
        for tag, i1, i2, j1, j2 in opcodes(a, b):
            assert (i1, j1) == (i, j) and tag in ("equal", "replace")
            if tag == "equal":
                assert a[i1:i2] == b[j1:j2]
            i, j = i2, j2
        assert (i, j) == (len(a), len(b))


def test_one_launch_inserted_among_twenty_thousand_alike_shifts_nothing():
    a = ["k"] * 10_000 + ["g"] + ["k"] * 10_000
    b = ["k"] * 10_000 + ["x", "g"] + ["k"] * 10_000
    assert opcodes(a, b) == [
        ("equal", 0, 10_000, 0, 10_000),
        ("replace", 10_000, 10_000, 10_000, 10_001),
        ("equal", 10_000, 20_001, 10_001, 20_002),
    ]
