"""Static API keys from the policy, looked up by their sha256.

Only hashes are held, so a policy file or a memory dump does not reveal keys. The lookup hashes
whatever the client sent and probes a dict with the digest: the time taken does not depend on how
much of a real key the guess shares, and every failure (missing, malformed, unknown) gets one
answer that does not say which it was.
"""

from __future__ import annotations

import hashlib
import secrets

__all__ = ["KEY_PREFIX", "StaticKeys", "bearer_token", "new_api_key"]

KEY_PREFIX = "sk-gw-"


def new_api_key() -> str:
    """A new key: recognisable prefix (secret scanners find it) and 32 random bytes."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def bearer_token(header: bytes | None) -> str | None:
    """The token of an ``Authorization: Bearer`` header, or None."""
    if not header:
        return None
    scheme, _, token = header.partition(b" ")
    if scheme.lower() != b"bearer":
        return None
    token = token.strip()
    if not token or len(token) > 512:
        return None
    try:
        return token.decode("ascii")
    except UnicodeDecodeError:
        return None


class StaticKeys:
    """Key hash -> key id."""

    __slots__ = ("_by_hash", "required")

    def __init__(self, by_hash: dict[str, str], *, required: bool = True) -> None:
        self._by_hash = dict(by_hash)
        self.required = required

    def identify(self, token: str | None) -> str | None:
        """The key id for a presented token; None when it is not a valid key."""
        if token is None:
            return None
        return self._by_hash.get(hashlib.sha256(token.encode()).hexdigest())

    def __repr__(self) -> str:
        return f"<StaticKeys [keys: {len(self._by_hash)} | required: {self.required}]>"
