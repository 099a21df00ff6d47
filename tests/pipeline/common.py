"""What the in-process pipeline tests share: a gateway started from a policy (``running``),
the ``send`` that collects an answer, and the usage records a gateway has written."""

from __future__ import annotations

import contextlib
import json
import time
from typing import TYPE_CHECKING, Any

from gateway.app.state import Gateway
from gateway.config import parse_policy

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from gateway.ledger import UsageRecord

__all__ = ["Answer", "records", "running"]


@contextlib.asynccontextmanager
async def running(data: dict[str, Any]) -> AsyncIterator[Gateway]:
    """A gateway of the policy ``data``, started, and closed at the end."""
    gw = Gateway(parse_policy(data))
    await gw.start()
    try:
        yield gw
    finally:
        await gw.close()


class Answer:
    """What the pipeline sent: the status, the headers, the body."""

    def __init__(self) -> None:
        self.status = 0
        self.headers: dict[bytes, bytes] = {}
        self.body = b""

    async def __call__(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            self.headers = dict(message["headers"])
        else:
            self.body += message.get("body", b"")

    def json(self) -> Any:
        return json.loads(self.body)

    def events(self) -> list[Any]:
        """The JSON of each ``data:`` event of a streamed answer (``[DONE]`` left out)."""
        return [json.loads(line[6:]) for line in self.body.decode().splitlines()
                if line.startswith("data: ") and line != "data: [DONE]"]


async def records(gw: Gateway) -> list[UsageRecord]:
    """Every usage record of the last hour, the ledger flushed first."""
    await gw.ledger.flush()
    now = time.time_ns() // 1_000_000
    return [r async for r in gw.ledger.export(now - 3_600_000, now + 60_000)]
