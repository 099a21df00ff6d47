"""The console over real HTTP, a real ``gateway serve`` in front of a seeded SQLite ledger:
sign-in and its cookie, CSRF refusals, the security headers, tenant isolation by URL and by
forged parameters, the operator's pages, sign-out and expiry, and the numbers and the CSV
against the usage API's own answers."""

from __future__ import annotations

import json
import re
import time
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from gateway.accounting.prices import format_micros
from gateway.console.edge import CSP
from tests.console.conftest import (
    ACME_KEY,
    ADMIN,
    GLOBEX_KEY,
    csrf_of,
    login_token,
    sign_in,
    start_console,
)
from tests.console.data import MONTH

pytestmark = pytest.mark.process

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from gateway.sim.server import SimServer
    from tests.helpers import GatewayProcess


@pytest.fixture()
def client(console: GatewayProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=console.url, timeout=30, follow_redirects=False) as c:
        yield c


@pytest.fixture()
def acme(client: httpx.Client) -> httpx.Client:
    answer = sign_in(client, ACME_KEY)
    assert answer.status_code == 303 and answer.headers["location"] == "/console/tenants/acme"
    return client


def _cookie(answer: httpx.Response, name: str) -> str:
    for value in answer.headers.get_list("set-cookie"):
        if value.startswith(name + "="):
            return value
    raise AssertionError(f"no {name} cookie in {answer.headers}")


def test_behind_a_tls_proxy_the_cookie_is_secure(sim: SimServer, tmp_path: Path) -> None:
    """``console.secure_cookie: always``: the cookies carry ``Secure`` though the gateway sees
    plain http (a proxy in front ends TLS); the browser then sends them over https only."""
    gw = start_console(sim, tmp_path, secure_cookie="always")
    try:
        with httpx.Client(base_url=gw.url, timeout=30, follow_redirects=False) as c:
            form = c.get("/console/login")
            login = _cookie(form, "gw_console_login")
            assert "secure" in [a.strip().lower() for a in login.split(";")]
            # the client keeps a Secure cookie off plain http, as a browser would: sent here
            # by hand, as the browser sends it over https to the proxy
            token = login.split(";")[0].split("=", 1)[1]
            answer = c.post("/console/login",
                            data={"csrf": token, "role": "tenant", "secret": ACME_KEY},
                            headers={"cookie": f"gw_console_login={token}"})
            assert answer.status_code == 303, answer.text[:300]
            attributes = [a.strip().lower() for a in _cookie(answer, "gw_console").split(";")]
            assert "secure" in attributes
    finally:
        gw.stop()


def test_sign_in_sets_a_strict_http_only_session_cookie(client: httpx.Client) -> None:
    """A 128-bit id in an HttpOnly, SameSite=Strict cookie on /console that lasts the session's
    minutes (not Secure here: the request came over plain http)."""
    answer = sign_in(client, ACME_KEY)
    assert answer.status_code == 303
    cookie = _cookie(answer, "gw_console")
    attributes = {a.strip().split("=")[0].lower(): a for a in cookie.split(";")[1:]}
    assert "httponly" in attributes and "secure" not in attributes
    assert attributes["samesite"].strip().lower() == "samesite=strict"
    assert attributes["path"].strip() == "Path=/console"
    assert attributes["max-age"].strip() == "Max-Age=1800"
    session_id = cookie.split(";")[0].split("=", 1)[1]
    assert len(session_id) == 22  # 16 random bytes
    assert ACME_KEY not in cookie
    page = client.get("/console/tenants/acme")
    assert page.status_code == 200 and 'id="tenant">acme<' in page.text


def test_a_wrong_key_or_token_signs_nobody_in(client: httpx.Client) -> None:
    for secret, role in ((ACME_KEY + "x", "tenant"), ("nope", "operator"), (ACME_KEY, "operator"),
                         (ADMIN, "tenant"), ("", "tenant")):
        answer = sign_in(client, secret, role)
        assert answer.status_code == 401, (secret, role)
        assert "gw_console=" not in answer.headers.get("set-cookie", "")
    assert client.get("/console/tenants/acme").status_code == 303


