"""The typed policy model: the single source of truth for what a policy file may say.

Every section has defaults, so a policy directory may split sections across files; the loader
(``gateway.config.load``) merges them and then runs the cross-field checks in ``validate``. The
JSON Schema published as ``policies/schema.json`` is generated from these types.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

__all__ = [
    "Affinity",
    "Alerts",
    "ApiKey",
    "Auth",
    "Backend",
    "Batch",
    "Borrow",
    "CacheIsolation",
    "CallLimits",
    "ClientLimits",
    "Console",
    "Continuation",
    "Engine",
    "Health",
    "Isolation",
    "Lend",
    "LimitSet",
    "Model",
    "Organization",
    "Plan",
    "Policy",
    "Pool",
    "PrefixRouting",
    "Price",
    "Prices",
    "Progressive",
    "RequestClass",
    "Retry",
    "RolloutGates",
    "RouteRule",
    "Routing",
    "Server",
    "Shadow",
    "Shed",
    "Signals",
    "Store",
    "StoredResponseLimits",
    "Team",
    "Tenant",
    "Timeouts",
    "Version",
    "seconds",
]

Name = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:/@-]+$")]
PositiveFloat = Annotated[float, msgspec.Meta(gt=0)]
PositiveInt = Annotated[int, msgspec.Meta(gt=0)]


#: a client API a backend may speak natively
ApiName = Literal["chat", "responses", "messages"]
#: the inference server behind a backend; it decides the engine signals read from its
#: ``/metrics``, how tenants are kept apart in its prompt cache (``cache_salt`` or
#: ``cache_prompt: false``), where it reports cached prompt tokens, and which of its error
#: answers are given OpenAI's shape (``gateway/upstream/engines.py``)
Engine = Literal["vllm", "sglang", "llamacpp", "tgi", "ollama", "openai", "anthropic"]


class _Base(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """Policy structs reject unknown fields, so a typo is an error rather than a silent default."""


class Backend(_Base, frozen=True):
    """One inference server (vLLM, SGLang, TGI, llama.cpp, Ollama or a hosted API)."""

    url: Annotated[str, msgspec.Meta(pattern=r"^https?://[^/\s]+(/\S*)?$")]
    name: Name | None = None
    weight: PositiveFloat = 1.0
    max_in_flight: PositiveInt = 256
    #: environment variable holding the backend's API key; sent as ``Authorization: Bearer``
    api_key_env: str | None = None
    #: the client APIs it serves natively besides chat completions ("chat", "responses",
    #: "messages"): a request in one of them passes through unchanged when every backend of
    #: its pool speaks it, and is translated to chat completions otherwise
    api: ApiName | list[ApiName] = "chat"
    #: the inference server it runs (default: its pool's ``engine``; unset there too: read
    #: from the names of its ``/metrics`` when the pool scrapes ``signals``, else unknown)
    engine: Engine | None = None

    @property
    def label(self) -> str:
        return self.name or self.url

    @property
    def apis(self) -> frozenset[str]:
        """The APIs it speaks; chat completions always."""
        names = [self.api] if isinstance(self.api, str) else self.api
        return frozenset({"chat", *names})


class Health(_Base, frozen=True):
    """Active checks and passive outlier ejection of a pool's backends."""

    #: path probed with GET every ``interval`` s (e.g. /health); None = passive ejection only
    path: str | None = None
    interval: PositiveFloat = 5.0
    timeout: PositiveFloat = 2.0
    #: consecutive failures (errors, timeouts, 5xx) that eject a backend
    eject_after: PositiveInt = 3
    #: first ejection lasts this long; each re-ejection doubles it up to ``eject_max``
    eject_base: PositiveFloat = 5.0
    eject_max: PositiveFloat = 300.0
    #: below this share of healthy backends the pool ignores ejections (never ejects itself empty)
    panic_threshold: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.5


class Borrow(_Base, frozen=True):
    """Lets requests of lower classes use this pool while it has headroom.

    A borrower is let in only while all of these hold: nothing waits in the pool's queue, its
    in-flight is below ``max_share`` of its capacity, its recent TTFT p90 is below
    ``ttft_p90_target``, no backend reports a waiting engine queue, and the predicted TTFT of
    the pool's own typical request stays within ``ttft_p90_target`` once the borrower's prompt
    is prefilled ahead of it (:mod:`gateway.routing.predict`): a long borrowed prompt is
    refused where a short one fits, so borrowing never pushes the owner's requests late.
    """

    #: borrowers may use the pool only while its in-flight is below this share of its capacity
    max_share: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.5
    #: ... its recent TTFT p90 and the predicted TTFT of its own next request (behind the
    #: borrower's prefill) are below this many seconds
    ttft_p90_target: PositiveFloat = 0.5


