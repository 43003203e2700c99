"""What frameworks tell the recorder about kernels and tensors: parameter annotations, and typed
sub-ranges of an allocation that holds tensors of several dtypes."""

from __future__ import annotations

from dataclasses import dataclass

from replayfmt.capture.allocations import Allocation
from replayfmt.format import model as m


@dataclass(frozen=True)
class KernelAnnotation:
    """Names and kinds of a kernel's parameters, from a framework (Triton's launcher)."""

    names: tuple[str, ...] = ()
    kinds: tuple[m.ParameterKind, ...] = ()
    dtypes: tuple[m.DType, ...] = ()
    tensor_maps: bool = False  # its 128-byte parameters are tensor maps (Triton tensor descriptors)


def typed_ranges(allocation: Allocation) -> tuple[m.TypedRange, ...]:
    """Typed sub-ranges of an allocation holding tensors of several dtypes (a caching-allocator
    segment), from the framework's tensor labels: the first label wins where tensors overlap."""
    if len({t.dtype for t in allocation.labels if t.dtype != m.DType.UNKNOWN}) < 2:
        return ()
    ranges: list[m.TypedRange] = []
    for t in sorted(allocation.labels, key=lambda t: t.address):
        start = max(t.address, allocation.address) - allocation.address
        end = min(t.address + t.size, allocation.address + allocation.size) - allocation.address
        if t.dtype == m.DType.UNKNOWN or end <= start or (ranges and start < ranges[-1].offset + ranges[-1].size):
            continue
        ranges.append(m.TypedRange(start, end - start, t.dtype))
    return tuple(ranges)
