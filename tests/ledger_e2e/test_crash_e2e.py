"""A gateway killed with SIGKILL under load loses no usage record of a response its client
received; three gateway processes on one PostgreSQL leave one row per request."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.ledger.sql import open_ledger
from gateway.sim.server import SimServer
from tests.helpers import TEST_KEY, GatewayProcess, policy
from tests.ledger_e2e.test_records_e2e import migrate

pytestmark = pytest.mark.process

AUTH = {"Authorization": f"Bearer {TEST_KEY}"}
CONNECTIONS = 16


def _policy(sim_url: str, durability: str = "commit") -> dict[str, Any]:
    data = policy({"chat": [sim_url]})
    data.setdefault("store", {})["ledger_durability"] = durability
    data["auth"]["keys"][0]["tenant"] = "acme"
    data["plans"] = [{"name": "p", "limits": {"rpm": 1_000_000}}]
    data["tenants"] = [{"name": "acme", "plan": "p"}]
    data["prices"] = {"models": {"chat-model": {"input": "1", "output": "2"}}}
    return data


class Load:
    """``CONNECTIONS`` clients sending chat requests (every third streamed) until stopped;
    ``received`` holds the gateway's request id of every response read to its end."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.received: list[str] = []
        self.broken = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True)
                         for i in range(CONNECTIONS)]

    def start(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=30)

    def _run(self, i: int) -> None:
        n = 0
        with httpx.Client(base_url=self.url, headers=AUTH, timeout=10) as client:
            while not self._stop.is_set():
                n += 1
                body = {"model": "chat-model", "max_tokens": 3, "stream": n % 3 == 0,
                        "messages": [{"role": "user", "content": f"c{i} q{n}"}]}
                try:
                    with client.stream("POST", "/v1/chat/completions", json=body) as r:
                        data = b"".join(r.iter_raw())  # raises if the response is cut short
                        rid = r.headers["x-request-id"]
                    if r.status_code == 200 and (not body["stream"]
                                                 or data.rstrip().endswith(b"[DONE]")):
                        self.received.append(rid)
                except (httpx.HTTPError, KeyError):
                    self.broken += 1
                    time.sleep(0.01)


def _ledger_url(gw: GatewayProcess, url: str | None) -> str:
    return url or f"sqlite:///{Path(gw.config).parent / f'data-{gw.port}' / 'ledger.db'}"


async def _stored(url: str, spool: Path) -> list[str]:
    """Every record in the database once the dead gateway's spool is replayed."""
    ledger = open_ledger(url, spool_dir=spool, migrate=True)
    await ledger.start()
    try:
        await ledger.replay()
        return [r.request_id async for r in ledger.export(0, 2**62, "acme")]
    finally:
        await ledger.close()


@pytest.mark.parametrize(("store", "durability"), [
    ("sqlite", "commit"), ("postgresql", "commit"), ("sqlite", "journal"),
    ("postgresql", "journal"), ("sqlite", "process"), ("postgresql", "process")])
def test_sigkill_under_load_loses_no_record_a_client_received(
    store: str, durability: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """``commit``: a response ends once its record is committed; ``journal``: once it is
    fsync'd to the local journal; ``process`` (the default on a local disk): once it is
    written there (the dead gateway's journal is replayed from its spool directory)."""
    url = None
    if store == "postgresql":
        url = str(request.getfixturevalue("postgres_url"))
        migrate(url)
        os.environ["GATEWAY_LEDGER_URL"] = url
    try:
        with SimServer("interactive", speedup=20, jitter=0.0) as sim:
            gw = GatewayProcess(tmp_path, _policy(sim.url, durability)).start()
            load = Load(gw.url).start()
            deadline = time.monotonic() + 60
            while len(load.received) < 600 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert gw.proc is not None
            gw.proc.send_signal(signal.SIGKILL)
            gw.proc.wait(timeout=30)
            load.stop()
            gw.stop()
    finally:
        os.environ.pop("GATEWAY_LEDGER_URL", None)
    received = list(load.received)
    assert len(received) >= 600, (len(received), load.broken)
    stored = asyncio.run(_stored(_ledger_url(gw, url), tmp_path / f"spool-{gw.port}"))
    assert len(stored) == len(set(stored)), "a record was stored twice"
    missing = set(received) - set(stored)
    assert not missing, f"{len(missing)} of {len(received)} received responses have no record"


def test_three_gateways_on_one_database_leave_one_row_per_request(
    postgres_url: str, tmp_path: Path
) -> None:
    migrate(postgres_url)
    os.environ["GATEWAY_LEDGER_URL"] = postgres_url
    try:
        with SimServer("interactive", speedup=20, jitter=0.0) as sim:
            gateways = [GatewayProcess(tmp_path, _policy(sim.url)).start() for _ in range(3)]
            loads = [Load(gw.url).start() for gw in gateways]
            deadline = time.monotonic() + 60
            while sum(len(x.received) for x in loads) < 900 and time.monotonic() < deadline:
                time.sleep(0.05)
            for load in loads:
                load.stop()
            for gw in gateways:
                assert gw.stop() == 0  # SIGTERM drains
    finally:
        os.environ.pop("GATEWAY_LEDGER_URL", None)
    received = [rid for load in loads for rid in load.received]
    assert len(received) >= 900
    stored = asyncio.run(_stored(postgres_url, tmp_path / "reader-spool"))
    assert len(stored) == len(set(stored))
    assert set(received) <= set(stored)
    broken = sum(load.broken for load in loads)
    assert len(stored) <= len(received) + broken  # no record without a request


@pytest.mark.parametrize("durability", ["process", "commit"])
def test_a_stream_cut_by_sigkill_is_billed_as_interrupted(
    durability: str, tmp_path: Path
) -> None:
    """A stream under way when the gateway is SIGKILLed leaves its provisional record: after
    the next replay it is ``interrupted``, estimated, with the output counted by then; a
    stream that ended before the kill keeps its final record (one row each)."""
    with SimServer("interactive", speedup=1, jitter=0.0) as sim:
        gw = GatewayProcess(tmp_path, _policy(sim.url, durability)).start()
        body = {"model": "chat-model", "max_tokens": 600, "stream": True,
                "messages": [{"role": "user", "content": "a long answer please"}]}
        with httpx.Client(base_url=gw.url, headers=AUTH, timeout=30) as client:
            done = client.post("/v1/chat/completions", json={**body, "max_tokens": 3})
            assert done.status_code == 200
            with client.stream("POST", "/v1/chat/completions", json=body) as r:
                cut = r.headers["x-request-id"]
                events = 0
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        events += 1
                    if events >= 80:  # past the first progress report (64 chunks)
                        break
                assert gw.proc is not None
                gw.proc.send_signal(signal.SIGKILL)
                gw.proc.wait(timeout=30)
        gw.stop()
    records = {r.request_id: r for r in asyncio.run(_records(
        _ledger_url(gw, None), Path(gw.config).parent / f"spool-{gw.port}"))}
    assert records[done.headers["x-request-id"]].outcome == "completed"
    interrupted = records[cut]
    assert interrupted.outcome == "interrupted", interrupted
    assert interrupted.estimated and interrupted.estimate_reason == "interrupted"
    assert 64 <= interrupted.output <= 600 and interrupted.sent_output == interrupted.output
    assert interrupted.cost_micros > 0 and interrupted.prompt_total > 0


async def _records(url: str, spool: Path) -> list[Any]:
    ledger = open_ledger(url, spool_dir=spool, migrate=True)
    await ledger.start()
    try:
        await ledger.replay()
        return [r async for r in ledger.export(0, 2**62, "acme")]
    finally:
        await ledger.close()
