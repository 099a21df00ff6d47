"""Process death: SIGTERM drains everything; SIGKILL loses no record whose durable write had
returned (the moment the pipeline lets a response's last bytes go), for both SQL ledgers."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.ledger.sql import open_ledger

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgresql":
        return str(request.getfixturevalue("postgres_url"))
    return f"sqlite:///{tmp_path / 'ledger.db'}"


_WORKERS: list[subprocess.Popen[bytes]] = []


@pytest.fixture(autouse=True)
def _no_worker_outlives_its_test() -> Iterator[None]:
    """A test that fails before its worker exits (a drain that hangs) kills it, so a stuck
    worker cannot go on writing for the rest of the suite."""
    yield
    while _WORKERS:
        proc = _WORKERS.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def run_worker(url: str, spool: Path, tenant: str, log: Path, mode: str = "commit"
               ) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.ledger.worker", url, str(spool), tenant, str(log), mode],
        cwd=ROOT,
    )
    _WORKERS.append(proc)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if log.exists() and log.stat().st_size > 20_000:  # writing steadily
            return proc
        if proc.poll() is not None:
            raise RuntimeError(f"worker exited with {proc.returncode}")
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("worker did not start writing")


def acknowledged(log: Path) -> list[str]:
    """Request ids whose durable write had returned (a torn last line is not one)."""
    text = log.read_text()
    lines = text.splitlines()
    if lines and not text.endswith("\n"):
        lines.pop()
    return lines


async def stored_ids(url: str, tmp_path: Path, tenant: str) -> list[str]:
    """What the database holds once the worker's spool (if any) is replayed."""
    reader = open_ledger(url, spool_dir=tmp_path / "spool", migrate=True)
    await reader.start()
    try:
        await reader.replay()
        return [r.request_id async for r in reader.export(0, 2**62, tenant)]
    finally:
        await reader.close()


@pytest.mark.parametrize("mode", ["commit", "journal"])
async def test_sigterm_drains(url: str, tmp_path: Path, mode: str) -> None:
    """SIGTERM -> close(): every acknowledged record is stored, each once, and no journal
    segment is left behind (its records are all stored)."""
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    log = tmp_path / "acks.log"
    proc = run_worker(url, tmp_path / "spool", tenant, log, mode)
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    assert not list((tmp_path / "spool").glob("journal-*")), "a drained journal was kept"
    acked = acknowledged(log)
    stored = await stored_ids(url, tmp_path, tenant)
    assert len(stored) == len(set(stored))
    assert set(acked) <= set(stored)
    assert len(acked) > 100


@pytest.mark.parametrize(("mode", "after"), [("commit", 0.2), ("commit", 0.7),
                                             ("journal", 0.2), ("journal", 0.7),
                                             ("journal-alone", 0.4)])
async def test_sigkill_loses_nothing_acknowledged(url: str, tmp_path: Path, mode: str,
                                                  after: float) -> None:
    """SIGKILL in the middle of group commits (``commit``: to the database; ``journal``: to
    the local journal, the database a batch behind): every record whose write had returned is
    in the database once the spool directory is replayed (the journal adopted), once; the only
    records missing are ones never acknowledged."""
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    log = tmp_path / "acks.log"
    proc = run_worker(url, tmp_path / "spool", tenant, log, mode)
    time.sleep(after)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    acked = acknowledged(log)
    stored = await stored_ids(url, tmp_path, tenant)
    assert len(stored) == len(set(stored)), "a record was stored twice"
    missing = set(acked) - set(stored)
    assert not missing, f"{len(missing)} acknowledged records lost, e.g. {sorted(missing)[:3]}"
    assert len(acked) > 100
