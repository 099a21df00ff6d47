"""Fixtures for the load tester's tests: small simulators with known capacity, a tiny trace."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.sim.server import SimServer
from loadtest.trace import TraceRow, write_trace


@pytest.fixture(scope="module")
def pool4() -> Iterator[SimServer]:
    """A pool that runs at most 4 sequences at once, 10x faster than real time, no jitter.

    A modest speed-up keeps the in-process simulator far from CPU-bound, so the plateau is the
    slot limit's and not the machine's.
    """
    with SimServer("interactive", speedup=10, jitter=0.0, max_running=4) as server:
        yield server


@pytest.fixture(scope="module")
def failing_sim() -> Iterator[SimServer]:
    """A simulator that answers every request with HTTP 500."""
    with SimServer("interactive", speedup=20, jitter=0.0, error_status=500) as server:
        yield server


@pytest.fixture()
def small_trace(tmp_path: Path) -> tuple[Path, list[TraceRow]]:
    """60 requests over ~3 s in the Azure trace CSV format (Poisson arrivals, seeded)."""
    rng = random.Random(7)
    rows, t = [], 0.0
    for _ in range(60):
        t += rng.expovariate(20.0)
        rows.append(TraceRow(t, rng.randint(50, 1500), rng.randint(4, 40)))
    path = tmp_path / "trace.csv"
    write_trace(path, rows)
    return path, rows
