"""Launch rows of the JSONL view: the compiled renderers (a fast one for finite floats, a careful
one for inf and nan), shared launch shapes, and raw bytes for parameters shorter than the layout."""

import json
import math
import struct

import replayfmt
from replayfmt.dump import Dumper
from replayfmt.format import model as m

KERNEL = m.Function(
    name="k",
    parameters=(
        m.Parameter(offset=0, size=4, kind=m.ParameterKind.VALUE, name="a", dtype=m.DType.FLOAT32),
        m.Parameter(offset=8, size=8, kind=m.ParameterKind.POINTER, name="x"),
        m.Parameter(offset=16, size=2, kind=m.ParameterKind.VALUE, name="h", dtype=m.DType.FLOAT16),
        m.Parameter(offset=20, size=4, kind=m.ParameterKind.VALUE, name="n", dtype=m.DType.INT32),
    ),
    parameters_known=True,
)
VALUES = [1.5, -0.0, 1e-5, 3.4e38, math.inf, -math.inf, math.nan]


def half(a: float) -> float:
    return a if math.isfinite(a) and abs(a) < 60000 else 2.0


def test_launch_rows_render_floats_pointers_and_short_parameters(tmp_path):
    path = tmp_path / "l.kreplay"
    with replayfmt.CaptureWriter(path) as w:
        exe = w.add_object(m.Executable(functions=(KERNEL,)))
        x = w.add_object(m.Buffer(size=64))
        for i, a in enumerate(VALUES):
            params = struct.pack("<f4xQe2xi", a, 0xDEAD0000, half(a), -i)
            relocations = (m.Relocation(0, x, 8, 16),) if i % 2 else ()
            w.launch(
                executable=exe,
                function=0,
                grid=(i + 1, 1, 1),
                block=(32, 1, 1),
                parameters=params,
                relocations=relocations,
            )
        w.launch(executable=exe, function=0, grid=(1, 1, 1), block=(32, 1, 1), parameters=b"\x01\x02")
    with replayfmt.open(path) as cap:
        rows = [json.loads(line) for line in Dumper(cap).jsonl_rows()]
    launches = [r for r in rows if r["kind"] == "launch"]
    assert len(launches) == len(VALUES) + 1
    for i, (row, a) in enumerate(zip(launches, VALUES, strict=False)):
        p = row["parameters"]
        assert row["grid"] == [i + 1, 1, 1] and row["function"] == "k"
        if math.isnan(a):
            assert p["a"] == "nan"
        elif math.isinf(a):
            assert p["a"] == ("inf" if a > 0 else "-inf")
        else:
            assert p["a"] == struct.unpack("<f", struct.pack("<f", a))[0]
            assert p["h"] == struct.unpack("<e", struct.pack("<e", half(a)))[0]
        assert p["x"] == ({"buffer": x, "offset": 16} if i % 2 else "0xdead0000")
        assert p["n"] == -i
        assert row["relocations"] == (
            [{"site_buffer": 0, "site_offset": 8, "target_buffer": x, "target_offset": 16, "kind": "pointer"}]
            if i % 2
            else []
        )
    assert launches[-1]["parameter_bytes"] == "0102" and "parameters" not in launches[-1]
