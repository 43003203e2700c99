"""CUDA graphs end to end on a GPU (issue 16, item 1): graphs made by stream capture (forked and
joined streams) and by the explicit API (with an executable kernel-node update and an executable
update between launches) are captured as Graph objects and graph launches, replayed as graphs,
verified, benchmarked (graph launches timed, a graph's nodes one by one with --per-kernel),
substituted and tuned. torch.compile(mode="reduce-overhead") graphs: test_capture_frameworks_gpu.py."""

from __future__ import annotations

import csv
import json
import re
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from samples import SAXPY, compiled_cubin
from test_capture_gpu import EXAMPLES, capture, capture_ready, dump, replay, run, verified  # noqa: F401 - a fixture

import replayfmt
from replayfmt.format import model as m
from replayfmt.format.model import GraphNode, GraphNodeKind as N


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in dump(path, "--format=jsonl").splitlines()]


def _graphs(path: Path) -> list[dict]:
    return [r for r in _rows(path) if r["kind"] == "graph"]


def written_graph(path: Path, arch: str) -> tuple[np.ndarray, np.ndarray]:
    """A capture written directly (no recorder): x, y, z and a graph (memset y[:16] = 0 -> saxpy
    y = 2x + y -> copy y to z -> child graph: memset z[:4] = 3.0; an event record and a host node
    beside) launched twice; its checkpoint holds y and z as the device must leave them."""
    n = 256
    x, y = np.arange(n, dtype=np.float32), np.ones(n, dtype=np.float32)
    with replayfmt.CaptureWriter(path) as w:
        device = w.add_object(m.Device())
        stream = w.add_object(m.Stream(device=device))
        event = w.add_object(m.Event(device=device))
        bx, by, bz = (w.add_object(m.Buffer(size=4 * n, device=device)) for _ in range(3))
        image = w.add_payload(compiled_cubin("container_kernels.cu", arch))
        exe = w.add_object(m.Executable(format=m.ExecutableFormat.CUBIN, payload=image, functions=(SAXPY,)))
        w.module_load(exe, device)
        w.state(buffer=bx, data=x)
        w.state(buffer=by, data=y)
        w.state(buffer=bz, data=np.zeros(n, np.float32))
        three = int(np.float32(3.0).view(np.uint32))
        child = m.Graph(
            device=device,
            nodes=(GraphNode(kind=N.MEMSET, dst_buffer=bz, value=three, element_size=4, width=4, height=1),),
        )
        kernel = GraphNode(
            kind=N.KERNEL,
            executable=exe,
            grid=(1, 1, 1),
            block=(n, 1, 1),
            parameters=struct.pack("<f4xQQi4x", 2.0, 0, 0, n),
            relocations=(m.Relocation(0, bx, 8, 0), m.Relocation(0, by, 16, 0)),
        )
        nodes = (
            GraphNode(kind=N.MEMSET, dst_buffer=by, value=0, element_size=4, width=16, height=1),
            kernel,
            GraphNode(kind=N.MEMCPY, src_buffer=by, dst_buffer=bz, size=4 * n),
            GraphNode(kind=N.CHILD_GRAPH, graph=w.add_object(child)),
            GraphNode(kind=N.EVENT_RECORD, event=event),
            GraphNode(kind=N.HOST),
        )
        graph = w.add_object(m.Graph(device=device, nodes=nodes, edges=((0, 1), (1, 2), (2, 3), (0, 4), (4, 5))))
        with w.scope("step"):
            w.graph_launch(graph, stream)
            w.graph_launch(graph, stream)
            w.stream_synchronize(stream)
        for _ in range(2):
            y[:16] = 0
            y = (np.float32(2.0) * x + y).astype(np.float32)
        z = y.copy()
        z[:4] = 3.0
        w.checkpoint({by: y, bz: z}, name="after")
    return y, z


def test_a_written_graph_replays_verifies_and_benchmarks(tmp_path, gpu_arch):
    """The replay side alone (no recorder): rebuilt with its topology, launched as a graph."""
    path = tmp_path / "written.kreplay"
    written_graph(path, gpu_arch)
    verified(path)
    result = _benchmark(path, "--scope=step", "--per-kernel")
    names = [k["name"] for k in result["kernels"]]
    assert names.count("saxpy (graph node 1)") == 2 and names.count("memset (graph node 3.0)") == 2, names
    as_graph = _benchmark(path, "--scope=step", "--mode=graph")  # the captured graph: a child node
    assert as_graph["mode"] == "graph" and as_graph["device_ms"]["median"] > 0, as_graph


