"""Diagnosis of a JAX capture on a GPU: records examples/capture/jax_jit.py in this process with
the recorder's allocation events, snapshot calls and errors logged (to $OUT/trace-events.log),
and JAX's live arrays and memory statistics after the program ran.

python3 scripts/jax_capture_trace.py out.kreplay
"""

from __future__ import annotations

import faulthandler
import os
import runpy
import sys
import time
import traceback
from typing import Any

from replayfmt.capture import events as ev
from replayfmt.capture.device_memory import DriverMemory
from replayfmt.capture.live_buffers import JaxLiveArrays
from replayfmt.capture.options import RecordOptions
from replayfmt.capture.recorder import Recorder
from replayfmt.capture.translate import Translator

LOGGED = (ev.Allocation, ev.Free, ev.AddressReserved, ev.AddressFreed, ev.Mapped, ev.Unmapped)
LOGGED += (ev.HostDevicePointer, ev.NotReproducible, ev.GraphLaunchBegin)
log = open(os.path.join(os.environ.get("OUT", "."), "trace-events.log"), "w")  # noqa: SIM115 - open for the run
faulthandler.dump_traceback_later(90, exit=True, file=log)  # a hang shows where every thread waits
began = time.perf_counter()
counts: dict[str, int] = {}


def say(*parts: object) -> None:
    print(f"{time.perf_counter() - began:8.3f}", *parts, file=log, flush=True)


def traced_handle(original: Any) -> Any:
    def handle(self: Translator, event: ev.Event) -> None:
        name = type(event).__name__
        counts[name] = counts.get(name, 0) + 1
        if isinstance(event, LOGGED) or (isinstance(event, (ev.Memset, ev.Copy)) and counts[name] < 30):
            say("EVENT", event)
        elif isinstance(event, ev.LaunchBegin) and counts[name] < 5:
            say("EVENT launch", event.kernel.name[:80], "stream", event.stream)
        errors = len(self.report.errors)
        original(self, event)
        for error in self.report.errors[errors:]:
            say("ERROR", error)

    return handle


def traced_copy(name: str, original: Any) -> Any:
    def copy(self: DriverMemory, address: int, size: int, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            result = original(self, address, size, *args, **kwargs)
        except Exception as exc:
            say(f"{name} FAILED {address:#x} {size} {exc!r}")
            raise
        say(f"{name} {address:#x} {size} ({size / 2**20:.1f} MiB) {time.perf_counter() - start:.3f}s")
        return result

    return copy


Translator.handle = traced_handle(Translator.handle)  # type: ignore[method-assign]
DriverMemory.snapshot = traced_copy("SNAPSHOT", DriverMemory.snapshot)  # type: ignore[method-assign]
DriverMemory.read = traced_copy("READ", DriverMemory.read)  # type: ignore[method-assign]

recorder = Recorder(sys.argv[1], RecordOptions(), overwrite=True)
recorder.start()
sys.argv = ["jax_jit.py"]
started = time.perf_counter()
namespace = runpy.run_path("examples/capture/jax_jit.py", run_name="__main__")
say("program ran", time.perf_counter() - started)
try:
    import jax

    view = JaxLiveArrays().view()
    say("live", [(hex(r.start), r.size) for r in view.live] if view else None)
    say("memory_stats", jax.devices()[0].memory_stats())
except Exception:
    say("live arrays failed", traceback.format_exc())
report = recorder.close()
say("counts", counts)
for line in report.lines():
    say("REPORT", line)
print("\n".join(report.lines()))
