"""Rich output: the live progress bar (:class:`RunProgress`) and the final tables.

Progress and warnings go to stderr, tables to stdout, so ``--json -`` style piping stays clean.
The bar is updated at most every 0.2 s, never per token, so drawing it costs the run nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

if TYPE_CHECKING:
    from loadtest.client import Result
    from loadtest.compare import CompareResult
    from loadtest.cost import CostEstimate
    from loadtest.probe import ProbeResult
    from loadtest.replay import ReplayResult
    from loadtest.soak import SoakResult, SoakRow
    from loadtest.sweep import LevelResult, SweepResult

__all__ = [
    "RunProgress",
    "compare_table",
    "cost_report",
    "fmt",
    "level_line",
    "print_compare",
    "print_cost",
    "print_probe",
    "print_replay",
    "print_soak_row",
    "print_sweep",
    "soak_table",
    "sweep_table",
]

# Tables are wide: when the output is not a terminal (a file, CI), do not wrap them at 80.
out = Console(width=None if Console().is_terminal else 160)
err = Console(stderr=True, width=None if Console(stderr=True).is_terminal else 160)


def fmt(value: Any, digits: int = 1, unit: str = "") -> str:
    """A number for a table cell; '-' for None/NaN."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    if isinstance(value, int):
        return f"{value:,}{unit}"
    return f"{value:,.{digits}f}{unit}"


def _errors(errors: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in errors.items()) or "0"


