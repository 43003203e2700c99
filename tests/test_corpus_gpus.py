"""corpus-replay's rows that need several GPUs (issue 42), without a GPU: which files make which
rows (a job's complete group of rank files is one row, a capture of several devices needs as many
GPUs, anything else one); those rows run after the others, a capture of several devices on a
local worker pinned to as many GPUs, a job's ranks through verify_ranks (a fake here), each row
made from what its ranks answered; too few --device, or --scheduler, make the row unavailable,
saying why; --dry-run plans each file alone."""

from __future__ import annotations

from pathlib import Path

import fanout_tasks as tasks
import pytest
from click.testing import CliRunner

import replayfmt
import replayfmt.verbs.corpus_runs as corpus_runs
from replayfmt.errors import ReplayUsageError
from replayfmt.format import model as m
from replayfmt.format.layout import DEFAULT_LIMITS
from replayfmt.measure.corpus import CorpusEntry, corpus_entries
from replayfmt.replay.verify_types import Outcome, VerifyResult
from replayfmt.verbs import CorpusOptions, RanksResult, corpus
from replayfmt.verbs.ranks import RankCapture, RankOutcome
from replayfmt_tools.corpus_replay import main as corpus_main


def write(path: Path, devices: int = 1, *, rank: int | None = None, world_size: int | None = None) -> Path:
    """A small capture of ``devices`` devices; ``rank``, ``world_size``: what torchrun's ranks record."""
    properties = () if rank is None else (("rank", str(rank)), ("world_size", str(world_size)))
    with replayfmt.CaptureWriter(path, metadata=m.CaptureMetadata(properties=properties)) as w:
        on = [w.add_object(m.Device(ordinal=k, name="NVIDIA H200", compute_capability=(9, 0))) for k in range(devices)]
        for device in on:
            buf = w.add_object(m.Buffer(size=256, device=device))
            w.memset(buffer=buf, value=0, count=64)
    return path


def job(directory: Path, prefix: str = "job", ranks: int = 2, world_size: int | None = None) -> list[Path]:
    return [
        write(directory / f"{prefix}.rank{k}.kreplay", rank=k, world_size=world_size or ranks) for k in range(ranks)
    ]


@pytest.fixture(autouse=True)
def gpus_here(monkeypatch) -> None:
    """The corpus asks the driver how many GPUs there are before a job's ranks run: eight here."""
    monkeypatch.setattr(corpus_runs, "cuda_gpu_count", lambda: 8)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    directory = tmp_path / "corpus"
    directory.mkdir()
    return directory


def entries(directory: Path, **kwargs) -> dict[str, CorpusEntry]:
    return {e.name: e for e in corpus_entries(sorted(directory.iterdir()), **kwargs)}


def test_a_complete_group_of_rank_files_is_one_entry_of_as_many_gpus(folder):
    ranks = job(folder, ranks=3)
    write(folder / "alone.kreplay")
    found = entries(folder)
    assert set(found) == {"job.rank*.kreplay", "alone.kreplay"}
    assert found["job.rank*.kreplay"] == CorpusEntry("job.rank*.kreplay", tuple(ranks), 3)
    assert found["job.rank*.kreplay"].why == "3 ranks together" and found["alone.kreplay"].gpus == 1


def test_an_incomplete_group_of_rank_files_stays_one_row_each(folder):
    job(folder, "short", ranks=2, world_size=3)  # rank 2 missing
    write(folder / "gap.rank0.kreplay", rank=0, world_size=2)
    write(folder / "gap.rank2.kreplay", rank=2, world_size=2)  # named rank 2 of 2
    write(folder / "bare.rank0.kreplay")  # nothing recorded: no rank, no world size
    write(folder / "bare.rank1.kreplay")
    write(folder / "liar.rank0.kreplay", rank=0, world_size=2)
    write(folder / "liar.rank1.kreplay", rank=0, world_size=2)  # named rank 1, recorded rank 0
    write(folder / "one.rank0.kreplay", rank=0, world_size=1)  # a job of one rank replays alone
    found = entries(folder)
    assert all(e.gpus == 1 and not e.job for e in found.values()), found
    assert len(found) == 9 and not any("*" in name for name in found)


