"""The docs, the playbook (--agents-md) and --help say the same things: each fact is checked in the
doc that holds it (the recorder's cost per launch in docs/PERFORMANCE.md, the graph updates it
follows in docs/RECORDER.md, benchmark-replay's state and clocks in the README), and the README
stays a page a newcomer reads from the top."""

from __future__ import annotations

import re
from pathlib import Path

from click.testing import CliRunner

from replayfmt.capture.graphs import GRAPH_NODE_CHANGES, GRAPH_NODE_UPDATES, GRAPH_UPDATES_NOT_FOLLOWED
from replayfmt_tools import benchmark_replay
from replayfmt_tools.playbook import playbook

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
RECORDER = (ROOT / "docs" / "RECORDER.md").read_text()
PERFORMANCE = (ROOT / "docs" / "PERFORMANCE.md").read_text()
LIMITATIONS = (ROOT / "docs" / "LIMITATIONS.md").read_text()
COST = re.compile(r"\+(\d+)(?: to \+(\d+))? µs \(Triton\) and \+(\d+)(?: to \+(\d+))? µs \(torch `add_`\)")
FIRST_SCREEN_LINES = 40
MAX_README_LINES = 160


def flat(text: str) -> str:
    return " ".join(text.split())


def test_the_recorders_cost_per_launch_is_the_same_figure_everywhere():
    measured, book = COST.findall(flat(PERFORMANCE)), COST.findall(flat(playbook("capture-replay")))
    assert len(measured) == 1 and measured == book, (measured, book)
    assert not COST.findall(flat(README)), "a measured figure belongs in docs/PERFORMANCE.md, with its date"
    assert " 7 us per Triton launch" not in flat(playbook("capture-replay"))


def test_the_graph_updates_followed_are_the_recorders_own_list():
    updates = [*GRAPH_NODE_UPDATES, *GRAPH_NODE_CHANGES]
    followed = ["cuGraphExecUpdate", *(name for name in updates if not name.endswith("_v2"))]
    for text in (flat(RECORDER), flat(playbook("capture-replay"))):
        for name in followed:
            assert name in text, name
        assert "other than cuGraphExecUpdate and cuGraphExecKernelNodeSetParams" not in text
    for name in GRAPH_UPDATES_NOT_FOLLOWED:  # what the recorder refuses, the docs call unsupported
        assert name in flat(LIMITATIONS) and name in flat(playbook("capture-replay")), name
    assert "other node updates" not in flat(RECORDER) and "Other node updates" not in flat(playbook("capture-replay"))


def test_benchmark_help_playbook_and_readme_agree_on_state_and_clocks():
    help_text = flat(CliRunner().invoke(benchmark_replay.main, ["--help"]).stdout)
    book = flat(playbook("benchmark-replay"))
    for text in (help_text, book, flat(README)):
        assert "never timed" in text and "CUPTI" in text
        assert re.search(r"not its elapsed time|never its elapsed time", text), text[:200]


def test_a_newcomer_finds_install_main_command_and_tests_on_the_first_screen():
    lines = README.splitlines()
    first_screen = "\n".join(lines[:FIRST_SCREEN_LINES])
    assert "pip install -e '.[test]'" in first_screen
    assert re.search(r"^python -m replayfmt\.capture -o \S+", first_screen, flags=re.M), "the main command"
    assert re.search(r"^run-replay --verify \S+", first_screen, flags=re.M), "the main command's replay"
    assert re.search(r"^python -m pytest -q$", first_screen, flags=re.M), "the test command"
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines (at most {MAX_README_LINES})"


def test_ci_runs_the_readmes_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    command = re.search(r"^```sh\n(python -m pytest[^\n]*)\n```", README, flags=re.M)
    assert command is not None and command.group(1) in ci, "CI must run exactly the README's test command"


def test_the_readme_holds_no_dated_figures_or_issue_numbers():
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", README), "dated figures go to docs/PERFORMANCE.md"
    assert not re.search(r"\bissue \d+", README, flags=re.I), "history goes in commit messages"


def test_every_doc_the_readme_links_exists():
    for target in re.findall(r"\]\(([^)#]+)", README):
        assert (ROOT / target).exists(), target
