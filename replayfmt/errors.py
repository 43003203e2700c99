"""The one error hierarchy of replayfmt.

Every error the library raises on purpose derives from :class:`ReplayError`. Messages say what
failed, where (file offset, record, operation index, object id) and, where there is one, what to
try. The command-line tools map these classes to exit codes in one place (tools/common.py).
"""

from __future__ import annotations


class ReplayError(Exception):
    """Root of every error replayfmt raises on purpose."""


class ReplayUsageError(ReplayError):
    """A flag, option or argument given to the library or a tool is invalid."""


class ReplayFormatError(ReplayError):
    """A .kreplay file is malformed, truncated, corrupted or hostile.

    ``offset`` is the file offset where the problem was found (None when not tied to one),
    ``record`` names the record or object (e.g. ``"RECORDS chunk"``, ``"payload 3"``).
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        offset: int | None = None,
        record: str | None = None,
    ) -> None:
        self.message = message
        self.path = path
        self.offset = offset
        self.record = record
        super().__init__(self._render())

    def _render(self) -> str:
        where = []
        if self.path:
            where.append(str(self.path))
        if self.offset is not None:
            where.append(f"offset {self.offset}")
        if self.record:
            where.append(self.record)
        return f"{': '.join(where)}: {self.message}" if where else self.message


class MissingRecordError(ReplayFormatError, KeyError):
    """A record names an object or payload the capture does not hold (a lookup by id that
    failed; also a ``KeyError``, for callers that look ids up as a mapping's keys)."""

    __str__ = ReplayFormatError.__str__  # the message, not KeyError's repr of it


class ReplayVersionError(ReplayFormatError):
    """The file was written by a newer, incompatible major version of the format."""


class UnsupportedOperationError(ReplayError):
    """The capture holds an operation that cannot be reproduced (replay is strict)."""


class MismatchError(ReplayError):
    """Something captured differs from what is available now."""


class FileMismatchError(MismatchError):
    """A referenced file is missing or differs from the captured one (identity or digest)."""


class AbiMismatchError(MismatchError):
    """A (substituted) executable does not match the captured functions' ABI."""


class VerificationError(MismatchError):
    """Replayed buffer contents differ from the capture's checkpoints."""


class DeviceError(ReplayError):
    """A CUDA call failed, or the device cannot host the capture.

    ``sticky`` is True for the driver's sticky errors (an illegal address, a kernel that faulted):
    the CUDA context is then unusable and only a new process can use the GPU again.
    """

    def __init__(self, message: str, *, sticky: bool = False) -> None:
        super().__init__(message)
        self.sticky = sticky


class DeviceUnavailableError(DeviceError):
    """No usable CUDA driver or device here (an environment problem, not a replay failure)."""
