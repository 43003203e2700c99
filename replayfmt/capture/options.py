"""What a recording keeps: the mode, the kernel selection and the file policy."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from replayfmt.errors import ReplayUsageError
from replayfmt.format import model as m


class CaptureMode(enum.Enum):
    """``region``: everything between start and stop (or inside selected scopes), replayed as a
    whole. ``kernel``: selected launches, each a self-contained instance with before and after
    snapshots, for per-kernel replay and tuning."""

    REGION = "region"
    KERNEL = "kernel"


@dataclass(frozen=True)
class RecordOptions:
    mode: CaptureMode = CaptureMode.REGION
    kernels: str | None = None  # kernel mode: regex searched in the kernel's symbol name
    skip_first: int = 0  # kernel mode: launches of each kernel to let pass before capturing
    max_per_kernel: int | None = 1  # kernel mode: instances kept per kernel (None: all)
    region_scopes: tuple[str, ...] = ()  # region mode: record only inside scopes with these names
    fixed_addresses: bool = False  # mark every buffer requires_fixed_address
    label_tensors: bool = False  # type buffers from every PyTorch op's tensors (a dispatch mode; costs per op)
    detect_pointers: bool = True  # scan snapshots for stored device pointers (then require fixed addresses)
    file_policy: m.FilePolicy = m.FilePolicy.REFERENCE
    file_validation: m.FileValidation = m.FileValidation.IDENTITY
    original_times: bool = True  # record the original program's device times (CUPTI activity records)
    # snapshot only the live framework buffers (JAX arrays, PyTorch blocks) of large allocations
    live_buffers: bool = True
    # type checkpointed ranges from the frameworks' live arrays (PyTorch, JAX, CuPy), once per checkpoint
    type_checkpoints: bool = True
    max_snapshot: int = 16 << 30  # bytes: a larger snapshot with no framework view is refused, never tried

    def __post_init__(self) -> None:
        if self.skip_first < 0:
            raise ReplayUsageError(f"skip_first must be >= 0, not {self.skip_first}")
        if self.max_per_kernel is not None and self.max_per_kernel < 1:
            raise ReplayUsageError(f"max_per_kernel must be >= 1, not {self.max_per_kernel}")
        if self.kernels is not None:
            try:
                re.compile(self.kernels)
            except re.error as exc:
                raise ReplayUsageError(f"kernels={self.kernels!r} is not a valid regular expression: {exc}") from None
        if self.max_snapshot < 0:
            raise ReplayUsageError(f"max_snapshot must be >= 0, not {self.max_snapshot}")
        if self.mode == CaptureMode.KERNEL and self.region_scopes:
            raise ReplayUsageError("region_scopes applies to mode=region only")
