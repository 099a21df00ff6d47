"""The rollouts of one gateway process: counts from finished requests, the decision loop, the
version weights the router reads, and the operators' actions.

Per request the pipeline calls :meth:`Rollouts.observe` once (a dict lookup and a few
additions for a model with a progressive version, one lookup otherwise) and the router calls
:meth:`Rollouts.weights` (a dict lookup: the table is rebuilt only when the state changes).
Everything else runs in :meth:`Rollouts.tick`, every ``interval`` seconds: read the state
back from the store, publish this replica's counts, and - on the replica holding the lease -
gather every replica's counts and decide (:func:`gateway.rollouts.machine.decide`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import socket
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from gateway.config.model import seconds
from gateway.rollouts.counts import Arm, Histogram, Window
from gateway.rollouts.gates import evaluate, evaluate_shadow
from gateway.rollouts.machine import InvalidAction, Phase, RolloutState, act, decide, restart
from gateway.rollouts.notify import Notifier

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from gateway.alerts.webhook import WebhookSender
    from gateway.config import Model, Policy, Version
    from gateway.config.model import Progressive
    from gateway.context import RequestContext
    from gateway.rollouts.base import AgreementSource, RolloutStore
    from gateway.telemetry import Metrics

__all__ = ["Rollouts", "UnknownRollout"]

_log = logging.getLogger("gateway.rollouts")
#: counts of a window stay in a shared store this long at least, seconds
_COUNTS_TTL = 600.0

Weights = tuple[tuple["Version", float], ...]


class UnknownRollout(LookupError):
    """No progressive version for this model (404)."""


@dataclass(frozen=True, slots=True)
class _Definition:
    """A model's progressive rollout as the policy in force defines it."""

    model: Model
    canary: Version
    progressive: Progressive
    digest: str  # changes when anything the rollout runs on changes

    @classmethod
    def of(cls, model: Model) -> _Definition | None:
        canary = next((v for v in model.versions if v.progressive is not None), None)
        if canary is None or canary.progressive is None:
            return None
        basis = msgspec.json.encode([canary, [v for v in model.versions if v is not canary]])
        return cls(model, canary, canary.progressive, hashlib.sha256(basis).hexdigest()[:16])


def weights_for(model: Model, canary: Version, share: float) -> Weights:
    """The versions' weights with the canary at ``share`` percent, the canary first.

    First, because a sticky key hashes to a point in [0, 1) and takes the version whose
    segment holds it: with the canary's segment [0, share) a key on the canary stays on it as
    the share grows, and only a rollback (share 0) moves it off.
    """
    others = [v for v in model.versions if v is not canary]
    total = sum(v.weight for v in others) or 1.0
    rest = 1.0 - share / 100
    return ((canary, share / 100), *((v, rest * v.weight / total) for v in others))