class Lend(_Base, frozen=True):
    """Lets a higher class use this pool when its own pool would miss its ``ttft_target``.

    Set it on a batch pool: an interactive request whose own pool predicts a TTFT above the
    class's ``ttft_target`` goes here instead when this pool predicts an earlier first token,
    taking a free slot ahead of this pool's own waiting requests. The pool's own class always
    leaves ``reserve`` of its capacity free for borrowers, and while it lends it is throttled to
    ``own_share``, so its prefills do not crowd out the borrowers'.
    """

    #: share of the capacity the pool's own class always leaves free for borrowers
    reserve: Annotated[float, msgspec.Meta(ge=0, lt=1)] = 0.1
    #: while lending, the pool's own class holds at most this share of its capacity
    own_share: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.25
    #: the pool counts as lending for this many seconds after a borrower last started here
    window: PositiveFloat = 5.0


class Shed(_Base, frozen=True):
    """Refuse at once (503 + Retry-After) a request the pool predicts would start too late.

    From the engines' scraped queue and KV use, the prompt tokens sent and the TTFTs observed,
    the pool predicts a request's time to first token; it is refused when that exceeds
    ``margin`` x the time left before its class's ``start_deadline`` (reason ``deadline``), or,
    for a lower class, the ``ttft_target`` of a higher class using the pool (``priority``: batch
    is shed before interactive). Never when nothing is ahead of the request.
    """

    #: share of the time left before the start deadline the prediction may use
    margin: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.8


class Signals(_Base, frozen=True):
    """Scrape each backend's engine metrics (Prometheus text) to steer backend choice: its
    waiting and running requests and KV-cache use, under its engine's names (vLLM, SGLang,
    llama.cpp with ``--metrics``, TGI; ``gateway/upstream/engines.py``). A backend whose
    answer holds none of them logs one warning and shows in
    ``gateway_engine_signals_missing``."""

    path: str = "/metrics"
    interval: PositiveFloat = 1.0
    timeout: PositiveFloat = 1.0


class Affinity(_Base, frozen=True):
    """Send a conversation back to the backend holding its prefix cache, within a load bound.

    The conversation is identified as in :mod:`gateway.routing.conversation` (its ``user``, a
    session header, or its system prompt and first user message: the same from the first turn).
    """

    #: a backend may take an affine request while its load is below this x the pool's mean
    bounded_load: Annotated[float, msgspec.Meta(ge=1)] = 1.25


class PrefixRouting(_Base, frozen=True):
    """Send a prompt to the backend that was recently sent its longest prefix, within a load
    bound (``strategy: prefix``; see :mod:`gateway.routing.prefix`)."""

    #: bytes of the prompt's JSON per hashed chunk (~4 bytes a token: 512 is ~128 tokens)
    block_bytes: Annotated[int, msgspec.Meta(ge=16, le=65536)] = 512
    #: chunk hashes the pool's index keeps, least recently used dropped first (~100 B each)
    max_entries: Annotated[int, msgspec.Meta(ge=1, le=10_000_000)] = 65536
    #: a backend may take a request for its cached prefix while its load is below this x the
    #: pool's mean (+1)
    bounded_load: Annotated[float, msgspec.Meta(ge=1)] = 1.25


#: ``salt``: the gateway sends each request a ``cache_salt`` of its tenant (vLLM, SGLang: a
#: prompt hits only the cache blocks of its own salt); ``no_cache``: it sends
#: ``cache_prompt: false`` (llama.cpp's per-request switch: nothing is reused, nothing can
#: leak, no prefill is saved); ``shared``: nothing is sent (one cache for every tenant: for a
#: pool that serves one tenant, or tenants that trust each other)
CacheIsolation = Literal["salt", "no_cache", "shared"]


class Isolation(_Base, frozen=True):
    """Tenants kept apart in the engines' prompt caches (and the gateway's prefix index).

    A prompt cache shared by tenants answers one tenant's exact guess of another's prompt with
    a cache hit (``cached_tokens``, a shorter time to first token). Each tenant's requests
    carry a salt of their own, derived by HMAC from a server secret, never from the client
    (a client's own ``cache_salt`` is dropped); the tenants of an organization with
    ``share_cache``, or of one ``cache_group``, share one salt.
    """

    #: the engines' isolation in pools that set none: ``shared`` for all of them; else the
    #: way a pool's known ``engine`` isolates (``salt``: vLLM, SGLang; ``no_cache``:
    #: llama.cpp; nothing for engines that take neither), and this for an unknown engine
    cache: CacheIsolation = "salt"
    #: environment variable holding the secret the salts derive from; unset: a secret made
    #: once in ``store.data_dir`` (one host: set the same secret on every replica so that a
    #: tenant's salt, and so its cache hits, are the same on all of them)
    cache_salt_secret_env: str = "GATEWAY_CACHE_SALT_SECRET"


