"""Reading a simulator's SSE answer in tests: raw events with their ``event:`` names."""

from __future__ import annotations

import json
from typing import Any

import httpx

__all__ = ["post_stream"]


def post_stream(
    url: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[httpx.Response, list[tuple[str | None, Any]]]:
    """POST ``body`` and read the whole SSE answer: ``(event name or None, data)`` per event
    (``data`` JSON-decoded, or the raw string such as ``[DONE]``)."""
    events: list[tuple[str | None, Any]] = []
    with httpx.stream("POST", url, json=body, headers=headers, timeout=30) as r:
        text = "".join(r.iter_text())
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        name = None
        data: list[str] = []
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                data.append(line.removeprefix("data: "))
        raw = "\n".join(data)
        try:
            events.append((name, json.loads(raw)))
        except json.JSONDecodeError:
            events.append((name, raw))
    return r, events