class Rollouts:
    """Progressive canaries of every model of the policy in force (one per process)."""

    def __init__(self, store: RolloutStore, *, metrics: Metrics | None = None,
                 webhooks: WebhookSender | None = None,
                 agreement: Callable[[], AgreementSource | None] | None = None,
                 clock: Callable[[], float] = time.time, replica: str | None = None,
                 interval: float | None = None) -> None:
        self.store = store
        self.notifier = Notifier(metrics, webhooks)
        self._agreement = agreement or (lambda: None)
        self.clock = clock
        self.replica = replica or f"{socket.gethostname()}:{os.getpid()}:{os.urandom(3).hex()}"
        self._fixed_interval = interval
        self.interval = interval or 1.0
        self.leader = False
        self._definitions: dict[str, _Definition] = {}
        self._roles: dict[tuple[str | None, str | None], tuple[str, str]] = {}
        self._states: dict[str, RolloutState] = {}
        self._weights: dict[str, Weights] = {}
        self._windows: dict[str, tuple[int, Window]] = {}  # model -> (epoch, this replica's)
        self._pending: list[RequestContext] = []  # finished since the last tick
        #: model -> (epoch, the agreement source's reading when that window began)
        self._agreement_base: dict[str, tuple[int, tuple[int, int]]] = {}
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    def __repr__(self) -> str:
        live = ", ".join(f"{s.model} {s.phase} {s.share:g}%" for s in self._states.values())
        return (f"<Rollouts {self.store.kind} {'leader' if self.leader else 'follower'} "
                f"[{live or 'none'}]>")

    # -- the policy ------------------------------------------------------------------------

    def configure(self, policy: Policy) -> None:
        """Take the rollouts the policy defines (at start and on every reload); a changed
        definition restarts its rollout on the next :meth:`sync`."""
        definitions = {m.name: d for m in policy.models if (d := _Definition.of(m)) is not None}
        self._definitions = definitions
        self._roles = {}
        for name, d in definitions.items():
            for v in d.model.versions:
                self._roles[(name, v.label)] = (name, "canary" if v is d.canary else "baseline")
            state = self._states.get(name)
            share = state.share if state is not None and state.definition == d.digest else 0.0
            self._weights[name] = weights_for(d.model, d.canary, share)
        for name in [n for n in self._weights if n not in definitions]:
            del self._weights[name]
        if self._fixed_interval is None and definitions:
            hold = min(seconds(d.progressive.hold) for d in definitions.values())
            self.interval = min(1.0, max(0.05, hold / 5))

    # -- the hot path ------------------------------------------------------------------------

    def weights(self, model: str) -> Sequence[tuple[Version, float]] | None:
        """The model's version weights now, or None when it has no progressive version."""
        return self._weights.get(model)

    def observe(self, ctx: RequestContext) -> None:
        """Keep one finished request of a rollout's model for the next tick (call once per
        request; a dict lookup and an append: the counting runs in :meth:`tick`)."""
        if (ctx.request_model, ctx.version) in self._roles:
            self._pending.append(ctx)

    def _count(self) -> None:
        """Count the requests kept since the last tick into their windows."""
        pending, self._pending = self._pending, []
        roles, windows = self._roles, self._windows
        for ctx in pending:
            role = roles.get((ctx.request_model, ctx.version))
            if role is None or ctx.pool is None or ctx.outcome == "cancelled":
                continue  # a reload dropped the rollout; never routed; the client left
            held = windows.get(role[0])
            if held is not None:
                _add(held[1].arm(role[1], ctx.request_class or ""), ctx)

    # -- the loop ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Read the stored states (so the first request routes by them), then tick."""
        await self.tick()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis away, a bug: keep routing by the last state
                _log.warning("rollouts: tick failed: %s: %s", type(exc).__name__, exc)

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        with contextlib.suppress(Exception):
            await self.store.resign(self.replica)
        await self.store.aclose()
        if self.notifier.webhooks is not None:
            await self.notifier.webhooks.aclose()

    async def tick(self) -> None:
        """One round: reconcile, count what finished, publish, and (holding the lease)
        decide."""
        async with self._lock:
            if not self._definitions:
                return
            self.leader = await self.store.lead(self.replica, max(3 * self.interval, 1.0))
            states = [await self._reconcile(name) for name in list(self._definitions)]
            windows = [self._local(state) for state in states]  # a new step: a new window
            self._count()
            for state, window in zip(states, windows, strict=True):
                await self._publish_and_decide(state, window)

    async def sync(self) -> None:
        """Reconcile every rollout with the policy now (after a reload)."""
        async with self._lock:
            for name in list(self._definitions):
                try:
                    await self._reconcile(name)
                except Exception as exc:  # the store is away: the next tick reconciles
                    _log.warning("rollout %s: cannot reconcile after the reload yet: %s: %s",
                                 name, type(exc).__name__, exc)

    async def _publish_and_decide(self, state: RolloutState, window: Window) -> None:
        name = state.model
        ttl = max(_COUNTS_TTL, 10 * seconds(self._definitions[name].progressive.hold))
        await self.store.publish(name, state.epoch, self.replica, window.to_json(), ttl)
        if not self.leader:
            return
        merged = await self._gathered(state)
        moved, _ = decide(state, self._definitions[name].progressive, merged, self.clock(),
                          self._shadow(state), self._shadow_ttft(state))
        if moved is not None:
            await self._commit(state, moved)

    async def _reconcile(self, name: str) -> RolloutState:
        """The stored state, made if missing and restarted if its definition changed."""
        d = self._definitions[name]
        while True:
            stored = await self.store.load(name)
            if stored is not None and stored.definition == d.digest:
                self._adopt(stored)
                return stored
            reason = "definition_changed" if stored is not None else "created"
            fresh = restart(name, d.canary.label, d.digest, d.progressive.steps, self.clock(),
                            stored, reason)
            if await self.store.save(fresh, stored.revision if stored is not None else None):
                if stored is not None:
                    _log.warning("rollout %s: definition changed by a reload; the rollout "
                                 "restarts at pending (was %s at %g%%)", name, stored.phase,
                                 stored.share)
                    self.notifier.transition(fresh, d.progressive)
                self._adopt(fresh)
                return fresh

    async def _commit(self, state: RolloutState, moved: RolloutState) -> bool:
        if not await self.store.save(moved, state.revision):
            return False  # another writer (an operator) came first: the next tick re-reads
        self._adopt(moved)
        self.notifier.transition(moved, self._definitions[moved.model].progressive)
        return True

    def _adopt(self, state: RolloutState) -> None:
        """Route by ``state`` from now on."""
        old = self._states.get(state.model)
        self._states[state.model] = state
        d = self._definitions.get(state.model)
        if d is not None and (old is None or old.revision != state.revision
                              or state.model not in self._weights):
            self._weights[state.model] = weights_for(d.model, d.canary, state.share)
        self.notifier.step(state)

    def _local(self, state: RolloutState) -> Window:
        held = self._windows.get(state.model)
        if held is None or held[0] != state.epoch:
            held = self._windows[state.model] = (state.epoch, Window())
        return held[1]

    async def _gathered(self, state: RolloutState) -> Window:
        merged = Window()
        for data in await self.store.gather(state.model, state.epoch):
            merged.merge(Window.from_json(data))
        return merged

    def _shadow(self, state: RolloutState) -> tuple[int, int] | None:
        """(agreed, compared) of the canary's shadow comparisons in the current window: the
        source counts since its process started, so the reading at the window's start is
        taken off. None while nothing was compared in the window."""
        source = self._agreement()
        reading = source.agreement(state.model, state.version) if source is not None else None
        if reading is None:
            return None
        base = self._agreement_base.get(state.model)
        if base is None or base[0] != state.epoch:
            base = self._agreement_base[state.model] = (state.epoch, reading)
        agreed, compared = reading[0] - base[1][0], reading[1] - base[1][1]
        return (agreed, compared) if compared > 0 else None

    def _shadow_ttft(self, state: RolloutState) -> tuple[Histogram, Histogram] | None:
        """(shadow, primary) TTFT histograms of the canary's comparisons since the window
        began, at a shadow stage (None elsewhere, or when the source keeps no times)."""
        if state.phase is not Phase.PROGRESSING or state.steps[state.step] != 0:
            return None
        source = self._agreement()
        if source is None:
            return None
        primary, shadow = source.ttfts(state.model, state.version, state.since)
        shadow_hist, primary_hist = Histogram(), Histogram()
        for value in shadow:
            shadow_hist.add(value)
        for value in primary:
            primary_hist.add(value)
        return shadow_hist, primary_hist

    # -- operators ---------------------------------------------------------------------------

    def models(self) -> list[str]:
        return sorted(self._definitions)

    async def state(self, model: str) -> RolloutState:
        if model not in self._definitions:
            raise UnknownRollout(model)
        async with self._lock:
            return await self._reconcile(model)

    async def view(self, model: str) -> dict[str, Any]:
        """The rollout with its current window's counts and gate figures."""
        if model not in self._definitions:
            raise UnknownRollout(model)
        routed = self._states.get(model)  # what this replica routed by as the call came in
        state = await self.state(model)
        local = routed or state
        d = self._definitions[model]
        window = await self._gathered(state)
        results = (evaluate_shadow(d.progressive, self._shadow(state), self._shadow_ttft(state))
                   if state.phase is Phase.PROGRESSING and state.steps[state.step] == 0
                   else evaluate(d.progressive, window, self._shadow(state)))
        return {**summary(state, d.progressive, self.clock()),
                "requests": {"canary": window.requests("canary"),
                             "baseline": window.requests("baseline")},
                "gates": [r.to_json() for r in results], "history": state.history,
                "store": self.store.kind, "leader": self.leader, "replica": self.replica,
                # what this replica routes by (read back from the store every tick)
                "routing": {"revision": local.revision, "share": local.share}}

    async def act(self, model: str, action: str, by: str) -> RolloutState:
        """Apply an operator's action (:class:`InvalidAction` if it does not apply now)."""
        if model not in self._definitions:
            raise UnknownRollout(model)
        async with self._lock:
            for _ in range(10):
                state = await self._reconcile(model)
                moved = act(state, action, self.clock(), by)
                if await self._commit(state, moved):
                    return moved
        raise InvalidAction(f"the rollout of {model!r} kept changing; try again")

    async def listing(self) -> list[dict[str, Any]]:
        rows = []
        for name in self.models():
            state = await self.state(name)
            rows.append(summary(state, self._definitions[name].progressive, self.clock()))
        return rows