class Continuation(_Base, frozen=True):
    """A stream whose backend fails after its first byte continues on another backend of the
    pool (``gateway/upstream/continuation.py``): the client's stream goes on where it broke.
    Turn it on only for a pool whose backends serve the same weights: the continuation is
    another engine's completion of the text already sent."""

    enabled: bool = False
    #: continuations of one stream, at most (each on a backend not tried before)
    max_attempts: Annotated[int, msgspec.Meta(ge=1, le=8)] = 1
    #: a stream that broke after more output tokens than this is not continued (the
    #: continuation's prompt holds them all): the error event ends it, as without continuation
    max_output_tokens: PositiveInt = 4096


class Pool(_Base, frozen=True):
    """A set of backends serving one request class."""

    name: Name
    backends: Annotated[list[Backend], msgspec.Meta(min_length=1)]
    request_class: Name = msgspec.field(name="class", default="interactive")
    #: least outstanding requests (power of two choices, weighted, latency-penalised), plain
    #: round robin, or prefix-cache aware (the longest recently sent prefix within a load bound)
    strategy: Literal["least_loaded", "round_robin", "prefix"] = "least_loaded"
    #: a pool tried when every backend of this one failed the request
    fallback: Name | None = None
    #: requests waiting for a free backend, at most. With ``fair`` the places are shared by
    #: weight between the tenants waiting: a tenant alone may fill them all, and once they are
    #: full a tenant's request takes the place of the last waiter of the tenant with the most
    #: waiting per unit of weight (that tenant's request is refused, 503), unless that is its
    #: own tenant: so a flood refuses only itself, and another tenant always has room for its
    #: share. A request that may start at once (a free slot, or ``fair_headroom`` for a tenant
    #: below its share) is never refused for the queue's length. ``fair: false``: the whole
    #: queue's bound refuses everyone
    queue_size: Annotated[int, msgspec.Meta(ge=0)] = 1024
    #: lets lower classes borrow this pool while it has headroom (set on interactive pools)
    borrow: Borrow | None = None
    #: lets a higher class borrow this pool when its own would miss its target (batch pools)
    lend: Lend | None = None
    #: refuse at once requests predicted to start after their deadline
    shed: Shed | None = None
    health: Health = msgspec.field(default_factory=Health)
    signals: Signals | None = None
    affinity: Affinity | None = None
    #: inside a class, serve tenants by weighted fair share of tokens (a tenant's ``weight``,
    #: else its plan's); false: one queue for all, by deadline and arrival
    fair: bool = True
    #: with ``fair``: slots above each backend's ``max_in_flight`` that only a tenant holding
    #: less than its weighted share of the pool's slots may take, so a light tenant beside a
    #: flood does not wait for the flood's next completion (the flood never gets them); keep
    #: ``max_in_flight`` + this within the engine's running batch. 0: none. A slot taken is
    #: free again at the backend's next completion, so 2 per backend lets a light tenant
    #: start several requests inside one completion gap. With ``prefill_aware`` such a tenant
    #: also takes one when every free slot is on a backend with more pending prefills
    fair_headroom: Annotated[int, msgspec.Meta(ge=0, le=64)] = 2
    #: with ``fair`` and ``fair_headroom``: while another tenant holds slots, the requests of
    #: tenants at or above their share start in bursts, one backend at a time, on a backend
    #: where no other tenant's streamed request awaits its first chunk, so one backend is
    #: always clear of the floods' prefills for a light tenant's next request (a freed slot
    #: waits for a first chunk, one prefill's time, at most); false: a freed slot goes at once
    fair_stagger: bool = True
    #: with ``fair_stagger`` (no effect without it): seconds a tenant still counts as sharing
    #: the pool after its last request ended, so the floods stay staggered across a light
    #: tenant's gaps between requests (an interactive tenant at a few requests a second holds
    #: nothing for a moment every few seconds, and its next request would find the floods'
    #: prefills on every backend); 0: only while it holds slots
    fair_linger: Annotated[float, msgspec.Meta(ge=0, le=60)] = 2.0
    #: ``least_loaded`` (and ``prefix`` when no backend holds the prompt's prefix): of the two
    #: backends compared, the one with fewer streamed requests awaiting their first chunk wins
    #: while its load is within 1.25x the other's, since every prefill an engine has scheduled
    #: delays a newcomer's first token by its whole length; false: load and latency alone
    prefill_aware: bool = True
    #: settings of ``strategy: prefix`` (default settings when left out)
    prefix: PrefixRouting | None = None
    #: how this pool's engines keep tenants apart in their prompt caches (default: what its
    #: engine takes, ``salt`` for vLLM and SGLang, ``no_cache`` for llama.cpp, ``shared`` for
    #: engines that take neither, unless ``isolation.cache`` is ``shared``; a backend of
    #: unknown engine, or engines that isolate differently: ``isolation.cache``); see
    #: :class:`Isolation`
    cache_isolation: CacheIsolation | None = None
    #: the inference server of its backends that set none (see :data:`Engine`)
    engine: Engine | None = None
    #: a stream broken after its first byte continues on another backend (off by default)
    continuation: Continuation = msgspec.field(default_factory=Continuation)

    def __post_init__(self) -> None:
        if self.prefix is not None and self.strategy != "prefix":
            raise ValueError(
                f"pool '{self.name}': a prefix block needs strategy: prefix "
                f"(strategy is {self.strategy})"
            )

    @property
    def prefix_routing(self) -> PrefixRouting | None:
        """The prefix settings in force: None unless ``strategy`` is prefix."""
        if self.strategy != "prefix":
            return None
        return self.prefix or PrefixRouting()


