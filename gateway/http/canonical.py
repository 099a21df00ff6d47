"""One canonical request path, computed once at the edge, that every gate and the router read.

A gate that decides on one spelling of a path while the router serves another is a bypass:
``//admin/keys`` or ``/%2Fadmin/keys`` looked like no admin path to a prefix check, and the
router then normalised them to ``/admin/keys``. So the path is canonicalised here, before any
route, gate or handler sees it, and the result is written back into the ASGI scope (``path``
and ``raw_path``): nothing downstream has a second spelling to look at.

The rules, in order, on the path component of the request target (the query is not part of
it):

- the path is split on ``/``; empty segments are dropped (``//`` collapses, a trailing slash
  goes), the way the router would treat them anyway;
- each segment is percent-decoded once, strictly: a ``%`` not followed by two hex digits, a
  decoded byte string that is not UTF-8, a control character, a ``\\``, a ``;`` (a path
  parameter some servers strip and others keep) or a ``%`` left after decoding (a
  double-encoded path) is refused;
- a decoded ``/`` (``%2F``) separates segments like a literal one, so a model id with a
  slash reads the same either way and ``/%2Fadmin`` is ``/admin``;
- a ``.`` or ``..`` segment (literal or encoded) is refused, not resolved: no route of the
  gateway has one, and resolving them is where servers disagree.

Anything refused is a 400 in the client's error shape (the app answers it), never a guess.
The common case, a plain ASCII path with none of ``%``, ``//``, ``/.``, ``;``, ``\\``, a
control byte or a trailing slash, is returned as it is after one regular-expression scan.
"""

from __future__ import annotations

import re
from urllib.parse import quote

__all__ = ["BadPath", "canonical_path", "encode_path"]

#: a byte that sends a path down the slow path (absent from nearly every real request)
_SUSPECT = re.compile(rb"[%;\\\x00-\x20\x7f-\xff]|//|/\.")
_ESCAPE = re.compile(rb"%(?![0-9A-Fa-f]{2})")
#: characters a decoded segment may not hold
_FORBIDDEN = re.compile(r"[\x00-\x1f\x7f;\\%]")


class BadPath(ValueError):
    """A request path that does not canonicalise cleanly (the reason is the message)."""


def _unquote(segment: bytes) -> bytes:
    """Percent-decode one segment exactly once; a malformed escape is refused."""
    if _ESCAPE.search(segment):
        raise BadPath("the path holds a malformed percent-escape")
    parts = segment.split(b"%")
    out = [parts[0]]
    for part in parts[1:]:
        out.append(bytes((int(part[:2], 16),)))
        out.append(part[2:])
    return b"".join(out)


def canonical_path(raw: bytes) -> str:
    """The canonical form of ``raw`` (the request target's path, query cut off if present).

    Raises :class:`BadPath` for a path that does not canonicalise cleanly.
    """
    raw = raw.partition(b"?")[0]
    if raw[:1] != b"/":
        raise BadPath("the request path must start with '/'")
    if raw == b"/" or (not _SUSPECT.search(raw) and raw[-1:] != b"/"):
        return raw.decode("ascii")
    segments: list[str] = []
    for piece in raw.split(b"/"):
        if not piece:
            continue
        try:
            text = _unquote(piece).decode("utf-8")
        except UnicodeDecodeError:
            raise BadPath("the path is not UTF-8 once percent-decoded") from None
        if _FORBIDDEN.search(text):
            raise BadPath("the path holds a control character, '\\', ';' or a "
                          "double-encoded '%'")
        for segment in text.split("/"):
            if segment in (".", ".."):
                raise BadPath("the path holds a '.' or '..' segment")
            if segment:
                segments.append(segment)
    return "/" + "/".join(segments)


def encode_path(path: str) -> bytes:
    """``raw_path`` for a canonical path: percent-encoded where it must be, so a handler that
    decodes ``raw_path`` reads the canonical path back."""
    return quote(path, safe="/:@!$&'()*+,=-._~").encode("ascii")
