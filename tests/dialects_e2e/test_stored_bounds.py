"""Stored responses per tenant, through a real gateway with the official openai client (issue
34, point 5), on the embedded SQLite ledger and on PostgreSQL:

* a tenant at its ``stored_responses`` bound (rows, or bytes) is answered 400
  ``stored_responses_limit_exceeded`` naming the bound, its usage and the limit, before any work
  (the backend sees nothing); ``store: false`` still runs, another tenant is unaffected, and a
  deleted response frees its room;
* a 30-turn ``previous_response_id`` chain stores each turn's new items once: its stored bytes
  grow linearly (the whole conversation saved again each turn made them quadratic), and the
  backend receives at each turn exactly the conversation full-history storage gave: the
  previous turn's conversation, its answer, then the new input.

The backend is the echo backend, so the test sees every body that crossed the hop.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import openai
import pytest

from tests.echo_backend import EchoBackend
from tests.helpers import TEST_KEY, GatewayProcess, policy
from tests.ledger.postgres import PostgresServer

pytestmark = pytest.mark.process

GLOBEX_KEY = "sk-gw-globex-bounds-0123456789abcdef0123456789ab"
INITECH_KEY = "sk-gw-initech-bounds-0123456789abcdef0123456789a"
CHAIN_KEY = "sk-gw-chain-bounds-0123456789abcdef0123456789abc"
LEDGER_ENV = "GATEWAY_TEST_STORED_BOUNDS_LEDGER_URL"


@dataclass
class Setup:
    gw: GatewayProcess
    echo: EchoBackend
    #: the stored rows of a tenant: (created_ms, bytes of request + messages + answer)
    rows: Any


def _key(name: str, key: str, tenant: str) -> dict[str, str]:
    return {"id": name, "tenant": tenant, "sha256": hashlib.sha256(key.encode()).hexdigest()}


def _policy(url: str) -> dict[str, Any]:
    data = policy({"chat": [url]})
    data["auth"]["keys"][0]["tenant"] = "acme"
    data["auth"]["keys"] += [_key("globex", GLOBEX_KEY, "globex"),
                             _key("initech", INITECH_KEY, "initech"),
                             _key("chain", CHAIN_KEY, "chain")]
    data["plans"] = [
        {"name": "small", "stored_responses": {"max_rows": 3, "max_bytes": None}},
        {"name": "standard"},  # the defaults: 1,000,000 responses, 1 GiB
    ]
    data["tenants"] = [
        {"name": "acme", "plan": "small"},
        {"name": "globex", "plan": "small", "stored_responses": {"max_rows": 100}},
        {"name": "initech", "plan": "standard",
         "stored_responses": {"max_rows": None, "max_bytes": 20_000}},
        {"name": "chain", "plan": "standard"},
    ]
    return data


_ROWS = ("SELECT created_ms, length(CAST(request AS BLOB)) + length(CAST(messages AS BLOB)) "
         "+ length(CAST(answer AS BLOB)) FROM stored_responses WHERE tenant = ? "
         "ORDER BY created_ms")


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def setup(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[Setup]:
    tmp = tmp_path_factory.mktemp("bounds")
    data: dict[str, Any]
    with EchoBackend() as echo:
        data = _policy(echo.url)
        data["store"] = {"data_dir": str(tmp / "data"), "spool_dir": str(tmp / "spool"),
                         "ledger_url_env": LEDGER_ENV}
        if request.param == "sqlite":
            path = tmp / "data" / "ledger.db"

            def rows(tenant: str) -> list[tuple[int, int]]:
                with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
                    return [(int(a), int(b)) for a, b in conn.execute(_ROWS, (tenant,))]

            with GatewayProcess(tmp, data) as gw:
                yield Setup(gw, echo, rows)
            return
        server: PostgresServer = request.getfixturevalue("postgres_server")
        name = f"bounds_{uuid.uuid4().hex[:12]}"
        os.environ[LEDGER_ENV] = server.create_database(name)
        data["store"]["ledger_migrate"] = True
        sql = _ROWS.replace("length(CAST(", "octet_length((").replace(" AS BLOB)", ")")

        def pg_rows(tenant: str) -> list[tuple[int, int]]:
            out = server.psql(sql.replace("?", f"'{tenant}'"), database=name)
            return [(int(a), int(b)) for a, b in (line.split("|") for line in out.split())]

        try:
            with GatewayProcess(tmp, data) as gw:
                yield Setup(gw, echo, pg_rows)
        finally:
            os.environ.pop(LEDGER_ENV, None)
            server.drop_database(name)


def client(setup: Setup, key: str = TEST_KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=setup.gw.url + "/v1", api_key=key, max_retries=0,
                         timeout=30)


def test_a_tenant_at_its_row_bound_is_refused_before_any_work(setup: Setup) -> None:
    acme, globex = client(setup), client(setup, GLOBEX_KEY)
    made = [acme.responses.create(model="chat-model", input=f"Turn {i}", max_output_tokens=4)
            for i in range(3)]
    seen = len(setup.echo.requests)
    with pytest.raises(openai.BadRequestError) as err:
        acme.responses.create(model="chat-model", input="One too many", max_output_tokens=4)
    assert err.value.status_code == 400
    assert err.value.code == "stored_responses_limit_exceeded"  # type: ignore[attr-defined]
    assert err.value.param == "store"  # type: ignore[attr-defined]
    message = err.value.message
    assert "it stores 3 responses, at its limit of 3 (max_rows)" in message, message
    assert "DELETE /v1/responses/{id}" in message and "store: false" in message
    # a continued turn would be stored too: refused the same way
    with pytest.raises(openai.BadRequestError) as err:
        acme.responses.create(model="chat-model", input="More", max_output_tokens=4,
                              previous_response_id=made[-1].id)
    assert err.value.code == "stored_responses_limit_exceeded"  # type: ignore[attr-defined]
    assert len(setup.echo.requests) == seen  # refused before admission: nothing forwarded
    # store: false still runs, and is not kept
    loose = acme.responses.create(model="chat-model", input="Not kept", store=False,
                                  max_output_tokens=4)
    assert loose.output_text == "echo"
    # another tenant on the same plan, with its own bound, is unaffected
    for i in range(5):
        globex.responses.create(model="chat-model", input=f"Globex {i}", max_output_tokens=4)
    assert len(setup.rows("globex")) == 5
    # deleting one frees its room, once
    acme.responses.delete(made[0].id)
    again = acme.responses.create(model="chat-model", input="Room again", max_output_tokens=4)
    assert acme.responses.retrieve(again.id).id == again.id
    with pytest.raises(openai.BadRequestError):
        acme.responses.create(model="chat-model", input="Full again", max_output_tokens=4)
    assert len(setup.rows("acme")) == 3


def test_a_tenant_at_its_byte_bound_is_refused(setup: Setup) -> None:
    initech = client(setup, INITECH_KEY)
    text = "All work and no play makes Jack a dull boy. " * 70  # ~3 kB of input
    stored, body = 0, 0
    with pytest.raises(openai.BadRequestError) as err:
        for _ in range(10):
            raw = initech.responses.with_raw_response.create(model="chat-model", input=text,
                                                             max_output_tokens=4)
            body = len(raw.http_request.content)
            stored += 1
    assert stored >= 1
    assert err.value.code == "stored_responses_limit_exceeded"  # type: ignore[attr-defined]
    message = err.value.message
    assert "limit of 20,000 bytes (max_bytes)" in message, message
    # checked with twice the body (its row keeps the request and its messages): the last
    # turn stored had room for that, the refused one had not
    sizes = [size for _, size in setup.rows("initech")]
    assert len(sizes) == stored
    assert sum(sizes[:-1]) + 2 * body <= 20_000 < sum(sizes) + 2 * body
    assert f"it stores {sum(sizes):,} bytes" in message and f"about {2 * body:,} more" in message
    # a small request still fits when its body does
    other = client(setup)
    assert other.responses.create(model="chat-model", input="x", store=False,
                                  max_output_tokens=2).output_text == "echo"


def test_a_chain_stores_each_turn_once_and_sends_the_whole_conversation(setup: Setup) -> None:
    c = client(setup, CHAIN_KEY)
    turns = 30
    previous: str | None = None
    sent_sizes: list[int] = []
    conversation: list[dict[str, Any]] = []  # what full-history storage re-sent
    for t in range(turns):
        text = f"Turn {t}: " + " ".join(f"word{t}x{i}" for i in range(120))  # ~1.3 kB
        args: dict[str, Any] = {"model": "chat-model", "max_output_tokens": 8}
        if t % 3 == 0:  # input items, a developer message among them
            args["input"] = [{"role": "developer", "content": f"Rule {t}: be brief."},
                             {"role": "user", "content": [{"type": "input_text",
                                                           "text": text}]}]
            own = 2
        else:
            args["input"] = text
            own = 1
        if t % 4 == 1:
            args["instructions"] = f"You are assistant number {t}."  # this turn's only
        if previous is not None:
            args["previous_response_id"] = previous
        raw = c.responses.with_raw_response.create(**args)
        response = raw.parse()
        assert response.previous_response_id == previous
        sent_sizes.append(len(raw.http_request.content) + len(raw.http_response.content))
        got = setup.echo.requests[-1]["body"]
        assert isinstance(got, dict)
        messages = list(got["messages"])
        if "instructions" in args:
            assert messages[0] == {"role": "system", "content": args["instructions"]}
            del messages[0]
        # the backend got the earlier conversation exactly as full-history storage gave it
        assert messages[:-own] == conversation, f"turn {t}"
        assert json.dumps(messages[-1]).count(f"word{t}x119") == 1
        conversation = [*messages, {"role": "assistant", "content": "echo"}]
        previous = response.id
    rows = setup.rows("chain")
    assert len(rows) == turns
    sizes = [size for _, size in rows]
    # linear: every turn's row holds that turn, not the conversation so far
    assert sum(sizes) < 3 * sum(sent_sizes), (sum(sizes), sum(sent_sizes))
    assert sum(sizes[-5:]) < 1.5 * sum(sizes[:5]), sizes
    # and the last turn continues like any other, from any point of the chain
    follow = c.responses.create(model="chat-model", input="And now?", max_output_tokens=4,
                                previous_response_id=previous)
    assert follow.output_text == "echo"
    body = setup.echo.requests[-1]["body"]
    assert isinstance(body, dict) and body["messages"][:-1] == conversation
