"""The usage result of one request: tokens by bucket, cost; what the ledger record carries.

When the backend reported usage that holds (``usage_bounds``: every figure a count, within what
the request can have used), its figures are the truth: the gateway's split is fitted to its
``prompt_tokens`` (``apportion.fit_split``), its cache read and cache write are parts of that
total, its ``completion_tokens`` is the output and its reasoning tokens a part of that. When it
did not (a stream cut short, a backend that ignores ``include_usage``, a body without usage) or
its usage does not hold (``1e30``, ``null``, ``-1``, ten times the prompt), the gateway's own
counts stand, the output is the delivered text counted with the tokenizer, and the record is
marked ``estimated`` with the reason (``estimate_reason``); nothing is reported as cached,
cache-written or reasoning then. Only that validated figure reaches the bill, the quota settle
and the next turn's history count. A continued stream's usage (``upstream/continuation.py``)
is billed as read, and marked ``estimated`` too when a figure of it is the gateway's (its
``BackendUsage.estimated``: ``continued:prompt_tokens``, ``continued:completion_tokens``).

The buckets, each token in exactly one of each row:

* input by role: ``system + history + new + tools == prompt_total``;
* input by cache: uncached + ``cached`` + ``cache_write`` ``== prompt_total``;
* output: visible + ``reasoning == output``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from gateway.accounting.apportion import fit_split
from gateway.accounting.prices import CostBreakdown, ModelPrice, price_usage
from gateway.accounting.usage import text_from_body, usage_from_body
from gateway.accounting.usage_bounds import NO_USAGE, screen

if TYPE_CHECKING:
    from gateway.accounting.split import PromptCounter, PromptSplit
    from gateway.accounting.sse import Scanner
    from gateway.accounting.usage import BackendUsage, Shape
    from gateway.accounting.usage_bounds import UsageLimits

__all__ = ["TokenUsage", "account", "account_body", "account_stream"]


class TokenUsage(msgspec.Struct, frozen=True, kw_only=True):
    """Tokens and cost of one request; ``system + history + new + tools == prompt_total``."""

    system: int = 0
    history: int = 0
    new: int = 0
    tools: int = 0
    #: prompt tokens the backend served from its cache (a subset of the parts above)
    cached: int = 0
    #: prompt tokens the backend wrote to its cache (a subset of the parts above, disjoint
    #: from ``cached``), e.g. Anthropic's ``cache_creation_input_tokens``
    cache_write: int = 0
    #: completion tokens in all (the backend's ``completion_tokens``), reasoning included
    output: int = 0
    #: of ``output``, the reasoning tokens (``completion_tokens_details.reasoning_tokens``)
    reasoning: int = 0
    prompt_total: int = 0
    #: True when these are the gateway's own counts: the backend reported no usage, or usage
    #: that could not be believed
    estimated: bool = False
    #: why they are (``usage_bounds``: ``no_usage``, ``too_large:prompt_tokens``, ...)
    estimate_reason: str | None = None
    #: image/audio/file parts in the prompt, whose tokens the gateway could only estimate
    non_text_parts: int = 0
    cost: CostBreakdown | None = None


def account(
    split: PromptSplit,
    reported: BackendUsage | None,
    *,
    estimated_output: int = 0,
    price: ModelPrice | None = None,
    batch: bool = False,
    reason: str | None = None,
) -> TokenUsage:
    """Combine the gateway's split with the backend's usage (or the estimate) and price it.

    ``reported`` is usage already screened (``usage_bounds.screen``); one read with a problem
    (``rejected``) counts as none. ``reason``: why there is none (default ``no_usage``).
    """
    if reported is not None and reported.rejected is not None:
        reason = reported.rejected
        reported = None
    # figures billed as read, but some of them the gateway's (a continued stream's splice)
    partly = reported.estimated if reported is not None else None
    if reported is not None:
        parts = fit_split(split, reported.prompt_tokens)
        output, reasoning = reported.completion_tokens, reported.reasoning_tokens
        cached, cache_write = reported.cached_tokens, reported.cache_write_tokens
    else:
        parts, output, reasoning, cached, cache_write = split, estimated_output, 0, 0, 0
    # BackendUsage from usage.py already holds these bounds; one built by hand may not
    cached = min(max(0, cached), parts.total)
    cache_write = min(max(0, cache_write), parts.total - cached)
    reasoning = min(max(0, reasoning), output)
    cost = None
    if price is not None:
        cost = price_usage(
            price,
            system=parts.system,
            history=parts.history,
            new=parts.new,
            tools=parts.tools,
            cached=cached,
            cache_write=cache_write,
            output=output,
            reasoning=reasoning,
            batch=batch,
        )
    return TokenUsage(
        system=parts.system,
        history=parts.history,
        new=parts.new,
        tools=parts.tools,
        cached=cached,
        cache_write=cache_write,
        output=output,
        reasoning=reasoning,
        prompt_total=parts.total,
        estimated=reported is None or partly is not None,
        estimate_reason=partly if reported is not None else reason or NO_USAGE,
        non_text_parts=parts.non_text_parts,
        cost=cost,
    )


def account_stream(
    split: PromptSplit,
    scanner: Scanner,
    counter: PromptCounter,
    *,
    price: ModelPrice | None = None,
    batch: bool = False,
    remember_reply: bool = False,
    limits: UsageLimits | None = None,
) -> TokenUsage:
    """Usage of a finished (or abandoned) stream; counts the delivered text only if needed
    (no usage, or usage that does not hold for the request's ``limits``).

    With ``remember_reply`` (chat), a plain-text reply is counted into the cache for next turn.
    """
    reported, reason = screen(split, scanner.usage, limits)
    estimate = 0 if reported is not None else counter.count_text(scanner.delivered_text())
    reply = scanner.reply_text() if remember_reply else None
    return _finish(split, reported, reason, estimate, reply, counter, price, batch)


def account_body(
    split: PromptSplit,
    body: bytes,
    counter: PromptCounter,
    *,
    price: ModelPrice | None = None,
    batch: bool = False,
    remember_reply: bool = False,
    shape: Shape = "openai",
    limits: UsageLimits | None = None,
) -> TokenUsage:
    """Usage of a non-streamed response body; counts its text only if its usage is absent or
    does not hold for the request's ``limits``.

    With ``remember_reply`` (chat), the reply is counted into the cache for the next turn.
    ``shape``: the API of the body (a Messages or Responses answer passed through unchanged
    has its own usage shape, and its own text).
    """
    reported, reason = screen(split, usage_from_body(body, shape), limits)
    remember = remember_reply and shape == "openai"
    text = text_from_body(body, shape) if reported is None or remember else ""
    estimate = 0 if reported is not None else counter.count_text(text)
    return _finish(split, reported, reason, estimate, text if remember else None, counter,
                   price, batch)


def _finish(
    split: PromptSplit,
    reported: BackendUsage | None,
    reason: str | None,
    estimate: int,
    reply: str | None,
    counter: PromptCounter,
    price: ModelPrice | None,
    batch: bool,
) -> TokenUsage:
    """Remember the reply for the next turn (its reported or estimated tokens), then account."""
    if reply:
        counter.remember_reply(
            reply, reported.completion_tokens if reported is not None else estimate
        )
    return account(split, reported, estimated_output=estimate, price=price, batch=batch,
                   reason=reason)
