"""Every id a client sees is the gateway's own and unguessable (issue 34, point 5).

Two simulators behind one pool, both counting their ids from 1 (as after an engine restart):
the backends hand out the same ``resp_`` / ``chatcmpl-`` / ``msg_`` ids to different requests.
Through the gateway each answer carries ``<prefix><x-request-id>`` (128 random bits) instead,
whole and streamed, passed through or translated; a stored response is found under that id by
its own tenant only, and two conversations never replace each other.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from gateway.sim.server import SimServer
from tests.helpers import TEST_KEY, GatewayProcess, policy

pytestmark = pytest.mark.process

OTHER_KEY = "sk-gw-other-ids-0123456789abcdef0123456789abcdef"
_HEX = re.compile(r"^[0-9a-f]{32}$")


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    tmp = tmp_path_factory.mktemp("ids")
    with SimServer("interactive", speedup=20, jitter=0.0) as one, \
            SimServer("interactive", speedup=20, jitter=0.0) as two:
        data = policy({"chat": [one.url, two.url]})
        data["pools"][0]["strategy"] = "round_robin"
        for backend in data["pools"][0]["backends"]:
            backend["api"] = ["responses", "messages"]
        data["auth"]["keys"][0]["tenant"] = "acme"
        data["auth"]["keys"].append({"id": "other", "tenant": "globex",
                                     "sha256": hashlib.sha256(OTHER_KEY.encode()).hexdigest()})
        with GatewayProcess(tmp, data) as gateway:
            yield gateway


def _suffix(value: str, prefix: str) -> str:
    assert value.startswith(prefix), value
    rest = value[len(prefix):]
    assert _HEX.match(rest), value
    return rest


def test_chat_ids_are_the_gateways_whole_and_streamed(gw: GatewayProcess) -> None:
    seen = set()
    with httpx.Client(base_url=gw.url, headers={"Authorization": f"Bearer {TEST_KEY}"},
                      timeout=30) as client:
        for _ in range(4):
            r = client.post("/v1/chat/completions", json={
                "model": "chat-model", "max_tokens": 4,
                "messages": [{"role": "user", "content": "hi"}]})
            assert r.status_code == 200
            assert _suffix(r.json()["id"], "chatcmpl-") == r.headers["x-request-id"]
            seen.add(r.json()["id"])
            with client.stream("POST", "/v1/chat/completions", json={
                    "model": "chat-model", "max_tokens": 6, "stream": True,
                    "messages": [{"role": "user", "content": "hi"}]}) as s:
                ids = {line.split('"id":"', 1)[1].split('"', 1)[0]
                       for line in s.iter_lines() if line.startswith("data: {")}
                assert ids == {"chatcmpl-" + s.headers["x-request-id"]}
                seen |= ids
            c = client.post("/v1/completions", json={"model": "chat-model", "prompt": "hi",
                                                     "max_tokens": 2})
            assert _suffix(c.json()["id"], "cmpl-") == c.headers["x-request-id"]
    assert len(seen) == 8  # the backends' repeated ids never show


def test_stored_responses_are_keyed_by_the_gateways_id(gw: GatewayProcess) -> None:
    acme = openai.OpenAI(base_url=gw.url + "/v1", api_key=TEST_KEY, max_retries=0)
    globex = openai.OpenAI(base_url=gw.url + "/v1", api_key=OTHER_KEY, max_retries=0)
    made: list[tuple[openai.OpenAI, Any, str]] = []
    for i in range(4):  # both backends answer resp_..1, resp_..2: same ids, other requests
        for who, c in (("acme", acme), ("globex", globex)):
            text = f"I am {who} number {i}."
            if i % 2:
                events = c.responses.create(model="chat-model", input=text,
                                            max_output_tokens=4, stream=True)
                response = next(e.response for e in events
                                if e.type in ("response.completed", "response.incomplete"))
            else:
                response = c.responses.create(model="chat-model", input=text,
                                              max_output_tokens=4)
            _suffix(response.id, "resp_")
            made.append((c, response, text))
    assert len({r.id for _, r, _ in made}) == len(made)
    for c, response, text in made:
        items = c.responses.input_items.list(response.id)
        assert text in str(items.data[0].model_dump())  # its own conversation, no other
        other = globex if c is acme else acme
        with pytest.raises(openai.NotFoundError):
            other.responses.retrieve(response.id)


def test_messages_ids_are_the_gateways(gw: GatewayProcess) -> None:
    client = anthropic.Anthropic(base_url=gw.url, api_key=TEST_KEY, max_retries=0)
    body: dict[str, Any] = {"model": "chat-model", "max_tokens": 4,
                            "messages": [{"role": "user", "content": "hi"}]}
    ids = {client.messages.create(**body).id for _ in range(3)}
    with client.messages.stream(**body) as stream:
        ids.add(stream.get_final_message().id)
    assert len(ids) == 4 and all(_suffix(i, "msg_") for i in ids)


def test_request_ids_are_random(gw: GatewayProcess, tmp_path: Path) -> None:
    """No two ids share a prefix or follow each other: 128 random bits, not a counter."""
    with httpx.Client(base_url=gw.url, headers={"Authorization": f"Bearer {TEST_KEY}"},
                      timeout=30) as client:
        ids = [client.get("/v1/models").headers["x-request-id"] for _ in range(20)]
    assert all(_HEX.match(i) for i in ids)
    assert len({i[:8] for i in ids}) == len(ids)
    ints = sorted(int(i, 16) for i in ids)
    assert min(b - a for a, b in itertools.pairwise(ints)) > 2**64
