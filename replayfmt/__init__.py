"""replayfmt: capture GPU work into one .kreplay file and replay it standalone.

Public API::

    import replayfmt
    with replayfmt.CaptureWriter("out.kreplay") as w: ...    # write a capture
    with replayfmt.open("out.kreplay") as cap: ...            # read one
    replayfmt.ReplayError                                     # root of every error raised on purpose
    replayfmt.ReplayFormatError                               # a malformed, truncated or hostile file
"""

from __future__ import annotations

from . import model
from .errors import (
    AbiMismatchError,
    DeviceError,
    DeviceUnavailableError,
    FileMismatchError,
    MismatchError,
    ReplayError,
    ReplayFormatError,
    ReplayUsageError,
    ReplayVersionError,
    UnsupportedOperationError,
    VerificationError,
)
from .layout import FORMAT_MAJOR, FORMAT_MINOR, Limits
from .payloads import CompressionPolicy
from .reader import (
    Capture,
    PayloadStats,
    open_capture as open,  # noqa: A004 - the documented entry point
)
from .writer import CaptureWriter

__version__ = "0.1.0"

__all__ = [
    "FORMAT_MAJOR",
    "FORMAT_MINOR",
    "AbiMismatchError",
    "Capture",
    "CaptureWriter",
    "CompressionPolicy",
    "DeviceError",
    "DeviceUnavailableError",
    "FileMismatchError",
    "Limits",
    "MismatchError",
    "PayloadStats",
    "ReplayError",
    "ReplayFormatError",
    "ReplayUsageError",
    "ReplayVersionError",
    "UnsupportedOperationError",
    "VerificationError",
    "model",
    "open",
]
