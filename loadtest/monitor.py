"""Watching the load generator itself: event-loop lag and process CPU (:class:`SelfMonitor`).

A load generator that is short of CPU delays its own timestamps and under-drives the target, so
every run samples both: a task that sleeps ``interval`` and records how late it woke up, and the
process CPU time (user + system, all threads) over wall time. :meth:`SelfMonitor.verdict` names
the limit that was approached, if any: CPU above 90% of one core, or a loop lag p90 above 10 ms
(p90, not the maximum: a lone 20 ms pause from the OS or the garbage collector is not a trend).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from dataclasses import dataclass

from loadtest.stats import percentile

__all__ = ["CPU_LIMIT", "LAG_LIMIT_MS", "SelfMonitor", "SelfReport"]

CPU_LIMIT = 0.90
LAG_LIMIT_MS = 10.0


@dataclass(slots=True, kw_only=True)
class SelfReport:
    """The generator's own load during one window."""

    cpu: float  # fraction of one core
    lag_p90_ms: float
    lag_p99_ms: float
    lag_max_ms: float

    @property
    def warning(self) -> str | None:
        """Why these numbers may understate the target, or None."""
        reasons = []
        if self.cpu > CPU_LIMIT:
            reasons.append(f"client CPU {self.cpu:.0%} of a core")
        if self.lag_p90_ms > LAG_LIMIT_MS:
            reasons.append(f"client event-loop lag p90 {self.lag_p90_ms:.1f} ms")
        if not reasons:
            return None
        return (
            "load generator near its ceiling (" + ", ".join(reasons) + "): figures may describe "
            "the client, not the target; lower concurrency or add --processes"
        )


def _cpu_s() -> float:
    t = os.times()
    return t.user + t.system


class SelfMonitor:
    """Samples loop lag every ``interval`` seconds while running; one per event loop.

    ``start()`` inside the loop, then ``report()`` at any time for the window since the last
    ``reset()``; ``stop()`` cancels the sampler.
    """

    def __init__(self, interval: float = 0.05) -> None:
        self.interval = interval
        self._lags: list[float] = []
        self._task: asyncio.Task[None] | None = None
        self._cpu0 = _cpu_s()
        self._wall0 = time.perf_counter()

    def __repr__(self) -> str:
        return f"<SelfMonitor samples={len(self._lags)} running={self._task is not None}>"

    def start(self) -> None:
        self.reset()
        self._task = asyncio.get_running_loop().create_task(self._sample())

    def reset(self) -> None:
        self._lags.clear()
        self._cpu0 = _cpu_s()
        self._wall0 = time.perf_counter()

    async def _sample(self) -> None:
        interval = self.interval
        while True:
            t0 = time.perf_counter()
            await asyncio.sleep(interval)
            self._lags.append(max(0.0, (time.perf_counter() - t0 - interval) * 1e3))

    def report(self) -> SelfReport:
        wall = time.perf_counter() - self._wall0
        cpu = (_cpu_s() - self._cpu0) / wall if wall > 0 else 0.0
        lags = self._lags or [0.0]
        return SelfReport(
            cpu=cpu,
            lag_p90_ms=percentile(lags, 90.0),
            lag_p99_ms=percentile(lags, 99.0),
            lag_max_ms=max(lags),
        )

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
