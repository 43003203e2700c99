"""The Markdown playbook that every tool prints with ``--agents-md``: one shared part, plus each
tool's own notes. It says only what this version of replayfmt does.

Every fenced command and snippet here runs as written from a checkout (tests/test_playbook.py
executes those that need no GPU and parses the flags of the others)."""

from __future__ import annotations

SHARED = """\
# replayfmt playbook

replayfmt captures GPU work into one `.kreplay` file and works on it without the original
program. Nine tools, each printing this page with `--agents-md`:

| tool | does | needs a GPU |
|---|---|---|
| `capture-replay` (also `python -m replayfmt.capture`) | record a program's GPU work (Python or any executable) | yes |
| `dump-replay` | inspect: summary, one line or JSON row per record, jq | no |
| `run-replay` | rebuild and run it, verify checkpoints; `--dry-run` checks everything else | yes (not `--dry-run`) |
| `benchmark-replay` | time a scope of it from the same starting state | yes |
| `tune-replay` | search launch shapes, every candidate verified | yes |
| `extract-replay` | cut one launch, a scope or a range out as a standalone capture | where the capture lacks bytes |
| `diff-replay` | compare two captures: kernels added, removed, changed; original times side by side | no |
| `corpus-replay` | replay a directory of captures, a worker per GPU, against a baseline | yes (not `--dry-run`) |
| `reduce-replay` | shrink a capture to the smallest one that still fails a test | yes (not `--command`) |

From Python: `replayfmt.open`, `replayfmt.CaptureWriter`, `replayfmt.capture.record` and
`replayfmt.execute.open_replay`. The front doors are `replayfmt/schema.fbs`, `writer.py`,
`reader.py` and `execute.py`; behind them the library is laid out by job (`format/` the wire,
`container/` the file's rooms, `cuda/` the driver, `replay/` plan and Replayer, `measure/` benchmark
and tune, `dump/`, `capture/` the recorder, `edit/` extract, diff, reduce), and these CLIs live apart in
top-level `tools/`; docs/ARCHITECTURE.md maps every module.

Every command on this page runs as written, from a checkout of replayfmt, on the example
capture (a saxpy kernel: executable 5, launch operation 9, scope `saxpy`):

```sh
cp examples/saxpy.kreplay cap.kreplay    # or rebuild it: python examples/make_saxpy_capture.py --output cap.kreplay
```

## The failure contract

* Exit 0: success. Exit 1: the work ran but found a problem (damaged or truncated file, a
  mismatch, failed verification). Exit 2: usage, format or environment error (no GPU or driver).
* Errors are one line on stderr, never a traceback: what failed, where (file offset, record,
  operation index, object id) and what to try.
* Replay is strict: anything that cannot be reproduced (an `unsupported` operation, a missing or
  changed file, a corrupted payload) fails loudly instead of being skipped.
* Nothing you have is overwritten without asking.
* Kernel names are shown demangled; JSON keeps the raw symbol (`function`) and adds
  `function_demangled` when they differ.

## Capture

With the recorder, from any Python program, no code change (needs a GPU and
`pip install -e '.[capture]'`):

```sh
python -m replayfmt.capture -o add.kreplay examples/capture/triton_add.py
python -m replayfmt.capture -o k.kreplay --mode kernel --kernels add_kernel examples/capture/triton_add.py
capture-replay -o gemm.kreplay --scope step ./a.out     # any executable; --scope = NVTX range "step"
```

Or with the writer, from Python, no GPU (a complete script: `examples/make_saxpy_capture.py`;
this one needs nvcc to build the kernel):

```python
import subprocess

import numpy as np

import replayfmt
from replayfmt.format import model as m

subprocess.run(["nvcc", "-cubin", "-arch=sm_90", "-o", "saxpy.cubin", "examples/kernels/saxpy.cu"], check=True)
n = 4096
x = np.arange(n, dtype=np.float32)
y = np.ones(n, dtype=np.float32)
saxpy = m.Function(name="saxpy", parameters_known=True, parameters=(
    m.Parameter(offset=0, size=4, kind=m.ParameterKind.VALUE, name="a", dtype=m.DType.FLOAT32),
    m.Parameter(offset=8, size=8, kind=m.ParameterKind.POINTER, name="x"),
    m.Parameter(offset=16, size=8, kind=m.ParameterKind.POINTER, name="y"),
    m.Parameter(offset=24, size=4, kind=m.ParameterKind.VALUE, name="n", dtype=m.DType.INT32),
))
with replayfmt.CaptureWriter("mine.kreplay") as w:
    dev = w.add_object(m.Device(name="NVIDIA H100", compute_capability=(9, 0)))
    bx = w.add_object(m.Buffer(size=x.nbytes, device=dev, dtype=m.DType.FLOAT32, shape=(n,)))
    by = w.add_object(m.Buffer(size=y.nbytes, device=dev, dtype=m.DType.FLOAT32, shape=(n,)))
    with open("saxpy.cubin", "rb") as f:
        image = w.add_payload(f.read())
    exe = w.add_object(m.Executable(format=m.ExecutableFormat.CUBIN, target_arch="sm_90", payload=image,
                                    functions=(saxpy,)))
    w.module_load(exe, dev)
    w.copy_h2d(dst_buffer=bx, data=x)
    params = np.float32(2.0).tobytes() + bytes(20) + np.int32(n).tobytes() + bytes(4)  # a, x, y, n
    with w.scope("step"):
        w.state(buffer=by, data=y)  # what y holds as the step begins: restored, never timed
        w.launch(executable=exe, function=0, grid=(n // 256, 1, 1), block=(256, 1, 1), parameters=params,
                 relocations=[m.Relocation(0, bx, 8, 0), m.Relocation(0, by, 16, 0)])  # x at 8, y at 16
    w.checkpoint({by: (np.float32(2.0) * x + y).astype(np.float32)})  # what replay must reproduce
```

```sh
run-replay --dry-run mine.kreplay
```

## Inspect

```sh
dump-replay cap.kreplay                         # summary (replayable, as --dry-run says) + one line per record
dump-replay --format=json cap.kreplay           # the summary alone, for scripts
dump-replay --format=jsonl cap.kreplay          # row 1 file, row 2 summary, then objects and operations
dump-replay --kind=launch --grep=saxpy cap.kreplay
dump-replay --ops=0:10 --object=5 cap.kreplay
```

jq recipes (`--jq` runs jq in-process; no jq binary needed):

```sh
# kernel names and launch shapes
dump-replay --jq 'select(.kind=="launch") | [.function, .grid, .block] | @json' cap.kreplay
# how many launches per kernel (aggregations need the whole stream: pipe into the jq binary, jq -s)
dump-replay --format=jsonl --kind=launch cap.kreplay \\
  | jq -s 'map(select(.kind=="launch")) | group_by(.function) | map({kernel: .[0].function, n: length})'
# executables and their functions (ids for --executable-substitution)
dump-replay --jq 'select(.kind=="executable") | {id, functions: [.functions[].name]}' cap.kreplay
# files the capture needs (paths for --file-remap)
dump-replay --jq 'select(.kind=="file_reference") | {id, path, policy, validation}' cap.kreplay
# why the capture cannot be replayed (empty when it can)
dump-replay --jq 'select(.kind=="summary") | .not_replayable_because' cap.kreplay
# payload bytes of the uploads, one file per payload (JSONL only: --payloads works on rows)
dump-replay --format=jsonl --kind=copy_h2d --payloads=files:payloads/ cap.kreplay
```

## Run

```sh
run-replay --dry-run cap.kreplay          # everything that needs no GPU: files, ABIs, plan
run-replay --verify cap.kreplay           # compare every checkpoint: exact, or judged by dtype over replays
run-replay --verify --tolerance cap.kreplay         # per-dtype tolerances for float buffers
run-replay --verify --rtol=1e-3 --atol=1e-5 cap.kreplay
run-replay --repetitions=10 cap.kreplay   # device time of each run (CUDA events)
run-replay --verify --save-output=out/ cap.kreplay  # replayed checkpoint buffers as .npy
run-replay --verify --format=json cap.kreplay  # per range: exact / within run-to-run variation / wrong (docs/VERIFY.md)
run-replay --verify --launch=9:skip cap.kreplay  # must fail: verification is evidence (docs/VERIFY.md)
```

## Substitute a newly compiled kernel

Find the executable id, build a replacement with the same kernel names and parameters, swap it in:

```sh
dump-replay --jq 'select(.kind=="executable") | {id, functions: [.functions[].name]}' cap.kreplay
nvcc -cubin -arch=sm_90 -o new.cubin examples/kernels/saxpy.cu
run-replay --dry-run --executable-substitution=5=new.cubin cap.kreplay   # ABI and architecture checked without a GPU
run-replay --verify --executable-substitution=5@cubin=new.cubin cap.kreplay
```

Every launched function must exist in the substitute with the same parameter offsets and sizes;
the first difference is printed as `captured=(...) loaded=(...)`. A cubin must be built for the
captured architecture (sm_80 code does not run on an sm_90 device). `all=PATH` substitutes every
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
run-replay --launch=9:grid=32,1,1,block=128,smem=0 --verify --repetitions=10 cap.kreplay
```

Overrides are checked against the grid/block limits and the function's threads-per-block and
shared-memory limits before anything runs; verification then says whether the kernel still
computes the right answer with that shape.

## Benchmark

```sh
benchmark-replay --scope=saxpy cap.kreplay                    # min/median/mean/stddev/p90, device and host
benchmark-replay --scope=saxpy --per-kernel --format=json --output=base.json cap.kreplay
benchmark-replay --scope=saxpy --executable-substitution=5=new.cubin --compare-to=base.json cap.kreplay
benchmark-replay --scope=saxpy --mode=graph --flush-l2 --repetitions=100 cap.kreplay
benchmark-replay --scope=saxpy --trace=iteration.json cap.kreplay   # open in ui.perfetto.dev
```

`--output` writes the result only once the run succeeded (a shell's `> base.json` would leave an
empty file behind a failed run). Scope names are in the summary (`dump-replay --summary`).

## Tune

```sh
tune-replay --launch=9 --block "64;128;256;512" --csv=tune.csv --plot=tune.png cap.kreplay
tune-replay --kernel=saxpy --grid "8;16;32" --block "128;256" --plot=grid-block.png cap.kreplay
```

The best shape is printed as ready `run-replay --launch=...` flags.

## Cut one kernel out (the bug-report loop)

From a big capture (a model step recorded with `--scope step`), write one launch, a scope or an
operation range as a standalone capture shaped like a kernel-mode one: a scope (`kernel#K` for a
launch) holding the starting state of what it reads, the work, and a checkpoint of what it
writes; only the executables, buffers, graphs, streams and events it needs; its original times;
and where it came from (`extract.*` metadata properties: source path and digest, operation range).

```sh
extract-replay --operation=9 --no-gpu -o launch9.kreplay cap.kreplay       # by operation index
extract-replay --kernel='saxpy#0' --no-gpu --force -o launch9.kreplay cap.kreplay   # K-th launch a regex finds
extract-replay --scope=saxpy --no-gpu --format=json -o scope.kreplay cap.kreplay    # a scope, JSON report
run-replay --dry-run launch9.kreplay
```

Then `run-replay --verify launch9.kreplay` and `benchmark-replay --scope='saxpy#0' launch9.kreplay`
on a GPU, or attach the file to the bug report. Starting state and checkpoint come from the
capture's own data where it holds them (states, uploads, memsets, device copies, checkpoints);
where it does not (the input was written by an earlier kernel of the step), the operations before
are replayed on a GPU and the bytes read back, narrowed from whole allocations to the ranges a
rerun with everything else zeroed proves enough (the report says which). `--no-gpu` refuses when
starting state is missing and names the buffer, byte range and operation that wrote it.

## Compare two captures (the regression loop)

```sh
diff-replay cap.kreplay launch9.kreplay                                   # a table; exit 0: the same
diff-replay --format=jsonl --fail-on=time=+5% --fail-on=any cap.kreplay launch9.kreplay
```

Launches are matched by demangled kernel name and order: the two name sequences are aligned as
diff aligns lines (longest matching blocks), so an inserted or removed launch shifts nothing
after it; in a changed stretch the k-th launch of a name on each side is paired. Paired launches
are compared by shape (grid, block, cluster, shared memory), parameters outside relocated
pointers, and executable image hash; kernels' and scopes' original times are shown side by side
with ratios. Exit 0: the same within `--fail-on`; 1: different; 2: usage or unreadable file.
"""

