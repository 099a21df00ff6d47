"""Weighted fair queuing of a pool's waiters between flows (tenants), inside class priority.

A pool's queue has one *level* per class priority (a lower number is served first, always),
and inside a level one queue per *flow* (a tenant, or one flow for all when the pool is not
fair) ordered by deadline, then arrival. Between the flows of a level the order is start-time
fair queuing (SFQ: Goyal, Vin and Cheng, 1996), weighted fair queuing's variant that needs no
simulated fluid system:

- a request's tags are ``start`` and ``finish = start + cost / weight``, where ``cost`` is its
  estimated prompt + output tokens; ``start`` is the larger of the level's virtual time and the
  finish tag of its flow's previous request;
- the flow head with the smallest start tag is served next, and the level's virtual time
  becomes that start tag.

So each backlogged flow is served tokens in proportion to its weight (to within one request's
cost per flow), and a flow that was idle starts at the current virtual time: it banks no credit
while idle, and nothing is held for it, so a flow alone gets the whole pool. Serving by start
tag (rather than finish, as WFQ does) lets a light flow's request go at the next free slot
beside a flood, instead of after one more of the flood's. Tags are charged only on service: a
waiter that leaves unserved (its deadline, its client) costs its flow nothing. An empty flow's
last finish tag is kept only while it is ahead of the virtual time, so memory follows what is
queued.

A flood still keeps every backend slot busy, so a light flow's request, first in the queue,
waits for the flood's next completion, which it never does alone. :class:`SlotShares` counts
the slots each flow holds, so the pool can give a flow below its weighted share of them a
slot of *headroom* above a full backend's limit (``fair_headroom``), which the flood (above
its share) never gets.

The queue's places are shared the same way: :func:`push_out` says, when the queue is full,
whose waiter gives its place to a newcomer (longest queue drop, weighted: the flow with the
most waiters per unit of weight gives way, and the newcomer is refused when that is its own).
Nothing is held for an idle flow: a flow alone fills the whole queue, and a second one takes
its share from the first's excess, so a flood refuses only the flood.

Pure: no clock, no I/O, no asyncio; :class:`~gateway.routing.pool.PoolState` puts its waiters
here and asks for the next one.
"""

from __future__ import annotations

import heapq
import itertools
import math
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping

__all__ = ["FairQueue", "SlotShares", "push_out"]

T = TypeVar("T")


class _Flow(Generic[T]):
    """One flow's waiters in a level, ordered by ``order`` (deadline, then arrival)."""

    __slots__ = ("entries", "queued_cost", "start", "version")

    def __init__(self, start: float) -> None:
        self.entries: list[tuple[Any, float, T]] = []  # (order, cost / weight, item): a heap
        #: start tag of its head: the finish tag of its last served waiter, or the virtual
        #: time when it became backlogged
        self.start = start
        self.queued_cost = 0.0  # sum of cost / weight of its entries
        self.version = -1  # the heap entry of its current head; any other entry is stale


class _Level(Generic[T]):
    """One class priority: its virtual time, its flows, and a heap of their heads' tags."""

    __slots__ = ("finished", "flows", "heads", "prune_at", "vtime")

    def __init__(self) -> None:
        self.vtime = 0.0
        self.flows: dict[str, _Flow[T]] = {}
        self.heads: list[tuple[float, int, str]] = []  # (start, version, flow)
        #: finish tags of flows with nothing queued, while ahead of the virtual time
        self.finished: dict[str, float] = {}
        self.prune_at = 64  # size of ``finished`` that triggers dropping the paid ones


