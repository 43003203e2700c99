"""Pointers stored in device memory (format 1.3 data relocations): found in captured data at
capture, written and read back, checked by the plan, relocated in the staged bytes at replay,
compared as relocated by verification, shown by dump-replay. No GPU: the recorder's translator
runs on a fake device memory, replay's relocation on a fake driver."""

from __future__ import annotations

import ctypes
import json
import struct
import types

import numpy as np
import pytest
from test_capture_translate import MODULE, FakeMemory, kernel, record, saxpy_params
from test_dump import dump

import replayfmt
from replayfmt.capture import RecordOptions, TensorLabel, Translator, events as ev
from replayfmt.capture.allocations import AllocationTable
from replayfmt.capture.hostfiles import HostFiles
from replayfmt.capture.stored_pointers import FrameWords, Words, candidate_words, resolve
from replayfmt.cuda import driver as driver_module
from replayfmt.errors import ReplayFormatError
from replayfmt.format import model as m
from replayfmt.replay.plan import build_plan, upload_key
from replayfmt.replay.staging import Staged, Staging
from replayfmt.replay.stored_pointers import ReplayedAddresses, relocate_staged
from replayfmt.writer import CaptureWriter

A, B, C = 0x7F00_0000_0000, 0x7F00_0010_0000, 0x7F00_0020_0000
ARENA = 0x3_0000_0000  # XLA's arena starts here and spans tens of GB


def table(*allocations: tuple[int, int]) -> AllocationTable:
    t = AllocationTable(lambda address: None)
    for address, size in allocations:
        t.add(address, size, ev.MemoryApi.DEVICE, "cuMemAlloc")
    return t


# -- finding them ------------------------------------------------------------------------------


SPAN = (A, ARENA + (60 << 30) + (1 << 48))  # what the tests' allocations span, and more


def pairs(words: Words) -> list[tuple[int, int]]:
    return list(zip(words.sites.tolist(), words.values.tolist(), strict=True))


def test_candidates_are_the_words_aligned_in_their_buffer_inside_the_span():
    data = struct.pack("<QQQQ", B + 8, 7, 0x3F80_0000_3F80_0000, C)  # pointer, int, two floats, pointer
    assert pairs(candidate_words(data, 0, A, C + 1)) == [(0, B + 8), (24, C)]
    assert pairs(candidate_words(data, 0, A, C)) == [(0, B + 8)]  # C is past the span
    # bytes that start 4 bytes into their buffer: words are aligned in the buffer, not in the bytes
    shifted = bytes(4) + struct.pack("<QQ", B, C)
    assert pairs(candidate_words(shifted, 4, A, C + 1)) == [(8, B), (16, C)]
    assert all(site % 8 == 0 for site, _ in pairs(candidate_words(struct.pack("<QQ", B, C), 4, 0, 1 << 63)))
    assert not len(candidate_words(bytes(7), 0, 0, 1 << 63))


def test_pointers_into_allocations_resolve_and_pairs_of_integers_stay_ambiguous():
    allocations = table((A, 4096), (B, 1 << 20), (ARENA, 60 << 30))
    holder = allocations.find(A)
    values = [
        B + 256,  # a pointer inside B
        B,  # B's start
        0x7F00_0000_1234_5678,  # into nothing recorded: data
        ARENA + (5 << 32) + 100_000,  # (100000, 5): an int32 pair inside the arena
        ARENA,  # the arena's own start: a pointer whatever its halves
        (0x7F00 << 32) | 3,  # A + 3, or the pair (3, 0x7f00)
    ]
    words = Words(np.arange(0, 48, 8, dtype=np.int64), np.array(values, dtype=np.uint64))
    resolved = resolve(words, allocations, holder)
    assert [(site, offset, t.address) for site, offset, t in resolved.relocations] == [
        (0, 256, B),
        (8, 0, B),
        (32, 0, ARENA),
    ]
    assert resolved.ambiguous == 2 and resolved.example[:2] == (24, ARENA + (5 << 32) + 100_000)


def test_a_small_integer_low_half_is_ambiguous_unless_it_is_an_allocation_start():
    base = 0x7F01_0000_0000  # an allocation that starts at a 4 GiB boundary: its start's low half is 0
    allocations = table((base, 1 << 20))
    words = Words(np.array([0, 8], dtype=np.int64), np.array([base, base + 64], dtype=np.uint64))
    resolved = resolve(words, allocations, allocations.find(base))
    assert [site for site, _, _ in resolved.relocations] == [0]
    assert resolved.ambiguous == 1 and resolved.example[0] == 8  # (64, 0x7f01): two integers or a pointer


