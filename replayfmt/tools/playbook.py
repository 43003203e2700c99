"""The Markdown playbook that every tool prints with ``--agents-md``: one shared part, plus each
tool's own notes. It says only what this version of replayfmt does; what is still to come is
marked as such."""

from __future__ import annotations

SHARED = """\
# replayfmt playbook

replayfmt captures GPU work into one `.kreplay` file and works on it without the original
program. Tools: `dump-replay` (inspect), `run-replay` (rebuild and execute on a GPU),
`benchmark-replay` (time it). Every tool prints this page with `--agents-md`.

## The failure contract

* Exit 0: success. Exit 1: the work ran but found a problem (damaged or truncated file, a
  mismatch, failed verification). Exit 2: usage, format or environment error.
* Errors are one line on stderr, never a traceback: what failed, where (file offset, record,
  operation index, object id) and what to try.
* Replay is strict: anything that cannot be reproduced (an `unsupported` operation, a missing or
  changed file, a corrupted payload) fails loudly instead of being skipped.
* Nothing you have is overwritten without asking.

## Capture

From Python, with the writer (the CUPTI recorder `python -m replayfmt.capture` is still to come):

```python
import replayfmt
from replayfmt.format import model as m
with replayfmt.CaptureWriter("out.kreplay") as w:
    buf = w.add_object(m.Buffer(size=4096, dtype=m.DType.FLOAT32, shape=(1024,)))
    w.copy_h2d(dst_buffer=buf, data=host_array)
    with w.scope("step"):
        w.launch(executable=exe, function=0, grid=(4, 1, 1), block=(256, 1, 1),
                 parameters=param_bytes, relocations=[m.Relocation(0, buf, 8, 0)])
    w.checkpoint({buf: expected_bytes})   # what replay must reproduce
```

## Inspect

```sh
dump-replay cap.kreplay                         # summary (replayable? why not?) + one line per record
dump-replay --format=json cap.kreplay           # the summary alone, for scripts
dump-replay --format=jsonl cap.kreplay          # row 1 file, row 2 summary, then objects and operations
dump-replay --kind=launch --grep=gemm cap.kreplay
dump-replay --ops=100:200 --object=7 cap.kreplay
```

jq recipes (`--jq` runs jq in-process; no jq binary needed):

```sh
# kernel names and launch shapes
dump-replay --jq 'select(.kind=="launch") | [.function, .grid, .block] | @json' cap.kreplay
# how many launches per kernel (aggregations need the whole stream: pipe into jq -s)
dump-replay --format=jsonl --kind=launch cap.kreplay \\
  | jq -s 'map(select(.kind=="launch")) | group_by(.function) | map({kernel: .[0].function, n: length})'
# executables and their functions (ids for --executable-substitution)
dump-replay --jq 'select(.kind=="executable") | {id, functions: [.functions[].name]}' cap.kreplay
# files the capture needs (paths for --file-remap)
dump-replay --jq 'select(.kind=="file_reference") | {id, path, policy, validation}' cap.kreplay
# why the capture cannot be replayed
dump-replay --format=json cap.kreplay | jq '.not_replayable_because'
# payload bytes of one copy, as files
dump-replay --kind=copy_h2d --payloads=files:out/ cap.kreplay
```

## Run

```sh
run-replay --dry-run cap.kreplay          # everything that needs no GPU: files, ABIs, plan
run-replay --verify cap.kreplay           # replay and compare every checkpoint, byte for byte
run-replay --verify --tolerance cap.kreplay         # per-dtype tolerances for float buffers
run-replay --verify --rtol=1e-3 --atol=1e-5 cap.kreplay
run-replay --repetitions=10 cap.kreplay   # device time of each run (CUDA events)
run-replay --verify --save-output=out/ cap.kreplay  # replayed checkpoint buffers as .npy
```

## Substitute a newly compiled kernel

Find the executable id, build a replacement with the same kernel names and parameters, swap it in:

```sh
dump-replay --jq 'select(.kind=="executable") | {id, functions: [.functions[].name]}' cap.kreplay
nvcc -cubin -arch=sm_90 -o new.cubin kernel.cu
run-replay --dry-run --executable-substitution=5=new.cubin cap.kreplay   # ABI checked without a GPU
run-replay --verify --executable-substitution=5@cubin=new.cubin cap.kreplay
```

Every launched function must exist in the substitute with the same parameter offsets and sizes;
the first difference is printed as `captured=(...) loaded=(...)`. `all=PATH` substitutes every
executable (alone only).

## Remap files

A capture that refers to files (weights, modules) validates them before use. If the files moved:

```sh
dump-replay --jq 'select(.kind=="file_reference") | .path' cap.kreplay
run-replay --file-remap=/home/alice/models=/data/models cap.kreplay   # longest prefix wins
```

Identity validation (size, device, inode, mtime) only accepts the very same file; a copy needs a
capture made with digest validation.

## Change a launch's shape

```sh
run-replay --launch=42:grid=128,1,1,block=256,smem=0 --verify --repetitions=10 cap.kreplay
```

Overrides are checked against the grid/block limits and the function's threads-per-block and
shared-memory limits before anything runs; verification then says whether the kernel still
computes the right answer with that shape.

## Benchmark

```sh
benchmark-replay --scope=step cap.kreplay                     # min/median/mean/stddev/p90, device and host
benchmark-replay --scope=step --per-kernel --format=json cap.kreplay > base.json
benchmark-replay --scope=step --executable-substitution=5=new.cubin --compare-to=base.json cap.kreplay
benchmark-replay --scope=step --mode=graph --flush-l2 --repetitions=100 cap.kreplay
benchmark-replay --scope=step --trace=iteration.json cap.kreplay   # open in ui.perfetto.dev
```

Scope names are in the summary (`dump-replay --summary`).
"""