def test_a_capture_of_several_devices_needs_as_many_gpus(folder):
    write(folder / "pipeline.kreplay", devices=2)
    write(folder / "wide.rank0.kreplay", rank=0, world_size=2)
    write(folder / "wide.rank1.kreplay", devices=2, rank=1, world_size=2)  # a rank of two devices: no job
    found = entries(folder)
    assert {name: (e.gpus, e.job) for name, e in found.items()} == {
        "pipeline.kreplay": (2, False),
        "wide.rank0.kreplay": (1, False),
        "wide.rank1.kreplay": (2, False),
    }
    assert found["pipeline.kreplay"].why == "a capture on 2 devices"


def test_an_unreadable_file_is_a_row_of_one_gpu_and_limits_are_respected(folder):
    job(folder)
    write(folder / "pipeline.kreplay", devices=2)
    (folder / "broken.rank2.kreplay").write_bytes(b"not a capture")
    (folder / "broken.kreplay").write_bytes(b"not a capture")
    found = entries(folder)
    assert found["broken.kreplay"].gpus == 1 and found["broken.rank2.kreplay"].gpus == 1
    assert found["job.rank*.kreplay"].gpus == 2 and found["pipeline.kreplay"].gpus == 2
    tight = entries(folder, limits=DEFAULT_LIMITS.overridden({"max_metadata_size": 8}))  # none can be read
    assert len(tight) == 5 and all(e.gpus == 1 for e in tight.values())


class FakeRanks:
    """verify_ranks as the corpus calls it: what it was asked, and a result of two ranks."""

    def __init__(self, *outcomes: VerifyResult, error: Exception | None = None, log: Path | None = None) -> None:
        self.outcomes, self.error, self.log = outcomes, error, log
        self.calls: list[tuple[list[str], object]] = []

    def __call__(self, paths, options=None, **_kwargs) -> RanksResult:
        self.calls.append((list(paths), options))
        if self.log is not None:
            with self.log.open("a") as log:
                log.write("ranks\n")
        if self.error is not None:
            raise self.error
        ranks = tuple(
            RankOutcome(RankCapture(path, k, 1, {}, ()), k, result)
            for k, (path, result) in enumerate(zip(paths, self.outcomes, strict=True))
        )
        return RanksResult(ranks, 2)


def rank_result(path: Path, outcome: Outcome, timed_ms, detail: str = "") -> VerifyResult:
    return VerifyResult(
        str(path), outcome, detail=detail, timed_ms=tuple(timed_ms), operations=10, setup_s=0.5, compared=3
    )


def test_rows_needing_several_gpus_run_after_the_others_on_a_worker_pinned_to_them(folder, monkeypatch):
    for name in ("a", "b", "c"):
        write(folder / f"{name}.kreplay")
    write(folder / "pipeline.kreplay", devices=2)
    ranks = job(folder)
    log = folder.parent / "order.log"
    fake = FakeRanks(*(rank_result(p, Outcome.VERIFIED, (1.0,)) for p in ranks), log=log)
    monkeypatch.setattr(corpus_runs, "verify_row", tasks.pinned_row)
    monkeypatch.setattr(corpus_runs, "verify_ranks", fake)
    said: list[str] = []
    result = corpus(folder, CorpusOptions(devices=(0, 1), engine="local", repetitions=4), progress=said.append)
    rows = {r.capture: r for r in result.rows}
    assert list(rows) == ["a.kreplay", "b.kreplay", "c.kreplay", "job.rank*.kreplay", "pipeline.kreplay"]
    order = log.read_text().split()
    assert sorted(order[:3]) == ["a.kreplay", "b.kreplay", "c.kreplay"] and sorted(order[3:]) == [
        "pipeline.kreplay",
        "ranks",
    ]
    for name in ("a.kreplay", "b.kreplay", "c.kreplay"):
        assert rows[name].error in ("CUDA_VISIBLE_DEVICES=0 devices=(0,)", "CUDA_VISIBLE_DEVICES=1 devices=(0,)")
    pipeline = rows["pipeline.kreplay"]
    assert pipeline.error == "CUDA_VISIBLE_DEVICES=0,1 devices=(0, 1)" and pipeline.worker == "gpu0,1"
    (paths, options), *more = fake.calls
    assert not more and paths == [str(p) for p in ranks]
    assert options.devices == (0, 1) and options.verify.timed_runs == 4 and not options.verify.dry_run
    assert rows["job.rank*.kreplay"].verdict == "verified" and rows["job.rank*.kreplay"].worker == "gpu0,1"
    assert "corpus: 6 capture(s) in" in said[0] and "(2 row(s) needing several GPUs run after the others)" in said[0]
    assert any("pipeline.kreplay: a capture on 2 devices on cuda:0, cuda:1" in line for line in said)


