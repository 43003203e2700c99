"""One rejection per check: every malformed input raises ReplayFormatError (or a usage error for
paths) with a message that names what is wrong and where."""

import struct

import numpy as np
import pytest
import zstandard
from craft import FileBuilder, amplifying_executable_batch, record_batch

import replayfmt
from replayfmt.format import decoder, model as m
from replayfmt.format.decoder import decode_buffer
from replayfmt.format.layout import FILE_HEADER_SIZE, ChunkFlags, Codec, FileHeader, pack_file_header
from replayfmt.format.payloads import frame_hash, payload_hash


def drain(path, **kw):
    with replayfmt.open(path, **kw) as cap:
        list(cap)
        list(cap.objects())
        for info in cap.payloads():
            cap.read_payload(info.id)
        return cap


def test_rejects_missing_file(tmp_path):
    with pytest.raises(replayfmt.ReplayUsageError, match=r"nope.kreplay: no such file$"):
        replayfmt.open(tmp_path / "nope.kreplay")


def test_rejects_directory(tmp_path):
    with pytest.raises(replayfmt.ReplayUsageError, match="is a directory"):
        replayfmt.open(tmp_path)


def test_rejects_non_kreplay_file(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("hello world, this is not a capture at all")
    with pytest.raises(replayfmt.ReplayFormatError, match=r"offset 0: not a .kreplay file \(bad magic"):
        replayfmt.open(path)


def test_rejects_file_too_short(tmp_path):
    path = tmp_path / "short.kreplay"
    path.write_bytes(b"KREPLAY\x00\x01")
    with pytest.raises(replayfmt.ReplayFormatError, match=r"too short for a \.kreplay header"):
        replayfmt.open(path)


def test_rejects_newer_major_version_naming_both(tmp_path):
    path = tmp_path / "v2.kreplay"
    path.write_bytes(pack_file_header(FileHeader(2, 3, FILE_HEADER_SIZE, 0)) + bytes(64))
    with pytest.raises(
        replayfmt.ReplayVersionError,
        match=rf"format version 2.3 is newer than this reader's 1.{replayfmt.FORMAT_MINOR}",
    ):
        replayfmt.open(path)


def test_rejects_header_checksum_mismatch(sample):
    data = bytearray(sample.read_bytes())
    data[10] ^= 1  # the minor version
    sample.write_bytes(bytes(data))
    with pytest.raises(replayfmt.ReplayFormatError, match="offset 0: file header checksum mismatch"):
        replayfmt.open(sample)


def test_truncated_file_is_recovered_and_says_so(sample):
    full = replayfmt.open(sample)
    full_ops = full.operation_count
    full.close()
    data = sample.read_bytes()
    sample.write_bytes(data[: len(data) - 100])
    with replayfmt.open(sample) as cap:
        assert cap.recovered and cap.discarded_bytes > 0
        assert "no valid footer" in cap.recovery_reason
        assert cap.operation_count == full_ops  # the index and footer were all that was lost


def test_rejects_corrupted_frame_body_naming_its_offset(tmp_path):
    path = tmp_path / "p.kreplay"
    with replayfmt.CaptureWriter(path, threads=0) as w:
        pid = w.add_payload(np.arange(10_000, dtype=np.int64))
    with replayfmt.open(path) as cap:
        frame_offset = cap.frame_location(cap.payload(pid).frames[0])[0]
    data = bytearray(path.read_bytes())
    data[frame_offset + 64 + 5] ^= 0xFF
    path.write_bytes(bytes(data))
    with (
        replayfmt.open(path) as cap,
        pytest.raises(
            replayfmt.ReplayFormatError, match=rf"offset {frame_offset}: payload 1 frame 0: .*checksum mismatch"
        ),
    ):
        cap.read_payload(pid)


def _one_frame_payload_file(tmp_path, body: bytes, *, codec: int, logical: int, size: int, frame_size: int):
    key = frame_hash(b"anything")
    fb = FileBuilder()
    fb.frame(key, body, codec=codec, logical=logical)
    fb.batch(record_batch(payloads=[(payload_hash(size, [key]), size, frame_size, (key,))]), 0, 0, payloads=1)
    return fb.finish(tmp_path / "bomb.kreplay")


def test_rejects_zstd_bomb_declaring_more_than_its_chunk(tmp_path):
    bomb = zstandard.ZstdCompressor(level=19).compress(bytes(256 << 20))  # 256 MiB of zeros
    path = _one_frame_payload_file(tmp_path, bomb, codec=Codec.ZSTD, logical=1024, size=1024, frame_size=1024)
    with (
        replayfmt.open(path) as cap,
        pytest.raises(replayfmt.ReplayFormatError, match=r"zstd frame declares 268435456 bytes, the chunk header 1024"),
    ):
        cap.read_payload(1)


def test_rejects_frame_over_the_size_limit(tmp_path):
    bomb = zstandard.ZstdCompressor(level=19).compress(bytes(8 << 20))
    path = _one_frame_payload_file(tmp_path, bomb, codec=Codec.ZSTD, logical=8 << 20, size=8 << 20, frame_size=8 << 20)
    limits = replayfmt.Limits(max_frame_size=1 << 20)
    with pytest.raises(replayfmt.ReplayFormatError, match="payload 1: invalid frame size 8388608"):
        drain(path, limits=limits)


def test_rejects_payload_over_the_size_limit(tmp_path):
    key = frame_hash(b"x")
    fb = FileBuilder()
    huge = 1 << 50
    frames = (key,) * (huge // (64 << 20))
    fb.batch(record_batch(payloads=[(payload_hash(huge, frames[:1]), huge, 64 << 20, frames[:1])]), 0, 0, payloads=1)
    path = fb.finish(tmp_path / "huge.kreplay")
    with pytest.raises(
        replayfmt.ReplayFormatError, match=r"payload 1: declares 1125899906842624 bytes, over the limit"
    ):
        drain(path)


def test_rejects_frame_whose_content_does_not_match_its_hash(tmp_path):
    fake_key = frame_hash(b"expected content")
    path = _one_frame_payload_file(tmp_path, b"other content!!!", codec=Codec.RAW, logical=16, size=16, frame_size=16)
    data = path.read_bytes().replace(frame_hash(b"anything"), fake_key)
    path.write_bytes(data)
    with pytest.raises(replayfmt.ReplayFormatError):
        drain(path)


def test_rejects_index_batch_outside_the_file(tmp_path):
    fb = FileBuilder()
    fb.batch(record_batch(), 0, 0)
    path = fb.finish(tmp_path / "i.kreplay", batches=[(1 << 40, 0, 0, 1, 0, 1, 0)])
    with pytest.raises(replayfmt.ReplayFormatError, match="index: a record batch offset lies outside the file"):
        replayfmt.open(path)


def test_rejects_index_with_non_contiguous_operations(tmp_path):
    fb = FileBuilder()
    fb.batch(record_batch(), 0, 0)
    path = fb.finish(tmp_path / "i.kreplay", batches=[(fb.batches[0][0], 5, 0, 1, 0, 1, 0)])
    with pytest.raises(replayfmt.ReplayFormatError, match="do not number operations contiguously"):
        replayfmt.open(path)


def test_rejects_batch_whose_counts_disagree_with_its_records(tmp_path):
    fb = FileBuilder()
    fb.batch(record_batch(kinds=bytes([m.OperationKind.LAUNCH])), 0, 1)
    path = fb.finish(tmp_path / "c.kreplay")
    with pytest.raises(replayfmt.ReplayFormatError, match="record batch 0: 1 launch operations but 0 launch records"):
        drain(path)


def test_rejects_launch_parameters_past_the_parameter_block(tmp_path):
    launches = np.zeros(1, replayfmt.writer.records.dtype("LaunchRecord"))
    launches["parameter_offset"], launches["parameter_size"] = 4, 1 << 31
    fb = FileBuilder()
    fb.batch(record_batch(kinds=bytes([m.OperationKind.LAUNCH]), launches=launches), 0, 1)
    path = fb.finish(tmp_path / "p.kreplay")
    with pytest.raises(replayfmt.ReplayFormatError, match="parameter bytes run past"):
        drain(path)


@pytest.mark.parametrize("index", [True, False], ids=["indexed", "recovered"])
def test_unknown_optional_chunk_is_skipped_and_unknown_required_chunk_is_refused(tmp_path, index):
    """FORMAT.md §3.2: a strict reader skips an unknown OPTIONAL chunk and fails on any other,
    whether the index lists it or not (it never does) and whether the file is recovered."""
    scope = record_batch(kinds=bytes([m.OperationKind.SCOPE_BEGIN]), table_ops=[m.ScopeBegin(0, "x")])
    fb = FileBuilder()
    fb.chunk(99, b"from the future", flags=ChunkFlags.OPTIONAL)
    fb.batch(scope, 0, 1)
    with replayfmt.open(fb.finish(tmp_path / "opt.kreplay", index=index)) as cap:
        assert cap.recovered is not index and cap.batch_count == 1 and cap.discarded_bytes == 0
        list(cap)
    fb = FileBuilder()
    where = fb.chunk(99, b"from the future")
    fb.batch(scope, 0, 1)
    with pytest.raises(replayfmt.ReplayFormatError, match=rf"offset {where}: unknown chunk kind 99 is not optional"):
        drain(fb.finish(tmp_path / "req.kreplay", index=index))


def test_unknown_required_chunk_after_a_record_batch_is_refused_when_the_batch_is_read(tmp_path):
    fb = FileBuilder()
    scope = record_batch(kinds=bytes([m.OperationKind.SCOPE_BEGIN]), table_ops=[m.ScopeBegin(0, "x")])
    fb.batch(scope, 0, 1)
    where = fb.chunk(77, b"x" * 10)
    fb.batch(scope, 0, 1)
    path = fb.finish(tmp_path / "gap.kreplay", batches=fb.batches[:1])
    with pytest.raises(replayfmt.ReplayFormatError, match=rf"offset {where}: unknown chunk kind 77 is not optional"):
        drain(path)


def test_unknown_operation_kind_is_kept_as_unknown(tmp_path):
    fb = FileBuilder()
    fb.batch(record_batch(kinds=bytes([200]), table_ops=[m.ScopeBegin(0, "x")]), 0, 1)
    path = fb.finish(tmp_path / "u.kreplay")
    with pytest.raises(replayfmt.ReplayFormatError, match="its kind 200 disagrees"):
        drain(path)


@pytest.fixture
def charges(monkeypatch) -> list[int]:
    """How many times the decoder charged its budget: every table, vector, string and shared
    reference it reaches is charged, so the count measures the walk's work (a clock would measure
    the machine's load)."""
    count = [0]
    charge = decoder._Decoder.charge

    def counted(self, *args: object) -> None:
        count[0] += 1
        charge(self, *args)

    monkeypatch.setattr(decoder._Decoder, "charge", counted)
    return count


def test_rejects_shared_offset_amplification_quickly(tmp_path, charges):
    body = amplifying_executable_batch(400)  # 400**3 = 64 million tables if walked naively
    with pytest.raises(replayfmt.ReplayFormatError, match=r"shared offsets amplify"):
        decode_buffer(body, "RecordBatch", max_depth=8)
    assert 0 < charges[0] <= len(body) // 4 + 64  # refused within the budget: one object per 4 bytes


def test_rejects_nesting_deeper_than_the_limit(sample):
    with pytest.raises(replayfmt.ReplayFormatError, match="nested deeper than 1"):
        drain(sample, limits=replayfmt.Limits(max_depth=1))


@pytest.mark.parametrize(
    ("buf", "message"),
    [
        (b"\x00" * 4, "buffer too small"),
        (struct.pack("<I", 1 << 30) + bytes(12), "out of bounds"),
        (struct.pack("<Ii", 4, 1 << 30) + bytes(8), "vtable offset out of bounds"),
        (struct.pack("<Ii", 4, -4) + bytes(8), "vtable size 0 invalid"),
        (struct.pack("<Ii", 4, 4) + bytes(8), "table size 0 out of bounds"),
        (struct.pack("<IiHH", 4, -4, 4, 200) + bytes(4), "table size 200 out of bounds"),
    ],
)
def test_rejects_bad_flatbuffer_offsets(buf, message):
    with pytest.raises(replayfmt.ReplayFormatError, match=message):
        decode_buffer(buf, "RecordBatch", max_depth=8)


def test_rejects_string_without_terminator_and_invalid_utf8():
    import flatbuffers

    from replayfmt.format.fb import ScopeBegin

    b = flatbuffers.Builder(64)
    name = b.CreateString("abcd")
    ScopeBegin.Start(b)
    ScopeBegin.AddName(b, name)
    b.Finish(ScopeBegin.End(b))
    good = bytes(b.Output())
    assert decode_buffer(good, "ScopeBegin", max_depth=8) == {"name": "abcd"}
    i = good.index(b"abcd")
    with pytest.raises(replayfmt.ReplayFormatError, match="not NUL-terminated"):
        decode_buffer(good[: i + 4] + b"x" + good[i + 5 :], "ScopeBegin", max_depth=8)
    with pytest.raises(replayfmt.ReplayFormatError, match="not valid UTF-8"):
        decode_buffer(good[:i] + b"\xff\xfe" + good[i + 2 :], "ScopeBegin", max_depth=8)
    with pytest.raises(replayfmt.ReplayFormatError, match="string of 4294967295 bytes runs past"):
        decode_buffer(good[: i - 4] + b"\xff\xff\xff\xff" + good[i:], "ScopeBegin", max_depth=8)


def test_rejects_chunk_kind_mismatch_at_index_offset(tmp_path):
    fb = FileBuilder()
    frame_offset = fb.frame(frame_hash(b"z"), b"z")
    path = fb.finish(tmp_path / "k.kreplay", batches=[(frame_offset, 0, 1, 1, 0, 1, 0)])
    with pytest.raises(replayfmt.ReplayFormatError, match="expected a RECORDS chunk, found chunk kind 3"):
        drain(path)


def test_shared_offsets_are_decoded_once_and_charged_at_every_reference(charges):
    """A value reached through many offsets is decoded once (the same object comes back) and its
    bytes count at each reference, so the budget bounds what consumers see, not just the work."""
    from hostile import _shared_name_batch

    small = _shared_name_batch(50, 100)  # 50 references to one 100-byte name: within budget
    d = decode_buffer(small, "RecordBatch", max_depth=8)
    functions = d["objects"][0]["body"][1]["functions"]
    assert len(functions) == 50 and all(f is functions[0] for f in functions)
    body = _shared_name_batch(20_000, 60_000)  # 1.2 GB of names from 140 KB
    charges[0] = 0
    with pytest.raises(replayfmt.ReplayFormatError) as info:
        decode_buffer(body, "RecordBatch", max_depth=8, offset=64, record="RECORDS chunk")
    assert 0 < charges[0] < 20_000  # refused before walking every reference
    assert str(info.value).startswith("offset 64: RECORDS chunk, byte ")
    assert str(info.value).endswith(
        ": decoding produces more than the decode budget allows (shared offsets amplify it)"
    )


def test_overlapping_launch_parameters_are_refused(tmp_path):
    from hostile import parameter_bomb

    with pytest.raises(replayfmt.ReplayFormatError, match=r"launches' parameter ranges overlap"):
        drain(parameter_bomb(tmp_path).path)


@pytest.mark.parametrize("limit", ["count", "order", "empty"])
def test_index_entries_are_distinct_chunks_in_file_order(tmp_path, limit):
    fb = FileBuilder()
    scope = record_batch(kinds=bytes([m.OperationKind.SCOPE_BEGIN]), table_ops=[m.ScopeBegin(0, "x")])
    first = fb.batch(scope, 0, 1)
    rows = {
        "count": [],
        "order": [(first, 0, 1, 1, 0, 1, 0), (first, 1, 1, 1, 0, 1, 0)],
        "empty": [(first, 0, 1, 1, 0, 1, 0), (first + 8, 1, 0, 1, 0, 1, 0)],
    }[limit]
    if limit == "count":
        from hostile import index_flood_raw

        path = index_flood_raw(tmp_path).path
        message = r"index: lists 20000 chunks, more than a \d+-byte file can hold"
    else:
        path = fb.finish(tmp_path / "i.kreplay", batches=rows)
        message = {"order": "not listed in file order", "empty": "holds no operation and no payload"}[limit]
    with pytest.raises(replayfmt.ReplayFormatError, match=message):
        replayfmt.open(path)


def test_zstd_chunks_may_not_expand_past_the_per_chunk_or_per_file_bound(tmp_path):
    from hostile import spread_bomb, zstd_records_bomb

    with pytest.raises(
        replayfmt.ReplayFormatError,
        match=r"declares 262144000 bytes from \d+ stored, more than "
        r"max_expansion \(1024x \+ 16777216\) allows",
    ):
        drain(zstd_records_bomb(tmp_path).path)
    with replayfmt.open(spread_bomb(tmp_path).path) as cap:  # recovered: the scan stops at the bound
        assert cap.recovered and "compressed chunks declare more than max_expansion" in cap.recovery_reason
