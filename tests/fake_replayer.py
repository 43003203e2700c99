"""A replayer over host memory, for testing verification on the CPU.

It plays a capture written by the real CaptureWriter and planned by the real plan: buffers are
bytearrays that keep their contents between runs (as device memory does), each region's starting
state is set from the capture's payloads before the region's first operation and the poison a
verification asks for is written over it, and at each checkpoint a *program* (a Python function
standing for the kernels: it reads and writes the buffers) runs first, then the observer sees
every entry's expected and replayed bytes, as the real Verifier shows them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from replayfmt.format import model as m
from replayfmt.replay.collectives import CollectiveRuntime
from replayfmt.replay.options import RunResult
from replayfmt.replay.plan import Plan
from replayfmt.replay.state import PoisonWrite

Program = Callable[[dict[int, bytearray], int, int], None]  # (memory, checkpoint index, run number)


class HostReplayer:
    def __init__(self, plan: Plan, program: Program) -> None:
        self.plan = plan
        self.program = program
        self.observer: Any = None
        self.memory = {b.id: bytearray(b.size) for b in plan.buffers.values()}
        self._poison: dict[int, list[PoisonWrite]] = {}
        self.only: set[tuple[int, int, int]] | None = None
        self.runs = 0
        self.poisoned_runs = 0
        self.collectives = CollectiveRuntime(None)  # alone: each collective's received bytes put in place

    def poison(self, writes: dict[int, list[PoisonWrite]] | None) -> None:
        self._poison = dict(writes or {})

    def verify_only(self, ranges: set[tuple[int, int, int]] | None) -> None:
        self.only = ranges

    def run(self, repetitions: int = 1, *, verify: bool | None = None) -> RunResult:
        result = RunResult()
        capture = self.plan.capture
        for _ in range(repetitions):
            self.runs += 1
            self.poisoned_runs += bool(self._poison)
            for op in capture.iter_operations():
                for copy in self.plan.state.get(op.index, ()):
                    data = capture.read_payload(copy.payload, 0, copy.size)
                    self.memory[copy.dst_buffer][copy.dst_offset : copy.dst_offset + copy.size] = data
                for write in self._poison.get(op.index, ()):
                    self.memory[write.buffer][write.offset : write.offset + len(write.data)] = write.data
                if isinstance(op, m.Collective) and op.recv_size:
                    received = capture.read_payload(op.received, 0, op.recv_size)
                    self.memory[op.recv_buffer][op.recv_offset : op.recv_offset + op.recv_size] = received
                if isinstance(op, m.Checkpoint):
                    self.program(self.memory, op.index, self.runs)
                    for e in op.entries:
                        if self.only is not None and (op.index, e.buffer, e.offset) not in self.only:
                            continue
                        expected = capture.read_payload(e.payload, 0, e.size)
                        actual = bytes(self.memory[e.buffer][e.offset : e.offset + e.size])
                        types = tuple(t for t in op.types if t.buffer == e.buffer)
                        if self.observer is not None:
                            self.observer.observe(
                                op.index, self.plan.buffers[e.buffer], e.offset, expected, actual, types
                            )
            result.device_ms.append(0.0)
            result.state_ms.append(0.0)
        return result
