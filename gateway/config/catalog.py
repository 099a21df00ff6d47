"""The policy's public models: what clients may ask for and where each name is served.

``models:`` and ``prices:`` in a policy: each :class:`Model` with its output bounds, its pools
per class, its weighted :class:`Version` rollouts (the :class:`Progressive` canary and its
gates), its :class:`Shadow` mirror, and the :class:`Prices` its tokens are billed at.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from gateway.config.base import (
    Amount,
    Duration,
    Name,
    PolicyStruct,
    PositiveInt,
)
from gateway.config.pools import Continuation

__all__ = [
    "DEFAULT_MAX_OUTPUT_TOKENS",
    "MAX_OUTPUT_TOKENS_LIMIT",
    "AgreementGate",
    "ErrorRateGate",
    "Fraction",
    "LatencyGate",
    "Model",
    "Price",
    "PriceOverride",
    "Prices",
    "Progressive",
    "RolloutGates",
    "Shadow",
    "TokensGate",
    "Version",
]


Fraction = Annotated[float, msgspec.Meta(ge=0, le=1)]


class ErrorRateGate(PolicyStruct, frozen=True):
    """The canary's error rate (5xx answers, stream breaks, failed first attempts) may exceed
    the baseline's by at most ``max_increase`` (absolute, 0.01 = one point)."""

    max_increase: Fraction = 0.01


class LatencyGate(PolicyStruct, frozen=True):
    """The canary's p90 may be at most ``max_ratio`` x the baseline's."""

    max_ratio: Annotated[float, msgspec.Meta(ge=1)] = 1.25


class TokensGate(PolicyStruct, frozen=True):
    """Mean output tokens per request may differ from the baseline's by at most
    ``max_change`` (relative: 0.5 = half as many or 1.5x as many)."""

    max_change: Annotated[float, msgspec.Meta(gt=0)] = 0.5


class AgreementGate(PolicyStruct, frozen=True):
    """The shadow-comparison agreement rate of the canary must be at least ``min``."""

    min: Fraction = 0.9


class RolloutGates(PolicyStruct, frozen=True):
    """What a canary must hold to advance; a gate set to null is off."""

    error_rate: ErrorRateGate | None = msgspec.field(default_factory=ErrorRateGate)
    ttft_p90: LatencyGate | None = msgspec.field(default_factory=LatencyGate)
    tpot_p90: LatencyGate | None = msgspec.field(default_factory=LatencyGate)
    output_tokens: TokensGate | None = None
    shadow_agreement: AgreementGate | None = None


class Progressive(PolicyStruct, frozen=True):
    """Drive a canary version by itself: its share of traffic walks through ``steps``
    (percent), each held for ``hold`` with at least ``min_requests`` on the canary, while
    every gate holds against the baseline versions; one failing gate rolls it back to 0%.

    A first step of 0 is a shadow stage: the canary takes no live traffic while the model's
    ``shadow:`` mirrors requests to it (``shadow.version`` naming the canary); after ``hold``
    with ``min_requests`` compared answers, it becomes a live canary (the next step) when the
    shadow's agreement and its TTFT against the primary's pass their gates."""

    steps: Annotated[list[Annotated[float, msgspec.Meta(ge=0, le=100)]],
                     msgspec.Meta(min_length=1)] = msgspec.field(
        default_factory=lambda: [1.0, 5.0, 25.0, 50.0, 100.0])
    hold: Duration = "5m"
    min_requests: PositiveInt = 200
    #: confidence of each gate's test: a gate fails only when the data say, at this level,
    #: that the canary is worse than the bound
    confidence: Annotated[float, msgspec.Meta(ge=0.5, lt=1)] = 0.95
    gates: RolloutGates = msgspec.field(default_factory=RolloutGates)
    #: environment variables holding a webhook URL and its HMAC secret: one signed POST per
    #: transition (unset: none)
    webhook_url_env: str | None = None
    webhook_secret_env: str | None = None


class Version(PolicyStruct, frozen=True):
    """One backend version of a public model, for weighted rollouts (e.g. 95/5 canaries)."""

    backend_model: str
    weight: Annotated[float, msgspec.Meta(ge=0)]
    #: serve this version from another pool (its own backends); default: the model's pool
    pool: Name | None = None
    name: str | None = None
    #: a canary driven by the gateway (``weight`` is then ignored: the rollout sets its share)
    progressive: Progressive | None = None

    @property
    def label(self) -> str:
        return self.name or self.backend_model


class Shadow(PolicyStruct, frozen=True):
    """Mirror a share of requests to a shadow pool; its answers never reach the client and are
    never billed, and each chat or completions answer is compared with the primary's."""

    pool: Name
    share: Annotated[float, msgspec.Meta(ge=0, le=1)]
    backend_model: str | None = None
    #: shadow requests in flight at most; beyond, mirroring is skipped (never queued)
    max_in_flight: PositiveInt = 64
    #: the label of the version this shadow tries, in reports and metrics (default: its
    #: backend model, else its pool)
    version: str | None = None
    #: two answers agree when equal after whitespace normalisation, or when their ROUGE-1 F
    #: (word overlap) is at least this
    agree_similarity: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.9
    #: compare the shadow's chat and completions answers with the primary's (false: mirror
    #: and count only)
    compare: bool = True

    @property
    def label(self) -> str:
        return self.version or self.backend_model or self.pool


