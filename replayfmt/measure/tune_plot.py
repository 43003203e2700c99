"""Drawing tune-replay's results for a person: a line chart when the search swept one axis (time
against that axis, failures marked, the captured shape marked), a heatmap when it swept two (the
captured cell outlined, failed cells grey and crossed). With more than two axes, the heatmap is
over the two with the most values, each cell the best over the others (the title says so).

matplotlib is imported lazily by :func:`plot` (an optional extra: ``replayfmt[plot]``), which owns
the message for a missing one.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from replayfmt.errors import ReplayUsageError
from replayfmt.format import model as m
from replayfmt.format.names import demangle
from replayfmt.measure.tune import CandidateResult, Targets

AXES = ("grid", "block", "smem", "max_registers")
AXIS_LABELS = {
    "grid": "grid",
    "block": "block (threads)",
    "smem": "dynamic shared memory (bytes)",
    "max_registers": "register cap",
}
TITLE_WIDTH = 60  # characters per title line: a long (demangled template) kernel name wraps, never runs off


@dataclass(frozen=True)
class Point:
    """One result at its effective coordinates (captured values filled in) on every axis."""

    coords: dict[str, str]
    median_ms: float | None
    stddev_ms: float | None
    ok: bool
    baseline: bool


def _dims_label(d: m.Dims) -> str:
    return str(d[0]) if d[1:] == (1, 1) else f"{d[0]},{d[1]},{d[2]}"


def points_of(results: list[CandidateResult], targets: Targets) -> list[Point]:
    out = []
    for r in results:
        c = r.candidate
        coords = {
            "grid": _dims_label(c.grid or targets.grid),
            "block": _dims_label(c.block or targets.block),
            "smem": str(targets.smem if c.smem is None else c.smem),
            "max_registers": "none" if c.max_registers is None else str(c.max_registers),
        }
        out.append(Point(coords, r.median_ms, r.stddev_ms, r.ok and r.median_ms is not None, r.baseline))
    return out


def _sort_key(label: str) -> tuple[int, list[int]]:
    if label == "none":
        return (0, [])
    return (1, [int(v) for v in label.split(",")])


def swept_axes(points: list[Point]) -> list[str]:
    """The axes along which the results differ, most values first (ties: grid, block, smem, regs)."""
    counts = {axis: len({p.coords[axis] for p in points}) for axis in AXES}
    return sorted((a for a in AXES if counts[a] > 1), key=lambda a: (-counts[a], AXES.index(a)))


def title(targets: Targets, note: str) -> str:
    name = demangle(targets.kernel)
    lines = textwrap.wrap(name, TITLE_WIDTH, break_long_words=True, break_on_hyphens=False)[:3]
    if len(lines) == 3 and sum(map(len, lines)) < len(name):
        lines[-1] = lines[-1][: TITLE_WIDTH - 3] + "..."
    return "\n".join([*lines, note])


def figure(results: list[CandidateResult], targets: Targets) -> Any:
    """The matplotlib Figure for these results (line chart or heatmap, as the module says)."""
    points = points_of(results, targets)
    axes = swept_axes(points)
    if len(axes) <= 1:
        return _line_chart(points, axes[0] if axes else "block", targets)
    rows, cols = sorted(axes[:2], key=AXES.index)  # grid down, block across, as the flags read
    return _heatmap(points, rows, cols, axes[2:], targets)


def _line_chart(points: list[Point], axis: str, targets: Targets) -> Any:
    import matplotlib.pyplot as plt

    labels = sorted({p.coords[axis] for p in points}, key=_sort_key)
    x_of = {label: i for i, label in enumerate(labels)}
    best: dict[str, Point] = {}
    for p in points:
        if p.ok and (p.coords[axis] not in best or p.median_ms < best[p.coords[axis]].median_ms):  # type: ignore[operator]
            best[p.coords[axis]] = p
    fig, ax = plt.subplots(figsize=(max(6.4, 0.55 * len(labels) + 2.5), 4.8), layout="constrained")
    good = sorted(best.values(), key=lambda p: x_of[p.coords[axis]])
    xs = [x_of[p.coords[axis]] for p in good]
    ys = [p.median_ms for p in good]
    ax.errorbar(
        xs,
        ys,
        yerr=[p.stddev_ms or 0.0 for p in good],
        marker="o",
        color="tab:blue",
        capsize=3,
        label="median device time (± stddev)",
    )
    bottom = min(ys) if ys else 1.0
    failed = sorted({x_of[p.coords[axis]] for p in points if not p.ok} - set(xs))
    if failed:  # no time to plot: a cross on the axis, labelled in the legend
        ax.plot(
            failed,
            [bottom] * len(failed),
            linestyle="none",
            marker="x",
            markersize=10,
            color="tab:red",
            label="failed (fault, timeout or wrong result)",
        )
    captured = [p for p in points if p.baseline and p.ok]
    if captured:
        p = captured[0]
        star = {"marker": "*", "markersize": 16, "color": "tab:orange", "markeredgecolor": "black", "zorder": 3}
        ax.plot(
            [x_of[p.coords[axis]]],
            [p.median_ms],
            linestyle="none",
            label=f"captured shape ({p.median_ms:.4g} ms)",
            **star,
        )
    ax.set_xticks(range(len(labels)), labels, rotation=45 if max(map(len, labels)) > 4 else 0)
    ax.set_xlim(-0.5, len(labels) - 0.5)
    ax.set_xlabel(AXIS_LABELS[axis])
    ax.set_ylabel("median device time (ms)")
    if ys and min(ys) > 0 and max(ys) / min(ys) > 20:
        ax.set_yscale("log")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    ax.set_title(title(targets, f"time over {axis} (lower is better)"), fontsize=9)
    return fig


def _heatmap(points: list[Point], row_axis: str, col_axis: str, others: list[str], targets: Targets) -> Any:
    import matplotlib.pyplot as plt
    import numpy as np

    rows = sorted({p.coords[row_axis] for p in points}, key=_sort_key)
    cols = sorted({p.coords[col_axis] for p in points}, key=_sort_key)
    values = np.full((len(rows), len(cols)), np.nan)
    tried = np.zeros((len(rows), len(cols)), dtype=bool)
    for p in points:
        i, j = rows.index(p.coords[row_axis]), cols.index(p.coords[col_axis])
        tried[i, j] = True
        if p.ok:
            values[i, j] = p.median_ms if np.isnan(values[i, j]) else min(values[i, j], p.median_ms)
    width = max(6.4, 0.9 * len(cols) + 3.0)
    height = max(4.0, 0.45 * len(rows) + 2.2)
    fig, ax = plt.subplots(figsize=(width, height), layout="constrained")
    ax.set_facecolor("#d9d9d9")  # cells never run (pruned or not in the space)
    image = ax.imshow(np.ma.masked_invalid(values), cmap="viridis_r", aspect="auto")
    fig.colorbar(image, ax=ax, label="median device time (ms)", shrink=0.9, pad=0.02)
    if len(rows) * len(cols) <= 120:  # the numbers themselves, where they fit
        finite = values[np.isfinite(values)]
        middle = (finite.min() + finite.max()) / 2 if finite.size else 0.0
        for i in range(len(rows)):
            for j in range(len(cols)):
                if math.isfinite(values[i, j]):
                    dark = values[i, j] > middle  # viridis_r: high values are dark
                    ax.text(
                        j,
                        i,
                        f"{values[i, j]:.3g}",
                        ha="center",
                        va="center",
                        fontsize=7,
                        color="white" if dark else "black",
                    )
                elif tried[i, j]:
                    ax.text(j, i, "x", ha="center", va="center", fontsize=10, color="tab:red", fontweight="bold")
    ax.set_xticks(range(len(cols)), cols, rotation=45 if max(map(len, cols)) > 4 else 0)
    ax.set_yticks(range(len(rows)), rows)
    ax.set_xlabel(AXIS_LABELS[col_axis])
    ax.set_ylabel(AXIS_LABELS[row_axis])
    captured = next((p for p in points if p.baseline), None)
    if captured is not None:
        i, j = rows.index(captured.coords[row_axis]), cols.index(captured.coords[col_axis])
        ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=2.5))
    note = "red frame: captured shape; x: failed; grey: not run"
    if others:
        note += f"\neach cell: best over {', '.join(others)}"
    ax.set_title(title(targets, note), fontsize=9)
    return fig


def check_plot_path(path: Path) -> None:
    """Fail before any work when ``path`` could not take the plot: matplotlib missing, or an
    extension that names no image format it writes (without one, matplotlib would add ".png" and
    the plot would land beside the name given)."""
    try:
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError:
        raise ReplayUsageError("--plot needs matplotlib: pip install 'replayfmt[plot]'") from None
    formats = FigureCanvasBase.get_supported_filetypes()
    suffix = path.suffix.lower().lstrip(".")
    if suffix not in formats:
        what = f"'.{suffix}' is no image format matplotlib writes" if suffix else "no extension names the format"
        raise ReplayUsageError(f"--plot {path}: {what}; use .png, .svg or .pdf (or {', '.join(sorted(formats))})")


def plot(results: list[CandidateResult], targets: Targets, path: Path) -> None:
    """Draw the results to ``path`` (PNG): a line chart over one swept axis, a heatmap over two
    (see :func:`figure`)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ReplayUsageError("--plot needs matplotlib: pip install 'replayfmt[plot]'") from None

    fig = figure(results, targets)
    try:
        fig.savefig(path, dpi=120)
    except OSError as exc:
        raise ReplayUsageError(f"--plot {path}: cannot write ({exc.strerror})") from None
    finally:
        plt.close(fig)
