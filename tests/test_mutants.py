"""Mutants of the example captures through the whole library, not only the reader: the verdict
(the plan), dump's summary, text and JSONL views, diff and extract without a GPU. Each mutant
changes a record batch behind valid checksums (FlatBuffers offsets, counts and vtable entries
redirected, or words and bits anywhere), seeded, so a failure names a reproducible mutant. Only
``ReplayError`` and kin may escape, each with a one-line message (a bare ``KeyError('payload N does
not exist')`` or ``IndexError`` is a bug).

Mutant ``k`` of an example is seeded by its own name and number alone, so any one can be built
again apart from the others. ``REPLAYFMT_MUTANTS`` sets how many (default 400 per example:
seconds); benchmarks/mutants.py runs the issue's 50,000 (25,000 per example) on every core and
counts how each ended."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import zstandard
from craft import FileBuilder
from test_fuzz import flatbuffer_sites

import replayfmt
from replayfmt.dump import Dumper, summarize
from replayfmt.edit.diff import diff_captures
from replayfmt.edit.extract import ExtractOptions, extract
from replayfmt.edit.select import Selection
from replayfmt.format.enums import OperationKind
from replayfmt.format.layout import ChunkKind, Codec
from replayfmt.replay.replayable import plan_verdict

EXAMPLES = sorted((Path(__file__).parent.parent / "examples").glob("*.kreplay"))
COUNT = int(os.environ.get("REPLAYFMT_MUTANTS", "400"))


def parts(path: Path) -> dict:
    """A capture's frames (as stored), its record batches (decompressed) and their index entries."""
    with replayfmt.open(path) as cap:
        d = cap.directory
        frames = []
        for row in d.frames:
            header = cap.chunks.header(int(row["offset"]), "frame")
            stored = bytes(cap.chunks.raw_body(header, "frame")) if hasattr(cap.chunks, "raw_body") else None
            frames.append((header, stored))
        batches = []
        for i in range(cap.batch_count):
            header = cap.chunks.header(d.batch_offsets[i], "batch")
            body = bytes(cap.chunks.body(header, 1 << 30, "batch"))
            e = d.entry(i)
            batches.append(
                (
                    body,
                    (
                        e.first_operation,
                        e.operation_count,
                        e.first_object,
                        e.object_count,
                        e.first_payload,
                        e.payload_count,
                    ),
                )
            )
    data = path.read_bytes()
    frames = [(h.key, data[h.body_offset : h.body_offset + h.stored_size], h.codec, h.logical_size) for h, _ in frames]
    return {"frames": frames, "batches": batches, "sites": [flatbuffer_sites(b, "RecordBatch") for b, _ in batches]}


def mutate(body: bytes, sites: dict[str, list[int]], rng: random.Random) -> bytes:
    out = bytearray(body)
    for _ in range(rng.randint(1, 4)):
        how = rng.choice(["u32", "u32", "redirect", "vtable", "word", "bit"])
        if how == "vtable" and sites["vtable"]:
            at = rng.choice(sites["vtable"])
            out[at : at + 2] = rng.choice([0, 2, 4, 0xFFFF, rng.randrange(1 << 16)]).to_bytes(2, "little")
        elif how in ("u32", "redirect") and sites["u32"]:
            at = rng.choice(sites["u32"])
            old = int.from_bytes(out[at : at + 4], "little")
            if how == "redirect":
                value = (rng.choice(sites["u32"] + sites["table"]) - at) % (1 << 32)
            else:
                value = rng.choice([0, 1, old + 4, old - 4, old * 2, 0x7FFFFFFF, 0xFFFFFFFF, rng.randrange(1 << 32)])
            out[at : at + 4] = (value % (1 << 32)).to_bytes(4, "little")
        elif how == "word":
            at = rng.randrange(0, max(1, len(out) - 8))
            value = rng.choice([0, 1, 2, 3, 999, 0xFFFFFFFF, 1 << 31, rng.randrange(1 << 32)])
            out[at : at + 4] = value.to_bytes(4, "little")
        else:
            at = rng.randrange(len(out))
            out[at] ^= 1 << rng.randrange(8)
    return bytes(out)


def build(p: dict, which: int, body: bytes, path: Path, zstd: bool) -> Path:
    fb = FileBuilder()
    for key, stored, codec, logical in p["frames"]:
        fb.frame(key, stored, codec=codec, logical=logical)
    for i, (original, (first_op, ops, first_obj, objs, first_payload, payloads)) in enumerate(p["batches"]):
        chunk = body if i == which else original
        if zstd:
            offset = fb.chunk(
                ChunkKind.RECORDS, zstandard.ZstdCompressor().compress(chunk), codec=Codec.ZSTD, logical=len(chunk)
            )
        else:
            offset = fb.chunk(ChunkKind.RECORDS, chunk)
        fb.batches.append((offset, first_op, ops, first_obj, objs, first_payload, payloads))
    return fb.finish(path)


def build_mutant(p: dict, example: Path, k: int, path: Path) -> Path:
    """Mutant ``k`` of ``example`` (whose :func:`parts` are ``p``), written to ``path``."""
    rng = random.Random(f"mutants-{example.stem}-{k}")
    which = rng.randrange(len(p["batches"]))
    body = mutate(p["batches"][which][0], p["sites"][which], rng)
    return build(p, which, body, path, zstd=rng.random() < 0.5)


def through_the_library(path: Path, other: Path, out: Path) -> str:
    """Everything a GPU-less tool does with a capture; only ReplayError may leave. Returns the
    ReplayError's class name where one ended it, else ``""``."""
    try:
        with replayfmt.open(path) as cap:
            verdict = plan_verdict(cap)
            summary = summarize(cap, problems=verdict.problems, warnings=verdict.warnings)
            summary.as_row()
            dumper = Dumper(cap)
            for _ in dumper.text_lines():
                pass
            for _ in dumper.jsonl_rows():
                pass
            with replayfmt.open(other) as b:
                diff_captures(cap, b)
            launched = [op.index for op in cap if op.kind == OperationKind.LAUNCH]
        if launched:  # the last launch alone, with its closure (the whole capture spans regions)
            extract(path, Selection.operation(launched[-1]), out, ExtractOptions(allow_gpu=False, overwrite=True))
    except replayfmt.ReplayError as exc:
        assert str(exc) and "\n" not in str(exc), repr(exc)
        return type(exc).__name__
    return ""


def test_the_examples_themselves_go_through_cleanly(tmp_path):
    for example in EXAMPLES:
        assert through_the_library(example, example, tmp_path / "extracted.kreplay") == ""


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_mutants_raise_only_replay_errors(example, tmp_path):
    p = parts(example)
    for k in range(COUNT):
        path = build_mutant(p, example, k, tmp_path / "mutant.kreplay")
        try:
            through_the_library(path, example, tmp_path / "extracted.kreplay")
        except Exception as exc:  # the mutant named, to replay it
            raise AssertionError(f"mutant {k} of {example.name}: {type(exc).__name__}: {exc}") from exc


def test_a_lookup_of_nothing_is_a_replay_error_with_one_line():
    with replayfmt.open(EXAMPLES[0]) as cap:
        for lookup, what, have in (
            (cap.payload, "payload", cap.payload_count),
            (cap.object, "object", cap.object_count),
        ):
            for missing in (0, 999):
                with pytest.raises(replayfmt.ReplayFormatError) as info:
                    lookup(missing)
                assert isinstance(info.value, KeyError)  # callers that look ids up as keys still catch it
                assert str(info.value) == f"{what} {missing} does not exist (the capture has {have})"
