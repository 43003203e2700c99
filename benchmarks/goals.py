"""What every benchmark does with its goals: each figure is judged against its goal where it is
printed (``ok`` or ``MISSED``), the misses are listed at the end, and ``--check`` turns any miss
into exit status 1 (scripts/run_gpu_suite.sh runs every benchmark so)."""

from __future__ import annotations

import argparse
import sys


def add_check(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--check", action="store_true", help="exit 1 when a goal is missed")


class Goals:
    """The goals one benchmark run judged."""

    def __init__(self) -> None:
        self.judged = 0
        self.missed: list[str] = []

    def judge(self, name: str, ok: bool) -> str:
        """Record one goal's verdict; returns the word to print beside its figure."""
        self.judged += 1
        if not ok:
            self.missed.append(name)
        return "ok" if ok else "MISSED"

    def exit_status(self, check: bool) -> int:
        """Print the misses; 1 when ``check`` and a goal was missed (or none was judged: a run that
        measured nothing proves nothing), else 0."""
        if self.missed:
            print(f"missed: {', '.join(self.missed)}", file=sys.stderr)
        elif not self.judged:
            print("no goal was judged", file=sys.stderr)
        return 1 if check and (self.missed or not self.judged) else 0
