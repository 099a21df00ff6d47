"""The admit stage: check and reserve every limit of a request, or refuse it with a 429.

Owns the estimate (counted prompt + the output the request may produce, priced for spend
budgets from the request's own policy snapshot), the decision, the 429 with ``Retry-After``
and the ``x-ratelimit-*`` figures. A small body is counted exactly first (on the loop: at most
``OFFLOAD_BYTES``). A large one is first reserved with a bound that needs no tokenizer (every
token is at least one byte of the body), so a key at its limit is refused before any counting;
only when that bound is refused by a token limit is the prompt counted, off the loop, and the
reservation tried with the exact figure. A large request admitted on the bound holds that
bound until its settle, which charges the real tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway.accounting import PromptSplit, price_usage
from gateway.accounting.meter import count_prompt
from gateway.accounting.offload import OFFLOAD_BYTES, off_loop
from gateway.errors import QuotaStoreUnavailable, RateLimited
from gateway.quota.base import QuotaRequest
from gateway.quota.errors import QuotaUnavailable
from gateway.quota.ratelimit import ratelimit_headers
from gateway.quota.reservation import Admission

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from gateway.accounting import ModelPrice, PromptCounter
    from gateway.context import RequestContext
    from gateway.quota.base import Decision, QuotaStore
    from gateway.quota.limits import Scope
    from gateway.types import RawHeaders

__all__ = ["Admitted", "admit"]

#: limits that count tokens (or cost): refusals a smaller, exact estimate might pass
_TOKEN_LIMITS = frozenset({"tpm", "tokens_per_day", "tokens_per_month"})


@dataclass(slots=True)
class Admitted:
    """An admitted request: its reservation (settle it once), the prompt's split if it was
    counted, and the ``x-ratelimit-*`` headers for its answer."""

    admission: Admission
    split: PromptSplit | None
    headers: RawHeaders


async def admit(
    store: QuotaStore,
    ctx: RequestContext,
    scopes: tuple[Scope, ...],
    *,
    model: str,
    output: int,
    counter: PromptCounter,
    operation: str,
    payload: Mapping[str, Any],
    size: int,
    price: ModelPrice | None,
    on_refused: Callable[[str, str | None], None] | None = None,
) -> Admitted:
    """Reserve, or raise :class:`RateLimited` (429) / :class:`QuotaStoreUnavailable` (503).

    ``output`` is the most the request may produce (its ``max_tokens``, or the model's
    default); ``on_refused(limit, tenant)`` counts a refusal in the metrics.
    """
    admission = Admission(store)
    estimate = _Estimate(store, admission, ctx, scopes, model, output, price)
    split: PromptSplit | None = None
    if size <= OFFLOAD_BYTES:
        split = count_prompt(counter, operation, payload)
        decision = await estimate.reserve(split)
    else:  # the bound's refusal may be undone by the exact count: it alerts nobody
        decision = await estimate.reserve(PromptSplit(new=size), final=False)
        if not decision.admitted and decision.limit in _TOKEN_LIMITS:
            split = await off_loop(lambda: count_prompt(counter, operation, payload))
            decision = await estimate.reserve(split)
    headers = ratelimit_headers(decision.ratelimit) if decision.ratelimit else []
    if not decision.admitted:
        name = str(decision.limit)
        if any(s.unit == "cost" for s in scopes if s.name == decision.scope):
            name = name.replace("tokens_", "cost_")  # spend budgets count cost
        ctx.quota = f"rejected:{name}"
        if on_refused is not None:
            on_refused(name, ctx.tenant)
        wait = max(1, math.ceil(decision.retry_after))
        raise RateLimited(
            f"Rate limit reached: {name} of {decision.scope} for tenant '{ctx.tenant}'. "
            f"Retry after {wait}s.",
            headers={"Retry-After": str(wait), **{k.decode(): v.decode() for k, v in headers}},
        )
    ctx.quota = "admitted"
    return Admitted(admission, split, headers)


@dataclass(slots=True)
class _Estimate:
    """Reserves one request for an estimate of a prompt split plus its output."""

    store: QuotaStore
    admission: Admission
    ctx: RequestContext
    scopes: tuple[Scope, ...]
    model: str
    output: int
    price: ModelPrice | None

    async def reserve(self, split: PromptSplit, *, final: bool = True) -> Decision:
        ctx = self.ctx
        cost = 0
        if self.price is not None and any(s.unit == "cost" for s in self.scopes):
            # spend budgets: the most this can cost (every token at its dearest rate)
            cost = price_usage(
                self.price.ceiling(), system=split.system, history=split.history, new=split.new,
                tools=split.tools, cached=0, output=self.output,
                batch=ctx.request_class == "batch",
            ).total
        request = QuotaRequest(
            request_id=ctx.request_id, tenant=ctx.tenant or "default", scopes=self.scopes,
            estimated_tokens=split.total + self.output, key_id=ctx.key_id, model=self.model,
            estimated_cost=cost, refusal_alerts=final,
        )
        try:
            return await self.admission.reserve(request)
        except QuotaUnavailable as exc:
            ctx.quota = "unavailable"
            raise QuotaStoreUnavailable(
                "quota store unavailable; retry shortly", headers={"Retry-After": "1"}
            ) from exc
