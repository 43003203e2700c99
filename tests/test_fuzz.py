"""Hostile input: truncation at every offset, bit flips, overwritten ranges. Whatever the damage,
reading raises ReplayError (never IndexError, struct.error, UnicodeDecodeError, MemoryError, ...)
or succeeds; recovered files say so."""

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from samples import write_sample

import replayfmt


def read_everything(path: Path) -> None:
    """Touch every part of a capture; only ReplayError may escape."""
    try:
        with replayfmt.open(path) as cap:
            _ = cap.metadata
            for op in cap:
                _ = op.index
            for obj in cap.objects():
                _ = obj.id
            for info in cap.payloads():
                cap.read_payload(info.id)
            cap.payload_stats()
    except replayfmt.ReplayError as exc:
        assert str(exc) and "\n" not in str(exc)


@pytest.fixture(scope="module")
def small_capture(tmp_path_factory) -> bytes:
    path = tmp_path_factory.mktemp("fuzz") / "small.kreplay"
    write_sample(path, n=64, threads=0)
    return path.read_bytes()


def test_truncation_at_every_offset(small_capture, tmp_path):
    path = tmp_path / "t.kreplay"
    recovered_ops = []
    for cut in range(len(small_capture)):
        path.write_bytes(small_capture[:cut])
        read_everything(path)
        try:
            with replayfmt.open(path) as cap:
                assert cap.recovered and cap.discarded_bytes >= 0
                recovered_ops.append(cap.operation_count)
        except replayfmt.ReplayError:
            pass
    assert recovered_ops == sorted(recovered_ops)  # a longer prefix never recovers less


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_bit_flips(small_capture, tmp_path, data):
    flips = data.draw(st.lists(st.integers(0, len(small_capture) * 8 - 1), min_size=1, max_size=4))
    damaged = bytearray(small_capture)
    for bit in flips:
        damaged[bit // 8] ^= 1 << (bit % 8)
    path = tmp_path / "flip.kreplay"
    path.write_bytes(bytes(damaged))
    read_everything(path)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_overwritten_ranges(small_capture, tmp_path, data):
    start = data.draw(st.integers(0, len(small_capture) - 1))
    junk = data.draw(st.binary(min_size=1, max_size=64))
    damaged = bytearray(small_capture)
    damaged[start : start + len(junk)] = junk
    path = tmp_path / "junk.kreplay"
    path.write_bytes(bytes(damaged))
    read_everything(path)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=st.sampled_from([0, 1, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0xFFFFFFFC, 0x1000, 7]), data=st.data())
def test_crafted_words(small_capture, tmp_path, value, data):
    """Plant extreme 32-bit values (huge sizes, negative and self-referencing offsets) anywhere."""
    at = data.draw(st.integers(0, len(small_capture) - 4))
    damaged = bytearray(small_capture)
    damaged[at : at + 4] = value.to_bytes(4, "little")
    path = tmp_path / "word.kreplay"
    path.write_bytes(bytes(damaged))
    read_everything(path)


@pytest.fixture(scope="module")
def batch_body(tmp_path_factory) -> tuple[bytes, tuple[int, ...]]:
    """The sample's single RecordBatch, decompressed, and its index entry."""
    path = tmp_path_factory.mktemp("fuzzbatch") / "one.kreplay"
    write_sample(path, n=16, threads=0, batch_operations=10_000)
    with replayfmt.open(path) as cap:
        assert cap.batch_count == 1
        offset = cap.directory.batch_offsets[0]
        body = bytes(cap.chunks.body(cap.chunks.header(offset, "batch"), 1 << 30, "batch"))
        entry = (cap.operation_count, cap.object_count, cap.payload_count)
    return body, entry


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_record_batch_behind_valid_checksums(batch_body, tmp_path, data):
    """The checksums are right, the FlatBuffer inside is hostile: the verifier must catch it."""
    from craft import FileBuilder

    body, (ops, objs, payloads) = batch_body
    mutated = bytearray(body)
    for _ in range(data.draw(st.integers(1, 6))):
        at = data.draw(st.integers(0, len(body) - 1))
        if data.draw(st.booleans()):
            mutated[at] ^= 1 << data.draw(st.integers(0, 7))
        else:
            word = data.draw(st.sampled_from([0, 0xFFFFFFFF, 0x80000000, 0x7FFFFFFF, len(body), 4]))
            mutated[at : at + 4] = word.to_bytes(4, "little")
    builder = FileBuilder()
    builder.batch(bytes(mutated[: len(body)]), 0, ops, 1, objs, 1, payloads)
    read_everything(builder.finish(tmp_path / "mutated.kreplay"))