class FairQueue(Generic[T]):
    """Waiters by class priority, then weighted fair share of tokens between flows.

    ``first(alive)`` gives the waiter to serve next (dropping waiters ``alive`` says are gone);
    ``pop_first()`` then takes it and charges its flow. Iterating yields every waiter held,
    gone ones included until they are dropped.
    """

    __slots__ = ("_current", "_levels", "_tie")

    def __init__(self) -> None:
        self._levels: dict[int, _Level[T]] = {}
        self._tie = itertools.count()
        self._current: tuple[int, str] | None = None  # (level, flow) of what first() gave

    def push(self, item: T, *, level: int, order: Any, flow: str, weight: float,
             cost: float) -> None:
        """Queue ``item``; ``order`` (unique, comparable) orders it inside its flow."""
        lv = self._levels.get(level)
        if lv is None:
            lv = self._levels[level] = _Level()
        f = lv.flows.get(flow)
        if f is None:
            # newly backlogged: at the virtual time, or its last finish if still ahead of it
            f = lv.flows[flow] = _Flow(max(lv.vtime, lv.finished.pop(flow, 0.0)))
        share = max(cost, 1.0) / weight
        entry = (order, share, item)
        heapq.heappush(f.entries, entry)
        f.queued_cost += share
        if f.entries[0] is entry:  # a new head (first, or earlier than the old head): it
            self._new_head(lv, flow, f, f.start)  # takes the old head's place and start
        self._current = None

    def first(self, alive: Callable[[T], bool]) -> T | None:
        """The waiter to serve next, or None; waiters not ``alive`` are dropped on the way."""
        while self._levels:
            level = min(self._levels)
            lv = self._levels[level]
            while lv.heads:
                _, version, name = lv.heads[0]
                f = lv.flows.get(name)
                if f is None or f.version != version:
                    heapq.heappop(lv.heads)  # stale: the flow's head changed since
                    continue
                item = f.entries[0][2]
                if alive(item):
                    self._current = (level, name)
                    return item
                self._drop_head(lv, name, f, served=False)
            del self._levels[level]
        self._current = None
        return None

    def first_where(self, alive: Callable[[T], bool], wanted: Callable[[T], bool]) -> T | None:
        """Like :meth:`first`, but among the flows whose head ``wanted`` accepts, in the first
        level only (so never a lower class before a higher one): the one with the smallest
        start tag. For what only some flows may take (the pool's headroom), which the flows
        before them would not get anyway. :meth:`pop_first` takes it."""
        self._current = None
        if not self._levels:
            return None
        level = min(self._levels)
        lv = self._levels[level]
        best: tuple[tuple[float, int], str, T] | None = None
        for name, f in list(lv.flows.items()):
            while f.entries and not alive(f.entries[0][2]):
                self._drop_head(lv, name, f, served=False)
            if not f.entries:
                continue
            item = f.entries[0][2]
            if (best is None or (f.start, f.version) < best[0]) and wanted(item):
                best = ((f.start, f.version), name, item)
        if not lv.flows:
            del self._levels[level]
        if best is None:
            return None
        self._current = (level, best[1])
        return best[2]

    def pop_first(self) -> T:
        """Take the waiter :meth:`first` (or :meth:`first_where`) just gave, charge its flow,
        advance virtual time."""
        if self._current is None:
            raise LookupError("pop_first() without a waiter from first()")
        level, name = self._current
        self._current = None
        lv = self._levels[level]
        f = lv.flows[name]
        item = f.entries[0][2]
        self._drop_head(lv, name, f, served=True)
        if not lv.flows:  # all idle: dropping the level forgets at most one request's
            del self._levels[level]  # debt per flow, with nobody waiting
        return item

    def ahead_of(self, *, level: int, flow: str) -> int:
        """About how many queued waiters a new one of ``flow`` would be served after: all of
        the levels before its own, and in its own those whose start tags would be smaller
        (its own size does not move its start). A flow's later waiters are taken to be
        spaced by its mean cost per waiter."""
        ahead = sum(len(f.entries) for key, other in self._levels.items() if key < level
                    for f in other.flows.values())
        lv = self._levels.get(level)
        if lv is None:
            return ahead
        own = lv.flows.get(flow)
        if own is None:
            tag = max(lv.vtime, lv.finished.get(flow, 0.0))
        else:
            ahead += len(own.entries)
            tag = own.start + own.queued_cost  # its start: after all of its flow's queued
        for name, f in lv.flows.items():
            if name == flow or not f.entries:
                continue
            spacing = f.queued_cost / len(f.entries)
            if tag >= f.start:  # its waiters start at f.start, f.start + spacing, ...
                ahead += min(len(f.entries), 1 + math.floor((tag - f.start) / spacing))
        return ahead

    def of_flow(self, flow: str) -> Iterator[T]:
        """The waiters held for ``flow``, in every level (gone ones too until dropped)."""
        for lv in self._levels.values():
            f = lv.flows.get(flow)
            if f is not None:
                for _, _, item in f.entries:
                    yield item

    def vtime(self, level: int) -> float:
        """The level's virtual time (0 for a level with nothing queued)."""
        lv = self._levels.get(level)
        return lv.vtime if lv is not None else 0.0

    def flows(self, level: int) -> int:
        """Flows with something queued in ``level``."""
        lv = self._levels.get(level)
        return len(lv.flows) if lv is not None else 0

    def __iter__(self) -> Iterator[T]:
        for lv in self._levels.values():
            for f in lv.flows.values():
                for _, _, item in f.entries:
                    yield item

    def __len__(self) -> int:
        return sum(len(f.entries) for lv in self._levels.values() for f in lv.flows.values())

    def __bool__(self) -> bool:
        return bool(self._levels)

    def __repr__(self) -> str:
        levels = ", ".join(f"{k}: {len(lv.flows)} flows @ {lv.vtime:.0f}"
                           for k, lv in sorted(self._levels.items()))
        return f"<FairQueue [{levels}]>"

    # --- heads
    def _new_head(self, lv: _Level[T], name: str, f: _Flow[T], start: float) -> None:
        f.version = next(self._tie)  # unique across flows, old and new: older entries stale
        f.start = start
        heapq.heappush(lv.heads, (start, f.version, name))

    def _drop_head(self, lv: _Level[T], name: str, f: _Flow[T], *, served: bool) -> None:
        """Remove the flow's head: served (charged: virtual time moves to its start, and the
        flow's next starts at its finish) or gone (free: the next takes its start)."""
        _, share, _ = heapq.heappop(f.entries)
        f.queued_cost -= share
        start = f.start
        if served:
            lv.vtime = max(lv.vtime, start)
            start += share  # its finish tag
        if f.entries:
            self._new_head(lv, name, f, start)
            return
        del lv.flows[name]
        if start > lv.vtime:
            lv.finished[name] = start  # a debt to pay if it comes back soon
        if len(lv.finished) > lv.prune_at:  # forget the paid ones (amortised: the bound
            vtime = lv.vtime  # doubles past what is still owed)
            lv.finished = {n: t for n, t in lv.finished.items() if t > vtime}
            lv.prune_at = 2 * len(lv.finished) + 64