def test_words_inside_tensors_typed_as_data_are_never_pointers():
    allocations = table((A, 4096), (B, 4096))
    holder = allocations.find(A)
    holder.labels.append(TensorLabel(A, 64, m.DType.INT32, name="token ids"))
    holder.labels.append(TensorLabel(A + 64, 64, m.DType.INT64, name="pointer table"))
    words = Words(np.array([8, 72], dtype=np.int64), np.array([B + 8, B + 16], dtype=np.uint64))
    assert [(site, offset) for site, offset, _ in resolve(words, allocations, holder).relocations] == [(72, 16)]


def test_a_word_of_a_64_bit_integer_tensor_is_one_integer_never_two():
    """A pointer table torch typed as int64 holds a pointer whose low half is small: one integer,
    so a pointer; the same word in untyped bytes stays ambiguous."""
    base = 0x7F01_0000_0000
    allocations = table((A, 4096), (base, 1 << 20))
    holder = allocations.find(A)
    holder.labels.append(TensorLabel(A, 64, m.DType.INT64, name="pointer table"))
    holder.labels.append(TensorLabel(A + 64, 64, m.DType.UNKNOWN, name="untyped"))  # says nothing
    words = Words(np.array([8, 64], dtype=np.int64), np.array([base + 64, base + 64], dtype=np.uint64))
    resolved = resolve(words, allocations, holder)
    assert [(site, offset) for site, offset, _ in resolved.relocations] == [(8, 64)]
    assert resolved.ambiguous == 1 and resolved.example[0] == 64


def test_data_that_looks_like_addresses_costs_no_python_per_word():
    """An int32 tensor of small values inside a 60 GB arena: every word is (integer, small integer)."""
    allocations = table((ARENA, 60 << 30))
    holder = allocations.find(ARENA)
    pairs_of_ints = np.empty(1 << 21, dtype=np.int32)
    pairs_of_ints[0::2] = np.arange(1 << 20) % 7 + 100_000
    pairs_of_ints[1::2] = 5  # each word: (100000 + i % 7, 5), an "address" 20 GiB into the arena
    data = pairs_of_ints.tobytes()
    words = candidate_words(data, 0, *allocations.span())
    assert len(words) == 1 << 20
    resolved = resolve(words, allocations, holder)
    assert not resolved.relocations and resolved.ambiguous == 1 << 20


def test_frame_words_remember_frames_by_digest():
    frames = FrameWords()
    frames.begin(A, C + 1)
    frames.visit(0, b"d1", memoryview(struct.pack("<QQ", 5, B)))
    frames.visit(4096, b"d2", None)  # held by the file, never seen
    assert pairs(frames.words()) == [(8, B)] and frames.unseen == [(4096, b"d2")]
    frames.begin(A, C + 1)
    frames.visit(8192, b"d1", None)  # seen before: known by its digest
    assert pairs(frames.words()) == [(8192 + 8, B)] and frames.unseen == []
    frames.begin(A, C + 4096)  # allocations span more now: the frame is read again
    frames.visit(0, b"d1", None)
    assert frames.unseen == [(0, b"d1")]
    dense = np.full(8192, B, dtype=np.uint64).tobytes()  # every word a candidate: not remembered
    frames.visit(0, b"dense", memoryview(dense))
    assert len(frames.words()) == 8192  # used for this snapshot
    frames.begin(A, C + 4096)
    frames.visit(0, b"dense", None)
    assert frames.unseen == [(0, b"dense")]  # read again when it is met again


# -- the recorder ------------------------------------------------------------------------------


def pointer_table_program(mem: FakeMemory, cubin: bytes, *, upload: bool):
    """A kernel reads a table of pointers (in A) to rows of B and C; B and C never appear among
    its parameters. The table is starting state, or an upload made in the region."""
    pointers = struct.pack("<QQQ", B, C + 64, 0x0000_0002_0000_0001)  # two pointers and a pair of ints
    mem.device[A] = bytearray(pointers if not upload else bytes(24))
    mem.device[B] = bytearray(np.arange(64, dtype=np.float32).tobytes())
    mem.device[C] = bytearray(np.ones(64, dtype=np.float32).tobytes())
    mem.host[0x1000] = pointers
    events = [
        ev.ModuleImage(MODULE, cubin, None),
        ev.Allocation(A, 24),
        ev.Allocation(B, 256),
        ev.Allocation(C, 256),
    ]
    if upload:
        events.append(ev.Copy(ev.CopyDirection.H2D, A, 0x1000, 24, call="cuMemcpyHtoD"))
    events.append(ev.LaunchBegin(kernel(), (1, 1, 1), (1, 1, 1), 0, 0, saxpy_params(1.0, A, A, 3)))
    return events