#: a duration: seconds as a number, or a string with a unit ("500ms", "90s", "5m", "1h")
Duration = Annotated[str, msgspec.Meta(pattern=r"^\d+(\.\d+)?(ms|s|m|h)$")] | Annotated[
    float, msgspec.Meta(gt=0)]
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def seconds(duration: str | float) -> float:
    """A :data:`Duration` in seconds ("5m" -> 300.0, 1.5 -> 1.5)."""
    if not isinstance(duration, str):
        return float(duration)
    unit = "ms" if duration.endswith("ms") else duration[-1]
    return float(duration[: -len(unit)]) * _UNITS[unit]


Fraction = Annotated[float, msgspec.Meta(ge=0, le=1)]


class ErrorRateGate(_Base, frozen=True):
    """The canary's error rate (5xx answers, stream breaks, failed first attempts) may exceed
    the baseline's by at most ``max_increase`` (absolute, 0.01 = one point)."""

    max_increase: Fraction = 0.01


class LatencyGate(_Base, frozen=True):
    """The canary's p90 may be at most ``max_ratio`` x the baseline's."""

    max_ratio: Annotated[float, msgspec.Meta(ge=1)] = 1.25


class TokensGate(_Base, frozen=True):
    """Mean output tokens per request may differ from the baseline's by at most
    ``max_change`` (relative: 0.5 = half as many or 1.5x as many)."""

    max_change: Annotated[float, msgspec.Meta(gt=0)] = 0.5


class AgreementGate(_Base, frozen=True):
    """The shadow-comparison agreement rate of the canary must be at least ``min``."""

    min: Fraction = 0.9


class RolloutGates(_Base, frozen=True):
    """What a canary must hold to advance; a gate set to null is off."""

    error_rate: ErrorRateGate | None = msgspec.field(default_factory=ErrorRateGate)
    ttft_p90: LatencyGate | None = msgspec.field(default_factory=LatencyGate)
    tpot_p90: LatencyGate | None = msgspec.field(default_factory=LatencyGate)
    output_tokens: TokensGate | None = None
    shadow_agreement: AgreementGate | None = None


class Progressive(_Base, frozen=True):
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


class Version(_Base, frozen=True):
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


class Shadow(_Base, frozen=True):
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


Amount = Annotated[str, msgspec.Meta(pattern=r"^\d+(\.\d+)?$")] | int | float


class Price(_Base, frozen=True):
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


class PriceOverride(_Base, frozen=True):
    """A tenant's override of some of a model's prices; the rest come from the model's."""

    input: Amount | None = None
    output: Amount | None = None
    cached_input: Amount | None = None
    cache_write_input: Amount | None = None
    reasoning: Amount | None = None
    batch_factor: Amount | None = None


class Prices(_Base, frozen=True):
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


class Model(_Base, frozen=True):
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


class Timeouts(_Base, frozen=True):
    """Upstream timeouts, in seconds; ``total`` and ``client_stall`` also bound relaying the
    answer to the client."""

    connect: PositiveFloat = 5.0
    #: until the first token: the response headers, and for a stream its first chunk
    first_token: PositiveFloat = 120.0
    #: the longest silence allowed between two chunks of a response
    idle: PositiveFloat = 120.0
    #: the whole request, from the attempt that answers to the last byte relayed: a client
    #: that stops reading is cut off then (response ended, backend connection closed, slot
    #: released)
    total: PositiveFloat = 900.0
    #: the longest one write to the client may wait for it to read (the connection's send
    #: buffer not draining): past it the stream is cancelled as if the client had left
    #: (backend connection closed, slot released, billed for what was relayed)
    client_stall: PositiveFloat = 30.0


