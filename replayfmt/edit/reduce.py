"""reduce-replay: shrink a capture to a small one that still fails a test.

:func:`reduce` first puts the original capture to the test (and refuses one that passes), then
runs delta debugging (:mod:`replayfmt.edit.ddmin`) in two phases:

1. over the capture's device work (launches, copies, memsets, graph launches): each candidate is a
   subset written as a standalone capture, closed under its dependencies with its inputs rebuilt
   from the capture's data (:mod:`replayfmt.edit.reduce_build`). ddmin starts from the first of
   :meth:`_Run._hints` that fails the test (the substituted executables' launches, the launches a
   fault names, the writer of the first wrong range), else from all the device work;
2. over the bytes given to the kept work (starting state and copies before it): whole ranges, then
   halves of the ranges still needed, down to ``least_piece`` bytes, so the result keeps only bytes
   its work reads. A candidate here must fail the test *and* verify when replayed as captured with
   the bytes left out poisoned, each byte complemented, not undefined (which may hold the right
   bytes still) (:class:`~replayfmt.edit.reduce_tests.AsCaptured`): bytes whose loss changes what
   the captured kernels compute are bytes they read, and stay, so the result reproduces the
   capture's own answers and the test's failure is the substitution's, not missing data. Where the
   first phase's result does not verify as captured (``FailsVerify`` or ``Faults`` without
   substitutions: the captured work itself is wrong or faults; or no GPU to replay it on) nothing
   can say which bytes are read: the phase is skipped and the result keeps every byte its work was
   given (``ReduceResult.inputs_kept`` says why).

Candidates are tested in child processes (:func:`replayfmt.edit.reduce_tests.run_candidate`), one
at a time per device, as many at once as there are devices: each already runs in a process of its
own, so the pool here is threads that wait on them. The search stops at ``max_tries`` replays or
``max_seconds``; an interrupt (KeyboardInterrupt) ends the children and returns what was found.
Every candidate that fails the test and is smaller than the best so far is written to ``output``
at once (atomically), so the file there always fails the test, whenever the search stops.

The result's metadata properties hold its provenance: ``reduce.source``, ``reduce.source_digest``
(the original file's xxh3-128), ``reduce.test`` (the test as reduce-replay's flags, substitutions
renumbered for the result: ``reduce.result_substitutions``) and ``reduce.operations_kept`` (the
original's operation indices).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from replayfmt.edit.ddmin import Search, ddmin
from replayfmt.edit.extract import file_digest
from replayfmt.edit.reduce_build import Built, NotBuildable, Piece, Reducible
from replayfmt.edit.reduce_tests import (
    Answer,
    AsCaptured,
    Command,
    FailsVerify,
    Faults,
    Test,
    end_children,
    run_candidate,
)
from replayfmt.errors import DeviceUnavailableError, MismatchError, ReplayError, ReplayUsageError
from replayfmt.reader import open_capture
from replayfmt.replay.plan_options import Substitution

Runner = Callable[[Test, Path, "int | None", float], Answer]
# the operations a fault's message lists ("launches since the last successful synchronisation:
# operation 1624 (name), ...") and the first wrong range of a verification ("first: op    144 buffer 3")
_NAMED_OPERATION = re.compile(r"\boperation (\d+) \(")
_FIRST_WRONG = re.compile(r"first: op\s+(\d+) buffer (\d+)\b")


class OriginalPasses(MismatchError):
    """The original capture does not fail the test: there is nothing to reduce."""


@dataclass(frozen=True)
class ReduceOptions:
    """``devices``: one child process at a time per device (None: not pinned); ``max_tries``,
    ``max_seconds``: bounds on replays and on time; ``timeout``: seconds one candidate may take
    (then it counts as passing); ``state_phase``: reduce the given bytes too; ``least_piece``: the
    smallest range of bytes the second phase splits to."""

    devices: tuple[int | None, ...] = (0,)
    max_tries: int | None = None
    max_seconds: float | None = None
    timeout: float = 600.0
    overwrite: bool = False
    state_phase: bool = True
    least_piece: int = 4096


@dataclass
class ReduceResult:
    """What :func:`reduce` did; :meth:`lines` is its short report."""

    source: Path
    output: Path
    test: str
    written: bool = False  # a reduced capture is at ``output``
    operations_before: int = 0
    operations_after: int = 0
    work_before: int = 0  # device work (launches, copies, memsets, graph launches)
    work_after: int = 0
    launches_before: int = 0
    launches_after: int = 0
    size_before: int = 0
    size_after: int = 0
    given_bytes: int = 0  # starting state and copies the result gives its work
    given_bytes_first: int = 0  # the same, before the second phase
    replays: int = 0  # candidates put to the test (the original included)
    not_buildable: int = 0  # candidates the capture's data could not give inputs for (not replayed)
    cached: int = 0
    seconds: float = 0.0
    devices: int = 1
    kept: tuple[int, ...] = ()
    stopped: str = ""  # why the search ended before it was 1-minimal
    interrupted: bool = False  # an interrupt (Ctrl-C) ended it
    last_answer: str = ""  # the result's own verdict, as the test put it
    inputs_kept: str = ""  # why every byte given was kept (the inputs phase did not run)

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def lines(self) -> list[str]:
        mb = 1 << 20
        out = [
            f"reduced      {self.source} -> {self.output}"
            if self.written
            else f"reduced      {self.source}: nothing written",
            f"test         {self.test}",
            f"operations   {self.operations_before} -> {self.operations_after} "
            f"(launches {self.launches_before} -> {self.launches_after}; "
            f"device work {self.work_before} -> {self.work_after})",
            f"bytes        file {self.size_before / mb:.3f} MiB -> {self.size_after / mb:.3f} MiB; inputs given "
            f"{self.given_bytes_first} -> {self.given_bytes} bytes",
            f"replays      {self.replays} tried ({self.not_buildable} candidate(s) the capture's data cannot feed, "
            f"{self.cached} answered again from memory)",
            *([f"inputs       all kept: {self.inputs_kept}"] if self.inputs_kept else []),
            f"time         {self.seconds:.1f} s on {self.devices} device(s)",
        ]
        if self.kept:
            out.append(f"kept         original operation(s) {ranges_text(self.kept)}")
        if self.last_answer:
            out.append(f"verdict      {self.last_answer}" if self.written else f"original     {self.last_answer}")
        if self.stopped:
            out.append(f"stopped      {self.stopped}")
        if not self.written:  # what there is of a result: none (its sizes above are no capture's)
            out = [line for line in out if not line.startswith(("operations", "bytes"))]
            out = [
                line.replace(
                    ": the result fails the test but may not be minimal", " before any smaller candidate failed"
                )
                for line in out
            ]
        return out


def ranges_text(indices: Iterable[int]) -> str:
    """``0..3,7,9..12`` for sorted indices."""
    out: list[str] = []
    run: list[int] = []
    for i in sorted(indices):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            out.append(f"{run[0]}..{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [i]
    if run:
        out.append(f"{run[0]}..{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def reduce(
    source: str | os.PathLike[str],
    output: str | os.PathLike[str],
    test: Test,
    options: ReduceOptions | None = None,
    *,
    progress: Callable[[str], None] | None = None,
    runner: Runner = run_candidate,
) -> ReduceResult:
    """Reduce ``source`` to ``output`` under ``test`` (see the module docstring); ``progress``
    receives one line per answered candidate; ``runner`` puts one candidate to the test."""
    options = options or ReduceOptions()
    source, output = Path(source), Path(output)
    if not options.devices:
        raise ReplayUsageError("give at least one device to test candidates on")
    if output.exists() and not options.overwrite:
        raise ReplayUsageError(f"-o {output}: the file already exists; pass --overwrite to replace it")
    if output.resolve() == source.resolve():
        raise ReplayUsageError(f"-o {output} is the capture being reduced: write the result elsewhere")
    test.check()
    with open_capture(source) as cap, _workdir(output) as work:
        r = Reducible(cap, source)
        run = _Run(r, test, output, work, options, progress, runner)
        run.result.operations_before = cap.operation_count
        run.result.size_before = source.stat().st_size
        run.go()
    return run.result


@contextlib.contextmanager
def _workdir(output: Path) -> Iterator[Path]:
    """A directory for the candidates beside ``output`` (so the best one is renamed into place)."""
    try:
        holder = tempfile.TemporaryDirectory(prefix=".reduce-", dir=output.parent)
    except OSError as exc:
        raise ReplayUsageError(
            f"-o {output}: cannot make a directory for candidates in {output.parent} ({exc.strerror})"
        ) from None
    with holder as work:
        yield Path(work)


class _Run:
    """One reduction's state: the budget, the best capture so far, the children running."""

    def __init__(
        self,
        r: Reducible,
        test: Test,
        output: Path,
        work: Path,
        options: ReduceOptions,
        progress: Callable[[str], None] | None,
        runner: Runner,
    ) -> None:
        self.r = r
        self.test = test
        self.output = output
        self.work = work
        self.options = options
        self.progress = progress or (lambda line: None)
        self.runner = runner
        self.started = time.monotonic()
        self.digest = file_digest(r.source)
        self.best: Built | None = None
        self.count = 0  # candidates built, which names their files
        self.phase = ""
        self.result = ReduceResult(
            r.source,
            output,
            test.describe(),
            work_before=len(r.units),
            launches_before=r.launches,
            devices=len(options.devices),
        )

    # -- budget and progress ------------------------------------------------------------------

    def budget(self) -> bool:
        o = self.options
        if o.max_tries is not None and self.result.replays >= o.max_tries:
            self.result.stopped = f"--max-tries {o.max_tries} reached: the result fails the test but may not be minimal"
            return False
        if o.max_seconds is not None and time.monotonic() - self.started >= o.max_seconds:
            self.result.stopped = (
                f"--max-seconds {o.max_seconds:g} reached: the result fails the test but may not be minimal"
            )
            return False
        return True

    def _say(self, what: str) -> None:
        best = self.best
        size = f"{len(best.kept)} of {len(self.r.units)} device operations" if best else "none yet"
        self.progress(
            f"{self.phase}: {self.result.replays} replays, {time.monotonic() - self.started:.1f} s; best {size}; {what}"
        )

    # -- the search -----------------------------------------------------------------------------

    def go(self) -> None:
        res = self.result
        try:
            self.phase = "original"
            answer = self.runner(self.test, self.r.source, self.options.devices[0], self.options.timeout)
            res.replays += 1
            if answer.error == "unavailable":
                raise DeviceUnavailableError(f"the test needs a GPU to replay on: {answer.detail}")
            if not answer.failing:
                raise OriginalPasses(
                    f"the original capture passes the test ({self.test.describe()}): {answer.detail or 'no failure'}; "
                    "nothing to reduce"
                )
            res.last_answer = answer.detail
            self.phase = "operations"
            self._say(f"the original fails: {answer.detail}")
            start = self._focus(answer.detail)
            searched = ddmin(start, self._operations, batch=len(self.options.devices), budget=self.budget)
            self._account(searched)
            if searched.exhausted and self.best is None:
                return  # the budget ran out before any candidate failed: nothing to write
            if self.best is None or list(self.best.kept) != searched.best:
                self._settle(searched.best)
            if self.best is not None:
                res.given_bytes_first = self.best.state_bytes
            if not searched.exhausted and self.best is not None:
                res.inputs_kept = self._inputs_kept_whole()
                if not res.inputs_kept:
                    self._state_phase()
        except KeyboardInterrupt:
            res.interrupted = True
            res.stopped = "interrupted: the result (if written) fails the test but may not be minimal"
        finally:
            self._finish()

    def _hints(self, detail: str) -> Iterator[tuple[str, list[int]]]:
        """Small sets of device work the bug likely lives in, named by the test and the original's
        answer, most precise first (see "Where the search starts" in docs/REDUCE.md)."""
        test = self.test
        subs = getattr(test, "substitutions", ())
        targets = {t for t in (Substitution.parse(s).target for s in subs) if t is not None}
        if targets:
            yield "the substituted executables' launches", self.r.launches_of(targets)
        if isinstance(test, Faults):
            named = {int(k) for k in _NAMED_OPERATION.findall(detail)} & set(self.r.units)
            if named:
                yield "the launches the fault names", sorted(named)
        if isinstance(test, FailsVerify):
            wrong = _FIRST_WRONG.search(detail)
            writer = self.r.last_writer(int(wrong[1]), int(wrong[2])) if wrong else None
            if writer is not None:
                yield "the last writer of the first wrong range", [writer]

    def _focus(self, detail: str) -> list[int]:
        """Where ddmin starts: the first hint that fails the test (alone, else with the work that
        produced its inputs when the capture does not hold them), else all the device work. Each
        hint is a candidate like any other, so ddmin still starts from a list that fails."""
        units = self.r.units
        for why, hint in self._hints(detail):
            for kept in (hint, self.r.with_producers(hint)):
                if not kept or len(kept) >= len(units) or not self.budget():
                    break
                unbuildable = self.result.not_buildable
                if self._operations([kept])[0]:
                    self._say(f"starting from {why}: {len(kept)} device operation(s)")
                    return kept
                if self.result.not_buildable == unbuildable:
                    break  # replayed and passed: the producers would not make it fail
        return units

    def _inputs_kept_whole(self) -> str:
        """Why the inputs phase cannot run on the best capture (see the module docstring), or ''."""
        if not self.options.state_phase:
            return "--no-state-phase"
        if isinstance(self.test, FailsVerify) and not self.test.substitutions:
            return "--fails-verify without a substitution cannot tell a wrong kernel from one that lost its inputs"
        if self._checks_itself():
            return ""
        assert self.best is not None
        self.phase = "inputs"
        answer = self.runner(AsCaptured(), self.best.path, self.options.devices[0], self.options.timeout)
        self.result.replays += 1
        if answer.error == "unavailable":
            return f"no GPU to check that the bytes left out are not read ({answer.detail[:200]})"
        if answer.failing:
            return (
                f"replayed as captured it does not verify, so nothing says which bytes are read ({answer.detail[:200]})"
            )
        self._say(f"it verifies as captured: {answer.detail[:120]}")
        return ""

    def _checks_itself(self) -> bool:
        """Whether the test itself asks each candidate to verify as captured."""
        return isinstance(self.test, FailsVerify) and bool(self.test.substitutions)

    def _account(self, s: Search) -> None:  # type: ignore[type-arg]
        self.result.cached += s.cached

    def _settle(self, kept: list[int]) -> None:
        """The search ended on ``kept`` without a file for it (the whole capture, rebuilt): test it."""
        answers = self._operations([kept])
        if (not answers or not answers[0]) and self.best is None:
            raise ReplayError(
                "the capture rebuilt from its own data no longer fails the test (the original does): the test "
                "depends on something the rebuilt capture lacks (bytes its data does not hold, the original's "
                "scopes or its uploads' timing)"
            )

    def _properties(self, kept: tuple[int, ...], ids: dict[int, int]) -> tuple[tuple[str, str], ...]:
        mapped = self.test.for_candidate(ids)
        props = [
            ("reduce.source", str(self.r.source.resolve())),
            ("reduce.source_digest", self.digest),
            ("reduce.test", self.test.describe()),
            ("reduce.operations_kept", ranges_text(kept)),
        ]
        if not isinstance(mapped, Command) and mapped.substitutions:
            props.append(("reduce.result_substitutions", " ".join(mapped.substitutions)))
        return tuple(props)

    def _build(self, kept: list[int], dropped: list[Piece], *, poison: bool = False) -> Built | None:
        self.count += 1
        path = self.work / f"candidate-{self.count}{'-poisoned' if poison else ''}.kreplay"
        try:
            built = self.r.build(kept, path, dropped=dropped, properties=self._properties, poison=poison)
        except NotBuildable:
            path.unlink(missing_ok=True)
            self.result.not_buildable += 1
            return None
        return built

    def _operations(self, candidates: list[list[int]]) -> list[bool | None]:
        return self._evaluate([(c, []) for c in candidates])

    def _run_all(self, tests: list[tuple[Test, Built]]) -> list[Answer]:
        """Each (test, candidate) in a child process, one at a time per device."""
        if not tests:
            return []
        devices = self.options.devices
        with ThreadPoolExecutor(max_workers=len(devices)) as pool:
            futures = [
                pool.submit(self.runner, test, b.path, devices[j % len(devices)], self.options.timeout)
                for j, (test, b) in enumerate(tests)
            ]
            try:
                answers = [f.result() for f in futures]
            except KeyboardInterrupt:
                end_children()  # the threads' children, so the pool's shutdown does not wait for them
                raise
        self.result.replays += len(answers)
        return answers

    def _evaluate(
        self, candidates: list[tuple[list[int], list[Piece]]], *, as_captured: bool = False
    ) -> list[bool | None]:
        """Build and test ``candidates``; ``as_captured`` (the inputs phase): a candidate must also
        verify replayed as captured, else it counts as passing (that is asked first, and the test
        only of those that verify)."""
        answers: list[bool | None] = [None] * len(candidates)
        queued: list[tuple[int, Built]] = []
        for k, (kept, dropped) in enumerate(candidates):
            built = self._build(kept, dropped)
            if built is None:
                answers[k] = False
            else:
                queued.append((k, built))
        if queued:
            results: list[Answer | None] = [None] * len(queued)
            if as_captured:
                # first: most candidates here lose bytes the kept work reads, which the test need not
                # tell. Checked with the bytes left out poisoned, not left undefined: an allocation
                # may still hold them from the replay before (x on the GPU: it verified without them)
                poisoned = [self._build(list(b.kept), candidates[k][1], poison=True) for k, b in queued]
                checks = self._run_all([(AsCaptured(), p) for p in poisoned if p is not None])
                it = iter(checks)
                for j, p in enumerate(poisoned):
                    check = next(it) if p is not None else Answer(True, "the poisoned candidate cannot be built")
                    if p is not None:
                        p.path.unlink(missing_ok=True)
                    if check.failing:
                        results[j] = Answer(
                            False, f"not verified as captured (bytes it reads are gone): {check.detail}"
                        )
            rest = [j for j, r in enumerate(results) if r is None]
            tests: list[tuple[Test, Built]] = [(self.test.for_candidate(queued[j][1].ids), queued[j][1]) for j in rest]
            for j, answer in zip(rest, self._run_all(tests)):
                results[j] = answer
            for (k, built), answer in zip(queued, results):
                assert answer is not None
                answers[k] = answer.failing
                verdict = "fails" if answer.failing else "passes"
                self._say(
                    f"{len(built.kept)} device operation(s), {built.state_bytes} bytes given: {verdict} "
                    f"({answer.detail[:120]})"
                )
                if answer.failing and self._better(built):
                    self._keep(built, answer)
                else:
                    built.path.unlink(missing_ok=True)
        return answers

    def _better(self, built: Built) -> bool:
        best = self.best
        if best is None:
            return True
        return (len(built.kept), built.state_bytes) < (len(best.kept), best.state_bytes)

    def _keep(self, built: Built, answer: Answer) -> None:
        tmp = self.output.with_name(f".{self.output.name}.{os.getpid()}.tmp")
        shutil.copyfile(built.path, tmp)
        os.replace(tmp, self.output)
        if self.best is not None:
            self.best.path.unlink(missing_ok=True)
        self.best = built
        self.result.written = True
        self.result.last_answer = answer.detail

    def _state_phase(self) -> None:
        """Drop the given bytes the kept work does not need: whole ranges, then halves."""
        assert self.best is not None
        kept = list(self.best.kept)
        items = sorted(self.best.pieces)
        dropped: list[Piece] = []
        self.phase = "inputs"
        # ddmin never tries nothing at all, and the test may need no bytes
        if items and self.budget() and self._evaluate([(kept, items)], as_captured=True)[0]:
            return
        while items:
            settled = set(items)

            def test(
                cands: list[list[Piece]], items: list[Piece] = items, dropped: list[Piece] = dropped
            ) -> list[bool | None]:
                return self._evaluate(
                    [(kept, dropped + [p for p in items if p not in set(c)]) for c in cands], as_captured=True
                )

            searched = ddmin(items, test, batch=len(self.options.devices), budget=self.budget)
            self._account(searched)
            dropped += [p for p in items if p not in set(searched.best)]
            if searched.exhausted:
                return
            finer = [h for p in searched.best for h in p.halves(self.options.least_piece)]
            if set(finer) == settled or len(finer) == len(searched.best):
                return
            items = finer

    def _finish(self) -> None:
        res = self.result
        res.seconds = time.monotonic() - self.started
        best = self.best
        if best is None:
            return
        res.kept = best.kept
        res.operations_after = best.operations
        res.work_after = len(best.kept)
        res.launches_after = best.launches
        res.given_bytes = best.state_bytes
        res.size_after = self.output.stat().st_size if self.output.exists() else 0