@pytest.mark.parametrize("upload", [False, True], ids=["state", "upload"])
def test_a_pointer_table_becomes_data_relocations_and_what_it_points_to_is_captured(tmp_path, cubin, upload):
    mem = FakeMemory()
    path, t = record(tmp_path, pointer_table_program(mem, cubin, upload=upload), mem)
    assert not t.report.errors and t.report.stored_pointers == 2
    with replayfmt.open(path) as cap:
        buffers = {o.address: o.id for o in cap.objects() if isinstance(o, m.Buffer)}
        ops = list(cap.iter_operations())
        holder = next(
            op
            for op in ops
            if (isinstance(op, m.State) or op.kind == m.OperationKind.COPY_HOST_TO_DEVICE)
            and (op.buffer if isinstance(op, m.State) else op.dst_buffer) == buffers[A]
        )
        assert [(r.site_buffer, r.site_offset, r.target_buffer, r.target_offset) for r in holder.relocations] == [
            (buffers[A], 0, buffers[B], 0),
            (buffers[A], 8, buffers[C], 64),
        ]
        # B and C are reached only through the table: their contents are starting state and checkpointed
        states = {op.buffer for op in ops if isinstance(op, m.State)}
        assert {buffers[B], buffers[C]} <= states
        checkpoint = next(op for op in ops if isinstance(op, m.Checkpoint))
        assert {buffers[B], buffers[C]} <= {e.buffer for e in checkpoint.entries}
        plan = build_plan(cap)
        assert not plan.needs_fixed_addresses
        relocated = [op for op, _ in plan.uploads.values() if op.relocations]
        assert len(relocated) == 1 and upload_key(relocated[0])[0] == "relocated"


def test_a_table_snapshotted_again_finds_its_pointers_by_digest_or_reads_them(tmp_path, cubin):
    """Each region snapshots the table: its frame is in the file already (never copied again), so
    its pointers are known by the frame's digest; a frame stored unscanned (the table was uploaded
    in region one and stored by its checkpoint) is read once more to be scanned."""
    for upload, extra_reads in ((False, 0), (True, 1)):
        mem = FakeMemory()
        events = pointer_table_program(mem, cubin, upload=upload)
        if upload:
            mem.device[A][:] = mem.host[0x1000]  # what the upload left on the "device"
        reads: list[int] = []
        plain_read = mem.read
        mem.read = lambda address, size, stream, reads=reads, plain=plain_read: (
            reads.append(address) or plain(address, size, stream)
        )
        path = tmp_path / f"c{upload}.kreplay"
        with CaptureWriter(path) as writer:
            t = Translator(writer, RecordOptions(), mem, host_files=HostFiles(tmp_path / "no-maps"))
            for name in ("one", "two", "three"):
                t.start(name)
                for e in events if name == "one" else events[-1:]:
                    t.handle(e)
                t.stop()
        assert reads.count(A) == extra_reads
        with replayfmt.open(path) as cap:
            states = [op for op in cap.iter_operations() if isinstance(op, m.State) and op.relocations]
            assert len(states) == (2 if upload else 3)
            assert len({op.payload for op in states}) == 1 and len({op.relocations for op in states}) == 1


def test_an_ambiguous_word_is_reported_with_the_buffer_and_fixed_addresses(tmp_path, cubin):
    mem = FakeMemory()
    base = 0x7F02_0000_0000
    mem.device[A] = bytearray(struct.pack("<QQ", base + 64, B))  # (64, 0x7f02): a pointer or two ints
    mem.device[B] = bytearray(64)
    mem.device[base] = bytearray(4096)
    _, t = record(
        tmp_path,
        [
            ev.ModuleImage(MODULE, cubin, None),
            ev.Allocation(A, 16),
            ev.Allocation(B, 64),
            ev.Allocation(base, 4096),
            ev.LaunchBegin(kernel(), (1, 1, 1), (1, 1, 1), 0, 0, saxpy_params(1.0, A, A, 2)),
        ],
        mem,
    )
    assert t.report.stored_pointers == 1
    (why,) = t.report.ambiguous_pointers.values()
    assert why.startswith(f"buffer {t.allocations.find(A).buffer} (") and f"{base + 64:#x} at byte 0" in why
    line = next(line for line in t.report.lines() if "may hold pointers" in line)
    assert "--fixed-addresses" in line


