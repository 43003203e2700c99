"""Delta debugging (Zeller and Hildebrandt's ddmin) over a list of items, with candidates tested
in batches so that several devices can test at once.

``ddmin(items, test)`` returns a 1-minimal sublist of ``items`` for which ``test`` still says
"failing" (removing any single item of it makes the test pass), given that ``items`` itself fails.
Each round splits the current list into ``n`` chunks and tries each chunk, then each complement;
the first failing candidate (in that order) becomes the current list. ``test`` receives a batch of
candidates (as many as there are workers) and answers each; a batch's candidates are the next ones
in the sequential order, so with one worker this is plain ddmin, and with several the result is
the same one plain ddmin would find (later candidates of a batch are only wasted work).

The search stops early when ``budget()`` says so (tries or time spent); it then returns the best
list found so far, which has been tested failing (or is ``items``). Candidates already answered
are not tested again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")

# answers to a batch of candidates, in order; None: not tested (the budget ran out)
BatchTest = Callable[[list[list[T]]], list[bool | None]]


@dataclass
class Search(Generic[T]):
    """The state of one ddmin search: the best failing list so far and what was asked."""

    best: list[T]
    tests: int = 0  # candidates answered by the test (not from the cache)
    cached: int = 0  # candidates answered from the cache
    exhausted: bool = False  # the budget stopped the search before it was 1-minimal
    answers: dict[tuple[T, ...], bool] = field(default_factory=dict)


def split(items: Sequence[T], n: int) -> list[list[T]]:
    """``items`` in ``n`` contiguous chunks as equal as can be (the first ones one longer)."""
    size, extra = divmod(len(items), n)
    out, at = [], 0
    for k in range(n):
        step = size + (1 if k < extra else 0)
        out.append(list(items[at : at + step]))
        at += step
    return [c for c in out if c]


def ddmin(
    items: Sequence[T],
    test: BatchTest[T],
    *,
    batch: int = 1,
    budget: Callable[[], bool] = lambda: True,
) -> Search[T]:
    """A 1-minimal failing sublist of ``items`` (see the module docstring); ``batch``: candidates
    handed to ``test`` at once; ``budget()``: False once no more tests may run."""
    if batch < 1:
        raise ValueError("batch must be at least 1")
    s = Search(best=list(items))
    n = 2
    while len(s.best) >= 2:
        chunks = split(s.best, min(n, len(s.best)))
        n = len(chunks)
        complements = [[x for j, c in enumerate(chunks) if j != k for x in c] for k in range(n)] if n > 2 else []
        candidates = chunks + complements
        found = _first_failing(s, candidates, test, batch, budget)
        if found is None and s.exhausted:
            return s
        if found is not None and found < n:  # a chunk alone fails
            s.best, n = candidates[found], 2
        elif found is not None:  # a complement fails
            s.best, n = candidates[found], max(n - 1, 2)
        elif n >= len(s.best):
            return s  # every single item is needed: 1-minimal
        else:
            n = min(len(s.best), 2 * n)
    return s


def _first_failing(
    s: Search[T], candidates: list[list[T]], test: BatchTest[T], batch: int, budget: Callable[[], bool]
) -> int | None:
    """The index of the first candidate that fails, asking ``test`` in batches in order."""
    k = 0
    while k < len(candidates):
        pending: list[int] = []
        while k < len(candidates) and len(pending) < batch:
            key = tuple(candidates[k])
            if key in s.answers:
                s.cached += 1
                if s.answers[key] and not pending:
                    return k
                if s.answers[key]:
                    break  # the batch so far comes first in order: ask it, then this one answers
            else:
                pending.append(k)
            k += 1
        if pending:
            if not budget():
                s.exhausted = True
                return None
            answers = test([candidates[j] for j in pending])
            for j, answer in zip(pending, answers):
                if answer is None:
                    s.exhausted = True
                    continue
                s.tests += 1
                s.answers[tuple(candidates[j])] = answer
            for j in pending:  # in order: the first failing one wins
                if s.answers.get(tuple(candidates[j])):
                    return j
            if s.exhausted:
                return None
        if k < len(candidates) and s.answers.get(tuple(candidates[k])):
            return k
    return None
