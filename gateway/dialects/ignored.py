"""What a translation to chat completions leaves out, and the response header that names it.

One rule for the fields of a front-end request (Messages, Responses) the gateway does not need:

* passed through to a backend that speaks the client's API, the request goes unchanged, every
  field and block as the client sent it (the gateway reads what it needs and touches nothing);
* translated to chat completions, a field with no chat equivalent is dropped and named in the
  answer's ``x-gateway-ignored`` header (``x-gateway-ignored: client_metadata,context_management``),
  never refused: a new client field is never a 400;
* unless dropping it would change what is billed or what is safe (Anthropic's
  ``billing_policy`` billing someone else, Responses ``moderation``), or what the model is asked
  (content chat cannot carry: a ``document`` block, an ``input_file`` part, a conversation the
  gateway does not hold): then the translation records a 400 naming it, raised only when the
  request is translated (``dialects.plan``), so a backend that speaks the API still gets it.

A front-end's translation collects both in one :class:`Ignored` (made per request) and hands
them on in its ``Translated``. The work stays bounded whatever the client sends: a dropped
field is named, never walked; at most :data:`MAX_NAMES` names are kept (the header says
``...`` when there were more), each cut to :data:`NAME_CHARS` characters, and a character that
could break the header (a control character, a non-ASCII one, a comma) is shown as ``?``.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

    from gateway.errors import InvalidRequest
    from gateway.types import RawHeaders

__all__ = ["HEADER", "MAX_NAMES", "NAME_CHARS", "Ignored", "ignored_headers"]

#: the response header naming the fields a translation dropped
HEADER = b"x-gateway-ignored"
#: the most names kept for the header
MAX_NAMES = 32
#: the longest name kept (a client's unknown key can be megabytes)
NAME_CHARS = 64
#: what a header value may not hold: controls, non-ASCII, the list separator
_UNSAFE = re.compile(r"[^\x21-\x2b\x2d-\x7e]")


class Ignored:
    """The fields one translation drops, and the first thing it cannot translate.

    Made per request by a front-end's translation; not shared.
    """

    __slots__ = ("more", "names", "refusal")

    def __init__(self) -> None:
        #: the dropped fields' names, in the order met, each once
        self.names: list[str] = []
        #: dropped fields past ``MAX_NAMES``
        self.more = False
        #: the first refusal: a 400 if the request is translated
        self.refusal: InvalidRequest | None = None

    def drop(self, name: str) -> None:
        """Name a field the translation leaves out (at most ``MAX_NAMES``, each once)."""
        names = self.names
        name = _UNSAFE.sub("?", name[:NAME_CHARS])
        if name in names:
            return
        if len(names) >= MAX_NAMES:
            self.more = True
            return
        names.append(name)

    def refuse(self, error: InvalidRequest) -> None:
        """Record why the request cannot be translated (the first reason is kept)."""
        if self.refusal is None:
            self.refusal = error

    def dropped(self) -> tuple[str, ...]:
        """The names for ``Translated.ignored`` (``...`` last when some were left out)."""
        if not self.names:
            return ()
        return (*self.names, "...") if self.more else tuple(self.names)

    def __repr__(self) -> str:
        refused = "" if self.refusal is None else f" | refused: {self.refusal.param}"
        return f"<Ignored [{', '.join(self.names) or 'nothing'}{refused}]>"


def ignored_headers(names: Sequence[str]) -> RawHeaders:
    """The ``x-gateway-ignored`` header for a translated answer (none when nothing was
    dropped)."""
    if not names:
        return []
    return [(HEADER, ",".join(names).encode("ascii", "replace"))]
