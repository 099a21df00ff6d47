"""A full disk under the embedded ledger: answers fail within ``store.ledger_timeout`` (never
hang), ``/readyz`` drains the replica, the log says so once, and nothing is lost once the
space returns.

The SQLite database and the spool share a real 2 MiB tmpfs that the test fills to the last
byte after the gateway has started (root and a kernel that allows the mount, else skipped).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import msgspec
import pytest

from gateway.ledger.sql import open_ledger
from gateway.sim.server import SimServer
from tests.helpers import TEST_KEY, GatewayProcess, policy, tmpfs

pytestmark = pytest.mark.process

if TYPE_CHECKING:
    from collections.abc import Iterator

AUTH = {"Authorization": f"Bearer {TEST_KEY}"}
LEDGER_TIMEOUT = 1.0


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 2 MiB tmpfs (skipped where it cannot be mounted)."""
    with tmpfs(tmp_path, "2m") as mount:
        yield mount


def _fill(path: Path) -> None:
    """Write until the disk refuses a single byte more."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (1 << 16, 1 << 12, 1 << 8, 1):
            with contextlib.suppress(OSError):
                while os.write(fd, b"\0" * size):
                    pass
    finally:
        os.close(fd)


def _policy(sim_url: str, disk: Path) -> dict[str, Any]:
    data = policy({"chat": [sim_url]})
    data["store"] = {"data_dir": str(disk / "data"), "spool_dir": str(disk / "spool"),
                     "ledger_durability": "commit", "ledger_timeout": LEDGER_TIMEOUT}
    data["auth"]["keys"][0]["tenant"] = "acme"
    data["plans"] = [{"name": "p", "limits": {"rpm": 1_000_000}}]
    data["tenants"] = [{"name": "acme", "plan": "p"}]
    data["prices"] = {"models": {"chat-model": {"input": "1", "output": "2"}}}
    return data


def _chat(client: httpx.Client, n: int, *, stream: bool = False) -> httpx.Response:
    body = {"model": "chat-model", "max_tokens": 3, "stream": stream,
            "messages": [{"role": "user", "content": f"q{n}"}]}
    return client.post("/v1/chat/completions", json=body)


def test_a_full_disk_fails_answers_within_the_bound_and_drains_the_replica(
    tiny_disk: Path, tmp_path: Path
) -> None:
    with SimServer("interactive", speedup=50, jitter=0.0) as sim:
        gw = GatewayProcess(tmp_path, _policy(sim.url, tiny_disk)).start()
        ids: list[str] = []
        try:
            # generous client bound: the gateway's own is LEDGER_TIMEOUT; a hang shows here
            with httpx.Client(base_url=gw.url, headers=AUTH, timeout=30) as client:
                first = _chat(client, 0)
                assert first.status_code == 200, first.text
                ids.append(first.headers["x-request-id"])
                assert client.get("/readyz").status_code == 200
                ballast = tiny_disk / "ballast"
                _fill(ballast)

                refused = []
                for n in range(1, 5):
                    r = _chat(client, n)
                    refused.append(r)
                    ids.append(r.headers["x-request-id"])
                withheld = [r.headers["x-request-id"] for r in refused]
                assert [r.status_code for r in refused] == [503] * 4, refused[0].text
                assert refused[0].json()["error"]["code"] == "usage_not_recorded"
                assert "store.ledger_timeout" in refused[0].json()["error"]["message"]

                stream = _chat(client, 9, stream=True)
                ids.append(stream.headers["x-request-id"])
                withheld.append(stream.headers["x-request-id"])
                assert stream.status_code == 200  # the stream had started
                assert b"usage_not_recorded" in stream.content  # its error event
                assert b"[DONE]" not in stream.content

                ready = client.get("/readyz")
                assert ready.status_code == 503 and ready.json()["ledger"] == "failing"
                metrics = client.get("/metrics").text
                assert "gateway_ledger_durable 0.0" in metrics

                ballast.unlink()  # the space returns
                deadline = time.monotonic() + 30
                while client.get("/readyz").status_code != 200:
                    assert time.monotonic() < deadline, "readiness never came back"
                    time.sleep(0.2)
                after = _chat(client, 10)
                assert after.status_code == 200, after.text
                ids.append(after.headers["x-request-id"])
        finally:
            gw.stop()
        log = gw.output()
    # one line when it started failing, one when it recovered: not one per attempt
    assert log.count("cannot be made durable") == 1, log[-3000:]
    assert log.count("durable again after") == 1
    assert "Traceback" not in log
    records = asyncio.run(_stored(tiny_disk))
    # nothing lost: the withheld answers' records were kept and written once space returned
    assert sorted(records) == sorted(ids)
    # and they say what the client got: a refusal, nothing delivered, nothing billed
    for rid in withheld:
        assert (records[rid]["outcome"], records[rid]["status"], records[rid]["delivered"],
                records[rid]["sent_output"], records[rid]["cost_micros"]) == (
                    "failed", 503, False, 0, 0), records[rid]
    delivered = [r for rid, r in records.items() if rid not in withheld]
    assert all(r["delivered"] and r["outcome"] == "completed" for r in delivered)
    assert all(r["sent_output"] == r["output"] > 0 and r["cost_micros"] > 0 for r in delivered)


async def _stored(disk: Path) -> dict[str, dict[str, Any]]:
    ledger = open_ledger(f"sqlite:///{disk / 'data' / 'ledger.db'}",
                         spool_dir=disk / "spool", migrate=True)
    await ledger.start()
    try:
        await ledger.replay()
        return {r.request_id: msgspec.structs.asdict(r)
                async for r in ledger.export(0, 2**62, "acme")}
    finally:
        await ledger.close()
