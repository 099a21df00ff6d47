"""A simulated continuous-batching engine: one asyncio task repeating "schedule, sleep, emit".

The scheduler follows vLLM V1 (SIMULATOR.md): every running sequence past its prompt decodes one
token per step; what is left of the step budget goes to prompt chunks, first to running sequences
still in prefill, then first-come-first-served to waiting requests while the batch has room and the
KV pool has blocks. The step sleeps for the closed-form cost of what it computed, then emits.

Requests carry no text: the engine counts tokens and wakes each request's consumer, which turns
counts into words. Each step is O(running); queued requests cost nothing until admitted.

KV admission reserves blocks for prompt plus ``max_tokens`` so nothing is ever preempted; the usage
reported to metrics counts only the blocks actually filled, as vLLM's gauge does.

Automatic prefix caching (``prefix_cache.py``, on unless ``prefix_caching=False``): a request
submitted with its prompt's token ids is matched at admission against the blocks the pool holds;
the cached prefix starts its prefill at the cached length (cached tokens cost nothing) and needs
no new blocks. Each prefill chunk caches the blocks it fills. ``_kv_free_blocks`` counts every
block no running request holds, evictable cached blocks included; an admission that takes free
space evicts the least recently used of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
import random
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from gateway.sim.prefix_cache import PrefixCache, block_hashes
from gateway.sim.stats import EngineStats

if TYPE_CHECKING:
    from collections.abc import Sequence
    from types import TracebackType

    from gateway.sim.profiles import Profile

__all__ = [
    "Engine",
    "EngineError",
    "QueueFullError",
    "RequestState",
    "RequestTooLargeError",
    "SimRequest",
]

# When the process falls further behind than this (seconds), stop catching up on missed steps.
_MAX_CATCH_UP_S = 0.05


class EngineError(Exception):
    """Base of the engine's admission errors."""


class QueueFullError(EngineError):
    """The waiting queue is at its limit; the request was not accepted."""


class RequestTooLargeError(EngineError):
    """Prompt plus ``max_tokens`` can never fit in the KV cache."""


