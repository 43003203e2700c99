"""The playbook (`--agents-md`) runs as written: every fenced command and snippet that needs no GPU
is executed, in order, in a scratch directory beside the repository's examples/; the flags of
those that need one are parsed by the tool itself (run-replay: executed with --dry-run)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from replayfmt_tools import benchmark_replay, capture_replay, dump_replay, run_replay, tune_replay
from replayfmt_tools.playbook import SHARED, TOOLS, playbook

ROOT = Path(__file__).resolve().parent.parent
GPU_ONLY = {
    "benchmark-replay": benchmark_replay.main,
    "tune-replay": tune_replay.main,
    "capture-replay": capture_replay.main,
    "python -m replayfmt.capture": capture_replay.main,
}
IN_PROCESS = {"dump-replay": dump_replay.main, "run-replay": run_replay.main}
FAKE_NVCC = """#!{python}
\"\"\"nvcc where none is installed: the checked-in cubin of the source and -arch given (a CPU test
runs the docs' nvcc lines for what they make; tests/fixtures/cubins holds what nvcc made).\"\"\"
import sys
from pathlib import Path

sys.path.insert(0, {tests!r})
from samples import _fixture

args = sys.argv[1:]
arch = next(a.split("=", 1)[1] for a in args if a.startswith("-arch="))
source = Path(next(a for a in args if a.endswith(".cu"))).resolve()
data = _fixture(source, arch) if "-cubin" in args else None
if data is None:
    sys.exit(f"nvcc (test stand-in): no checked-in cubin of {{source}} for {{arch}}")
