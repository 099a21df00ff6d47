"""The ``x-ratelimit-*`` response headers, in OpenAI's names and duration format.

Clients pace themselves from these (the openai SDKs surface them; LangChain and others read
them), so the gateway sends them on every admitted answer and every 429 of a request whose
key has an ``rpm`` or ``tpm`` limit, from the tightest scope (see
:class:`gateway.quota.base.RateLimitState` for what each figure means).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.quota.base import RateLimitState
    from gateway.types import RawHeaders

__all__ = ["format_duration", "ratelimit_headers"]


def format_duration(seconds: float) -> str:
    """OpenAI's shape: ``20ms`` below a second, else whole seconds as ``1s``, ``6m0s``, ``1h0m5s``
    (rounded up, so a client that waits that long finds the slot free)."""
    if seconds <= 0:
        return "0s"
    if seconds < 1:
        return f"{max(1, math.ceil(seconds * 1000))}ms"
    total = math.ceil(seconds)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


def ratelimit_headers(state: RateLimitState) -> RawHeaders:
    """The headers for one decision: the requests trio and/or the tokens trio."""
    headers: RawHeaders = []
    if state.limit_requests is not None:
        headers += (
            (b"x-ratelimit-limit-requests", str(state.limit_requests).encode()),
            (b"x-ratelimit-remaining-requests", str(state.remaining_requests).encode()),
            (b"x-ratelimit-reset-requests", format_duration(state.reset_requests_s).encode()),
        )
    if state.limit_tokens is not None:
        headers += (
            (b"x-ratelimit-limit-tokens", str(state.limit_tokens).encode()),
            (b"x-ratelimit-remaining-tokens", str(state.remaining_tokens).encode()),
            (b"x-ratelimit-reset-tokens", format_duration(state.reset_tokens_s).encode()),
        )
    return headers
