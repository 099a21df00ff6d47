"""The input split: how many prompt tokens are system, history, new input and tool definitions.

Parts of a chat request (``count_chat``):

* ``system``: every system and developer message, wherever it stands;
* ``history``: every other message up to and including the last assistant message: the earlier
  turns a chat client re-sends on every call;
* ``new``: every other message after the last assistant message (all of them when there is no
  assistant message), plus the reply priming;
* ``tools``: the tool or function definitions (see ``tools.py``).

Each message's framing (3 tokens, 1 more with a name) goes with the message; the reply priming
(3) goes with ``new``. So for plain messages ``system + history + new`` equals
``count_chat_prompt(messages)``, and for a conversation re-sent unchanged with one more
assistant reply and user turn::

    history[n+1] == history[n] + (new[n] - REPLY_PRIMING) + message_tokens(reply[n])

Message counts come from a bounded cache keyed by message hash, so at turn 50 only the new turn
is tokenised; the re-sent history costs a hash and a dict lookup per message. Completions
(``prompt``) and embeddings (``input``) have no history: their whole input is ``new``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from gateway.accounting.cache import CountCache
from gateway.accounting.messages import count_message, message_key
from gateway.accounting.tools import FUNC_INIT, count_tools
from gateway.tokenizers import REPLY_PRIMING, TOKENS_PER_MESSAGE, get_encoding

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from gateway.accounting.messages import MessageCount

__all__ = ["SYSTEM_ROLES", "PromptCounter", "PromptSplit"]

#: Roles whose messages are counted as ``system``.
SYSTEM_ROLES = frozenset({"system", "developer"})

_encode_json = msgspec.json.Encoder(order="deterministic").encode


class PromptSplit(msgspec.Struct, frozen=True, kw_only=True):
    """Prompt tokens by part, as counted by the gateway (or fitted to the backend's total)."""

    system: int = 0
    history: int = 0
    new: int = 0
    tools: int = 0
    #: image/audio/file parts: their tokens are a fixed estimate (images) or 0 (others)
    non_text_parts: int = 0

    @property
    def total(self) -> int:
        return self.system + self.history + self.new + self.tools


class PromptCounter:
    """Counts requests in one encoding; one per process and encoding (it owns the count cache).

    Not thread-safe: use it from one event loop.
    """

    __slots__ = ("_assistant_role_tokens", "_cache", "_encode", "_func_init", "encoding")

    def __init__(self, encoding: str = "o200k_base", *, cache_size: int = 100_000) -> None:
        self.encoding = encoding
        self._encode = get_encoding(encoding).encode_ordinary
        self._func_init = FUNC_INIT.get(encoding, FUNC_INIT["o200k_base"])
        self._cache: CountCache[MessageCount] = CountCache(cache_size)
        self._assistant_role_tokens = len(self._encode("assistant"))

    @property
    def cache(self) -> CountCache[MessageCount]:
        return self._cache

    def count_text(self, text: str) -> int:
        """Tokens of plain text (used for delivered output when the backend reports no usage)."""
        return len(self._encode(text))

    def remember_reply(self, text: str, tokens: int | None = None) -> int:
        """Count a reply once it has been delivered, so the next turn finds it in the cache.

        The client re-sends it as ``{"role": "assistant", "content": text}``; counting it now,
        after the response went out, keeps that work off the next request. When the backend
        reported the reply's ``tokens`` (its completion tokens), they are used as they are and
        nothing is tokenised. Returns the message's tokens including its framing.
        """
        message = {"role": "assistant", "content": text}
        if tokens is not None:
            counted = (TOKENS_PER_MESSAGE + self._assistant_role_tokens + tokens, 0)
        else:
            counted = count_message(message, self._encode)
        self._cache.put(message_key(message), counted)
        return counted[0]

    def count_chat(self, payload: Mapping[str, Any]) -> PromptSplit:
        """Split a ``/v1/chat/completions`` request body into system, history, new and tools."""
        messages = payload.get("messages")
        if not isinstance(messages, list):
            messages = []
        last = _last_assistant(messages)
        system, history, non_text = self._sum(messages[: last + 1], 0)
        system, new, non_text = self._sum(messages[last + 1 :], system, non_text)
        return PromptSplit(
            system=system,
            history=history,
            new=new + REPLY_PRIMING,
            tools=self._tools(payload),
            non_text_parts=non_text,
        )

    def count_completion(self, payload: Mapping[str, Any]) -> PromptSplit:
        """A ``/v1/completions`` request: its ``prompt`` is all new."""
        return PromptSplit(new=self.count_input(payload.get("prompt")))

    def count_embedding(self, payload: Mapping[str, Any]) -> PromptSplit:
        """A ``/v1/embeddings`` request: its ``input`` is all new."""
        return PromptSplit(new=self.count_input(payload.get("input")))

    def count_input(self, value: Any) -> int:
        """Tokens of a prompt/input: text, token ids, or a list of either."""
        if isinstance(value, str):
            return len(self._encode(value))
        if not isinstance(value, list):
            return 0
        if all(type(v) is int for v in value):
            return len(value)  # already token ids
        return sum(self.count_input(v) for v in value)

    def _sum(self, messages: Sequence[Any], system: int, non_text: int = 0) -> tuple[int, int, int]:
        """(system so far, tokens of the non-system messages, non-text parts so far).

        The hot loop of a long conversation: a cached message costs a hash and a dict lookup, so
        the plain-message key (``message_key``'s first case) is computed inline.
        """
        cache = self._cache
        get = cache.get
        other = 0
        for message in messages:
            if type(message) is not dict:
                continue
            role = message.get("role")
            content = message.get("content")
            if len(message) == 2 and type(content) is str:
                key = hash((role, content))
            else:
                key = message_key(message)
            counted = get(key)
            if counted is None:
                counted = count_message(message, self._encode)
                cache.put(key, counted)
            if role in SYSTEM_ROLES:
                system += counted[0]
            else:
                other += counted[0]
            non_text += counted[1]
        return system, other, non_text

    def _tools(self, payload: Mapping[str, Any]) -> int:
        definitions = payload.get("tools") or payload.get("functions")
        if not isinstance(definitions, list) or not definitions:
            return 0
        key = hash(_encode_json(definitions))
        counted = self._cache.get(key)
        if counted is None:
            counted = (count_tools(definitions, self._encode, self._func_init), 0)
            self._cache.put(key, counted)
        return counted[0]

    def __repr__(self) -> str:
        return f"<PromptCounter {self.encoding} {self._cache!r}>"


def _last_assistant(messages: Sequence[Any]) -> int:
    """Index of the last assistant message, or -1."""
    for i in range(len(messages) - 1, -1, -1):
        message = messages[i]
        if isinstance(message, dict) and message.get("role") == "assistant":
            return i
    return -1
