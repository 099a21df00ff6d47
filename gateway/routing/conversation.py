"""A conversation's identity, for canary stickiness and backend affinity.

A chat client re-sends the whole conversation every turn, so turn n+1 starts with turn n. The
key must be the same from the first turn on, which rules out "the first k messages" for any
k > 1 (turn 1 has only one user message). In order:

1. the request's ``user`` field (the client says who the conversation belongs to);
2. a session header (``x-session-id``, as agent frameworks and chat front-ends send);
3. the system prompt(s) before the first user message, plus that first user message.

The key is bytes, hashed by the caller (version choice, backend pick); it never leaves the
process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["SESSION_HEADER", "conversation_key"]

#: a client-chosen conversation id; used only to keep a conversation in one place
SESSION_HEADER = b"x-session-id"
_MAX_SESSION = 256

_encode = msgspec.json.encode


def conversation_key(payload: Mapping[str, Any], session: bytes | None = None) -> bytes | None:
    """The conversation's key, or None when the request names none and has no messages."""
    user = payload.get("user")
    if isinstance(user, str) and user:
        return b"u:" + user.encode()
    if session and len(session) <= _MAX_SESSION:
        return b"s:" + session
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages:
        return None
    opening: list[Any] = []
    for message in messages:
        opening.append(message)
        if isinstance(message, dict) and message.get("role") == "user":
            break  # system prompt(s) and the first user message: the same on every turn
    return b"m:" + _encode(opening)
