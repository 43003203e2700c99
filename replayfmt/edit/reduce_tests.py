"""What a reduction keeps failing: the tests of reduce-replay, as typed objects, and how one
candidate is put to one in a child process.

* :class:`FailsVerify`: verification finds a wrong range when replayed with the test's run options
  (executable substitutions); with substitutions, the same candidate must also verify without them
  (so a candidate fails because the substituted kernel computes wrong, not because it lost inputs);
* :class:`Faults`: the replay stops on a CUDA error (any, or the one named, e.g.
  ``CUDA_ERROR_ILLEGAL_ADDRESS``);
* :class:`Slower`: the substitution's time is over ``threshold`` times the captured kernels'
  (timed like benchmark-replay);
* :class:`Command`: a command exits non-zero, ``{}`` replaced by the candidate's path;
* :class:`AsCaptured`: replayed as captured, the candidate does not verify (what the inputs phase
  asks of a candidate besides the test: see :mod:`replayfmt.edit.reduce`).

Candidates are tested in child processes (a fault leaves a CUDA context unusable, and a hang is
cut off): ``python -m replayfmt.verbs.reduce_worker TEST CAPTURE`` prints one JSON object (an
:class:`Answer`); a command runs in a shell. ``CUDA_VISIBLE_DEVICES`` pins each to its device.
Substitutions name executables by the original capture's ids; :meth:`for_candidate` renumbers them
for a candidate (a substituted executable the candidate does not keep is left out).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from replayfmt.errors import ReplayUsageError
from replayfmt.replay.plan_options import Substitution


def _mapped(substitutions: tuple[str, ...], ids: dict[int, int]) -> tuple[str, ...]:
    out = []
    for spec in substitutions:
        sub = Substitution.parse(spec)
        if sub.target is None:
            out.append(spec)
        elif sub.target in ids:
            key, _, rest = spec.partition("=")
            suffix = key[len(str(sub.target)) :]  # "@FORMAT", if given
            out.append(f"{ids[sub.target]}{suffix}={rest}")
    return tuple(out)


def _check_substitutions(substitutions: tuple[str, ...]) -> None:
    for spec in substitutions:
        sub = Substitution.parse(spec)
        if not sub.path.is_file():
            raise ReplayUsageError(f"--executable-substitution {spec!r}: {sub.path} is not a file")


@dataclass(frozen=True)
class FailsVerify:
    """Verification finds a wrong range (see the module docstring)."""

    substitutions: tuple[str, ...] = ()  # ID=PATH, ids of the original capture
    replays: int = 4  # replays in all when a range differs (run-replay --nondeterminism-runs)
    kind: str = "fails-verify"

    def describe(self) -> str:
        subs = "".join(f" --executable-substitution {s}" for s in self.substitutions)
        return f"--fails-verify{subs}"

    def for_candidate(self, ids: dict[int, int]) -> FailsVerify:
        return FailsVerify(_mapped(self.substitutions, ids), self.replays)

    def check(self) -> None:
        _check_substitutions(self.substitutions)


@dataclass(frozen=True)
class Faults:
    """The replay stops on a CUDA error: ``error`` (a name such as CUDA_ERROR_ILLEGAL_ADDRESS) or any."""

    error: str = ""
    substitutions: tuple[str, ...] = ()
    kind: str = "faults"

    def describe(self) -> str:
        subs = "".join(f" --executable-substitution {s}" for s in self.substitutions)
        return f"--faults{'=' + self.error if self.error else ''}{subs}"

    def for_candidate(self, ids: dict[int, int]) -> Faults:
        return Faults(self.error, _mapped(self.substitutions, ids))

    def check(self) -> None:
        _check_substitutions(self.substitutions)


@dataclass(frozen=True)
class Slower:
    """With the substitutions the candidate's device time is over ``threshold`` times its time as captured."""

    threshold: float
    substitutions: tuple[str, ...] = ()
    min_time: float = 0.2  # seconds of timed iterations per side
    kind: str = "slower"

    def describe(self) -> str:
        subs = "".join(f" --executable-substitution {s}" for s in self.substitutions)
        return f"--slower {self.threshold:g}{subs}"

    def for_candidate(self, ids: dict[int, int]) -> Slower:
        return Slower(self.threshold, _mapped(self.substitutions, ids), self.min_time)

    def check(self) -> None:
        if not self.substitutions:
            raise ReplayUsageError(
                "--slower compares a substitution with the captured kernels: give --executable-substitution"
            )
        if not self.threshold > 1.0:
            raise ReplayUsageError(f"--slower {self.threshold:g}: the threshold is a ratio over 1 (1.1: 10% slower)")
        _check_substitutions(self.substitutions)


