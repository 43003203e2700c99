"""Rebuild the test suite's checked-in cubins (tests/fixtures/cubins/) and the shipped digest PTX
with nvcc, and record in tests/fixtures/cubins/MANIFEST.json what each was built from.

The CPU tests parse real cubins (the recorder's translation, verdicts, substitution, plans) but
never run them: the fixtures let them run, and never skip, on a machine without nvcc (CI). Each
entry names its source, target and the source's SHA-256, so the suite fails (never silently runs
stale binaries) when a source changes without this script being run again.

    python scripts/make_test_cubins.py            # rebuild (needs nvcc on PATH)
    python scripts/make_test_cubins.py --check    # exit 1 if an output is missing or stale
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "cubins"
MANIFEST = FIXTURES / "MANIFEST.json"
MAX_FIXTURE_BYTES = 64 << 10  # small binaries only: a larger one belongs to test-time generation

# (source, nvcc target): cubins at -O3, as tests/samples.py compiled them on the fly
CUBINS = [
    ("tests/kernels/container_kernels.cu", "sm_90"),
    ("tests/kernels/module_globals.cu", "sm_90"),
    ("examples/kernels/saxpy.cu", "sm_80"),
    ("examples/kernels/saxpy.cu", "sm_90"),
    ("tests/gpu/kernels/replay_kernels.cu", "sm_90"),
    ("tests/gpu/kernels/replay_kernels_same_abi.cu", "sm_90"),
    ("tests/gpu/kernels/replay_kernels_other_abi.cu", "sm_90"),
    ("tests/gpu/kernels/replay_kernels_wrong.cu", "sm_90"),
]
# (source, comma-separated codes): fatbins holding several cubins and PTX (which GPUs a capture can run on)
FATBINS = [("examples/kernels/saxpy.cu", "sm_80,sm_90,compute_90")]
PTX = [("replayfmt/cuda/kernels/frame_digest.cu", "compute_75", "replayfmt/cuda/kernels/frame_digest.ptx")]


def fixture_name(source: str, arch: str) -> str:
    return f"{Path(source).stem}.{arch}.cubin"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def expected_entries() -> dict[str, dict[str, str]]:
    """Output path (relative to the repository) -> what it is built from."""
    entries = {}
    for source, arch in CUBINS:
        out = (FIXTURES / fixture_name(source, arch)).relative_to(ROOT).as_posix()
        entries[out] = {"source": source, "arch": arch, "kind": "cubin", "source_sha256": sha256(ROOT / source)}
    for source, codes in FATBINS:
        out = (FIXTURES / f"{Path(source).stem}.{codes.replace(',', '.')}.fatbin").relative_to(ROOT).as_posix()
        entries[out] = {"source": source, "arch": codes, "kind": "fatbin", "source_sha256": sha256(ROOT / source)}
    for source, arch, out in PTX:
        entries[out] = {"source": source, "arch": arch, "kind": "ptx", "source_sha256": sha256(ROOT / source)}
    return entries


def nvcc_command(nvcc: str, kind: str, arch: str, source: Path, out: Path) -> list[str]:
    if kind == "ptx":
        return [nvcc, "-ptx", f"-arch={arch}", "-o", str(out), str(source)]
    if kind == "fatbin":  # sm_XY: that cubin; compute_XY: that PTX
        codes = [f"-gencode=arch=compute_{code.split('_')[1]},code={code}" for code in arch.split(",")]
        return [nvcc, "-fatbin", *codes, "-O3", "-o", str(out), str(source)]
    return [nvcc, "-cubin", f"-arch={arch}", "-O3", "-o", str(out), str(source)]


def problems() -> list[str]:
    """Why the checked-in outputs do not match their sources (empty when they do)."""
    try:
        recorded = json.loads(MANIFEST.read_text())["outputs"]
    except (OSError, ValueError, KeyError) as exc:
        return [f"{MANIFEST.relative_to(ROOT)}: unreadable ({exc})"]
    found = []
    for out, entry in expected_entries().items():
        if not (ROOT / out).is_file():
            found.append(f"{out}: missing")
        elif recorded.get(out) != entry:
            found.append(f"{out}: built from another version of {entry['source']}")
        elif entry["kind"] in ("cubin", "fatbin") and (ROOT / out).stat().st_size > MAX_FIXTURE_BYTES:
            found.append(f"{out}: over {MAX_FIXTURE_BYTES} bytes")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if an output is missing or stale")
    args = parser.parse_args()
    if args.check:
        found = problems()
        for line in found:
            print(line, file=sys.stderr)
        return 1 if found else 0
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        print("make_test_cubins: nvcc is not on PATH", file=sys.stderr)
        return 2
    version = subprocess.run([nvcc, "--version"], check=True, capture_output=True, text=True).stdout.split("\n")
    FIXTURES.mkdir(parents=True, exist_ok=True)
    entries = expected_entries()
    for out, entry in entries.items():
        command = nvcc_command(nvcc, entry["kind"], entry["arch"], ROOT / entry["source"], ROOT / out)
        subprocess.run(command, check=True)
        print(f"{out}: {(ROOT / out).stat().st_size} bytes")
    release = next((line for line in version if "release" in line), "").strip()
    MANIFEST.write_text(json.dumps({"nvcc": release, "outputs": entries}, indent=2) + "\n")
    found = problems()
    for line in found:
        print(line, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
