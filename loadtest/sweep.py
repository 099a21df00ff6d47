"""Closed-loop concurrency sweep: run levels, summarise them, find the plateau and degradation.

At a level of concurrency ``c``, ``c`` workers each send a request, wait for its stream to end and
send the next, for ``duration`` seconds or until ``requests`` requests were sent. With a duration,
requests still in flight at the end are awaited (no new ones start), and the level's wall time is
first start -> last end, so the tail is counted. ``processes > 1`` splits each level's workers over
that many processes, each with its own uvloop loop and connection pool, and merges the results
(``perf_counter_ns`` is the system-wide monotonic clock on Linux, comparable across processes).

**Plateau** (:func:`detect_plateau`): the first level ``c0`` whose next level ``c1`` gains less than
``min_gain`` (10%) of throughput *per doubling* of concurrency. For a step that is not a doubling,
the gain is normalised: ``(x1/x0) ** (1 / log2(c1/c0)) - 1``, so 8 -> 32 (two doublings) must
gain more than 21% overall (1.1^2) to count as still rising. The plateau level is the most
concurrency the target turns into throughput.

**Degradation** (:func:`detect_degradation`): the first level where throughput falls more than
``max_drop`` (10%) below the best level before it, or where any request fails or times out.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from loadtest.client import Client, Result, Target
from loadtest.monitor import SelfMonitor, SelfReport
from loadtest.stats import Summary, summarize
from loadtest.workload import SpecFactory, Workload, spec_factory

__all__ = [
    "Finding",
    "LevelResult",
    "LevelRunner",
    "SweepPlan",
    "SweepResult",
    "closed_loop",
    "detect_degradation",
    "detect_plateau",
    "run_sweep",
]

OnResult = Callable[[Result], None]


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepPlan:
    """Levels and how long each runs (``duration`` seconds or ``requests`` requests)."""

    levels: tuple[int, ...] = (1, 4, 8, 16, 32, 64)
    duration: float | None = 30.0
    requests: int | None = None
    processes: int = 1
    timeout: float = 300.0
    pause: float = 0.5
    min_gain: float = 0.10
    max_drop: float = 0.10

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True, kw_only=True)
class LevelResult:
    """One concurrency level: its summary and the load generator's own state."""

    concurrency: int
    summary: Summary
    client: SelfReport
    label: str = ""

    @property
    def warning(self) -> str | None:
        return self.client.warning

    def to_dict(self) -> dict[str, Any]:
        return {
            "concurrency": self.concurrency,
            "label": self.label,
            "summary": self.summary.to_dict(),
            "client": asdict(self.client),
            "warning": self.warning,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LevelResult:
        return cls(
            concurrency=int(data["concurrency"]),
            summary=Summary.from_dict(data["summary"]),
            client=SelfReport(**data["client"]),
            label=data.get("label", ""),
        )


@dataclass(frozen=True, slots=True)
class Finding:
    """A detected point: the concurrency level and a sentence saying why."""

    level: int
    reason: str


@dataclass(slots=True, kw_only=True)
class SweepResult:
    """A whole sweep against one target."""

    target: dict[str, str]
    workload: dict[str, Any]
    plan: dict[str, Any]
    levels: list[LevelResult] = field(default_factory=list)
    plateau: Finding | None = None
    degradation: Finding | None = None

    def analyse(self, min_gain: float = 0.10, max_drop: float = 0.10) -> None:
        """Fill in :attr:`plateau` and :attr:`degradation` from the levels."""
        pts = [(lv.concurrency, lv.summary.output_tps) for lv in self.levels]
        errs = [lv.summary.error_count for lv in self.levels]
        self.plateau = detect_plateau(pts, min_gain)
        self.degradation = detect_degradation(pts, errs, max_drop)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "sweep",
            "target": self.target,
            "workload": self.workload,
            "plan": self.plan,
            "levels": [lv.to_dict() for lv in self.levels],
            "plateau": asdict(self.plateau) if self.plateau else None,
            "degradation": asdict(self.degradation) if self.degradation else None,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SweepResult:
        out = cls(
            target=data.get("target", {}),
            workload=data.get("workload", {}),
            plan=data.get("plan", {}),
            levels=[LevelResult.from_dict(lv) for lv in data["levels"]],
        )
        out.plateau = Finding(**data["plateau"]) if data.get("plateau") else None
        out.degradation = Finding(**data["degradation"]) if data.get("degradation") else None
        return out


def _gain_per_doubling(c0: int, x0: float, c1: int, x1: float) -> float:
    doublings = math.log2(c1 / c0)
    if x0 <= 0 or doublings <= 0:
        return math.inf if x1 > x0 else 0.0
    return float((max(x1, 0.0) / x0) ** (1.0 / doublings) - 1.0)


def detect_plateau(points: Sequence[tuple[int, float]], min_gain: float = 0.10) -> Finding | None:
    """The first level after which throughput gains < ``min_gain`` per doubling (or None)."""
    pts = sorted(points)
    for (c0, x0), (c1, x1) in itertools.pairwise(pts):
        if x0 <= 0:
            continue  # nothing delivered yet (e.g. every request failed): no plateau to claim
        gain = _gain_per_doubling(c0, x0, c1, x1)
        if gain < min_gain:
            return Finding(
                c0,
                f"throughput stops rising at concurrency {c0} ({x0:,.0f} tok/s): {c0} -> {c1} "
                f"changes it {gain:+.1%} per doubling (threshold {min_gain:.0%})",
            )
    return None


def detect_degradation(
    points: Sequence[tuple[int, float]], errors: Sequence[int], max_drop: float = 0.10
) -> Finding | None:
    """The first level with errors, or throughput ``max_drop`` below the best before it."""
    best = 0.0
    best_c = 0
    for (c, x), n_err in zip(points, errors, strict=True):
        if n_err:
            return Finding(c, f"{n_err} failed or timed-out requests at concurrency {c}")
        if best > 0 and x < best * (1.0 - max_drop):
            return Finding(
                c,
                f"throughput falls to {x:,.0f} tok/s at concurrency {c}, "
                f"{1 - x / best:.0%} below {best:,.0f} at {best_c}",
            )
        if x > best:
            best, best_c = x, c
    return None


async def closed_loop(
    client: Client,
    factory: SpecFactory,
    concurrency: int,
    *,
    duration: float | None,
    requests: int | None,
    on_result: OnResult | None = None,
    first: int = 0,
) -> list[Result]:
    """Run ``concurrency`` send-wait-repeat workers; returns every result."""
    if duration is None and requests is None:
        raise ValueError("closed_loop needs a duration or a request count")
    results: list[Result] = []
    counter = itertools.count(first)
    deadline = time.perf_counter() + duration if duration is not None else math.inf
    last = first + requests if requests is not None else None

    async def worker() -> None:
        send, append = client.send, results.append
        while True:
            i = next(counter)
            if (last is not None and i >= last) or time.perf_counter() >= deadline:
                return
            res = await send(factory(i))
            append(res)
            if on_result is not None:
                on_result(res)
            if res.error == "connect":  # refused: do not spin
                await asyncio.sleep(0.05)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return results


def _split(total: int | None, parts: int) -> list[int | None]:
    if total is None:
        return [None] * parts
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def _worker_level(
    target: Target,
    workload: Workload,
    concurrency: int,
    duration: float | None,
    requests: int | None,
    timeout: float,
    first: int,
) -> tuple[list[Result], SelfReport]:
    """One process's share of a level (runs in a pool process with its own uvloop loop)."""
    import uvloop

    async def main() -> tuple[list[Result], SelfReport]:
        mon = SelfMonitor()
        mon.start()
        async with Client(concurrency, timeout=timeout) as client:
            res = await closed_loop(
                client,
                spec_factory(target, workload),
                concurrency,
                duration=duration,
                requests=requests,
                first=first,
            )
        report = mon.report()
        await mon.stop()
        return res, report

    return uvloop.run(main())


class LevelRunner:
    """Runs levels against one target; reuses one connection pool (or process pool) across them.

    Use as ``async with LevelRunner(target, workload, plan) as runner: await runner.run(c)``.
    """

    def __init__(
        self, target: Target, workload: Workload, plan: SweepPlan, *, label: str = ""
    ) -> None:
        self.target = target
        self.workload = workload
        self.plan = plan
        self.label = label or target.label
        self.factory = spec_factory(target, workload)
        self._client = Client(max(plan.levels, default=1), timeout=plan.timeout)
        self._pool: ProcessPoolExecutor | None = None
        self._monitor = SelfMonitor()
        self._sent = 0

    def __repr__(self) -> str:
        return f"<LevelRunner {self.target.chat_url} model={self.target.model} sent={self._sent}>"

    async def __aenter__(self) -> LevelRunner:
        if self.plan.processes > 1:
            import multiprocessing

            ctx = multiprocessing.get_context("spawn")
            self._pool = ProcessPoolExecutor(self.plan.processes, mp_context=ctx)
        else:
            await self._client.__aenter__()
        self._monitor.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._monitor.stop()
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
        else:
            await self._client.__aexit__()

    async def run(self, concurrency: int, on_result: OnResult | None = None) -> LevelResult:
        """Run one level and summarise it."""
        plan = self.plan
        requests = plan.requests
        self._monitor.reset()
        t0 = time.perf_counter_ns()
        if self._pool is None:
            results = await closed_loop(
                self._client,
                self.factory,
                concurrency,
                duration=plan.duration,
                requests=requests,
                on_result=on_result,
                first=self._sent,
            )
            client = self._monitor.report()
        else:
            results, client = await self._run_processes(concurrency)
            # Workers start after their process spawned: time the level from the first request.
            t0 = min((r.start_ns for r in results), default=t0)
        self._sent += len(results)
        end = max((r.end_ns for r in results), default=time.perf_counter_ns())
        summary = summarize(results, (end - t0) / 1e9)
        return LevelResult(
            concurrency=concurrency, summary=summary, client=client, label=self.label
        )

    async def _run_processes(self, concurrency: int) -> tuple[list[Result], SelfReport]:
        assert self._pool is not None
        plan = self.plan
        n = min(plan.processes, concurrency)
        shares = _split(concurrency, n)
        counts = _split(plan.requests, n)
        loop = asyncio.get_running_loop()
        futures = [
            loop.run_in_executor(
                self._pool,
                _worker_level,
                self.target,
                self.workload,
                share or 1,
                plan.duration,
                count,
                plan.timeout,
                self._sent + k * 10_000_000,
            )
            for k, (share, count) in enumerate(zip(shares, counts, strict=True))
        ]
        parts = await asyncio.gather(*futures)
        results = [r for res, _ in parts for r in res]
        reports = [rep for _, rep in parts]
        worst = SelfReport(
            cpu=max(r.cpu for r in reports),
            lag_p90_ms=max(r.lag_p90_ms for r in reports),
            lag_p99_ms=max(r.lag_p99_ms for r in reports),
            lag_max_ms=max(r.lag_max_ms for r in reports),
        )
        return results, worst


async def run_sweep(
    target: Target,
    workload: Workload,
    plan: SweepPlan,
    *,
    on_level_start: Callable[[int], None] | None = None,
    on_result: OnResult | None = None,
    on_level_end: Callable[[LevelResult], None] | None = None,
) -> SweepResult:
    """Run every level of ``plan`` in order and analyse the curve."""
    out = SweepResult(
        target={"url": target.url, "model": target.model, "label": target.label},
        workload=workload.to_dict(),
        plan=plan.to_dict(),
    )
    async with LevelRunner(target, workload, plan) as runner:
        for i, c in enumerate(plan.levels):
            if i and plan.pause > 0:
                await asyncio.sleep(plan.pause)
            if on_level_start is not None:
                on_level_start(c)
            level = await runner.run(c, on_result)
            out.levels.append(level)
            if on_level_end is not None:
                on_level_end(level)
    out.analyse(plan.min_gain, plan.max_drop)
    return out
