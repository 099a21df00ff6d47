"""The meter stage: a request's tokens by kind and their cost, in one call.

Before forwarding, :func:`count_prompt` splits the prompt (system, history, new, tools) for
the admission estimate; after the response, :func:`meter` combines that split (or counts it
now, if admission did not need it) with what the backend reported or, failing that, with the
delivered text, and prices the result. Large work - a large prompt not counted yet, a large
body, a stream whose backend reported no usage - runs on the counting thread
(:mod:`gateway.accounting.offload`), so the event loop never stalls on it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gateway.accounting.offload import OFFLOAD_BYTES, off_loop
from gateway.accounting.record import account_body, account_stream

if TYPE_CHECKING:
    from collections.abc import Mapping

    from gateway.accounting.prices import ModelPrice
    from gateway.accounting.record import TokenUsage
    from gateway.accounting.split import PromptCounter, PromptSplit
    from gateway.accounting.sse import StreamScanner

__all__ = ["count_prompt", "meter"]


def count_prompt(counter: PromptCounter, operation: str, payload: Mapping[str, Any]
                 ) -> PromptSplit:
    """The prompt's split for one operation (``chat``, ``embeddings``, ``text_completion``)."""
    if operation == "chat":
        return counter.count_chat(payload)
    if operation == "embeddings":
        return counter.count_embedding(payload)
    return counter.count_completion(payload)


async def meter(
    counter: PromptCounter,
    operation: str,
    payload: Mapping[str, Any],
    size: int,
    split: PromptSplit | None,
    *,
    body: bytes | None,
    scanner: StreamScanner | None,
    price: ModelPrice | None,
    batch: bool,
) -> TokenUsage:
    """Tokens by kind and their cost, after the response (off the latency path).

    ``size`` is the request body's length; ``split`` the prompt's count if admission made
    one; ``body`` the whole answer (non-streamed) or ``scanner`` the stream's scanner.
    """
    remember = operation == "chat"

    def count() -> TokenUsage:
        prompt = split or count_prompt(counter, operation, payload)
        if scanner is not None:
            return account_stream(prompt, scanner, counter, price=price, batch=batch,
                                  remember_reply=remember)
        return account_body(prompt, body or b"", counter, price=price, batch=batch,
                            remember_reply=remember)

    large = ((split is None and size > OFFLOAD_BYTES)
             or (scanner is not None and scanner.usage is None)
             or len(body or b"") > OFFLOAD_BYTES)
    return await off_loop(count) if large else count()