class SlotShares:
    """Backend slots held per flow, and whether a flow holds less than its weighted share.

    A flow's share of ``capacity`` slots is ``capacity * weight / (its weight + the weights of
    the other flows sharing the pool)``: the flows holding slots, and those that gave back
    their last one less than ``linger`` seconds ago. The flows gone longer are left out, as
    they take nothing from it. A flow alone therefore has all of the capacity as its share,
    and is never below it while it holds all of it.

    The linger is for a light tenant whose requests come one at a time (an interactive
    tenant at a few requests a second holds nothing for a moment between them every few
    seconds): the flows above their share stay paced (``fair_stagger``) across that moment,
    so its next request finds one backend clear of their prefills instead of the whole pool
    handed back to them a moment earlier.
    """

    __slots__ = ("_held", "_lingering", "_weights", "linger")

    def __init__(self, linger: float = 0.0) -> None:
        self._held: dict[str, tuple[int, float]] = {}  # flow -> (slots, weight when it took one)
        #: flows holding none that still count: flow -> (weight, monotonic time they stop)
        self._lingering: dict[str, tuple[float, float]] = {}
        self._weights = 0.0  # sum of the weights in ``_held`` and ``_lingering``
        self.linger = linger

    def take(self, flow: str, weight: float) -> None:
        """``flow`` got a slot."""
        slots, w = self._held.get(flow, (0, weight))
        if not slots:
            lingered = self._lingering.pop(flow, None)
            if lingered is not None:
                self._weights -= lingered[0]
            self._weights += w
        self._held[flow] = (slots + 1, w)

    def give_back(self, flow: str, now: float) -> None:
        """``flow`` freed a slot (one it took: a flow holding none is left alone) at ``now``
        (monotonic seconds): its last one starts its linger."""
        slots, w = self._held.get(flow, (0, 0.0))
        if slots > 1:
            self._held[flow] = (slots - 1, w)
        elif slots == 1:
            del self._held[flow]
            if self.linger > 0:
                self._lingering[flow] = (w, now + self.linger)
            else:
                self._drop(w)

    def expire(self, now: float) -> None:
        """Leave out the flows whose linger ended by ``now``."""
        if not self._lingering:
            return
        for flow in [f for f, (_, until) in self._lingering.items() if until <= now]:
            self._drop(self._lingering.pop(flow)[0])

    def _drop(self, weight: float) -> None:
        # summed floats drift: with no flow left the sum is exactly zero
        if self._held or self._lingering:
            self._weights = max(0.0, self._weights - weight)
        else:
            self._weights = 0.0

    def others(self, flow: str) -> bool:
        """Does a flow other than ``flow`` share the pool (hold slots, or linger)?"""
        mine = flow in self._held or flow in self._lingering
        return len(self._held) + len(self._lingering) > mine

    def weight(self, flow: str) -> float:
        """The weight ``flow`` took its slots with (1 when it holds none)."""
        return self._held.get(flow, (0, 1.0))[1]

    def held(self, flow: str) -> int:
        """Slots ``flow`` holds."""
        return self._held.get(flow, (0, 0.0))[0]

    def below_share(self, flow: str, weight: float, capacity: int) -> bool:
        """Does ``flow`` (of ``weight``) hold fewer slots than its share of ``capacity``?"""
        slots, w = self._held.get(flow, (0, 0.0))
        if not slots:
            w = self._lingering.get(flow, (0.0, 0.0))[0]
        return slots < capacity * weight / (weight + max(0.0, self._weights - w))

    def __repr__(self) -> str:
        flows = ", ".join(f"{name}: {slots}" for name, (slots, _) in sorted(self._held.items()))
        lingering = f" lingering [{', '.join(sorted(self._lingering))}]" if self._lingering else ""
        return f"<SlotShares [{flows}]{lingering}>"


def push_out(waiting: Mapping[str, tuple[int, float]], flow: str, weight: float) -> str | None:
    """A full queue and a newcomer of ``flow`` (of ``weight``): the flow whose last waiter gives
    its place to the newcomer, or None when the newcomer is refused.

    ``waiting``: each flow's waiters and weight. The flow with the most waiters per unit of
    weight, the newcomer counted in its own, gives way (longest queue drop); a tie with the
    newcomer's own flow refuses the newcomer, so equals never push each other out in turn.

    A bound on the whole queue alone lets one flow's flood refuse every other flow's request
    while it holds every place; this one refuses only the flows over their weighted share.
    A newcomer whose flow stays within its share of the places (the queue's size times its
    weight over the weights of the flows waiting, its own included) is always let in: the
    places are all taken, so some other flow holds more than its share, and more per unit of
    weight than the newcomer's. A flow alone is over no one's share: it may fill the queue.
    """
    mine = (waiting.get(flow, (0, weight))[0] + 1) / weight
    victim: str | None = None
    most = mine
    for name, (count, w) in waiting.items():
        if name != flow and count / w > most:
            victim, most = name, count / w
    return victim
