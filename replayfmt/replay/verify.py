"""Verification: replayed checkpoint buffers and expected downloads compared with the capture
(every repetition, since a race can show in any of them: the first's reports are kept, later
ones only when they fail), and checkpoint buffers saved with ``--save-output``."""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Protocol

import numpy as np

from replayfmt.cuda.driver import check
from replayfmt.errors import ReplayUsageError
from replayfmt.format import model as m
from replayfmt.replay.compare import NUMPY_DTYPES, BufferReport, Tolerance, compare
from replayfmt.replay.devices import Devices
from replayfmt.replay.options import RunResult
from replayfmt.replay.plan import Plan
from replayfmt.replay.stored_pointers import ReplayedAddresses

_EXPECTED_CACHE = 1 << 30  # bytes of decoded checkpoint payloads kept between runs


class RangeObserver(Protocol):
    """Something that watches every verified range (expected and actual bytes) across replays;
    ``types``: what the capture says ranges of it hold (format 1.3), empty when it does not."""

    def observe(
        self,
        operation: int,
        buffer: m.Buffer,
        offset: int,
        expected: bytes,
        actual: bytes,
        types: tuple[m.TypedTensor, ...],
        same: bool | None = None,
    ) -> None: ...


class Verifier:
    """Compares (and saves) what a run produced; its steps call :meth:`checkpoint` and
    :meth:`check_download`, for the run that :meth:`begin` announced."""

    def __init__(
        self,
        devices: Devices,
        plan: Plan,
        addresses: dict[int, int],
        tolerance: Tolerance,
        save_output: Path | None,
    ) -> None:
        self.devices = devices
        self.plan = plan
        self.addresses = addresses
        self.tolerance = tolerance
        self.save_output = save_output
        self._expected: dict[tuple[int, int], bytes] = {}  # (payload, size) -> decoded expected bytes
        self._expected_total = 0  # bytes held in _expected (summed once per entry, not per lookup)
        self._result = RunResult()
        self._saved: set[Path] = set()
        self._repetition = 0
        self._verify = False
        self._pointers = ReplayedAddresses(plan.buffers, addresses)  # stored pointers compare as relocated
        # sees every verified range's bytes (a replay.verification.Verification's collector), or None
        self.observer: RangeObserver | None = None
        # (operation, buffer, offset) of the ranges to compare (None: all): later replays of a verification
        self.only: set[tuple[int, int, int]] | None = None

    def begin(self, result: RunResult, repetition: int, *, verify: bool) -> None:
        """The next steps belong to repetition ``repetition`` of a run reporting into ``result``."""
        self._result = result
        self._repetition = repetition
        self._verify = verify

    def read_back(self, buffer: int, offset: int, size: int, *, synchronized: bool = False) -> bytes:
        """The replayed bytes of a buffer range (after every device has finished its work;
        ``synchronized``: the caller has just waited for them)."""
        out = bytearray(size)
        if not synchronized:
            check(self.devices.synchronize_all(), "cuCtxSynchronize before reading a checkpoint")
        if size:
            host = (ctypes.c_char * size).from_buffer(out)
            check(
                self.devices.cu.cuMemcpyDtoH(ctypes.addressof(host), self.addresses[buffer] + offset, size),
                f"reading buffer {buffer}",
            )
        return bytes(out)

    def checkpoint(self, op: m.Checkpoint) -> None:
        """Compare (and save) the checkpoint's buffers."""
        saving = self.save_output is not None and self._repetition == 0
        if not (self._verify or saving):
            return  # nothing to compare or save: no read-back, no synchronisation
        entries = [e for e in op.entries if self.only is None or (op.index, e.buffer, e.offset) in self.only]
        if entries:  # one wait for the devices per checkpoint, not per entry: nothing is issued between its reads
            check(self.devices.synchronize_all(), "cuCtxSynchronize before reading a checkpoint")
        for entry in entries:
            actual = self.read_back(entry.buffer, entry.offset, entry.size, synchronized=True)
            buffer = self.plan.buffers[entry.buffer]
            if self._verify:
                expected = self._pointers.align(self._expected_bytes(entry.payload, entry.size), actual, entry.offset)
                tolerance, offset = self.tolerance, entry.offset
                report = compare(
                    expected, actual, buffer=buffer, operation=op.index, tolerance=tolerance, offset=offset
                )
                self._report(report)
                if self.observer is not None:
                    end = entry.offset + entry.size
                    types = tuple(t for t in op.types if t.buffer == entry.buffer and entry.offset <= t.offset < end)
                    same = report.passed if report.mode == "exact" else None  # known: no second comparison
                    self.observer.observe(op.index, buffer, entry.offset, expected, actual, types, same)
            if saving:
                self._save(op, buffer, entry.offset, actual)

    def check_download(self, op: m.Copy, host: int) -> None:
        """Compare a download that the capture recorded the bytes of with what the replay read."""
        if not self._verify or (self.only is not None and (op.index, op.src_buffer, op.src_offset) not in self.only):
            return
        check(self.devices.synchronize_all(), "cuCtxSynchronize before checking a download")
        actual = ctypes.string_at(host, op.size)
        expected = self._pointers.align(self._expected_bytes(op.payload, op.size), actual, op.src_offset)
        buffer = self.plan.buffers[op.src_buffer]
        self._report(
            compare(expected, actual, buffer=buffer, operation=op.index, tolerance=self.tolerance, offset=op.src_offset)
        )
        if self.observer is not None:
            self.observer.observe(op.index, buffer, op.src_offset, expected, actual, ())

    def _expected_bytes(self, payload: int, size: int) -> bytes:
        """Expected bytes, decoded once: repetitions and tuning candidates compare against them."""
        key = (payload, size)
        data = self._expected.get(key)
        if data is None:
            data = self.plan.capture.read_payload(payload, 0, size)
            if self._expected_total + size <= _EXPECTED_CACHE:
                self._expected[key] = data
                self._expected_total += size
        return data

    def _report(self, report: BufferReport) -> None:
        if self._repetition == 0 or not report.passed:
            self._result.reports.append(report)

    def _save(self, op: m.Checkpoint, buffer: m.Buffer, offset: int, data: bytes) -> None:
        directory = self.save_output
        assert directory is not None
        directory.mkdir(parents=True, exist_ok=True)
        code = NUMPY_DTYPES.get(buffer.dtype)
        stem = f"op{op.index}_buffer{buffer.id}" + (f"_at{offset}" if offset else "")
        path = directory / (stem + (".npy" if code else ".bin"))
        if path in self._saved:
            return  # saved by this replayer's first run (verification replays again)
        self._saved.add(path)
        if path.exists():
            raise ReplayUsageError(f"--save-output: {path} already exists; choose an empty directory")
        if code:
            itemsize = np.dtype(code).itemsize
            array = np.frombuffer(data[: len(data) // itemsize * itemsize], code)
            if buffer.shape and int(np.prod(buffer.shape)) == array.size and not offset:
                array = array.reshape(buffer.shape)
            np.save(path, array)
        else:
            path.write_bytes(data)
