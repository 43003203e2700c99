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
