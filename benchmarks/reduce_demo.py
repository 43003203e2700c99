"""reduce-replay and --jit-from-ptx on a real program, on the GPU machine.

    python3 benchmarks/reduce_demo.py [--work DIR] [--device cuda:0 ...] [--layers 5]
        [--steps capture,verify,offbyone,oob,command,jit] [--max-seconds S] [--jobs N] [--profile-verify]

(each step can run in a call of its own: the capture in DIR is reused, DIR/summary.json gathers;
the steps after the capture run at once, --jobs at a time, each line led by its step's name)

1. capture: a torch.compile'd MLP training step (forward, backward, SGD: a few hundred launches of
   Triton, cuBLAS and ATen kernels) is captured in kernel mode (every launch its own region, with
   its state and checkpoint). verify: it is replayed with --verify (under cProfile with
   --profile-verify: DIR/verify.prof and the top of it printed).
2. offbyone: one Triton kernel's PTX (kept in the capture, else found in Triton's cache) gets an
   off-by-one (every global load reads one access further: benchmarks/ptx_plant.py), built with
   ptxas for the PTX's own target; ``reduce-replay --fails-verify`` with that substitution (a kernel
   whose planting does not show is refused as "the original capture passes", and the next one is
   tried); the result is checked to fail verification with the substitution and to verify without.
3. oob: the last Triton kernel's first global load moved 1 TiB away; reduced with
   ``--faults=CUDA_ERROR_ILLEGAL_ADDRESS``; the result faults with the substitution and verifies
   without it (its inputs are what the faulting launch reads).
4. command: ``--command``, a script grepping dump-replay's output for a Triton kernel's launch; the
   result holds that launch and verifies.
5. jit: ``run-replay --jit-from-ptx --verify`` on a Triton program's capture (kernel mode, the
   Triton kernel) and on the step's Triton kernels (the step captured again in kernel mode with
   ``--kernels ^triton_``); dump-replay's "runs on" line and the executables without PTX (with
   their kernels) of each, and --jit-from-ptx refusing the whole step, naming those.

Prints, per reduction, launches before and after, replays tried and time; writes DIR/summary.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ptx_plant import assemble, far_load, off_by_one

import replayfmt

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
_LABEL = threading.local()

MODEL = """
import sys, torch
torch.manual_seed(0)
layers, width, batch = int(sys.argv[1]), 256, 64
ws = [torch.nn.Parameter(torch.randn(width, width, device="cuda") / 16) for _ in range(layers)]
bs = [torch.nn.Parameter(torch.zeros(width, device="cuda")) for _ in range(layers)]
norms = [torch.nn.LayerNorm(width, device="cuda") for _ in range(layers)]
params = ws + bs + [p for n in norms for p in n.parameters()]
opt = torch.optim.SGD(params, lr=1e-3)
def loss_fn(x, y):
    for w, b, n in zip(ws, bs, norms):
        x = x + torch.nn.functional.gelu(n(x) @ w + b)
    return torch.nn.functional.mse_loss(x, y)
