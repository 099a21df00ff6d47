"""The console's actions over real HTTP, a real ``gateway serve``: a tenant's managed keys
(create, shown once, used, revoked; CSRF and another tenant's key refused), its limits in use
against the ``x-ratelimit-*`` headers, its team's and organization's budgets, the operator's
audit page with the console's actions in it, and the bound on failed sign-ins."""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest

from tests.console.conftest import (
    ACME_KEY,
    ADMIN,
    GLOBEX_KEY,
    csrf_of,
    sign_in,
    start_console,
)

pytestmark = pytest.mark.process

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from gateway.sim.server import SimServer
    from tests.helpers import GatewayProcess

MODEL = "chat-model"


@pytest.fixture()
def client(console: GatewayProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=console.url, timeout=30, follow_redirects=False) as c:
        yield c


def _signed_in(client: httpx.Client, secret: str, role: str = "tenant") -> httpx.Client:
    answer = sign_in(client, secret, role)
    assert answer.status_code == 303, answer.text
    return client


def _chat(url: str, key: str) -> Any:
    """One chat completion with the openai client; its raw answer (status, headers)."""
    api = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=30)
    return api.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=8)


def _status(url: str, key: str) -> int:
    try:
        return int(_chat(url, key).status_code)
    except openai.APIStatusError as exc:
        return exc.status_code


def _create_key(client: httpx.Client, tenant: str, name: str, days: str = "") -> tuple[str, str]:
    """Create a key from the tenant page's form: (key id, key)."""
    page = client.get(f"/console/tenants/{tenant}")
    answer = client.post(f"/console/tenants/{tenant}/keys",
                         data={"csrf": csrf_of(page), "name": name, "expires_days": days})
    assert answer.status_code == 200, answer.text
    assert "location" not in answer.headers
    key = re.search(r'id="new-key" value="([^"]+)"', answer.text)
    key_id = re.search(r'id="new-key-id">([^<]+)<', answer.text)
    assert key is not None and key_id is not None
    return key_id.group(1), key.group(1)


def _key_state(client: httpx.Client, tenant: str, key_id: str) -> str | None:
    page = client.get(f"/console/tenants/{tenant}").text
    row = re.search(rf'<tr data-key-id="{key_id}">.*?<td class="state">(\w+)', page, re.S)
    return row.group(1) if row else None


def _wait_status(url: str, key: str, status: int, within: float = 5.0) -> int:
    deadline = time.monotonic() + within
    while True:
        got = _status(url, key)
        if got == status or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


def test_a_tenant_creates_uses_and_revokes_a_key(console: GatewayProcess,
                                                 client: httpx.Client) -> None:
    acme = _signed_in(client, ACME_KEY)
    key_id, key = _create_key(acme, "acme", "ci runner", days="30")
    assert key.startswith("sk-gw-") and key_id in key
    page = acme.get("/console/tenants/acme").text
    assert key not in page  # shown once, on the answer to the form only
    assert _key_state(acme, "acme", key_id) == "active" and "ci runner" in page
    assert _status(console.url, key) == 200
    revoke = acme.post(f"/console/tenants/acme/keys/{key_id}/revoke",
                       data={"csrf": csrf_of(acme.get("/console/tenants/acme"))})
    assert revoke.status_code == 303
    assert _key_state(acme, "acme", key_id) == "revoked"
    assert _wait_status(console.url, key, 401) == 401
    assert key not in console.output()  # never logged


def test_key_forms_need_the_sessions_csrf_token(client: httpx.Client) -> None:
    acme = _signed_in(client, ACME_KEY)
    before = acme.get("/console/tenants/acme").text.count("data-key-id=")
    for data in ({"name": "x"}, {"name": "x", "csrf": "forged-token-0123456789"}):
        assert acme.post("/console/tenants/acme/keys", data=data).status_code == 403
    assert acme.get("/console/tenants/acme").text.count("data-key-id=") == before
    key_id, _ = _create_key(acme, "acme", "kept")
    answer = acme.post(f"/console/tenants/acme/keys/{key_id}/revoke", data={})
    assert answer.status_code == 403
    assert _key_state(acme, "acme", key_id) == "active"


def test_a_tenant_cannot_revoke_another_tenants_key(console: GatewayProcess,
                                                    client: httpx.Client) -> None:
    """A forged form naming globex's key id: 404 under acme's own URL, 403 under globex's;
    the key still works."""
    with httpx.Client(base_url=console.url, timeout=30, follow_redirects=False) as other:
        globex = _signed_in(other, GLOBEX_KEY)
        theirs, their_key = _create_key(globex, "globex", "theirs")
    acme = _signed_in(client, ACME_KEY)
    token = csrf_of(acme.get("/console/tenants/acme"))
    mine = acme.post(f"/console/tenants/acme/keys/{theirs}/revoke", data={"csrf": token})
    assert mine.status_code == 404
    there = acme.post(f"/console/tenants/globex/keys/{theirs}/revoke", data={"csrf": token})
    assert there.status_code == 403
    create = acme.post("/console/tenants/globex/keys", data={"csrf": token, "name": "x"})
    assert create.status_code == 403
    assert theirs not in acme.get("/console/tenants/acme").text  # not listed either
    assert _status(console.url, their_key) == 200


def _in_use(page: str, scope: str, limit: str) -> tuple[str, str, str]:
    row = re.search(rf'<tr data-scope="{re.escape(scope)}" data-limit="{limit}">'
                    rf'<td>[^<]*</td><td>[^<]*</td><td>([^<]*)</td><td class="used">([^<]*)'
                    rf'</td><td class="remaining">([^<]*)</td>', page)
    assert row is not None, (scope, limit, re.findall(r'<tr data-scope="[^"]*"[^>]*>', page))
    return row.group(1), row.group(2), row.group(3)


