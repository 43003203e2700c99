"""JAX steps timed alone, original against replay, kernel by kernel (issue 44: JAX steps replayed
6-12% slow where PyTorch's sat within 2%).

    python benchmarks/jax_step_bench.py [--only diffrax adam donated equinox] [--iterations 30] [--check]

For each program, nothing else on the GPU, one process after the other:
1. the original: the jitted step run ``--iterations`` times under CUPTI activity records, the host
   idle 3 ms between runs (each run's records are the ones between two such gaps); the step's GPU
   busy time (union of its kernels, copies and memsets), its kernels' busy time, their summed
   durations (the two differ where kernels overlap), streams and graph-launched kernels;
2. the same with XLA's command buffers off (``--xla_gpu_enable_command_buffer=``): the step as
   plain launches, as an eager replay issues it;
3. ``python -m replayfmt.capture --scope step`` on one more run of the step;
4. benchmark-replay --scope step --clock=cupti, eager and graph, and --per-kernel (eager).

Prints the busy times side by side (replay / original: the eager replay's goal within 2%; graph
mode beside it, docs/LIMITATIONS.md) and where the difference lies: the kernels' summed durations
per kernel name, original against replay, largest first.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from goals import Goals, add_check

ROOT = Path(__file__).resolve().parents[1]
GOAL = 0.02
GAP_NS = 1_000_000  # runs are split where the GPU idled this long (the host sleeps 3 ms between them)


def build(name: str):  # -> a callable that runs the step once and waits for it
    """The programs' steps, jitted and compiled (run twice) before they are returned."""
    import jax
    import jax.numpy as jnp

    key = jax.random.PRNGKey(0)
    if name == "diffrax":  # issue 44's adaptive ODE solve: lax.while_loop, some 900 kernels
        import diffrax

        @jax.jit
        def solve(a, y0):
            term = diffrax.ODETerm(lambda t, y, args: -args @ jnp.tanh(y) + jnp.sin(t))
            controller = diffrax.PIDController(rtol=1e-6, atol=1e-6)
            saved = diffrax.SaveAt(ts=jnp.linspace(0.0, 2.0, 64))
            return diffrax.diffeqsolve(
                term, diffrax.Tsit5(), 0.0, 2.0, 0.01, y0, args=a, stepsize_controller=controller, saveat=saved
            ).ys

        ka, ky = jax.random.split(key)
        a, y0 = jax.random.normal(ka, (256, 256)) / 16, jax.random.normal(ky, (256,))

        def work():
            return jax.block_until_ready(solve(a, y0))

    elif name in ("adam", "donated"):  # benchmarks/corpus/jax_optax_adam.py, jax_donated_step.py
        import optax

        k1, k2, k3, k4 = jax.random.split(key, 4)
        params = {
            "w1": jax.random.normal(k1, (256, 512)) * 0.05,
            "b1": jnp.zeros(512),
            "w2": jax.random.normal(k2, (512, 10)) * 0.05,
            "b2": jnp.zeros(10),
        }
        x = jax.random.normal(k3, (128, 256))
        y = jax.nn.one_hot(jax.random.randint(k4, (128,), 0, 10), 10)
        optimizer = optax.adam(1e-3)

        def loss_fn(p, x, y):
            h = jax.nn.relu(x @ p["w1"] + p["b1"])
            return optax.softmax_cross_entropy(h @ p["w2"] + p["b2"], y).mean()

        def update(p, s, x, y):
            loss, grads = jax.value_and_grad(loss_fn)(p, x, y)
            updates, s = optimizer.update(grads, s, p)
            return optax.apply_updates(p, updates), s, loss

        step = jax.jit(update, donate_argnums=(0, 1) if name == "donated" else ())
        state = [params, optimizer.init(params)]

        def work():
            for _ in range(2):  # as the corpus's scope: two steps
                state[0], state[1], loss = step(state[0], state[1], x, y)
            return jax.block_until_ready((state[0], state[1], loss))

    elif name == "equinox":  # benchmarks/corpus/equinox_mlp_train.py
        import equinox as eqx
        import optax

        k1, k2 = jax.random.split(jax.random.PRNGKey(5))
        model = eqx.nn.MLP(in_size=64, out_size=1, width_size=256, depth=3, key=k1)
        x = jax.random.normal(k2, (512, 64))
        y = jnp.sin(x.sum(axis=1, keepdims=True))
        optimizer = optax.adam(1e-3)

        @eqx.filter_jit
        def update(model, opt_state):
            def loss(m):
                return jnp.mean((jax.vmap(m)(x) - y) ** 2)

            value, grads = eqx.filter_value_and_grad(loss)(model)
            updates, opt_state = optimizer.update(grads, opt_state, eqx.filter(model, eqx.is_array))
            return eqx.apply_updates(model, updates), opt_state, value

        state = [model, optimizer.init(eqx.filter(model, eqx.is_array))]

        def work():
            state[0], state[1], value = update(state[0], state[1])
            return jax.block_until_ready((eqx.filter(state[0], eqx.is_array), state[1], value))

    else:
        raise SystemExit(f"unknown program {name}")
    work()
    work()
    return work


