"""What verification answers (docs/VERIFY.md): per piece of a compared range its verdict and
what it proves (:class:`RangeReport`), and the whole verdict (:class:`VerificationReport`), as
text lines like numpy's ``assert_allclose`` and as JSON for scripts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from replayfmt.replay.evidence import Evidence, Piece
from replayfmt.replay.judge import PieceJudgement, ValueVerdict


@dataclass
class RangeReport:
    """The verdict on one piece: how it compared, and what that proves."""

    piece: Piece
    judgement: PieceJudgement
    evidence: Evidence
    note: str = ""

    @property
    def passed(self) -> bool:
        return self.judgement.verdict is not ValueVerdict.WRONG and self.evidence is not Evidence.LEFT

    @property
    def counts(self) -> bool:
        """Whether it is evidence for the verdict (compared against bytes it did not start with)."""
        return self.passed and self.evidence in (Evidence.COMPARED, Evidence.PROVEN)

    def line(self) -> str:
        p, j = self.piece, self.judgement
        name = f"buffer {p.buffer}" + (f" ({p.label})" if p.label else "")
        what = f"{j.dtype}" + (f"{list(p.shape)}" if p.shape else "") if p.typed else "untyped bytes"
        if p.name:
            what += f" {p.name!r}"
        verdict = "FAIL" if not self.passed else "ok"
        text = f"op {p.operation:>6} {name} bytes {p.offset}+{p.size} ({what}): {verdict} {j.verdict.value}"
        if j.verdict is ValueVerdict.VARIES:
            text += (
                f" (largest difference {j.largest_abs_diff:.3g}, {j.largest_ulp_diff} ulp; replays spread "
                f"{j.spread_abs:.3g}, {j.spread_ulps} ulp; {j.differing} of {j.elements} differ)"
            )
        elif j.verdict is ValueVerdict.WRONG:
            text += f": {j.wrong} of {j.elements} {'elements' if p.typed else '4-byte words'} wrong"
        text += f"; {self.evidence.value}" + (f" ({self.note})" if self.note else "")
        return text

    def detail(self) -> list[str]:
        """numpy's assert_allclose, per piece: the first differing elements."""
        j = self.judgement
        if j.verdict is ValueVerdict.EXACT or not j.shown:
            return []
        unit = "index" if self.piece.typed else "byte"
        out = [f"    {unit:>12} {'captured':>14} {'replay min':>14} {'replay max':>14} {'abs diff':>10} {'ulp':>8}"]
        for e in j.shown:
            where = ",".join(str(x) for x in e.position)
            flag = "  <- wrong" if e.wrong else ""
            out.append(
                f"    {where:>12} {e.captured:>14.7g} {e.replay_min:>14.7g} {e.replay_max:>14.7g} "
                f"{e.abs_diff:>10.3g} {e.ulp_diff:>8}{flag}"
            )
        return out

    def as_dict(self) -> dict[str, Any]:
        p, j = self.piece, self.judgement
        return {
            "operation": p.operation,
            "buffer": p.buffer,
            "label": p.label,
            "offset": p.offset,
            "size": p.size,
            "dtype": j.dtype if p.typed else None,
            "typed_by": p.typed_by or None,
            "shape": list(p.shape),
            "name": p.name,
            "verdict": j.verdict.name.lower(),
            "evidence": self.evidence.name.lower(),
            "note": self.note,
            "passed": self.passed,
            "elements": j.elements,
            "differing": j.differing,
            "wrong": j.wrong,
            "largest_abs_diff": _finite(j.largest_abs_diff),
            "largest_ulp_diff": j.largest_ulp_diff,
            "spread_abs": _finite(j.spread_abs),
            "spread_ulps": j.spread_ulps,
            "widening_ulps": j.widening_ulps,
            "first": [e.as_dict() for e in j.shown],
        }


def _finite(x: float) -> float | str:
    return x if np.isfinite(x) else str(x)


@dataclass
class VerificationReport:
    """Every compared piece's verdict and what it proves; :attr:`verified` is earned."""

    ranges: list[RangeReport] = field(default_factory=list)
    replays: int = 0
    poisoned_replays: int = 0
    nondeterministic: bool = False
    reference: bool = False  # a replay of the unmodified capture said which bytes its kernels write

    @property
    def compared(self) -> int:
        return len(self.ranges)

    @property
    def failed(self) -> list[RangeReport]:
        return [r for r in self.ranges if not r.passed]

    @property
    def evidence(self) -> int:
        """Pieces compared against bytes they did not start with (or proven so)."""
        return sum(r.counts for r in self.ranges)

    @property
    def verified(self) -> bool:
        return not self.failed and self.evidence > 0

    def problem(self) -> str | None:
        """Why the verdict is not "verified" (None when it is)."""
        if not self.ranges:
            return "nothing was compared: the capture holds no checkpoints or expected downloads"
        failed = self.failed
        if failed:
            return f"{len(failed)} of {self.compared} compared range(s) failed; first: {failed[0].line()}"
        if not self.evidence:
            return (
                f"nothing was proven: every one of the {self.compared} compared range(s) held its expected bytes "
                "before the region ran, and no replay showed the region writing them"
            )
        return None

    def summary(self) -> str:
        counts: dict[str, int] = {}
        for r in self.ranges:
            counts[r.judgement.verdict.value] = counts.get(r.judgement.verdict.value, 0) + 1
        verdicts = ", ".join(f"{n} {v}" for v, n in counts.items())
        proven = sum(r.evidence is Evidence.PROVEN for r in self.ranges)
        typed = sum(r.piece.typed for r in self.ranges)
        return (
            f"{'verified' if self.verified else 'NOT verified'}: {self.compared} range(s) compared "
            f"({typed} typed) over "
            f"{self.replays} replay(s): {verdicts}; {self.evidence} with evidence ({proven} proven by "
            f"{self.poisoned_replays} poisoned replay(s))"
        )

    def lines(self, *, all_ranges: bool = False) -> list[str]:
        """The summary's detail: every piece that did not compare exactly or proves little (all
        pieces with ``all_ranges``), with the first differing elements of each."""
        out = []
        for r in self.ranges:
            quiet = r.judgement.verdict is ValueVerdict.EXACT and r.evidence is Evidence.COMPARED
            if all_ranges or not quiet:
                out.append(r.line())
                out += r.detail()
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            "verified": self.verified,
            "problem": self.problem(),
            "compared": self.compared,
            "evidence": self.evidence,
            "replays": self.replays,
            "poisoned_replays": self.poisoned_replays,
            "nondeterministic": self.nondeterministic,
            "reference": self.reference,
            "ranges": [r.as_dict() for r in self.ranges],
        }
