"""replayfmt: capture GPU work into one .kreplay file and replay it standalone.

Public API::

    import replayfmt
    with replayfmt.CaptureWriter("out.kreplay") as w: ...    # write a capture
    with replayfmt.open("out.kreplay") as cap: ...            # read one
    replayfmt.ReplayError                                     # root of every error raised on purpose
    replayfmt.ReplayFormatError                               # a malformed, truncated or hostile file
"""

from __future__ import annotations

from replayfmt.errors import (
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
from replayfmt.format import model
from replayfmt.format.layout import FORMAT_MAJOR, FORMAT_MINOR, Limits
from replayfmt.format.payloads import CompressionPolicy
from replayfmt.reader import Capture, PayloadStats, open_capture as open  # noqa: A004 - the documented entry point
from replayfmt.version import __version__ as __version__
from replayfmt.writer import CaptureWriter

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