def test_no_search_with_fixed_addresses_or_when_turned_off(tmp_path, cubin):
    for options in (RecordOptions(fixed_addresses=True), RecordOptions(detect_pointers=False)):
        mem = FakeMemory()
        path, t = record(tmp_path, pointer_table_program(mem, cubin, upload=True), mem, options=options)
        assert t.report.stored_pointers == 0
        with replayfmt.open(path) as cap:
            assert not any(getattr(op, "relocations", ()) for op in cap if not isinstance(op, m.Launch))
        path.unlink()


# -- the file and the plan ----------------------------------------------------------------------


def write_two_buffers(path, relocations_state=(), relocations_copy=(), partial=""):
    with CaptureWriter(path) as w:
        a = w.add_object(m.Buffer(size=64, address=A))
        b = w.add_object(m.Buffer(size=64, address=B))
        w.state(buffer=a, data=bytes(64), relocations=relocations_state)
        w.copy_h2d(dst_buffer=b, data=bytes(32), dst_offset=16, relocations=relocations_copy)
        w.close(partial=partial)
    return a, b


def test_data_relocations_round_trip_and_older_files_have_none(tmp_path):
    a, b = 1, 2
    write_two_buffers(tmp_path / "r.kreplay", [m.Relocation(a, b, 8, 16)], [m.Relocation(b, a, 40, 0)])
    with replayfmt.open(tmp_path / "r.kreplay") as cap:
        state, copy = [op for op in cap if isinstance(op, m.State | m.Copy)]
        assert state.relocations == (m.Relocation(a, b, 8, 16),)
        assert copy.relocations == (m.Relocation(b, a, 40, 0),)
        assert cap.partial == "" and (cap.header.major, cap.header.minor) == (1, replayfmt.FORMAT_MINOR)
        assert not build_plan(cap).problems
    for old in (
        "sample-1.1.kreplay",
        "sample-1.2.kreplay",
        "sample-1.3.kreplay",
        "sample-1.4.kreplay",
        "sample-1.5.kreplay",
        "sample-1.6.kreplay",
    ):
        with replayfmt.open(f"{__file__.rsplit('/', 1)[0]}/golden/{old}") as cap:
            assert not any(getattr(op, "relocations", ()) for op in cap if not isinstance(op, m.Launch))
            assert cap.partial == ""


@pytest.mark.parametrize(
    ("state", "copy", "message"),
    [
        ([m.Relocation(1, 2, 64, 0)], [], r"stored pointer at byte 64 lies outside the range \[0, 64\)"),
        ([], [m.Relocation(2, 1, 8, 0)], r"stored pointer at byte 8 lies outside the range \[16, 48\)"),
        ([m.Relocation(1, 9, 8, 0)], [], "its stored pointer's target object 9 does not exist"),
        ([m.Relocation(1, 2, 8, 65)], [], "points 65 bytes into buffer 2"),
    ],
)
def test_the_plan_refuses_a_stored_pointer_outside_its_bytes_or_its_target(tmp_path, state, copy, message):
    write_two_buffers(tmp_path / "r.kreplay", state, copy)
    with replayfmt.open(tmp_path / "r.kreplay") as cap, pytest.raises(ReplayFormatError, match=message):
        build_plan(cap)


def test_a_data_relocation_naming_another_kind_of_operation_is_refused(tmp_path):
    path = tmp_path / "r.kreplay"
    with CaptureWriter(path) as w:
        a = w.add_object(m.Buffer(size=64, address=A))
        w._batch.add_data_relocations(0, [m.Relocation(a, a, 0, 0)])  # operation 0 creates the buffer
    with replayfmt.open(path) as cap, pytest.raises(ReplayFormatError, match="neither a state nor an upload"):
        list(cap)


def test_a_partial_capture_is_refused_and_dump_says_so(tmp_path):
    write_two_buffers(tmp_path / "p.kreplay", partial="cuMemcpyDtoHAsync (snapshot): CUDA_ERROR_INVALID_VALUE")
    with replayfmt.open(tmp_path / "p.kreplay") as cap, pytest.raises(replayfmt.ReplayError, match="is partial"):
        build_plan(cap)
    _, out, _ = dump("--summary", str(tmp_path / "p.kreplay"))
    assert "partial       yes: cuMemcpyDtoHAsync (snapshot)" in out and "replayable    no:" in out