def test_a_worker_pinned_to_later_gpus_sees_them_as_its_first(folder, monkeypatch):
    write(folder / "pipeline.kreplay", devices=2)
    monkeypatch.setattr(corpus_runs, "verify_row", tasks.pinned_row)
    result = corpus(folder, CorpusOptions(devices=(2, 3, 0), engine="local"))
    (row,) = result.rows
    assert row.error == "CUDA_VISIBLE_DEVICES=2,3 devices=(0, 1)" and row.worker == "gpu2,3"


def test_a_job_row_is_made_from_every_ranks_answer(folder, monkeypatch):
    ranks = job(folder)
    wrong = "rank 1: 1 of 3 compared range(s) failed: buffer 2 [0, 256)"
    fake = FakeRanks(
        rank_result(ranks[0], Outcome.VERIFIED, (1.0, 3.0, 2.0)),
        rank_result(ranks[1], Outcome.MISMATCH, (4.0, 6.0, 5.0), wrong),
    )
    monkeypatch.setattr(corpus_runs, "verify_ranks", fake)
    baseline = folder.parent / "baseline"
    baseline.mkdir()
    job(baseline)
    result = corpus(folder, CorpusOptions(devices=(1, 0), baseline=baseline, timeout_s=30))
    (row,) = result.rows
    assert (row.capture, row.verdict, row.operations, row.ranges) == ("job.rank*.kreplay", "mismatch", 20, 6)
    assert row.device_ms == 5.0 and row.host_s == 0.5  # the slowest rank's median
    assert row.error == wrong and row.worker == "gpu1,0" and result.failed == [row]
    assert [options.devices for _, options in fake.calls] == [(1, 0), (1, 0)]  # the corpus, then its baseline
    assert fake.calls[0][1].timeout_s == 30
    (pair,) = result.comparisons
    assert pair.capture == "job.rank*.kreplay" and pair.baseline.verdict == "mismatch" and pair.ratio == 1.0


def test_a_job_that_cannot_replay_together_is_its_rows_failure_in_one_line(folder, monkeypatch):
    job(folder)
    why = "communicator nccl-0x1 has 2 ranks, but the captures given hold 1 of them"
    monkeypatch.setattr(corpus_runs, "verify_ranks", FakeRanks(error=ReplayUsageError(why)))
    (row,) = corpus(folder, CorpusOptions(devices=(0, 1))).rows
    assert (row.capture, row.verdict, row.error, row.device_ms) == ("job.rank*.kreplay", "failed", why, None)


def test_too_few_devices_or_a_dask_cluster_make_the_row_unavailable(folder, monkeypatch):
    job(folder)
    write(folder / "pipeline.kreplay", devices=2)
    fake = FakeRanks()
    monkeypatch.setattr(corpus_runs, "verify_ranks", fake)
    rows = {r.capture: r for r in corpus(folder, CorpusOptions(devices=(3,))).rows}
    assert rows["job.rank*.kreplay"].verdict == "unavailable"
    assert rows["job.rank*.kreplay"].error == (
        "needs 2 GPUs (2 ranks together); --device gives 1: give --device cuda:3 --device cuda:0"
    )
    assert rows["pipeline.kreplay"].error == (
        "needs 2 GPUs (a capture on 2 devices); --device gives 1: give --device cuda:3 --device cuda:0"
    )
    on_cluster = corpus(folder, CorpusOptions(devices=(0, 1), scheduler="tcp://127.0.0.1:1"))
    assert [r.verdict for r in on_cluster.rows] == ["unavailable"] * 2 and on_cluster.nowhere_to_run
    assert "run on local processes only (--device), not on the Dask cluster" in on_cluster.rows[0].error
    assert not fake.calls


