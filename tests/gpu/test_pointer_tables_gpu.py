"""Issue 23 on a GPU: kernels that read pointers from device memory (a CUDA kernel following a
table of pointers; Triton's grouped GEMM with its pointer tables and, on sm_90, TMA descriptors
built on the device in scratch memory) captured, replayed and verified, the pointers relocated
(format 1.3 data relocations); and the recorder's self-check catching a capture that does not
replay (the same table recorded with the search for stored pointers off)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from test_capture_gpu import EXAMPLES, SCRIPTS, capture, capture_ready, dump, needs, run, verified  # noqa: F401 - a fixture

sys.path.insert(0, str(SCRIPTS))  # the capture scripts' own module
from address_search import CANNOT

pytestmark = pytest.mark.usefixtures("capture_ready")


def self_checked(out: Path, script: Path, *flags: str) -> str:
    """Capture ``script``; the recorder's self-check must have replayed and verified it. Skips when
    the script says it cannot be set up here (address_search.CANNOT: the memory it needs is taken)."""
    result = run([sys.executable, "-m", "replayfmt.capture", "-o", str(out), *flags, str(script)])
    cannot = [line for line in result.stdout.splitlines() if line.startswith(CANNOT)]
    if cannot:
        pytest.skip(cannot[0])
    found = re.search(r"replayable: yes \(replayed and verified: (\d+) ranges\)", result.stderr)
    assert result.returncode == 0 and out.exists(), result.stderr[-3000:]
    assert found and int(found.group(1)) > 0, (result.stdout + result.stderr)[-3000:]
    return result.stderr


@pytest.mark.parametrize("flags", [(), ("--scope", "sum")], ids=["upload", "starting-state"])
def test_a_cuda_kernel_following_a_device_pointer_table(tmp_path, flags):
    needs("cupy")
    out = tmp_path / "table.kreplay"
    report = self_checked(out, SCRIPTS / "pointer_table_shifted.py", *flags)
    stored = re.search(r"stored pointers: (\d+) in state and uploads", report)
    assert stored and int(stored.group(1)) >= 6, report[-3000:]
    text = dump(out)
    assert "pointers=6 (@" in text, text[-3000:]
    assert ("(starting state) pointers=6" in text) == bool(flags)
    verified(out)  # and by hand, as a user would


def test_the_self_check_catches_a_capture_that_does_not_replay(tmp_path):
    needs("cupy")
    out = tmp_path / "unrelocated.kreplay"
    result = run([sys.executable, str(SCRIPTS / "pointer_table_unrelocated.py"), str(out)])
    assert result.returncode == 0, result.stderr[-3000:]
    line = result.stdout.strip().splitlines()[-1]
    caught = line.startswith("replayable: no: the replay failed: ") or "verification failed" in line
    assert caught, (result.stdout + result.stderr)[-3000:]


@pytest.mark.parametrize("flags", [(), ("--scope", "grouped")], ids=["whole-program", "scope"])
def test_triton_grouped_gemm_with_pointer_tables_and_device_descriptors(tmp_path, flags):
    needs("torch")
    needs("triton")
    out = tmp_path / "grouped.kreplay"
    result = capture(out, EXAMPLES / "triton_grouped_gemm.py", *flags)
    found = re.search(r"replayable: yes \(replayed and verified: (\d+) ranges\)", result.stderr)
    assert found and int(found.group(1)) > 0, result.stderr[-3000:]
    tma = "TMA on the device: yes" in result.stdout
    print(f"TMA descriptors built on the device: {tma}")
    text = dump(out)
    tables = [int(n) for n in re.findall(r"pointers=(\d+) \(@", text)]  # one table per upload, or joined in state
    assert "grouped_gemm" in text and tables and sum(tables) >= 9, text[-3000:]
    if tma:
        assert "grouped_gemm_tma" in text
    verified(out)


@pytest.mark.parametrize("flags", [(), ("--scope", "step")], ids=["whole-program", "scope"])
def test_module_globals_the_host_wrote_are_restored_with_their_pointers(tmp_path, flags):
    """cuFFT's case (format 1.4): a __device__ pointer and a __constant__ table written by the
    host before the region, read by a kernel that names neither; a fresh module load leaves the
    pointer zero, so the replay must restore the globals and relocate the pointer."""
    needs("cupy")
    out = tmp_path / "globals.kreplay"
    self_checked(out, SCRIPTS / "module_global_pointer.py", *flags)
    text = dump(out)
    globals_ = set(re.findall(r"^obj\s+\d+\s+global\s+(\S+) exe=", text, re.M))
    # the whole program starts before the warm-up launch, when the kernel's counter holds what a
    # fresh load gives it: it is recorded because the program's kernels change it (state: its
    # load-time zero, in the file's region where it was found); a scope starts after one call
    assert globals_ == {"base", "scale", "calls"}, text[-3000:]
    assert re.search(r"'module global base' size=8 device=\d+ address=0x[0-9a-f]+ global=\d+", text), text[-3000:]
    assert "pointers=1" in text, text[-3000:]  # the base pointer, relocated (starting state, or the upload)
    verified(out)


def test_struct_pointers_next_to_a_4gib_boundary_are_relocated(tmp_path):
    """A foreach kernel's tensor addresses just below and past a 4 GiB boundary at 0x7fxx (where
    PyTorch's allocator put them by chance in BERT and MobileNet steps): the recorder relocates
    both, and the self-check's replay in another process verifies."""
    needs("torch")
    out = tmp_path / "boundary.kreplay"
    self_checked(out, SCRIPTS / "struct_pointer_near_boundary.py", "--scope", "step")
    verified(out)


def test_a_float_field_beside_a_stale_half_stays_as_captured(tmp_path):
    """A struct word made of a float (a scale) and the stale high half of an old pointer that lands
    inside an allocation no kernel uses (dropout backward's functor in a BERT step): the recorder
    leaves it as captured, and the self-check's replay in another process verifies."""
    needs("cupy")
    out = tmp_path / "stale.kreplay"
    self_checked(out, SCRIPTS / "struct_field_beside_stale_half.py", "--scope", "step")
    verified(out)
