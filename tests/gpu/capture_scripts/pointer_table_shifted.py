"""The pointer-table example after a 512 MiB allocation that no kernel touches: the capture's
arrays lie past it, and a replay (which allocates only what the capture holds) puts them
elsewhere, so pointers left as captured point at nothing there."""

import runpy
import sys
from pathlib import Path

import cupy as cp

hole = cp.empty(512 << 20, dtype=cp.uint8)
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "capture" / "cupy_pointer_table.py"
sys.argv = [str(EXAMPLE)]
runpy.run_path(str(EXAMPLE), run_name="__main__")
