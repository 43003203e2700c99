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
        body = bytes(cap._chunk_body(cap._chunk_header(offset, "batch"), 1 << 30, "batch"))
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

    cubin = compiled_cubin("container_kernels.cu")
    if cubin is None:
        pytest.skip("nvcc not available")
    return cubin


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
