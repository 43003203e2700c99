"""A pytest plugin: skipped tests summarised once per distinct reason, with a count."""

from collections import Counter


def pytest_terminal_summary(terminalreporter) -> None:
    """One line per distinct skip reason with its count (``-ra`` printed one line per skipped test:
    47 identical "no GPU" lines on a machine without one)."""
    skipped = terminalreporter.stats.get("skipped", [])
    reasons: Counter[str] = Counter()
    for report in skipped:
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
        reasons[reason.removeprefix("Skipped: ")] += 1
    if reasons:
        terminalreporter.section("skipped", sep="-")
        for reason, count in reasons.most_common():
            terminalreporter.line(f"{count} skipped: {reason}")
