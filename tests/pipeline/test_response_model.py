"""The engine's own model name is kept for the trace (issue 36, point 3): the client gets the
public name, the request's context (and so its span's ``gen_ai.response.model``) the name the
engine answered with; the usage record keeps the name the gateway sent."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator, Iterator, MutableMapping
from pathlib import Path
from typing import Any

import pytest

from gateway.app.state import Gateway
from gateway.context import RequestContext
from gateway.dialects.shape import ENDPOINTS
from gateway.pipeline import Inbound
from gateway.telemetry import RequestSpan
from tests.fake_engine import Engine, FakeEngines
from tests.helpers import TEST_KEY, policy
from tests.pipeline.common import running

ENGINE = Engine("/models/tiny.gguf")


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeEngines]:
    with FakeEngines({"llama": ENGINE}) as server:
        yield server


@pytest.fixture()
async def gateway(fake: FakeEngines, tmp_path: Path) -> AsyncIterator[Gateway]:
    data = policy({"chat": [fake.url("llama")]})
    data["store"] = {"spool_dir": str(tmp_path / "spool"), "data_dir": str(tmp_path / "data")}
    async with running(data) as gw:
        yield gw


@pytest.mark.parametrize("stream", [False, True])
async def test_the_engines_name_is_on_the_context(gateway: Gateway, stream: bool) -> None:
    seen: list[RequestContext] = []
    services = gateway.pipeline.services

    def finished(ctx: RequestContext, span: RequestSpan) -> None:
        seen.append(ctx)
        services.finished(ctx, span)

    gateway.pipeline.services = dataclasses.replace(services, finished=finished)
    raw = json.dumps({"model": "chat-model", "stream": stream,
                      "messages": [{"role": "user", "content": "hi"}]}).encode()

    async def read(limit: int) -> bytes:
        return raw

    body = b""

    async def send(message: MutableMapping[str, Any]) -> None:
        nonlocal body
        body += message.get("body", b"")

    await gateway.pipeline.run(Inbound(
        method="POST", endpoint=ENDPOINTS["/v1/chat/completions"], read_body=read,
        headers=[(b"authorization", f"Bearer {TEST_KEY}".encode())]), send)
    assert b"tiny.gguf" not in body and b'"model":"chat-model"' in body
    (ctx,) = seen
    assert ctx.response_model == "/models/tiny.gguf"
    assert (ctx.request_model, ctx.upstream_model) == ("chat-model", "sim-model")
