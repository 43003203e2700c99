"""run-replay speed, on a GPU (issue: run-replay), measured side by side in one run.

    python benchmarks/replay_bench.py [--launches 20000] [--upload-mib 1024] [--upload-dir DIR ...]
        [--sections launches,uploads,bert] [--bert-capture FILE] [--check]

1. Host overhead per launch: a 20,000-launch capture of an empty kernel replayed by the Replayer,
   against raw cuda-python cuLaunchKernel with pre-packed parameters over the same launches
   (goal: <= 1.25x). Both are timed from the first launch to the end of a final synchronisation.
2. Upload bandwidth: a 1 GiB payload taken from the capture file (in the page cache) to the
   device: upload lanes (a thread, a stream, two pinned slots each) read runs of frames and
   copy each up as it arrives, against a bare pinned cuMemcpyHtoD of the same bytes (goal for
   payloads stored raw: >= 50%). Frames are checked against their hashes on the device (or not
   at all: --no-payload-checks). Printed: the staging rate, the same including setup (the pool,
   pinning the lanes) and the first run, and the rate of later runs;
   next to them this host's own ceiling, the same move done by bare threads without replayfmt,
   since host memory bandwidth varies widely between machines (and between minutes on a shared
   one). Medians of 3 rounds, interleaved. Measured once per --upload-dir (default: the
   temporary directory, a disk file system, and /dev/shm, tmpfs): the kernel copies out of
   their page caches at different rates.
3. Host gaps on a BERT-like training step (issue 29; --sections ...,bert: needs torch,
   transformers and CUPTI): examples/capture/bert_train_step.py recorded with the recorder (or
   --bert-capture), its "step" scope timed by benchmark-replay's machinery. The region's GPU busy
   time (CUPTI: the union of its kernels and copies) against the elapsed time between events:
   idle = elapsed - busy is the device waiting (for the host, or between dependent kernels).
   Printed side by side: raw cuda-python (the region's prepared calls issued by a bare Python
   loop, no checks), eager replay (goal: its host cost, the time its checked runner takes to
   issue the region, <= 1.5 us a launch; its idle beside raw cuda-python's) and graph mode,
   which launches the region as one native CUDA graph built by stream capture (goal: idle < 2%
   of busy), beside the program's own torch.cuda graph of the step. Beside the eager host cost,
   the driver's floor: the same calls packed once and issued by the bare C loop, nothing else
   (what the driver itself costs the host for them; no replay making these calls costs less).
--check exits 1 when a goal printed is missed.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from itertools import repeat
from pathlib import Path
from typing import NamedTuple

import numpy as np
from goals import Goals, add_check

import replayfmt
from replayfmt.cuda.driver import check, compute_capability, driver
from replayfmt.execute import open_replay
from replayfmt.format import model as m
from replayfmt.measure.benchmark import Benchmark, BenchmarkOptions, BenchmarkResult, find_region
from replayfmt.replay import Replayer, ReplayOptions
from replayfmt.replay.issue import IssueLibrary, IssuePlanner
from replayfmt.replay.plan import build_plan

HERE = Path(__file__).resolve().parent
EMPTY = m.Function(
    name="empty",
    parameters=(
        m.Parameter(offset=0, size=8, kind=m.ParameterKind.POINTER),
        m.Parameter(offset=8, size=4, kind=m.ParameterKind.VALUE, dtype=m.DType.INT32),
    ),
    parameters_known=True,
)


def compile_empty(arch: str) -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "empty.cubin"
        nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
        subprocess.run(
            [nvcc, "-cubin", f"-arch={arch}", "-o", str(out), str(HERE / "kernels" / "empty.cu")], check=True
        )
        return out.read_bytes()


def device_arch() -> str:
    major, minor = compute_capability(check(driver().cuDeviceGet(0), "cuDeviceGet"))
    return f"sm_{major}{minor}"


def bench_launches(directory: Path, cubin: bytes, count: int) -> dict[str, float]:
    path = directory / "launches.kreplay"
    with replayfmt.CaptureWriter(path) as w:
        dev = w.add_object(m.Device(name="bench"))
        stream = w.add_object(m.Stream(device=dev, flags=1))
        buf = w.add_object(m.Buffer(size=256, device=dev))
        exe = w.add_object(
            m.Executable(format=m.ExecutableFormat.CUBIN, payload=w.add_payload(cubin), functions=(EMPTY,))
        )
        for i in range(count):
            w.launch(
                executable=exe,
                function=0,
                grid=(1, 1, 1),
                block=(32, 1, 1),
                stream=stream,
                parameters=bytes(8) + i.to_bytes(4, "little") + bytes(4),
                relocations=[m.Relocation(0, buf, 0, 0)],
            )
    cu = driver()
    with replayfmt.open(path) as cap:
        plan = build_plan(cap)
        with Replayer(plan, ReplayOptions()) as replayer:
            replayer.run(1)  # warm-up
            # raw: the same launches, pre-packed, straight through cuda-python
            function = replayer.functions[(exe, 0)]
            raw_stream = replayer.streams[stream]
            device_ptr = replayer.addresses[buf]
            packed = [device_ptr.to_bytes(8, "little") + i.to_bytes(4, "little") + bytes(4) for i in range(count)]
            blocks = [np.frombuffer(b, np.uint8).copy() for b in packed]
            arrays = [np.array([b.ctypes.data, b.ctypes.data + 8], np.uint64) for b in blocks]
            params = [a.ctypes.data for a in arrays]
            launch = cu.cuLaunchKernel
            for p in params[:100]:
                launch(function, 1, 1, 1, 32, 1, 1, 0, raw_stream, p, 0)
            check(cu.cuCtxSynchronize(), "sync")
            ratios = []
            raw_times, replay_times = [], []
            for _ in range(5):
                start = time.perf_counter()
                for p in params:
                    (err,) = launch(function, 1, 1, 1, 32, 1, 1, 0, raw_stream, p, 0)
                    if err != cu.CUresult.CUDA_SUCCESS:
                        raise RuntimeError(err)
                check(cu.cuCtxSynchronize(), "sync")
                raw = time.perf_counter() - start
                start = time.perf_counter()
                replayer.run(1)
                replay = time.perf_counter() - start
                raw_times.append(raw)
                replay_times.append(replay)
                ratios.append(replay / raw)
    return {
        "raw_us": 1e6 * min(raw_times) / count,
        "replay_us": 1e6 * min(replay_times) / count,
        "ratio": float(np.median(ratios)),
    }


def bench_upload(directory: Path, size: int) -> dict[str, list[float]]:
    cu = driver()
    # the process keeps its CUDA context, as a program that uses CUDA does: context creation is
    # not upload time (each Replayer would otherwise create and destroy the primary context)
    device = check(cu.cuDeviceGet(0), "cuDeviceGet")
    check(cu.cuDevicePrimaryCtxRetain(device), "cuDevicePrimaryCtxRetain")
    try:
        return _bench_upload(directory, size)
    finally:
        cu.cuDevicePrimaryCtxRelease(device)


ROUNDS = 3  # each upload measured this many times, interleaved with the host's ceiling


def host_ceiling_gbs(path: Path, size: int, device_buffer: int, lanes: int = 16, piece: int = 8 << 20) -> float:
    """The same move without replayfmt: ``lanes`` threads preadv the file's first ``size`` bytes
    in ``piece``-byte pieces into their own pinned slots and copy each up on their own stream.
    What this host manages at this moment: its memory bandwidth varies from machine to machine."""
    cu = driver()
    ctx = check(cu.cuCtxGetCurrent(), "cuCtxGetCurrent")
    fd = os.open(path, os.O_RDONLY)
    pieces = deque(range(0, size, piece))
    slots = [check(cu.cuMemHostAlloc(2 * piece, 0), "pinned") for _ in range(lanes)]

    def lane(k: int) -> None:
        check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        stream = check(cu.cuStreamCreate(1), "stream")
        done = [check(cu.cuEventCreate(2), "event") for _ in range(2)]
        turn = 0
        while True:
            try:
                offset = pieces.popleft()
            except IndexError:
                break
            slot, n = turn % 2, min(piece, size - offset)
            if turn >= 2:
                check(cu.cuEventSynchronize(done[slot]), "event")
            address = int(slots[k]) + slot * piece
            os.preadv(fd, [memoryview((ctypes.c_char * n).from_address(address)).cast("B")], offset)
            check(cu.cuMemcpyHtoDAsync(device_buffer + offset, address, n, stream), "copy")
            check(cu.cuEventRecord(done[slot], stream), "event")
            turn += 1
        check(cu.cuStreamSynchronize(stream), "sync")
        for event in done:
            check(cu.cuEventDestroy(event), "event")
        check(cu.cuStreamDestroy(stream), "stream")

    try:
        with ThreadPoolExecutor(lanes) as pool:
            start = time.perf_counter()
            list(pool.map(lane, range(lanes)))
            return size / (time.perf_counter() - start) / 1e9
    finally:
        os.close(fd)
        for slot in slots:
            check(cu.cuMemFreeHost(slot), "free")


def _bench_upload(directory: Path, size: int) -> dict[str, list[float]]:
    """Rates in GB/s, each measured ROUNDS times (bare_gbs: the best of three)."""
    cu = driver()
    rng = np.random.default_rng(0)
    noise = rng.integers(0, 2**32, size // 4, dtype=np.uint32)  # stored raw (incompressible)
    sparse = np.maximum(rng.standard_normal(size // 4, dtype=np.float32) - 1.3, 0)  # stored zstd
    results: dict[str, list[float]] = {}
    scratch = check(cu.cuMemAlloc(size), "device buffer")
    try:
        host = check(cu.cuMemHostAlloc(size, 0), "pinned")
        ctypes.memmove(host, noise.ctypes.data, size)
        bare = []
        for _ in range(3):
            start = time.perf_counter()
            check(cu.cuMemcpyHtoD(scratch, host, size), "bare copy")
            bare.append(time.perf_counter() - start)
        check(cu.cuMemFreeHost(host), "free")
        results["bare_gbs"] = [size / min(bare) / 1e9]
        for name, data in (("raw", noise), ("zstd", sparse)):
            path = directory / f"upload_{name}.kreplay"
            with replayfmt.CaptureWriter(path, overwrite=True) as w:
                dev = w.add_object(m.Device(name="bench"))
                w.copy_h2d(dst_buffer=w.add_object(m.Buffer(size=data.nbytes, device=dev)), data=data)
            os.sync()
            with replayfmt.open(path) as cap:
                plan = build_plan(cap)
                for _ in range(ROUNDS):
                    if name == "raw":
                        results.setdefault("ceiling_gbs", []).append(host_ceiling_gbs(path, size, int(scratch)))
                    for checked in (True, False):
                        suffix = "" if checked else "_unchecked"
                        start = time.perf_counter()
                        with Replayer(plan, ReplayOptions(check_payloads=checked)) as replayer:
                            replayer.run(1)
                            first = time.perf_counter() - start  # file to device: setup, read, upload, a run
                            staging = replayer.staging
                            for what, value in (
                                ("pipeline_gbs", staging.gbs),
                                ("lanes_ms", 1e3 * staging.setup_seconds),
                                ("check_ms", 1e3 * staging.check_seconds),
                                ("end_to_end_gbs", data.nbytes / first / 1e9),
                            ):
                                results.setdefault(f"{name}{suffix}_{what}", []).append(value)
                            if checked:  # later runs: the copy from the device-resident pristine bytes only
                                copy_ms = min(replayer.run(1).device_ms[0] for _ in range(3))
                                results.setdefault(f"{name}_copy_gbs", []).append(data.nbytes / copy_ms / 1e6)
    finally:
        check(cu.cuMemFree(scratch), "free")
    return results


def file_system(directory: Path) -> str:
    """The type of the file system holding ``directory`` (from /proc/mounts), or "?"."""
    best, kind = "", "?"
    with contextlib.suppress(OSError), open("/proc/mounts") as mounts:
        for line in mounts:
            fields = line.split()
            point = fields[1]
            if len(fields) > 2 and str(directory).startswith(point) and len(point) > len(best):
                best, kind = point, fields[2]
    return kind


def default_upload_dirs() -> list[str]:
    dirs = [tempfile.gettempdir()]
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        dirs.append("/dev/shm")
    return dirs


BERT_PROGRAM = HERE.parent / "examples" / "capture" / "bert_train_step.py"
BERT_ROUNDS = 50


def record_bert(directory: Path) -> Path:
    """Record the BERT-like step with the recorder (region mode, its "step" scope)."""
    out = directory / "bert.kreplay"
    command = [sys.executable, "-m", "replayfmt.capture", "-o", str(out), "--scope", "step", str(BERT_PROGRAM)]
    subprocess.run(command, check=True)
    return out


def _timed(capture: Path, mode: str) -> tuple[BenchmarkResult, list[float], int]:
    """benchmark-replay's measurement of the "step" scope in ``mode`` (a session of its own: each
    owns its CUPTI activity); in eager mode also the elapsed times of the raw loop under the same
    clock: (result, raw elapsed ms, launches in the region)."""
    raw_elapsed: list[float] = []
    with open_replay(capture) as session:
        region = find_region(session.capture, "step")
        ops = session.capture.iter_operations(region.start, region.stop)
        launches = sum(1 for op in ops if op.kind in (m.OperationKind.LAUNCH, m.OperationKind.GRAPH_LAUNCH))
        replayer = session.start(ReplayOptions(uploads_from_host=True))
        options = BenchmarkOptions(scope="step", warmup=5, repetitions=BERT_ROUNDS, mode=mode)
        bench = Benchmark(replayer, region, options)
        result = bench.run()
        if mode == "eager":  # raw cuda-python: the same prepared calls from a bare loop, no checks
            where = "the C issue loop (replayfmt/replay/issue.c)" if replayer.issue_compiled else "Python alone"
            print(f"  eager replay issues its calls from {where}")
            calls = [(step.fn, step.args) for step in bench.body]
            for k, (_, elapsed) in enumerate(_issue_rounds(replayer, _bare_loop(calls))):
                if k >= 5:
                    raw_elapsed.append(elapsed)
    return result, raw_elapsed, launches


def _bare_loop(calls: list[tuple[Callable[..., object], tuple[object, ...]]]) -> Callable[[], None]:
    """Raw cuda-python: the calls issued by a plain loop, nothing checked or kept."""

    def issue() -> None:
        for fn, args in calls:
            fn(*args)

    return issue


def _issue_rounds(replayer: Replayer, issue: Callable[[], object]) -> Iterator[tuple[float, float]]:
    """Rounds of ``issue()`` (5 warm-up rounds, then BERT_ROUNDS), each between the replayer's
    fork and join events: (host ms to issue, without the wait that follows; elapsed device ms)."""
    cu = replayer.cu
    start, end = (check(cu.cuEventCreate(0), "event") for _ in range(2))
    replayer.own(lambda: cu.cuEventDestroy(start))
    replayer.own(lambda: cu.cuEventDestroy(end))
    for _ in range(5 + BERT_ROUNDS):
        replayer.fork(start)
        began = time.perf_counter()
        issue()
        host = time.perf_counter() - began
        replayer.join(end)
        replayer.synchronize()
        yield 1e3 * host, check(cu.cuEventElapsedTime(start, end), "elapsed")


def _driver_floor(replayer: Replayer, steps: list) -> Callable[[], None] | None:
    """The driver's own cost of the region's calls: every call the C loop can make packed once
    and issued by it with nothing around (no runner, no checks, no bookkeeping), the rest from
    Python; None where the C loop is not built. No replay that makes these calls can cost less."""
    library = IssueLibrary.for_driver(replayer.cu)
    if library is None:
        return None
    runs = IssuePlanner(replayer.cu).runs(steps, 0, len(steps))

    def issue() -> None:
        for run in runs:
            if run.calls is None:
                for step in steps[run.start : run.stop]:
                    step.fn(*step.args)
            elif library.issue(run.calls)[0] != len(run.calls):
                raise RuntimeError("the driver refused a call of the floor's loop")

    return issue


class HostCost(NamedTuple):
    """The host's ms to issue the region once (medians): a bare cuda-python loop, the replay's
    checked runner, and the driver's own floor (None: the C loop is not built)."""

    raw_ms: float
    replay_ms: float
    floor_ms: float | None