class RequestClass(_Base, frozen=True):
    """A class of requests with its priority, deadlines and timeouts."""

    name: Name
    #: lower is served first from a pool's queue
    priority: int = 0
    #: a request that cannot start (get a backend) within this many seconds is refused at once
    start_deadline: PositiveFloat = 10.0
    #: the time to first token this class aims for: above it (predicted on its own pool) its
    #: requests borrow a lower class's pool that ``lend``s, and a pool that ``shed``s refuses
    #: lower classes first; None: neither
    ttft_target: PositiveFloat | None = None
    #: per-class upstream timeouts (default: ``server.timeouts``)
    timeouts: Timeouts | None = None


DEFAULT_CLASSES = [
    RequestClass(name="interactive", priority=0, start_deadline=5.0),
    RequestClass(name="batch", priority=10, start_deadline=600.0),
]


class RouteRule(_Base, frozen=True):
    """Sets the class of matching requests; every given condition must hold."""

    request_class: Name = msgspec.field(name="class")
    models: list[str] | None = None
    endpoints: list[str] | None = None
    stream: bool | None = None
    #: matches when the request's max_tokens (or max_completion_tokens) is at least this
    min_max_tokens: PositiveInt | None = None
    #: fnmatch-style pattern on the request's ``user`` field
    user: str | None = None


class Retry(_Base, frozen=True):
    """Retries on another backend (then the fallback pool) before the first byte is relayed."""

    max_attempts: PositiveInt = 3
    backoff_base: PositiveFloat = 0.025
    backoff_max: PositiveFloat = 1.0
    #: retries may be at most this share of recent requests ...
    budget_ratio: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.2
    #: ... plus this many per second, so light traffic can always retry
    budget_min_per_s: Annotated[float, msgspec.Meta(ge=0)] = 2.0
    #: the window of "recent", in seconds
    budget_window: PositiveFloat = 10.0
    #: the longest a backend's ``Retry-After`` may keep it out of picks (and the most a client
    #: is told to wait on its behalf), in seconds: a backend answering ``Retry-After: 1e12``
    #: sits out this long, not 31,700 years; unparseable values (``inf``, ``nan``, negative,
    #: garbage) are ignored
    retry_after_max: PositiveFloat = 60.0


class Routing(_Base, frozen=True):
    """How a request's class is chosen, and how failures are retried."""

    default_class: Name = "interactive"
    #: honour the X-Request-Class header from every key (keys may opt in one by one)
    class_header: bool = False
    rules: list[RouteRule] = msgspec.field(default_factory=list)
    retry: Retry = msgspec.field(default_factory=Retry)


class ClientLimits(_Base, frozen=True):
    """Bounds on what one client connection may hold, per worker process (the HTTP edge).

    The header and body timeouts and the idle bound are enforced by the native server
    protocol; under ``http_protocol: uvicorn`` only ``keep_alive_timeout`` and
    ``max_connections`` apply (uvicorn has no header or body timeout).
    """

    #: open client connections per worker; beyond it a new connection is answered 503 and
    #: closed at once (``null``: no limit)
    max_connections: PositiveInt | None = 10_000
    #: seconds a connection may sit idle between requests (bytes that start no request, such
    #: as bare CRLFs, do not count as activity)
    keep_alive_timeout: PositiveFloat = 75.0
    #: seconds a client may take to send a request's line and headers once it has started
    header_timeout: PositiveFloat = 30.0
    #: seconds a client may take to send a request's whole body once its headers are in
    #: (time the gateway spends not reading, under back-pressure, is not counted): a client
    #: sending a byte every 2 s is answered 408 and closed
    body_timeout: PositiveFloat = 60.0


class CallLimits(_Base, frozen=True):
    """The per-key limit of the routes that work per call but are not inference (token
    counting, stored-response reads, usage queries): a token bucket per key and worker."""

    #: calls per minute per key and worker process (``null``: no limit)
    rpm: PositiveInt | None = 300
    #: calls a key may make at once before the per-minute rate applies (``null``: ``rpm``)
    burst: PositiveInt | None = None

    @property
    def bucket(self) -> int:
        """The bucket's size: ``burst``, or a minute's worth of calls."""
        return self.burst or self.rpm or 1


class Server(_Base, frozen=True):
    """Limits of the HTTP edge and the upstream hop."""

    max_body_bytes: PositiveInt = 8 * 1024 * 1024
    #: how long SIGTERM waits for in-flight requests and streams before cancelling them
    drain_timeout: Annotated[float, msgspec.Meta(ge=0)] = 30.0
    timeouts: Timeouts = msgspec.field(default_factory=Timeouts)
    #: client connections: how many, how long idle, how long to send headers and body
    limits: ClientLimits = msgspec.field(default_factory=ClientLimits)
    #: keep-alive connections kept open per backend when idle
    keepalive_per_backend: PositiveInt = 256
    #: readiness: how often /readyz may re-check backend reachability, in seconds
    ready_check_interval: PositiveFloat = 5.0
    #: seconds between checks of the policy file for changes (0 = no watching; SIGHUP and
    #: POST /admin/reload still reload)
    watch_interval: Annotated[float, msgspec.Meta(ge=0)] = 2.0
    #: the upstream HTTP client: the lean built-in HTTP/1.1 client, or aiohttp
    upstream_client: Literal["native", "aiohttp"] = "native"
    #: the HTTP/1.1 server protocol under uvicorn: the gateway's lean one, or uvicorn's own
    #: httptools protocol (``uvicorn``); uvicorn runs the sockets, workers and drain either way
    http_protocol: Literal["native", "uvicorn"] = "native"
    #: the per-key limit of count_tokens, stored-response reads and usage queries
    call_limits: CallLimits = msgspec.field(default_factory=CallLimits)


