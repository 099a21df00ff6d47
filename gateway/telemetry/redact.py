"""Redaction of secrets and prompt text from log events, as a structlog processor.

Three cases, applied to every log event (structlog's own and stdlib records routed through it):

* fields whose *name* says they hold prompt or completion text (``prompt``, ``messages``,
  ``content``, ``completion``, ``body``, ...) are replaced whole;
* fields whose name says they hold a credential (``authorization``, ``api_key``, ``secret``,
  ``password``, ``token``, ...) are replaced whole, also inside nested ``headers`` dicts;
* every other string, nested ones included, is scanned for API-key shapes (``sk-...``,
  ``Bearer ...``, ``Authorization: ...`` / ``api-key=...``) and for the configured secret
  strings, and each match is replaced in place.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterable

    from structlog.typing import EventDict, WrappedLogger

__all__ = ["REDACTED", "Redactor"]

REDACTED = "[REDACTED]"

#: field names whose value is prompt/completion text (compared lower-case, '-' read as '_')
TEXT_FIELDS = frozenset({
    "prompt", "prompts", "messages", "message_content", "content", "completion", "completions",
    "input", "inputs", "body", "payload", "request_body", "response_body", "text", "choices",
})
#: field names whose value is a credential
SECRET_FIELDS = frozenset({
    "authorization", "proxy_authorization", "api_key", "apikey", "x_api_key", "key", "secret",
    "password", "token", "access_token", "bearer", "cookie", "set_cookie",
})

_PATTERNS = (
    # OpenAI-style keys: sk-..., sk-proj-..., sk-ant-...
    r"\bsk-[A-Za-z0-9_\-]{8,}",
    # an Authorization / api-key header or parameter, with or without a scheme
    r"(?i:(?<![A-Za-z0-9])(?:proxy-)?(?:authorization|x-api-key|api[-_]?key)"
    r"(?:[\"']?\s*[:=]\s*[\"']?|\s+)(?:(?:bearer|basic)\s+)?[^\s\"',;}]+)",
    # a bearer token on its own
    r"(?i:\bbearer\s+[A-Za-z0-9._~+/=\-]{8,})",
)
_MAX_DEPTH = 4


class Redactor:
    """A structlog processor: ``Redactor(secrets)(logger, method, event_dict)``."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        extra = sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True)
        patterns = [*_PATTERNS, *(re.escape(s) for s in extra)]
        self._pattern = re.compile("|".join(f"(?:{p})" for p in patterns))

    def __call__(self, logger: WrappedLogger, method: str, event: EventDict) -> EventDict:
        for key, value in event.items():
            if not key.startswith("_"):  # structlog's private keys (_record, _from_structlog)
                event[key] = self._value(key, value, 0)
        return event

    def text(self, value: str) -> str:
        """``value`` with every key shape and configured secret replaced."""
        return self._pattern.sub(REDACTED, value)

    def _value(self, key: str, value: Any, depth: int) -> Any:
        name = key.lower().replace("-", "_")
        if name in TEXT_FIELDS or name in SECRET_FIELDS:
            return REDACTED if value not in (None, "") else value
        return self._scrub(value, depth)

    def _scrub(self, value: Any, depth: int) -> Any:
        if isinstance(value, str):
            return self._pattern.sub(REDACTED, value)
        if depth >= _MAX_DEPTH:
            return value if isinstance(value, int | float | bool) or value is None else REDACTED
        if isinstance(value, dict):
            return {k: self._value(str(k), v, depth + 1) for k, v in value.items()}
        if isinstance(value, list | tuple):
            if value and all(isinstance(p, tuple) and len(p) == 2 for p in value):
                return [self._pair(p, depth) for p in value]  # a raw header list
            return [self._scrub(v, depth + 1) for v in value]
        if isinstance(value, bytes):
            return self._pattern.sub(REDACTED, value.decode("utf-8", "replace"))
        return value

    def _pair(self, pair: tuple[Any, Any], depth: int) -> tuple[Any, Any]:
        name, value = pair
        text_name = name.decode("latin-1") if isinstance(name, bytes) else str(name)
        return text_name, self._value(text_name, value, depth + 1)
