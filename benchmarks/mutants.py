"""Issue 46's 50,000 mutants: tests/test_mutants.py's mutants of the example captures (a record
batch changed behind valid checksums) through everything a GPU-less tool does (the verdict,
dump's summary, text and JSONL views, diff and extract), on every core.

    python benchmarks/mutants.py [--per-example 25000] [--workers N]

Mutant ``k`` of an example is the test's mutant ``k`` (seeded by the example's name and ``k``),
so a mutant named here is rebuilt by ``tests/test_mutants.build_mutant``. Prints how the mutants
ended (read through cleanly, or refused by which ReplayError) and every one that raised anything
else; exits 1 when any did.
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))

import test_mutants as tm  # the tests' own mutants


def _run(job: tuple[Path, range]) -> tuple[collections.Counter[str], list[str]]:
    example, ks = job
    p = tm.parts(example)
    ended: collections.Counter[str] = collections.Counter()
    escaped = []
    with tempfile.TemporaryDirectory() as scratch:
        for k in ks:
            path = tm.build_mutant(p, example, k, Path(scratch) / "mutant.kreplay")
            try:
                ended[tm.through_the_library(path, example, Path(scratch) / "extracted.kreplay") or "clean"] += 1
            except Exception as exc:  # what this counts: anything but ReplayError
                ended["escaped"] += 1
                escaped.append(f"mutant {k} of {example.name}: {type(exc).__name__}: {str(exc)[:300]}")
    return ended, escaped


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-example", type=int, default=25_000, help="mutants of each example capture")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--chunk", type=int, default=500, help="mutants per task")
    args = parser.parse_args()
    jobs = [
        (example, range(start, min(start + args.chunk, args.per_example)))
        for example in tm.EXAMPLES
        for start in range(0, args.per_example, args.chunk)
    ]
    began = time.perf_counter()
    total: collections.Counter[str] = collections.Counter()
    escaped: list[str] = []
    with multiprocessing.Pool(args.workers) as pool:
        for ended, bad in pool.imap_unordered(_run, jobs):
            total += ended
            escaped += bad
    seconds = time.perf_counter() - began
    count = sum(total.values())
    print(f"{count} mutants of {len(tm.EXAMPLES)} examples in {seconds:.0f} s on {args.workers} workers")
    for how, n in total.most_common():
        print(f"  {n:>7}  {how}")
    for line in escaped:
        print(f"ESCAPED {line}")
    return 1 if escaped else 0


if __name__ == "__main__":
    sys.exit(main())
