"""Across OS processes: limits stay exact, and a killed process's leases come back."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from gateway.quota import Limits, QuotaRequest, RedisQuotaStore, Scope
from tests.redis_servers import RedisProc

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parents[2]


def spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.quota.worker", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )


def run_three(mode: str, url: str, tenant: str, limit: int) -> list[dict[str, int]]:
    """Three processes x 32 tasks for 1.5 s, started together."""
    start = time.time() + 1.5
    procs = [spawn(mode, url, tenant, str(limit), "32", str(start), "1.5") for _ in range(3)]
    outs = [p.communicate(timeout=30)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    return [json.loads(out.strip().splitlines()[-1]) for out in outs]


def test_rpm_exact_across_three_processes(redis_proc: RedisProc) -> None:
    """96 concurrent reservers in 3 processes against rpm=50: exactly 50 admitted."""
    results = run_three("rpm", redis_proc.url, f"t-{uuid.uuid4().hex[:8]}", 50)
    assert sum(r["admitted"] for r in results) == 50


def test_concurrency_never_exceeded_across_three_processes(redis_proc: RedisProc) -> None:
    """concurrency=4 shared by 96 reservers: in-flight never above 4, slots are reused."""
    results = run_three("conc", redis_proc.url, f"t-{uuid.uuid4().hex[:8]}", 4)
    assert max(r["peak"] for r in results) <= 4
    assert sum(r["admitted"] for r in results) > 40


async def test_killed_process_leases_come_back(redis_proc: RedisProc) -> None:
    """A child takes all 3 slots and is SIGKILLed; the slots return after the 1 s TTL."""
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    child = spawn("hold", redis_proc.url, tenant, "3", "1.0")
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "ready"
    os.kill(child.pid, signal.SIGKILL)
    child.wait()

    store = RedisQuotaStore.from_url(redis_proc.url, timeout=30.0, connect_timeout=30.0)
    scopes = (Scope("tenant", Limits(concurrency=3)),)

    def request() -> QuotaRequest:
        return QuotaRequest(
            request_id=uuid.uuid4().hex, tenant=tenant, scopes=scopes, estimated_tokens=1
        )

    try:
        refused = await store.reserve(request())
        assert refused.limit == "concurrency"
        await asyncio.sleep(1.1)
        for _ in range(3):
            assert (await store.reserve(request())).admitted
    finally:
        await store.aclose()
