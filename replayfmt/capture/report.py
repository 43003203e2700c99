"""The end-of-recording report, as LLVM's recorder prints one: what was seen and kept."""

from __future__ import annotations

from dataclasses import dataclass, field

from replayfmt.capture.verdict import CaptureVerdict
from replayfmt.format.host_waits import released_counts
from replayfmt.format.names import demangle


@dataclass
class KernelStats:
    occurrences: int = 0  # launches the program made while the recorder listened
    captured: int = 0  # launches written to the capture
    bytes_stored: int = 0  # snapshot bytes taken for this kernel's launches


@dataclass
class Report:
    path: str = ""
    kernels: dict[str, KernelStats] = field(default_factory=dict)
    operations: int = 0
    snapshot_bytes: int = 0
    snapshot_seconds: float = 0.0
    checkpoint_bytes: int = 0  # bytes checkpointed
    typed_bytes: int = 0  # of them, typed by a framework's arrays (format 1.3)
    typing_seconds: float = 0.0  # spent asking the frameworks what their arrays are
    skipped_bytes: int = 0  # bytes of allocations left out of snapshots: outside every live framework buffer
    live_sources: set[str] = field(default_factory=set)  # frameworks whose live buffers bounded snapshots
    unsupported: dict[str, int] = field(default_factory=dict)  # call -> count
    graph_launches: int = 0  # cuGraphLaunch calls written as GraphLaunch operations
    graphs: int = 0  # Graph objects written (a graph changed between launches is written again)
    collectives: int = 0  # NCCL calls recorded as collective operations
    errors: list[str] = field(default_factory=list)  # problems met inside callbacks
    stored_pointers: int = 0  # pointers found in state and uploads, relocated on replay (data relocations)
    # buffer id -> what it holds that may be pointers or data: left as captured (--fixed-addresses replays it)
    ambiguous_pointers: dict[int, str] = field(default_factory=dict)
    partial: str = ""  # why the capture stopped before the program did ("" complete): written in the file
    verdict: CaptureVerdict | None = None  # run-replay's plan on the closed file (None: not checked)
    # checkpoints taken before what a region wrote was freed, remapped or reused (its scope's end would miss it)
    released_checkpoints: int = 0
    released_bytes: int = 0  # of them
    released_dropped: int = 0  # frees past MAX_RELEASED_CHECKPOINTS or _BYTES: what they held goes unchecked
    # what named regions wrote into memory their framework calls free (free_writes): ranges, bytes
    free_writes: int = 0
    free_write_bytes: int = 0
    free_writes_dropped: int = 0  # ranges past MAX_FREE_WRITE_BYTES: not compared
    host_waits: list[str] = field(default_factory=list)  # launches marked LAUNCH_FLAG_HOST_RELEASED: what each is
    timing: str = ""  # whether the original program's device times were recorded (CUPTI)
    notes: list[str] = field(
        default_factory=list
    )  # what the recorder changed in the program (its profilers turned off)
    children: list[str] = field(default_factory=list)  # "pid program" of child processes that used CUDA, unrecorded

    def kernel(self, name: str) -> KernelStats:
        stats = self.kernels.get(name)
        if stats is None:
            stats = self.kernels[name] = KernelStats()
        return stats

    def lines(self, limit: int = 20) -> list[str]:
        out = [f"replayfmt capture: {self.path}: {self.operations} operations"]
        if self.kernels:
            width = min(60, max(len(demangle(n)) for n in self.kernels))
            out.append(f"  {'kernel':<{width}}  {'seen':>7}  {'captured':>8}  {'bytes stored':>12}")
            ranked = sorted(self.kernels.items(), key=lambda kv: (-kv[1].captured, -kv[1].occurrences, kv[0]))
            for symbol, s in ranked[:limit]:
                name = demangle(symbol)  # mangled symbols are keys (what --kernels matches), not for reading
                short = name if len(name) <= width else name[: width - 3] + "..."
                out.append(f"  {short:<{width}}  {s.occurrences:>7}  {s.captured:>8}  {s.bytes_stored:>12}")
            if len(ranked) > limit:
                out.append(f"  ... and {len(ranked) - limit} more kernels")
        if self.snapshot_bytes:
            rate = self.snapshot_bytes / self.snapshot_seconds / 1e9 if self.snapshot_seconds else 0.0
            out.append(f"  snapshots: {self.snapshot_bytes} bytes read from the device at {rate:.1f} GB/s")
        if self.checkpoint_bytes:
            out.append(
                f"  checkpoints: {self.typed_bytes} of {self.checkpoint_bytes} bytes typed by the program's arrays "
                f"({self.typing_seconds:.3f} s asking); the rest is compared as bytes"
            )
        if self.released_checkpoints:
            out.append(
                f"  checkpoints before frees: {self.released_checkpoints} (what a scope wrote into memory freed "
                "before it ended)"
                + (
                    f"; {self.released_dropped} more frees past the limit went unchecked"
                    if self.released_dropped
                    else ""
                )
            )
        if self.free_writes or self.free_writes_dropped:
            out.append(
                f"  written into free memory: {self.free_writes} ranges, {self.free_write_bytes} bytes compared (what "
                "a step's launches wrote outside the buffers live at its start and end: a dropped result, "
                "temporaries; proven by poisoned replays)"
                + (
                    f"; {self.free_writes_dropped} more past the limit went unchecked"
                    if self.free_writes_dropped
                    else ""
                )
            )
        if self.graph_launches:
            graphs = f"{self.graph_launches} launches recorded as graph launches of {self.graphs} graph objects"
            out.append(f"  CUDA graphs: {graphs}")
        if self.collectives:
            out.append(
                f"  collectives: {self.collectives} NCCL calls recorded (the ranks replay together, issuing them "
                "among each other, in one process for the ranks one capture holds; a rank alone puts what each "
                "received in place)"
            )
        if self.skipped_bytes:
            sources = ", ".join(sorted(self.live_sources))
            # (a step's dropped result lies there: compared, with the bytes it left as its start)
            written = self.free_writes or self.released_checkpoints
            compared = "compared only where a step wrote them (its dropped results)" if written else "never compared"
            out.append(
                f"  snapshots skipped {self.skipped_bytes} bytes outside live buffers ({sources}): "
                f"undefined at replay's start, {compared}"
            )
        for call, count in sorted(self.unsupported.items()):
            out.append(f"  unsupported: {call} x{count} (recorded; replay will refuse the capture)")
        if self.stored_pointers:
            out.append(f"  stored pointers: {self.stored_pointers} in state and uploads, relocated on replay")
        for why in list(self.ambiguous_pointers.values())[:5]:
            out.append(
                f"  may hold pointers: {why}; left as captured (if replay fails, capture with --fixed-addresses)"
            )
        if len(self.ambiguous_pointers) > 5:
            out.append(f"  ... and {len(self.ambiguous_pointers) - 5} more buffers that may hold pointers")
        if self.host_waits:
            out.append(
                f"  host waits: {released_counts(self.host_waits)} at replay (each spins until the "
                "program writes a release into pinned memory; a replay runs no such host code)"
            )
        if self.timing:
            out.append(f"  {self.timing}")
        out.extend(f"  note: {note}" for note in self.notes)
        for child in self.children[:limit]:
            out.append(f"  not recorded: process {child} used CUDA (record each process: docs/RECORDER.md)")
        if self.partial:
            out.append(f"  partial: {self.partial}")
        if self.verdict is not None:
            out.append(f"  {self.verdict.host_line()}")
            out.append(f"  {self.verdict.line()}")
        for error in self.errors[:limit]:
            out.append(f"  error: {error}")
        if len(self.errors) > limit:
            out.append(f"  ... and {len(self.errors) - limit} more errors")
        return out
