"""``plan_upstream``: a translated stream has the prompt counted only if its events report it.

Counting the prompt may tokenise all of it; Anthropic's ``message_start`` carries the input
tokens before the backend's usage arrives, so a Messages stream needs the count, while a
Responses stream reports usage only in its last event, from the backend's usage chunk.
"""

from __future__ import annotations

import msgspec
import pytest

from gateway.config import Backend, Pool
from gateway.dialects.plan import plan_upstream
from gateway.dialects.registry import FRONTENDS, parse_translated
from gateway.routing.pool import PoolState

BODIES = {
    "messages": {"model": "m", "max_tokens": 16, "stream": True,
                 "messages": [{"role": "user", "content": "hello"}]},
    "responses": {"model": "m", "input": "hello", "stream": True},
}


@pytest.mark.parametrize(("api", "counts"), [("messages", 1), ("responses", 0)])
def test_the_prompt_is_counted_for_the_streams_that_report_it(api: str, counts: int) -> None:
    frontend = FRONTENDS[api]
    parsed, _ = parse_translated(msgspec.json.encode(BODIES[api]), frontend)
    pool = PoolState(Pool(name="p", backends=[Backend(url="http://127.0.0.1:9")]))
    calls: list[int] = []

    def count() -> int:
        calls.append(1)
        return 123

    plan = plan_upstream(frontend, parsed, pool, "m", "req-1", count)
    assert plan.scanner is not None and len(calls) == counts
    first = plan.scanner.feed(b'data: {"id":"c","object":"chat.completion.chunk","created":1,'
                              b'"model":"m","choices":[{"index":0,"delta":{"content":"hi"}}]}'
                              b"\n\n")
    if api == "messages":
        assert b'"input_tokens":123' in first  # message_start reports the count
