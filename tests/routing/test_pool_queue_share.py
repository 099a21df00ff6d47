"""The pool queue's bound per tenant share (issue 34, point 6): one tenant filling the queue
refuses only itself once another tenant waits, and a request takes a slot free for it before
the queue's length can refuse it. Before, ``queue_size`` bounded the whole queue: a flood that
filled it had every other tenant refused 503 "queue is full" at once, beside free headroom."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from typing import Any

import pytest

from gateway.config import Backend, Pool
from gateway.routing.backend import BackendState
from gateway.routing.errors import PoolSaturated
from gateway.routing.fair import push_out
from gateway.routing.pool import PoolState

FAR = 600.0  # seconds: a start deadline no request here reaches


def _pool(n: int = 1, max_in_flight: int = 1, **kw: object) -> PoolState:
    return PoolState(Pool(name="p", backends=[
        Backend(url=f"http://b{i}", max_in_flight=max_in_flight) for i in range(n)
    ], **kw))  # type: ignore[arg-type]


def _ask(pool: PoolState, tenant: str, weight: float = 1.0) -> asyncio.Task[BackendState]:
    return asyncio.create_task(pool.acquire(0, time.monotonic() + FAR, tenant=tenant,
                                            weight=weight, tokens=500))


def _refused(tasks: Sequence[asyncio.Task[Any]]) -> list[str]:
    """The messages of the tasks refused with :class:`PoolSaturated` so far."""
    return [str(t.exception()) for t in tasks
            if t.done() and isinstance(t.exception(), PoolSaturated)]


def _waiting(tasks: Sequence[asyncio.Task[Any]]) -> int:
    return sum(1 for t in tasks if not t.done())


# --- the decision alone
def test_a_flow_alone_fills_the_queue_and_is_refused_beyond_it() -> None:
    assert push_out({"a": (16, 1.0)}, "a", 1.0) is None


def test_a_newcomer_takes_the_place_of_the_longest_flow() -> None:
    assert push_out({"a": (16, 1.0)}, "b", 1.0) == "a"
    assert push_out({"a": (10, 1.0), "b": (6, 1.0)}, "c", 1.0) == "a"
    assert push_out({"a": (9, 1.0), "b": (7, 1.0)}, "b", 1.0) == "a"  # b's 8th: within half


def test_equals_do_not_push_each_other_out() -> None:
    """At their shares, each tenant's next is refused (the tie goes against the newcomer)."""
    assert push_out({"a": (8, 1.0), "b": (8, 1.0)}, "a", 1.0) is None
    assert push_out({"a": (8, 1.0), "b": (8, 1.0)}, "b", 1.0) is None
    assert push_out({f"t{i}": (1, 1.0) for i in range(16)}, "new", 1.0) is None


def test_shares_follow_weights() -> None:
    """B of weight 3 beside A of weight 1 in 16 places: B's share is 12, A's 4."""
    waiting = {"a": (8, 1.0), "b": (8, 3.0)}
    assert push_out(waiting, "b", 3.0) == "a"
    assert push_out(waiting, "a", 1.0) is None
    assert push_out({"a": (4, 1.0), "b": (12, 3.0)}, "b", 3.0) is None  # at its share
    assert push_out({"a": (4, 1.0), "b": (12, 3.0)}, "a", 1.0) is None


def test_a_newcomer_within_its_share_is_always_let_in() -> None:
    """Random full queues: whenever the newcomer's flow, its request counted, is within its
    weighted share of the places, some other flow gives way; else nobody is pushed out for
    a flow over its share."""
    rng = random.Random(34)
    for _ in range(5000):
        size = rng.randint(1, 64)
        flows = [f"t{i}" for i in range(rng.randint(1, 6))]
        weights = {f: rng.choice((0.5, 1.0, 2.0, 3.0)) for f in flows}
        counts = dict.fromkeys(flows, 0)
        for _ in range(size):
            counts[rng.choice(flows)] += 1
        waiting = {f: (n, weights[f]) for f, n in counts.items() if n}
        newcomer = rng.choice([*flows, "new"])
        weight = weights.get(newcomer, 1.0)
        total = weight + sum(w for f, (_, w) in waiting.items() if f != newcomer)
        mine = waiting.get(newcomer, (0, weight))[0] + 1
        victim = push_out(waiting, newcomer, weight)
        if mine <= size * weight / total:
            assert victim is not None and victim != newcomer
        if victim is not None:
            n, w = waiting[victim]
            assert n / w > mine / weight  # only a flow further over its share gives way


# --- in a pool
async def test_flood_fills_the_queue_only_until_another_tenant_waits() -> None:
    """A holds all 4 slots and sends 40 more: 16 wait (``queue_size``), 24 are refused. B
    then sends 8 (its share of 16 beside A): all 8 wait, each in the place of one of A's, and
    are all served; A's and B's next requests are refused, each for its own tenant's share.
    No headroom: the queue alone. Before, B's 8 were refused "queue is full" at once."""
    pool = _pool(n=2, max_in_flight=2, queue_size=16, fair_headroom=0)
    held: list[tuple[BackendState, str]] = []

    async def client(tenant: str) -> BackendState:
        backend = await pool.acquire(0, time.monotonic() + FAR, tenant=tenant, tokens=500)
        held.append((backend, tenant))
        return backend

    for _ in range(4):
        await client("a")
    flood = [asyncio.create_task(client("a")) for _ in range(40)]
    await asyncio.sleep(0.01)
    assert pool.queued == 16 and _waiting(flood) == 16
    assert len(_refused(flood)) == 24
    assert all("queue is full" in m for m in _refused(flood))

    b = [asyncio.create_task(client("b")) for _ in range(8)]
    await asyncio.sleep(0.01)
    assert _waiting(b) == 8, _refused(b)
    assert pool.queued == 16 and _waiting(flood) == 8  # A's excess gave its places
    pushed = [m for m in _refused(flood) if "place went to another tenant's" in m]
    assert len(pushed) == 8 and len(_refused(flood)) == 32

    more_a, more_b = _ask(pool, "a"), _ask(pool, "b")  # each at its share: only it refused
    await asyncio.sleep(0.01)
    for late in (more_a, more_b):
        with pytest.raises(PoolSaturated, match="queue is full"):
            await late
    assert pool.queued == 16

    # serve: free one slot at a time until every waiter started
    while _waiting(b) or _waiting(flood):
        while not held:
            await asyncio.sleep(0)
        backend, tenant = held.pop(0)
        pool.release(backend, tenant)
        await asyncio.sleep(0)
    assert not _refused(b)  # B's 8 all served
    assert len(_refused(flood)) == 32  # and A's 8 that kept their places
    assert pool.queued == 0