class RunProgress:
    """A live bar per level or phase; ``on_result`` is the per-request hook."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[done]} done, {task.fields[errors]} errors"),
            TimeElapsedColumn(),
            console=err,
            disable=not enabled,
            transient=False,
        )
        self._task: TaskID | None = None
        self._done = 0
        self._errors = 0
        self._t0 = 0.0
        self._duration: float | None = None
        self._last = 0.0
        self._ticker: asyncio.Task[None] | None = None

    def __enter__(self) -> RunProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
        self._progress.stop()

    def phase(
        self, description: str, *, requests: int | None = None, duration: float | None = None
    ) -> None:
        """Start a new bar: by request count, else by time."""
        if self._task is not None:
            self._refresh(final=True)
        self._done = self._errors = 0
        self._t0 = time.perf_counter()
        self._duration = duration if requests is None else None
        total = requests if requests is not None else duration
        self._task = self._progress.add_task(description, total=total, done=0, errors=0)
        if self._ticker is None and self.enabled and self._duration is not None:
            with contextlib.suppress(RuntimeError):
                self._ticker = asyncio.get_running_loop().create_task(self._tick())

    def on_result(self, res: Result) -> None:
        self._done += 1
        if res.error is not None:
            self._errors += 1
        now = time.perf_counter()
        if now - self._last >= 0.2:
            self._last = now
            self._refresh()

    def _refresh(self, final: bool = False) -> None:
        if self._task is None:
            return
        if self._duration is not None:
            elapsed = time.perf_counter() - self._t0
            completed = self._duration if final else min(elapsed, self._duration)
        else:
            completed = self._done
        self._progress.update(self._task, completed=completed, done=self._done, errors=self._errors)

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(0.25)
            self._refresh()

    def log(self, text: str) -> None:
        self._progress.console.print(text)


def sweep_table(result: SweepResult, title: str | None = None) -> Table:
    t = Table(
        title=title
        or f"Sweep: {result.target.get('label') or result.target.get('url')} "
        f"model {result.target.get('model')}"
    )
    for col in (
        "conc",
        "req/s",
        "out tok/s",
        "TTFT p50/p95/p99 ms",
        "TPOT p50/p95/p99 ms",
        "E2E p50/p99 ms",
        "errors",
        "client cpu",
    ):
        t.add_column(col, justify="right")
    for lv in result.levels:
        s = lv.summary
        mark = ""
        if result.plateau and result.plateau.level == lv.concurrency:
            mark = " [green]plateau[/]"
        if result.degradation and result.degradation.level == lv.concurrency:
            mark += " [red]degraded[/]"
        t.add_row(
            f"{lv.concurrency}{mark}",
            fmt(s.rps, 2),
            fmt(s.output_tps, 0),
            " / ".join(fmt(s.ttft_ms.get(k)) for k in ("p50", "p95", "p99")),
            " / ".join(fmt(s.tpot_ms.get(k), 2) for k in ("p50", "p95", "p99")),
            " / ".join(fmt(s.e2e_ms.get(k), 0) for k in ("p50", "p99")),
            _errors(s.errors),
            f"{lv.client.cpu:.0%}",
        )
    return t


def _findings(result: SweepResult) -> list[str]:
    lines = []
    if result.plateau:
        lines.append(f"[green]Plateau[/]: {result.plateau.reason}.")
    else:
        lines.append(
            "[yellow]No plateau[/]: throughput still rises at the highest level; add higher levels."
        )
    if result.degradation:
        lines.append(
            f"[red]Degradation[/] at concurrency {result.degradation.level}: "
            f"{result.degradation.reason}."
        )
    else:
        lines.append("No degradation: no errors and no throughput drop at any level.")
    warned = {lv.warning for lv in result.levels if lv.warning}
    lines += [f"[yellow]Warning[/]: {w}" for w in sorted(warned)]
    return lines


def print_sweep(result: SweepResult, title: str | None = None) -> None:
    out.print(sweep_table(result, title))
    for line in _findings(result):
        out.print(line)


def level_line(lv: LevelResult) -> str:
    s = lv.summary
    line = (
        f"{lv.label + ' ' if lv.label else ''}c={lv.concurrency}: {s.output_tps:,.0f} tok/s, "
        f"TTFT p99 {fmt(s.ttft_ms.get('p99'))} ms, errors {_errors(s.errors)}"
    )
    if lv.warning:
        line += f"\n  [yellow]warning[/]: {lv.warning}"
    return line


def print_probe(result: ProbeResult) -> None:
    t = Table(title=f"Probe: {result.target['url']} model {result.target['model']}")
    t.add_column("figure")
    t.add_column("value", justify="right")
    t.add_row("TTFT", fmt(result.ttft_ms, 1, " ms"))
    t.add_row("total latency", fmt(result.e2e_ms, 1, " ms"))
    t.add_row("output tokens", fmt(result.output_tokens))
    t.add_row("tokens/s (output / total time)", fmt(result.tokens_per_s, 1))
    t.add_row("decode tokens/s (after first)", fmt(result.decode_tokens_per_s, 1))
    t.add_row("finish_reason", str(result.finish_reason))
    out.print(t)
    out.print("[bold]Text:[/]")
    out.print(result.text or "(empty)", markup=False, highlight=False)
    for c in result.checks:
        tag = "[green]PASS[/]" if c.passed else "[red]FAIL[/]"
        out.print(f"{tag} {c.name}: {c.detail}", highlight=False)
    out.print("[bold green]probe passed[/]" if result.passed else "[bold red]probe failed[/]")


def cost_report(est: CostEstimate, currency: str = "$") -> tuple[Table, list[str]]:
    t = Table(title="Cost per 1k tokens at each level (replica fully used)")
    for col in ("conc", "out tok/s", "per 1k output", "per 1k tokens (in+out)"):
        t.add_column(col, justify="right")
    for lc in est.levels:
        mark = ""
        if lc.concurrency == est.max_concurrency:
            mark = " [green]plateau[/]" if est.plateau_found else " [yellow]best[/]"
        t.add_row(
            f"{lc.concurrency}{mark}",
            fmt(lc.output_tps, 0),
            f"{currency}{lc.per_1k_output:.5f}",
            f"{currency}{lc.per_1k_tokens:.5f}",
        )
    inp = est.inputs
    m = 1e6
    days = inp["days"]
    lines = [
        f"Workload: {inp['requests_per_day']:,.0f} requests/day x {inp['output_tokens']:,} output "
        f"tokens, {inp['context_tokens']:,}-token context re-sent with each request",
        f"Max concurrency the hardware holds "
        f"({'plateau' if est.plateau_found else 'best level, no plateau'}): "
        f"{est.max_concurrency} "
        f"({est.plateau_tps:,.0f} output tok/s per replica)",
        f"Target throughput: {est.target_tps:,.1f} output tok/s mean"
        + (
            f", {est.provision_tps:,.1f} provisioned (peak x{inp['peak_factor']:g})"
            if inp["peak_factor"] != 1
            else ""
        )
        + f" -> {est.replicas} replica(s), {est.utilisation:.1%} used",
        f"Mean latency at the target throughput: {fmt(est.latency_ms / 1000, 2)} s "
        f"({est.latency_level})",
        f"{days}-day output tokens: {est.output_tokens / m:,.1f} M",
        f"{days}-day context (history) re-send: {est.context_tokens / m:,.1f} M tokens "
        f"({est.context_share:.0%} of all tokens processed)",
        f"{days}-day total tokens: {est.total_tokens / m:,.1f} M",
        f"{days}-day cost: {currency}{est.total_cost:,.2f} (hardware and fees "
        f"{currency}{est.hardware_cost:,.2f}, operations {currency}{est.ops_cost:,.2f}, "
        f"per-token fees {currency}{est.token_fees:,.2f})",
        f"All-in: {currency}{est.per_1k_tokens:.5f} per 1k tokens (in+out), "
        f"{currency}{est.per_1k_output:.5f} per 1k output tokens",
    ]
    if est.hosted:
        h = est.hosted
        lines += [
            f"Hosted API, same tokens: {currency}{h['total']:,.2f} over {days} days "
            f"(output {currency}{h['output']:,.2f}; context re-send {currency}{h['context']:,.2f})"
            f", {currency}{h['per_1k_tokens']:.5f} per 1k tokens",
        ]
    if est.baseline_ratio is not None:
        lines.append(f"Plateau throughput is {est.baseline_ratio:.1f}x today's baseline")
    lines += [f"[yellow]Note[/]: {n}" for n in est.notes]
    return t, lines


def print_cost(est: CostEstimate) -> None:
    table, lines = cost_report(est)
    out.print(table)
    for line in lines:
        out.print(line, highlight=False)


def print_replay(result: ReplayResult) -> None:
    t = Table(title=f"Replay: {result.rows} requests against {result.target['url']}")
    for col in (
        "class",
        "requests",
        "out tok/s",
        "TTFT p50/p95/p99 ms",
        "TPOT p50 ms",
        "E2E p50/p99 ms",
        "TTFT target",
        "attained",
        "errors",
    ):
        t.add_column(col, justify="right")
    for c in result.classes:
        s = c.summary
        t.add_row(
            c.klass,
            fmt(s.requests),
            fmt(s.output_tps, 0),
            " / ".join(fmt(s.ttft_ms.get(k)) for k in ("p50", "p95", "p99")),
            fmt(s.tpot_ms.get("p50"), 2),
            " / ".join(fmt(s.e2e_ms.get(k), 0) for k in ("p50", "p99")),
            fmt(c.ttft_target_s * 1000, 0, " ms") if c.ttft_target_s is not None else "-",
            f"{c.attainment:.1%}" if c.attainment is not None else "-",
            _errors(s.errors),
        )
    out.print(t)
    lag = result.lag_ms
    out.print(
        f"Arrival accuracy: lag behind schedule p50 {fmt(lag.get('p50'), 2)} ms, "
        f"p99 {fmt(lag.get('p99'), 2)} ms, max {fmt(result.lag_max_ms, 2)} ms; "
        f"wall {result.wall_s:.1f} s",
        highlight=False,
    )
    if result.history_tokens:
        out.print(
            f"Input tokens {result.input_tokens:,}, of which history re-sent "
            f"~{result.history_tokens:,}",
            highlight=False,
        )
    if result.warning:
        out.print(f"[yellow]Warning[/]: {result.warning}")


def compare_table(result: CompareResult) -> Table:
    la = result.a.target.get("label") or "A"
    lb = result.b.target.get("label") or "B"
    t = Table(title=f"Compare: {lb} - {la} (added latency) and {lb} / {la} (throughput)")
    for col in (
        "conc",
        f"{la} tok/s",
        f"{lb} tok/s",
        "ratio",
        "+TTFT p50/p95/p99 ms",
        "+E2E p50/p99 ms",
        "+TPOT p50 ms",
        f"{la} err",
        f"{lb} err",
    ):
        t.add_column(col, justify="right")
    for d, a, b in zip(result.deltas, result.a.levels, result.b.levels, strict=False):
        t.add_row(
            str(d.concurrency),
            fmt(a.summary.output_tps, 0),
            fmt(b.summary.output_tps, 0),
            fmt(d.throughput_ratio, 3),
            " / ".join(fmt(d.ttft_ms.get(k), 2) for k in ("p50", "p95", "p99")),
            " / ".join(fmt(d.e2e_ms.get(k), 1) for k in ("p50", "p99")),
            fmt(d.tpot_ms.get("p50"), 3),
            _errors(a.summary.errors),
            _errors(b.summary.errors),
        )
    return t


def print_compare(result: CompareResult) -> None:
    out.print(compare_table(result))
    for side in (result.a, result.b):
        label = side.target.get("label") or side.target.get("url")
        for line in _findings(side):
            out.print(f"{label}: {line}")


def soak_table(result: SoakResult) -> Table:
    t = Table(title=f"Soak at concurrency {result.concurrency}, a row per {result.interval_s:g} s")
    for col in (
        "t (s)",
        "requests",
        "out tok/s",
        "TTFT p99 ms",
        "errors",
        "target RSS MiB",
        "drift",
    ):
        t.add_column(col, justify="right")
    for r in result.rows:
        t.add_row(*_soak_cells(r))
    return t


def _soak_cells(r: SoakRow) -> list[str]:
    rss = fmt(r.rss_bytes / 2**20, 1) if r.rss_bytes else "-"
    drift = "[red]" + "; ".join(r.drift) + "[/]" if r.drift else "ok"
    return [
        fmt(r.t_s, 0),
        fmt(r.requests),
        fmt(r.output_tps, 0),
        fmt(r.ttft_p99_ms, 1),
        fmt(r.errors),
        rss,
        drift,
    ]


def print_soak_row(r: SoakRow, progress: RunProgress | None = None) -> None:
    cells = _soak_cells(r)
    text = (
        f"soak t={cells[0]} s: {cells[1]} requests, {cells[2]} tok/s, TTFT p99 {cells[3]} "
        f"ms, errors {cells[4]}, RSS {cells[5]} MiB, {cells[6]}"
    )
    (progress.log if progress else err.print)(text)
