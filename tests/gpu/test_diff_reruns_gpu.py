"""Issue 46 on a GPU: two captures of one unchanged PyTorch step (indexing, cub and TensorIterator
kernels, whose parameters are structs holding pointers) diff as the same: parameters are read by
what the kernel declares (pointers as buffer and offset, values by value, TensorInfo up to its
dims), the other bytes of structs passed by value counted apart as struct-bytes. A capture with
one payload byte flipped is refused by dump's verdict, the dry run and diff, naming the payload."""

from __future__ import annotations

import sys

import pytest
from test_capture_gpu import SCRIPTS, capture, capture_ready, needs, run  # noqa: F401 - a fixture

import replayfmt
from replayfmt.format.layout import CHUNK_HEADER_SIZE
from replayfmt.replay.plan_checks import payloads_of

pytestmark = pytest.mark.usefixtures("capture_ready")


def test_two_captures_of_one_step_diff_the_same(tmp_path):
    needs("torch")
    a, b = tmp_path / "a.kreplay", tmp_path / "b.kreplay"
    capture(a, SCRIPTS / "moe_step.py")
    capture(b, SCRIPTS / "moe_step.py")
    done = run([sys.executable, "-m", "replayfmt_tools.diff_replay", str(a), str(b)])
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert done.stdout.rstrip().endswith("verdict: same within the thresholds")
    assert ", 0 parameters," in done.stdout


def test_a_flipped_payload_byte_is_refused_everywhere(tmp_path):
    needs("torch")
    good = tmp_path / "good.kreplay"
    capture(good, SCRIPTS / "moe_step.py")
    with replayfmt.open(good) as cap:  # a payload the replay reads: an upload's, state's or checkpoint's
        used = [p for op in cap for p in payloads_of(op)]
        info = max((cap.payload(p) for p in set(used)), key=lambda p: p.size)
        offset = cap.frame_location(info.frames[0])[0]
    data = bytearray(good.read_bytes())
    data[offset + CHUNK_HEADER_SIZE + 40] ^= 0x10
    bad = tmp_path / "bad.kreplay"
    bad.write_bytes(bytes(data))
    # equal frames are stored once (zeros are common): other payloads may use this frame too, and
    # each verdict names this one, as the damaged payload or as one that shares the damaged frame
    chunk, named = f"{bad}: offset {offset}: payload ", f"payload {info.id} frame 0"
    dumped = run([sys.executable, "-m", "replayfmt_tools.dump_replay", "--summary", str(bad)])
    assert "replayable    no:" in dumped.stdout and chunk in dumped.stdout and named in dumped.stdout, dumped.stdout
    dry = run([sys.executable, "-m", "replayfmt_tools.run_replay", "--dry-run", str(bad)])
    assert dry.returncode == 2 and chunk in dry.stderr and named in dry.stderr, dry.stdout + dry.stderr
    diffed = run([sys.executable, "-m", "replayfmt_tools.diff_replay", str(good), str(bad)])
    assert diffed.returncode == 1 and chunk in diffed.stdout and named in diffed.stdout, diffed.stdout