def test_the_key_is_never_in_a_url(client: httpx.Client) -> None:
    """The sign-in form posts; a GET with the key in the query signs nobody in."""
    page = client.get("/console/login")
    assert 'method="post"' in page.text and 'type="password"' in page.text
    client.get("/console/login", params={"secret": ACME_KEY, "role": "tenant"})
    assert client.get("/console/tenants/acme").status_code == 303


@pytest.mark.parametrize("token", [None, "", "wrong-token-0123456789"])
def test_sign_in_without_its_csrf_token_is_refused(client: httpx.Client,
                                                   token: str | None) -> None:
    login_token(client)
    data = {"role": "tenant", "secret": ACME_KEY}
    if token is not None:
        data["csrf"] = token
    answer = client.post("/console/login", data=data)
    assert answer.status_code == 403
    assert "gw_console=" not in answer.headers.get("set-cookie", "")


@pytest.mark.parametrize("token", [None, "wrong-token-0123456789"])
def test_sign_out_without_its_csrf_token_is_refused(acme: httpx.Client,
                                                    token: str | None) -> None:
    """A POST without the session's token (or with another) is 403 and the session lives."""
    answer = acme.post("/console/logout", data={} if token is None else {"csrf": token})
    assert answer.status_code == 403
    assert acme.get("/console/tenants/acme").status_code == 200


def test_sign_out_ends_the_session(acme: httpx.Client) -> None:
    page = acme.get("/console/tenants/acme")
    session = acme.cookies["gw_console"]
    answer = acme.post("/console/logout", data={"csrf": csrf_of(page)})
    assert answer.status_code == 303 and answer.headers["location"] == "/console/login"
    assert "Max-Age=0" in _cookie(answer, "gw_console") or "expires" in _cookie(
        answer, "gw_console").lower()
    # the old cookie, replayed, is no session any more
    with httpx.Client(base_url=str(acme.base_url), cookies={"gw_console": session}) as again:
        assert again.get("/console/tenants/acme").status_code == 303


@pytest.mark.parametrize("path", ["/console/login", "/console/tenants/acme",
                                  "/console/tenants/globex", "/console/nothing-here",
                                  "/console/static/console.js"])
def test_every_answer_carries_the_security_headers(acme: httpx.Client, path: str) -> None:
    answer = acme.get(path)
    assert answer.headers["content-security-policy"] == CSP
    assert answer.headers["x-frame-options"] == "DENY"
    assert answer.headers["referrer-policy"] == "no-referrer"


def test_pages_have_no_inline_script(acme: httpx.Client) -> None:
    """Every <script> is a static file or a JSON data block (which no browser runs)."""
    page = acme.get("/console/tenants/acme").text
    for tag in re.findall(r"<script[^>]*>", page):
        assert 'src="/console/static/' in tag or 'type="application/json"' in tag, tag
    assert not re.search(r"<[^>]*\son[a-z]+=", page)  # no onclick= style handlers either
    assert "style=" not in page


def test_static_files_are_cached_for_a_year(client: httpx.Client) -> None:
    page = client.get("/console/login").text
    href = re.search(r'href="(/console/static/console.css\?v=[0-9a-f]+)"', page)
    assert href is not None
    answer = client.get(href.group(1))
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/css")
    assert answer.headers["cache-control"] == "public, max-age=31536000, immutable"
    chart = client.get("/console/static/chart-4.6.1.umd.min.js")
    assert chart.status_code == 200 and b"Chart.js v4.6.1" in chart.content
    assert client.get("/console/static/../policy.yaml").status_code in (400, 404)


@pytest.mark.parametrize(("path", "status"), [
    pytest.param("/console/tenants/globex", 403, id="page"),
    pytest.param("/console/tenants/globex/export.csv", 403, id="csv"),
    pytest.param("/console/tenants/quiet", 403, id="tenant-without-usage"),
    pytest.param("/console/tenants/GLOBEX", 403, id="letter-case"),
    pytest.param("/console/operator", 403, id="operator-page"),
    pytest.param("/console/operator/live.json", 403, id="operator-json"),
    pytest.param("/console/tenants/acme/..%2Fglobex", 400, id="dot-dot"),
    pytest.param("/console/tenants/acme%2F..%2Fglobex", 400, id="encoded-dot-dot"),
])
def test_a_tenant_cannot_open_another_tenants_pages(acme: httpx.Client, path: str,
                                                    status: int) -> None:
    """403 for another tenant's (or the operator's) URL; a path that would climb out of the
    tenant's own is a 400 at the edge (the canonical path)."""
    answer = acme.get(path)
    assert answer.status_code == status
    assert "globex" not in answer.text.lower() or status == 400


