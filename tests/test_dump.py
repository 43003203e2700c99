"""dump-replay: goldens, filters, jq, payload export, pipes and damaged files."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from samples import write_sample

import replayfmt
from replayfmt.dump import Dumper, DumpFilter, summarize
from replayfmt.format import model as m
from replayfmt.replay.replayable import plan_verdict
from replayfmt_tools.dump_replay import main

GOLDEN = Path(__file__).parent / "golden"
ROOT = Path(__file__).resolve().parent.parent
UPDATE = os.environ.get("UPDATE_GOLDENS") == "1"


def dump(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def normalized(text: str, path: Path) -> str:
    """Goldens must not depend on the zstd build: payloads are stored raw (see golden_capture)
    and the file's own size, which includes compressed record batches, is masked."""
    return text.replace(str(path), "<capture>").replace(f'"size":{path.stat().st_size},', '"size":"<size>",', 1)


@pytest.fixture
def golden_capture(tmp_path) -> Path:
    path = tmp_path / "golden.kreplay"
    write_sample(path, n=64, threads=0, compression=replayfmt.CompressionPolicy(min_saving=1.0))
    return path


@pytest.mark.parametrize(
    ("fmt", "golden"), [("text", "sample.txt"), ("jsonl", "sample.jsonl"), ("json", "sample.json")]
)
def test_golden_output(golden_capture, fmt, golden):
    code, out, err = dump(f"--format={fmt}", str(golden_capture))
    assert code == 0, err
    text = normalized(out, golden_capture)
    if UPDATE:
        (GOLDEN / golden).write_text(text)
    assert text == (GOLDEN / golden).read_text()


def test_every_jsonl_line_parses_with_stable_leading_rows(sample):
    code, out, _ = dump("--format=jsonl", str(sample))
    rows = [json.loads(line) for line in out.splitlines()]
    assert code == 0
    assert (
        rows[0]["kind"] == "file"
        and rows[0]["format_version"] == f"1.{replayfmt.FORMAT_MINOR}"
        and rows[0]["jsonl_version"] == 6
    )
    assert rows[1]["kind"] == "summary" and rows[1]["replayable"] is False
    with replayfmt.open(sample) as cap:
        assert len(rows) == 2 + cap.operation_count + cap.object_count
    launch = next(r for r in rows if r["kind"] == "launch")
    assert launch["function"] == "saxpy" and launch["grid"] == [4, 1, 1]
    assert launch["parameters"]["a"] == 2.0 and launch["parameters"]["n"] == 1024
    assert launch["parameters"]["x"] == {"buffer": 5, "offset": 0}


def test_fast_rows_equal_the_dict_rows(sample):
    """The f-string fast paths render exactly what json.dumps of operation_row would."""
    with replayfmt.open(sample) as cap:
        dumper = Dumper(cap)
        for op in cap:
            if op.kind == m.OperationKind.LAUNCH:
                continue
            assert json.loads(dumper.operation_json(op)) == json.loads(json.dumps(dumper.operation_row(op)))
            assert list(json.loads(dumper.operation_json(op))) == list(dumper.operation_row(op))


def test_jq_runs_in_process(sample):
    code, out, _ = dump("--jq", 'select(.kind=="launch") | .function', str(sample))
    assert code == 0 and out == '"saxpy"\n'


def test_jq_through_the_real_binary_if_present(sample):
    import shutil

    if shutil.which("jq") is None:
        pytest.skip("no jq binary")
    dumped = subprocess.run(
        [sys.executable, "-m", "replayfmt_tools.dump_replay", "--format=jsonl", str(sample)],
        capture_output=True,
        check=True,
    )
    out = subprocess.run(["jq", "-c", 'select(.kind=="launch")'], input=dumped.stdout, capture_output=True, check=True)
    assert json.loads(out.stdout)["function"] == "saxpy"


def test_bad_jq_program_is_a_usage_error(sample):
    code, _, err = dump("--jq", "select(", str(sample))
    # the message, then jq's program and caret lines saying where (issue 17: the caret was lost)
    lines = err.splitlines()
    assert code == 2 and lines[0].startswith("dump-replay: error: --jq: syntax error") and len(lines) == 3
    assert lines[1].strip() == "select(" and lines[2].strip() == "^"


@pytest.mark.parametrize(
    ("args", "kinds"),
    [
        (["--kind=launch"], {"launch"}),
        (["--kind=copy"], {"copy_h2d", "copy_d2h", "copy_d2d"}),
        (["--kind=buffer,scope_begin"], {"buffer", "scope_begin"}),
        (["--grep=^saxpy$"], {"launch", "executable", "create", "graph_launch"}),
        (
            ["--object=6"],
            {"buffer", "create", "copy_h2d", "memset", "launch", "copy_d2d", "checkpoint", "copy_d2h", "collective"},
        ),
    ],
)
def test_filters(sample, args, kinds):
    code, out, _ = dump("--format=jsonl", *args, str(sample))
    rows = [json.loads(line) for line in out.splitlines()[2:]]
    assert code == 0 and {r["kind"] for r in rows} == kinds


def test_ops_range(sample):
    code, out, _ = dump("--format=jsonl", "--ops=10:14", str(sample))
    indices = [json.loads(line).get("index") for line in out.splitlines()[2:]]
    assert code == 0 and indices == [10, 11, 12, 13]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--kind=lunch"], "unknown kind(s) lunch"),
        (["--ops=5:2"], "START must be >= 0 and END >= START"),
        (["--ops=a:b"], "expected START:END"),
        (["--grep=("], "invalid regular expression"),
        (["--payloads=files"], "files needs a directory"),
        (["--payloads=gzip"], "expected none, hex, base64 or files:DIR"),
    ],
)
def test_bad_flags_are_one_line_usage_errors(sample, args, message):
    code, _, err = dump(*args, str(sample))
    assert code == 2 and message in err and "Traceback" not in err