compiled = torch.compile(loss_fn)
x, y = torch.randn(batch, width, device="cuda"), torch.randn(batch, width, device="cuda")
opt.zero_grad(set_to_none=False)
compiled(x, y).backward()
opt.step()
torch.cuda.synchronize()
"""


def say(text: str) -> None:
    lead = getattr(_LABEL, "name", "")
    for line in text.splitlines() or [""]:
        print(f"[{lead}] {line}" if lead else line, flush=True)


def run(args: list[str], timeout: int = 1800) -> subprocess.CompletedProcess:
    started = time.monotonic()
    res = subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    shown = " ".join("<script>" if "\n" in a else a for a in args)
    say(f"$ {shown}  [exit {res.returncode}, {time.monotonic() - started:.1f} s]")
    return res


def tool(name: str, *args: str, timeout: int = 1800) -> subprocess.CompletedProcess:
    return run([PY, "-m", f"replayfmt_tools.{name}", *args], timeout=timeout)


def tail(res: subprocess.CompletedProcess, n: int = 12) -> str:
    return "\n".join((res.stdout + res.stderr).strip().splitlines()[-n:])


def capture(out: Path, options: list[str], program: Path, *program_args: str) -> subprocess.CompletedProcess:
    return run([PY, "-m", "replayfmt.capture", "--overwrite", "-o", str(out), *options, str(program), *program_args])


def runs_on(path: Path) -> dict:
    """dump-replay's summary of where the capture runs, with the kernels of executables without PTX."""
    rows = [json.loads(line) for line in tool("dump_replay", "--format=jsonl", str(path)).stdout.splitlines()]
    summary = next(r for r in rows if r["kind"] == "summary")
    out = {k: summary.get(k) for k in ("runs_on", "executables_without_ptx", "operations")}
    out["without_ptx"] = {
        r["id"]: [f["name"][:80] for f in r.get("functions", [])][:3]
        for r in rows
        if r["kind"] == "executable" and not r.get("has_ptx", True)
    }
    return out


def kernel_ptx(path: Path) -> dict[int, tuple[str, bytes]]:
    """executable id -> (kernel name, PTX) of the Triton executables: from the capture where it kept
    the PTX, else from Triton's cache by kernel name."""
    from replayfmt.capture.ptx_sources import default_roots
    from replayfmt.format import model as m
    from replayfmt.format.targets import ptx_text

    out = {}
    with replayfmt.open(path) as cap:
        for obj in cap.objects():
            if not isinstance(obj, m.Executable) or not obj.payload or not obj.functions:
                continue
            name = obj.functions[0].name
            if not name.startswith("triton_"):
                continue
            texts = ptx_text(bytes(cap.read_payload(obj.payload)))
            if texts:
                out[obj.id] = (name, texts[0][1])
                continue
            for root in default_roots():
                found = sorted(root.glob(f"**/{name}.ptx")) if root.is_dir() else []
                if found:
                    out[obj.id] = (name, found[0].read_bytes())
                    break
    return out


def report(res: subprocess.CompletedProcess) -> dict:
    lines = {line.split()[0]: line for line in res.stdout.splitlines() if line.strip()}
    keys = ("operations", "bytes", "replays", "inputs", "time", "kept", "stopped", "verdict")
    out = {k: lines[k] for k in keys if k in lines}
    original = [line for line in res.stderr.splitlines() if "the original fails:" in line]
    if original:
        out["original_failure"] = original[0].split("the original fails:", 1)[1].strip()
    return out


def reduce(step: Path, out: Path, devices: list[str], *test: str) -> tuple[subprocess.CompletedProcess, dict]:
    dev = [f"--device={d}" for d in devices]
    res = tool("reduce_replay", str(step), "-o", str(out), "--overwrite", *dev, *test)
    say(res.stdout.strip() or tail(res, 4))
    return res, {"exit": res.returncode, **report(res)}


def checked(out: Path, expect_failure: str) -> dict:
    """The reduced capture replayed with its substitution (it fails: ``expect_failure``) and without
    it (it verifies)."""
    with replayfmt.open(out) as cap:
        mapped = dict(cap.metadata.properties).get("reduce.result_substitutions", "")
    subs = [f"--executable-substitution={mapped}"] if mapped else []
    again = tool("run_replay", "--verify", *subs, str(out))
    plain = tool("run_replay", "--verify", str(out))
    text = again.stdout + again.stderr
    return {
        "with_substitution_exit": again.returncode,
        "with_substitution": tail(again, 1),
        "fails_as_planted": again.returncode == 1 and expect_failure in text,
        "without_substitution_exit": plain.returncode,
        "without_substitution": tail(plain, 1),
    }


