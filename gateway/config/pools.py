"""The policy's pools and their backends: how one pool picks, checks, shares and isolates them.

``pools:`` in a policy: each :class:`Pool` with its :class:`Backend` list and the settings of
its scheduling (borrowing, lending, shedding, fair share, prefix routing), health checks,
engine signals, prompt-cache isolation and stream continuation.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from gateway.config.base import Name, PolicyStruct, PositiveFloat, PositiveInt

__all__ = [
    "Affinity",
    "ApiName",
    "Backend",
    "Borrow",
    "CacheIsolation",
    "Continuation",
    "Engine",
    "Health",
    "Isolation",
    "Lend",
    "Pool",
    "PrefixRouting",
    "Shed",
    "Signals",
]


#: a client API a backend may speak natively
ApiName = Literal["chat", "responses", "messages"]
#: the inference server behind a backend; it decides the engine signals read from its
#: ``/metrics``, how tenants are kept apart in its prompt cache (``cache_salt`` or
#: ``cache_prompt: false``), where it reports cached prompt tokens, and which of its error
#: answers are given OpenAI's shape (``gateway/upstream/engines.py``)
Engine = Literal["vllm", "sglang", "llamacpp", "tgi", "ollama", "openai", "anthropic"]


class Backend(PolicyStruct, frozen=True):
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


class Health(PolicyStruct, frozen=True):
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


class Borrow(PolicyStruct, frozen=True):
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


class Lend(PolicyStruct, frozen=True):
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


class Shed(PolicyStruct, frozen=True):
    """Refuse at once (503 + Retry-After) a request the pool predicts would start too late.

    From the engines' scraped queue and KV use, the prompt tokens sent and the TTFTs observed,
    the pool predicts a request's time to first token; it is refused when that exceeds
    ``margin`` x the time left before its class's ``start_deadline`` (reason ``deadline``), or,
    for a lower class, the ``ttft_target`` of a higher class using the pool (``priority``: batch
    is shed before interactive). Never when nothing is ahead of the request.
    """

    #: share of the time left before the start deadline the prediction may use
    margin: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.8


class Signals(PolicyStruct, frozen=True):
    """Scrape each backend's engine metrics (Prometheus text) to steer backend choice: its
    waiting and running requests and KV-cache use, under its engine's names (vLLM, SGLang,
    llama.cpp with ``--metrics``, TGI; ``gateway/upstream/engines.py``). A backend whose
    answer holds none of them logs one warning and shows in
    ``gateway_engine_signals_missing``."""

    path: str = "/metrics"
    interval: PositiveFloat = 1.0
    timeout: PositiveFloat = 1.0


class Affinity(PolicyStruct, frozen=True):
    """Send a conversation back to the backend holding its prefix cache, within a load bound.

    The conversation is identified as in :mod:`gateway.routing.conversation` (its ``user``, a
    session header, or its system prompt and first user message: the same from the first turn).
    """

    #: a backend may take an affine request while its load is below this x the pool's mean
    bounded_load: Annotated[float, msgspec.Meta(ge=1)] = 1.25


class PrefixRouting(PolicyStruct, frozen=True):
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


class Isolation(PolicyStruct, frozen=True):
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


class Continuation(PolicyStruct, frozen=True):
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
    #: whether the continuation's prompt (the prompt plus the text already sent, priced at the
    #: model's input price: the record's ``continuation_cost``) is charged to the tenant, in
    #: its cost and its spend budgets; off, the operator carries it
    billed: bool = False


class Pool(PolicyStruct, frozen=True):
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
