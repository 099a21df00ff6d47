"""Key naming shared by every Redis store: the hash-tag rule that makes Redis Cluster work.

A key ``<prefix>{<name>}:...`` is placed by the hash of ``<name>`` alone, so every key of one
tenant (or one batch) lives in one Cluster slot and a Lua script may touch them all. A name
must not contain a brace (Redis would take the tag to end there), and an empty tag is ignored
by Redis (the whole key is hashed): :func:`hash_tag` refuses both, and :func:`escape_tag` makes
any name safe where a store would rather keep every name than refuse one.

The stores' own layouts stay beside them, built on these: ``gw:q:`` (``quota/keys.py``),
``gw:k:`` (``auth/keystore.py``), ``gwbatch:``/``gwfile:`` (``batch/redis.py``).
"""

from __future__ import annotations

__all__ = ["InvalidTag", "escape_tag", "hash_tag"]


class InvalidTag(ValueError):
    """A name that cannot be used in a hash tag (empty, or with a brace)."""


def hash_tag(prefix: str, name: str) -> str:
    """``<prefix>{<name>}``: the start of every key that must share ``name``'s slot."""
    if not name or "{" in name or "}" in name:
        raise InvalidTag(f"{name!r} cannot be used in a Redis hash tag")
    return f"{prefix}{{{name}}}"


def escape_tag(name: str) -> str:
    """``name`` with ``%``, ``{`` and ``}`` percent-escaped: always a valid, unambiguous tag.
    The empty name (no policy allows one) becomes ``%``, which no escaped name equals."""
    return name.replace("%", "%25").replace("{", "%7B").replace("}", "%7D") or "%"
