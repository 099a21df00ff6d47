"""PNG charts with matplotlib's Agg backend (no display needed).

- ``throughput.png``: output tokens/s vs concurrency (log2 axis), plateau and degradation marked;
  one line per endpoint in a comparison;
- ``ttft.png`` / ``tpot.png``: p50/p95/p99 vs concurrency;
- ``replay.png``: the replay timeline: arrivals per second and TTFT of each request by class;
- ``soak.png``: throughput, TTFT p99 and target memory per interval.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from loadtest.replay import ReplayResult
    from loadtest.soak import SoakResult
    from loadtest.sweep import SweepResult

__all__ = ["LOG_SPAN", "latency_figure", "plot_replay", "plot_soak", "plot_sweeps"]

#: a latency axis goes logarithmic only when its data spans at least this factor; below it a
#: log axis shows one or two labelled ticks (6.5-11.5 ms showed only "10")
LOG_SPAN = 10.0

_DPI = 90
_PLAIN = FuncFormatter(lambda y, _pos: f"{y:g}")


def _log_y(ax: Axes) -> None:
    """Log scale with plain numbers (20, 50, 100), not 2x10^1."""
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(_PLAIN)
    ax.yaxis.set_minor_formatter(NullFormatter())


def _value_y(ax: Axes, values: list[float | None]) -> None:
    """Log scale for data spanning >= :data:`LOG_SPAN`, else linear with 4-8 labelled ticks."""
    finite = [v for v in values if v is not None and math.isfinite(v) and v > 0]
    if finite and max(finite) / min(finite) >= LOG_SPAN:
        _log_y(ax)
        return
    ax.set_yscale("linear")
    ax.yaxis.set_major_locator(MaxNLocator(nbins=7, steps=[1, 2, 2.5, 5, 10], min_n_ticks=4))
    ax.yaxis.set_major_formatter(_PLAIN)


_STYLES = {"p50": "-", "p95": "--", "p99": ":"}


def _conc_axis(ax: Axes, levels: list[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels)
    ax.set_xticklabels([str(c) for c in levels])
    ax.set_xlabel("concurrency (requests in flight)")
    ax.grid(True, alpha=0.3)


def _save(fig: Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=_DPI)
    plt.close(fig)
    return path


def _label(s: SweepResult) -> str:
    return s.target.get("label") or s.target.get("model") or s.target.get("url", "")


def plot_sweeps(sweeps: list[SweepResult], out_dir: str | Path) -> list[Path]:
    """Throughput, TTFT and TPOT charts for one sweep or several side by side."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    levels = sorted({lv.concurrency for s in sweeps for lv in s.levels})
    paths = []

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for s in sweeps:
        xs = [lv.concurrency for lv in s.levels]
        ys = [lv.summary.output_tps for lv in s.levels]
        ax.plot(xs, ys, marker="o", label=f"{_label(s)} output tokens/s")
        if s.plateau:
            y = dict(zip(xs, ys, strict=True)).get(s.plateau.level)
            ax.axvline(s.plateau.level, color="green", alpha=0.4, linestyle="--")
            ax.annotate(
                f"plateau ({s.plateau.level})",
                (s.plateau.level, y or 0),
                textcoords="offset points",
                xytext=(5, -15),
                color="green",
            )
        if s.degradation:
            ax.axvline(
                s.degradation.level,
                color="red",
                alpha=0.4,
                linestyle=":",
                label=f"{_label(s)} degradation ({s.degradation.level})",
            )
    _conc_axis(ax, levels)
    ax.set_ylabel("output throughput (tokens/s)")
    ax.set_ylim(bottom=0)
    ax.set_title("Aggregate output throughput vs concurrency")
    ax.legend(loc="lower right")
    paths.append(_save(fig, out / "throughput.png"))

    for key in ("ttft_ms", "tpot_ms"):
        fig = latency_figure(sweeps, key)
        paths.append(_save(fig, out / f"{key.split('_')[0]}.png"))
    return paths


_LATENCY = {"ttft_ms": ("Time to first token", "TTFT (ms)"),
            "tpot_ms": ("Time per output token", "TPOT (ms)")}


