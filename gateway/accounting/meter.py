"""The meter stage: a request's tokens by kind and their cost, in one call.

Before forwarding, :func:`count_prompt` splits the prompt (system, history, new, tools) for
the admission estimate; after the response, :func:`meter` combines that split (or counts it
now, if admission did not need it) with what the backend reported or, failing that, with the
delivered text, and prices the result; the backend's figures count only if they hold for the
request (``usage_bounds``: the prompt's own count, its max output tokens, the model's context
length, in ``limits``), else the gateway's estimate is billed. Large work - a large prompt not
counted yet, a large body, a stream whose backend reported no usage or usage not believed - runs
on the counting thread (:mod:`gateway.accounting.offload`), so the event loop never stalls on it.

A request that failed before any output (no backend answered, the backend answered an error, a
stream broke before its first token) goes through :func:`meter_failed`: it keeps its token
counts - what was sent is worth recording - but costs nothing unless the policy says
``prices.bill_failed: true``; a customer is not charged for an answer they never got.

A stream continued on another backend (``pools[].continuation``) is priced as its client
received it, plus the continuations' prompt (:func:`add_continuation`): the ``continuation`` cost
line, always there (the operator's cost), in the total (what the tenant is billed and its
budgets settle with) only with ``continuation.billed``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from gateway.accounting.offload import OFFLOAD_BYTES, off_loop
from gateway.accounting.prices import CostBreakdown, price_continuation
from gateway.accounting.split import PromptSplit
from gateway.accounting.tokens import account, account_body, account_stream
from gateway.accounting.usage_bounds import screen

if TYPE_CHECKING:
    from collections.abc import Mapping

    from gateway.accounting.prices import ModelPrice
    from gateway.accounting.split import PromptCounter
    from gateway.accounting.sse import Scanner
    from gateway.accounting.tokens import TokenUsage
    from gateway.accounting.usage import Shape
    from gateway.accounting.usage_bounds import UsageLimits

__all__ = ["RequestMeter", "add_continuation", "count_prompt", "meter", "meter_failed"]


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
    scanner: Scanner | None,
    price: ModelPrice | None,
    batch: bool,
    shape: Shape = "openai",
    limits: UsageLimits | None = None,
) -> TokenUsage:
    """Tokens by kind and their cost, after the response (off the latency path).

    ``size`` is the request body's length; ``split`` the prompt's count if admission made
    one; ``body`` the whole answer (non-streamed, in the usage ``shape`` of its API) or
    ``scanner`` the stream's scanner; ``limits`` what the request allows its usage to be.
    """
    remember = operation == "chat"

    def count() -> TokenUsage:
        prompt = split or count_prompt(counter, operation, payload)
        if scanner is not None:
            return account_stream(prompt, scanner, counter, price=price, batch=batch,
                                  remember_reply=remember, limits=limits)
        return account_body(prompt, body or b"", counter, price=price, batch=batch,
                            remember_reply=remember, shape=shape, limits=limits)

    large = ((split is None and size > OFFLOAD_BYTES)
             or _counts_text(scanner, split, limits)
             or len(body or b"") > OFFLOAD_BYTES)
    return await off_loop(count) if large else count()


def _counts_text(scanner: Scanner | None, split: PromptSplit | None,
                 limits: UsageLimits | None) -> bool:
    """Whether a stream's delivered text will be tokenised: its usage is absent or will not
    hold (a hostile backend's long answer is counted off the loop like any other)."""
    if scanner is None:
        return False
    usage = scanner.usage
    if usage is None or usage.rejected is not None:
        return True
    return split is not None and screen(split, usage, limits)[0] is None


async def meter_failed(
    counter: PromptCounter,
    operation: str,
    payload: Mapping[str, Any],
    size: int,
    split: PromptSplit | None,
    usage: TokenUsage | None,
    *,
    price: ModelPrice | None,
    batch: bool,
    bill_failed: bool,
) -> TokenUsage:
    """The usage of a request that failed before any output; the caller decides it failed so.

    ``usage`` is what :func:`meter` measured if it ran (the backend's error answer), else None
    (no answer at all): then the prompt is counted now (``split`` if admission made one) and
    the usage is marked ``estimated``. The token counts are kept either way; with
    ``bill_failed`` false (the default policy) every cost line and the total are 0, with it
    true the request costs what its tokens cost.
    """
    if usage is None:
        usage = await meter(counter, operation, payload, size, split, body=None, scanner=None,
                            price=price, batch=batch)
    if bill_failed or usage.cost is None:
        return usage
    return msgspec.structs.replace(usage, cost=CostBreakdown())


def add_continuation(usage: TokenUsage, tokens: int, price: ModelPrice | None, *,
                     batch: bool, billed: bool) -> TokenUsage:
    """``usage`` with its stream's continuations priced: their ``tokens`` (the prompt plus the
    text already sent, each time) at the uncached input price as the ``continuation`` line,
    added to the total only when ``billed``. Unchanged without such tokens or a price."""
    cost = usage.cost
    if tokens <= 0 or cost is None or price is None:
        return usage
    line = price_continuation(price, tokens, batch=batch)
    total = cost.total + line if billed else cost.total
    return msgspec.structs.replace(
        usage, cost=msgspec.structs.replace(cost, continuation=line, total=total))


class RequestMeter:
    """One request's meter: built before admission with what its usage is measured by, told
    the prompt's split when admission counts it (``split``) and what the answer is read from
    (``read``), then asked for the usage (``measure``; ``failed`` for a request that failed
    before any output; ``interrupted`` for a stream's provisional record).

    The pipeline's one object for stages 3 to 7: admission, routing (``route_tokens``) and a
    translated stream (``prompt_tokens``) read the prompt's size from it, and the relay's
    closing step meters through it without the pipeline passing the same ten values again.
    A stream continued on another backend is measured with its continuations' prompt tokens
    (``continuation``), charged to the tenant when ``bill_continuation`` says so (the stream's
    ``continuation.billed``, set when its continuation is set up).
    """

    __slots__ = ("batch", "bill_continuation", "bill_failed", "body", "counter", "limits",
                 "operation", "payload", "price", "scanner", "shape", "size", "split")

    def __init__(self, counter: PromptCounter, operation: str, payload: Mapping[str, Any],
                 size: int, *, price: ModelPrice | None, batch: bool,
                 limits: UsageLimits | None, bill_failed: bool) -> None:
        self.counter, self.operation, self.payload, self.size = counter, operation, payload, size
        self.price, self.batch, self.limits = price, batch, limits
        self.bill_failed = bill_failed
        #: a continued stream's continuation prompts are charged to the tenant
        self.bill_continuation = False
        #: the prompt's split, when admission counted it
        self.split: PromptSplit | None = None
        #: a whole answer as the backend sent it (in its usage ``shape``), or a stream's scanner
        self.body: bytes | None = None
        self.scanner: Scanner | None = None
        self.shape: Shape = "openai"

    def read(self, body: bytes | None, scanner: Scanner | None, shape: Shape) -> None:
        """What the answer's usage is read from: the backend's whole body, or the stream's
        scanner (which sees every chunk the relay passes)."""
        self.body, self.scanner, self.shape = body, scanner, shape

    def prompt_tokens(self) -> int:
        """The prompt's tokens as admission counted them (or counted now, without limits)."""
        return (self.split or count_prompt(self.counter, self.operation, self.payload)).total

    def route_tokens(self) -> int:
        """The prompt's tokens for routing (prefill prediction, the tenant's fair share):
        admission's count when it counted, else the body's bytes / 4 (about a token per four
        bytes of text; routing predicts and shares, it does not bill, so the prompt is not
        tokenised for this alone)."""
        split = self.split
        return split.total if split is not None else self.size // 4

    async def measure(self, continuation: int = 0) -> TokenUsage:
        """The request's usage from what ``read`` named (``meter``), with the prompt tokens
        of its stream's ``continuation`` priced (``add_continuation``)."""
        usage = await meter(self.counter, self.operation, self.payload, self.size, self.split,
                            body=self.body, scanner=self.scanner, price=self.price,
                            batch=self.batch, shape=self.shape, limits=self.limits)
        return add_continuation(usage, continuation, self.price, batch=self.batch,
                                billed=self.bill_continuation)

    async def failed(self, usage: TokenUsage | None) -> TokenUsage:
        """The usage of a request that failed before any output (``meter_failed``)."""
        return await meter_failed(self.counter, self.operation, self.payload, self.size,
                                  self.split, usage, price=self.price, batch=self.batch,
                                  bill_failed=self.bill_failed)

    def interrupted(self, chunks: int, continuation: int = 0) -> TokenUsage:
        """What a stream cut off after ``chunks`` chunks would bill (its provisional record,
        should the process die): the prompt and one token a chunk, and its continuations'
        prompt so far."""
        usage = account(self.split or PromptSplit(), None, estimated_output=chunks,
                        price=self.price, batch=self.batch, reason="interrupted")
        return add_continuation(usage, continuation, self.price, batch=self.batch,
                                billed=self.bill_continuation)
