"""What the program's frameworks say its device memory holds when a checkpoint is taken: the dtype,
shape and strides of live PyTorch tensors, JAX arrays and CuPy arrays, so that the checkpoint's
ranges are stored typed (format 1.3, ``Checkpoint.types``) and verification compares values of
that type (docs/VERIFY.md).

Asked once per checkpoint, never per operation: PyTorch and CuPy keep no registry of live arrays,
so their arrays are found among the objects the garbage collector tracks (a walk of the heap, tens
of milliseconds in a large program), JAX's through ``jax.live_arrays()``. A framework the program
has not imported is never imported here, and one whose API fails is left out (``problems``).
"""

from __future__ import annotations

import bisect
import gc
import sys
import time
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from replayfmt.capture.allocations import TensorLabel
from replayfmt.capture.labels import dtype_of
from replayfmt.format import model as m

# Weak proxies forward isinstance's look at ``__class__`` to their referent, and raise
# ReferenceError once it is gone (torch.compile's caches hold such proxies).
_WEAK_PROXIES = (weakref.ProxyType, weakref.CallableProxyType)


def _heap() -> list[Any]:
    """The objects the garbage collector tracks, but weak proxies."""
    return [obj for obj in gc.get_objects() if type(obj) not in _WEAK_PROXIES]


def _torch_labels(objects: list[Any]) -> list[TensorLabel]:
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return []
    out: list[TensorLabel] = []
    seen: set[int] = set()
    for obj in objects:
        if not isinstance(obj, torch.Tensor):
            continue
        try:
            label = _torch_label(obj, seen)
        except Exception:  # a tensor with no storage (fake, functional, meta): not device memory we compare
            continue
        if label is not None:
            out.append(label)
    return out


def _torch_label(obj: Any, seen: set[int]) -> TensorLabel | None:
    if not obj.is_cuda or obj.is_sparse:
        return None
    storage = obj.untyped_storage()
    address, size = storage.data_ptr(), storage.nbytes()
    if not size or address in seen:
        return None
    seen.add(address)
    whole = obj.storage_offset() == 0 and obj.is_contiguous() and obj.numel() * obj.element_size() == size
    shape = tuple(obj.shape) if whole else ()
    strides = tuple(obj.stride()) if whole else ()
    return TensorLabel(address, size, dtype_of(str(obj.dtype)), shape, strides)


def _cupy_labels(objects: list[Any]) -> list[TensorLabel]:
    cupy = sys.modules.get("cupy")
    if cupy is None:
        return []
    out = []
    for obj in objects:
        if not isinstance(obj, cupy.ndarray) or obj.base is not None or not obj.nbytes:
            continue
        itemsize = obj.dtype.itemsize
        strides = tuple(s // itemsize for s in obj.strides) if all(s % itemsize == 0 for s in obj.strides) else ()
        out.append(TensorLabel(obj.data.ptr, obj.nbytes, dtype_of(obj.dtype.name), tuple(obj.shape), strides))
    return out


def _jax_labels() -> list[TensorLabel]:
    jax = sys.modules.get("jax")
    if jax is None or not hasattr(jax, "live_arrays"):
        return []
    out = []
    for array in jax.live_arrays():
        if array.is_deleted():
            continue
        dtype = dtype_of(str(array.dtype))
        for shard in array.addressable_shards:
            if shard.device.platform != "gpu":
                continue
            data = shard.data
            out.append(TensorLabel(data.unsafe_buffer_pointer(), data.nbytes, dtype, tuple(data.shape)))
    return out


BUDGET_SECONDS = 10.0  # asking stops once it has taken this long in one recording (kernel mode, many instances)


@dataclass
class LiveTypes:
    """The typed arrays of the frameworks a program uses, asked once per checkpoint, until asking
    has cost ``budget`` seconds in all (then the rest of the checkpoints are untyped, and
    ``problems`` says so once)."""

    enabled: bool = True
    problems: list[str] = field(default_factory=list)
    budget: float = BUDGET_SECONDS
    seconds: float = 0.0  # spent asking
    asked: int = 0
    _broken: set[str] = field(default_factory=set)

    def labels(self) -> list[TensorLabel]:
        """Every live typed array now, sorted by address."""
        if not self.enabled:
            return []
        if self.seconds > self.budget:
            self.enabled = False
            self.problems.append(
                f"typing checkpoints stopped after {self.asked} checkpoints ({self.seconds:.1f} s asking the "
                "frameworks for their arrays); later checkpoints are compared as bytes where their buffers are untyped"
            )
            return []
        started = time.perf_counter()
        try:
            return self._labels()
        finally:
            self.asked += 1
            self.seconds += time.perf_counter() - started

    def _labels(self) -> list[TensorLabel]:
        heap: list[Any] | None = None
        out: list[TensorLabel] = []
        for name in ("torch", "cupy", "jax"):
            if name in self._broken or name not in sys.modules:
                continue
            try:
                if name == "jax":
                    out += _jax_labels()
                    continue
                if heap is None:
                    heap = _heap()
                out += _torch_labels(heap) if name == "torch" else _cupy_labels(heap)
            except Exception as exc:  # a framework's API changed: leave it out, say so once
                self._broken.add(name)
                self.problems.append(f"{name} array types: {type(exc).__name__}: {exc}")
        return sorted(out, key=lambda t: (t.address, -t.size))


def typed_tensors(
    buffer: int, base: int, spans: Iterable[tuple[int, int]], labels: list[TensorLabel]
) -> list[m.TypedTensor]:
    """The typed tensors of checkpointed spans (offset, size) of the allocation at ``base``, from
    ``labels`` sorted by address: each label clipped to the span (its shape kept only when whole);
    where labels overlap, the first (lowest, then largest) wins."""
    starts = [t.address for t in labels]
    out: list[m.TypedTensor] = []
    for offset, size in spans:
        lo, hi = base + offset, base + offset + size
        end = lo
        k = max(0, bisect.bisect_right(starts, lo) - 1)
        while k < len(labels) and labels[k].address < hi:
            t = labels[k]
            k += 1
            a, b = max(t.address, end), min(t.address + t.size, hi)
            if b <= a or t.dtype == m.DType.UNKNOWN:
                continue
            whole = (a, b) == (t.address, t.address + t.size)
            shape, strides = (t.shape, t.strides) if whole else ((), ())
            out.append(m.TypedTensor(buffer, a - base, b - a, t.dtype, shape, strides, t.name))
            end = b
    return out
