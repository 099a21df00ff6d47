"""Which class a request belongs to: a pure function of the request and the policy.

In order: the ``X-Request-Class`` header (only if the key may set it), the key's default, the
tenant's default, the first matching route rule, the configured default. A header that names no
declared class is an error (:class:`UnknownClass`), whether or not the key may set the class:
silently ignoring a typo would send a client's bulk work to the interactive pool.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gateway.config import RouteRule, Routing

__all__ = ["UnknownClass", "resolve_class"]


class UnknownClass(ValueError):
    """The ``X-Request-Class`` header names a class the policy does not declare."""

    def __init__(self, name: str, known: Any) -> None:
        shown = name if len(name) <= 64 else name[:64] + "..."
        super().__init__(
            f"unknown request class '{shown}' in X-Request-Class; the classes are: "
            + ", ".join(sorted(known))
        )


def _matches(rule: RouteRule, model: str, endpoint: str, payload: dict[str, Any],
             stream: bool) -> bool:
    if rule.models is not None and model not in rule.models:
        return False
    if rule.endpoints is not None and endpoint not in rule.endpoints:
        return False
    if rule.stream is not None and rule.stream != stream:
        return False
    if rule.min_max_tokens is not None:
        limit = payload.get("max_completion_tokens") or payload.get("max_tokens")
        if not isinstance(limit, int) or limit < rule.min_max_tokens:
            return False
    if rule.user is not None:
        user = payload.get("user")
        if not isinstance(user, str) or not fnmatchcase(user, rule.user):
            return False
    return True


def resolve_class(
    routing: Routing,
    known: Any,
    header: str | None,
    allow_header: bool,
    key_default: str | None,
    tenant_default: str | None,
    model: str,
    endpoint: str,
    payload: dict[str, Any],
    stream: bool,
) -> str:
    """The request's class name. ``known`` is the set (or mapping) of declared class names."""
    if header:
        if header not in known:
            raise UnknownClass(header, known)
        if routing.class_header or allow_header:
            return header
    if key_default:
        return key_default
    if tenant_default:
        return tenant_default
    for rule in routing.rules:
        if _matches(rule, model, endpoint, payload, stream):
            return rule.request_class
    return routing.default_class