def test_forged_tenant_parameters_are_ignored(acme: httpx.Client) -> None:
    """A ``tenant`` in the query or a form changes nothing: the tenant is the session's."""
    csv = acme.get("/console/tenants/acme/export.csv",
                   params={"month": MONTH.label, "tenant": "globex"})
    assert csv.status_code == 200
    lines = csv.text.splitlines()
    column = lines[0].split(",").index("tenant")
    assert len(lines) > 1 and {line.split(",")[column] for line in lines[1:]} == {"acme"}
    page = acme.get("/console/tenants/acme", params={"tenant": "globex"})
    assert page.status_code == 200 and 'id="tenant">acme<' in page.text


def _usage(gw: GatewayProcess, key: str, group_by: str) -> list[dict[str, Any]]:
    answer = httpx.get(gw.url + "/v1/usage", headers={"Authorization": f"Bearer {key}"},
                       params={"from": MONTH.days[0], "to": _next_month(), "group_by": group_by,
                               "limit": 10000}, timeout=30)
    assert answer.status_code == 200, answer.text
    rows: list[dict[str, Any]] = answer.json()["data"]
    return rows


def _next_month() -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(MONTH.hi / 1000, UTC).strftime("%Y-%m-%d")


def test_the_page_shows_the_usage_apis_numbers(console: GatewayProcess,
                                               acme: httpx.Client) -> None:
    """The chart's data and the by-model table are /v1/usage's numbers for the same month."""
    page = acme.get("/console/tenants/acme").text
    data = re.search(r'<script type="application/json" id="usage-data">(.*?)</script>', page,
                     re.S)
    assert data is not None
    chart = json.loads(data.group(1))
    by_day = {r["day"]: r for r in _usage(console, ACME_KEY, "day")}
    series = {s["label"]: s["data"] for s in chart["series"]}
    for i, day in enumerate(MONTH.days):
        row = by_day.get(day, {"system": 0, "output": 0, "cached": 0, "prompt_total": 0})
        assert series["system"][i] == row["system"]
        assert series["cached"][i] == row["cached"]
        assert series["output"][i] + series["reasoning"][i] == row["output"]
    spend = re.search(r'<script type="application/json" id="spend-data">(.*?)</script>', page,
                      re.S)
    assert spend is not None
    micros = json.loads(spend.group(1))["micros"]
    for i, day in enumerate(MONTH.days):
        assert format_micros(micros[i]) == by_day.get(day, {"cost": "0.000000"})["cost"], day
    table = re.search(r'<table id="by-model">.*?<tbody>(.*?)</tbody>', page, re.S)
    assert table is not None
    shown = [re.findall(r"<td>(.*?)</td>", tr) for tr in re.findall(r"<tr>(.*?)</tr>",
                                                                    table.group(1), re.S)]
    want = _usage(console, ACME_KEY, "model")
    assert [(int(c[1]), int(c[8]), c[10]) for c in shown] == [
        (r["requests"], r["output"], r["cost"]) for r in sorted(want, key=lambda r: r["model"])]


def test_the_csv_is_the_admin_export_of_the_tenant(console: GatewayProcess,
                                                   acme: httpx.Client) -> None:
    mine = acme.get("/console/tenants/acme/export.csv")
    assert mine.status_code == 200 and mine.headers["content-type"].startswith("text/csv")
    assert "attachment" in mine.headers["content-disposition"]
    admin = httpx.get(console.url + "/admin/usage/export", timeout=30,
                      headers={"Authorization": f"Bearer {ADMIN}"},
                      params={"start_ms": MONTH.lo, "end_ms": MONTH.hi, "tenant": "acme",
                              "format": "csv"})
    assert admin.status_code == 200
    assert mine.text == admin.text and mine.text.count("\n") > 10


def test_limits_show_plan_and_key(acme: httpx.Client) -> None:
    page = acme.get("/console/tenants/acme").text
    table = re.search(r'<table id="limits">(.*?)</table>', page, re.S)
    assert table is not None
    assert "tokens_per_day" in table.group(1) and "5000000" in table.group(1)
    assert "this API key" in table.group(1)