def test_dump_shows_stored_pointers_in_text_and_jsonl(tmp_path):
    write_two_buffers(tmp_path / "r.kreplay", [m.Relocation(1, 2, 8, 16)], [m.Relocation(2, 1, 40, 0)])
    code, text, err = dump(str(tmp_path / "r.kreplay"))
    assert code == 0, err
    assert "pointers=1 (@8->buffer#2+16)" in text and "pointers=1 (@40->buffer#1+0)" in text
    assert "pointers      2 stored in state and uploads" in text
    rows = [json.loads(line) for line in dump("--format=jsonl", str(tmp_path / "r.kreplay"))[1].splitlines()]
    state = next(r for r in rows if r["kind"] == "state")
    copy = next(r for r in rows if r["kind"] == "copy_h2d")
    expected = {"site_buffer": 2, "site_offset": 40, "target_buffer": 1, "target_offset": 0, "kind": "pointer"}
    assert state["relocations"][0]["target_offset"] == 16 and copy["relocations"] == [expected]
    assert next(r for r in rows if r["kind"] == "summary")["stored_pointers"] == 2


# -- replay --------------------------------------------------------------------------------------


class FakeCu:
    CUresult = types.SimpleNamespace(CUDA_SUCCESS=0)

    def __init__(self) -> None:
        self.writes: list[tuple[int, bytes]] = []

    def cuMemcpyHtoD(self, dst, src, size):
        self.writes.append((dst, ctypes.string_at(src, size)))
        return (0,)


def test_staged_bytes_get_the_replays_addresses_once(tmp_path, monkeypatch):
    cu = FakeCu()
    monkeypatch.setattr(driver_module, "driver", lambda: cu)
    relocations = [m.Relocation(1, 2, 8, 16), m.Relocation(1, 2, 16, 24), m.Relocation(1, 1, 40, 0)]
    write_two_buffers(tmp_path / "r.kreplay", relocations, [m.Relocation(2, 1, 24, 8)])
    with replayfmt.open(tmp_path / "r.kreplay") as cap:
        plan = build_plan(cap)
        host = (ctypes.c_char * 64)()
        staged = {}
        for key, (op, size) in plan.uploads.items():  # the state on the "device", the copy in pinned memory
            staged[key] = (
                Staged(0xD000, size, True) if op.dst_buffer == 1 else Staged(ctypes.addressof(host), 32, False)
            )
        devices = types.SimpleNamespace(cu=cu, use=lambda gpu: None, index=lambda device: 0)
        addresses = {1: 0x5000_0000, 2: 0x6000_0000}
        assert relocate_staged(devices, plan, Staging(staged=staged), addresses) == 4
    # consecutive pointers are one write; each holds the replay's address + offset
    assert cu.writes == [
        (0xD000 + 8, struct.pack("<QQ", 0x6000_0000 + 16, 0x6000_0000 + 24)),
        (0xD000 + 40, struct.pack("<Q", 0x5000_0000)),
    ]
    assert struct.unpack_from("<Q", host, 24 - 16)[0] == 0x5000_0000 + 8  # site 24 of buffer 2, copied from 16


def test_verification_takes_a_relocated_pointer_for_the_captured_one():
    buffers = {1: m.Buffer(id=1, size=4096, address=A), 2: m.Buffer(id=2, size=64, address=B)}
    addresses = {1: 0x5000_0000, 2: 0x6000_0000}
    replayed = ReplayedAddresses(buffers, addresses)
    expected = struct.pack("<QQQQ", A + 64, B, 7, A + 8)
    actual = struct.pack("<QQQQ", 0x5000_0000 + 64, 0x6000_0000, 7, 0x5000_0000 + 16)  # the last moved elsewhere
    aligned = replayed.align(expected, actual, 0)
    assert aligned[:24] == actual[:24] and aligned[24:] == expected[24:]  # a real difference stays one
    # bytes from buffer byte 4: the cut word is no word of the buffer's, the rest are
    assert replayed.align(expected[4:], actual[4:], 4) == expected[4:8] + aligned[8:]
    same = ReplayedAddresses(buffers, {1: A, 2: B})
    assert same.align(expected, actual, 0) == expected  # fixed addresses: nothing moved, nothing to take


def test_a_kernel_mode_instance_captures_and_checkpoints_what_its_table_points_to(tmp_path, cubin):
    from replayfmt.capture import CaptureMode

    mem = FakeMemory()
    events = [*pointer_table_program(mem, cubin, upload=False), ev.LaunchEnd(0)]
    path, t = record(tmp_path, events, mem, options=RecordOptions(mode=CaptureMode.KERNEL), region=False)
    assert not t.report.errors and t.report.stored_pointers == 2
    with replayfmt.open(path) as cap:
        buffers = {o.address: o.id for o in cap.objects() if isinstance(o, m.Buffer)}
        ops = list(cap.iter_operations())
        assert {buffers[B], buffers[C]} <= {op.buffer for op in ops if isinstance(op, m.State)}
        checkpoint = next(op for op in ops if isinstance(op, m.Checkpoint))
        assert {buffers[A], buffers[B], buffers[C]} <= {e.buffer for e in checkpoint.entries}
