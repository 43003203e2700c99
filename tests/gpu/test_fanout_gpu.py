"""Fan-out with real GPU workers (Dask when installed, else local processes): a corpus verified
on the GPU, a capture that faults losing only its worker, and tune candidates spread over the
workers with a faulting shape isolated."""

import shutil
from pathlib import Path

import pytest
from test_tune_gpu import FAULT, STRIDE, tune_capture

import replayfmt
from replayfmt.measure.corpus import run_corpus
from replayfmt.measure.fanout import open_fanout
from replayfmt.measure.tune import CsvLog, SearchSpace, WorkerConfig, fan_out_search, find_targets, prune
from replayfmt.replay.plan import build_plan
from replayfmt.verbs.corpus_runs import verify_row

pytestmark = pytest.mark.gpu
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def fanout():
    with open_fanout([0]) as f:
        yield f


def test_a_corpus_verifies_on_the_gpu_and_a_faulting_capture_loses_only_its_worker(tmp_path, kernels, fanout):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    shutil.copy(EXAMPLES / "saxpy.kreplay", corpus / "a_saxpy.kreplay")
    path, _ = tune_capture(tmp_path, kernels, FAULT, (132, 1, 1), (512, 1, 1), lambda y: 2 * y)
    shutil.copy(path, corpus / "b_fault.kreplay")
    path, _ = tune_capture(tmp_path, kernels, STRIDE, (132, 1, 1), (256, 1, 1), lambda y: 2 * y)
    shutil.copy(path, corpus / "c_stride.kreplay")
    before = fanout.replaced
    rows = {
        r.capture: r
        for r in run_corpus(fanout, sorted(corpus.iterdir()), {"repetitions": 3}, timeout=120, task=verify_row)
    }
    assert rows["a_saxpy.kreplay"].verdict == "verified" and rows["a_saxpy.kreplay"].ranges > 0
    assert rows["a_saxpy.kreplay"].device_ms > 0
    fault = rows["b_fault.kreplay"]
    assert fault.verdict == "failed" and "ILLEGAL" in fault.error and "worker was replaced" in fault.error
    assert rows["c_stride.kreplay"].verdict == "verified"  # after the fault, on a fresh worker
    assert fanout.replaced == before + 1


def test_tune_candidates_fan_out_with_faulting_shapes_isolated(tmp_path, kernels, fanout):
    path, op = tune_capture(tmp_path, kernels, FAULT, (132, 1, 1), (128, 1, 1), lambda y: 2 * y)
    with replayfmt.open(path) as cap:
        plan = build_plan(cap)
        targets = find_targets(plan, launch=op, kernel=None)
    space = SearchSpace(blocks=[(64, 1, 1), (512, 1, 1), (256, 1, 1), (1024, 1, 1), (128, 1, 1)])
    valid, _ = prune(plan, targets, space.points())
    config = WorkerConfig(capture=str(path), operations=targets.operations, plan={}, repetitions=5)
    before = fanout.replaced
    results = list(fan_out_search(fanout, config, valid, done={}, log=CsvLog(None, targets), timeout=60))
    by_block = {r.candidate.block: r for r in results}
    assert "ILLEGAL" in by_block[(512, 1, 1)].error and "ILLEGAL" in by_block[(1024, 1, 1)].error
    assert all(by_block[b].ok and by_block[b].verified for b in (None, (64, 1, 1), (256, 1, 1), (128, 1, 1)))
    assert fanout.replaced >= before + 2


def test_the_corpus_verb_on_one_gpu_verifies_one_gpu_rows_and_says_a_job_needs_more(tmp_path, gpu_arch):
    """The corpus verb's rows on one GPU: a capture, and a lone rank file (its group incomplete:
    replayed alone) verified; a job's complete rank files made one row that needs two GPUs, which
    --device cuda:0 alone cannot give (unavailable, saying which flags would)."""
    from replayfmt.format import model as m
    from replayfmt.verbs.corpus_runs import CorpusOptions, corpus

    folder = tmp_path / "corpus"
    folder.mkdir()
    shutil.copy(EXAMPLES / "saxpy.kreplay", folder / "saxpy.kreplay")
    shutil.copy(EXAMPLES / "saxpy.kreplay", folder / "lone.rank0.kreplay")
    for rank in (0, 1):  # what torchrun's ranks record
        metadata = m.CaptureMetadata(properties=(("rank", str(rank)), ("world_size", "2")))
        with replayfmt.CaptureWriter(folder / f"job.rank{rank}.kreplay", metadata=metadata) as w:
            device = w.add_object(m.Device(ordinal=0, name="NVIDIA H200", compute_capability=(9, 0)))
            w.memset(buffer=w.add_object(m.Buffer(size=256, device=device)), value=0, count=64)
    result = corpus(folder, CorpusOptions(devices=(0,), engine="local", repetitions=2))
    rows = {r.capture: r for r in result.rows}
    assert set(rows) == {"saxpy.kreplay", "lone.rank0.kreplay", "job.rank*.kreplay"}
    for name in ("saxpy.kreplay", "lone.rank0.kreplay"):
        assert rows[name].verdict == "verified" and rows[name].ranges > 0 and rows[name].device_ms > 0, rows[name]
    job = rows["job.rank*.kreplay"]
    assert job.verdict == "unavailable" and "needs 2 GPUs" in job.error and "--device cuda:1" in job.error
