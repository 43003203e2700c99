"""Capture the GPU work of a Python process into a .kreplay file (CUPTI driver callbacks).

::

    import replayfmt.capture
    with replayfmt.capture.record("step.kreplay") as rec:       # region mode: all work inside
        with rec.scope("execute"):
            model(x)

    rec = replayfmt.capture.record("k.kreplay", mode="kernel", kernels="softmax", max_per_kernel=2)
    ...; rec.close()                                            # kernel mode: selected launches

    python -m replayfmt.capture -o out.kreplay [OPTIONS] script.py ARGS...

Needs cupti-python matching the driver's CUPTI: ``pip install 'replayfmt[capture]'``.
"""

from __future__ import annotations

from replayfmt.capture.allocations import TensorLabel
from replayfmt.capture.labels import KernelAnnotation
from replayfmt.capture.options import CaptureMode, RecordOptions
from replayfmt.capture.recorder import Recorder, SelfCheck, active, record, scope
from replayfmt.capture.report import KernelStats, Report
from replayfmt.capture.translate import Translator

__all__ = [
    "CaptureMode",
    "KernelAnnotation",
    "KernelStats",
    "RecordOptions",
    "Recorder",
    "Report",
    "SelfCheck",
    "TensorLabel",
    "Translator",
    "active",
    "record",
    "scope",
]