def test_corpus_replay_prints_the_job_row_and_why_it_could_not_run(folder, monkeypatch):
    job(folder)
    write(folder / "a.kreplay")
    runner = CliRunner()
    planned = runner.invoke(corpus_main, ["--dry-run", "--engine", "local", str(folder)])
    assert planned.exit_code == 0, planned.output
    assert "job.rank0.kreplay" in planned.output and "job.rank1.kreplay" in planned.output
    assert "rank*" not in planned.output and "3 planned" in planned.output
    assert "each file alone" in " ".join(runner.invoke(corpus_main, ["--help"]).output.split())
    monkeypatch.setattr(corpus_runs, "verify_row", tasks.pinned_row)
    result = runner.invoke(corpus_main, ["--engine", "local", "--device", "cuda:0", str(folder)])
    assert result.exit_code == 1, result.output
    lines = result.output.splitlines()
    row = next(line for line in lines if line.startswith("job.rank*.kreplay "))
    assert row.split()[1] == "unavailable"
    assert lines[lines.index(row) + 1].strip() == (
        "needs 2 GPUs (2 ranks together); --device gives 1: give --device cuda:0 --device cuda:1"
    )
    assert "1 verified, 1 unavailable" in result.output
    (folder / "a.kreplay").unlink()
    alone = runner.invoke(corpus_main, ["--engine", "local", str(folder)])
    assert alone.exit_code == 2 and "nothing could run here: every row is unavailable" in alone.stderr


def test_a_job_rows_error_is_the_worst_ranks_detail(folder, monkeypatch):
    """A rank with nothing to verify before a mismatching one: the row is a mismatch, and its
    error says what mismatched, not the first rank's lesser complaint."""
    ranks = job(folder, ranks=3)
    wrong = "rank 2: 1 of 3 compared range(s) failed: buffer 2 [0, 256)"
    fake = FakeRanks(
        rank_result(ranks[0], Outcome.VERIFIED, (1.0,)),
        rank_result(ranks[1], Outcome.NOTHING_TO_VERIFY, (1.0,), "rank 1: no range was compared"),
        rank_result(ranks[2], Outcome.MISMATCH, (1.0,), wrong),
    )
    monkeypatch.setattr(corpus_runs, "verify_ranks", fake)
    (row,) = corpus(folder, CorpusOptions(devices=(0, 1, 2))).rows
    assert (row.verdict, row.error) == ("mismatch", wrong)


def test_a_job_row_has_no_device_time_when_a_rank_was_not_timed(folder, monkeypatch):
    """The slowest rank's median is unknown when a rank made no timed run (it failed first): the
    row's device time is none, not the others' (which a baseline would compare as a speed-up)."""
    ranks = job(folder)
    fake = FakeRanks(
        rank_result(ranks[0], Outcome.VERIFIED, (1.0, 1.0)),
        rank_result(ranks[1], Outcome.FAILED, (), "rank 1: operation 3 (launch k): CUDA_ERROR_ILLEGAL_ADDRESS"),
    )
    monkeypatch.setattr(corpus_runs, "verify_ranks", fake)
    (row,) = corpus(folder, CorpusOptions(devices=(0, 1))).rows
    assert (row.verdict, row.device_ms) == ("failed", None) and "ILLEGAL_ADDRESS" in row.error


def test_a_job_row_on_a_machine_with_too_few_gpus_is_unavailable_before_any_rank_runs(folder, monkeypatch):
    job(folder)
    fake = FakeRanks()
    monkeypatch.setattr(corpus_runs, "verify_ranks", fake)
    monkeypatch.setattr(corpus_runs, "cuda_gpu_count", lambda: 1)
    (row,) = corpus(folder, CorpusOptions(devices=(0, 1), engine="local")).rows
    assert row.verdict == "unavailable" and "on cuda:0, cuda:1; this machine has 1" in row.error
    assert not fake.calls  # no rank was started

    def no_driver() -> int:
        raise replayfmt.DeviceUnavailableError("no CUDA driver here")

    monkeypatch.setattr(corpus_runs, "cuda_gpu_count", no_driver)
    (row,) = corpus(folder, CorpusOptions(devices=(0, 1), engine="local")).rows
    assert row.verdict == "unavailable" and row.error == "needs 2 GPUs: no CUDA driver here"