def test_the_operator_sees_every_tenant_and_live_pools(client: httpx.Client) -> None:
    answer = sign_in(client, ADMIN, "operator")
    assert answer.status_code == 303 and answer.headers["location"] == "/console/operator"
    page = client.get("/console/operator")
    assert page.status_code == 200
    for tenant in ("acme", "globex", "initech", "quiet"):
        assert f'href="/console/tenants/{tenant}?month={MONTH.label}"' in page.text
    live = client.get("/console/operator/live.json")
    assert live.status_code == 200
    pools = live.json()["pools"]
    assert pools[0]["pool"] == "chat" and pools[0]["backends"][0]["backend"] == "chat-0"
    assert "ttft_p50_ms" in pools[0]
    backend = pools[0]["backends"][0]
    assert {"ttft_p50_ms", "ttft_p99_ms", "engine"} <= set(backend)
    assert backend["engine"] is None  # the pool scrapes no engine metrics
    assert client.get("/console/tenants/globex").status_code == 200  # any tenant's page


def _cells(page: str, table: str, attribute: str, name: str) -> list[str]:
    """The cells of the first row of ``table`` whose ``attribute`` is ``name``."""
    body = re.search(rf'<table id="{table}"[^>]*>(.*?)</table>', page, re.S)
    assert body is not None
    row = re.search(rf'<tr {attribute}="{re.escape(name)}"[^>]*>(.*?)</tr>', body.group(1),
                    re.S)
    assert row is not None, body.group(1)
    return [re.sub(r"<[^>]+>", "", c).strip()
            for c in re.findall(r"<td[^>]*>(.*?)</td>", row.group(1), re.S)]


def test_the_operator_sees_teams_and_organizations(console: GatewayProcess,
                                                   client: httpx.Client) -> None:
    """Team labs (globex) and organization corp: globex's month as /v1/usage answers it,
    their budgets from the policy with what is used, the thresholds that alert."""
    sign_in(client, ADMIN, "operator")
    page = client.get("/console/operator").text
    rows = _usage(console, GLOBEX_KEY, "model")
    requests = sum(r["requests"] for r in rows)
    tokens = sum(r["prompt_total"] + r["output"] for r in rows)
    spend = _usage(console, GLOBEX_KEY, "")
    team = _cells(page, "teams", "data-team", "labs")
    assert team[:6] == ["labs", "corp", "globex", str(requests), str(tokens), spend[0]["cost"]]
    assert team[6:] == ["tokens_per_month", "9000000", "0", "0%", "50%, 90%", "none"]
    org = _cells(page, "organizations", "data-organization", "corp")
    assert org[:5] == ["corp", "globex", str(requests), str(tokens), spend[0]["cost"]]
    assert org[5:] == ["cost_per_month", "500.000000", "0.000000", "0%", "50%, 90%", "none"]
    assert _cells(page, "tenants", "data-tenant", "acme")[-1] == "none"
    assert _cells(page, "tenants", "data-tenant", "initech")[-1] == ""  # not in the policy


def test_live_json_needs_a_session(client: httpx.Client) -> None:
    assert client.get("/console/operator/live.json").status_code == 401
    assert client.get("/console/operator").status_code == 303


def test_another_tenant_signs_into_its_own(client: httpx.Client) -> None:
    answer = sign_in(client, GLOBEX_KEY)
    assert answer.headers["location"] == "/console/tenants/globex"
    assert client.get("/console/tenants/acme").status_code == 403


def test_a_session_expires_after_its_minutes(sim: SimServer, tmp_path: Path) -> None:
    """``session_minutes: 0.05``: signed in, then 3 s later signed out by the server."""
    gw = start_console(sim, tmp_path, session_minutes=0.05)
    try:
        with httpx.Client(base_url=gw.url, timeout=30) as c:
            answer = sign_in(c, ACME_KEY)
            assert "Max-Age=3" in _cookie(answer, "gw_console")
            assert c.get("/console/tenants/acme").status_code == 200
            session = c.cookies["gw_console"]
            time.sleep(3.2)
        # replayed past its expiry (as a browser ignoring Max-Age would)
        with httpx.Client(base_url=gw.url, cookies={"gw_console": session}) as late:
            answer = late.get("/console/tenants/acme")
            assert answer.status_code == 303 and answer.headers["location"] == "/console/login"
    finally:
        gw.stop()
