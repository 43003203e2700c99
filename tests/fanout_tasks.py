"""Task functions for the fan-out tests (importable by name in worker processes)."""

from __future__ import annotations

import os

from replayfmt.measure.fanout import Outcome


def square(x: int) -> int:
    return x * x


def pinned_to() -> tuple[str | None, int]:
    return os.environ.get("CUDA_VISIBLE_DEVICES"), os.getpid()


def die(code: int) -> None:
    os._exit(code)  # as a CUDA fault that takes the process down would


def poison(x: int) -> Outcome:
    return Outcome(x, poisoned=True)


def fail(message: str) -> None:
    raise ValueError(message)


def sleep(seconds: float) -> float:
    import time

    time.sleep(seconds)
    return seconds