@pytest.fixture(scope="module")
def real_cubin() -> bytes:
    from samples import compiled_cubin

    return compiled_cubin("container_kernels.cu")  # the checked-in fixture


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_cubin_reader_on_damaged_cubins(real_cubin, data):
    """Substitution files are user input: a damaged cubin gives CubinError, never a crash."""
    from replayfmt.format.cubin import CubinError, parse_cubin

    damaged = bytearray(real_cubin)
    for _ in range(data.draw(st.integers(1, 8))):
        at = data.draw(st.integers(0, len(damaged) - 1))
        damaged[at] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(damaged)))
    try:
        parse_cubin(bytes(damaged[:cut] if data.draw(st.booleans()) else damaged))
    except CubinError as exc:
        assert "\n" not in str(exc)


# -- structure-aware mutations ---------------------------------------------------------------
# Byte flips mostly break a checksum and stop there. These mutations know the structure: they
# change FlatBuffers offsets, counts, lengths and vtable entries (found by walking the real
# buffer with the verifier), redirect offsets to other objects (sharing: amplification) and
# rewrite chunk header fields, and then recompute every checksum, so that the hostile content
# reaches the decoders.


def flatbuffer_sites(body: bytes, root: str) -> dict[str, list[int]]:
    """Positions of the root offset, uoffsets, vector counts and string lengths (every u32 the
    verifier reads), of tables and of vtable entries, in a valid buffer."""
    from replayfmt.format import decoder
    from replayfmt.format.schema import load_schema

    sites: dict[str, list[int]] = {"u32": [], "table": [], "vtable": []}
    walker = decoder._Decoder(body, load_schema(), 8, decoder.DEFAULT_LIMITS)
    walker.compiled = {}  # the schema walk, whose table steps can be watched
    u32, table = walker.u32, walker._table_by_schema

    def record_u32(pos: int) -> int:
        sites["u32"].append(pos)
        return u32(pos)

    def record_table(pos, definition, depth):
        sites["table"].append(pos)
        vtable = pos - int.from_bytes(body[pos : pos + 4], "little", signed=True)
        vsize = int.from_bytes(body[vtable : vtable + 2], "little")
        sites["vtable"] += range(vtable, vtable + vsize, 2)
        return table(pos, definition, depth)

    walker.u32, walker._table_by_schema = record_u32, record_table
    walker.table(walker.u32(0), load_schema().tables[root], 0)
    return {k: sorted(set(v)) for k, v in sites.items()}


@st.composite
def mutated_flatbuffer(draw, body: bytes, sites: dict[str, list[int]]) -> bytes:
    out = bytearray(body)
    targets = sites["u32"] + sites["table"]
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["u32", "u32", "redirect", "table", "vtable"]))
        if kind == "vtable" and sites["vtable"]:
            at = draw(st.sampled_from(sites["vtable"]))
            value = draw(st.sampled_from([0, 2, 3, 4, 0xFFFF, len(body) & 0xFFFF, draw(st.integers(0, 0xFFFF))]))
            out[at : at + 2] = value.to_bytes(2, "little")
            continue
        at = draw(st.sampled_from(sites["table"] if kind == "table" else sites["u32"]))
        old = int.from_bytes(out[at : at + 4], "little")
        if kind == "redirect":  # point this offset at another object: shared offsets
            value = (draw(st.sampled_from(targets)) - at) % (1 << 32)
        else:
            value = draw(
                st.sampled_from(
                    [
                        0,
                        1,
                        4,
                        old + 4,
                        old - 4,
                        old * 2,
                        old + 0x10000,
                        0x7FFFFFFF,
                        0xFFFFFFFF,
                        len(body),
                        len(body) - at,
                        draw(st.integers(0, (1 << 32) - 1)),
                    ]
                )
            )
        out[at : at + 4] = (value % (1 << 32)).to_bytes(4, "little")
    return bytes(out)