class Price(PolicyStruct, frozen=True):
    """A model's prices per million tokens (decimal strings keep them exact).

    Each token is priced once, in its bucket: input uncached, cache read, cache write; output
    visible, reasoning.
    """

    input: Amount
    output: Amount
    #: prompt tokens the backend served from its cache; default: the input price
    cached_input: Amount | None = None
    #: prompt tokens the backend wrote to its cache (e.g. Anthropic's cache creation, usually
    #: dearer than input); default: the input price
    cache_write_input: Amount | None = None
    #: reasoning tokens (a part of the completion); default: the output price
    reasoning: Amount | None = None
    #: multiplier for batch-class requests, e.g. "0.5" for a 50% batch discount
    batch_factor: Amount | None = None


class PriceOverride(PolicyStruct, frozen=True):
    """A tenant's override of some of a model's prices; the rest come from the model's."""

    input: Amount | None = None
    output: Amount | None = None
    cached_input: Amount | None = None
    cache_write_input: Amount | None = None
    reasoning: Amount | None = None
    batch_factor: Amount | None = None


class Prices(PolicyStruct, frozen=True):
    """Prices by public model name, with optional per-tenant overrides."""

    currency: str = "USD"
    #: default batch multiplier for every model
    batch_factor: Amount | None = None
    #: charge a request that failed before any output for its tokens; by default it is
    #: recorded with its token counts and a cost of 0
    bill_failed: bool = False
    models: dict[str, Price] = msgspec.field(default_factory=dict)
    #: tenant -> model -> price (fields not given fall back to the model's price)
    tenants: dict[str, dict[str, PriceOverride]] = msgspec.field(default_factory=dict)


#: the output bound of a model that sets no ``max_output_tokens`` and has no context length to
#: derive one from: above the longest answer of most served models (raise it per model for
#: long reasoning outputs) while keeping a single request's quota reservation to 32k tokens
DEFAULT_MAX_OUTPUT_TOKENS = 32768
#: the largest ``max_output_tokens`` a policy may set (far above any model's context window)
MAX_OUTPUT_TOKENS_LIMIT = 10_000_000


class Model(PolicyStruct, frozen=True):
    """A public model name clients ask for, mapped to pools and the name the backend knows."""

    name: Name
    #: the pool for classes without an entry in ``pools``
    pool: Name
    #: tokenizer for the gateway's own counts (the backend's usage figures stay authoritative)
    encoding: Literal["o200k_base", "cl100k_base"] = "o200k_base"
    #: output tokens reserved against token quotas when a request sets no max_tokens (at most
    #: the model's output bound, ``output_ceiling``)
    default_max_tokens: PositiveInt = 1024
    #: the largest output limit a request may ask for, in every API's field (chat
    #: ``max_tokens`` and ``max_completion_tokens``, completions ``max_tokens``, Responses
    #: ``max_output_tokens``, Messages ``max_tokens``): above it the request is answered 400
    #: naming the field and this bound, before admission, so nothing is reserved or forwarded.
    #: Unset: the model's ``context_length``, else 32768 (see ``output_ceiling``)
    max_output_tokens: Annotated[int, msgspec.Meta(ge=1, le=MAX_OUTPUT_TOKENS_LIMIT)] | None = None
    #: the model's context window in tokens (prompt and output together), as its engine
    #: serves it (vLLM's ``max_model_len``): shown on ``/v1/models`` so an agent need not
    #: guess, and the output bound when ``max_output_tokens`` is unset
    context_length: Annotated[int, msgspec.Meta(ge=1, le=MAX_OUTPUT_TOKENS_LIMIT)] | None = None
    #: request class -> pool, e.g. {interactive: chat-h100, batch: bulk-h100}
    pools: dict[str, Name] = msgspec.field(default_factory=dict)
    #: the model name sent to the backend; defaults to the public name
    backend_model: str | None = None
    owned_by: str = "gateway"
    #: weighted backend versions; when set, each request picks one by weight
    versions: list[Version] = msgspec.field(default_factory=list)
    #: keep a caller on one version: per API key, per conversation, or not at all
    sticky: Literal["none", "key", "conversation"] = "none"
    shadow: Shadow | None = None
    #: a broken stream of this model continued on another backend of its pool; set, it takes
    #: the place of the pool's ``continuation`` for this model (on for a model whose pool's
    #: backends serve the same weights, off for one whose do not)
    continuation: Continuation | None = None

    def __post_init__(self) -> None:
        if (self.max_output_tokens is not None and self.context_length is not None
                and self.max_output_tokens > self.context_length):
            raise ValueError(
                f"model '{self.name}': max_output_tokens ({self.max_output_tokens}) is above "
                f"its context_length ({self.context_length})"
            )
        if self.default_max_tokens > self.output_ceiling:
            raise ValueError(
                f"model '{self.name}': default_max_tokens ({self.default_max_tokens}) is above "
                f"its max_output_tokens ({self.output_ceiling})"
            )

    @property
    def output_ceiling(self) -> int:
        """The largest output limit a request may set: ``max_output_tokens``, else the model's
        ``context_length``, else :data:`DEFAULT_MAX_OUTPUT_TOKENS`."""
        if self.max_output_tokens is not None:
            return self.max_output_tokens
        if self.context_length is not None:
            return self.context_length
        return DEFAULT_MAX_OUTPUT_TOKENS

    @property
    def upstream_name(self) -> str:
        return self.backend_model or self.name

    def pool_for(self, request_class: str) -> str:
        return self.pools.get(request_class, self.pool)
