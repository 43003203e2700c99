"""Crash safety: a writer killed at a random moment leaves every flushed record readable."""

import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import replayfmt
from replayfmt.format import model as m

WRITER = textwrap.dedent(
    """
    import sys, numpy as np, replayfmt
    from replayfmt.format import model as m
    with replayfmt.CaptureWriter(sys.argv[1], batch_operations=int(sys.argv[2])) as w:
        exe = w.add_object(m.Executable(functions=(m.Function(name="k"),)))
        i = 0
        while True:
            w.launch(executable=exe, function=0, grid=(i, 1, 1), block=(1, 1, 1), parameters=i.to_bytes(8, "little"))
            if i % 97 == 0:
                w.checkpoint({exe: np.full(5000, i, np.int64)})
            i += 1
            if i % 50 == 0:
                w.flush()
                print(w.operation_count, flush=True)
    """
)


@pytest.mark.parametrize("seed", range(6))
def test_killed_writer_leaves_flushed_records_readable(tmp_path, seed):
    rng = random.Random(seed)
    path = tmp_path / "killed.kreplay"
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), str(rng.choice([7, 64, 1000]))],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    flushed = 0
    deadline = time.monotonic() + rng.uniform(0.3, 1.5)
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        flushed = int(line)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert flushed > 0, "the writer never flushed"
    with replayfmt.open(path) as cap:
        assert cap.recovered
        assert cap.operation_count >= flushed
        for op in cap:
            if op.kind == m.OperationKind.LAUNCH:
                assert op.grid[0] == int.from_bytes(op.parameters, "little")
            elif op.kind == m.OperationKind.CHECKPOINT:
                values = np.frombuffer(cap.read_payload(op.entries[0].payload), np.int64)
                assert (values == values[0]).all()
