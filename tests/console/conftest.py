"""A real ``gateway serve`` with the console on, over a SQLite ledger seeded with this month's
usage of three tenants; acme's and globex's keys (globex in team ``labs`` of organization
``corp``, both with budgets), managed keys in a keys file, and the admin token."""

from __future__ import annotations

import asyncio
import hashlib
import re
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from gateway.ledger.sql.sqlite import SqliteLedger
from tests.console.data import seed
from tests.helpers import TEST_KEY, TEST_KEY_SHA, GatewayProcess, policy
from tests.process_marker import starts_process

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from gateway.sim.server import SimServer

ADMIN = "console-admin-test-token"
ACME_KEY = TEST_KEY
GLOBEX_KEY = "sk-gw-console-globex-0123456789abcdef0123456789abcd"
#: the secret of managed keys' hashes (``auth.key_secret_env``)
KEY_SECRET = "console-test-key-secret-0123456789"


def console_policy(sim: SimServer, tmp: Path, **console: Any) -> dict[str, Any]:
    data = policy({"chat": [sim.url]})
    data["auth"]["keys"] = [
        {"id": "acme-key", "tenant": "acme", "sha256": TEST_KEY_SHA, "limits": {"rpm": 30}},
        {"id": "globex-key", "tenant": "globex",
         "sha256": hashlib.sha256(GLOBEX_KEY.encode()).hexdigest()},
    ]
    data["plans"] = [{"name": "std", "limits": {"rpm": 600, "tokens_per_day": 5_000_000,
                                                 "cost_per_month": "100"}}]
    data["tenants"] = [{"name": "acme", "plan": "std"},
                       {"name": "globex", "plan": "std", "team": "labs"},
                       {"name": "quiet", "plan": "std"}]
    data["organizations"] = [{"name": "corp", "limits": {"cost_per_month": "500"},
                              "alerts": {"thresholds": [50, 90]}}]
    data["teams"] = [{"name": "labs", "organization": "corp",
                      "limits": {"tokens_per_month": 9_000_000}}]
    data["auth"]["cache_ttl"] = 0.2  # a revoked managed key stops within 0.2 s
    data["console"] = {"enabled": True, **console}
    data["store"] = {"data_dir": str(tmp / "data"), "spool_dir": str(tmp / "spool"),
                     "keys_file": str(tmp / "data" / "keys.json")}
    data["batch"] = {"files_dir": str(tmp / "files")}  # batch files, not in the working dir
    return data


def start_console(sim: SimServer, tmp: Path, data: dict[str, Any] | None = None,
                  **console: Any) -> GatewayProcess:
    """The gateway over ``data`` (default: :func:`console_policy`)."""
    asyncio.run(seed(SqliteLedger(tmp / "data" / "ledger.db", spool_dir=tmp / "seed")))
    with pytest.MonkeyPatch.context() as env:
        env.setenv("GATEWAY_ADMIN_TOKEN", ADMIN)
        env.setenv("GATEWAY_KEY_SECRET", KEY_SECRET)
        env.setenv("GATEWAY_ACCESS_LOG", "off")
        env.delenv("GATEWAY_LEDGER_URL", raising=False)
        env.delenv("GATEWAY_REDIS_URL", raising=False)
        return GatewayProcess(tmp, data or console_policy(sim, tmp, **console)).start()


@pytest.fixture(scope="module")
@starts_process
def console(sim: SimServer, tmp_path_factory: pytest.TempPathFactory,
            ) -> Iterator[GatewayProcess]:
    gw = start_console(sim, tmp_path_factory.mktemp("console"))
    try:
        yield gw
    finally:
        gw.stop()


def login_token(client: httpx.Client) -> str:
    """Open the sign-in page; its form's CSRF token."""
    page = client.get("/console/login")
    assert page.status_code == 200, page.text
    match = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert match is not None
    return match.group(1)


def sign_in(client: httpx.Client, secret: str, role: str = "tenant") -> httpx.Response:
    token = login_token(client)
    return client.post("/console/login", data={"csrf": token, "role": role, "secret": secret})


def csrf_of(page: httpx.Response) -> str:
    match = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert match is not None, page.text
    return match.group(1)
