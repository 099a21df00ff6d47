"""``room``: the stored-responses bound of a tenant, checked before a Responses request runs
(issue 34, point 5), against a real SQLite ledger: refused at the bound with the usage and the
limit in the message, expired rows freed first, ``store: false`` and other tenants never
refused, and a database that cannot answer refuses nothing."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.config.model import StoredResponseLimits
from gateway.dialects.responses import ResponsesFrontend
from gateway.dialects.responses.store import StoredResponsesFull, check_room
from gateway.ledger.errors import LedgerUnavailable
from gateway.ledger.sql.sqlite import SqliteLedger
from gateway.ledger.sql.stored_responses import ResponseStore, StorageUsage

FRONTEND = ResponsesFrontend()
HOUR_MS = 3_600_000


@pytest.fixture()
async def store(tmp_path: Path) -> AsyncIterator[ResponseStore]:
    ledger = SqliteLedger(tmp_path / "ledger.db", spool_dir=tmp_path / "spool")
    await ledger.start()
    yield ResponseStore(ledger)
    await ledger.close()


async def _put(store: ResponseStore, tenant: str, n: int, ttl_ms: int = HOUR_MS,
               now_ms: int | None = None) -> None:
    for _ in range(n):
        await store.put(tenant, f"resp_{uuid.uuid4().hex}", request={"input": "x" * 100},
                        messages=[], answer={}, ttl_ms=ttl_ms, now_ms=now_ms, delta=True)


async def test_refused_at_the_row_bound_only_when_it_would_store(store: ResponseStore) -> None:
    bound = StoredResponseLimits(max_rows=2, max_bytes=None)
    native: dict[str, Any] = {"model": "m", "input": "hi"}
    await _put(store, "acme", 1)
    await check_room(store, FRONTEND, "acme", native, bound, 10)  # one of two: room
    await _put(store, "acme", 1)
    with pytest.raises(StoredResponsesFull) as err:
        await check_room(store, FRONTEND, "acme", native, bound, 10)
    assert err.value.status == 400 and err.value.param == "store"
    assert err.value.code == "stored_responses_limit_exceeded"
    assert "it stores 2 responses, at its limit of 2 (max_rows)" in err.value.message
    await check_room(store, FRONTEND, "acme", {**native, "store": False}, bound, 10)
    await check_room(store, FRONTEND, "globex", native, bound, 10)  # another tenant
    await check_room(store, FRONTEND, "acme", native, StoredResponseLimits(max_rows=None,
                                                                      max_bytes=None), 10)


async def test_the_byte_bound_counts_twice_the_body(store: ResponseStore) -> None:
    await _put(store, "acme", 1)
    used = (await store.usage("acme")).bytes
    bound = StoredResponseLimits(max_rows=None, max_bytes=used + 200)
    await check_room(store, FRONTEND, "acme", {"input": "x"}, bound, 100)  # exactly fits
    with pytest.raises(StoredResponsesFull) as err:
        await check_room(store, FRONTEND, "acme", {"input": "x"}, bound, 101)
    assert (f"it stores {used:,} bytes of responses, and this request would add about 202 "
            f"more, past its limit of {used + 200:,} bytes (max_bytes)") in err.value.message


async def test_expired_rows_are_freed_at_the_bound(store: ResponseStore) -> None:
    """Rows past their expiry that the hourly sweep has not reached do not refuse a request:
    at the bound the tenant's dead rows are freed first."""
    store.ledger.sweeps.remove(store.expire)  # no maintenance sweep in this test
    past = time.time_ns() // 1_000_000 - 60_000
    await _put(store, "acme", 2, ttl_ms=1, now_ms=past)
    assert (await store.usage("acme")).responses == 2  # counted until swept
    await check_room(store, FRONTEND, "acme", {"input": "x"},
               StoredResponseLimits(max_rows=2, max_bytes=None), 10)
    assert (await store.usage("acme")).responses == 0


class _Away(ResponseStore):
    """A store whose database does not answer."""

    def __init__(self) -> None:
        pass

    async def usage(self, tenant: str) -> StorageUsage:
        raise LedgerUnavailable("down")


async def test_a_database_away_refuses_nothing() -> None:
    await check_room(_Away(), FRONTEND, "acme", {"input": "x"},
               StoredResponseLimits(max_rows=1, max_bytes=1), 10)
