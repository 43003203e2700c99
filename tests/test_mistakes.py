"""User mistakes, every command: each ends with exit 1 or 2 and one error line, never a traceback.

Each command runs through click's CliRunner (the same process: an escaped exception is the
runner's ``exception``), and a few through a subprocess (the installed console scripts, as a user
types them). The captures are the example capture, a copy with one payload byte flipped, and a
truncated copy: the damaged ones must never be called replayable or the same."""

from __future__ import annotations

import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import replayfmt
from replayfmt.format.layout import CHUNK_HEADER_SIZE
from replayfmt_tools.benchmark_replay import main as benchmark_main
from replayfmt_tools.capture_replay import main as capture_main
from replayfmt_tools.corpus_replay import main as corpus_main
from replayfmt_tools.diff_replay import main as diff_main
from replayfmt_tools.dump_replay import main as dump_main
from replayfmt_tools.extract_replay import main as extract_main
from replayfmt_tools.run_replay import main as run_main
from replayfmt_tools.tune_replay import main as tune_main

EXAMPLE = Path(__file__).parent.parent / "examples" / "saxpy.kreplay"
COMMANDS = {
    "dump": dump_main,
    "run": run_main,
    "diff": diff_main,
    "corpus": corpus_main,
    "extract": extract_main,
    "benchmark": benchmark_main,
    "tune": tune_main,
    "capture": capture_main,
}


def flipped_payload(path: Path) -> tuple[int, int]:
    """Copy the example to ``path`` with one byte flipped inside payload 2's first frame;
    (payload id, frame chunk offset)."""
    data = bytearray(EXAMPLE.read_bytes())
    with replayfmt.open(EXAMPLE) as cap:
        offset = cap.frame_location(cap.payload(2).frames[0])[0]
    data[offset + CHUNK_HEADER_SIZE + 100] ^= 0x01
    path.write_bytes(bytes(data))
    return 2, offset


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("mistakes")
    good = d / "good.kreplay"
    shutil.copy(EXAMPLE, good)
    flipped_payload(d / "flip.kreplay")
    (d / "trunc.kreplay").write_bytes(EXAMPLE.read_bytes()[:-300])
    (d / "notes.txt").write_text("capture notes\nnothing here is a CSV of runs\n")
    (d / "binary.dat").write_bytes(bytes(range(256)) * 4)
    (d / "ok.csv").write_text("capture,verdict,operations,ranges,device_ms,host_s,worker,error\n")
    corpus = d / "corpus"
    corpus.mkdir()
    shutil.copy(EXAMPLE, corpus / "good.kreplay")
    (d / "empty").mkdir()
    return {
        "good": good,
        "flip": d / "flip.kreplay",
        "trunc": d / "trunc.kreplay",
        "notes": d / "notes.txt",
        "binary": d / "binary.dat",
        "corpus": corpus,
        "empty": d / "empty",
        "missing": d / "missing.kreplay",
        "dir": d,
    }


