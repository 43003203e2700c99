"""reduce-replay and --jit-from-ptx on a real program, on the GPU machine.

    python3 benchmarks/reduce_demo.py [--work DIR] [--device cuda:0 ...] [--layers 8]
        [--steps capture,offbyone,oob,command,jit] [--max-seconds S]

(each step can run in a call of its own: the capture in DIR is reused, DIR/summary.json gathers)

1. A torch.compile'd MLP training step (forward, backward, SGD: a few hundred launches of Triton
   and cuBLAS kernels) is captured in kernel mode (every launch its own region, with its state and
   checkpoint), and replayed with --verify.
2. Off-by-one: one Triton kernel's PTX (kept in the capture, else found in Triton's cache) gets its
   bounds check ``setp.lt.s32 ..., N`` changed to ``N-1``, built with ptxas (JIT-compiled PTX where
   ptxas refuses it); the first kernel whose planted build fails verification is reduced with
   ``reduce-replay --fails-verify``; the result is checked to fail the same way with the
   substitution and to verify without it.
3. Out-of-bounds read: a kernel's first global load is moved 1 TiB away; reduced with
   ``--faults=CUDA_ERROR_ILLEGAL_ADDRESS``.
4. ``--command``: a script grepping dump-replay's output for a kernel name.
5. ``run-replay --jit-from-ptx --verify`` on a Triton program's capture and on the step's, and
   dump-replay's "runs on" line and executables without PTX for both.

Prints, per reduction, launches before and after, replays tried and time; writes DIR/summary.json.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import replayfmt

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable

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


def run(args: list[str], timeout: int = 1800) -> subprocess.CompletedProcess:
    started = time.monotonic()
    res = subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    print(f"$ {' '.join(args)}  [exit {res.returncode}, {time.monotonic() - started:.1f} s]", flush=True)
    return res


def tool(name: str, *args: str, timeout: int = 1800) -> subprocess.CompletedProcess:
    return run([PY, "-m", f"replayfmt_tools.{name}", *args], timeout=timeout)


def tail(res: subprocess.CompletedProcess, n: int = 12) -> str:
    return "\n".join((res.stdout + res.stderr).strip().splitlines()[-n:])


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in tool("dump_replay", "--format=jsonl", str(path)).stdout.splitlines()]


def runs_on(path: Path) -> dict:
    summary = next(r for r in rows(path) if r["kind"] == "summary")
    return {k: summary.get(k) for k in ("runs_on", "executables_without_ptx", "operations")}


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


def build(ptx: bytes, work: Path, stem: str, arch: str) -> tuple[Path, str]:
    """(the file, its --executable-substitution format): a cubin from ptxas, else the PTX itself."""
    src = work / f"{stem}.ptx"
    src.write_bytes(ptx.rstrip(b"\0") + b"\n")
    ptxas = shutil.which("ptxas") or "/usr/local/cuda/bin/ptxas"
    cubin = work / f"{stem}.cubin"
    res = run([ptxas, f"-arch={arch}", "-o", str(cubin), str(src)])
    return (cubin, "cubin") if res.returncode == 0 else (src, "ptx")


def off_by_one(ptx: bytes) -> bytes | None:
    """The first bounds check ``i < n`` (``setp.lt.s32`` or its negation ``setp.ge.s32``) made
    ``i < n - 1``: the last element is left unwritten (or unread)."""
    found = re.search(rb"setp\.(lt|ge)\.s32\s+(%p\d+),\s*(%r\d+),\s*(%r\d+|\d+);", ptx)
    if found is None:
        return None
    op, pred, index, bound = found[1], found[2], found[3], found[4]
    if bound.isdigit():
        if int(bound) < 2:
            return None
        line = b"setp." + op + b".s32 " + pred + b", " + index + b", " + str(int(bound) - 1).encode() + b";"
    else:
        line = b"{ .reg .s32 %obo; add.s32 %obo, " + bound + b", -1; setp." + op + b".s32 " + pred + b", "
        line += index + b", %obo; }"
    return ptx[: found.start()] + line + ptx[found.end() :]


def far_load(ptx: bytes) -> bytes | None:
    found = re.search(rb"^(\s*)(@!?%p\d+\s+)?ld\.global[^\[]*\[\s*(%rd\d+)", ptx, re.M)
    if found is None:
        return None
    reg = found[3]
    line = found[1] + b"add.s64 " + reg + b", " + reg + b", 1099511627776;\n"
    return ptx[: found.start()] + line + ptx[found.start() :]


def report(res: subprocess.CompletedProcess) -> dict:
    lines = {line.split()[0]: line for line in res.stdout.splitlines() if line.strip()}
    return {k: lines.get(k, "") for k in ("operations", "bytes", "replays", "time", "kept", "stopped", "verdict")}


def reduce(step: Path, out: Path, devices: list[str], *test: str) -> dict:
    dev = [f"--device={d}" for d in devices]
    res = tool("reduce_replay", str(step), "-o", str(out), "--overwrite", "--quiet", *dev, *test)
    print(tail(res, 10))
    return {"exit": res.returncode, **report(res)}


def planted(step: Path, work: Path, arch: str, kernels: dict, make, devices: list[str], label: str, test: list[str]):
    """Plant a bug with ``make`` in the first kernel where it shows, then reduce under ``test``."""
    for eid, (name, ptx) in kernels.items():
        changed = make(ptx)
        if changed is None:
            continue
        path, fmt = build(changed, work, f"{label}_{eid}", arch)
        sub = f"--executable-substitution={eid}@{fmt}={path}"
        check = tool("run_replay", "--verify" if label == "offbyone" else "--no-payload-checks", sub, str(step))
        if check.returncode == 0:
            print(f"{label}: planting into {name} (executable {eid}) does not show; next kernel")
            continue
        print(f"{label}: planted into {name} (executable {eid}): {tail(check, 2)}")
        out = work / f"{label}.kreplay"
        result = {"kernel": name, "executable": eid, **reduce(step, out, devices, *test, sub)}
        with replayfmt.open(out) as cap:
            props = dict(cap.metadata.properties)
        mapped = props.get("reduce.result_substitutions", "")
        subs = [f"--executable-substitution={mapped}"] if mapped else []
        again = tool("run_replay", "--verify", *subs, str(out))
        plain = tool("run_replay", "--verify", str(out))
        result["result_with_substitution_exit"] = again.returncode
        result["result_without_substitution_exit"] = plain.returncode
        result["result_without_substitution"] = tail(plain, 1)
        return result
    return {"error": f"no Triton kernel where the {label} bug shows"}


STEPS = ("capture", "offbyone", "oob", "command", "jit")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/reduce_demo"))
    ap.add_argument("--device", action="append", default=[], help="cuda:N to test candidates on (repeatable)")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--steps", default=",".join(STEPS), help=f"which of {','.join(STEPS)} (the capture is reused)")
    ap.add_argument("--max-seconds", type=float, default=0, help="bound each reduction (0: none)")
    args = ap.parse_args()
    steps = set(args.steps.split(","))
    if steps - set(STEPS):
        ap.error(f"--steps: unknown {', '.join(sorted(steps - set(STEPS)))}")
    work: Path = args.work
    work.mkdir(parents=True, exist_ok=True)
    devices = args.device or ["cuda:0"]
    bound = [f"--max-seconds={args.max_seconds:g}"] if args.max_seconds else []
    from replayfmt.cuda.driver import check, compute_capability, driver

    major, minor = compute_capability(check(driver().cuDeviceGet(0), "cuDeviceGet"))
    arch = f"sm_{major}{minor}"
    summary_path = work / "summary.json"
    summary: dict = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    summary.update(arch=arch, devices=devices)

    step = work / "step.kreplay"
    if "capture" in steps or not step.exists():
        program = work / "model_step.py"
        program.write_text(MODEL)
        cap = run([PY, "-m", "replayfmt.capture", "--overwrite", "--mode=kernel", "--max-per-kernel=0", "-o",
                   str(step), str(program), str(args.layers)])  # fmt: skip
        if cap.returncode != 0:
            print(tail(cap, 30))
            return 1
        summary["step"] = runs_on(step)
        print(f"step capture: {summary['step']}")
        verify = tool("run_replay", "--verify", str(step))
        summary["step_verify_exit"] = verify.returncode
        print(tail(verify, 3))

    kernels = kernel_ptx(step)
    summary["triton_executables"] = len(kernels)
    if "offbyone" in steps:
        test = ["--fails-verify", *bound]
        summary["fails_verify"] = planted(step, work, arch, kernels, off_by_one, devices, "offbyone", test)
        print(f"fails-verify: {summary['fails_verify']}")
    if "oob" in steps:
        test = ["--faults=CUDA_ERROR_ILLEGAL_ADDRESS", *bound]
        summary["faults"] = planted(step, work, arch, kernels, far_load, devices, "oob", test)
        print(f"faults: {summary['faults']}")
    if "command" in steps:
        name = next(iter(kernels.values()))[0] if kernels else "gemm"
        grep = f"{PY} -m replayfmt_tools.dump_replay {{}} | grep -q 'launch *{name}' && exit 1; exit 0"
        result = reduce(step, work / "command.kreplay", devices, "--command", grep, *bound)
        summary["command"] = {"kernel": name, **result}
        print(f"command: {summary['command']}")
    if "jit" in steps:
        softmax = work / "softmax.kreplay"
        script = ROOT / "tests" / "gpu" / "capture_scripts" / "triton_softmax_repeated.py"
        run([PY, "-m", "replayfmt.capture", "--overwrite", "-o", str(softmax), str(script), "3"])
        for label, path in (("triton", softmax), ("pytorch_step", step)):
            jit = tool("run_replay", "--jit-from-ptx", "--verify", str(path))
            summary[f"jit_from_ptx_{label}"] = {"exit": jit.returncode, "tail": tail(jit, 4), **runs_on(path)}
            print(f"--jit-from-ptx --verify {label}: exit {jit.returncode}\n{tail(jit, 4)}")
    summary_path.write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
