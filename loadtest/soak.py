"""Holding one level for a long time (:func:`run_soak`) and flagging drift (:func:`find_drift`).

The closed loop of :mod:`loadtest.sweep` runs at one concurrency for the whole duration; every
``interval`` seconds the requests that finished in that interval make a row: throughput, TTFT
p99, errors, and the target's resident memory when a Prometheus ``metrics_url`` is given
(``process_resident_memory_bytes``, summed over series). A row **drifts** when, against the first
row, TTFT p99 or memory rose more than ``limit`` (20%) or throughput fell more than ``limit``.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp

from loadtest.client import Client, Result, Target
from loadtest.monitor import SelfMonitor
from loadtest.stats import percentile
from loadtest.sweep import closed_loop
from loadtest.workload import Workload, spec_factory

__all__ = ["SoakResult", "SoakRow", "find_drift", "parse_rss", "read_rss", "run_soak"]


@dataclass(slots=True, kw_only=True)
class SoakRow:
    t_s: float
    requests: int
    output_tps: float
    ttft_p99_ms: float
    errors: int
    rss_bytes: float | None
    client_cpu: float
    drift: list[str] = field(default_factory=list)


@dataclass(slots=True, kw_only=True)
class SoakResult:
    target: dict[str, str]
    concurrency: int
    interval_s: float
    rows: list[SoakRow] = field(default_factory=list)

    @property
    def drifted(self) -> bool:
        return any(r.drift for r in self.rows)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "soak",
            "target": self.target,
            "concurrency": self.concurrency,
            "interval_s": self.interval_s,
            "rows": [asdict(r) for r in self.rows],
            "drifted": self.drifted,
        }


def parse_rss(text: str) -> float | None:
    """Sum of ``process_resident_memory_bytes`` samples in Prometheus text, or None."""
    name = "process_resident_memory_bytes"
    total, seen = 0.0, False
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        rest = line[len(name) :]
        if rest.startswith("{"):
            rest = rest[rest.find("}") + 1 :]
        elif not rest.startswith(" "):
            continue  # another metric sharing the prefix
        try:
            total += float(rest.split()[0])  # "value [timestamp]"
            seen = True
        except (ValueError, IndexError):
            continue
    return total if seen else None


async def read_rss(session: aiohttp.ClientSession, url: str) -> float | None:
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=5)) as resp:
            return parse_rss(await resp.text()) if resp.status == 200 else None
    except (aiohttp.ClientError, TimeoutError):
        return None


def find_drift(first: SoakRow, row: SoakRow, limit: float = 0.20) -> list[str]:
    """What drifted in ``row`` against ``first`` (pure)."""
    out = []
    if first.ttft_p99_ms > 0 and row.ttft_p99_ms > first.ttft_p99_ms * (1 + limit):
        out.append(f"TTFT p99 +{row.ttft_p99_ms / first.ttft_p99_ms - 1:.0%}")
    if first.output_tps > 0 and row.output_tps < first.output_tps * (1 - limit):
        out.append(f"throughput {row.output_tps / first.output_tps - 1:.0%}")
    if first.rss_bytes and row.rss_bytes and row.rss_bytes > first.rss_bytes * (1 + limit):
        out.append(f"memory +{row.rss_bytes / first.rss_bytes - 1:.0%}")
    if row.errors and not first.errors:
        out.append(f"{row.errors} errors")
    return out


def _row(
    t_s: float, window: list[Result], interval: float, rss: float | None, cpu: float
) -> SoakRow:
    good = [r for r in window if r.ok]
    ttfts = [r.ttft_s * 1e3 for r in good if r.ttft_s is not None]
    return SoakRow(
        t_s=t_s,
        requests=len(window),
        output_tps=sum(r.output_tokens for r in good) / interval,
        ttft_p99_ms=percentile(ttfts, 99.0) if ttfts else math.nan,
        errors=len(window) - len(good),
        rss_bytes=rss,
        client_cpu=cpu,
    )


async def run_soak(
    target: Target,
    workload: Workload,
    *,
    concurrency: int,
    duration: float,
    interval: float = 60.0,
    metrics_url: str | None = None,
    timeout: float = 300.0,
    drift_limit: float = 0.20,
    on_row: Callable[[SoakRow], None] | None = None,
    on_result: Callable[[Result], None] | None = None,
) -> SoakResult:
    """Hold ``concurrency`` for ``duration`` seconds, a row every ``interval``."""
    out = SoakResult(
        target={"url": target.url, "model": target.model},
        concurrency=concurrency,
        interval_s=interval,
    )
    window: list[Result] = []

    def collect(res: Result) -> None:
        window.append(res)
        if on_result is not None:
            on_result(res)

    mon = SelfMonitor()
    mon.start()
    async with Client(concurrency, timeout=timeout) as client, aiohttp.ClientSession() as meta:
        load = asyncio.create_task(
            closed_loop(
                client,
                spec_factory(target, workload),
                concurrency,
                duration=duration,
                requests=None,
                on_result=collect,
            )
        )
        t0 = time.perf_counter()
        n = 0
        while not load.done():
            n += 1
            due = t0 + n * interval
            done, _ = await asyncio.wait({load}, timeout=max(0.0, due - time.perf_counter()))
            span = min(interval, time.perf_counter() - (due - interval))
            if done and span < interval * 0.5:
                break  # only the drain tail of in-flight requests: no row
            batch, window[:] = window[:], []
            rss = await read_rss(meta, metrics_url) if metrics_url else None
            row = _row(time.perf_counter() - t0, batch, span, rss, mon.report().cpu)
            mon.reset()
            if out.rows:
                row.drift = find_drift(out.rows[0], row, drift_limit)
            out.rows.append(row)
            if on_row is not None:
                on_row(row)
        await load
    await mon.stop()
    return out