@dataclass(frozen=True)
class Command:
    """``command`` (a shell command line, ``{}`` the candidate's path) exits non-zero."""

    command: str
    kind: str = "command"

    def describe(self) -> str:
        return f"--command {shlex.quote(self.command)}"

    def for_candidate(self, ids: dict[int, int]) -> Command:
        return self

    def check(self) -> None:
        if "{}" not in self.command:
            raise ReplayUsageError(f"--command {self.command!r}: put {{}} where the candidate capture's path goes")

    def line(self, path: Path) -> str:
        return self.command.replace("{}", shlex.quote(str(path)))


@dataclass(frozen=True)
class AsCaptured:
    """Replayed as captured (no substitution), the candidate does not verify: a range is wrong or
    an operation fails. Not one of reduce-replay's tests: its inputs phase puts each candidate that
    still fails the test to this one too, and keeps it only when it verifies, so the bytes dropped
    are bytes the kept work does not read and the result reproduces what the capture computed."""

    kind: str = "as-captured"

    def describe(self) -> str:
        return "run-replay --verify, as captured"

    def for_candidate(self, ids: dict[int, int]) -> AsCaptured:
        return self

    def check(self) -> None:
        pass


Test = FailsVerify | Faults | Slower | Command | AsCaptured
_KINDS: dict[str, type] = {
    "fails-verify": FailsVerify,
    "faults": Faults,
    "slower": Slower,
    "command": Command,
    "as-captured": AsCaptured,
}


def encode_test(test: Test) -> str:
    return json.dumps(asdict(test))


def decode_test(text: str) -> Test:
    try:
        fields = json.loads(text)
        cls = _KINDS[fields["kind"]]
        if "substitutions" in fields:
            fields["substitutions"] = tuple(fields["substitutions"])
        return cls(**fields)  # type: ignore[no-any-return]
    except (ValueError, KeyError, TypeError) as exc:
        raise ReplayUsageError(f"not a reduce-replay test: {text[:200]!r} ({exc})") from None


@dataclass(frozen=True)
class Answer:
    """What one test of one candidate said: ``failing`` (still shows the bug), and why."""

    failing: bool
    detail: str = ""
    error: str = ""  # the CUDA error name, for a fault
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


_RUNNING: set[subprocess.Popen[str]] = set()  # children started here and not yet reaped
_RUNNING_LOCK = threading.Lock()


def end_children() -> None:
    """End the children :func:`run_candidate` started that still run (an interrupted reduction)."""
    with _RUNNING_LOCK:
        running = list(_RUNNING)
    for child in running:
        _end(child)


def run_candidate(test: Test, path: Path, device: int | None, timeout: float) -> Answer:
    """Put ``path`` to ``test`` in a child process pinned to ``device`` (None: not pinned)."""

    env = dict(os.environ)
    if device is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(device)
    if isinstance(test, Command):
        argv = ["/bin/sh", "-c", test.line(path)]
    else:
        argv = [sys.executable, "-m", "replayfmt.verbs.reduce_worker", encode_test(test), str(path)]
    started = time.monotonic()
    # its own session: a timeout ends the whole group (a shell's children too), and the terminal's
    # interrupt reaches only the parent, which then ends the children it started
    child = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True, start_new_session=True
    )
    with _RUNNING_LOCK:
        _RUNNING.add(child)
    try:
        out, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _end(child)
        return Answer(False, f"timed out after {timeout:g} s", seconds=time.monotonic() - started)
    except BaseException:
        _end(child)
        raise
    finally:
        with _RUNNING_LOCK:
            _RUNNING.discard(child)
    took = time.monotonic() - started
    if isinstance(test, Command):
        tail = (err or out).strip().splitlines()[-1:] if (err or out).strip() else []
        return Answer(
            child.returncode != 0, f"exit {child.returncode}" + (f": {tail[0][:200]}" if tail else ""), seconds=took
        )
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if child.returncode != 0 or not lines:
        why = (err.strip().splitlines() or ["no output"])[-1][:300]
        crashed = child.returncode < 0
        # a process killed by a signal (a crash in the driver) counts as a fault of any kind
        failing = isinstance(test, Faults) and not test.error and crashed
        return Answer(failing, f"worker exit {child.returncode}: {why}", "crash" if crashed else "", took)
    fields = json.loads(lines[-1])
    return Answer(bool(fields["failing"]), str(fields.get("detail", "")), str(fields.get("error", "")), took)


def _end(child: subprocess.Popen[str]) -> None:
    """Kill the process group of a child started here (its own session), and reap it."""
    if child.poll() is None:
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    child.wait()
