"""A capture that does not replay, planted for the recorder's self-check: the pointer table is
recorded with the search for stored pointers turned off (RecordOptions(detect_pointers=False)),
so replay uploads the capture's addresses and the kernel follows them into nothing. Prints the
verdict line the self-check earned.

    python tests/gpu/capture_scripts/pointer_table_unrelocated.py OUT.kreplay
"""

import runpy
import sys
from pathlib import Path

import cupy as cp

from replayfmt.capture import Recorder, RecordOptions, SelfCheck

out = sys.argv[1]
recorder = Recorder(out, RecordOptions(detect_pointers=False), overwrite=True)
hole = cp.empty(512 << 20, dtype=cp.uint8)  # the replay's buffers land elsewhere (see pointer_table_shifted.py)
recorder.start()
runpy.run_path(str(Path(__file__).resolve().parents[3] / "examples" / "capture" / "cupy_pointer_table.py"))
report = recorder.close()
recorder.self_check(SelfCheck(timeout_s=120))
print(report.verdict.line())
