"""Skips for what the driver, not replayfmt, refuses on a given machine."""

from __future__ import annotations

import subprocess

import pytest

RANGE_REFUSED = "the driver would not reserve the recorded range"


def skip_when_the_range_is_refused(result: subprocess.CompletedProcess) -> None:
    """Skip with the driver's answer when a --fixed-addresses replay failed because the driver gave
    another address than the recorded range (the hint is honoured only inside the process's own
    range, which other work on the device or the kernel's address layout can take first); any other
    failure is left to the test's asserts."""
    if result.returncode == 0 or RANGE_REFUSED not in result.stderr:
        return
    line = next(line for line in result.stderr.splitlines() if RANGE_REFUSED in line)
    pytest.skip(f"the driver would not give the recorded range back: {line.strip()[:400]}")
