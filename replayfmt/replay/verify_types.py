"""The verify verb's typed edges: :class:`VerifyOptions` in, :class:`VerifyResult` out.

Data only (no GPU, no file opened), so that the recorder's self-check can build the options and
read the result back from the child process that ran :func:`replayfmt.verbs.verify`, and
``run-replay --verify`` prints the same result: one function, one option set, one meaning of
"verified" (:attr:`VerifyResult.outcome`). The result goes between processes as one JSON object
(:meth:`VerifyResult.to_dict` / :meth:`VerifyResult.from_dict`), never as the tool's text.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from replayfmt.errors import DeviceUnavailableError, ReplayError, ReplayFormatError, ReplayUsageError
from replayfmt.format.layout import DEFAULT_LIMITS, Limits
from replayfmt.replay.collectives import Peers
from replayfmt.replay.compare import Tolerance
from replayfmt.replay.plan_options import PlanOptions

DEFAULT_REPLAYS = 4  # replays in all when a piece differs from the capture (docs/VERIFY.md)

# errors that say nothing of the capture's replay: the file, the flags or this machine (exit 2)
UNAVAILABLE_ERRORS: tuple[type[ReplayError], ...] = (ReplayUsageError, ReplayFormatError, DeviceUnavailableError)


class EvidencePolicy(enum.Enum):
    """When the ranges that start as they are expected to end are replayed poisoned."""

    AUTO = "auto"  # when kernels were changed, nothing else has evidence, or an undefined range starts as expected
    ALWAYS = "always"
    NEVER = "never"  # such ranges then prove nothing


@dataclass(frozen=True)
class VerifyOptions:
    """What :func:`replayfmt.verbs.verify` is asked to do. The defaults are ``run-replay --verify FILE``'s.

    ``plan``: substitutions, remaps, launch overrides, fixed addresses, strictness (what the
    replay is built from). ``verify``: compare checkpoints and expected downloads (False: replay
    and time only, ``run-replay`` without ``--verify``). ``dry_run``: plan only, no GPU.
    """

    plan: PlanOptions = field(default_factory=PlanOptions)
    verify: bool = True
    devices: tuple[int, ...] = (0,)  # captured device k runs on cuda:devices[k]
    tolerance: Tolerance = field(default_factory=Tolerance)  # exact bytes unless enabled
    replays: int = DEFAULT_REPLAYS  # replays in all where a range differs from the capture (1: judge the first)
    evidence: EvidencePolicy = EvidencePolicy.AUTO
    repetitions: int = 1  # runs of the whole capture (inputs restored each time), each timed
    timed_runs: int = 0  # then runs that are timed and not compared (what a corpus reports), in timed_ms
    save_output: Path | None = None  # write the replayed checkpoint buffers here
    nvtx: bool = False  # NVTX ranges around scopes and launches
    check_payloads: bool = True  # check payload frames against their hashes
    dry_run: bool = False  # parse, resolve files, load substitutions, check ABIs, plan; no GPU
    limits: Limits = DEFAULT_LIMITS  # the reader's caps (--limit NAME=VALUE)
    peers: Peers | None = None  # the other ranks' replays, to issue collectives among (verbs/ranks.py)

    def __post_init__(self) -> None:
        if self.replays < 1 or self.repetitions < 1 or self.timed_runs < 0:
            raise ReplayUsageError(
                f"replays ({self.replays}) and repetitions ({self.repetitions}) must be >= 1, "
                f"timed_runs ({self.timed_runs}) >= 0"
            )
        if not self.devices or len(set(self.devices)) != len(self.devices):
            raise ReplayUsageError(f"devices {self.devices}: at least one, none twice")


class Outcome(enum.Enum):
    """What a replay earned; the one meaning of "verified"."""

    VERIFIED = "verified"  # replayed; ranges compared with evidence, none wrong
    NOTHING_TO_VERIFY = "nothing to verify"  # replayed; nothing was compared, or nothing proven
    MISMATCH = "mismatch"  # replayed; a compared range is wrong
    FAILED = "failed"  # the plan refused it, an operation failed, or the replay could not reproduce it
    UNAVAILABLE = "unavailable"  # could not run here: unreadable file, bad options, no device or driver
    REPLAYED = "replayed"  # replayed without verification (verify=False), no operation failed
    PLANNED = "planned"  # a dry run whose plan has no problems

    @property
    def exit_code(self) -> int:
        """run-replay's exit status: 0 it did what was asked; 1 the capture cannot be reproduced
        or verified; 2 usage, format or environment."""
        if self in (Outcome.VERIFIED, Outcome.REPLAYED, Outcome.PLANNED):
            return 0
        return 2 if self is Outcome.UNAVAILABLE else 1


@dataclass(frozen=True)
class VerifyResult:
    """What :func:`replayfmt.verbs.verify` found. ``detail`` says why the outcome is not the one
    asked for (the first problem, failed operation or wrong range), "" when it is."""

    capture: str
    outcome: Outcome
    detail: str = ""
    problems: tuple[str, ...] = ()  # the plan's (nothing ran when there are any)
    errors: tuple[str, ...] = ()  # operations that failed as they ran
    device_ms: tuple[float, ...] = ()  # one per repetition, its starting state left out
    state_ms: tuple[float, ...] = ()  # one per repetition: setting its starting state
    built_while_running: bool = False  # device_ms[0] may include waits for the host
    timed_ms: tuple[float, ...] = ()  # device times of the timed runs (VerifyOptions.timed_runs)
    operations: int = 0  # operations in the capture (those recovered, for a recovered file)
    setup_s: float = 0.0  # host seconds before the device's work: open, plan (and the replay's setup)
    compared: int = 0  # ranges compared (verify)
    summary: str = ""  # the verification's verdict line ("verified: N range(s) compared ...")
    report_lines: tuple[str, ...] = ()  # the ranges that did not compare exactly or prove little
    report: dict[str, Any] | None = field(default=None, compare=False)  # VerificationReport.as_dict()
    # launches not run, by operation: they wait for a host write no replay makes (XLA's autotuner)
    released: dict[int, str] = field(default_factory=dict)

    @property
    def verified(self) -> bool:
        return self.outcome is Outcome.VERIFIED

    @property
    def exit_code(self) -> int:
        return self.outcome.exit_code

    @classmethod
    def from_error(cls, capture: str | Path, exc: ReplayError) -> VerifyResult:
        """The result of a verification that raised: UNAVAILABLE for what says nothing of the
        capture's replay (the file, the options, this machine), FAILED for the rest."""
        unavailable = isinstance(exc, UNAVAILABLE_ERRORS)
        return cls(str(capture), Outcome.UNAVAILABLE if unavailable else Outcome.FAILED, detail=str(exc))

    def to_dict(self) -> dict[str, Any]:
        """One JSON-able object (what a child process hands back)."""
        return {
            "capture": self.capture,
            "outcome": self.outcome.value,
            "detail": self.detail,
            "problems": list(self.problems),
            "errors": list(self.errors),
            "device_ms": list(self.device_ms),
            "state_ms": list(self.state_ms),
            "built_while_running": self.built_while_running,
            "timed_ms": list(self.timed_ms),
            "operations": self.operations,
            "setup_s": self.setup_s,
            "compared": self.compared,
            "summary": self.summary,
            "report_lines": list(self.report_lines),
            "verification": self.report,
            "released": {str(i): what for i, what in sorted(self.released.items())},
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> VerifyResult:
        """The inverse of :meth:`to_dict`; a malformed object is a ReplayFormatError naming the key."""
        try:
            return cls(
                capture=str(data["capture"]),
                outcome=Outcome(data["outcome"]),
                detail=str(data["detail"]),
                problems=tuple(str(p) for p in data["problems"]),
                errors=tuple(str(e) for e in data["errors"]),
                device_ms=tuple(float(x) for x in data["device_ms"]),
                state_ms=tuple(float(x) for x in data["state_ms"]),
                built_while_running=bool(data["built_while_running"]),
                timed_ms=tuple(float(x) for x in data["timed_ms"]),
                operations=int(data["operations"]),
                setup_s=float(data["setup_s"]),
                compared=int(data["compared"]),
                summary=str(data["summary"]),
                report_lines=tuple(str(line) for line in data["report_lines"]),
                report=data["verification"],
                released={int(i): str(what) for i, what in data.get("released", {}).items()},
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ReplayFormatError(f"verify result: malformed or missing field ({exc!r})") from None
