"""The console's figures against the usage API's: a tenant's month read by day and model from
a real SQLite ledger gives the same numbers as ``usage_rows`` (what ``GET /v1/usage`` answers)
and as the records themselves; the chart's stacks each sum to a whole, the spend chart's days
to the month's cost; the operator's tenants are the policy's and the ledger's, its teams and
organizations the sums of their tenants' rows."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pytest

from gateway.config import parse_policy
from gateway.console.views import (
    MonthError,
    chart_data,
    group_spend,
    limit_lines,
    parse_month,
    read_rows,
    spend_chart,
    tenant_month,
    tenant_spend,
)
from gateway.ledger.aggregate import UsageRow
from gateway.ledger.sql.sqlite import SqliteLedger
from gateway.runtime import Runtime
from tests.console.data import MONTH, RECORDS, seed
from tests.ledger.usage_data import expected_rows

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path


@pytest.fixture()
async def ledger(tmp_path: Path) -> AsyncIterator[SqliteLedger]:
    await seed(SqliteLedger(tmp_path / "ledger.db", spool_dir=tmp_path / "seed"))
    reader = SqliteLedger(tmp_path / "ledger.db", spool_dir=tmp_path / "spool")
    await reader.start()
    yield reader
    await reader.close()


@pytest.mark.parametrize(("text", "label", "days"), [
    pytest.param("2024-02", "2024-02", 29, id="leap-february"),
    pytest.param("2023-12", "2023-12", 31, id="december"),
    pytest.param(" 2025-04 ", "2025-04", 30, id="spaces"),
])
def test_parse_month(text: str, label: str, days: int) -> None:
    """A month is its UTC days, ``[lo, hi)`` from the 1st to the next 1st."""
    month = parse_month(text)
    assert (month.label, len(month.days)) == (label, days)
    assert month.hi - month.lo == days * 86_400_000
    assert month.days[0] == f"{label}-01"


@pytest.mark.parametrize("text", ["2024-13", "2024-1", "24-01", "2024-01-01", "x", "1969-12",
                                  "9999-12", "2024-00"])
def test_parse_month_refuses(text: str) -> None:
    """Anything but ``YYYY-MM`` in 1970..9998 is refused."""
    with pytest.raises(MonthError):
        parse_month(text)


def test_parse_month_defaults_to_the_current_month() -> None:
    assert parse_month(None, datetime(2024, 5, 31, 23, 59, tzinfo=UTC)).label == "2024-05"
    assert parse_month("", datetime(2024, 1, 1, tzinfo=UTC)).label == "2024-01"


def _sum(rows: list[dict[str, Any]], field: str) -> int:
    return sum(int(r[field]) for r in rows)


async def test_tenant_month_matches_the_usage_api(ledger: SqliteLedger) -> None:
    """The day-and-model table is ``usage_rows`` by day and model, which is the records summed
    (``expected_rows``); the per-model sums equal ``usage_rows`` by model; the totals equal the
    month's one-row read."""
    for tenant in ("acme", "globex"):
        rows = await read_rows(ledger, tenant, MONTH.lo, MONTH.hi, ("day", "model"))
        view = tenant_month(tenant, MONTH, rows, "USD")
        want = expected_rows(RECORDS, ("day", "model"), MONTH.lo, MONTH.hi, tenant)
        assert [(r["day"], r["model"]) for r in view.rows] == [(w["day"], w["model"])
                                                               for w in want]
        for got, expected in zip(view.rows, want, strict=True):
            for field in ("requests", "failed", "system", "history", "new", "tools", "cached",
                          "cache_write", "output", "reasoning", "cost_micros"):
                assert got[field] == expected[field], field
        by_model = await read_rows(ledger, tenant, MONTH.lo, MONTH.hi, ("model",))
        assert [(m["model"], m["requests"], m["output"], m["cost_micros"])
                for m in view.by_model] == sorted(
            (r.model, r.requests, r.output, r.cost_micros) for r in by_model)
        (total,) = await read_rows(ledger, tenant, MONTH.lo, MONTH.hi, ())
        assert view.totals["requests"] == total.requests
        assert view.totals["tokens"] == total.prompt_total + total.output
        assert view.totals["cost_micros"] == total.cost_micros
        # no other tenant's request is in the view
        assert view.totals["requests"] == sum(1 for r in RECORDS if r.tenant == tenant)


async def test_chart_stacks_sum_to_the_rows(ledger: SqliteLedger) -> None:
    """Per day, the input-by-role stack sums the role buckets, the input-by-cache stack is the
    prompt total, the output stack the output: nothing counted twice."""
    rows = await read_rows(ledger, "acme", MONTH.lo, MONTH.hi, ("day", "model"))
    chart = chart_data(MONTH, rows)
    assert len(chart["labels"]) == len(MONTH.days)
    stacks: dict[str, list[int]] = {}
    for series in chart["series"]:
        sums = stacks.setdefault(series["stack"], [0] * len(MONTH.days))
        for i, value in enumerate(series["data"]):
            sums[i] += value
    for i, day in enumerate(MONTH.days):
        of_day = [r for r in rows if r.day == day]
        assert stacks["input by role"][i] == sum(r.system + r.history + r.new + r.tools
                                                 for r in of_day)
        assert stacks["input by cache"][i] == sum(r.prompt_total for r in of_day)
        assert stacks["output"][i] == sum(r.output for r in of_day)