def latency_figure(sweeps: list[SweepResult], key: str) -> Figure:
    """p50/p95/p99 of ``key`` (``ttft_ms`` or ``tpot_ms``) vs concurrency, one colour per
    sweep; the y axis is linear unless the data spans :data:`LOG_SPAN` or more."""
    title, unit = _LATENCY[key]
    levels = sorted({lv.concurrency for s in sweeps for lv in s.levels})
    fig, ax = plt.subplots(figsize=(7, 4.2))
    values: list[float | None] = []
    for i, s in enumerate(sweeps):
        color = f"C{i}"
        xs = [lv.concurrency for lv in s.levels]
        for p, style in _STYLES.items():
            ys = [getattr(lv.summary, key).get(p) for lv in s.levels]
            values += ys
            ax.plot(xs, ys, linestyle=style, marker=".", color=color, label=f"{_label(s)} {p}")
    _conc_axis(ax, levels)
    ax.set_ylabel(unit)
    _value_y(ax, values)
    ax.set_title(f"{title} percentiles vs concurrency")
    ax.legend(loc="upper left", fontsize="small")
    return fig


def plot_replay(result: ReplayResult, out_dir: str | Path) -> Path:
    """Arrivals per second and per-request TTFT over the replay, by class."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(8, 5.5), sharex=True, gridspec_kw={"height_ratios": [1, 2]}
    )
    classes = sorted({p["class"] for p in result.timeline})
    end = max((p["at_s"] for p in result.timeline), default=1.0)
    bins = max(1, int(end) + 1)
    by_class = [[p for p in result.timeline if p["class"] == k] for k in classes]
    top.hist(
        [[p["at_s"] for p in pts] for pts in by_class],
        bins=bins,
        range=(0, bins),
        stacked=True,
        color=[f"C{i}" for i in range(len(classes))],
        label=classes,
    )
    for i, (klass, pts) in enumerate(zip(classes, by_class, strict=True)):
        ok = [p for p in pts if p["ttft_ms"] is not None and not p["error"]]
        bottom.scatter(
            [p["at_s"] for p in ok],
            [p["ttft_ms"] for p in ok],
            s=8,
            color=f"C{i}",
            label=f"{klass} TTFT",
        )
        bad = [p for p in pts if p["error"]]
        if bad:
            bottom.scatter(
                [p["at_s"] for p in bad],
                [1.0] * len(bad),
                marker="x",
                color="red",
                label=f"{klass} errors",
            )
        target = next((c.ttft_target_s for c in result.classes if c.klass == klass), None)
        if target:
            bottom.axhline(
                target * 1000,
                color=f"C{i}",
                linestyle="--",
                alpha=0.6,
                label=f"{klass} target {target * 1000:g} ms",
            )
    top.set_ylabel("arrivals per second")
    top.set_title("Replay timeline: arrivals and TTFT by class")
    top.legend(loc="upper right", fontsize="small")
    bottom.set_ylabel("TTFT (ms)")
    _log_y(bottom)
    bottom.set_xlabel("time since start of replay (s)")
    bottom.legend(loc="upper right", fontsize="small")
    for ax in (top, bottom):
        ax.grid(True, alpha=0.3)
    return _save(fig, out / "replay.png")


def plot_soak(result: SoakResult, out_dir: str | Path) -> Path:
    """Throughput, TTFT p99 and memory per soak interval."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ts = [r.t_s for r in result.rows]
    ax.plot(
        ts, [r.output_tps for r in result.rows], marker="o", color="C0", label="output tokens/s"
    )
    ax.set_ylabel("output throughput (tokens/s)")
    ax.set_xlabel("time (s)")
    ax.set_ylim(bottom=0)
    right = ax.twinx()
    right.plot(
        ts, [r.ttft_p99_ms for r in result.rows], marker="s", color="C1", label="TTFT p99 (ms)"
    )
    if any(r.rss_bytes for r in result.rows):
        right.plot(
            ts,
            [(r.rss_bytes or 0) / 2**20 for r in result.rows],
            marker="^",
            color="C2",
            label="target RSS (MiB)",
        )
    right.set_ylabel("TTFT p99 (ms) / RSS (MiB)")
    ax.set_title(f"Soak at concurrency {result.concurrency}")
    lines = ax.get_legend_handles_labels()
    rlines = right.get_legend_handles_labels()
    ax.legend(lines[0] + rlines[0], lines[1] + rlines[1], loc="lower right")
    ax.grid(True, alpha=0.3)
    return _save(fig, out / "soak.png")
