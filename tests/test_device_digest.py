"""The frame-digest kernel without a GPU: the shipped PTX is the one its source compiles to, and
a model of the kernel's arithmetic (eight lanes, pairs swapping words), with the constants read
from the .cu file itself, gives xxhash's XXH3-128 for every long-input length class."""

import hashlib
import json
import re
import shutil
import struct
import subprocess
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
import xxhash

from replayfmt.cuda.digest import SHORTEST
from replayfmt.format.payloads import frame_hash

ROOT = Path(__file__).resolve().parent.parent
KERNELS = Path(resources.files("replayfmt.cuda").joinpath("kernels"))  # type: ignore[arg-type]
SOURCE = (KERNELS / "frame_digest.cu").read_text()
MASK = (1 << 64) - 1


def constant(name: str) -> int:
    return int(re.search(rf"#define {name} (0x[0-9A-F]+)ULL", SOURCE).group(1), 16)


SECRET_TEXT = SOURCE[SOURCE.index("kSecret[192]") :].split("};")[0]
SECRET = bytes(int(b, 16) for b in re.findall(r"0x([0-9a-f]{2})", SECRET_TEXT))
INITIAL = [
    constant(n)
    for n in ("PRIME32_3", "PRIME64_1", "PRIME64_2", "PRIME64_3", "PRIME64_4", "PRIME32_2", "PRIME64_5", "PRIME32_1")
]


def word(data: bytes, offset: int) -> int:
    return struct.unpack_from("<Q", data, offset)[0]


def kernel_model(data: bytes) -> bytes:
    """What one group of eight threads computes, lane by lane, as the kernel is written."""
    n = len(data)
    acc = list(INITIAL)

    def accumulate(stripe: int, key_offset: int) -> None:
        values = [word(data, stripe + 8 * lane) for lane in range(8)]  # each lane's load
        for lane in range(8):
            mixed = values[lane] ^ word(SECRET, key_offset + 8 * lane)
            partner = values[lane ^ 1]  # the shuffle
            acc[lane] = (acc[lane] + (mixed & 0xFFFFFFFF) * (mixed >> 32) + partner) & MASK

    blocks = (n - 1) // 1024
    for b in range(blocks):
        for s in range(16):
            accumulate(b * 1024 + 64 * s, 8 * s)
        for lane in range(8):
            a = acc[lane] ^ (acc[lane] >> 47) ^ word(SECRET, 128 + 8 * lane)
            acc[lane] = (a * constant("PRIME32_1")) & MASK
    for s in range(((n - 1) - 1024 * blocks) // 64):
        accumulate(blocks * 1024 + 64 * s, 8 * s)
    accumulate(n - 64, 192 - 64 - 7)

    def merge(offset: int, start: int) -> int:
        result = start
        for i in range(4):
            left, right = word(SECRET, offset + 16 * i), word(SECRET, offset + 16 * i + 8)
            product = (acc[2 * i] ^ left) * (acc[2 * i + 1] ^ right)
            result = (result + ((product & MASK) ^ (product >> 64))) & MASK
        result ^= result >> 37
        result = (result * constant("PRIME_MX1")) & MASK
        return result ^ (result >> 32)

    low = merge(11, (n * constant("PRIME64_1")) & MASK)
    high = merge(192 - 64 - 11, ~(n * constant("PRIME64_2")) & MASK)
    return low.to_bytes(8, "little") + high.to_bytes(8, "little")


@pytest.mark.parametrize(
    "length", [SHORTEST, 242, 255, 256, 1023, 1024, 1025, 1087, 1088, 1089, 2048, 2049, 5003, 65536]
)
def test_kernel_model_is_xxh3_128(length):
    data = np.random.default_rng(length).integers(0, 256, length, dtype=np.uint8).tobytes()
    assert len(SECRET) == 192
    assert kernel_model(data) == frame_hash(data) == xxhash.xxh3_128_intdigest(data).to_bytes(16, "little")


def test_shipped_ptx_is_what_its_source_compiles_to(tmp_path):
    """The PTX replayfmt loads was built from today's frame_digest.cu: without nvcc, by the source
    hash scripts/make_test_cubins.py recorded when it built the PTX; with nvcc, by compiling."""
    manifest = json.loads((ROOT / "tests" / "fixtures" / "cubins" / "MANIFEST.json").read_text())["outputs"]
    entry = manifest["replayfmt/cuda/kernels/frame_digest.ptx"]
    source_hash = hashlib.sha256((KERNELS / "frame_digest.cu").read_bytes()).hexdigest()
    assert entry["source_sha256"] == source_hash, (
        "frame_digest.cu changed since its PTX was built: run python scripts/make_test_cubins.py"
    )
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return  # the hash above is the whole check here; CI machines have no nvcc
    out = tmp_path / "frame_digest.ptx"
    subprocess.run([nvcc, "-ptx", "-arch=compute_75", "-o", str(out), str(KERNELS / "frame_digest.cu")], check=True)

    def code(text: str) -> list[str]:
        return [line for line in text.splitlines() if not line.startswith("//")]

    assert code(out.read_text()) == code((KERNELS / "frame_digest.ptx").read_text()), (
        "replayfmt/cuda/kernels/frame_digest.ptx is stale: regenerate it as frame_digest.cu says"
    )