def _host_cost(capture: Path) -> HostCost:
    """The host's ms to issue the region, the bare loop, the replay's checked runner and the
    driver floor alternating, in a session with no CUPTI activity (which adds its own cost to
    every launch): medians."""
    raw: list[float] = []
    replay: list[float] = []
    floor: list[float] = []
    with open_replay(capture) as session:
        region = find_region(session.capture, "step")
        replayer = session.start(ReplayOptions(uploads_from_host=True))
        options = BenchmarkOptions(scope="step", warmup=1, repetitions=1, clock="events")
        body = Benchmark(replayer, region, options).body
        calls = [(step.fn, step.args) for step in body]
        bare = _issue_rounds(replayer, _bare_loop(calls))
        checked = _issue_rounds(replayer, lambda: replayer.execute_steps(body))
        floor_issue = _driver_floor(replayer, list(body))
        least = _issue_rounds(replayer, floor_issue) if floor_issue is not None else repeat((float("nan"), 0.0))
        # (least: rounds of its own, or an endless filler where the C loop is not built)
        for k, ((a, _), (b, _), (c, _)) in enumerate(zip(bare, checked, least)):
            if k >= 5:
                raw.append(a)
                replay.append(b)
                floor.append(c)
    return HostCost(float(np.median(raw)), float(np.median(replay)), float(np.median(floor)) if floor_issue else None)