def test_a_kernel_node_launched_in_clusters_replays_in_them(tmp_path, gpu_arch):
    """A kernel node's cluster dimensions (a node attribute: cuDNN's sm_90 kernels in XLA's graphs
    run in clusters) are set on the rebuilt node: each block reports its cluster's size and rank."""
    if int(gpu_arch.removeprefix("sm_")) < 90:
        pytest.skip("thread block clusters need sm_90")
    image = compiled_cubin(Path(__file__).resolve().parent / "kernels" / "cluster_rank.cu", gpu_arch)
    blocks = 8
    path = tmp_path / "clusters.kreplay"
    function = m.Function(
        name="cluster_rank", parameters=(m.Parameter(offset=0, size=8, kind=m.ParameterKind.POINTER),)
    )
    with replayfmt.CaptureWriter(path) as w:
        device = w.add_object(m.Device())
        stream = w.add_object(m.Stream(device=device))
        out = w.add_object(m.Buffer(size=4 * blocks, device=device))
        exe = w.add_object(
            m.Executable(format=m.ExecutableFormat.CUBIN, payload=w.add_payload(image), functions=(function,))
        )
        w.module_load(exe, device)
        w.state(buffer=out, data=np.zeros(blocks, np.uint32))
        node = GraphNode(
            kind=N.KERNEL,
            executable=exe,
            grid=(blocks, 1, 1),
            block=(32, 1, 1),
            cluster=(2, 1, 1),
            parameters=bytes(8),
            relocations=(m.Relocation(0, out, 0, 0),),
        )
        graph = w.add_object(m.Graph(device=device, nodes=(node,)))
        with w.scope("step"):
            w.graph_launch(graph, stream)
            w.stream_synchronize(stream)
        w.checkpoint({out: np.array([2000, 2001] * (blocks // 2), np.uint32)}, name="after")
    verified(path)
    result = _benchmark(path, "--scope=step", "--per-kernel")  # the node alone, through cuLaunchKernelEx
    assert [k["name"] for k in result["kernels"]] == ["cluster_rank (graph node 0)"], result["kernels"]


def _benchmark(path: Path, *flags: str) -> dict:
    args = [sys.executable, "-m", "replayfmt_tools.benchmark_replay", "--repetitions=5", "--format=json"]
    result = run([*args, *flags, str(path)])
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def stream_captured(tmp_path_factory, request) -> Path:
    arch = request.getfixturevalue("capture_ready")
    out = tmp_path_factory.mktemp("graphs") / "stream_capture.kreplay"
    report = capture(out, EXAMPLES / "cuda_python_stream_capture.py", "--scope", "step", args=(arch,))
    assert "replayable: yes" in report.stderr and "CUDA graphs: 3 launches" in report.stderr, report.stderr[-3000:]
    return out


def test_stream_captured_graph_replays_as_a_graph(stream_captured):
    rows = _rows(stream_captured)
    assert sum(r["kind"] == "graph_launch" for r in rows) == 3
    assert not [r for r in rows if r["kind"] in ("launch", "unsupported")]  # captured work is no launch
    (graph,) = _graphs(stream_captured)
    kinds = sorted(n["kind"] for n in graph["nodes"])
    assert kinds == ["kernel", "kernel", "memcpy", "memset"], kinds
    assert len(graph["edges"]) >= 3
    text = dump(stream_captured)
    assert "    node    " in text and "saxpy" in text
    verified(stream_captured)


def test_graph_launches_are_timed_and_per_kernel_reaches_their_nodes(stream_captured):
    whole = _benchmark(stream_captured, "--scope=step")
    assert whole["device_ms"]["median"] > 0
    result = _benchmark(stream_captured, "--scope=step", "--per-kernel")  # every node of each of the 3 launches
    names = [k["name"] for k in result["kernels"]]
    assert sum(n.startswith("saxpy (graph node") for n in names) == 6, names
    assert sum(n.startswith(("memset (graph node", "memcpy (graph node")) for n in names) == 6, names
    assert all(k["device_ms"]["median"] > 0 for k in result["kernels"])
    eager = _benchmark(stream_captured, "--scope=step")
    as_graph = _benchmark(stream_captured, "--scope=step", "--mode=graph")  # graph launches as child nodes
    # that one graph of child graphs takes about the eager region's device time is a timing goal
    # (benchmarks/timing_goals_bench.py --only graph --check)
    assert as_graph["mode"] == "graph" and as_graph["device_ms"]["median"] > 0, as_graph
    assert eager["mode"] == "eager" and as_graph["operations"] == eager["operations"], (eager, as_graph)


def test_substitution_reaches_kernel_nodes(stream_captured, tmp_path, gpu_arch):
    source = tmp_path / "saxpy_plus_one.cu"
    source.write_text(
        'extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {\n'
        "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n  if (i < n) y[i] = a * x[i] + y[i] + 1.0f;\n}\n"
    )
    cubin = tmp_path / "saxpy_plus_one.cubin"
    subprocess.run(["nvcc", "-cubin", f"-arch={gpu_arch}", "-o", str(cubin), str(source)], check=True)
    changed = replay(stream_captured, "--verify", f"--executable-substitution=all={cubin}")
    assert changed.returncode != 0 and "fail wrong" in (changed.stdout + changed.stderr).lower()


def test_tune_replay_reaches_kernel_nodes(stream_captured, tmp_path):
    """saxpy runs as two kernel nodes of grid 4096 over 2^20 elements: block 128 leaves half of
    them undone (a wrong result, so the node's shape did change), block 256 is the captured one."""
    csv_path = tmp_path / "tune.csv"
    args = [sys.executable, "-m", "replayfmt_tools.tune_replay", "--kernel=saxpy", "--grid=4096", "--block=128;256"]
    result = run([*args, "--csv", str(csv_path), str(stream_captured)])
    output = result.stdout + result.stderr
    assert re.search(r"graph \d+ node \d+", output), output[-3000:]
    rows = {row["block"]: row for row in csv.DictReader(csv_path.open())}
    assert rows["256,1,1"]["verified"] == "yes" and rows["256,1,1"]["median_ms"], rows
    assert rows["128,1,1"]["verified"] == "no" and "wrong result" in rows["128,1,1"]["error"], rows
    assert result.returncode == 0, output[-3000:]


def test_explicit_graph_with_updates_between_launches(tmp_path, request):
    arch = request.getfixturevalue("capture_ready")
    out = tmp_path / "explicit.kreplay"
    report = capture(out, EXAMPLES / "cuda_python_graph.py", args=(arch,))
    assert "replayable: yes" in report.stderr, report.stderr[-3000:]
    rows = _rows(out)
    launches = [r for r in rows if r["kind"] == "graph_launch"]
    graphs = {g["id"]: g for g in _graphs(out)}
    # the child graph (written once) and one version of the graph per launch
    parents = [g for g in graphs.values() if any(n["kind"] == "child_graph" for n in g["nodes"])]
    assert len(launches) == 3 and len(parents) == 3 and len(graphs) == 4, [g["nodes"] for g in graphs.values()]
    assert [r["graph"] for r in launches] == [p["id"] for p in parents]
    kinds = sorted(n["kind"] for n in parents[0]["nodes"])
    assert kinds == ["child_graph", "event_record", "kernel", "memcpy", "memset"], kinds
    scales = [next(n for n in p["nodes"] if n["kind"] == "kernel")["parameters"][:8] for p in parents]
    assert scales == ["00000040", "00004040", "00008040"], scales  # a = 2, then 3 (exec node update), then 4
    verified(out)


def test_a_programmatic_edge_is_captured_and_replayed_as_one(tmp_path, request):
    """XLA's command buffers chain kernels with programmatic edges; a replay that made them full
    dependencies would run the same work without the overlap the program had."""
    arch = request.getfixturevalue("capture_ready")
    if int(arch.removeprefix("sm_")[:-1] or 0) < 9:
        pytest.skip("programmatic dependent launch needs compute capability 9.0")
    out = tmp_path / "pdl.kreplay"
    capture(
        out,
        Path(__file__).parent / "capture_scripts" / "programmatic_graph.py",
        "--scope",
        "step",
        args=(arch,),
    )
    (graph,) = _graphs(out)
    assert [e["type"] for e in graph["edge_data"]] == [1]  # the one edge, programmatic
    assert "(1 programmatic)" in dump(out, "--kind=graph")
    verified(out)
    for mode in ("eager", "graph"):  # the graph mode takes the graph as a child node of the region's
        timed = run(
            [
                sys.executable,
                "-m",
                "replayfmt_tools.benchmark_replay",
                "--scope=step",
                f"--mode={mode}",
                "--repetitions=3",
                str(out),
            ]
        )
        assert timed.returncode == 0, timed.stderr[-2000:]
