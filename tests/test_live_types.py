"""Typed checkpoints (format 1.3): the recorder asks the program's frameworks, once per
checkpoint, what their live arrays are, and stores the dtype, shape and strides of the
checkpointed ranges they cover; verification then compares values of that type."""

from __future__ import annotations

import sys
import types
import weakref

import numpy as np
from test_capture_translate import MODULE, A, FakeMemory, kernel, saxpy_params

import replayfmt
from replayfmt.capture import events as ev
from replayfmt.capture.allocations import TensorLabel
from replayfmt.capture.hostfiles import HostFiles
from replayfmt.capture.live_types import LiveTypes, typed_tensors
from replayfmt.capture.options import RecordOptions
from replayfmt.capture.translate import Translator
from replayfmt.format import model as m
from replayfmt.writer import CaptureWriter

D = m.DType


def test_labels_are_clipped_to_the_checkpointed_spans_first_label_winning():
    base = 0x1000
    labels = sorted(
        [
            TensorLabel(base, 256, D.FLOAT32, (64,), (1,), "w"),
            TensorLabel(base + 128, 64, D.INT32, (16,), (1,), "view"),  # overlaps w: w wins
            TensorLabel(base + 512, 512, D.BFLOAT16, (256,), (1,), "h"),
            TensorLabel(base + 2048, 64, D.UNKNOWN),
        ],
        key=lambda t: (t.address, -t.size),
    )
    typed = typed_tensors(9, base, [(0, 768)], labels)
    assert typed == [
        m.TypedTensor(9, 0, 256, D.FLOAT32, (64,), (1,), "w"),
        m.TypedTensor(9, 512, 256, D.BFLOAT16, (), (), "h"),  # clipped: its shape no longer applies
    ]
    assert typed_tensors(9, base, [(256, 256)], labels) == []


class FakeArray:
    """Stands for cupy.ndarray: what LiveTypes reads of one."""

    def __init__(self, ptr: int, shape: tuple[int, ...], dtype: str) -> None:
        self.data = types.SimpleNamespace(ptr=ptr)
        self.dtype = np.dtype(dtype)
        self.shape = shape
        self.strides = tuple(int(s) for s in np.empty(shape, dtype).strides)
        self.nbytes = int(np.prod(shape)) * self.dtype.itemsize
        self.base = None


def test_live_arrays_of_a_framework_the_program_imported_are_found(monkeypatch):
    fake = types.ModuleType("cupy")
    fake.ndarray = FakeArray
    monkeypatch.setitem(sys.modules, "cupy", fake)
    arrays = [FakeArray(0x2000, (4, 8), "float16"), FakeArray(0x1000, (16,), "int64")]
    found = LiveTypes().labels()
    assert [(t.address, t.size, t.dtype, t.shape, t.strides) for t in found if t.address in (0x1000, 0x2000)] == [
        (0x1000, 128, D.INT64, (16,), (1,)),
        (0x2000, 64, D.FLOAT16, (4, 8), (8, 1)),
    ]
    assert LiveTypes(enabled=False).labels() == []
    del arrays


def test_a_weak_proxy_to_a_gone_object_does_not_stop_the_search(monkeypatch):
    """torch.compile's caches hold weak proxies; isinstance on one whose referent is gone raises
    ReferenceError, which stopped typing a compiled step's checkpoints (0 of 1.1 GB typed)."""
    fake = types.ModuleType("cupy")
    fake.ndarray = FakeArray
    monkeypatch.setitem(sys.modules, "cupy", fake)

    class Cached:
        pass

    gone = Cached()
    proxies = [weakref.proxy(gone)]
    del gone
    array = FakeArray(0x3000, (8,), "float32")
    live = LiveTypes()
    assert [t.address for t in live.labels() if t.address == 0x3000] == [0x3000]
    assert live.problems == []
    del array, proxies


def test_a_framework_whose_api_fails_is_left_out_and_said_once(monkeypatch):
    fake = types.ModuleType("cupy")

    class Broken:
        @property
        def base(self):
            raise RuntimeError("changed API")

    fake.ndarray = Broken
    monkeypatch.setitem(sys.modules, "cupy", fake)
    keep = Broken()
    live = LiveTypes()
    assert live.labels() == [] and live.labels() == []
    assert live.problems == ["cupy array types: RuntimeError: changed API"]
    del keep


def test_the_recorder_stores_typed_checkpoints(tmp_path, cubin, monkeypatch):
    fake = types.ModuleType("cupy")
    fake.ndarray = FakeArray
    monkeypatch.setitem(sys.modules, "cupy", fake)
    mem = FakeMemory()
    mem.device[A] = bytearray(1024)
    x = FakeArray(A, (64,), "float32")  # the framework's array: the first 256 bytes
    path = tmp_path / "c.kreplay"
    with CaptureWriter(path) as writer:
        t = Translator(writer, RecordOptions(), mem, host_files=HostFiles(tmp_path / "no-maps"))
        t.handle(ev.ModuleImage(MODULE, cubin, None))
        t.handle(ev.Allocation(A, 1024))
        t.label_tensor(TensorLabel(A + 512, 256, D.INT32, (64,), (1,), "index"))  # an explicit label too
        t.start("step")
        t.handle(ev.LaunchBegin(kernel(), (1, 1, 1), (4, 1, 1), 0, 0, saxpy_params(1.0, A, A, 4)))
        t.stop()
    assert t.report.typed_bytes == 512 and t.report.checkpoint_bytes == 1024
    assert any("checkpoints: 512 of 1024 bytes typed" in line for line in t.report.lines())
    with replayfmt.open(path) as cap:
        (checkpoint,) = [op for op in cap if isinstance(op, m.Checkpoint)]
        buffer = checkpoint.entries[0].buffer
        assert checkpoint.types == (
            m.TypedTensor(buffer, 0, 256, D.FLOAT32, (64,), (1,), ""),
            m.TypedTensor(buffer, 512, 256, D.INT32, (64,), (1,), "index"),
        )
    del x


def test_typing_can_be_turned_off(tmp_path, cubin):
    mem = FakeMemory()
    mem.device[A] = bytearray(1024)
    path = tmp_path / "c.kreplay"
    with CaptureWriter(path) as writer:
        t = Translator(writer, RecordOptions(type_checkpoints=False), mem, host_files=HostFiles(tmp_path / "n"))
        t.handle(ev.ModuleImage(MODULE, cubin, None))
        t.handle(ev.Allocation(A, 1024))
        t.label_tensor(TensorLabel(A, 256, D.FLOAT32, (64,), (1,), "x"))
        t.start("step")
        t.handle(ev.LaunchBegin(kernel(), (1, 1, 1), (4, 1, 1), 0, 0, saxpy_params(1.0, A, A, 4)))
        t.stop()
    with replayfmt.open(path) as cap:
        (checkpoint,) = [op for op in cap if isinstance(op, m.Checkpoint)]
        assert [t.dtype for t in checkpoint.types] == [D.FLOAT32]  # explicit labels still type it


def test_asking_stops_once_its_budget_is_spent(monkeypatch):
    fake = types.ModuleType("cupy")
    fake.ndarray = FakeArray
    monkeypatch.setitem(sys.modules, "cupy", fake)
    keep = FakeArray(0x3000, (4,), "float32")
    live = LiveTypes(budget=0.0)
    assert [t.address for t in live.labels() if t.address == 0x3000] == [0x3000]  # the first ask is free
    assert live.labels() == [] and live.labels() == [] and not live.enabled
    assert len(live.problems) == 1 and live.problems[0].startswith("typing checkpoints stopped after 1 checkpoints")
    del keep
