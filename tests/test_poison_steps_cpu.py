"""The Replayer's pieces of verification, with a fake driver over host memory: the starting state
set and then poisoned in stream order (StateSetter), and the Verifier reading back only the
ranges a later replay of a verification asks for."""

from __future__ import annotations

import ctypes
from types import SimpleNamespace

import numpy as np

from replayfmt.format import model as m
from replayfmt.replay.compare import Tolerance
from replayfmt.replay.plan import upload_key
from replayfmt.replay.staging import Staged
from replayfmt.replay.state import PoisonWrite, StateSetter
from replayfmt.replay.verify import Verifier

OK = 0


class FakeDriver:
    """cuMemcpy* over ctypes buffers standing for device memory; every call logged in order."""

    CUresult = SimpleNamespace(CUDA_SUCCESS=OK)

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def cuEventCreate(self, flags):
        return OK, object()

    def cuEventDestroy(self, event):
        return OK

    def cuMemcpyDtoDAsync(self, dst, src, size, stream):
        self.calls.append(("DtoD", dst, src, size))
        ctypes.memmove(dst, src, size)
        return (OK,)

    def cuMemcpyHtoDAsync(self, dst, src, size, stream):
        self.calls.append(("HtoD", dst, size))
        ctypes.memmove(dst, src, size)
        return (OK,)

    def cuMemcpyDtoH(self, dst, src, size):
        self.calls.append(("DtoH", src, size))
        ctypes.memmove(dst, src, size)
        return (OK,)


class FakeDevices:
    def __init__(self, cu: FakeDriver) -> None:
        self.cu = cu

    def use(self, index: int) -> None:
        pass

    def own(self, release) -> None:
        pass

    def synchronize_all(self):
        self.cu.calls.append(("sync",))
        return (OK,)


class FakeStreams:
    timing_stream = "timing"

    def join(self, event) -> None:
        pass

    def fork(self, event) -> None:
        pass


def test_poison_is_written_after_the_starting_state_in_stream_order(monkeypatch):
    import replayfmt.cuda.driver as driver_module

    cu = FakeDriver()
    monkeypatch.setattr(driver_module, "driver", lambda: cu)
    memory = (ctypes.c_char * 64)()
    pristine = (ctypes.c_char * 64).from_buffer_copy(np.arange(16, dtype=np.float32).tobytes())
    buffer = ctypes.addressof(memory)
    copy = m.Copy(3, m.OperationKind.COPY_HOST_TO_DEVICE, 0, 0, 7, 1, 0, 0, 0, 0, 64)
    staged = {upload_key(copy): Staged(ctypes.addressof(pristine), 64, True)}
    state = StateSetter(FakeDevices(cu), FakeStreams(), staged, {7: buffer})
    state.poison = {2: [PoisonWrite(7, 16, b"\xff" * 8)]}
    state.begin()
    state.apply(2, [copy])
    assert [c[0] for c in cu.calls] == ["DtoD", "HtoD"] and cu.calls[1][1:] == (buffer + 16, 8)
    got = np.frombuffer(bytes(memory), np.float32)
    assert got[:4].tolist() == [0, 1, 2, 3] and np.isnan(got[4:6]).all() and got[6:].tolist() == list(range(6, 16))
    cu.calls.clear()
    state.apply(5, [])  # another region: nothing poisoned there
    assert cu.calls == []


def test_the_verifier_reads_back_only_what_a_verification_asks_for(monkeypatch):
    import replayfmt.cuda.driver as driver_module

    cu = FakeDriver()
    monkeypatch.setattr(driver_module, "driver", lambda: cu)
    a = (ctypes.c_char * 16).from_buffer_copy(bytes(range(16)))
    b = (ctypes.c_char * 16).from_buffer_copy(bytes(range(16, 32)))
    capture = SimpleNamespace(
        read_payload=lambda payload, offset, size: bytes(range(16)) if payload == 1 else bytes(16)
    )
    plan = SimpleNamespace(capture=capture, buffers={1: m.Buffer(size=16), 2: m.Buffer(size=16)})
    verifier = Verifier(FakeDevices(cu), plan, {1: ctypes.addressof(a), 2: ctypes.addressof(b)}, Tolerance(), None)
    seen = []
    verifier.observer = SimpleNamespace(observe=lambda *args: seen.append(args[:3]))
    from replayfmt.replay.options import RunResult

    result = RunResult()
    checkpoint = m.Checkpoint(9, "step", (m.CheckpointEntry(1, 1, 0, 16), m.CheckpointEntry(2, 2, 0, 16)))
    verifier.begin(result, 0, verify=True)
    verifier.checkpoint(checkpoint)
    assert [r.passed for r in result.reports] == [True, False] and len(seen) == 2
    verifier.only = {(9, 2, 0)}
    cu.calls.clear()
    verifier.checkpoint(checkpoint)
    assert [c for c in cu.calls if c[0] == "DtoH"] == [("DtoH", ctypes.addressof(b), 16)] and seen[-1][:2] == (
        9,
        plan.buffers[2],
    )


def test_the_verifier_waits_once_per_checkpoint_and_not_at_all_for_one_it_skips(monkeypatch):
    """A kernel-mode checkpoint holds several ranges: the devices are waited for once before
    they are read back, and a later replay that compares none of them neither waits nor reads."""
    import replayfmt.cuda.driver as driver_module

    cu = FakeDriver()
    monkeypatch.setattr(driver_module, "driver", lambda: cu)
    memory = (ctypes.c_char * 64).from_buffer_copy(bytes(range(64)))
    capture = SimpleNamespace(read_payload=lambda payload, offset, size: bytes(range(16 * payload, 16 * payload + 16)))
    plan = SimpleNamespace(capture=capture, buffers={1: m.Buffer(size=64)})
    verifier = Verifier(FakeDevices(cu), plan, {1: ctypes.addressof(memory)}, Tolerance(), None)
    from replayfmt.replay.options import RunResult

    result = RunResult()
    entries = tuple(m.CheckpointEntry(1, k, 16 * k, 16) for k in range(4))
    verifier.begin(result, 0, verify=True)
    verifier.checkpoint(m.Checkpoint(9, "k#0", entries))
    assert [c[0] for c in cu.calls] == ["sync", "DtoH", "DtoH", "DtoH", "DtoH"]
    assert all(r.passed for r in result.reports) and len(result.reports) == 4
    verifier.only = {(3, 1, 0)}
    cu.calls.clear()
    verifier.checkpoint(m.Checkpoint(9, "k#0", entries))
    assert cu.calls == []