@pytest.fixture(scope="module")
def sample_parts(tmp_path_factory):
    """The sample file, its single RecordBatch body and entry, and its Index body and offset."""
    from replayfmt.format.layout import FOOTER_SIZE, unpack_footer

    path = tmp_path_factory.mktemp("structure") / "one.kreplay"
    write_sample(path, n=16, threads=0, batch_operations=10_000)
    data = path.read_bytes()
    index_offset, _ = unpack_footer(data[-FOOTER_SIZE:])
    with replayfmt.open(path) as cap:
        assert cap.batch_count == 1
        batch = bytes(cap.chunks.body(cap.chunks.header(cap.directory.batch_offsets[0], "b"), 1 << 30, "b"))
        index = bytes(cap.chunks.body(cap.chunks.header(index_offset, "i"), 1 << 30, "i"))
        entry = (cap.operation_count, cap.object_count, cap.payload_count)
    return {
        "file": data,
        "batch": batch,
        "entry": entry,
        "index": index,
        "index_offset": index_offset,
        "batch_sites": flatbuffer_sites(batch, "RecordBatch"),
        "index_sites": flatbuffer_sites(index, "Index"),
    }


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_structure_aware_record_batch_mutations(sample_parts, tmp_path, data):
    import zstandard
    from craft import FileBuilder

    from replayfmt.format.layout import ChunkKind, Codec

    body = data.draw(mutated_flatbuffer(sample_parts["batch"], sample_parts["batch_sites"]))
    ops, objs, payloads = sample_parts["entry"]
    builder = FileBuilder()
    if data.draw(st.booleans()):
        offset = builder.chunk(
            ChunkKind.RECORDS, zstandard.ZstdCompressor().compress(body), codec=Codec.ZSTD, logical=len(body)
        )
        builder.batches.append((offset, 0, ops, 1, objs, 1, payloads))
    else:
        builder.batch(body, 0, ops, 1, objs, 1, payloads)
    read_everything(builder.finish(tmp_path / "mutated.kreplay"))


def decoded_both_ways(body: bytes, root: str) -> list[object]:
    """The compiled tables' decoding of ``body`` and the schema walk's: values or error messages."""
    from replayfmt.format.decoder import decode_buffer

    out: list[object] = []
    for compiled in (True, False):
        try:
            out.append(decode_buffer(body, root, max_depth=8, compiled=compiled))
        except replayfmt.ReplayFormatError as exc:
            out.append(str(exc))
    return out