def planted(ctx: dict, label: str, make, test: list[str], order: list[int], tries: int = 3) -> dict:
    """Plant a bug with ``make`` in the first kernel (in ``order``) where it shows, then reduce."""
    step, work, kernels = ctx["step"], ctx["work"], ctx["kernels"]
    for eid in [e for e in order if make(kernels[e][1]) is not None][:tries]:
        name, ptx = kernels[eid]
        path, fmt, why = assemble(make(ptx), work, f"{label}_{eid}")
        say(f"{label}: {name} (executable {eid}) built as {fmt}" + (f"; ptxas failed: {why}" if why else ""))
        sub = f"--executable-substitution={eid}@{fmt}={path}"
        out = work / f"{label}.kreplay"
        res, result = reduce(step, out, ctx["devices"], *test, sub)
        if res.returncode == 1 and "the original capture passes the test" in res.stderr:
            say(f"{label}: the planting in {name} does not show; next kernel")
            continue
        result.update(kernel=name, executable=eid, built_as=fmt, ptxas_error=why)
        if out.exists():
            expect = "CUDA_ERROR_ILLEGAL_ADDRESS" if label == "oob" else "verification:"
            result.update(checked(out, expect))
        return result
    return {"error": f"no Triton kernel (of {tries} tried) where the {label} bug shows"}


def step_offbyone(ctx: dict) -> dict:
    return planted(ctx, "offbyone", off_by_one, ["--fails-verify", *ctx["bound"]], list(ctx["kernels"]))


def step_oob(ctx: dict) -> dict:
    test = ["--faults=CUDA_ERROR_ILLEGAL_ADDRESS", *ctx["bound"]]
    return planted(ctx, "oob", far_load, test, list(reversed(ctx["kernels"])))


def step_command(ctx: dict) -> dict:
    kernels = ctx["kernels"]
    name = next(iter(kernels.values()))[0] if kernels else "gemm"
    grep = f"{PY} -m replayfmt_tools.dump_replay {{}} | grep -q 'launch  *{name} ' && exit 1; exit 0"
    out = ctx["work"] / "command.kreplay"
    _res, result = reduce(ctx["step"], out, ctx["devices"], "--command", grep, *ctx["bound"])
    if out.exists():
        result["result_verify_exit"] = tool("run_replay", "--verify", str(out)).returncode
    return {"kernel": name, **result}


def step_jit(ctx: dict) -> dict:
    work, out = ctx["work"], {}
    softmax = work / "softmax.kreplay"
    script = ROOT / "tests" / "gpu" / "capture_scripts" / "triton_softmax_repeated.py"
    # kernel mode, the Triton kernel: torch.randn's kernels, which make its input, carry no PTX
    capture(softmax, ["--mode=kernel", "--kernels=softmax_kernel"], script, "3")
    triton_step = work / "triton_step.kreplay"
    options = ["--mode=kernel", "--kernels=^triton_", "--max-per-kernel=0"]
    capture(triton_step, options, ctx["program"], str(ctx["layers"]))
    for label, path in (("triton_program", softmax), ("pytorch_step_triton_kernels", triton_step)):
        jit = tool("run_replay", "--jit-from-ptx", "--verify", str(path))
        out[label] = {"exit": jit.returncode, "tail": tail(jit, 2), **runs_on(path)}
        say(f"--jit-from-ptx --verify {label}: exit {jit.returncode}\n{tail(jit, 2)}")
    whole = tool("run_replay", "--jit-from-ptx", "--dry-run", str(ctx["step"]))
    out["whole_step_refused"] = {"exit": whole.returncode, "tail": tail(whole, 1)}
    say(f"--jit-from-ptx on the whole step: {tail(whole, 1)}")
    return out


