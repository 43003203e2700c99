"""Each rank of a job started by a launcher writes its own capture, named after the one ``-o`` the
user gave, with its rank in the metadata; a process that runs alone writes ``-o`` itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from replayfmt.capture.ranks import Rank, rank_output, this_rank


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}, Rank(1, 2, 1)),  # torchrun
        ({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1"}, Rank(3, 4, 1)),
        ({"PMI_RANK": "0", "PMI_SIZE": "2"}, Rank(0, 2, 0)),  # no local rank: the rank
        ({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1"}, Rank(5, 8, 1)),
        ({"RANK": "0", "WORLD_SIZE": "1"}, None),  # a world of one: alone
        ({"RANK": "2", "WORLD_SIZE": "2"}, None),  # out of range: not believed
        ({"RANK": "x", "WORLD_SIZE": "2"}, None),
        ({}, None),
    ],
)
def test_the_launchers_variables_say_which_rank_this_is(environ, expected):
    assert this_rank(environ) == expected


def test_each_rank_writes_beside_the_name_given():
    assert rank_output(Path("out/ddp.kreplay"), Rank(1, 2, 1)) == Path("out/ddp.rank1.kreplay")
    assert rank_output(Path("ddp"), Rank(0, 2, 0)) == Path("ddp.rank0.kreplay")
    assert rank_output(Path("ddp.kreplay"), None) == Path("ddp.kreplay")
    assert dict(Rank(1, 2, 0).properties()) == {"rank": "1", "world_size": "2", "local_rank": "0"}


def test_dump_replay_says_which_rank_a_capture_is(tmp_path):
    import replayfmt
    from replayfmt.dump import render_summary_text, summarize
    from replayfmt.format import model as m

    path = tmp_path / "job.rank1.kreplay"
    meta = m.CaptureMetadata(tool="replayfmt.capture", properties=Rank(1, 2, 1).properties())
    with replayfmt.CaptureWriter(path, metadata=meta):
        pass
    with replayfmt.open(path) as cap:
        summary = summarize(cap)
    assert summary.rank == "1 of 2 (local rank 1)"
    assert "rank          1 of 2 (local rank 1)" in render_summary_text(summary)
