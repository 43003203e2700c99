"""dump-replay takes each record batch as the verdict's plan first decodes it (dump/one_pass): its
rows are the rows a plain walk makes, in order, and each batch is decoded once, though the reader
keeps one batch decoded and the plan reads each twice (its objects, then its operations)."""

from __future__ import annotations

import collections

import numpy as np
import pytest
from click.testing import CliRunner

import replayfmt
from replayfmt.container.batches import LaunchTemplate
from replayfmt.dump import Dumper
from replayfmt.dump.one_pass import OnePass
from replayfmt.format import model as m
from replayfmt.reader import Capture
from replayfmt.replay.replayable import plan_verdict
from replayfmt_tools.dump_replay import main


@pytest.fixture(scope="module")
def many_batches(tmp_path_factory):
    """30 record batches, each creating an event, launching, recording and waiting on it."""
    path = tmp_path_factory.mktemp("onepass") / "many.kreplay"
    with replayfmt.CaptureWriter(path, threads=0, batch_operations=200) as w:
        device = w.add_object(m.Device(name="x", compute_capability=(9, 0)))
        stream = w.add_object(m.Stream(device=device))
        buffer = w.add_object(m.Buffer(size=4096, device=device))
        exe = w.add_object(
            m.Executable(
                format=m.ExecutableFormat.CUBIN, payload=w.add_payload(b"\x7fELF"), functions=(m.Function(name="k"),)
            )
        )
        template = [LaunchTemplate(exe, 0, bytes(16), (m.Relocation(0, buffer, 0, 0),))]
        shapes = np.zeros((190, 12), np.uint32)
        shapes[:, 0], shapes[:, 2:5], shapes[:, 5], shapes[:, 6:8] = stream, 1, 32, 1
        for _ in range(30):
            event = w.add_object(m.Event(device=device))
            w.launches(template, np.zeros(190, np.int64), shapes)
            w.event_record(event, stream)
            w.stream_wait_event(stream, event)
    with replayfmt.open(path) as cap:
        assert cap.batch_count >= 20
    return path


@pytest.mark.parametrize("args", [[], ["--format=jsonl"], ["--format=jsonl", "--kind=launch", "--ops", "150:2500"]])
def test_rows_are_a_plain_walks_and_no_batch_is_decoded_for_the_dump_alone(many_batches, monkeypatch, args):
    plain = CliRunner().invoke(main, [*args, str(many_batches)])  # everything kept: one decode each
    assert plain.exit_code == 0, plain.output
    decoded: collections.Counter[int] = collections.Counter()
    original = Capture._decode_batch

    def counted(self, i):
        decoded[i] += 1
        return original(self, i)

    monkeypatch.setattr(Capture, "_decode_batch", counted)
    with replayfmt.open(many_batches) as cap:  # what the verdict alone decodes, one batch kept
        cap.cache_records = 1
        plan_verdict(cap)
    verdict_alone, decoded = decoded, collections.Counter()
    monkeypatch.setattr("replayfmt.dump.one_pass.KEPT_RECORDS", 1)
    got = CliRunner().invoke(main, [*args, str(many_batches)])
    assert got.exit_code == 0 and got.output == plain.output
    payloads = {0}  # the batch defining the payloads, whose entries the plan looks up again
    # alone, with one batch kept, the plan reads each batch twice; with the dump, once
    assert {n for i, n in verdict_alone.items() if i not in payloads} == {2}
    assert set(decoded) == set(verdict_alone)
    assert {n for i, n in decoded.items() if i not in payloads} == {1}
    assert decoded[0] < verdict_alone[0]


def test_a_batch_nothing_decoded_is_rendered_in_its_place(many_batches):
    with replayfmt.open(many_batches) as cap:
        expected = list(Dumper(cap).text_lines())
    with replayfmt.open(many_batches) as cap, OnePass(cap, Dumper(cap), Dumper.text_lines) as taken:
        assert len(list(cap.iter_operations(0, 600))) == 600  # the first batches only, as a verdict stopped early
        assert list(taken.lines()) == expected
