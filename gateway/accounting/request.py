"""Prepare the upstream request so that the backend always reports usage.

A streamed response carries usage only when ``stream_options.include_usage`` is set; without it the
gateway would have to estimate every streamed request. So the gateway always sets it, and
remembers whether the client asked itself: if not, the SSE scanner strips the usage event before
the client sees it. Non-streamed responses always carry usage; ``stream_options`` is left alone
there, since OpenAI rejects it on a non-streamed request.
"""

from __future__ import annotations

from typing import Any

__all__ = ["request_usage"]


def request_usage(payload: dict[str, Any], stream: bool) -> bool:
    """Make a streamed request ask for usage (edits ``payload``); True if the client wants usage.

    Returns True for non-streamed requests (usage is in the body; nothing to strip) and for
    streamed ones whose client set ``include_usage`` itself; False means strip the usage event.
    """
    if not stream:
        return True
    options = payload.get("stream_options")
    if isinstance(options, dict):
        if options.get("include_usage"):
            return True
        payload["stream_options"] = {**options, "include_usage": True}
    else:
        payload["stream_options"] = {"include_usage": True}
    return False