# (command, arguments with {name} for the files above): each a mistake a user makes
MISTAKES: list[tuple[str, str]] = [
    ("dump", "{missing}"),
    ("dump", "{notes}"),
    ("dump", "{binary}"),
    ("dump", "{empty}"),
    ("dump", "--ops 5:x {good}"),
    ("dump", "--ops 9:2 {good}"),
    ("dump", "--kind nothing {good}"),
    ("dump", "--object 999 {good}"),
    ("dump", "--grep ( {good}"),
    ("dump", "--jq bad( {good}"),
    ("dump", "--payloads=bogus {good}"),
    ("dump", "--payloads=files: {good}"),
    ("dump", "--payloads=hex {good}"),
    ("dump", "--format=json --summary {good}"),
    ("dump", "--format=jsonl --payloads=hex {flip}"),
    ("run", "{missing}"),
    ("run", "--dry-run {binary}"),
    ("run", "--dry-run {flip}"),
    ("run", "--dry-run --device cuda:x {good}"),
    ("run", "--dry-run --device cuda:0 --device 0 {good}"),
    ("run", "--dry-run --device cuda:0 --device cuda:1 {good}"),
    ("run", "--dry-run --launch 9 {good}"),
    ("run", "--dry-run --launch 9:grid=0 {good}"),
    ("run", "--dry-run --launch 9:smem=99999999 {good}"),
    ("run", "--dry-run --launch 9:block=4096 {good}"),
    ("run", "--dry-run --launch 999:grid=1 {good}"),
    ("run", "--dry-run --launch 2:grid=1 {good}"),
    ("run", "--dry-run --launch 9:grid=1 --launch 9:skip {good}"),
    ("run", "--dry-run --executable-substitution x=1 {good}"),
    ("run", "--dry-run --executable-substitution 5={missing} {good}"),
    ("run", "--dry-run --executable-substitution 5={notes} {good}"),
    ("run", "--dry-run --executable-substitution 2={notes} {good}"),
    ("run", "--dry-run --file-remap nothing {good}"),
    ("run", "--dry-run --file-remap /data= {good}"),  # an empty target would remap to the root
    ("run", "--dry-run --rtol nan {good}"),
    ("run", "--dry-run --rtol inf {good}"),
    ("run", "--dry-run --atol -1 {good}"),
    ("run", "--dry-run --nondeterminism-runs 3 {good}"),
    ("run", "--dry-run --repetitions 0 {good}"),
    ("run", "--dry-run --format yaml {good}"),
    ("run", "--dry-run --save-output /proc/x {good}"),
    ("run", "--dry-run --save-output {notes} {good}"),
    ("diff", "{missing} {good}"),
    ("diff", "{good} {notes}"),
    ("diff", "{good} {binary}"),
    ("diff", "--fail-on bogus {good} {good}"),
    ("diff", "--fail-on time=abc% {good} {good}"),
    ("diff", "--fail-on shape=5% {good} {good}"),
    ("corpus", "--dry-run {missing}"),
    ("corpus", "--dry-run {empty}"),
    ("corpus", "--dry-run --compare-to {notes} {corpus}"),
    ("corpus", "--dry-run --compare-to {binary} {corpus}"),
    ("corpus", "--dry-run --compare-to {missing} {corpus}"),
    ("corpus", "--dry-run --compare-to {empty} {corpus}"),
    ("corpus", "--dry-run --csv {missing}/x.csv {corpus}"),
    ("corpus", "--dry-run --csv {notes} {corpus}"),
    ("corpus", "--dry-run --csv {dir} {corpus}"),
    ("corpus", "--dry-run --timeout nan {corpus}"),
    ("corpus", "--dry-run --timeout inf {corpus}"),
    ("corpus", "--dry-run --threshold nan {corpus}"),
    ("corpus", "--dry-run --scheduler foo://bar {corpus}"),
    ("corpus", "--dry-run --scheduler tcp://head {corpus}"),
    ("corpus", "--dry-run --scheduler tcp://127.0.0.1:1 {corpus}"),
    ("corpus", "--dry-run --device cuda:x {corpus}"),
    ("extract", "--operation 9 -o {dir}/x.kreplay {missing}"),
    ("extract", "--operation 9 -o {dir}/x.kreplay --max-read-gib nan {good}"),
    ("extract", "--operation 9 -o {dir}/x.kreplay --max-read-gib inf {good}"),
    ("extract", "--operation 999 -o {dir}/x.kreplay {good}"),
    ("extract", "--operation 9 -o {good} {good}"),
    ("extract", "--operation 9 -o {missing}/x.kreplay {good}"),
    ("extract", "--kernel ( -o {dir}/y.kreplay {good}"),
    ("extract", "--operation 9 --no-gpu -o {dir}/z.kreplay {flip}"),
    ("extract", "--operation 9 -o {dir}/w.kreplay {binary}"),
    ("benchmark", "--min-time nan {good}"),
    ("benchmark", "--min-time inf {good}"),
    ("benchmark", "--compare-to {binary} {good}"),
    ("benchmark", "--compare-to {notes} {good}"),
    ("benchmark", "{missing}"),
    ("tune", "--launch 9 --grid x {good}"),
    ("tune", "--launch 9 --block 64 --timeout nan {good}"),
    ("tune", "--launch 9 --block 64 --rtol nan {good}"),
    ("tune", "--launch 9 --block 64 --scheduler foo://x {good}"),
    ("capture", "--max-snapshot-gib inf -o {dir}/c.kreplay -- true"),
    ("capture", "--max-snapshot-gib nan -o {dir}/c.kreplay -- true"),
    ("capture", "--self-check-timeout nan -o {dir}/c.kreplay -- true"),
    ("capture", "--self-check-max-gib inf -o {dir}/c.kreplay -- true"),
]