NonNegInt = Annotated[int, msgspec.Meta(ge=0)]
TenantName = Annotated[
    str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._:-]+$")
]


class LimitSet(_Base, frozen=True):
    """Quota limits; an absent limit is unlimited."""

    #: requests in any rolling 60 s window
    rpm: NonNegInt | None = None
    #: input + output tokens in any rolling 60 s window
    tpm: NonNegInt | None = None
    #: requests in flight at once
    concurrency: NonNegInt | None = None
    #: input + output tokens per calendar day / month (UTC, or the organization's timezone)
    tokens_per_day: NonNegInt | None = None
    tokens_per_month: NonNegInt | None = None
    #: spend per calendar day / month in the price currency (e.g. "25.00"), from ``prices``
    cost_per_day: Amount | None = None
    cost_per_month: Amount | None = None


#: ``stored_responses.max_rows`` unless a plan or tenant sets it
DEFAULT_STORED_RESPONSES_ROWS = 1_000_000
#: ``stored_responses.max_bytes`` unless a plan or tenant sets it: 1 GiB
DEFAULT_STORED_RESPONSES_BYTES = 1 << 30


class StoredResponseLimits(_Base, frozen=True):
    """A tenant's bound on its stored responses (Responses API ``store`` not false, the
    default), counted across every replica in the ledger's database: past either bound a
    request that would store one more is answered 400 ``stored_responses_limit_exceeded``
    (naming the bound, the tenant's usage and the limit) before admission, so nothing is
    reserved or forwarded; ``store: false`` requests still run. Deleting stored responses
    (``DELETE /v1/responses/{id}``) or their expiry (``store.responses_ttl_hours``) frees the
    room. Checked before the request runs, so concurrent requests may pass it together: a
    tenant can go past a bound by at most its requests in flight (rows) and their answers
    (bytes; beyond the first request, their requests too)."""

    #: stored responses the tenant keeps at once (``null``: no bound)
    max_rows: PositiveInt | None = DEFAULT_STORED_RESPONSES_ROWS
    #: bytes of stored responses the tenant keeps at once: each response's request, its new
    #: chat messages and its answer, as JSON (``null``: no bound). A request is refused when
    #: the tenant's bytes plus twice its body (its request and its messages) would pass it
    max_bytes: PositiveInt | None = DEFAULT_STORED_RESPONSES_BYTES


class Plan(_Base, frozen=True):
    """Limits a tenant gets; ``models`` adds per-model limits inside the tenant's."""

    name: Name
    limits: LimitSet = msgspec.field(default_factory=LimitSet)
    models: dict[str, LimitSet] = msgspec.field(default_factory=dict)
    #: its tenants' share of a busy pool, against other tenants of the same class (fair
    #: queuing): a tenant of weight 2 is served twice the tokens of one of weight 1
    weight: PositiveFloat = 1.0
    #: each of its tenants' bound on stored responses (rows and bytes; a tenant outside any
    #: plan gets the defaults: 1,000,000 responses, 1 GiB)
    stored_responses: StoredResponseLimits = msgspec.field(
        default_factory=StoredResponseLimits)


# --- organizations, teams and budget alerts (issue 16) ---------------------------------------
#: organization and team names: no ``:`` or ``/`` (they separate the names of quota scopes)
GroupName = Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$")]
Percent = Annotated[int, msgspec.Meta(ge=1, le=100)]


class Alerts(_Base, frozen=True):
    """Budget alerts: a log event, a metric and (with a webhook) an HMAC-signed POST when a day
    or month budget (tokens or spend) of an organization, team, tenant or key crosses one of
    ``thresholds`` - once per budget, period and threshold across all replicas."""

    #: percentages of each day/month budget that alert, in 1..100
    thresholds: Annotated[list[Percent], msgspec.Meta(min_length=1)] = msgspec.field(
        default_factory=lambda: [50, 80, 100])
    #: environment variable holding the webhook URL (http:// or https://); unset: no webhook
    webhook_url_env: str | None = None
    #: environment variable holding the secret that signs the webhook body (HMAC-SHA256)
    webhook_secret_env: str | None = None


