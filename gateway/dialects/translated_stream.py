"""A translated stream: the backend's chat SSE read for usage, then turned into the client's API.

The front-end's ``StreamTranslator`` reads the backend's stream through its chat scanner
(``accounting.sse.StreamScanner``), which decodes each event once, as it does for a chat client
(usage, delivered text, ``[DONE]``), and hands the decoded chunks to the translator. This pair
has the scanner's surface (``accounting.sse.Scanner``), so the relay and the meter use it like
any other: the client's bytes come from the translator, the usage and text from its scanner.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from gateway.accounting.usage import BackendUsage
    from gateway.dialects.base import StreamTranslator
    from gateway.errors import GatewayError

__all__ = ["TranslatingScanner"]


class TranslatingScanner:
    """Chat SSE in (scanned for usage), the client API's SSE out."""

    __slots__ = ("_scanner", "_translator", "feed")

    def __init__(self, translator: StreamTranslator) -> None:
        self._scanner = translator.scanner
        self._translator = translator
        #: the translator's own ``feed``: the relay calls it once per read, so no call of ours
        #: sits in between
        self.feed: Callable[[bytes], bytes] = translator.feed

    @property
    def usage(self) -> BackendUsage | None:
        return self._scanner.usage

    @property
    def done(self) -> bool:
        return self._scanner.done

    def flush(self) -> bytes:
        return self._translator.finish()

    def delivered_text(self) -> str:
        return self._scanner.delivered_text()

    def reply_text(self) -> str | None:
        return self._scanner.reply_text()

    def error_event(self, error: GatewayError) -> bytes:
        return self._translator.fail(error)

    @property
    def partial_sent(self) -> bool:
        """Never: the translator sends whole events only (made from whole chat events)."""
        return False

    def drop_partial(self) -> None:
        """Forget the start of a chat event held at a break (the client got nothing of it)."""
        self._scanner.drop_partial()
