"""Fixtures: record factories, and one ``make_ledger`` fixture that runs the same tests against
the SQLite and PostgreSQL ledgers (the litestar ``store`` fixture pattern; the PostgreSQL
servers are the session's, from ``tests/conftest.py``)."""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.ledger import Ledger, LedgerSettings, UsageRecord
from gateway.ledger.sql.postgres import PostgresLedger
from gateway.ledger.sql.sqlite import SqliteLedger
from tests.ledger.postgres import SQL_DIALECTS

LedgerFactory = Callable[..., Awaitable[Ledger]]
RecordFactory = Callable[..., UsageRecord]

# generous round-trip bound: the test box is shared
TIMEOUT = 2.0


@pytest.fixture(params=SQL_DIALECTS)
async def make_ledger(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[LedgerFactory]:
    """Builds started ledgers of one kind (``await make_ledger()``); closes them after."""
    kind: str = request.param
    url = request.getfixturevalue("postgres_url") if kind == "postgresql" else ""
    made: list[Ledger] = []
    counter = itertools.count()

    async def make(**settings: Any) -> Ledger:
        spool = tmp_path / f"spool-{next(counter)}"
        config = LedgerSettings(**settings)
        ledger: Ledger
        if kind == "sqlite":  # every ledger of the test shares the file, like replicas
            ledger = SqliteLedger(tmp_path / "ledger.db", spool_dir=spool, settings=config)
        else:
            ledger = PostgresLedger(url, spool_dir=spool, settings=config, migrate=True)
        await ledger.start()
        made.append(ledger)
        return ledger

    yield make
    for ledger in made:
        await ledger.close()


@pytest.fixture()
async def ledger(make_ledger: LedgerFactory) -> Ledger:
    return await make_ledger()


@pytest.fixture()
def tenant() -> str:
    """A fresh tenant per test, so tests sharing a Redis never see each other's records."""
    return f"t-{uuid.uuid4().hex[:12]}"


def now_ms() -> int:
    """Records are stamped "now": Redis keys expire from the record's day, so a fixed date
    years ago would be written already expired."""
    return time.time_ns() // 1_000_000


@pytest.fixture()
def make_record() -> RecordFactory:
    """Records with unique request ids and varied, known token counts."""
    seq = itertools.count(1)

    def make(tenant: str, **fields: Any) -> UsageRecord:
        n = next(seq)
        base: dict[str, Any] = {
            "request_id": f"req-{uuid.uuid4().hex}",
            "ts_ms": now_ms(),
            "tenant": tenant,
            "key_id": "key-1",
            "model": "chat-model",
            "upstream_model": "llama-3-8b",
            "request_class": "interactive",
            "pool": "chat",
            "backend": "b1",
            "attempts": 1,
            "status": 200,
            "outcome": "completed",
            "system": n % 7,
            "history": n % 11,
            "new": 1 + n % 13,
            "tools": n % 3,
            "cached": n % 5,
            "output": 1 + n % 17,
            "cost_micros": 10 * n,
            "cost_new": 4 * n,
            "cost_output": 6 * n,
            "estimated": n % 4 == 0,
            "duration_ms": 12.5,
        }
        base.update(fields)
        base.setdefault(
            "prompt_total", base["system"] + base["history"] + base["new"] + base["tools"]
        )
        return UsageRecord(**base)

    return make
