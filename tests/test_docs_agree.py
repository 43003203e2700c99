"""README, the playbook (--agents-md) and --help say the same things (issue 25: they disagreed on
which graph updates the recorder follows and on its cost per launch)."""

from __future__ import annotations

import re
from pathlib import Path

from click.testing import CliRunner

from replayfmt.capture.graphs import GRAPH_NODE_CHANGES, GRAPH_NODE_UPDATES, GRAPH_UPDATES_NOT_FOLLOWED
from replayfmt_tools import benchmark_replay
from replayfmt_tools.playbook import playbook

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()
COST = re.compile(r"\+(\d+)(?: to \+(\d+))? µs \(Triton\) and \+(\d+)(?: to \+(\d+))? µs \(torch `add_`\)")


def flat(text: str) -> str:
    return " ".join(text.split())


def test_the_recorders_cost_per_launch_is_the_same_figure_everywhere():
    readme, book = COST.findall(flat(README)), COST.findall(flat(playbook("capture-replay")))
    assert len(readme) == 1 and readme == book, (readme, book)
    assert " 7 us per Triton launch" not in flat(playbook("capture-replay"))


def test_the_graph_updates_followed_are_the_recorders_own_list():
    updates = [*GRAPH_NODE_UPDATES, *GRAPH_NODE_CHANGES]
    followed = ["cuGraphExecUpdate", *(name for name in updates if not name.endswith("_v2"))]
    for text in (flat(README), flat(playbook("capture-replay"))):
        for name in followed:
            assert name in text, name
        assert "other than cuGraphExecUpdate and cuGraphExecKernelNodeSetParams" not in text
    for name in GRAPH_UPDATES_NOT_FOLLOWED:  # what the recorder refuses, the docs call unsupported
        assert name in flat(README) and name in flat(playbook("capture-replay")), name
    assert "other node updates" not in flat(README) and "Other node updates" not in flat(playbook("capture-replay"))


def test_benchmark_help_playbook_and_readme_agree_on_state_and_clocks():
    help_text = flat(CliRunner().invoke(benchmark_replay.main, ["--help"]).stdout)
    book = flat(playbook("benchmark-replay"))
    for text in (help_text, book, flat(README)):
        assert "never timed" in text and "CUPTI" in text
        assert re.search(r"not its elapsed time|never its elapsed time", text), text[:200]
