"""A rollout driven by synthetic traffic and a fake clock: real :class:`Rollouts`, real
:class:`RequestContext` objects, the in-process store; only time and the backends' answers
are made up (a pure unit: no part that could run here is replaced)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gateway.accounting import TokenUsage
from gateway.config import Model, Policy, Pool, Version
from gateway.config.model import Backend, Progressive, seconds
from gateway.context import RequestContext
from gateway.rollouts import AgreementSource, MemoryRolloutStore, Rollouts
from gateway.routing.versions import choose_version

#: (rng, canary?) -> (status, ttft seconds, tpot seconds, output tokens, stream broke?)
Answer = Callable[[random.Random, bool], tuple[int, float, float, int, bool]]


def healthy(rng: random.Random, canary: bool) -> tuple[int, float, float, int, bool]:
    """Both versions alike: lognormal TTFT (median 200 ms) and TPOT (median 20 ms)."""
    return 200, rng.lognormvariate(-1.6, 0.35), rng.lognormvariate(-3.9, 0.25), \
        rng.randint(50, 150), False


def failing(rate: float) -> Answer:
    def answer(rng: random.Random, canary: bool) -> tuple[int, float, float, int, bool]:
        status, ttft, tpot, out, broke = healthy(rng, canary)
        if canary and rng.random() < rate:
            return 500, ttft, tpot, 0, False
        return status, ttft, tpot, out, broke
    return answer


def slow_ttft(factor: float) -> Answer:
    def answer(rng: random.Random, canary: bool) -> tuple[int, float, float, int, bool]:
        status, ttft, tpot, out, broke = healthy(rng, canary)
        return status, ttft * factor if canary else ttft, tpot, out, broke
    return answer


class Clock:
    def __init__(self, start: float = 1_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


def policy(steps: list[float], hold: str = "60s", min_requests: int = 200,
           **options: Any) -> Policy:
    progressive = Progressive(steps=steps, hold=hold, min_requests=min_requests, **options)
    model = Model(name="m", pool="p", versions=[
        Version(backend_model="v1", weight=1, name="stable"),
        Version(backend_model="v2", weight=0, name="canary", progressive=progressive)])
    return Policy(pools=[Pool(name="p", backends=[Backend(url="http://127.0.0.1:1")])],
                  models=[model])


def context(version: str, status: int, ttft: float, tpot: float, out: int,
            broke: bool, now_ns: int) -> RequestContext:
    ctx = RequestContext(request_id="r", endpoint="/v1/chat/completions", started_ns=now_ns)
    ctx.request_model, ctx.version, ctx.pool, ctx.request_class = "m", version, "p", \
        "interactive"
    ctx.stream, ctx.status, ctx.attempts = True, status, 1
    ctx.outcome = "failed" if status >= 500 or broke else "completed"
    ctx.response_started = status < 500
    if status < 500:
        ctx.first_token_ns = now_ns + int(ttft * 1e9)
        ctx.last_chunk_ns = ctx.first_token_ns + int(tpot * 1e9 * max(out - 1, 0))
        ctx.usage = TokenUsage(new=10, prompt_total=10, output=out)
    return ctx


@dataclass
class Run:
    rollouts: Rollouts
    clock: Clock
    hold: float
    model: Model
    log: list[tuple[float, str, float]] = field(default_factory=list)  # (time, phase, share)

    @property
    def state(self) -> Any:
        return self.rollouts._states["m"]


def drive(policy_: Policy, answer: Answer, *, windows: float, rate: float = 100.0,
          seed: int = 1, ticks_per_hold: int = 10, store: MemoryRolloutStore | None = None,
          agreement: AgreementSource | None = None) -> Run:
    """Traffic at ``rate`` requests/s for ``windows`` hold windows, ticking the rollout
    ``ticks_per_hold`` times a window; the router picks each request's version from the
    rollout's weights, as the gateway does."""
    rng = random.Random(seed)
    clock = Clock()
    rollouts = Rollouts(store or MemoryRolloutStore(), clock=clock, interval=1.0,
                        agreement=lambda: agreement)
    rollouts.configure(policy_)
    model = policy_.models[0]
    progressive = next(v.progressive for v in model.versions if v.progressive)
    assert progressive is not None
    hold = seconds(progressive.hold)
    run = Run(rollouts, clock, hold, model)

    async def go() -> None:
        await rollouts.tick()
        tick = hold / ticks_per_hold
        per_tick = int(rate * tick)
        end = clock.now + windows * hold
        while clock.now < end:
            for _ in range(per_tick):
                version = choose_version(model, None, rng, rollouts.weights("m"))
                assert version is not None
                canary = version.label == "canary"
                rollouts.observe(context(version.label, *answer(rng, canary),
                                         now_ns=int(clock.now * 1e9)))
            clock.now += tick
            await rollouts.tick()
            state = rollouts._states["m"]
            run.log.append((clock.now, str(state.phase), state.share))

    asyncio.run(go())
    return run