def same_values(a: object, b: object) -> bool:
    """Equal decoded values (numpy arrays by content; a column walk's TableRows as the list of
    its rows, which it stands for)."""
    from replayfmt.format.table_columns import TableRows

    a, b = (list(v) if isinstance(v, TableRows) else v for v in (a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_values(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(map(same_values, a, b))
    if hasattr(a, "dtype") or hasattr(b, "dtype"):
        return type(a) is type(b) and a.dtype == b.dtype and bytes(a.tobytes()) == bytes(b.tobytes())
    return type(a) is type(b) and a == b


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_compiled_tables_decode_as_the_schema_walk_does(sample_parts, data):
    """Every table kind of the sample, intact or hostile: the same values, or the same message."""
    root = data.draw(st.sampled_from(["RecordBatch", "Index"]))
    part = "batch" if root == "RecordBatch" else "index"
    body = sample_parts[part]
    if data.draw(st.integers(0, 9)):
        body = data.draw(mutated_flatbuffer(body, sample_parts[f"{part}_sites"]))
    compiled, walked = decoded_both_ways(body, root)
    assert same_values(compiled, walked), (compiled, walked)


@pytest.fixture(scope="module")
def event_batches(tmp_path_factory):
    """RecordBatch bodies whose objects are walked column by column (a stream and 48 events, some
    with flags), and one where a labelled event sends the walk table by table."""
    from replayfmt.format import model as m

    bodies = {}
    for labelled in (False, True):
        path = tmp_path_factory.mktemp("events") / "events.kreplay"
        with replayfmt.CaptureWriter(path, batch_operations=10_000) as w:
            dev = w.add_object(m.Device(name="NVIDIA H100", compute_capability=(9, 0)))
            stream = w.add_object(m.Stream(device=dev))
            w.stream_synchronize(stream)
            w.flush()  # the device in a batch of its own: its table is walked table by table
            w.add_object(m.Stream(device=dev, priority=-1))
            for k in range(48):
                label = "named" if labelled and k == 30 else ""
                event = w.add_object(m.Event(device=dev, flags=k % 3, label=label))
                w.event_record(event, stream)
        with replayfmt.open(path) as cap:
            assert cap.batch_count == 2
            body = bytes(cap.chunks.body(cap.chunks.header(cap.directory.batch_offsets[1], "b"), 1 << 30, "b"))
        bodies[labelled] = (body, flatbuffer_sites(body, "RecordBatch"))
    return bodies


def test_event_objects_are_walked_by_column(event_batches, monkeypatch):
    """The column walk decodes the plain batch (and gives up on the labelled one), to the values
    the schema walk gives; the decoded model objects are the same events."""
    from replayfmt.format import decoder
    from replayfmt.format.object_records import decode_object, decode_objects
    from replayfmt.format.table_columns import TableRows

    walked = []
    by_column = decoder._Decoder._tables_by_column

    def watched(self, *args):
        out = by_column(self, *args)
        walked.append(out is not None)
        return out

    monkeypatch.setattr(decoder._Decoder, "_tables_by_column", watched)
    for labelled, (body, _) in event_batches.items():
        walked.clear()
        compiled, schema_walk = decoded_both_ways(body, "RecordBatch")
        assert same_values(compiled, schema_walk)
        assert walked == [not labelled]
        flags = [o["body"][1]["flags"] for o in compiled["objects"] if o["body"][0] == "Event"]
        assert flags == [k % 3 for k in range(48)]
        # the model objects made from the columns are those made from each row's dict
        assert isinstance(compiled["objects"], TableRows) != labelled
        from_columns = list(decode_objects(compiled["objects"]))
        assert from_columns == [decode_object(row) for row in schema_walk["objects"]]
        assert [type(o).__name__ for o in from_columns] == ["Stream"] + ["Event"] * 48
        assert [o.flags for o in from_columns[1:]] == [k % 3 for k in range(48)]


def _executable(functions: int, parameters: int, *, shared: bool) -> bytes:
    """An Executable table whose ``functions`` functions each list ``parameters`` parameter tables
    (a vector of plain tables, walked by column): their own, or (``shared``) the same ones."""
    import flatbuffers

    from replayfmt.format.fb import Executable as FbExecutable, Function as FbFunction, Parameter as FbParameter

    b = flatbuffers.Builder(4096)

    def vector(offsets: list[int]) -> int:
        b.StartVector(4, len(offsets), 4)
        for t in reversed(offsets):
            b.PrependUOffsetTRelative(t)
        return b.EndVector()

    def parameter_tables() -> list[int]:
        tables = []
        for k in range(parameters):
            FbParameter.Start(b)
            FbParameter.AddOffset(b, 8 * k)
            FbParameter.AddSize(b, 8)
            tables.append(FbParameter.End(b))
        return tables

    common = parameter_tables() if shared else []
    made = []
    for f in range(functions):
        listed = vector(common if shared else parameter_tables())
        label = b.CreateString(f"f{f}")
        FbFunction.Start(b)
        FbFunction.AddName(b, label)
        FbFunction.AddParameters(b, listed)
        made.append(FbFunction.End(b))
    listed = vector(made)
    FbExecutable.Start(b)
    FbExecutable.AddFunctions(b, listed)
    b.Finish(FbExecutable.End(b))
    return bytes(b.Output())


def test_tables_walked_by_column_are_remembered_for_later_references():
    """Two functions' parameter vectors (distinct vectors) list the same 40 parameter tables: the
    first is walked by column, the second refers to tables walked before and is walked table by
    table, each table found among those remembered (no dict kept per table): the schema walk's
    values, and the budget of objects runs out where the schema walk's does."""
    import dataclasses

    from replayfmt.format.decoder import decode_buffer
    from replayfmt.format.layout import DEFAULT_LIMITS

    body = _executable(2, 40, shared=True)
    compiled, walked = decoded_both_ways(body, "Executable")
    assert same_values(compiled, walked)
    first, second = (f["parameters"] for f in compiled["functions"])
    assert [p["offset"] for p in second] == [8 * k for k in range(40)] and list(first) == list(second)
    for most in (40, 60, 90, 200):  # every budget of objects: the same values, or the same message
        limits = dataclasses.replace(DEFAULT_LIMITS, max_decode_objects=most)
        outcomes = []
        for by_compiled in (True, False):
            try:
                outcomes.append(decode_buffer(body, "Executable", max_depth=8, compiled=by_compiled, limits=limits))
            except replayfmt.ReplayFormatError as exc:
                outcomes.append(str(exc))
        assert same_values(*outcomes), (most, outcomes)


def test_many_vectors_walked_by_column_cost_in_proportion():
    """What a vector walked by column is checked against (every table decoded before it) is one
    set per kind, not a pass over everything remembered: four times the functions, each with its
    own 32 parameters or all listing the same ones, take about four times as long (measured side
    by side, best of three; a pass per vector made it sixteen)."""
    import time

    from replayfmt.format.decoder import decode_buffer

    def seconds(body: bytes) -> float:
        best = float("inf")
        for _ in range(3):
            started = time.perf_counter()
            decode_buffer(body, "Executable", max_depth=8)
            best = min(best, time.perf_counter() - started)
        return best

    for shared in (False, True):
        small, large = (_executable(n, 32, shared=shared) for n in (200, 800))
        ratio = seconds(large) / seconds(small)
        assert ratio < 8, f"shared={shared}: 4x the vectors took {ratio:.1f}x as long"


def _object_tables(body: bytes) -> list[tuple[int, int]]:
    """(Object table, its body's table) positions of a RecordBatch, by the generated accessors
    (on an intact body only: they trust every offset)."""
    from replayfmt.format.fb.RecordBatch import RecordBatch

    batch = RecordBatch.GetRootAs(body, 0)
    out = []
    for j in range(batch.ObjectsLength()):
        obj = batch.Objects(j)
        out.append((obj._tab.Pos, obj.Body().Pos))
    return out


def _vtable(body: bytes | bytearray, table: int) -> int:
    return table - int.from_bytes(body[table : table + 4], "little", signed=True)


def _both_ways(body: bytes | bytearray, limits=None) -> list[object]:
    from replayfmt.format.decoder import decode_buffer
    from replayfmt.format.layout import DEFAULT_LIMITS

    out: list[object] = []
    for compiled in (True, False):
        try:
            out.append(
                decode_buffer(
                    bytes(body), "RecordBatch", max_depth=8, compiled=compiled, limits=limits or DEFAULT_LIMITS
                )
            )
        except replayfmt.ReplayFormatError as exc:
            out.append(str(exc))
    return out


def test_column_walk_checks_what_the_table_walk_checks(event_batches):
    """Each check of the column walk, planted: a table size past the buffer, a union type with
    no value, an event table shared by two objects (charged once as a repeat), a field past its
    table and every budget of objects up to enough. The column walk gives the table walk's values or message in each."""
    import dataclasses

    from replayfmt.format.layout import DEFAULT_LIMITS

    body, _ = event_batches[False]
    tables = _object_tables(body)
    event_object, event = tables[-1]

    too_big = bytearray(body)  # the events' shared vtable says their tables run past the buffer
    too_big[_vtable(body, event) + 2 : _vtable(body, event) + 4] = (0xFFFF).to_bytes(2, "little")
    no_value = bytearray(body)  # the objects' vtable: a body type, no body
    at = _vtable(body, event_object) + 4 + 2 * 3
    no_value[at : at + 2] = bytes(2)
    shared = bytearray(body)  # the last object's body is the one before it's
    field = event_object + int.from_bytes(
        body[_vtable(body, event_object) + 10 : _vtable(body, event_object) + 12], "little"
    )
    shared[field : field + 4] = (tables[-2][1] - field).to_bytes(4, "little")
    outside = bytearray(body)  # the events' shared vtable puts their device field past their tables
    at = _vtable(body, event) + 4
    outside[at : at + 2] = (0xFFF0).to_bytes(2, "little")
    outcomes = {}
    for name, mutated in (("too big", too_big), ("no value", no_value), ("shared", shared), ("outside", outside)):
        compiled, walked = _both_ways(mutated)
        assert same_values(compiled, walked), (name, compiled, walked)
        outcomes[name] = compiled if isinstance(compiled, str) else "decoded"
    assert "table size" in outcomes["too big"] and "has a type but no value" in outcomes["no value"]
    assert "lies outside its table" in outcomes["outside"]
    assert outcomes["shared"] == "decoded"
    # every budget of objects up to what decodes the body (intact, and shared), running out
    # before, inside and after the objects: the same message where the walk runs out, or values
    for mutated in (body, shared):
        decoded = False
        for k in range(2, 400):
            compiled, walked = _both_ways(mutated, dataclasses.replace(DEFAULT_LIMITS, max_decode_objects=k))
            assert same_values(compiled, walked), (k, compiled, walked)
            if not isinstance(walked, str):
                decoded = True
                break
            assert "too many references" in walked
        assert decoded


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_column_walk_decodes_as_the_schema_walk_does(event_batches, data):
    """Hostile bodies of many event objects (shared vtables, redirected and shared offsets, bad
    counts): the column walk gives the schema walk's values, or the same message."""
    body, sites = event_batches[data.draw(st.booleans())]
    body = data.draw(mutated_flatbuffer(body, sites))
    compiled, walked = decoded_both_ways(body, "RecordBatch")
    assert same_values(compiled, walked), (compiled, walked)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_structure_aware_index_mutations(sample_parts, tmp_path, data):
    """The index is rewritten with mutated offsets, counts and vtables; chunk and footer valid."""
    from replayfmt.format.layout import ChunkKind, Codec, align_up, pack_chunk_header, pack_footer

    index = data.draw(mutated_flatbuffer(sample_parts["index"], sample_parts["index_sites"]))
    head = bytearray(sample_parts["file"][: sample_parts["index_offset"]])
    offset = len(head)
    head += pack_chunk_header(ChunkKind.INDEX, 0, Codec.RAW, index, len(index)) + index
    head += bytes(align_up(len(head)) - len(head))
    head += pack_footer(offset, len(head) + 32)
    path = tmp_path / "index.kreplay"
    path.write_bytes(bytes(head))
    read_everything(path)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_chunk_header_field_mutations_with_valid_checksums(sample_parts, tmp_path, data):
    """A chunk header's kind, flags, codec, sizes or key changed, its checksum recomputed."""
    import struct

    from replayfmt.format.layout import CHUNK_HEADER_SIZE, FILE_HEADER_SIZE, checksum64, unpack_chunk_header

    file = bytearray(sample_parts["file"])
    offsets, at = [], FILE_HEADER_SIZE
    while at + CHUNK_HEADER_SIZE <= len(file) - 32:
        offsets.append(at)
        at = unpack_chunk_header(bytes(file[at : at + CHUNK_HEADER_SIZE]), at).end
    at = data.draw(st.sampled_from(offsets))
    layout = struct.Struct("<4sHHB7sQQ16sQQ")
    fields = list(layout.unpack_from(file, at))
    for _ in range(data.draw(st.integers(1, 3))):
        which = data.draw(st.sampled_from([1, 2, 3, 5, 6, 6, 7]))
        if which == 7:
            fields[7] = data.draw(st.binary(min_size=16, max_size=16))
        else:
            base = fields[which]
            fields[which] = data.draw(
                st.sampled_from(
                    [0, 1, 2, 5, 99, base + 1, base * 1024, base + (1 << 30), (1 << 40), data.draw(st.integers(0, 255))]
                )
            )
            fields[which] &= {1: 0xFFFF, 2: 0xFFFF, 3: 0xFF}.get(which, (1 << 64) - 1)
    packed = bytearray(layout.pack(*fields))
    packed[56:] = checksum64(bytes(packed[:56])).to_bytes(8, "little")
    file[at : at + CHUNK_HEADER_SIZE] = packed
    path = tmp_path / "header.kreplay"
    path.write_bytes(bytes(file))
    read_everything(path)
