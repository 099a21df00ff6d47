"""The prompt-cache fields of the body sent to an engine: the tenant's, never the client's.

A pool's ``cache_isolation`` (default: the policy's ``isolation.cache``) says what its engines
are told:

- ``salt``: ``"cache_salt": "<the tenant's salt>"`` (vLLM and SGLang; the simulator honours it
  as vLLM does), so a prompt hits only cache blocks written under the same salt;
- ``no_cache``: ``"cache_prompt": false`` (llama.cpp, which takes no salt: nothing is reused,
  so nothing is learnt; the cost is every prefill);
- ``shared``: nothing (one cache for the pool's tenants).

In every mode the client's own top-level ``cache_salt`` and ``cache_prompt`` are dropped: a
client choosing its salt could pick another tenant's scope, and one turning caching back on
would undo ``no_cache``.

The common case costs no parse: the client sent neither field (checked with one byte search:
inside a JSON string a quote is escaped, so ``"cache_salt"`` with both quotes bare can only be
a member name or a whole string value), and the gateway's member is spliced in before the
object's closing brace. Decoders differ on duplicate members (first or last wins), which is
why a client's own member is removed, never merely outvoted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

if TYPE_CHECKING:
    from gateway.config.model import CacheIsolation

__all__ = ["CLIENT_FIELDS", "isolate_body"]

#: the request members that steer an engine's prompt cache, dropped from what a client sent
CLIENT_FIELDS = ("cache_salt", "cache_prompt")
_PATTERNS = tuple(b'"' + f.encode() + b'"' for f in CLIENT_FIELDS)
_decode = msgspec.json.Decoder(dict[str, Any]).decode
_encode = msgspec.json.Encoder().encode


def isolate_body(body: bytes, mode: CacheIsolation, salt: str) -> bytes:
    """``body`` (a JSON object) with the client's cache fields gone and the pool's set."""
    if any(p in body for p in _PATTERNS):
        payload = _decode(body)
        if any(f in payload for f in CLIENT_FIELDS):
            for field in CLIENT_FIELDS:
                payload.pop(field, None)
            body = _encode(payload)
    if mode == "shared":
        return body
    member = (b'"cache_salt":' + _encode(salt) if mode == "salt"
              else b'"cache_prompt":false')
    end = body.rstrip()
    if not end.endswith(b"}"):  # not an object: the engine answers it as it would
        return body
    inner = end[:-1].rstrip()
    return inner + (member if inner.endswith(b"{") else b"," + member) + b"}"