async def test_a_free_headroom_slot_goes_before_a_full_queue_refuses() -> None:
    """One slot held by A, A's 20 more: 16 wait, 4 refused. B's request, below its share,
    takes a ``fair_headroom`` slot at once, without pushing any of A's out; A's next is still
    refused. Before, B was refused "queue is full" beside the free headroom."""
    pool = _pool(queue_size=16, fair_headroom=2)
    await pool.acquire(0, time.monotonic() + FAR, tenant="a")
    flood = [_ask(pool, "a") for _ in range(20)]
    await asyncio.sleep(0.01)
    assert pool.queued == 16 and len(_refused(flood)) == 4

    got = await asyncio.wait_for(pool.acquire(0, time.monotonic() + FAR, tenant="b"), 5)
    assert got is pool.backends[0] and pool.headroom_in_use == 1
    assert pool.queued == 16 and _waiting(flood) == 16  # nobody lost a place for it
    with pytest.raises(PoolSaturated, match="queue is full"):
        await pool.acquire(0, time.monotonic() + FAR, tenant="a")
    for task in flood:
        task.cancel()
    await asyncio.gather(*flood, return_exceptions=True)


async def test_no_queue_still_gives_headroom() -> None:
    """``queue_size: 0``: nothing waits, yet B below its share takes a headroom slot beside
    A's; A, at its share, is refused."""
    pool = _pool(queue_size=0, fair_headroom=1)
    await pool.acquire(0, time.monotonic() + FAR, tenant="a")
    with pytest.raises(PoolSaturated, match="queue is full"):
        await pool.acquire(0, time.monotonic() + FAR, tenant="a")
    got = await pool.acquire(0, time.monotonic() + FAR, tenant="b")
    assert got is pool.backends[0] and pool.headroom_in_use == 1


async def test_without_fair_the_full_queue_refuses_everyone() -> None:
    """``fair: false`` (one flow for all): the bound is the whole queue's, as documented."""
    pool = _pool(queue_size=4, fair=False)
    await pool.acquire(0, time.monotonic() + FAR, tenant="a")
    flood = [_ask(pool, "a") for _ in range(4)]
    await asyncio.sleep(0.01)
    with pytest.raises(PoolSaturated, match="queue is full"):
        await pool.acquire(0, time.monotonic() + FAR, tenant="b")
    assert _waiting(flood) == 4
    for task in flood:
        task.cancel()
    await asyncio.gather(*flood, return_exceptions=True)


async def test_waiting_counts_follow_every_way_out() -> None:
    """The per-tenant counts the bound reads are kept as waiters come and go: served, past
    their deadline, pushed out, refused, cancelled (also a cancelled flood whose tasks have
    not run yet: its places are free, nobody is pushed out for them); zero at the end."""
    pool = _pool(queue_size=4, fair_headroom=0)
    held: list[tuple[BackendState, str]] = []

    async def client(tenant: str, wait: float = FAR) -> None:
        backend = await pool.acquire(0, time.monotonic() + wait, tenant=tenant, tokens=500)
        held.append((backend, tenant))

    await client("x")
    a = [asyncio.create_task(client("a")) for _ in range(4)]
    await asyncio.sleep(0.01)
    assert (pool._waiting, pool._flows) == (4, {"a": (4, 1.0)})
    for task in a:
        task.cancel()  # their tasks have not run since: still counted
    b = asyncio.create_task(client("b"))
    await asyncio.sleep(0.01)
    assert not b.done() and (pool._waiting, pool._flows) == (1, {"b": (1, 1.0)})
    late = asyncio.create_task(client("c", 0.05))
    d = [asyncio.create_task(client("d")) for _ in range(3)]  # the third: d over its share
    await asyncio.sleep(0.01)
    assert pool._flows == {"b": (1, 1.0), "c": (1, 1.0), "d": (2, 1.0)}
    e = asyncio.create_task(client("e"))  # pushes out one of d's (the longest)
    await asyncio.sleep(0.01)
    assert pool._flows == {"b": (1, 1.0), "c": (1, 1.0), "d": (1, 1.0), "e": (1, 1.0)}
    assert len(_refused(d)) == 2  # one refused on arrival, one pushed out
    with pytest.raises(PoolSaturated, match="before the request's deadline"):
        await late
    assert pool._waiting == pool.queued == 3 and "c" not in pool._flows
    while pool.queued:  # serve the rest, one slot at a time
        while not held:
            await asyncio.sleep(0)
        backend, tenant = held.pop(0)
        pool.release(backend, tenant)
        await asyncio.sleep(0)
    await asyncio.gather(*a, b, *d, e, return_exceptions=True)
    assert (pool._waiting, pool._flows, pool.queued) == (0, {}, 0)
