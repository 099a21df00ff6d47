"""The pipeline in-process: the app's real state (memory quota store, embedded ledger, the
built-in upstream client) and a real simulated engine on a socket; each test calls
``Pipeline.run`` or ``Pipeline.run_line`` directly and checks one stage's effect."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.app.state import Gateway
from gateway.auth.resolver import Identity
from gateway.config import parse_policy
from gateway.dialects.shape import ENDPOINTS
from gateway.pipeline import Inbound
from gateway.sim.server import SimServer
from tests.helpers import TEST_KEY, policy
from tests.pipeline.common import Answer, records, running

CHAT = ENDPOINTS["/v1/chat/completions"]


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    with SimServer("interactive", speedup=50, jitter=0.0) as server:
        yield server


@pytest.fixture()
async def gateway(sim: SimServer, tmp_path: Path) -> AsyncIterator[Gateway]:
    data = policy({"chat": [sim.url]})
    data["auth"]["keys"][0]["tenant"] = "acme"
    data["plans"] = [{"name": "p", "limits": {"rpm": 3, "tpm": 100_000}}]
    data["tenants"] = [{"name": "acme", "plan": "p"}]
    data["prices"] = {"models": {"chat-model": {"input": "1", "output": "2"}}}
    data["store"] = {"spool_dir": str(tmp_path / "spool"), "data_dir": str(tmp_path / "data")}
    async with running(data) as gw:
        yield gw


def _inbound(body: dict[str, Any], **fields: Any) -> Inbound:
    raw = json.dumps(body).encode()

    async def read(limit: int) -> bytes:
        return raw

    headers = [(b"authorization", f"Bearer {TEST_KEY}".encode()), *fields.pop("headers", [])]
    return Inbound(method="POST", endpoint=CHAT, headers=headers, read_body=read, **fields)






def _chat(content: str = "hi", **extra: Any) -> dict[str, Any]:
    return {"model": "chat-model", "max_tokens": 4,
            "messages": [{"role": "user", "content": content}], **extra}


async def test_a_request_goes_through_every_stage(gateway: Gateway) -> None:
    """authenticate, classify, admit, route, forward, relay, meter, record, settle."""
    answer = Answer()
    await gateway.pipeline.run(_inbound(_chat()), answer)
    assert answer.status == 200
    reply = json.loads(answer.body)
    assert reply["model"] == "chat-model"  # the public name, not the backend's
    assert answer.headers[b"x-gateway-class"] == b"interactive"
    assert answer.headers[b"x-ratelimit-remaining-requests"] == b"2"
    request_id = answer.headers[b"x-request-id"].decode()
    [record] = await records(gateway)
    assert record.request_id == request_id and record.tenant == "acme"
    assert record.prompt_total == reply["usage"]["prompt_tokens"]
    assert record.output == reply["usage"]["completion_tokens"] == 4
    assert record.cost_micros > 0
    if gateway.settles:  # the settle runs in the background once the answer is complete
        await asyncio.wait(set(gateway.settles))
    usage = await gateway.quota.usage("acme", "tenant")
    assert usage.requests == 1 and usage.tokens == record.prompt_total + record.output


def _completed(sim: SimServer) -> int:
    return int(httpx.get(sim.url + "/sim/stats", timeout=10).json()["completed"])


async def test_a_refused_request_never_reaches_a_backend_or_the_ledger(
        gateway: Gateway, sim: SimServer) -> None:
    for _ in range(3):
        answer = Answer()
        await gateway.pipeline.run(_inbound(_chat()), answer)
        assert answer.status == 200
    before = _completed(sim)
    refused = Answer()
    await gateway.pipeline.run(_inbound(_chat()), refused)
    assert refused.status == 429
    error = json.loads(refused.body)["error"]
    assert error["code"] == "rate_limit_exceeded" and "rpm" in error["message"]
    assert refused.headers[b"retry-after"]
    assert _completed(sim) == before
    assert len(await records(gateway)) == 3


async def test_a_stream_is_relayed_and_metered(gateway: Gateway) -> None:
    answer = Answer()
    await gateway.pipeline.run(_inbound(_chat(stream=True, max_tokens=8)), answer)
    assert answer.status == 200
    events = [json.loads(line[6:]) for line in answer.body.decode().splitlines()
              if line.startswith("data: {")]
    assert events and {e["model"] for e in events} == {"chat-model"}
    assert not any(e.get("usage") for e in events)  # asked by the gateway, stripped for us
    [record] = await records(gateway)
    assert record.output == 8 and not record.estimated


async def test_a_batch_line_runs_as_its_key_with_its_own_id(gateway: Gateway) -> None:
    identity = Identity("test", "acme")
    result = await gateway.pipeline.run_line(_inbound(
        _chat(), headers=[], identity=identity, request_class="batch",
        request_id="batch_x-line-7", batch_id="batch_x"))
    assert result.status == 200
    [record] = await records(gateway)
    assert (record.request_id, record.batch_id, record.request_class) == (
        "batch_x-line-7", "batch_x", "batch")


async def test_a_client_id_is_correlation_only(gateway: Gateway) -> None:
    answers = []
    for _ in range(2):
        answer = Answer()
        await gateway.pipeline.run(
            _inbound(_chat(), headers=[(b"x-request-id", b"mine")]), answer)
        answers.append(answer)
    ids = {a.headers[b"x-request-id"] for a in answers}
    assert len(ids) == 2 and b"mine" not in ids
    assert {a.headers[b"x-client-request-id"] for a in answers} == {b"mine"}
    assert len(await records(gateway)) == 2


async def test_bad_input_is_answered_in_shape_and_not_recorded(gateway: Gateway) -> None:
    for body, status in ((_chat(model="nope"), 404), ({"model": "chat-model"}, 400)):
        answer = Answer()
        await gateway.pipeline.run(_inbound(body), answer)
        assert answer.status == status
        assert set(json.loads(answer.body)["error"]) == {"message", "type", "param", "code"}
    unauthenticated = Answer()
    inbound = _inbound(_chat())
    await gateway.pipeline.run(Inbound(method="POST", endpoint=CHAT, headers=[],
                                       read_body=inbound.read_body), unauthenticated)
    assert unauthenticated.status == 401
    assert await records(gateway) == []


async def test_the_record_names_the_tenants_team_and_organization(
        sim: SimServer, tmp_path: Path) -> None:
    """A tenant placed in a team of an organization: its usage record carries both."""
    data = policy({"chat": [sim.url]})
    data["auth"]["keys"][0]["tenant"] = "acme"
    data["plans"] = [{"name": "p", "limits": {"rpm": 100}}]
    data["organizations"] = [{"name": "bigco", "limits": {"tokens_per_day": 1_000_000}}]
    data["teams"] = [{"name": "search", "organization": "bigco"}]
    data["tenants"] = [{"name": "acme", "plan": "p", "team": "search"}]
    data["store"] = {"spool_dir": str(tmp_path / "spool"), "data_dir": str(tmp_path / "data")}
    gw = Gateway(parse_policy(data))
    await gw.start()
    try:
        answer = Answer()
        await gw.pipeline.run(_inbound(_chat()), answer)
        assert answer.status == 200
        [record] = await records(gw)
        assert (record.tenant, record.team, record.organization) == ("acme", "search", "bigco")
    finally:
        await gw.close()