def _error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if re.search(r"(^Error: |: error: |^\S+-replay: )", line)]


@pytest.mark.parametrize(("tool", "args"), MISTAKES, ids=[f"{t}:{a}" for t, a in MISTAKES])
def test_a_mistake_is_one_line_and_exit_1_or_2(files, tool, args):
    argv = [part.format(**files) for part in args.split()]
    result = CliRunner().invoke(COMMANDS[tool], argv)
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"{type(result.exception).__name__}: {result.exception}\n{result.output}"
    )
    assert "Traceback" not in result.output
    assert result.exit_code in (1, 2), result.output
    errors = _error_lines(result.stderr)
    assert errors, result.output
    assert all(len(line) < 2000 for line in errors)


def test_one_flipped_payload_byte_is_named_by_every_gpu_less_verdict(files):
    """dump-replay's verdict, the dry run, corpus-replay's dry run and diff-replay all read the
    payload and name it, its frame and the frame's offset."""
    payload, offset = flipped_payload(files["dir"] / "flip2.kreplay")
    flip = str(files["dir"] / "flip2.kreplay")
    named = f"payload {payload}: {flip}: offset {offset}: payload {payload} frame 0"
    r = CliRunner().invoke(dump_main, ["--summary", flip])
    assert "replayable    no:" in r.output and named in r.output
    r = CliRunner().invoke(run_main, ["--dry-run", flip])
    assert r.exit_code == 2 and named in r.stderr and "plan OK" not in r.output
    r = CliRunner().invoke(run_main, ["--dry-run", "--no-payload-checks", flip])
    assert r.exit_code == 0
    assert "payloads      contents not read (--no-payload-checks): a damaged payload goes unseen" in r.output
    r = CliRunner().invoke(run_main, ["--dry-run", str(files["good"])])
    assert r.exit_code == 0 and "payloads      4 used, 53000 bytes read and checked against their hashes" in r.output
    r = CliRunner().invoke(diff_main, [str(files["good"]), flip])
    assert r.exit_code == 1 and f"damaged   b: the capture uses {named}" in r.output
    assert r.output.rstrip().splitlines()[-1].startswith("verdict: different: damaged: b: the capture uses payload 2")
    corpus = files["dir"] / "flipped_corpus"
    corpus.mkdir()
    shutil.copy(flip, corpus / "flip.kreplay")
    r = CliRunner().invoke(corpus_main, ["--dry-run", "--engine", "local", str(corpus)])
    assert (
        r.exit_code == 1 and "flip.kreplay                     failed" in r.output and "payload 2 frame 0" in r.output
    )


def test_a_truncated_capture_never_diffs_the_same(files):
    for args in ([files["good"], files["trunc"]], ["--fail-on", "time=5%", files["trunc"], files["trunc"]]):
        r = CliRunner().invoke(diff_main, [str(a) for a in args])
        assert r.exit_code == 1, r.output
        assert "was not closed properly and was recovered" in r.output
        assert "verdict: different: damaged:" in r.output


def test_corpus_checks_its_paths_before_any_work(files, monkeypatch):
    import replayfmt.verbs.corpus_runs as corpus_verb

    def never(*args, **kwargs):
        raise AssertionError("the corpus ran before its paths were checked")

    monkeypatch.setattr(corpus_verb, "run_corpus", never)
    for flag, path, said in (
        ("--compare-to", files["notes"], "not a corpus-replay CSV"),
        ("--compare-to", files["binary"], "not a CSV (not UTF-8 text"),
        ("--csv", files["dir"] / "nowhere" / "x.csv", "does not exist"),
    ):
        r = CliRunner().invoke(corpus_main, ["--dry-run", flag, str(path), str(files["corpus"])])
        assert r.exit_code == 2 and said in r.stderr, r.output