TOOLS = {
    "capture-replay": """\
## capture-replay notes (python -m replayfmt.capture)

* Needs cupti-python matching the driver's CUPTI (`pip install 'replayfmt[capture]'`); CUPTI
  allows one subscriber, so torch.profiler, nsys or ncu in the same process is a clear error.
* Region mode (default) records everything; `--scope NAME` only inside
  `replayfmt.capture.scope(NAME)` blocks. The first touch of an allocation uploads its contents;
  the allocations a region wrote are checkpointed at its end, so `run-replay --verify` checks them.
* Kernel mode: `--mode kernel --kernels REGEX [--skip-first N] [--max-per-kernel N]`; each
  instance is a scope `NAME#K` with its inputs, the launch and a checkpoint of what it changed:
  `benchmark-replay --scope 'NAME#K'`, `tune-replay --launch OP`.
* Modules must load while the recorder listens: start it first (the CLI does). Libraries
  (cuBLAS, cuDNN, PyTorch's own kernels) load their cubins lazily: CUPTI's resource domain
  reports each, and a launched kernel is matched to the cubin that defines its name. A kernel
  whose module loaded before the recorder listened is recorded as unsupported and replay
  refuses the capture.
* Cost: about 7 us per Triton launch and 13 us per PyTorch eager launch (H100), with snapshots
  off; a snapshot synchronises only the launching stream.
* Libraries that keep device pointers in device memory (cuBLAS workspaces, pointer arrays) are
  detected when snapshots hold addresses: the report says "needs --fixed-addresses". Capture with
  `--fixed-addresses` and replay with `run-replay --fixed-addresses` (both re-run themselves with
  address-space randomisation off).
* CUDA graphs (stream capture, the explicit API, `torch.compile(mode="reduce-overhead")`) are
  followed: each launch is a `graph_launch` of a `graph` object (kernel, memcpy, memset, event,
  child-graph, empty and host nodes with their edges) and replays as a graph; `dump-replay` lists
  the nodes; `benchmark-replay --per-kernel` times them one by one. Region mode only. Graph updates
  other than cuGraphExecUpdate and cuGraphExecKernelNodeSetParams, host-memory, 2D/3D memcpy,
  memory-allocation and conditional nodes are recorded as unsupported.
* Not reproducible, recorded as unsupported (replay refuses): host functions, IPC, managed
  memory, NCCL kernels, peer and 2D/3D copies.
* The report at the end lists kernels seen, instances captured and bytes stored, and any error
  met inside a callback (callbacks never raise into the program).
""",
    "dump-replay": """\
## dump-replay notes

* Output streams in constant memory; `| head` ends quietly with exit 0.
* A damaged or truncated file: everything readable is printed, then one error line on stderr,
  exit 1. The summary says whether the file was recovered and how many bytes were lost.
* JSONL keys are listed in docs/JSONL.md and frozen within a major version (only added).
  Addresses are hex strings (they do not fit a JSON double); ids are integers.
* Payload bytes are never inlined unless asked: `--payloads=hex|base64|files:DIR`.
""",
    "run-replay": """\
## run-replay notes

* Buffers are allocated anew and every relocated pointer (in parameters, in buffers, in tensor
  maps) is re-pointed; streams and events are rebuilt, so captured concurrency is kept.
* Uploads are staged once (as pristine copies on the device when memory allows); each run replays
  them, so inputs are restored between repetitions. The `uploads` line gives the staging rate and
  where frames were checked against their hashes: on the device (a kernel hashes them where they
  landed) or, on several devices or an old driver, on the host as they are read.
  `--no-payload-checks` skips the check (faster, corruption unseen).
* A CUDA error names the operation index, kernel and driver error; an asynchronous fault (illegal
  address) also names the launches issued since the last successful synchronisation.
* `--fixed-addresses` places buffers at their recorded addresses or fails. The driver grants an
  address only inside its own per-process range, placed below what the process has mapped when
  CUDA starts: the tool re-runs itself with address-space randomisation off, then, before CUDA
  starts, pads its address space until a forked copy of itself is granted the recorded range.
  The capture must have been taken with randomisation off too (`capture-replay --fixed-addresses`
  does that). Used from Python, create the Replayer before anything else starts CUDA.
* Several devices: captured device k runs on the k-th `--device` (`--device cuda:1 --device
  cuda:0` swaps them). Streams, events and modules live on their device; event edges and copies
  cross devices; a kernel that uses another device's memory gets peer access (or a clear error
  where the devices have none). Default-stream work runs on the device whose buffers it touches.
  benchmark-replay, tune-replay and `--fixed-addresses` take single-device captures only.
""",
    "tune-replay": """\
## tune-replay notes

* `--launch=OP` tunes one launch; `--kernel=REGEX` every launch of one kernel, together.
* Space: `--grid`, `--block` (X or X,Y,Z, ';'-separated), `--smem`, and for executables captured
  as PTX `--max-registers` (re-JIT with a register cap: launch bounds without the source); points
  over the device's or the function's limits are pruned first and listed.
  `--strategy=random --budget=N` for large spaces.
* Every candidate is verified against the checkpoints: a shape that computes the wrong answer is
  reported as such, however fast. Faults and hangs (`--timeout`) are isolated in a worker process.
* `--csv` streams results and resumes; `--plot` draws grid x block; the winner is printed as
  `run-replay --launch=...` flags.
""",
    "benchmark-replay": """\
## benchmark-replay notes

* Only the scope is timed: setup and the operations before it run once, outside the timed region.
  Before every iteration the buffers the scope touches are restored from pristine device copies.
* Device time: CUDA events around the scope, joined across every captured stream. Host time: the
  wall clock around issuing it and waiting for it.
* `--mode=graph` captures the scope once as a CUDA graph; host synchronisations inside it become
  event edges (same device-side order).
* Uploads inside the scope stay host-to-device copies from pinned memory, as in the program.
* `--nvtx` wraps scopes and launches in NVTX ranges, so Nsight tools can select them:
  `ncu --nvtx --nvtx-include "step/" benchmark-replay --nvtx --scope=step --repetitions=1 cap.kreplay`.
  `--trace` writes a per-stream timeline of one iteration without any profiler.
""",
}


def playbook(tool: str) -> str:
    """The shared playbook followed by ``tool``'s own notes."""
    return SHARED + "\n" + TOOLS.get(tool, "")