TOOLS = {
    "capture-replay": """\
## capture-replay notes (python -m replayfmt.capture)

* Needs cupti-python matching the driver's CUPTI (`pip install -e '.[capture]'`); CUPTI
  allows one subscriber: a recorder started under torch.profiler, nsys or ncu is a clear error;
  a profiler the program starts itself runs with its GPU side off (proton's start does nothing,
  torch.profiler keeps its CPU events), said in a `note:` line; any other failure of the
  program's own CUPTI client is traced to the conflict in one line.
* `-o` is checked before CUDA or the program start (a missing or read-only directory, an
  existing file: it is replaced only with `--overwrite`).
* Region mode (default) records everything; `--scope NAME` only inside
  `replayfmt.capture.scope(NAME)` blocks. The first touch of an allocation records its contents
  as the region's starting state (`state` rows: replay sets them before the region begins and
  never times them); the allocations a region, or a scope inside it, touched are checkpointed at
  its end, so `run-replay --verify` checks them.
* Framework arenas (XLA preallocates most of the device as one; PyTorch's caching allocator keeps
  free blocks): in allocations of 16 MiB or more that JAX or PyTorch manages, only the live
  buffers are snapshotted (`jax.live_arrays()` with the arrays a step donates, the allocator's
  active blocks; XLA's arena known by its size from the program's start); checkpoints compare
  the buffers' own bytes; the report says how many bytes were skipped, which are undefined at
  replay. `--whole-allocations` snapshots
  whole allocations; a snapshot over `--max-snapshot-gib` (16) that no framework describes is
  refused (the capture says why), never attempted.
* Kernel mode: `--mode kernel --kernels REGEX [--skip-first N] [--max-per-kernel N]`; each
  instance is a scope `NAME#K` with its inputs, the launch and a checkpoint of what it changed:
  `benchmark-replay --scope 'NAME#K'`, `tune-replay --launch OP`.
* Programs that are not Python (ELF binaries, non-Python scripts) run as a child that hosts the
  same recorder through CUDA's injection entry point (docs/INJECTION.md): same flags, file and
  verdict; `--scope NAME` records inside the program's NVTX ranges named NAME. Needs the shared
  libpython of the Python that runs capture-replay. Only the first process that initialises
  CUDA records; others are listed. A program that names libcupti, or CUDA_INJECTION64_PATH
  already set (nsys, ncu), is refused.
* Modules must load while the recorder listens: start it first (the CLI does). Libraries
  (cuBLAS, cuDNN, PyTorch's own kernels) load their cubins lazily: CUPTI's resource domain
  reports each, and a launched kernel is matched to the cubin that defines its name. A kernel
  whose module loaded before the recorder listened is recorded as unsupported and replay
  refuses the capture.
* Cost per launch: +4 to +11 µs (Triton) and +1 to +10 µs (torch `add_`) with the original's
  times over the latest runs (`benchmarks/capture_bench.py`, H100, snapshots off, a noisy
  machine): a launch that repeats one already written is answered in C. A snapshot synchronises
  only the launching stream; one of 32 MiB or more is copied aside on the device and written
  behind the program.
* Libraries that keep device pointers in device memory (cuBLAS workspaces, pointer arrays) are
  detected when snapshots hold addresses: the report says "needs --fixed-addresses". Capture with
  `--fixed-addresses` and replay with `run-replay --fixed-addresses` (both re-run themselves with
  address-space randomisation off).
* CUDA graphs (stream capture, the explicit API, `torch.compile(mode="reduce-overhead")`) are
  followed: each launch is a `graph_launch` of a `graph` object (kernel, memcpy, memset, event,
  child-graph, empty and host nodes with their edges) and replays as a graph; `dump-replay` lists
  the nodes; `benchmark-replay --per-kernel` times them one by one; `tune-replay --kernel` and
  `--executable-substitution` reach kernel nodes. Region mode only. An executable changed
  between launches is written again as a new graph: cuGraphExecUpdate,
  cuGraphExecKernelNodeSetParams, cuGraphExecMemsetNodeSetParams,
  cuGraphExecMemcpyNodeSetParams, cuGraphExecNodeSetParams, cuGraphExecChildGraphNodeSetParams,
  cuGraphExecEventRecordNodeSetEvent, cuGraphExecEventWaitNodeSetEvent,
  cuGraphExecHostNodeSetParams and cuGraphNodeSetEnabled (a disabled node is written as an empty
  node), inside child graphs too. Host-memory and 2D/3D memcpy nodes, memory-allocation and
  conditional nodes are recorded as unsupported.
* Not reproducible, recorded as unsupported (replay refuses): IPC and 2D/3D copies.
* Several devices in one process: every device's work is recorded, each object on its device
  (peer copies included). Under a launcher each rank writes its own capture (`-o job.kreplay`:
  `job.rank0.kreplay`, ...). A rank's NCCL calls are collective operations (NCCL's own log says
  each call, with the bytes it left): the ranks' captures replay together (`run-replay --verify
  job.rank0.kreplay job.rank1.kreplay`), one rank alone on one GPU; collectives among the devices
  of one process (a sharded JAX step) are one capture holding each device's rank, replayed among
  them in one process on as many GPUs.
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
* Payload bytes are never inlined unless asked: `--payloads=hex|base64|files:DIR`. DIR is
  created only under an existing directory (one level, and stderr says so); a file in its place
  is an error.
* `--jq` runs on the JSONL rows, or with `--format=json` on the summary
  (`dump-replay --format=json --jq .replayable cap.kreplay`); `--summary` is for the text format.
""",
    "run-replay": """\
## run-replay notes

* Buffers are allocated anew and every relocated pointer (in parameters, in buffers, in tensor
  maps) is re-pointed; streams and events are rebuilt, so captured concurrency is kept. Inside a
  struct parameter (cuBLAS's, CUTLASS's), the recorder leaves words whose low half is a small
  integer or INT32_MIN as captured unless they are an allocation's start: integer pairs, which a
  large arena's address range would otherwise take for pointers (a real pointer inside a struct
  to within 64 KiB of a 4 GiB boundary is left too).
* Uploads are staged once (as pristine copies on the device when memory allows); each run replays
  them, so inputs are restored between repetitions. The `uploads` line gives the staging rate and
  where frames were checked against their hashes: on the device (a kernel hashes them where they
  landed) or, on several devices or an old driver, on the host as they are read.
  `--no-payload-checks` skips the check (faster, corruption unseen).
* A CUDA error names the operation index, kernel and driver error; an asynchronous fault (illegal
  address) also names the launches issued since the last successful synchronisation.
* `--fixed-addresses` places device buffers at their recorded addresses or fails (pinned and
  managed host memory is relocated: its host address cannot be chosen). The driver grants an
  address only inside its own per-process range, placed below what the process has mapped when
  CUDA starts: the tool re-runs itself with address-space randomisation off, then, before CUDA
  starts, pads its address space until a forked copy of itself is granted the recorded range.
  The capture must have been taken with randomisation off too (`capture-replay --fixed-addresses`
  does that). Used from Python, create the Replayer before anything else starts CUDA.
* Several devices: captured device k runs on the k-th `--device` (`--device cuda:1 --device
  cuda:0` swaps them); captured devices no `--device` names run on the lowest free ordinals.
  Streams, events and modules live on their device; event edges and copies cross devices; a
  kernel that uses another device's memory gets peer access (or a clear error where the devices
  have none). Default-stream work of the first device runs on its default stream; a capture the
  recorder made writes other devices' default streams as streams of theirs. benchmark-replay times
  such a capture in eager mode (GPU busy time: the union over every device, on both sides);
  `--mode graph`, tune-replay and `--fixed-addresses` take single-device captures only.
""",
    "tune-replay": """\
## tune-replay notes

* `--launch=OP` tunes one launch; `--kernel=REGEX` every launch of one kernel, together.
* Space: `--grid`, `--block` (X or X,Y,Z, ';'-separated), `--smem`, and for executables captured
  as PTX `--max-registers` (re-JIT with a register cap: launch bounds without the source); points
  over the device's or the function's limits are pruned first and listed; a space pruned
  whole is a usage error before any worker starts. `--plot`'s extension names the image format
  (.png, .svg, .pdf), checked before the search.
  `--strategy=random --budget=N` for large spaces.
* Every candidate is verified against the checkpoints: a shape that computes the wrong answer is
  reported as such, however fast. Faults and hangs (`--timeout`) are isolated in a worker process.
* `--csv` streams results and resumes; `--plot` draws a line chart over one swept axis or a
  heatmap over two, the captured shape marked; the winner is printed as `run-replay --launch=...`
  flags.
""",
    "extract-replay": """\
## extract-replay notes

* One of `--operation N`, `--operations FIRST..LAST` (both included), `--kernel 'REGEX#K'` (the
  K-th launch, from 0, whose raw or demangled name the regex finds; without `#K` it must find
  exactly one), `--scope 'NAME[#K]'`. A range must lie in one region (an outermost scope or a
  stretch outside scopes).
* Footprints: copies and memsets keep exactly their ranges; a launch keeps the buffers its
  relocations name (sites inside buffers included). On the CPU path those are whole buffers,
  minus bytes the capture never defined; on the GPU path they are narrowed (see above).
* State from the capture is computed as a replay would see it: every upload, memset and device
  copy before the range is simulated, and a checkpoint makes bytes known again after a kernel.
* The output never replaces a file without `--force`, nor the source at all.
""",
    "reduce-replay": """\
## reduce-replay notes

* One test: `--fails-verify` (with `--executable-substitution ID=PATH`: the candidate must also
  verify without it), `--faults[=CUDA_ERROR_NAME]`, `--slower RATIO` (a substitution against the
  captured kernels), `--command 'CMD {}'` (non-zero exit: still failing). The original is tested
  first; one that passes is refused.
* Candidates are subsets of the device work with their inputs rebuilt from the capture's data;
  one whose inputs the capture lacks is skipped, not replayed. Kernel-mode captures reduce best.
* Then the inputs: a byte is dropped only if the candidate still fails the test and verifies
  replayed as captured, so the result holds what its kernels read. Without a substitution under
  `--faults`/`--fails-verify`, or with no GPU, every input is kept (the report's `inputs` line).
* Each candidate runs in a child process (one at a time per `--device`); `--max-tries`,
  `--max-seconds` and Ctrl-C leave the best capture so far at `-o`, which fails the test.
* Substitution ids are the original capture's; the result's metadata says them for the result
  (`reduce.result_substitutions`), with `reduce.source_digest` and `reduce.operations_kept`.
""",
    "diff-replay": """\
## diff-replay notes

* Without `--fail-on`, every structural check applies (`any`: shape, parameters, executable,
  new-kernels, missing-kernels, launches); times fail only with `time=P%`, `scope-time=P%` or
  `total-time=P%` (a leading `+`: only slowdowns).
* JSONL rows: `summary` first (counts, `kernels_only_a`/`_b`, `verdict`, `failed`), then `kernel`,
  `scope` and `launch` rows (changed launches only; `--all-launches` for all).
* Times are the original program's (the recorder's CUPTI records); a capture without them shows
  `-` and no ratio. Graph launches are not matched (kernel launches only).
* Parameters are read by what the kernel declares: pointers as buffer and offset, values by value,
  PyTorch's TensorInfo up to its dims. A launch differing only in the other bytes of a struct
  passed by value (padding, unused entries: two runs of one program differ there) is
  `struct-bytes`, not `parameters`; `--fail-on struct-bytes` counts and lists them.
""",
    "benchmark-replay": """\
## benchmark-replay notes

* Only the scope is timed (the whole capture without `--scope`): setup, the operations before
  it and its starting state run once, outside the timed region. Starting state is never timed,
  whatever the region (a region spanning several captured scopes sets each one's state every
  iteration, outside the timing). Before every iteration the buffers the scope touches are
  restored from pristine device copies.
* Device (elapsed) time: CUDA events around the scope, joined across every captured stream. GPU
  busy and per-operation times: CUPTI activity records (CUDA events where CUPTI is absent; a
  note says so). Host time: the wall clock around issuing it and waiting for it.
* A capture with the original's times shows the original's GPU busy time beside the replay's,
  never its elapsed time (under the recorder that includes the recorder's own work).
* Paths (`--output`, `--trace`, `--compare-to`) are checked before any GPU work.
* `--mode=graph` captures the scope once as a CUDA graph; host synchronisations inside it become
  event edges (same device-side order). A captured CUDA graph the scope launches joins that
  graph as a child-graph node (stream capture refuses cuGraphLaunch).
* Uploads inside the scope stay host-to-device copies from pinned memory, as in the program.
* `--nvtx` wraps scopes and launches in NVTX ranges, so Nsight tools can select them:
  `ncu --nvtx --nvtx-include "saxpy/" benchmark-replay --nvtx --scope=saxpy --repetitions=1 cap.kreplay`.
  `--trace` writes a per-stream timeline of one iteration without any profiler.
""",
    "corpus-replay": """\
## corpus-replay notes

* `corpus-replay DIR` replays every `*.kreplay` of DIR, one task each on a worker per GPU
  (`--device cuda:N`, several times; `--scheduler ADDRESS` for the workers of a Dask cluster),
  verifying every checkpoint and timing `--repetitions` runs; `--dry-run` plans them without a GPU.
* One table and `--csv`; `--compare-to` a directory of the same captures (run as the baseline) or
  an earlier `--csv`: a verdict worse than the baseline's, a missing capture or a device time over
  `--threshold` times the baseline's is a regression (exit 1).
* A capture that breaks its CUDA context, crashes or hangs its worker (`--timeout`) loses only
  that worker, which is replaced; its row says so. tune-replay fans out the same way.
* Dask distributed is optional (`pip install 'replayfmt[cluster]'`; dask-cuda's LocalCUDACluster
  when installed); without it the workers are local processes (`--engine local`).
* A job's rank files (`job.rank0.kreplay`, `job.rank1.kreplay`, ..., the group complete) are one
  row, `job.rank*.kreplay`, its ranks replayed together (collectives through NCCL); a capture of
  several devices runs on a worker pinned to as many GPUs. These run after the other rows, on the
  first `--device` GPUs (too few, or `--scheduler`: the row is unavailable, saying why).
""",
}


def playbook(tool: str) -> str:
    """The shared playbook followed by ``tool``'s own notes."""
    return SHARED + "\n" + TOOLS.get(tool, "")