Path(args[args.index("-o") + 1]).write_bytes(data)
"""


def nvcc_on_path(tmp_path: Path, monkeypatch) -> None:
    """Where nvcc is missing, a stand-in that serves the checked-in fixtures goes on PATH."""
    if shutil.which("nvcc") is not None:
        return
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir()
    nvcc = bin_dir / "nvcc"
    nvcc.write_text(FAKE_NVCC.format(python=sys.executable, tests=str(Path(__file__).parent)))
    nvcc.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")


def blocks(text: str = "") -> list[tuple[str, str]]:
    """(language, body) of every fenced block of ``text`` (default: the shared page and each tool's
    notes), in order."""
    text = text or SHARED + "".join(TOOLS.values())
    return re.findall(r"^```(\w+)\n(.*?)^```", text, flags=re.S | re.M)


def commands(body: str) -> list[str]:
    """Shell lines of a block: continuations joined, comments dropped."""
    out = []
    for line in body.replace("\\\n", " ").splitlines():
        line = line.split("  # ")[0].strip()
        if line and not line.startswith("#"):
            out.append(line)
    return out


def test_playbook_is_complete_and_current():
    tools = ("capture-replay", "dump-replay", "run-replay", "benchmark-replay", "tune-replay")
    for tool in (*tools, "extract-replay", "diff-replay"):
        assert f"`{tool}`" in SHARED and tool in TOOLS and playbook(tool).startswith(SHARED)
    assert "still to come" not in SHARED + "".join(TOOLS.values())
    assert "examples/make_saxpy_capture.py" in SHARED
    assert "> base.json" not in SHARED.replace("`> base.json`", "")  # --output, never a shell redirect
    assert {lang for lang, _ in blocks()} == {"sh", "python"}


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # the tools of this venv
    return env


def test_every_command_and_snippet_runs_as_written(tmp_path, monkeypatch):
    ran, parsed, skipped = run_blocks(blocks(), tmp_path, monkeypatch)
    assert ran >= 20 and parsed >= 8, (ran, parsed, skipped)
    if skipped:
        pytest.skip(f"ran {ran}, parsed {parsed}; skipped (missing programs): {skipped}")  # the rest passed


def test_readme_commands_run_as_written(tmp_path, monkeypatch):
    readme = (ROOT / "README.md").read_text()
    ran, parsed, skipped = run_blocks(blocks(readme), tmp_path, monkeypatch)
    assert ran >= 8 and parsed >= 5, (ran, parsed, skipped)
    if skipped:
        pytest.skip(f"ran {ran}, parsed {parsed}; skipped (missing programs): {skipped}")


def run_blocks(found: list[tuple[str, str]], tmp_path: Path, monkeypatch) -> tuple[int, int, list[str]]:
    """Run (or, for GPU-only tools, parse) every command and snippet; (ran, parsed, skipped)."""
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    nvcc_on_path(tmp_path, monkeypatch)
    ran, parsed, skipped = 0, 0, []
    gpu_made: set[str] = set()  # files that GPU-only commands would write
    for lang, body in found:
        if lang == "python":
            script = tmp_path / "snippet.py"
            script.write_text(body)
            done = subprocess.run(
                [sys.executable, str(script)], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=120
            )
            assert done.returncode == 0, f"snippet failed:\n{body}\n{done.stderr}"
            ran += 1
            continue
        for command in commands(body):
            if command.startswith(("pip ", "python -m pytest")):
                continue  # installing, and this suite itself, are its own preconditions
            tool = next((t for t in GPU_ONLY if command.startswith(t + " ")), None)
            if tool is None and command.startswith("run-replay ") and any(o in command for o in gpu_made):
                tool = "run-replay"  # its input is made on a GPU (by a capture above)
            if tool is not None:  # needs a GPU: let the tool parse and check every flag
                args = shlex.split(command[len(tool) :])
                context = {**GPU_ONLY, "run-replay": run_replay.main}[tool].make_context(tool, args)
                if context.params.get("output"):
                    gpu_made.add(str(context.params["output"]))
                parsed += 1
                continue
            if command.startswith("run-replay ") and "--dry-run" not in command:
                command = command.replace("run-replay ", "run-replay --dry-run ", 1)
            tokens = shlex.split(command)
            if "|" in tokens:  # a pipeline into another program
                programs = [tokens[0]] + [tokens[i + 1] for i, t in enumerate(tokens) if t == "|"]
                if not all(shutil.which(p, path=_env()["PATH"]) for p in programs):
                    skipped.append(command)
                    continue
                argv = ["bash", "-o", "pipefail", "-c", command]
            elif tokens[0] in IN_PROCESS:  # the tool itself, without a process start per line
                monkeypatch.chdir(tmp_path)
                result = CliRunner().invoke(IN_PROCESS[tokens[0]], tokens[1:])
                assert result.exit_code == 0, f"{command}\nexit {result.exit_code}: {result.stderr}"
                assert result.exception is None or isinstance(result.exception, SystemExit), command
                ran += 1
                continue
            else:
                argv = tokens
            done = subprocess.run(argv, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, f"{command}\nexit {done.returncode}: {done.stderr}"
            assert "Traceback" not in done.stderr
            ran += 1
    return ran, parsed, skipped


def test_payload_recipe_writes_files(tmp_path):
    """The playbook's payload recipe writes one file per payload (it used to exit 0 writing nothing)."""
    shutil.copy(ROOT / "examples" / "saxpy.kreplay", tmp_path / "cap.kreplay")
    recipe = next(c for _, b in blocks() for c in commands(b) if "--payloads=files:" in c)
    done = subprocess.run(shlex.split(recipe), cwd=tmp_path, env=_env(), capture_output=True, text=True)
    written = sorted(p.name for p in (tmp_path / "payloads").iterdir())
    assert done.returncode == 0 and len(written) == 2 and all(re.fullmatch(r"[0-9a-f]{32}\.bin", n) for n in written)


def test_the_tools_print_it():
    done = subprocess.run(
        [sys.executable, "-m", "replayfmt_tools.dump_replay", "--agents-md"], capture_output=True, text=True, env=_env()
    )
    assert done.returncode == 0 and done.stdout.startswith("# replayfmt playbook")
    assert dump_replay.main.name and run_replay.main.name  # imported above: every tool module loads without a GPU