class Organization(_Base, frozen=True):
    """Holds teams, which hold tenants: its limits bind all of them together."""

    name: GroupName
    limits: LimitSet = msgspec.field(default_factory=LimitSet)
    #: the calendar of the day/month budgets of the organization, its teams and its tenants:
    #: "UTC" or an IANA name ("Europe/Paris") from the installed tzdata
    timezone: str = "UTC"
    #: budget alerts of the organization and everything in it (default: the policy's
    #: ``alerts``)
    alerts: Alerts | None = None
    #: its tenants share one prompt-cache salt (``isolation``): a tenant's prompt is reused
    #: for, and so can be learnt by, the other tenants of the organization
    share_cache: bool = False


class Team(_Base, frozen=True):
    """A group of tenants inside one organization, with limits of its own."""

    name: GroupName
    organization: GroupName
    limits: LimitSet = msgspec.field(default_factory=LimitSet)


class Tenant(_Base, frozen=True):
    """A customer of the gateway: its plan and defaults."""

    name: TenantName
    plan: Name
    #: the class of this tenant's requests unless a key, header or rule says otherwise
    default_class: Name | None = None
    #: record prompt and completion text in traces, and the texts of disagreeing shadow
    #: answers (off unless turned on per tenant; counts and agreement are always kept)
    record_content: bool = False
    #: the team this tenant belongs to (and so the team's organization)
    team: GroupName | None = None
    #: the organization this tenant belongs to without a team (or its team's, if repeated)
    organization: GroupName | None = None
    #: its share of a busy pool against other tenants of its class (default: its plan's)
    weight: PositiveFloat | None = None
    #: tenants of one cache group share one prompt-cache salt (``isolation``): they can reuse,
    #: and so learn, each other's prompts; unset: its organization's if that shares, else its own
    cache_group: GroupName | None = None
    #: its own bound on stored responses, in place of its plan's (default: its plan's)
    stored_responses: StoredResponseLimits | None = None


class Store(_Base, frozen=True):
    """Where shared state lives: Redis when a URL is configured, else in this process."""

    #: environment variable holding the Redis URL (redis:// or rediss://); unset = embedded
    redis_url_env: str = "GATEWAY_REDIS_URL"
    #: Redis Cluster instead of a single Redis
    cluster: bool = False
    #: on a Redis outage: "open" falls back to local limits (each process's share), "closed"
    #: answers 503
    outage: Literal["open", "closed"] = "open"
    #: no request waits on Redis longer than this, in seconds
    timeout: PositiveFloat = 0.25
    #: gateway processes sharing the limits (each gets 1/processes of them when failing open)
    processes: PositiveInt = 1
    #: where managed API keys live without Redis (a JSON file); default: no managed keys
    keys_file: str | None = None
    #: environment variable holding the ledger database URL (postgresql://... or
    #: sqlite:///path); unset = SQLite at ``<data_dir>/ledger.db``
    ledger_url_env: str = "GATEWAY_LEDGER_URL"
    #: this process's own files: the embedded SQLite ledger (``ledger.db``)
    data_dir: str = "./gateway-data"
    #: "auto" (the default): "process" where ``spool_dir`` is on this host's own disk, else
    #: "commit" (a network share keeps no promise the database's commit does not keep
    #: better). "process": the record is written to the local journal in ``spool_dir`` before
    #: the response's last bytes (a killed process cannot lose it: the page cache is the
    #: kernel's), its fdatasync follows in the background within a group (a host crash in
    #: that window may lose it). "commit": a response's last bytes go out only once its usage
    #: record is durable in the database (committed, or fsync'd to the spool while it is
    #: away; one commit serves every request that finished meanwhile); "journal": once the
    #: record is fsync'd to the local journal (one fsync per group; the records reach the
    #: database in the background batches of "buffered", and a dead process's journal is
    #: replayed at the next start): survives SIGKILL like "commit", not the loss of the disk;
    #: "buffered": records are flushed every 50 ms after the response, and a SIGKILL may lose
    #: the last ~50 ms
    ledger_durability: Literal["auto", "commit", "journal", "process", "buffered"] = "auto"
    #: apply missing ledger schema migrations at start (else run ``gateway db migrate``;
    #: the embedded SQLite ledger always migrates its own file)
    ledger_migrate: bool = False
    #: the longest a response waits for its usage record, seconds: a flush the database has
    #: not committed within it (less 0.25 s for the spool's write) goes to the spool, and a
    #: record neither can take by then fails its response with 503 ``usage_not_recorded``
    ledger_timeout: PositiveFloat = 2.0
    #: the local spool: usage records wait here (fsync'd) while the ledger database is away
    spool_dir: str = "./gateway-spool"
    #: days raw usage records are kept (whole day partitions are dropped); the hourly
    #: rollups that usage queries read are kept
    usage_retention_days: PositiveInt = 90
    #: hours a stored response (Responses API ``store: true``, the default) can be retrieved
    #: and continued with ``previous_response_id``; 720 = 30 days, as OpenAI keeps them
    responses_ttl_hours: PositiveFloat = 720.0