def test_payload_export_modes(sample, tmp_path):
    code, out, _ = dump("--format=jsonl", "--kind=copy_h2d", "--payloads=hex", str(sample))
    hex_row = json.loads(out.splitlines()[2])
    code, out, _ = dump("--format=jsonl", "--kind=copy_h2d", "--payloads=base64", str(sample))
    b64_row = json.loads(out.splitlines()[2])
    import base64

    assert bytes.fromhex(hex_row["payload"]["data"]) == base64.b64decode(b64_row["payload"]["data"])
    out_dir = tmp_path / "payloads"
    code, out, _ = dump("--format=jsonl", "--kind=copy_h2d", f"--payloads=files:{out_dir}", str(sample))
    row = json.loads(out.splitlines()[2])
    written = Path(row["payload"]["file"])
    assert code == 0 and written.parent == out_dir and written.name == row["payload"]["hash"] + ".bin"
    assert written.read_bytes() == bytes.fromhex(hex_row["payload"]["data"])
    assert np.frombuffer(written.read_bytes(), np.float32).shape == (1024,)


def test_closed_pipe_ends_quietly(tmp_path):
    path = tmp_path / "big.kreplay"
    with replayfmt.CaptureWriter(path) as w:
        exe = w.add_object(m.Executable(functions=(m.Function(name="k"),)))
        for i in range(30_000):
            w.launch(executable=exe, function=0, grid=(i, 1, 1), block=(1, 1, 1))
    shell = f"{sys.executable} -m replayfmt_tools.dump_replay --format=jsonl {path} | head -n 3"
    result = subprocess.run(["bash", "-o", "pipefail", "-c", shell], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stderr == "" and len(result.stdout.splitlines()) == 3


def test_truncated_file_prints_what_it_can_then_fails(sample):
    data = sample.read_bytes()
    sample.write_bytes(data[: len(data) - 40])
    code, out, err = dump("--format=jsonl", str(sample))
    rows = [json.loads(line) for line in out.splitlines()]
    assert code == 1 and rows[1]["recovered"] is True and len(rows) > 10
    assert err.count("\n") == 1 and "was recovered" in err and "bytes at its end" in err


def test_damaged_batch_prints_what_it_can_then_one_error_line(tmp_path):
    path = tmp_path / "damaged.kreplay"
    with replayfmt.CaptureWriter(path, batch_operations=10, threads=0) as w:
        for i in range(40):
            w.scope_begin(f"s{i}")
    with replayfmt.open(path) as cap:
        offset = cap.directory.batch_offsets[2]
    data = bytearray(path.read_bytes())
    data[offset + 64 + 20] ^= 0xFF  # a body byte of the third batch
    path.write_bytes(bytes(data))
    code, out, err = dump("--format=jsonl", str(path))
    rows = [json.loads(line) for line in out.splitlines()]
    assert code == 1 and [r["name"] for r in rows[2:]] == [f"s{i}" for i in range(20)]
    assert rows[1]["damaged"] and err.count("\n") == 1 and f"offset {offset}" in err


@pytest.mark.parametrize("what", ["missing", "directory", "not_kreplay"])
def test_unreadable_inputs_give_one_line(tmp_path, what):
    path = {"missing": tmp_path / "nope.kreplay", "directory": tmp_path, "not_kreplay": tmp_path / "x.txt"}[what]
    if what == "not_kreplay":
        path.write_text("just text, definitely not a capture file")
    code, out, err = dump(str(path))
    assert code == 2 and out == "" and err.count("\n") == 1 and "Traceback" not in err


def test_summary_reports_verdicts(tmp_path):
    path = tmp_path / "v.kreplay"
    with replayfmt.CaptureWriter(path) as w:
        w.add_object(m.FileReference(path="/models/w.safetensors", policy=m.FilePolicy.FAIL))
        w.scope_begin("outer")
        w.scope_end("inner")
    with replayfmt.open(path) as cap:
        assert summarize(cap).replayable is None  # the summary alone judges nothing
        verdict = plan_verdict(cap)
        s = summarize(cap, problems=verdict.problems, warnings=verdict.warnings)
    assert not s.replayable and s.not_replayable_because == verdict.problems
    assert any("policy fail" in r for r in s.not_replayable_because)
    assert any("matches no open scope" in r for r in s.warnings)
    assert any("never closed" in r for r in s.warnings)
    assert s.files == {"fail/identity": 1}


def test_summary_flag_prints_only_the_summary(sample):
    code, out, _ = dump("--summary", str(sample))
    assert code == 0 and "replayable" in out and "op " not in out


def test_agents_md_is_shared_plus_tool_notes():
    code, out, _ = dump("--agents-md")
    assert code == 0 and out.startswith("# replayfmt playbook") and "## dump-replay notes" in out
    assert "failure contract" in out.lower()


def test_help_runs_as_a_module():
    result = subprocess.run(
        [sys.executable, "-m", "replayfmt_tools.dump_replay", "--help"], capture_output=True, text=True
    )
    assert result.returncode == 0 and "--jq" in result.stdout and "Exit status" in result.stdout


def test_quick_start_example_dumps():
    example = ROOT / "examples" / "saxpy.kreplay"
    code, out, _ = dump(str(example))
    assert code == 0 and "replayable    yes (strict)" in out and re.search(r"launch\s+saxpy", out)


def test_dump_filter_parse_alone():
    f = DumpFilter.parse(ops="5:", kinds="copy")
    assert (f.start, f.stop) == (5, None) and "copy_d2d" in f.kinds
