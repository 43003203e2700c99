"""The JSONL launch renderer over every legal parameter list: empty lists, gaps, every dtype and
kind, duplicate and odd names, launches shorter or longer than their layout, relocated and plain
pointers. Captures are generated (hypothesis), written by the real writer and dumped by the real
Dumper; every row must be one valid JSON object that says what the launch holds."""

from __future__ import annotations

import json
import struct

from hypothesis import HealthCheck, given, settings, strategies as st

import replayfmt
from replayfmt.dump import Dumper, PayloadMode
from replayfmt.format import model as m

_SIZES = (0, 1, 2, 4, 8, 12, 16, 128)
_NAMES = st.one_of(st.just(""), st.sampled_from(["x", "n", "ptr", "x"]), st.text(max_size=6))


@st.composite
def layouts(draw: st.DrawFn) -> tuple[m.Parameter, ...]:
    """A legal parameter list: 0 to 6 parameters in order, not overlapping, gaps allowed."""
    params, offset = [], 0
    for _ in range(draw(st.integers(0, 6))):
        offset += draw(st.integers(0, 9))
        kind = draw(st.sampled_from(list(m.ParameterKind)))
        size = 8 if kind == m.ParameterKind.POINTER and draw(st.booleans()) else draw(st.sampled_from(_SIZES))
        if kind == m.ParameterKind.TENSOR_MAP and draw(st.booleans()):
            size = 128
        dtype = draw(st.sampled_from(list(m.DType)))
        params.append(m.Parameter(offset=offset, size=size, kind=kind, name=draw(_NAMES), dtype=dtype))
        offset += size
    return tuple(params)


def _pointer_sites(params: tuple[m.Parameter, ...]) -> list[int]:
    return [p.offset for p in params if p.kind == m.ParameterKind.POINTER and p.size == 8]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_every_legal_parameter_list_renders_as_json(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("jsonl") / "gen.kreplay"
    functions = data.draw(st.lists(layouts(), min_size=1, max_size=3))
    launches = []
    with replayfmt.CaptureWriter(path, threads=0) as w:
        buf = w.add_object(m.Buffer(size=4096))
        known = data.draw(st.lists(st.booleans(), min_size=len(functions), max_size=len(functions)))
        exe = w.add_object(
            m.Executable(
                functions=tuple(
                    m.Function(name=f"k{i}", parameters=params, parameters_known=k)
                    for i, (params, k) in enumerate(zip(functions, known, strict=True))
                )
            )
        )
        for _ in range(data.draw(st.integers(1, 6))):
            fn = data.draw(st.integers(0, len(functions) - 1))
            params = functions[fn]
            end = max((p.offset + p.size for p in params), default=0)
            length = max(0, end + data.draw(st.integers(-3, 3)))  # shorter or longer than the layout
            raw = bytes(data.draw(st.binary(min_size=length, max_size=length)))
            sites = [s for s in _pointer_sites(params) if s + 8 <= length]
            relocated = data.draw(st.lists(st.sampled_from(sites), unique=True)) if sites else []
            relocations = [
                m.Relocation(0, buf, site, 16 * k, m.RelocationKind.POINTER) for k, site in enumerate(relocated)
            ]
            w.launch(
                executable=exe, function=fn, grid=(1, 1, 1), block=(32, 1, 1), parameters=raw, relocations=relocations
            )
            launches.append((fn, raw, relocated))
    for mode in (PayloadMode.NONE, PayloadMode.HEX):
        with replayfmt.open(path) as cap:
            rows = [json.loads(row) for row in Dumper(cap, payloads=mode).jsonl_rows()]
        launch_rows = [r for r in rows if r["kind"] == "launch"]
        assert len(launch_rows) == len(launches)
        for row, (fn, raw, relocated) in zip(launch_rows, launches, strict=True):
            assert row["function"] == f"k{fn}" and row["function_index"] == fn
            if "parameters" in row:  # rendered by the function's layout
                parameters = row["parameters"]
                params = functions[fn]
                assert known[fn] and len(parameters) == len(params)
                shown = [v for v in parameters.values() if isinstance(v, dict)]
                assert len(shown) == len(relocated)  # each relocated pointer names its buffer
                for p, value in zip(sorted(params, key=lambda p: p.offset), parameters.values(), strict=True):
                    if p.kind == m.ParameterKind.POINTER and p.size == 8 and p.offset not in relocated:
                        assert value == f"{struct.unpack_from('<Q', raw, p.offset)[0]:#x}"
            else:  # raw bytes: unknown layout, or fewer bytes than it needs
                assert bytes.fromhex(row["parameter_bytes"]) == raw


def test_a_kernel_without_parameters(tmp_path):
    """The case that crashed: a known, empty parameter list (``(,) = UNPACK(raw)``)."""
    path = tmp_path / "empty.kreplay"
    with replayfmt.CaptureWriter(path, threads=0) as w:
        exe = w.add_object(m.Executable(functions=(m.Function(name="noargs", parameters_known=True),)))
        w.launch(executable=exe, function=0, grid=(1, 1, 1), block=(1, 1, 1))
    with replayfmt.open(path) as cap:
        rows = [json.loads(r) for r in Dumper(cap).jsonl_rows()]
    assert [r["parameters"] for r in rows if r["kind"] == "launch"] == [{}]