# --- batch jobs (issue 9) -------------------------------------------------------------------
class Batch(_Base, frozen=True):
    """OpenAI batch jobs: file limits, where files live, and how the runner paces itself."""

    #: uploaded and generated files (and, without Redis, the batch state database)
    files_dir: str = "./gateway-files"
    #: an uploaded batch file larger than this is refused (413)
    max_file_bytes: PositiveInt = 100 * 1024 * 1024
    #: requests (lines) per batch file, at most
    max_lines: PositiveInt = 50_000
    #: one line's request body, at most
    max_line_bytes: PositiveInt = 1024 * 1024
    #: how many line problems a refusal lists
    report_errors: PositiveInt = 20
    #: run batches in this process (false: this replica only serves the API)
    run: bool = True
    #: lines per lease: a process claims this many lines at a time
    chunk_lines: PositiveInt = 64
    #: a lease not renewed for this long is taken over by another process
    lease_seconds: PositiveFloat = 30.0
    #: how often each process looks for new, cancelled or finished batches
    poll_interval: PositiveFloat = 0.5
    #: batch lines in flight in one process, at most
    max_in_flight: PositiveInt = 512
    #: batch lines in flight in one process while interactive traffic is pressed (>= 1 keeps
    #: batches moving)
    min_in_flight: Annotated[int, msgspec.Meta(ge=0)] = 1
    #: interactive pools count as pressed above this share of their capacity (or with a queue)
    interactive_share: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.8
    #: seconds a line refused for quota or capacity (429/503) waits before it is tried again
    retry_after: PositiveFloat = 1.0


# ---------------------------------------------------------------------------------------------
class ApiKey(_Base, frozen=True):
    """A static API key, stored only as the sha256 of the key (or read from an env variable)."""

    id: Name
    sha256: Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{64}$")] | None = None
    key_env: str | None = None
    #: the class of this key's requests unless a header or rule says otherwise
    default_class: Name | None = None
    #: may this key choose its class with the X-Request-Class header
    allow_class_header: bool = False
    #: the tenant this key belongs to (default: "default")
    tenant: TenantName = "default"
    #: the key's own limits, inside its tenant's
    limits: LimitSet | None = None


class Auth(_Base, frozen=True):
    """Who may call the gateway. Tenants and managed keys extend this."""

    #: when false, requests without a key are served (a local demo or a trusted sidecar)
    required: bool = True
    keys: list[ApiKey] = msgspec.field(default_factory=list)
    #: seconds a managed key's lookup is cached: a revocation takes effect within this bound
    cache_ttl: Annotated[float, msgspec.Meta(ge=0, le=10)] = 2.0
    #: environment variable with the secret that keys managed API keys' hashes (HMAC-SHA256)
    key_secret_env: str = "GATEWAY_KEY_SECRET"


class Console(_Base, frozen=True):
    """The web console served at ``/console`` (``gateway/console/``): off unless enabled."""

    enabled: bool = False
    #: minutes a console session lasts from its sign-in (then it must sign in again)
    session_minutes: PositiveFloat = 30.0


class Policy(_Base, frozen=True):
    """A whole policy: what the gateway serves and how."""

    version: Literal[1] = 1
    server: Server = msgspec.field(default_factory=Server)
    auth: Auth = msgspec.field(default_factory=Auth)
    classes: list[RequestClass] = msgspec.field(default_factory=lambda: list(DEFAULT_CLASSES))
    routing: Routing = msgspec.field(default_factory=Routing)
    pools: list[Pool] = msgspec.field(default_factory=list)
    models: list[Model] = msgspec.field(default_factory=list)
    prices: Prices = msgspec.field(default_factory=Prices)
    plans: list[Plan] = msgspec.field(default_factory=list)
    tenants: list[Tenant] = msgspec.field(default_factory=list)
    organizations: list[Organization] = msgspec.field(default_factory=list)
    teams: list[Team] = msgspec.field(default_factory=list)
    #: budget alerts of tenants outside any organization, and of organizations that set none
    alerts: Alerts = msgspec.field(default_factory=Alerts)
    store: Store = msgspec.field(default_factory=Store)
    batch: Batch = msgspec.field(default_factory=Batch)
    #: tenants kept apart in the engines' prompt caches
    isolation: Isolation = msgspec.field(default_factory=Isolation)
    #: the web console at ``/console``
    console: Console = msgspec.field(default_factory=Console)