async def test_tenant_spend_lists_policy_and_ledger_tenants(ledger: SqliteLedger) -> None:
    """One read grouped by tenant; a tenant of the policy without usage shows 0, a tenant in
    the ledger but not the policy is listed and marked."""
    rows = await read_rows(ledger, None, MONTH.lo, MONTH.hi, ("tenant",))
    spend = tenant_spend(["acme", "globex", "quiet"], rows)
    assert [s.tenant for s in spend] == ["acme", "globex", "initech", "quiet"]
    by_name = {s.tenant: s for s in spend}
    assert by_name["quiet"].requests == 0 and by_name["quiet"].cost == "0.000000"
    assert not by_name["initech"].configured and by_name["acme"].configured
    assert by_name["acme"].requests == sum(1 for r in RECORDS if r.tenant == "acme")


def test_limit_lines_show_plan_team_and_key_limits() -> None:
    """A tenant's plan limits (with the day and month use), its per-model, team and key limits."""
    policy = parse_policy({
        "plans": [{"name": "std", "limits": {"rpm": 60, "tokens_per_day": 1000,
                                              "cost_per_month": "5"},
                   "models": {"m": {"rpm": 6}}}],
        "organizations": [{"name": "org", "limits": {"tokens_per_month": 99}}],
        "teams": [{"name": "red", "organization": "org", "limits": {"tpm": 7}}],
        "tenants": [{"name": "acme", "plan": "std", "team": "red"}],
    })
    today = UsageRow(prompt_total=300, output=20, cost_micros=1_500_000)
    month = UsageRow(prompt_total=3000, output=200, cost_micros=2_500_000)
    lines = limit_lines(Runtime(policy), "acme", today, month, {"rpm": 3})
    got = [(line.level, line.name, line.limit, line.used) for line in lines]
    assert got == [
        ("tenant (plan std)", "rpm", "60", None),
        ("tenant (plan std)", "tokens_per_day", "1000", "320"),
        ("tenant (plan std)", "cost_per_month", "5", "2.500000"),
        ("model m", "rpm", "6", None),
        ("team red", "tpm", "7", None),
        ("organization org", "tokens_per_month", "99", None),
        ("this API key", "rpm", "3", None),
    ]


async def test_spend_chart_days_sum_to_the_month(ledger: SqliteLedger) -> None:
    """Each day's spend is that day's rows' cost; the days sum to the month's one-row read."""
    rows = await read_rows(ledger, "acme", MONTH.lo, MONTH.hi, ("day", "model"))
    spend = spend_chart(MONTH, rows, "EUR")
    assert (spend["currency"], len(spend["micros"])) == ("EUR", len(MONTH.days))
    for i, day in enumerate(MONTH.days):
        assert spend["micros"][i] == sum(r.cost_micros for r in rows if r.day == day)
    (total,) = await read_rows(ledger, "acme", MONTH.lo, MONTH.hi, ())
    assert sum(spend["micros"]) == total.cost_micros > 0
    assert tenant_month("acme", MONTH, rows, "EUR").spend == spend


def _grouped_runtime() -> Runtime:
    """acme in organization corp without a team, globex and initech in team labs of corp,
    quiet in team idle of corp; organization solo and team empty hold no tenant."""
    return Runtime(parse_policy({
        "plans": [{"name": "std"}],
        "organizations": [{"name": "corp", "limits": {"cost_per_month": "500"}},
                          {"name": "solo"}],
        "teams": [{"name": "labs", "organization": "corp"},
                  {"name": "idle", "organization": "corp"},
                  {"name": "empty", "organization": "solo"}],
        "tenants": [{"name": "acme", "plan": "std", "organization": "corp"},
                    {"name": "globex", "plan": "std", "team": "labs"},
                    {"name": "initech", "plan": "std", "team": "labs"},
                    {"name": "quiet", "plan": "std", "team": "idle"}],
    }))


async def test_teams_and_organizations_sum_their_tenants_usage_rows(
        ledger: SqliteLedger) -> None:
    """A team's (an organization's) requests, tokens and spend are the sums of its tenants'
    month as ``usage_rows`` answers it for each tenant (``GET /v1/usage``), and so of their
    records; from the one read grouped by tenant."""
    rows = await read_rows(ledger, None, MONTH.lo, MONTH.hi, ("tenant",))
    teams, organizations = group_spend(_grouped_runtime(), rows)
    assert [(t.name, t.organization, t.tenants) for t in teams] == [
        ("empty", "solo", ()), ("idle", "corp", ("quiet",)),
        ("labs", "corp", ("globex", "initech"))]
    assert [(o.name, o.tenants) for o in organizations] == [
        ("corp", ("acme", "globex", "initech", "quiet")), ("solo", ())]
    per_tenant = {}
    for tenant in ("acme", "globex", "initech", "quiet"):
        found = await read_rows(ledger, tenant, MONTH.lo, MONTH.hi, ())
        per_tenant[tenant] = found[0] if found else UsageRow()
    for group in (*teams, *organizations):
        mine = [per_tenant[t] for t in group.tenants]
        assert group.requests == sum(r.requests for r in mine)
        assert group.tokens == sum(r.prompt_total + r.output for r in mine)
        assert group.cost_micros == sum(r.cost_micros for r in mine)
        assert group.requests == sum(1 for r in RECORDS if r.tenant in group.tenants)
    labs = next(t for t in teams if t.name == "labs")
    assert labs.requests > 0 and labs.cost == f"{labs.cost_micros / 1e6:.6f}"
    assert next(o for o in organizations if o.name == "solo").requests == 0
