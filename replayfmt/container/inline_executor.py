"""An executor that runs work at once on the caller's thread: the writer's ``threads=0`` mode, with
the same Future-based interface as its thread pools."""

from __future__ import annotations

import concurrent.futures as cf
from typing import Any


class InlineExecutor:
    """Runs submitted work at once on the caller's thread (``threads=0``)."""

    def submit(self, fn: Any, *args: Any) -> cf.Future:
        future: cf.Future = cf.Future()
        try:
            future.set_result(fn(*args))
        except BaseException as exc:
            future.set_exception(exc)
        return future

    def shutdown(self, wait: bool = True) -> None:
        pass