def torch_graph_baseline() -> dict | None:
    """bert_torch_graph.py's measurement (a child process), or None where it cannot run."""
    result = subprocess.run(
        [sys.executable, str(HERE / "bert_torch_graph.py")], capture_output=True, text=True, timeout=300
    )
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        print(f"  (the torch.cuda graph baseline did not run: {(result.stderr or '').strip()[-300:]})")
        return None
    return json.loads(lines[-1])


def bench_bert(directory: Path, capture: Path | None, goals: Goals) -> list[str]:
    """The host-gap lines of the BERT-like step; its two goals judged into ``goals``."""
    capture = capture or record_bert(directory)
    host = _host_cost(capture)  # first: before CUPTI's activity is ever on in this process
    raw_host, replay_host = host.raw_ms, host.replay_ms
    eager, raw_elapsed, launches = _timed(capture, "eager")
    graph, *_ = _timed(capture, "graph")
    lines = [f"\nBERT-like training step ({capture.name}, scope 'step'): {launches} launches"]
    if eager.busy_ms is None or graph.busy_ms is None:
        verdict = goals.judge("bert: GPU busy time", False)
        return [*lines, f"  no GPU busy time: {eager.clock_note or graph.clock_note or 'CUPTI is absent'} {verdict}"]
    busy = eager.busy_ms.median
    lines.append(
        f"  GPU busy (CUPTI, union of kernels and copies): {busy:.3f} ms eager, {graph.busy_ms.median:.3f} graph"
    )
    lines.append(
        f"  {'':<34}{'elapsed ms':>11}{'idle ms':>9}{'idle/busy':>10}{'idle us/launch':>16}{'issue us/launch':>17}"
    )

    def row(name: str, elapsed: float, host_ms: float | None, busy_ms: float, goal: str) -> str:
        idle = max(0.0, elapsed - busy_ms)
        issue = "" if host_ms is None else f"{1e3 * host_ms / launches:.2f}"
        return (
            f"  {name:<34}{elapsed:>11.3f}{idle:>9.3f}{idle / busy_ms:>10.1%}{1e3 * idle / launches:>16.2f}"
            f"{issue:>17}  {goal}"
        )

    raw = float(np.median(raw_elapsed))
    lines.append(row("raw cuda-python (bare loop)", raw, raw_host, busy, ""))
    issue_per_launch = 1e3 * replay_host / launches
    if host.floor_ms is not None:  # the least these very calls cost the host: the driver's own time
        lines.append(
            f"  {'driver floor (same calls, bare C loop)':<34}{'':>11}{'':>9}{'':>10}{'':>16}"
            f"{1e3 * host.floor_ms / launches:>17.2f}  (the driver's own cost of these calls)"
        )
    goal = f"goal host cost <= 1.5 us/launch {goals.judge('bert: eager host cost per launch', issue_per_launch <= 1.5)}"
    lines.append(row("replay, eager", eager.device_ms.median, replay_host, busy, goal))
    graph_busy = graph.busy_ms.median
    idle_share = max(0.0, graph.device_ms.median - graph_busy) / graph_busy
    goal = f"goal idle < 2% of busy {goals.judge('bert: graph idle share', idle_share < 0.02)}"
    lines.append(row("replay, graph (a native CUDA graph)", graph.device_ms.median, None, graph_busy, goal))
    own = torch_graph_baseline()
    if own is not None:  # the floor: the same step in PyTorch's own CUDA graph, no replayfmt
        elapsed, own_busy = own["elapsed_ms"], own["busy_ms"]
        lines.append(row("the program's own torch.cuda graph", elapsed, None, own_busy, "(baseline)"))
        lines.append(
            f"  graph mode's idle share against the program's own graph: "
            f"{idle_share:.1%} vs {max(0.0, elapsed - own_busy) / own_busy:.1%}"
            f" ({own['nodes_per_replay']} kernels and copies a replay)"
        )
    lines.append(
        f"  (medians of {BERT_ROUNDS} iterations; eager replay issues the calls raw cuda-python does, through "
        "its checked runner; issue us/launch: the host's time to issue the region, without the wait that "
        "follows, measured with CUPTI's activity off (it adds its own cost to every launch); issue and wait "
        f"under CUPTI, eager: {eager.host_ms.median:.3f} ms an iteration)"
    )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=20_000)
    parser.add_argument("--upload-mib", type=int, default=1024)
    parser.add_argument("--upload-dir", action="append", help="where the upload capture is written (repeatable)")
    parser.add_argument(
        "--sections",
        default="launches,uploads",
        help="comma-separated: launches, uploads, bert (default: the first two)",
    )
    parser.add_argument("--bert-capture", type=Path, help="time this capture of the BERT-like step (else record one)")
    add_check(parser)
    args = parser.parse_args()
    goals = Goals()
    sections = {s.strip() for s in args.sections.split(",") if s.strip()}
    unknown = sections - {"launches", "uploads", "bert"}
    if unknown:
        parser.error(f"--sections: unknown {', '.join(sorted(unknown))}")
    arch = device_arch()
    if "launches" in sections:
        with tempfile.TemporaryDirectory() as tmp:
            r = bench_launches(Path(tmp), compile_empty(arch), args.launches)
        verdict = goals.judge("launch overhead", r["ratio"] <= 1.25)
        print(f"{arch}, {args.launches:,} launches of an empty kernel")
        print(f"  raw cuLaunchKernel (pre-packed)  {r['raw_us']:.2f} us/launch")
        print(f"  Replayer.run                     {r['replay_us']:.2f} us/launch")
        print(f"  ratio (median of 5)              {r['ratio']:.3f}x   goal <= 1.25x  {verdict}")
    if "bert" in sections:
        with tempfile.TemporaryDirectory() as tmp:
            lines = bench_bert(Path(tmp), args.bert_capture, goals)
        print("\n".join(lines))
    for where in (args.upload_dir or default_upload_dirs()) if "uploads" in sections else []:
        with tempfile.TemporaryDirectory(dir=where) as tmp:
            directory = Path(tmp)
            kind = file_system(directory)
            print(f"\nupload of {args.upload_mib} MiB from a file in {where} ({kind}, in the page cache)")
            rounds = bench_upload(directory, args.upload_mib << 20)
        u = {key: float(np.median(values)) for key, values in rounds.items()}
        bare, ceiling = u["bare_gbs"], u["ceiling_gbs"]
        print(
            f"  bare pinned cuMemcpyHtoD: {bare:.1f} GB/s; this host's ceiling (16 threads preadv the file into "
            f"pinned slots and copy up, no replayfmt): {ceiling:.1f} GB/s = {ceiling / bare:.0%}"
            f"  [{', '.join(f'{x:.1f}' for x in rounds['ceiling_gbs'])}]"
        )
        for name in ("raw", "zstd"):
            for suffix, how in (("", "frames hashed"), ("_unchecked", "--no-payload-checks")):
                key = f"{name}{suffix}_pipeline_gbs"
                pipeline, total = u[key], u[f"{name}{suffix}_end_to_end_gbs"]
                goal = ""
                if name == "raw":
                    goal = "  goal >= 50% " + goals.judge(f"staging {how} from {where}", pipeline >= 0.5 * bare)
                print(
                    f"  stored {name:4}, {how:19}: staging {pipeline:5.1f} GB/s = {pipeline / bare:4.0%} of bare"
                    f"{goal}; with setup and first run {total:5.1f} GB/s = {total / bare:4.0%}"
                    f"  [{', '.join(f'{x:.1f}' for x in rounds[key])}]"
                )
                check_ms = u[f"{name}{suffix}_check_ms"]
                print(
                    f"      pinning the lanes {u[f'{name}{suffix}_lanes_ms']:.0f} ms"
                    + (f"; frames checked on the device in {check_ms:.1f} ms" if check_ms else "")
                )
            print(f"  stored {name:4}: later runs (from the device-resident copy) {u[f'{name}_copy_gbs']:.0f} GB/s")
        print(f"  (medians of {ROUNDS} rounds, interleaved; each round's staging rate in brackets)")
    return goals.exit_status(args.check)


if __name__ == "__main__":
    sys.exit(main())
