"""``/v1/usage`` and ``/admin/usage`` through a real ``gateway serve`` over real HTTP, on its
SQLite file and on a real PostgreSQL: two tenants, each key sees only its tenant's rows
whatever the query says; rows, pages, costs and the old start/end spelling; every bad
parameter is a 400 naming it; the admin routes read every tenant, export and reconcile.

Records are written straight into the database the gateway reads (dated the last few days,
inside retention), plus one real request through the gateway to the simulator."""

from __future__ import annotations

import asyncio
import hashlib
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from gateway.accounting.prices import format_micros
from gateway.ledger import LedgerSettings, UsageRecord, decode_record
from gateway.ledger.sql.postgres import PostgresLedger
from gateway.ledger.sql.sqlite import SqliteLedger
from gateway.ledger.sql.usage_query import encode_cursor
from tests.helpers import TEST_KEY, GatewayProcess, policy
from tests.ledger.usage_data import DAY, expected_rows, sample_records

pytestmark = pytest.mark.process

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from gateway.ledger.sql.store import SqlLedger
    from gateway.sim.server import SimServer

ADMIN = "admin-usage-test-token"
OTHER_KEY = "sk-gw-usage-other-tenant-0123456789abcdef0123456789"
A = {"Authorization": f"Bearer {TEST_KEY}"}  # tenant acme
B = {"Authorization": f"Bearer {OTHER_KEY}"}  # tenant globex
ADMIN_AUTH = {"Authorization": f"Bearer {ADMIN}"}
TODAY = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
TODAY_MS = int(TODAY.timestamp() * 1000)
START_MS = TODAY_MS - 5 * DAY
FROM, TO = (datetime.fromtimestamp(START_MS / 1000, UTC).strftime("%Y-%m-%d"),
            TODAY.strftime("%Y-%m-%d"))
RECORDS = sample_records(600, ("acme", "globex", "initech"), seed=21, start=START_MS, days=5)


class Served:
    def __init__(self, gw: GatewayProcess, records: list[UsageRecord]) -> None:
        self.gw = gw
        self.url = gw.url
        self.records = records

    def get(self, path: str, headers: dict[str, str], **params: Any) -> httpx.Response:
        return httpx.get(self.url + path, params=params, headers=headers, timeout=30)


async def _seed(ledger: SqlLedger, records: Sequence[UsageRecord]) -> None:
    await ledger.start()
    try:
        for r in records:
            ledger.write_nowait(r)
        await ledger.flush()
        assert ledger.stats.stored == len(records)
    finally:
        await ledger.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def served(request: pytest.FixtureRequest, tmp_path: Path, sim: SimServer,
           monkeypatch: pytest.MonkeyPatch) -> Iterator[Served]:
    data = policy({"chat": [sim.url]})
    data["auth"]["keys"][0]["tenant"] = "acme"
    data["auth"]["keys"].append({"id": "other", "tenant": "globex",
                                 "sha256": hashlib.sha256(OTHER_KEY.encode()).hexdigest()})
    data["prices"] = {"currency": "EUR"}
    data["store"] = {"data_dir": str(tmp_path / "data"), "spool_dir": str(tmp_path / "spool")}
    settings = LedgerSettings(retention_days=90)
    ledger: SqlLedger
    if request.param == "postgresql":
        url = request.getfixturevalue("postgres_url")
        monkeypatch.setenv("GATEWAY_LEDGER_URL", url)
        ledger = PostgresLedger(url, spool_dir=tmp_path / "seed-spool", migrate=True,
                                settings=settings)
    else:
        monkeypatch.delenv("GATEWAY_LEDGER_URL", raising=False)
        ledger = SqliteLedger(tmp_path / "data" / "ledger.db", spool_dir=tmp_path / "seed",
                              settings=settings)
    asyncio.run(_seed(ledger, RECORDS))
    monkeypatch.setenv("GATEWAY_ADMIN_TOKEN", ADMIN)
    monkeypatch.setenv("GATEWAY_ACCESS_LOG", "off")
    with GatewayProcess(tmp_path, data) as gw:
        yield Served(gw, list(RECORDS))


