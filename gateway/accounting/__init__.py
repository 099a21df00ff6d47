"""Token accounting: the input split (system/history/new/tools), usage from responses, prices.

A pure library: no HTTP, no Redis. Per request the proxy calls, in order:

1. before forwarding: ``split = counter.count_chat(payload)`` (or ``count_completion`` /
   ``count_embedding``) and ``wants = request_usage(payload, stream)``;
2. streamed: ``scanner = StreamScanner(strip_usage=not wants)``, forward ``scanner.feed(chunk)``
   for every chunk and ``scanner.flush()`` at the end (also when the stream fails or the client
   leaves), then ``account_stream(split, scanner, counter, price=..., remember_reply=is_chat)``;
   not streamed: ``account_body(split, body, counter, price=..., remember_reply=is_chat)``.
   ``remember_reply`` counts the delivered reply into the cache after the response went out,
   so the next turn of the conversation tokenises only its new user message.

The result, a :class:`TokenUsage`, is what the ledger records. A request that failed before
any output goes through ``meter.meter_failed`` instead: its tokens, at no cost unless
``prices.bill_failed``. Usage of other API shapes (Anthropic Messages, OpenAI Responses) reads
with ``usage_from_body(body, shape)`` / ``usage_from_mapping(usage, shape)``.
"""

from __future__ import annotations

from gateway.accounting.apportion import apportion, fit_split
from gateway.accounting.cache import CountCache
from gateway.accounting.prices import (
    CostBreakdown,
    ModelPrice,
    PriceTable,
    format_micros,
    price_usage,
    to_micros,
)
from gateway.accounting.request import request_usage
from gateway.accounting.split import PromptCounter, PromptSplit
from gateway.accounting.sse import Scanner, StreamScanner
from gateway.accounting.tokens import TokenUsage, account, account_body, account_stream
from gateway.accounting.usage import (
    AnthropicUsage,
    BackendUsage,
    ResponsesUsage,
    text_from_body,
    usage_from_body,
    usage_from_mapping,
)

__all__ = [
    "AnthropicUsage",
    "BackendUsage",
    "CostBreakdown",
    "CountCache",
    "ModelPrice",
    "PriceTable",
    "PromptCounter",
    "PromptSplit",
    "ResponsesUsage",
    "Scanner",
    "StreamScanner",
    "TokenUsage",
    "account",
    "account_body",
    "account_stream",
    "apportion",
    "fit_split",
    "format_micros",
    "price_usage",
    "request_usage",
    "text_from_body",
    "to_micros",
    "usage_from_body",
    "usage_from_mapping",
]