def test_limits_in_use_match_the_ratelimit_headers(console: GatewayProcess,
                                                   client: httpx.Client) -> None:
    """After N requests with acme's key (rpm 30), the page shows N used of the key's rpm and
    what the last answer's ``x-ratelimit-remaining-requests`` said was left."""
    n = 4
    answers = [_chat(console.url, ACME_KEY) for _ in range(n)]
    headers = answers[-1].headers
    assert headers["x-ratelimit-limit-requests"] == "30"
    acme = _signed_in(client, ACME_KEY)
    page = acme.get("/console/tenants/acme").text
    limit, used, remaining = _in_use(page, "API key acme-key", "rpm")
    assert (limit, used) == ("30", str(n))
    assert remaining == headers["x-ratelimit-remaining-requests"] == str(30 - n)
    plan_limit, plan_used, _ = _in_use(page, "tenant", "rpm")
    assert plan_limit == "600" and int(plan_used) >= n
    _, tokens_today, _ = _in_use(page, "tenant", "tokens_per_day")
    assert int(tokens_today) > 0


def test_a_team_tenant_sees_its_team_and_organization_budgets(client: httpx.Client) -> None:
    globex = _signed_in(client, GLOBEX_KEY)
    page = globex.get("/console/tenants/globex").text
    limit, _, _ = _in_use(page, "team labs", "tokens_per_month")
    assert limit == "9000000"
    _in_use(page, "organization corp spend", "cost_per_month")
    row = re.search(r'data-scope="organization corp spend".*?</tr>', page, re.S)
    assert row is not None and "50%, 90%" in row.group(0)


def test_the_operator_reads_the_audit_log(console: GatewayProcess,
                                          client: httpx.Client) -> None:
    """Console sign-ins, key creations and revocations and the admin API's own requests,
    newest first; tenants get 403."""
    acme = _signed_in(client, ACME_KEY)
    key_id, _ = _create_key(acme, "acme", "audited")
    acme.post(f"/console/tenants/acme/keys/{key_id}/revoke",
              data={"csrf": csrf_of(acme.get("/console/tenants/acme"))})
    assert acme.get("/console/operator/audit").status_code == 403
    httpx.get(console.url + "/admin/audit", headers={"Authorization": f"Bearer {ADMIN}"})
    operator = _signed_in(client, ADMIN, "operator")
    page = operator.get("/console/operator/audit")
    assert page.status_code == 200
    text = page.text
    assert f"created key {key_id} of acme" in text and f"revoked key {key_id} of acme" in text
    assert "signed in with key acme-key" in text and "/admin/audit" in text
    newest = text.index("<tbody>")
    assert text.index("operator", newest) < text.index(f"revoked key {key_id}") \
        < text.index(f"created key {key_id}")
    assert operator.get("/console/operator/audit", params={"page": "x"}).status_code == 400


def test_failed_sign_ins_are_bounded_per_address(sim: SimServer, tmp_path: Path) -> None:
    """10 failures a minute, then 429 with Retry-After, a right key too."""
    gw = start_console(sim, tmp_path)
    try:
        with httpx.Client(base_url=gw.url, timeout=30, follow_redirects=False) as c:
            for _ in range(10):
                assert sign_in(c, "sk-gw-wrong-key").status_code == 401
            refused = sign_in(c, ACME_KEY)
            assert refused.status_code == 429
            assert 1 <= int(refused.headers["retry-after"]) <= 60
            assert "gw_console=" not in refused.headers.get("set-cookie", "")
    finally:
        gw.stop()


def test_behind_a_trusted_proxy_the_bound_is_per_forwarded_client(sim: SimServer,
                                                                  tmp_path: Path) -> None:
    """With the test's loopback as a trusted proxy, each client named by X-Forwarded-For
    has its own bound: one that failed 10 times is refused, another behind the same proxy
    signs in; a forged first entry does not escape the bound (the last untrusted hop
    counts)."""
    gw = start_console(sim, tmp_path, trusted_proxies=["127.0.0.0/8", "::1"])
    try:
        with httpx.Client(base_url=gw.url, timeout=30, follow_redirects=False) as c:
            mallory = {"x-forwarded-for": "203.0.113.7"}
            for _ in range(10):
                c.headers.update(mallory)
                assert sign_in(c, "sk-gw-wrong-key").status_code == 401
            assert sign_in(c, ACME_KEY).status_code == 429
            c.headers.update({"x-forwarded-for": "198.51.100.1, 203.0.113.7"})  # forged hop
            assert sign_in(c, ACME_KEY).status_code == 429
            c.cookies.clear()
            c.headers.update({"x-forwarded-for": "192.0.2.44"})
            assert sign_in(c, ACME_KEY).status_code == 303
    finally:
        gw.stop()


def test_without_trusted_proxies_a_forwarded_address_is_ignored(sim: SimServer,
                                                                tmp_path: Path) -> None:
    """No trusted proxies: X-Forwarded-For changes nothing, the peer's address is bounded."""
    gw = start_console(sim, tmp_path)
    try:
        with httpx.Client(base_url=gw.url, timeout=30, follow_redirects=False) as c:
            for n in range(10):
                c.headers.update({"x-forwarded-for": f"203.0.113.{n}"})
                assert sign_in(c, "sk-gw-wrong-key").status_code == 401
            c.headers.update({"x-forwarded-for": "192.0.2.44"})
            assert sign_in(c, ACME_KEY).status_code == 429
    finally:
        gw.stop()