def _http_rows(expected: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``expected_rows`` as the API spells them: plus the cost as a decimal and currency."""
    return [{**r, "cost": format_micros(r["cost_micros"]), "currency": "EUR"}
            for r in expected]


def _walk(s: Served, path: str, headers: dict[str, str], **params: Any) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    after: str | None = None
    while True:
        page = s.get(path, headers, **params, **({"after": after} if after else {}))
        assert page.status_code == 200, page.text
        body = page.json()
        assert body["object"] == "list" and body["has_more"] == (body["next"] is not None)
        rows += body["data"]
        if not body["has_more"]:
            return rows
        after = body["next"]


def test_a_tenant_only_ever_sees_its_own_rows(served: Served) -> None:
    """acme's key, with every way of naming another tenant the query allows, gets acme's rows
    and nothing else; globex's key gets globex's."""
    group = "tenant,model,key"
    params = {"from": FROM, "to": TO, "group_by": group}
    plain = served.get("/v1/usage", A, **params)
    assert plain.status_code == 200, plain.text
    body = plain.json()
    assert body["tenant"] == "acme"
    want = _http_rows(expected_rows(served.records, ("tenant", "model", "key"), START_MS,
                                    TODAY_MS, "acme"))
    assert body["data"] == want and len(want) > 5
    tricks: list[tuple[dict[str, Any], dict[str, str]]] = [
        ({"tenant": "globex"}, {}),
        ({"tenant": ["globex", "initech"]}, {}),
        ({"tenant": ""}, {}),
        ({}, {"X-Tenant": "globex", "X-Gateway-Tenant": "globex"}),
        ({"after": encode_cursor(("tenant", "model", "key"), ["globex", "", ""])}, {}),
        ({"after": encode_cursor(("tenant", "model", "key"), ["", "", ""])}, {}),
    ]
    for extra, headers in tricks:
        r = httpx.get(served.url + "/v1/usage", params={**params, **extra},
                      headers={**A, **headers}, timeout=30)
        assert r.status_code == 200, (extra, r.text)
        assert {row["tenant"] for row in r.json()["data"]} <= {"acme"}, extra
        if "after" not in extra:
            assert r.json()["data"] == want, extra
    everything = _walk(served, "/v1/usage", A, **{**params, "group_by": "tenant",
                                                   "from": FROM, "limit": 1})
    assert [row["tenant"] for row in everything] == ["acme"]
    other = served.get("/v1/usage", B, **params).json()
    assert other["tenant"] == "globex"
    assert other["data"] == _http_rows(expected_rows(
        served.records, ("tenant", "model", "key"), START_MS, TODAY_MS, "globex"))
    # the admin token is no API key, and an API key opens no admin route
    assert served.get("/v1/usage", ADMIN_AUTH, **params).status_code == 401
    assert served.get("/admin/usage", A, **params).status_code == 401
    assert served.get("/v1/usage", {}, **params).status_code == 401


def test_rows_pages_costs_and_the_old_spelling(served: Served) -> None:
    for group in ("day,model", "hour", "month,class,version,batch", "team,organization,key"):
        dims = tuple(group.split(","))
        want = _http_rows(expected_rows(served.records, dims, START_MS, TODAY_MS, "acme"))
        assert _walk(served, "/v1/usage", A, **{"from": FROM, "to": TO, "group_by": group,
                                                 "limit": 4}) == want, group
    # start/end: inclusive days; the default grouping is day, model, class
    last = datetime.fromtimestamp((TODAY_MS - DAY) / 1000, UTC).strftime("%Y-%m-%d")
    old = served.get("/v1/usage", A, start=FROM, end=last)
    assert old.status_code == 200, old.text
    assert old.json()["data"] == _http_rows(expected_rows(
        served.records, ("day", "model", "class"), START_MS, TODAY_MS, "acme"))
    assert old.json()["group_by"] == ["day", "model", "class"]
    assert (old.json()["from"], old.json()["to"]) == (f"{FROM}T00:00:00Z", f"{TO}T00:00:00Z")
    # a time with a zone: 02:00+02:00 is midnight UTC
    zoned = served.get("/v1/usage", A, **{"from": f"{FROM}T02:00:00+02:00", "to": TO,
                                          "group_by": "day,model,class"})
    assert zoned.json()["data"] == old.json()["data"]


def test_a_request_through_the_gateway_shows_up_today(served: Served) -> None:
    r = httpx.post(served.url + "/v1/chat/completions", headers=A, timeout=60, json={
        "model": "chat-model", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text
    today = served.get("/v1/usage", A, group_by="model,key").json()  # default range: today
    assert [(row["model"], row["key_id"], row["requests"], row["output"])
            for row in today["data"]] == [("chat-model", "test", 1, r.json()["usage"][
                "completion_tokens"])]
    assert served.get("/v1/usage", B).json()["data"] == []


BAD_PARAMETERS: list[tuple[dict[str, str], str]] = [
    ({"from": "yesterday"}, "from"), ({"to": "2024-13-01"}, "to"),
    ({"from": "2024-05-02", "to": "2024-05-01"}, "to"),
    ({"from": "2024-05-01T10:30:00", "to": "2024-05-02"}, "from"),
    ({"from": "2024-05-01", "to": "2024-05-01T10:00:01Z"}, "to"),
    ({"from": "2023-01-01", "to": "2024-05-01"}, "to"),
    ({"from": "0001-01-01"}, "from"), ({"to": "9999-12-31T23:00:00-12:00"}, "to"),
    ({"start": "2024-05-01", "from": "2024-05-01"}, "from"), ({"start": "1 May"}, "start"),
    ({"start": "2024-05-02", "end": "2024-05-01"}, "end"),
    ({"group_by": "day,weekday"}, "group_by"), ({"group_by": "day,day"}, "group_by"),
    ({"limit": "abc"}, "limit"), ({"limit": "0"}, "limit"), ({"limit": "10001"}, "limit"),
    ({"limit": "-5"}, "limit"), ({"limit": "1e3"}, "limit"),
    ({"after": "not-a-cursor"}, "after"), ({"after": "e30"}, "after"),
    ({"after": "%00"}, "after"), ({"after": "\x00"}, "after"),
    ({"group_by": "day,\x00"}, "group_by"), ({"from": "\x00"}, "from"),
]


def test_bad_parameters_are_400_naming_them(served: Served) -> None:
    for params, param in BAD_PARAMETERS:
        for path, auth in (("/v1/usage", A), ("/admin/usage", ADMIN_AUTH)):
            r = served.get(path, auth, **params)
            assert r.status_code == 400, (path, params, r.text)
            error = r.json()["error"]
            assert error["param"] == param, (params, error)
            assert error["type"] == "invalid_request_error", error


def test_admin_reads_every_tenant_exports_and_reconciles(served: Served) -> None:
    params = {"from": FROM, "to": TO}
    every = _walk(served, "/admin/usage", ADMIN_AUTH, **params, limit=50)
    assert every == _http_rows(expected_rows(served.records, ("tenant", "day", "model",
                                                              "class"), START_MS, TODAY_MS,
                                             None))
    assert {row["tenant"] for row in every} == {"acme", "globex", "initech"}
    one = served.get("/admin/usage", ADMIN_AUTH, **params, tenant="initech").json()
    assert one["tenant"] == "initech"
    assert one["data"] == _http_rows(expected_rows(served.records, ("day", "model", "class"),
                                                   START_MS, TODAY_MS, "initech"))
    assert served.get("/admin/usage", ADMIN_AUTH, tenant="a\x00b").json()["error"][
        "param"] == "tenant"
    totals = served.get("/admin/usage", ADMIN_AUTH, **params, group_by="").json()["data"]
    assert [t["requests"] for t in totals] == [len(served.records)]  # group_by=: one total
    exported = served.get("/admin/usage/export", ADMIN_AUTH, start_ms=START_MS,
                          end_ms=TODAY_MS, tenant="globex")
    assert exported.status_code == 200
    got = [decode_record(line) for line in exported.text.splitlines()]
    assert got == sorted((r for r in served.records if r.tenant == "globex"),
                         key=lambda r: (r.ts_ms, r.request_id))
    for bad, param in (({"format": "xml"}, "format"), ({"start_ms": -1}, "start_ms"),
                       ({"end_ms": 2**60}, "end_ms")):
        r = served.get("/admin/usage/export", ADMIN_AUTH, **{
            "start_ms": START_MS, "end_ms": TODAY_MS, **bad})
        assert (r.status_code, r.json()["error"]["param"]) == (400, param), bad
    check = served.get("/admin/usage/reconcile", ADMIN_AUTH, tenant="acme", day=FROM).json()
    assert check == {"tenant": "acme", "day": FROM, "consistent": True, "differences": []}
    assert json.dumps(check)  # plain JSON