def original(name: str, iterations: int) -> dict:
    """Child process: the step's runs under CUPTI, split at the host's idle gaps."""
    from replayfmt.cuda.activity import ActivityKind, KernelActivity
    from replayfmt.format.timings import busy_ns

    activity = KernelActivity()
    with activity:  # before JAX loads its kernels
        work = build(name)
        for _ in range(iterations):
            time.sleep(0.003)
            work()
        time.sleep(0.003)
    records = sorted(activity.take().records, key=lambda r: r.start_ns)
    runs: list[list] = []
    last_end = None
    for record in records:
        if last_end is None or record.start_ns - last_end > GAP_NS:
            runs.append([])
        runs[-1].append(record)
        last_end = record.end_ns if last_end is None else max(last_end, record.end_ns)
    runs = runs[-iterations:]  # the compile's and warm-up's work come first
    busy, kernel_busy, kernel_sum, per_name = [], [], [], Counter()
    for run in runs:
        kernels = [r for r in run if r.kind == ActivityKind.CONCURRENT_KERNEL]
        busy.append(busy_ns((r.start_ns, r.end_ns) for r in run) / 1e6)
        kernel_busy.append(busy_ns((r.start_ns, r.end_ns) for r in kernels) / 1e6)
        kernel_sum.append(sum(r.end_ns - r.start_ns for r in kernels) / 1e6)
        for r in kernels:
            per_name[r.name] += (r.end_ns - r.start_ns) / len(runs)
    last = runs[-1] if runs else []
    return {
        "busy_ms": statistics.median(busy),
        "kernel_busy_ms": statistics.median(kernel_busy),
        "kernel_sum_ms": statistics.median(kernel_sum),
        "records": statistics.median(len(r) for r in runs),
        "kernels": sum(r.kind == ActivityKind.CONCURRENT_KERNEL for r in last),
        "streams": len({r.stream for r in last}),
        "graph_records": sum(r.graph_node != 0 for r in last),
        "per_name_ns": dict(per_name),
        "last_run": [  # for --traces: what ran, when (from the run's first start), how long
            {
                "kind": r.kind.name.lower(),
                "name": r.name,
                "node": r.graph_node,
                "start_ns": r.start_ns - last[0].start_ns,
                "ns": r.end_ns - r.start_ns,
                "bytes": r.bytes,
            }
            for r in last
        ],
    }


def captured(name: str) -> None:
    """Child process under the recorder: one run of the step in scope "step"."""
    import replayfmt.capture

    work = build(name)
    with replayfmt.capture.scope("step"):
        work()


def child(args: list[str], env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    paths = [str(ROOT), str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH", "")]
    full = dict(os.environ, PYTHONPATH=os.pathsep.join(paths), **(env or {}))
    return subprocess.run(args, capture_output=True, text=True, cwd=ROOT, env=full, timeout=timeout)


def last_json(done: subprocess.CompletedProcess) -> dict:
    """The JSON a child printed last: the whole of stdout (benchmark-replay indents it) or its last line."""
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-1500:])
    try:
        return json.loads(done.stdout)
    except json.JSONDecodeError:
        return json.loads(done.stdout.strip().splitlines()[-1])


def benchmark(path: Path, *flags: str) -> dict:
    tool = [sys.executable, "-m", "replayfmt_tools.benchmark_replay", "--scope=step", "--clock=cupti"]
    return last_json(child([*tool, "--format=json", "--min-time=0.5", *flags, str(path)]))


