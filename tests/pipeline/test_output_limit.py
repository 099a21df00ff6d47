"""A model's ``max_output_tokens`` (issue 34, point 8), in-process: the pipeline refuses every
API's output limit above it with a 400 naming the field and the bound, in the client's shape,
before admission (no quota reserved or used, no usage record, nothing forwarded), for live
requests and batch lines alike; at the bound the request is served. The policy's checks: the
default bound, and a ``default_max_tokens`` above the bound is refused."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.app.state import Gateway
from gateway.auth.resolver import Identity
from gateway.config import PolicyError, parse_policy
from gateway.config.model import DEFAULT_MAX_OUTPUT_TOKENS, Model
from gateway.dialects.shape import ENDPOINTS
from gateway.pipeline import Inbound
from gateway.sim.server import SimServer
from tests.helpers import TEST_KEY, policy
from tests.pipeline.common import Answer, records, running

BOUND = 64


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    with SimServer("interactive", speedup=50, jitter=0.0) as server:
        yield server


@pytest.fixture()
async def gateway(sim: SimServer, tmp_path: Path) -> AsyncIterator[Gateway]:
    data = policy({"chat": [sim.url]})
    data["models"][0]["max_output_tokens"] = BOUND
    data["models"][0]["default_max_tokens"] = 16
    data["auth"]["keys"][0]["tenant"] = "acme"
    data["plans"] = [{"name": "p", "limits": {"rpm": 1000, "tpm": 100_000}}]
    data["tenants"] = [{"name": "acme", "plan": "p"}]
    data["store"] = {"spool_dir": str(tmp_path / "spool"), "data_dir": str(tmp_path / "data")}
    async with running(data) as gw:
        yield gw




def _inbound(path: str, body: dict[str, Any], **fields: Any) -> Inbound:
    raw = json.dumps(body).encode()

    async def read(limit: int) -> bytes:
        return raw

    headers = [(b"authorization", f"Bearer {TEST_KEY}".encode())]
    return Inbound(method="POST", endpoint=ENDPOINTS[path], headers=headers, read_body=read,
                   **fields)


MESSAGES = [{"role": "user", "content": "hi"}]
#: (path, the body with its output limit set to the value, the field the error names)
CASES = [
    ("/v1/chat/completions",
     lambda v: {"model": "chat-model", "messages": MESSAGES, "max_tokens": v}, "max_tokens"),
    ("/v1/chat/completions",
     lambda v: {"model": "chat-model", "messages": MESSAGES, "max_completion_tokens": v},
     "max_completion_tokens"),
    ("/v1/completions",
     lambda v: {"model": "chat-model", "prompt": "hi", "max_tokens": v}, "max_tokens"),
    ("/v1/responses",
     lambda v: {"model": "chat-model", "input": "hi", "max_output_tokens": v},
     "max_output_tokens"),
    ("/v1/messages",
     lambda v: {"model": "chat-model", "messages": MESSAGES, "max_tokens": v}, "max_tokens"),
]


def _error(path: str, body: bytes, field: str) -> str:
    """The error's message, checked to be in the API's shape and to name ``field``."""
    data = json.loads(body)
    if path == "/v1/messages":  # Anthropic's shape
        assert data["type"] == "error" and set(data) == {"type", "error"}, data
        assert data["error"]["type"] == "invalid_request_error"
        message: str = data["error"]["message"]
    else:
        error = data["error"]
        assert error["type"] == "invalid_request_error" and error["param"] == field, data
        message = error["message"]
    assert field in message
    return message




def _completed(sim: SimServer) -> int:
    return int(httpx.get(sim.url + "/sim/stats", timeout=10).json()["completed"])


@pytest.mark.parametrize(("path", "make", "field"), CASES, ids=[c[2] + c[0] for c in CASES])
async def test_above_the_models_bound_is_refused_before_admission(
        gateway: Gateway, sim: SimServer, path: str, make: Any, field: str) -> None:
    before = _completed(sim)
    for value in (BOUND + 1, 10**18):
        for stream in (False, True):
            answer = Answer()
            await gateway.pipeline.run(_inbound(path, {**make(value), "stream": stream}),
                                       answer)
            assert answer.status == 400, answer.body
            message = _error(path, answer.body, field)
            assert f"at most {BOUND}" in message and "chat-model" in message
    for value in (1e18, "64", True, 0):  # not a positive integer: a 400, never a 500
        answer = Answer()
        await gateway.pipeline.run(_inbound(path, make(value)), answer)
        assert answer.status == 400, answer.body
        _error(path, answer.body, field)
    assert _completed(sim) == before  # nothing forwarded
    assert await records(gateway) == []  # nothing admitted, so nothing recorded
    usage = await gateway.quota.usage("acme", "tenant")
    assert usage.requests == 0 and usage.tokens == 0  # nothing reserved or charged
    # at the bound it is served
    answer = Answer()
    await gateway.pipeline.run(_inbound(path, make(BOUND)), answer)
    assert answer.status == 200, answer.body
    [record] = await records(gateway)
    assert record.output == BOUND


async def test_a_batch_line_above_the_bound_is_refused(gateway: Gateway) -> None:
    identity = Identity(key_id="test", tenant="acme")
    line = await gateway.pipeline.run_line(_inbound(
        "/v1/chat/completions", {"model": "chat-model", "messages": MESSAGES,
                                 "max_tokens": 10**18},
        identity=identity, request_class="batch", request_id="batch-line-1", batch_id="b1"))
    assert line.status == 400
    assert f"at most {BOUND}" in _error("/v1/chat/completions", line.body, "max_tokens")
    assert await records(gateway) == []


def test_the_bound_defaults_and_is_checked_against_default_max_tokens() -> None:
    assert DEFAULT_MAX_OUTPUT_TOKENS == 32768
    assert Model(name="m", pool="p").output_ceiling == DEFAULT_MAX_OUTPUT_TOKENS
    assert Model(name="m", pool="p", max_output_tokens=5,
                 default_max_tokens=5).output_ceiling == 5
    data = policy({"chat": ["http://127.0.0.1:9"]})
    data["models"][0].update(max_output_tokens=100, default_max_tokens=200)
    with pytest.raises(PolicyError, match="default_max_tokens"):
        parse_policy(data)
    data["models"][0].update(max_output_tokens=0, default_max_tokens=1)
    with pytest.raises(PolicyError, match="max_output_tokens"):
        parse_policy(data)
