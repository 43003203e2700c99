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


def fake_candidate(config: dict, request: dict) -> Outcome:
    """Stands for the tune worker's evaluation: a candidate's time is its grid's x (the captured
    grid: 64); block 512 takes the process down, block 1024 poisons it (a sticky error)."""
    block = request["reshape"]["block"] or [256, 1, 1]
    if block[0] == 512:
        os._exit(1)
    if block[0] == 1024:
        return Outcome({"error": "CUDA_ERROR_ILLEGAL_ADDRESS", "fatal": True}, poisoned=True)
    grid = request["reshape"]["grid"] or [64, 1, 1]
    return Outcome({"median_ms": float(grid[0]), "stddev_ms": 0.01, "verified": True, "pid": os.getpid()})


def replay_or_crash(path: str, settings: dict) -> Outcome:
    """corpus-replay's task, except that a capture named crash.kreplay takes its worker down."""
    from pathlib import Path

    from replayfmt.verbs.corpus_runs import verify_row

    if Path(path).name == "crash.kreplay":
        os._exit(11)
    return verify_row(path, settings)


def pinned_row(path: str, settings: dict) -> Outcome:
    """corpus-replay's task, except that it replays nothing: its row says which GPUs its worker
    sees and which devices it was asked for, and it appends its capture's name to order.log
    beside the corpus directory (the order rows ran in)."""
    from dataclasses import asdict
    from pathlib import Path

    from replayfmt.measure.corpus import CorpusRow

    with (Path(path).parent.parent / "order.log").open("a") as log:
        log.write(Path(path).name + "\n")
    seen = f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')} devices={settings.get('devices', (0,))}"
    return Outcome(asdict(CorpusRow(Path(path).name, "verified", error=seen)))