def compare(name: str, iterations: int, goals: Goals, traces: Path | None = None) -> None:
    if traces:
        traces.mkdir(parents=True, exist_ok=True)
    print(f"\n== {name}")
    me = [sys.executable, __file__]
    plain = {"XLA_FLAGS": (os.environ.get("XLA_FLAGS", "") + " --xla_gpu_enable_command_buffer=").strip()}
    measure = [*me, "--original", name, f"--iterations={iterations}"]
    sides = {"original": last_json(child(measure)), "original, no command buffers": last_json(child(measure, plain))}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{name}.kreplay"
        recorder = [sys.executable, "-m", "replayfmt.capture", "-o", str(path), "--scope", "step"]
        done = child([*recorder, __file__, "--captured", name])  # a script: recorded in-process
        if done.returncode != 0 or not path.exists():
            print(f"  capture failed: {done.stderr[-1500:]}")
            goals.judge(f"{name} capture", False)
            return
        eager = benchmark(path, *([f"--trace={traces / (name + '.replay.json')}"] if traces else []))
        graph = benchmark(path, "--mode=graph")
        per_kernel = benchmark(path, "--per-kernel")
    first = sides["original"]
    if traces:
        (traces / f"{name}.original.json").write_text(json.dumps(first.pop("last_run"), indent=0))
    print(
        f"  original: {first['kernels']} kernels a run on {first['streams']} stream(s), "
        f"{first['graph_records']} records (kernels, copies, memsets) from CUDA graph nodes; kernels' summed durations "
        f"{first['kernel_sum_ms']:.4f} ms against their busy union {first['kernel_busy_ms']:.4f} ms"
    )
    print(f"  {'':<34}{'busy':>10}{'kernels':>10}{'/ original':>12}")
    for label, side in sides.items():
        print(
            f"  {label:<34}{side['busy_ms']:>7.4f} ms{side['kernel_busy_ms']:>7.4f} ms"
            f"{side['busy_ms'] / first['busy_ms']:>11.4f}"
        )
    for label, result in (("replay, eager", eager), ("replay, graph", graph)):
        busy, kernels = result["busy_ms"]["median"], result["kernel_busy_ms"]["median"]
        ratio = busy / first["busy_ms"]
        # the goal is the default (eager) replay's; graph mode nests XLA's graphs as child nodes and
        # is shown beside it (docs/LIMITATIONS.md)
        verdict = goals.judge(f"{name} {label} within 2%", abs(ratio - 1) <= GOAL) if label.endswith("eager") else ""
        print(f"  {label:<34}{busy:>7.4f} ms{kernels:>7.4f} ms{ratio:>11.4f}  {verdict}")
    stored = (eager.get("original") or {}).get("busy_ns")
    if stored:
        ratio = stored / 1e6 / first["busy_ms"]
        print(f"  {'recorded while capturing':<34}{stored / 1e6:>7.4f} ms{'':>10}{ratio:>11.4f}")
    replayed: Counter = Counter()
    for k in per_kernel["kernels"]:
        if k["name"]:
            replayed[k["name"]] += k["device_ms"]["median"] * 1e6
    names = set(first["per_name_ns"]) | set(replayed)
    rows = sorted(names, key=lambda n: -abs(replayed.get(n, 0) - first["per_name_ns"].get(n, 0)))
    total = sum(replayed.values()) / 1e6
    print(
        f"  kernels' summed durations: replay {total:.4f} ms, original {first['kernel_sum_ms']:.4f} ms; "
        "largest differences by kernel name (us a run):"
    )
    for n in rows[:12]:
        a, b = replayed.get(n, 0) / 1e3, first["per_name_ns"].get(n, 0) / 1e3
        print(f"    {n[:70]:<72} replay {a:9.2f}  original {b:9.2f}  {a - b:+8.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", default=["diffrax", "adam", "donated", "equinox"])
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument(
        "--traces", type=Path, metavar="DIR", help="write the original's last run and the eager replay's trace here"
    )
    parser.add_argument("--original", metavar="NAME", help=argparse.SUPPRESS)
    parser.add_argument("--captured", metavar="NAME", help=argparse.SUPPRESS)
    add_check(parser)
    args = parser.parse_args()
    if args.original:
        print(json.dumps(original(args.original, args.iterations)))
        return 0
    if args.captured:
        captured(args.captured)
        return 0
    goals = Goals()
    for name in args.only:
        try:
            compare(name, args.iterations, goals, args.traces)
        except (RuntimeError, subprocess.TimeoutExpired, KeyError) as exc:
            print(f"  {name} failed: {str(exc)[-1500:]}")
            goals.judge(name, False)
    return goals.exit_status(args.check)


if __name__ == "__main__":
    sys.exit(main())