def _add(arm: Arm, ctx: RequestContext) -> None:
    """One request into its arm: an error (5xx, a stream broken after the first byte, a
    failed first attempt), its TTFT, output tokens and, for a stream, its TPOT."""
    arm.requests += 1
    if ctx.status >= 500 or ctx.attempts > 1 or (ctx.response_started
                                                 and ctx.outcome == "failed"):
        arm.errors += 1
    first = ctx.first_token_ns
    if first is not None:
        arm.ttft.add((first - ctx.started_ns) / 1e9)
    usage = ctx.usage
    if usage is not None:
        out = usage.output
        arm.token_n += 1
        arm.tokens += out
        arm.tokens_sq += out * out
        if ctx.stream and first is not None and out > 1 and ctx.last_chunk_ns is not None:
            arm.tpot.add((ctx.last_chunk_ns - first) / 1e9 / (out - 1))


def summary(state: RolloutState, progressive: Progressive, now: float) -> dict[str, Any]:
    """The short form of a rollout (``gateway rollout list``)."""
    return {"model": state.model, "version": state.version, "phase": str(state.phase),
            "step": state.step, "steps": state.steps, "share": state.share,
            "since": state.since, "in_step_s": round(max(0.0, now - state.since), 3),
            "hold_s": seconds(progressive.hold), "min_requests": progressive.min_requests,
            "epoch": state.epoch, "revision": state.revision}


