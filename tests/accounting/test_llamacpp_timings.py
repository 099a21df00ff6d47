"""llama.cpp's cached prompt tokens (issue 36, point 2c): builds before its usage detail
report them only as ``timings.cache_n`` beside the usage, on a whole answer and on a stream's
last chunk; read as an alias of ``prompt_tokens_details.cached_tokens`` (never summed)."""

from __future__ import annotations

import json

from gateway.accounting.sse import StreamScanner
from gateway.accounting.usage import usage_from_body


def test_llamacpp_cached_tokens_from_timings() -> None:
    """Builds before the usage detail report the cache read as ``timings.cache_n`` only."""
    usage = {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}
    body = json.dumps({"usage": usage, "timings": {"cache_n": 7, "prompt_n": 3}}).encode()
    read = usage_from_body(body)
    assert read is not None and (read.prompt_tokens, read.cached_tokens) == (10, 7)
    newer = {**usage, "prompt_tokens_details": {"cached_tokens": 7}}
    read = usage_from_body(json.dumps({"usage": newer, "timings": {"cache_n": 7}}).encode())
    assert read is not None and read.cached_tokens == 7  # aliases of one count, never summed
    odds: list[object] = [{"cache_n": -1}, {"cache_n": "7"}, [], None]
    for odd in odds:
        read = usage_from_body(json.dumps({"usage": usage, "timings": odd}).encode())
        assert read is not None and read.rejected is None and read.cached_tokens == 0
    scanner = StreamScanner(strip_usage=False)
    scanner.feed(b'data: {"choices":[],"usage":' + json.dumps(usage).encode()
                 + b',"timings":{"cache_n":4}}\n\ndata: [DONE]\n\n')
    scanner.flush()
    assert scanner.usage is not None and scanner.usage.cached_tokens == 4