def test_an_override_prints_the_whole_shape(files):
    r = CliRunner().invoke(run_main, ["--dry-run", "--launch", "9:smem=128", str(files["good"])])
    assert r.exit_code == 0, r.output
    assert "override      operation 9: grid=(16, 1, 1) block=(256, 1, 1) smem=128" in r.output
    assert "None" not in r.output


def test_a_device_the_machine_does_not_show_is_refused_by_the_dry_run(files, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    r = CliRunner().invoke(run_main, ["--dry-run", "--device", "cuda:9", str(files["good"])])
    assert r.exit_code == 1
    assert "run-replay: error: --device cuda:9: CUDA_VISIBLE_DEVICES='0,1' shows 2 GPU(s)" in r.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["dump-replay", "{binary}"],
        ["run-replay", "--dry-run", "--launch=9:smem=99999999", "{good}"],
        ["corpus-replay", "--dry-run", "--scheduler", "tcp://127.0.0.1:1", "{corpus}"],
        ["diff-replay", "--fail-on", "bogus", "{good}", "{flip}"],
        ["extract-replay", "--operation", "9", "-o", "{dir}/s.kreplay", "--max-read-gib", "nan", "{good}"],
    ],
)
def test_console_scripts_end_in_one_line(files, argv):
    script = Path(sys.executable).parent / argv[0]
    command = [str(script)] if script.exists() else [sys.executable, "-m", f"replayfmt_tools.{argv[0][:-7]}_replay"]
    done = subprocess.run(
        command + [a.format(**files) for a in argv[1:]], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode in (1, 2), done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert len(_error_lines(done.stderr)) >= 1


def test_a_damaged_frame_two_payloads_share_names_each_of_them(tmp_path):
    """Equal frames are stored once: a byte flipped in a frame that a starting state's payload
    (its frame 0) and a checkpoint's (its frame 1) share damages both, and each GPU-less verdict
    names each, with its own frame, and the chunk's offset."""
    size = 64 << 10
    shared, state_tail, checkpoint_head = (random.Random(v).randbytes(size) for v in (7, 8, 9))  # stored raw
    good = tmp_path / "good.kreplay"
    with replayfmt.CaptureWriter(good, threads=0, frame_size=size) as w:
        device = w.add_object(replayfmt.model.Device(name="NVIDIA H100", compute_capability=(9, 0)))
        buffer = w.add_object(replayfmt.model.Buffer(size=2 * size, device=device))
        with w.scope("step"):
            w.state(buffer=buffer, data=shared + state_tail)
            w.memset(buffer=buffer, value=0, count=16)
            w.checkpoint({buffer: checkpoint_head + shared})
    with replayfmt.open(good) as cap:
        state, checkpoint = (p.id for p in cap.payloads() if len(p.frames) == 2)
        assert cap.payload(state).frames[0] == cap.payload(checkpoint).frames[1]
        offset = cap.frame_location(cap.payload(state).frames[0])[0]
    bad = tmp_path / "bad.kreplay"
    data = bytearray(good.read_bytes())
    data[offset + CHUNK_HEADER_SIZE + 1000] ^= 0x40
    bad.write_bytes(bytes(data))
    named = [
        f"uses payload {state}: {bad}: offset {offset}: payload {state} frame 0",
        f"uses payload {checkpoint}: {bad}: offset {offset}: payload {checkpoint} frame 1",
    ]
    r = CliRunner().invoke(dump_main, ["--summary", str(bad)])
    assert "replayable    no:" in r.output and all(n in r.output for n in named), r.output
    r = CliRunner().invoke(run_main, ["--dry-run", str(bad)])  # the first problem: it names the other user too
    assert r.exit_code == 2 and named[0] in r.stderr and "plan OK" not in r.output, r.output
    assert f"(the frame is stored once: payload {checkpoint} frame 1 uses it too)" in r.stderr
    r = CliRunner().invoke(diff_main, [str(good), str(bad)])
    assert r.exit_code == 1 and all(f"damaged   b: the capture {n}" in r.output for n in named), r.output
    assert CliRunner().invoke(run_main, ["--dry-run", str(good)]).exit_code == 0