def step_verify(ctx: dict) -> dict:
    """run-replay --verify of the step (under cProfile with --profile-verify: the top of it printed)."""
    if not ctx["profile"]:
        res = tool("run_replay", "--verify", str(ctx["step"]))
        return {"exit": res.returncode, "tail": tail(res, 1)}
    prof = ctx["work"] / "verify.prof"
    # not python -m cProfile, which swallows the exit status
    code = (
        "import cProfile, sys\n"
        "from replayfmt_tools.run_replay import main\n"
        "profile, status = cProfile.Profile(), 0\n"
        "try:\n"
        "    profile.runcall(main, sys.argv[2:])\n"
        "except SystemExit as exc:\n"
        "    status = exc.code\n"
        "profile.dump_stats(sys.argv[1])\n"
        "sys.exit(status)\n"
    )
    res = run([PY, "-c", code, str(prof), "--verify", str(ctx["step"])])
    import io
    import pstats

    text = io.StringIO()
    stats = pstats.Stats(str(prof), stream=text)
    stats.sort_stats("cumulative").print_stats(30)
    stats.sort_stats("tottime").print_stats(20)
    say(text.getvalue())
    return {"exit": res.returncode, "tail": tail(res, 1), "profile": str(prof)}


STEPS = {
    "verify": step_verify,
    "offbyone": step_offbyone,
    "oob": step_oob,
    "command": step_command,
    "jit": step_jit,
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/reduce_demo"))
    ap.add_argument("--device", action="append", default=[], help="cuda:N to test candidates on (repeatable)")
    ap.add_argument("--layers", type=int, default=5)
    ap.add_argument("--steps", default=",".join(["capture", *STEPS]), help="which steps (the capture is reused)")
    ap.add_argument("--max-seconds", type=float, default=0, help="bound each reduction (0: none)")
    ap.add_argument("--jobs", type=int, default=len(STEPS), help="steps after the capture run at once")
    ap.add_argument("--profile-verify", action="store_true", help="the verify step under cProfile")
    args = ap.parse_args()
    steps = args.steps.split(",")
    if set(steps) - {"capture", *STEPS}:
        ap.error(f"--steps: unknown {', '.join(sorted(set(steps) - {'capture', *STEPS}))}")
    work: Path = args.work
    work.mkdir(parents=True, exist_ok=True)
    summary_path = work / "summary.json"
    summary: dict = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    ctx = {
        "work": work,
        "step": work / "step.kreplay",
        "program": work / "model_step.py",
        "layers": args.layers,
        "devices": args.device or ["cuda:0"],
        # a hung candidate is cut off (it counts as passing) rather than outliving a killed demo: its
        # child runs in a session of its own
        "bound": [f"--max-seconds={args.max_seconds:g}", f"--timeout={max(120.0, args.max_seconds):g}"]
        if args.max_seconds
        else [],
        "profile": args.profile_verify,
    }
    started = time.monotonic()
    if "capture" in steps or not ctx["step"].exists():
        ctx["program"].write_text(MODEL)
        cap = capture(ctx["step"], ["--mode=kernel", "--max-per-kernel=0"], ctx["program"], str(args.layers))
        if cap.returncode != 0:
            say(tail(cap, 30))
            return 1
        summary["step"] = runs_on(ctx["step"])
        summary["capture_seconds"] = round(time.monotonic() - started, 1)
        say(f"step capture: {summary['step']}")
    ctx["kernels"] = kernel_ptx(ctx["step"])
    summary["triton_executables"] = {eid: name for eid, (name, _) in ctx["kernels"].items()}
    lock = threading.Lock()

    def save() -> None:  # after each step, so a run cut off by a timeout leaves what it finished
        with lock:
            summary["seconds"] = round(time.monotonic() - started, 1)
            summary_path.write_text(json.dumps(summary, indent=2) + "\n")

    def one(name: str) -> None:
        _LABEL.name = name
        begun = time.monotonic()
        try:
            result = STEPS[name](ctx)
        except Exception as exc:  # one step's failure is reported, the others go on
            result = {"error": f"{type(exc).__name__}: {exc}"}
        result["step_seconds"] = round(time.monotonic() - begun, 1)
        summary[name] = result
        say(f"{name}: {json.dumps(result)}")
        save()

    save()
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        list(pool.map(one, [s for s in STEPS if s in steps]))
    save()
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
