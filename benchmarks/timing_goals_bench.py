"""The timing goals of recorded captures, judged on a GPU: kept out of tests/gpu, which would
fail whenever other work shared the device (the tests assert the behaviour).

    python benchmarks/timing_goals_bench.py [--check] [--only NAME ...]

Each goal prints its figures and ``ok`` or ``MISSED``; ``--check`` exits 1 on a miss. Run it with
nothing else on the GPU: the goals compare device times.

* ``whole``: benchmark-replay with no --scope on a kernel-mode capture of Triton's softmax (one
  captured launch, then four): the replay's GPU busy time within 2% of the original's (the
  capture's original_ns rows), and its elapsed device time under 0.05 ms (one launch) and
  0.3 ms (four, CUPTI and events clocks): the captured scopes' starting state (2 MiB each) is set
  outside the timed region. The quick start's examples/triton_softmax.kreplay: busy within 2%.
* ``state``: a scoped step of tests/gpu/capture_scripts/big_state_small_kernel.py (256 MiB of
  state, a small kernel): benchmark-replay --scope=step under 0.05 ms, eager and graph.
* ``extract``: the longest GEMM of a torch.compile'd step cut out with extract-replay: its busy
  time alone within 2% of the same launch inside the step's replay (--per-kernel).
* ``host_waits``: tests/gpu/capture_scripts/xla_delay_kernel.py, XLA's autotuner timing three
  candidates behind its DelayKernel, captured whole: benchmark-replay's busy time within 2% of the
  original's (the delay kernels, which would spin 100 ms each, are released: neither side times
  them).
* ``graph``: the stream-captured CUDA graphs of examples/capture/cuda_python_stream_capture.py:
  benchmark-replay --mode=graph within 0.3x..3x of the eager replay.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from goals import Goals, add_check

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "tests" / "gpu" / "capture_scripts"
EXAMPLES = ROOT / "examples"
TOLERANCE = 0.02


class Skipped(Exception):
    """A goal that cannot be judged here (a module missing); printed, not a miss."""


def run(args: list[str], timeout: int = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)


def tool(name: str, *args: str) -> str:
    result = run([sys.executable, "-m", f"replayfmt_tools.{name}", *args])
    if result.returncode != 0:
        raise RuntimeError(f"{name} {' '.join(args)} exited {result.returncode}: {result.stderr[-2000:]}")
    return result.stdout


def capture(out: Path, script: Path, *flags: str, args: tuple[str, ...] = ()) -> Path:
    result = run([sys.executable, "-m", "replayfmt.capture", "-o", str(out), *flags, str(script), *args])
    if result.returncode != 0:
        raise RuntimeError(f"capturing {script.name} exited {result.returncode}: {result.stderr[-2000:]}")
    return out


def needs(*modules: str) -> None:
    for module in modules:
        if importlib.util.find_spec(module) is None:
            raise Skipped(f"{module} is not installed")


def bench(path: Path, *flags: str, repetitions: int = 100) -> dict:
    return json.loads(tool("benchmark_replay", f"--repetitions={repetitions}", "--format=json", *flags, str(path)))


def busy_within(goals: Goals, name: str, result: dict) -> None:
    """The replay's busy time against the original's, for a whole-capture benchmark."""
    if result["original"] is None:
        print(f"  {name}: the capture carries no original_ns rows  {goals.judge(name, False)}")
        return
    busy, original = result["busy_ms"]["median"], result["original"]["busy_ns"] / 1e6
    ratio = busy / original
    ok = abs(ratio - 1) <= TOLERANCE
    print(f"  {name}: replay busy {busy:.4f} ms, original {original:.4f} ms ({ratio:.3f}x)  {goals.judge(name, ok)}")


def under(goals: Goals, name: str, result: dict, limit_ms: float) -> None:
    ms = result["device_ms"]["median"]
    print(f"  {name}: elapsed {ms:.4f} ms (goal < {limit_ms} ms)  {goals.judge(name, ms < limit_ms)}")


def softmax(tmp: Path, instances: int) -> Path:
    needs("triton", "torch")
    return capture(
        tmp / f"softmax{instances}.kreplay",
        SCRIPTS / "triton_softmax_repeated.py",
        "--mode=kernel",
        "--kernels=softmax_kernel",
        "--skip-first=5",
        f"--max-per-kernel={instances}",
        args=(str(5 + instances + 2),),
    )


def whole(goals: Goals, tmp: Path) -> None:
    one = bench(softmax(tmp, 1))
    busy_within(goals, "whole capture, one launch: busy", one)
    # 2 MiB from pinned host memory takes over 0.1 ms: timed, the state would show
    under(goals, "whole capture, one launch: elapsed", one, 0.05)
    four = softmax(tmp, 4)
    for clock in ("cupti", "events"):
        # timed, the 3 later scopes' 2 MiB of state each took about 0.2 ms apiece
        under(goals, f"whole capture, four scopes ({clock}): elapsed", bench(four, f"--clock={clock}"), 0.3)
    busy_within(goals, "whole capture, four scopes: busy", bench(four))
    busy_within(goals, "quick start: busy", bench(EXAMPLES / "triton_softmax.kreplay"))


def state(goals: Goals, tmp: Path) -> None:
    needs("torch")
    out = capture(tmp / "big.kreplay", SCRIPTS / "big_state_small_kernel.py", "--scope", "step")
    # 256 MiB of state takes >= 80 us to restore even device to device (3 TB/s); the kernel, a few us
    for mode in ("eager", "graph"):
        result = bench(out, "--scope=step", f"--mode={mode}", repetitions=20)
        under(goals, f"256 MiB of state, small kernel ({mode}): elapsed", result, 0.05)


def extract(goals: Goals, tmp: Path) -> None:
    needs("torch")
    import replayfmt
    from replayfmt.format import model as m

    step = capture(
        tmp / "step.kreplay", SCRIPTS / "compiled_layers.py", "--scope", "step", args=("default", "64", "float32")
    )
    with replayfmt.open(step) as cap:
        times = cap.original_times()
        launches = [op for op in cap if op.kind == m.OperationKind.LAUNCH]
        names = {op.index: cap.object(op.executable).functions[op.function].name for op in launches}
    longest = max(times.duration_ns(op.index) or 0 for op in launches)
    long_ones = [op.index for op in launches if (times.duration_ns(op.index) or 0) >= 0.8 * longest]
    index = long_ones[len(long_ones) // 2]
    occurrence = sum(1 for op in launches if op.index < index and names[op.index] == names[index])
    one = tmp / "gemm.kreplay"
    pattern = f"^{re.escape(names[index])}$#{occurrence}"
    report = json.loads(tool("extract_replay", "--kernel", pattern, "--format=json", "-o", str(one), str(step)))
    alone = json.loads(
        tool("benchmark_replay", f"--scope={report['scope']}", "--clock=cupti", "--format=json", str(one))
    )
    inside = json.loads(
        tool("benchmark_replay", "--scope=step", "--per-kernel", "--clock=cupti", "--format=json", str(step))
    )
    in_step = next(k for k in inside["kernels"] if k["operation"] == index)["device_ms"]["median"]
    busy = alone["busy_ms"]["median"]
    ok = abs(busy / in_step - 1) <= TOLERANCE
    print(
        f"  one GEMM cut out (original {longest / 1e6:.4f} ms): alone {busy:.4f} ms, inside the step "
        f"{in_step:.4f} ms  {goals.judge('extracted GEMM alone against inside the step', ok)}"
    )


def graph(goals: Goals, tmp: Path) -> None:
    out = capture(
        tmp / "stream_capture.kreplay",
        EXAMPLES / "capture" / "cuda_python_stream_capture.py",
        "--scope",
        "step",
        args=(arch(),),
    )
    eager = bench(out, "--scope=step", repetitions=5)["device_ms"]["median"]
    as_graph = bench(out, "--scope=step", "--mode=graph", repetitions=5)["device_ms"]["median"]
    ratio = as_graph / eager
    # the same work: one graph of child graphs takes about the eager region's device time
    ok = 0.3 < ratio < 3
    verdict = goals.judge("graph against eager", ok)
    print(f"  graph launches: eager {eager:.4f} ms, as a graph {as_graph:.4f} ms ({ratio:.2f}x)  {verdict}")


def host_waits(goals: Goals, tmp: Path) -> None:
    out = capture(tmp / "autotune.kreplay", SCRIPTS / "xla_delay_kernel.py", args=(arch(),))
    result = bench(out, "--clock=cupti", repetitions=20)
    print(f"  {result['released'] or 'nothing released'}")
    busy_within(goals, "autotuner timing behind delay kernels: busy", result)


def arch() -> str:
    from replayfmt.cuda.driver import check, compute_capability, driver

    major, minor = compute_capability(check(driver().cuDeviceGet(0), "cuDeviceGet"))
    return f"sm_{major}{minor}"


GOALS: dict[str, Callable[[Goals, Path], None]] = {
    "whole": whole,
    "state": state,
    "extract": extract,
    "graph": graph,
    "host_waits": host_waits,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=sorted(GOALS), help="judge only these goals")
    add_check(parser)
    args = parser.parse_args()
    goals = Goals()
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only or GOALS:
            print(f"{name}:")
            try:
                GOALS[name](goals, Path(tmp))
            except Skipped as skipped:
                print(f"  skipped: {skipped}")
            except RuntimeError as failed:
                print(f"  {failed}  {goals.judge(name, False)}")
    return goals.exit_status(args.check)


if __name__ == "__main__":
    sys.exit(main())