class RequestState(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    CANCELLED = "cancelled"


class SimRequest:
    """One request inside the engine; created by :meth:`Engine.submit`, read by its consumer.

    Per-request and single-consumer: one coroutine calls :meth:`wait`. Times are ``loop.time()``.
    """

    __slots__ = (
        "_engine",
        "_loop",
        "_waiter",
        "admitted_at",
        "arrival",
        "cached_tokens",
        "computed",
        "eligible_at",
        "finished_at",
        "first_token_at",
        "generated",
        "hashes",
        "id",
        "kv_blocks",
        "max_tokens",
        "prompt_tokens",
        "refs",
        "registered",
        "state",
    )

    def __init__(
        self,
        engine: Engine,
        loop: asyncio.AbstractEventLoop,
        rid: int,
        prompt_tokens: int,
        max_tokens: int,
        cached_tokens: int,
        now: float,
        eligible_at: float,
        hashes: list[int],
    ) -> None:
        self._engine = engine
        self._loop = loop
        self._waiter: asyncio.Future[None] | None = None
        self.id = rid
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.cached_tokens = cached_tokens
        # A full cache hit still recomputes the last prompt token, as vLLM does.
        self.computed = min(cached_tokens, max(prompt_tokens - 1, 0))
        self.generated = 0
        self.state = RequestState.WAITING
        self.arrival = now
        self.eligible_at = eligible_at
        self.admitted_at: float | None = None
        self.first_token_at: float | None = None
        self.finished_at: float | None = None
        #: blocks this request alone holds (reserved, not shared through the prefix cache)
        self.kv_blocks = 0
        #: chained hashes of the prompt's full blocks (empty: not looked up or cached)
        self.hashes = hashes
        #: the cached blocks this request holds a reference on, in prompt order
        self.refs: list[int] = []
        #: prompt blocks already matched or offered to the cache
        self.registered = 0

    def __repr__(self) -> str:
        return (
            f"<SimRequest {self.id} {self.state.value} prompt={self.computed}/"
            f"{self.prompt_tokens} out={self.generated}/{self.max_tokens}>"
        )

    @property
    def done(self) -> bool:
        """Finished or cancelled: no more tokens will come."""
        return self.state is RequestState.FINISHED or self.state is RequestState.CANCELLED

    async def wait(self, seen: int) -> int:
        """Wait until more than ``seen`` tokens exist or the request is done; return the count."""
        # Hot path (once per token per stream): no property calls, the loop looked up once.
        while self.generated <= seen and (
            self.state is RequestState.WAITING or self.state is RequestState.RUNNING
        ):
            fut: asyncio.Future[None] = self._loop.create_future()
            self._waiter = fut
            try:
                await fut
            finally:
                self._waiter = None
        return self.generated

    def cancel(self) -> None:
        """Leave the queue or batch now, freeing the slot and KV; idempotent."""
        self._engine.cancel(self)

    def _wake(self) -> None:
        fut = self._waiter
        if fut is not None and not fut.done():
            fut.set_result(None)


class Engine:
    """One simulated replica. Start it in a running loop (or let the first submit start it).

    ``speedup`` divides every modelled time; ``jitter`` is the relative standard deviation of a
    Gaussian factor on each step (0 for exact timing in tests).
    """

    def __init__(
        self,
        profile: Profile,
        *,
        speedup: float = 1.0,
        jitter: float = 0.05,
        seed: int | None = None,
        prefix_caching: bool = True,
    ) -> None:
        if speedup <= 0:
            raise ValueError("speedup must be positive")
        self.profile = profile
        self.speedup = speedup
        self.jitter = jitter
        self.stats = EngineStats()
        self._rng = random.Random(seed)
        self._ids = itertools.count(1)
        self._waiting: OrderedDict[int, SimRequest] = OrderedDict()
        self._running: dict[int, SimRequest] = {}
        self._kv_total_blocks = profile.kv_tokens // profile.block_tokens
        self._kv_free_blocks = self._kv_total_blocks
        #: the automatic prefix cache, None when prefix caching is off
        self.prefix_cache = PrefixCache(profile.block_tokens) if prefix_caching else None
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        #: The loop the engine runs in, set by :meth:`start`.
        self.loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self._scale = 1.0 / (1000.0 * speedup)  # model milliseconds -> wall seconds

    def __repr__(self) -> str:
        return (
            f"<Engine {self.profile.name} [running {len(self._running)}, waiting "
            f"{len(self._waiting)}, kv {self.kv_used_tokens}/{self.profile.kv_tokens}]>"
        )

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the step loop in the running event loop (no-op when already started)."""
        if self._task is None and not self._closed:
            self.loop = asyncio.get_running_loop()
            self._task = self.loop.create_task(self._run(), name="sim-engine")

    async def close(self) -> None:
        """Stop the loop and cancel every request still in the engine."""
        self._closed = True
        for req in [*self._running.values(), *self._waiting.values()]:
            self.cancel(req)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def __aenter__(self) -> Engine:
        self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- requests --------------------------------------------------------------------------------

    def submit(
        self,
        prompt_tokens: int,
        max_tokens: int,
        *,
        cached_tokens: int = 0,
        token_ids: Sequence[int] | None = None,
        cache_salt: str | None = None,
    ) -> SimRequest:
        """Queue a request; raises :class:`QueueFullError` or :class:`RequestTooLargeError`.

        ``cached_tokens``: a prefix known to be cached elsewhere (the Messages API's
        ``cache_control`` cache), skipped in prefill. ``token_ids``: the prompt's tokens, looked
        up in and added to the prefix cache (``req.cached_tokens`` then includes the hit once the
        request is admitted). ``cache_salt``: the request's salt; it hits only blocks cached
        under the same salt.
        """
        if self._closed:
            raise EngineError("engine is closed")
        if len(self._waiting) >= self.profile.queue_limit:
            self.stats.rejected += 1
            raise QueueFullError(f"waiting queue full ({self.profile.queue_limit} requests)")
        if self._blocks(prompt_tokens + max_tokens) > self._kv_total_blocks:
            raise RequestTooLargeError(
                f"{prompt_tokens} prompt + {max_tokens} output tokens exceed the KV cache "
                f"({self.profile.kv_tokens} tokens)"
            )
        self.start()
        loop = self.loop
        assert loop is not None  # set by start()
        now = loop.time()
        eligible = now + self.profile.request_overhead_ms * self._scale
        cache = self.prefix_cache
        hashes = (
            block_hashes(token_ids, cache.block_tokens, cache_salt)
            if cache is not None and token_ids
            else []
        )
        req = SimRequest(
            self,
            loop,
            next(self._ids),
            prompt_tokens,
            max_tokens,
            cached_tokens,
            now,
            eligible,
            hashes,
        )
        self._waiting[req.id] = req
        self._wake.set()
        return req

    def cancel(self, req: SimRequest) -> None:
        """Remove a request wherever it is; its consumer wakes and sees ``CANCELLED``."""
        if req.state is RequestState.WAITING:
            del self._waiting[req.id]
        elif req.state is RequestState.RUNNING:
            del self._running[req.id]
            self._free(req)
        else:
            return
        req.state = RequestState.CANCELLED
        self.stats.cancelled += 1
        req._wake()

    # -- observation -----------------------------------------------------------------------------

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def kv_used_tokens(self) -> int:
        """Tokens held in filled KV blocks (whole blocks), over the running batch."""
        bt = self.profile.block_tokens
        return sum(-(-(r.computed + r.generated) // bt) for r in self._running.values()) * bt

    @property
    def kv_usage(self) -> float:
        """Fraction of the KV cache filled, 0..1."""
        return self.kv_used_tokens / self.profile.kv_tokens if self.profile.kv_tokens else 0.0

    def snapshot(self) -> dict[str, Any]:
        """Live state and totals, the JSON of ``GET /sim/stats``."""
        s = self.stats
        return {
            "running": self.num_running,
            "waiting": self.num_waiting,
            "kv_used_tokens": self.kv_used_tokens,
            "completed": s.completed,
            "cancelled": s.cancelled,
            "rejected": s.rejected,
            "generated_tokens_total": s.generation_tokens_total,
            "prompt_tokens_total": s.prompt_tokens_total,
            "prefill_tokens_total": s.prefill_tokens_total,
            "prefix_cache": self._cache_snapshot(),
            "steps": s.steps,
            "step_lag_ms_mean": 1000 * s.step_lag_total / s.steps if s.steps else 0.0,
        }

    def _cache_snapshot(self) -> dict[str, int] | None:
        cache = self.prefix_cache
        if cache is None:
            return None
        return {
            "queries_tokens": cache.queries,
            "hits_tokens": cache.hits,
            "cached_blocks": cache.cached_blocks,
            "evictable_blocks": cache.evictable,
            "evictions": cache.evictions,
        }

    # -- the step loop ---------------------------------------------------------------------------

    def _blocks(self, tokens: int) -> int:
        return -(-tokens // self.profile.block_tokens)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        step_end: float | None = None  # when the previous step ended, in model-paced time
        last_emit = 0.0
        while True:
            now = loop.time()
            if not self._running:
                if not self._waiting:
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                # Idle: plan the first step as of the moment the head clears its request overhead,
                # so its TTFT costs one timer wake-up, not two.
                now = max(now, next(iter(self._waiting.values())).eligible_at)
                step_end = None  # resuming from idle: no missed steps to catch up on
            start = now if step_end is None or now - step_end > _MAX_CATCH_UP_S else step_end
            cost_ms, decode, chunks = self._schedule(now)
            if self.jitter:
                cost_ms *= max(0.1, self._rng.gauss(1.0, self.jitter))
            step_end = start + cost_ms * self._scale
            delay = step_end - loop.time()
            await asyncio.sleep(delay if delay > 0 else 0)
            now = loop.time()
            self.stats.steps += 1
            self.stats.step_lag_total += max(0.0, now - step_end)
            self._emit(decode, chunks, now, now - last_emit)
            last_emit = now

    def _schedule(self, now: float) -> tuple[float, list[SimRequest], list[tuple[SimRequest, int]]]:
        """Pick this step's decodes and prompt chunks; admit waiting requests. No I/O."""
        p = self.profile
        decode: list[SimRequest] = []
        prefilling: list[SimRequest] = []
        ctx = 0
        for req in self._running.values():
            if req.computed >= req.prompt_tokens:
                decode.append(req)
                ctx += req.prompt_tokens + req.generated
            else:
                prefilling.append(req)
        budget = p.step_tokens - len(decode)
        chunks: list[tuple[SimRequest, int]] = []
        prefill_ms = 0.0
        for req in prefilling:
            if budget <= 0:
                break
            k = min(req.prompt_tokens - req.computed, budget)
            prefill_ms += p.chunk_cost_ms(req.computed, k)
            chunks.append((req, k))
            budget -= k
        waiting = self._waiting
        while budget > 0 and waiting and len(self._running) < p.max_running:
            req = next(iter(waiting.values()))
            if req.eligible_at > now:
                break
            need = self._blocks(req.prompt_tokens + req.max_tokens)
            hit, hit_free = 0, 0
            if req.hashes:
                assert self.prefix_cache is not None  # hashes exist only with a cache
                hit, hit_free = self.prefix_cache.match(req.hashes, req.prompt_tokens)
            # cached blocks in use are shared; evictable ones leave the free space like new ones
            if need - hit + hit_free > self._kv_free_blocks:
                break
            del waiting[req.id]
            self._admit(req, need - hit, hit, hit_free, now)
            k = min(req.prompt_tokens - req.computed, budget)
            prefill_ms += p.chunk_cost_ms(req.computed, k)
            chunks.append((req, k))
            budget -= k
        return p.step_cost_ms(len(decode), ctx, prefill_ms), decode, chunks

    def _admit(self, req: SimRequest, blocks: int, hit: int, hit_free: int, now: float) -> None:
        """Run ``req`` with ``blocks`` new blocks and the first ``hit`` blocks of its prompt
        from the prefix cache (``hit_free`` of them evictable until now)."""
        req.state = RequestState.RUNNING
        req.admitted_at = now
        req.kv_blocks = blocks
        self._kv_free_blocks -= blocks + hit_free
        cache = self.prefix_cache
        if cache is not None:
            cache.count_query(req.prompt_tokens, hit)
            if hit:
                req.refs = req.hashes[:hit]
                cache.acquire(req.refs)
                cached = hit * cache.block_tokens
                req.cached_tokens = max(req.cached_tokens, cached)
                req.computed = max(req.computed, cached)
            req.registered = hit
            cache.evict_to(self._kv_free_blocks)
        self._running[req.id] = req
        self.stats.queue_time.observe(now - req.eligible_at)

    def _emit(
        self,
        decode: list[SimRequest],
        chunks: list[tuple[SimRequest, int]],
        now: float,
        step_s: float,
    ) -> None:
        """Apply the step: one token per decode, prompt progress per chunk; wake consumers."""
        running = RequestState.RUNNING
        emitted = 0
        for req in decode:
            if req.state is not running:  # cancelled during the step
                continue
            req.generated += 1
            emitted += 1
            if req.generated >= req.max_tokens:
                self._finish(req, now)
            else:
                req._wake()
        if emitted:
            self.stats.itl.observe(step_s, emitted)
        for req, k in chunks:
            if req.state is not running:
                continue
            req.computed += k
            self.stats.prefill_tokens_total += k
            if req.hashes:
                self._cache_filled(req)
            if req.computed < req.prompt_tokens:
                continue
            # The step that completes the prompt also samples the first token.
            self.stats.prompt_tokens_total += req.prompt_tokens
            if req.max_tokens > 0:
                req.generated = 1
                emitted += 1
                req.first_token_at = now
                self.stats.ttft.observe(now - req.arrival)
            if req.generated >= req.max_tokens:
                self._finish(req, now)
            else:
                req._wake()
        self.stats.generation_tokens_total += emitted

    def _finish(self, req: SimRequest, now: float) -> None:
        req.state = RequestState.FINISHED
        req.finished_at = now
        del self._running[req.id]
        self._free(req)
        self.stats.completed += 1
        self.stats.e2e.observe(now - req.arrival)
        req._wake()

    def _cache_filled(self, req: SimRequest) -> None:
        """Offer the prompt blocks ``req`` has filled to the prefix cache; a block it caches
        becomes shared (held by reference) instead of private."""
        cache = self.prefix_cache
        assert cache is not None
        full = min(req.computed // cache.block_tokens, len(req.hashes))
        for i in range(req.registered, full):
            h = req.hashes[i]
            if cache.register(h):
                req.refs.append(h)
                req.kv_blocks -= 1
        req.registered = max(req.registered, full)

    def _free(self, req: SimRequest) -> None:
        """Return a leaving request's blocks: its private ones, and the cached ones nobody
        else holds (which stay cached, now evictable)."""
        freed = req.kv_blocks
        if req.refs:
            assert self.prefix_cache is not None
            freed += self.prefix_cache.release(req.refs)
            req.refs = []
        req.kv_blocks = 0
        self._kv_free_blocks += freed
