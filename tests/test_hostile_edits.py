"""Hostile input, round three (issue 46): the forged files of tests/hostile_edits.py through
every tool that reads a capture without a GPU: ``dump-replay`` (text and JSONL), ``run-replay
--dry-run``, ``extract-replay --no-gpu`` (the whole capture as one region) and ``diff-replay``
(the file against itself), in capped subprocesses (1.5 GiB of address space): each run ends in
10 s with exit 0, 1 or 2, one line on stderr at most and no traceback, its peak memory under
1 GiB; dump's verdict is the dry run's on every file, and extract refuses what the verdict refuses
where it reads it."""

from __future__ import annotations

import concurrent.futures as cf
from pathlib import Path

import hostile_edits as he
import pytest
import test_hostile as th

import replayfmt
from replayfmt.errors import ReplayError


def commands(path: Path) -> list[list[str]]:
    out = path.parent / "extracted.kreplay"
    try:  # extract the whole capture as one region (a forged file may not even open: then operation 0)
        with replayfmt.open(path) as cap:
            last = max(0, cap.operation_count - 1)
    except ReplayError:
        last = 0
    return [
        ["dump-replay", str(path)],
        ["dump-replay", "--format=jsonl", str(path)],
        ["run-replay", "--dry-run", str(path)],
        ["extract-replay", "--operations", f"0..{last}", "--no-gpu", "--force", "-o", str(out), str(path)],
        ["diff-replay", str(path), str(path)],
    ]


@pytest.fixture(scope="module")
def forged(tmp_path_factory) -> dict[str, tuple[Path, list[th.Outcome]]]:
    """Every forged file built, and the commands run on each: the files split over two
    interpreters (imports paid once each), side by side."""
    built = {build.__name__: build(tmp_path_factory.mktemp(build.__name__)) for build in he.BUILDERS}
    names = list(built)
    groups = [names[0::2], names[1::2]]

    def run(group: list[str]) -> list[th.Outcome]:
        return th.run_tools([c for name in group for c in commands(built[name])], built[group[0]].parent)

    with cf.ThreadPoolExecutor(2) as pool:
        ran = list(pool.map(run, groups))
    results = {}
    for group, outcomes in zip(groups, ran, strict=True):
        per = len(commands(built[group[0]]))
        for k, name in enumerate(group):
            results[name] = (built[name], outcomes[k * per : (k + 1) * per])
    every = [o for _, runs in results.values() for o in runs]
    dirty = sum(1 for o in every if th.check(o, ()))
    slowest = max(every, key=lambda o: o.seconds)
    print(
        f"\nhostile inputs, round three: {len(built)} files, {len(every)} runs, {dirty} dirty; slowest "
        f"{slowest.seconds:.1f} s ({' '.join(slowest.command[:2])} {Path(slowest.command[-1]).name}), "
        f"largest peak {max(o.peak_bytes for o in every) >> 20} MiB"
    )
    return results


def _verdict(dump: th.Outcome) -> bool | None:
    """dump-replay's replayable: True, False, or None when it printed none (the file refused)."""
    for line in dump.stdout.splitlines():
        if line.startswith("replayable"):
            return line.split()[1] == "yes"
    return None


@pytest.mark.parametrize("build", he.BUILDERS, ids=lambda b: b.__name__)
def test_forged_file_is_answered_cleanly(build, forged):
    path, runs = forged[build.__name__]
    report = []
    if len(runs) < len(commands(path)):
        report.append(f"only {len(runs)} of the commands ran")
    for outcome in runs:
        problems = th.check(outcome, ())
        if problems:
            report.append(f"{' '.join(outcome.command[:3])}: {'; '.join(problems)}")
    assert not report, f"{build.__name__}:\n" + "\n".join(report)


@pytest.mark.parametrize("build", he.BUILDERS, ids=lambda b: b.__name__)
def test_dump_the_dry_run_and_extract_agree(build, forged):
    _, runs = forged[build.__name__]
    dump, _, dry, extract, _ = runs
    replayable = _verdict(dump)
    assert replayable == (dry.code == 0), f"dump says {replayable}, the dry run exits {dry.code}: {dry.stderr}"
    assert replayable == (build.__name__ in he.REPLAYABLE), dump.stdout[-800:]
    needs_a_flag = "--fixed-addresses" in dump.stdout or "--file-remap" in dump.stdout  # sound, replayed so
    if not replayable and not needs_a_flag:  # what the verdict refuses, extract does not cut out as if sound
        assert extract.code != 0, extract.stdout[-400:]
