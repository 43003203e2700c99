"""What frameworks tell the recorder about kernels and tensors: parameter annotations, and typed
sub-ranges of an allocation that holds tensors of several dtypes."""

from __future__ import annotations

from dataclasses import dataclass

from replayfmt.capture import events as ev
from replayfmt.capture.allocations import Allocation
from replayfmt.format import model as m

_DTYPES = {
    "bool": m.DType.BOOL,
    "int8": m.DType.INT8,
    "uint8": m.DType.UINT8,
    "int16": m.DType.INT16,
    "uint16": m.DType.UINT16,
    "int32": m.DType.INT32,
    "uint32": m.DType.UINT32,
    "int64": m.DType.INT64,
    "uint64": m.DType.UINT64,
    "float16": m.DType.FLOAT16,
    "bfloat16": m.DType.BFLOAT16,
    "float32": m.DType.FLOAT32,
    "float64": m.DType.FLOAT64,
    "float8_e4m3fn": m.DType.FLOAT8_E4M3FN,
    "float8_e5m2": m.DType.FLOAT8_E5M2,
    "complex64": m.DType.COMPLEX64,
    "complex128": m.DType.COMPLEX128,
    # Triton's signature spellings
    "i1": m.DType.BOOL,
    "i8": m.DType.INT8,
    "u8": m.DType.UINT8,
    "i16": m.DType.INT16,
    "u16": m.DType.UINT16,
    "i32": m.DType.INT32,
    "u32": m.DType.UINT32,
    "i64": m.DType.INT64,
    "u64": m.DType.UINT64,
    "fp16": m.DType.FLOAT16,
    "bf16": m.DType.BFLOAT16,
    "fp32": m.DType.FLOAT32,
    "fp64": m.DType.FLOAT64,
    "fp8e4nv": m.DType.FLOAT8_E4M3FN,
    "fp8e5": m.DType.FLOAT8_E5M2,
}


def dtype_of(name: str) -> m.DType:
    """A DType from a PyTorch (``torch.float32``), NumPy, JAX, CuPy or Triton (``fp32``) dtype name."""
    return _DTYPES.get(str(name).removeprefix("torch.").lstrip("*"), m.DType.UNKNOWN)


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


class KernelAnnotations:
    """The annotations frameworks gave kernels, by (module key, kernel name); a module key of None
    names the kernel in any module (Triton's launcher knows the name, not the module)."""

    def __init__(self) -> None:
        self._by_kernel: dict[tuple[tuple[str, int] | None, str], KernelAnnotation] = {}

    def add(self, module: tuple[str, int] | None, name: str, annotation: KernelAnnotation) -> None:
        self._by_kernel[(module, name)] = annotation

    def of(self, kernel: ev.Kernel) -> KernelAnnotation:
        return self._by_kernel.get((kernel.module, kernel.name)) or self._by_kernel.get(
            (None, kernel.name), KernelAnnotation()
        )

    def tensor_map(self, kernel: ev.Kernel, offset: int, size: int) -> bool:
        """A 128-byte parameter is a tensor map when 64-aligned (CUtensorMap's alignment) or
        when the framework says the kernel takes tensor descriptors."""
        return size == 128 and (offset % 64 == 0 or self.of(kernel).tensor_maps)
