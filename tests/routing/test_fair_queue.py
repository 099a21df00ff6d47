"""The fair queue alone: weighted shares between backlogged flows, no credit for idle flows,
class levels before flows, deadline order inside a flow, waiters that leave cost nothing."""

from __future__ import annotations

import random

import pytest

from gateway.routing import fair
from gateway.routing.fair import FairQueue, SlotShares


def _alive(_: object) -> bool:
    return True


def _serve(q: FairQueue[str], n: int) -> list[str]:
    out: list[str] = []
    for _ in range(n):
        if q.first(_alive) is None:
            break
        out.append(q.pop_first())
    return out


class _Order:
    """Unique, comparable order keys (deadline, arrival) like the pool's."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, deadline: float = 0.0) -> tuple[float, int]:
        self.n += 1
        return (deadline, self.n)


def test_exported_names() -> None:
    assert fair.__all__ == ["FairQueue", "SlotShares", "push_out"]


@pytest.mark.parametrize(("weights", "costs"), [
    pytest.param({"a": 1.0, "b": 1.0}, (100, 2000), id="equal-weights"),
    pytest.param({"a": 3.0, "b": 1.0}, (100, 2000), id="three-to-one"),
    pytest.param({"a": 1.0, "b": 2.0, "c": 5.0}, (10, 4000), id="three-tenants"),
    pytest.param({"a": 0.5, "b": 1.0, "c": 1.0, "d": 4.0}, (500, 600), id="four-tenants"),
])
def test_backlogged_flows_get_their_weight_share(weights: dict[str, float],
                                                 costs: tuple[int, int]) -> None:
    """Seeded random sizes, every flow kept backlogged: over a long run each flow is served
    tokens within 10% of its weight's share (the property of issue #18)."""
    for seed in range(5):
        rng = random.Random(seed)
        q: FairQueue[tuple[str, int]] = FairQueue()
        order = _Order()
        served = dict.fromkeys(weights, 0)
        for name in weights:
            for _ in range(20):
                _push_random(q, rng, order, name, weights[name], costs)
        for _ in range(5000):
            assert q.first(_alive) is not None
            name, cost = q.pop_first()
            served[name] += cost
            _push_random(q, rng, order, name, weights[name], costs)  # stays backlogged
        total = sum(served.values())
        for name, w in weights.items():
            share = w / sum(weights.values())
            assert abs(served[name] / total - share) <= 0.1 * share, (seed, served)


def _push_random(q: FairQueue[tuple[str, int]], rng: random.Random, order: _Order, name: str,
                 weight: float, costs: tuple[int, int]) -> None:
    cost = rng.randint(*costs)
    q.push((name, cost), level=0, order=order(), flow=name, weight=weight, cost=cost)


def test_flow_alone_gets_everything() -> None:
    """One flow, whatever its weight, is served every time: nothing is held for others."""
    q: FairQueue[str] = FairQueue()
    order = _Order()
    for i in range(50):
        q.push(f"a{i}", level=0, order=order(), flow="a", weight=0.01, cost=1000)
    assert _serve(q, 100) == [f"a{i}" for i in range(50)]
    assert not q


def test_idle_flow_banks_no_credit() -> None:
    """B idle while A is served for a long time: when B comes back it alternates with A
    (same cost, same weight) instead of taking the pool for as long as it was away."""
    q: FairQueue[str] = FairQueue()
    order = _Order()
    for i in range(200):
        q.push(f"a{i}", level=0, order=order(), flow="a", weight=1, cost=100)
    _serve(q, 100)  # only A asked meanwhile
    for i in range(20):
        q.push(f"b{i}", level=0, order=order(), flow="b", weight=1, cost=100)
    nxt = _serve(q, 20)
    assert 9 <= sum(x.startswith("b") for x in nxt) <= 11


def test_flow_that_empties_and_comes_back_keeps_its_place() -> None:
    """B keeps one request queued at a time and sends the next the moment one is served (a
    closed loop of one): its queue empties each time, yet it gets half, not all, beside a
    backlogged A - its last finish tag is remembered while ahead of the virtual time."""
    q: FairQueue[str] = FairQueue()
    order = _Order()
    for i in range(400):
        q.push(f"a{i}", level=0, order=order(), flow="a", weight=1, cost=100)
    q.push("b", level=0, order=order(), flow="b", weight=1, cost=100)
    served = []
    for _ in range(200):
        assert q.first(_alive) is not None
        served.append(q.pop_first())
        if served[-1] == "b":
            q.push("b", level=0, order=order(), flow="b", weight=1, cost=100)
    assert 95 <= served.count("b") <= 105


def test_new_flow_is_served_next_beside_a_flood() -> None:
    """A flood of A queued first; one request of B is served next (start tags: B's is the
    virtual time, A's next is past it)."""
    q: FairQueue[str] = FairQueue()
    order = _Order()
    for i in range(1000):
        q.push(f"a{i}", level=0, order=order(), flow="a", weight=1, cost=300)
    _serve(q, 10)
    q.push("b0", level=0, order=order(), flow="b", weight=1, cost=300)
    assert _serve(q, 1) == ["b0"]


def test_levels_before_flows() -> None:
    """A lower level (class priority) is served first, whatever the flows' tags."""
    q: FairQueue[str] = FairQueue()
    order = _Order()
    for i in range(5):
        q.push(f"batch{i}", level=10, order=order(), flow="a", weight=100, cost=1)
    q.push("interactive", level=0, order=order(), flow="b", weight=0.01, cost=100_000)
    assert _serve(q, 1) == ["interactive"]


def test_inside_a_flow_by_order() -> None:
    """Inside a flow the order key decides (deadline, then arrival), not arrival alone."""
    q: FairQueue[str] = FairQueue()
    q.push("late", level=0, order=(9.0, 1), flow="a", weight=1, cost=10)
    q.push("soon", level=0, order=(1.0, 2), flow="a", weight=1, cost=10)
    q.push("mid", level=0, order=(5.0, 3), flow="a", weight=1, cost=10)
    assert _serve(q, 3) == ["soon", "mid", "late"]


def test_gone_waiters_are_skipped_and_cost_nothing() -> None:
    """Waiters that left (timed out) are dropped on the way and not charged: A, whose first
    nine left, is not pushed behind B for them."""
    q: FairQueue[str] = FairQueue()
    order = _Order()
    gone = {f"a{i}" for i in range(9)}
    for i in range(10):
        q.push(f"a{i}", level=0, order=order(), flow="a", weight=1, cost=100)
    for i in range(10):
        q.push(f"b{i}", level=0, order=order(), flow="b", weight=1, cost=100)
    out = []
    for _ in range(3):
        assert q.first(lambda x: x not in gone) is not None
        out.append(q.pop_first())
    assert out[:2] in (["a9", "b0"], ["b0", "a9"])
    assert len(q) == 8  # 20 queued, 9 dropped, 3 served


def test_state_follows_what_is_queued() -> None:
    """Flows and levels are forgotten once empty: thousands of one-off tenants leave nothing."""
    q: FairQueue[str] = FairQueue()
    order = _Order()
    for i in range(5000):
        q.push(f"t{i}", level=i % 3, order=order(), flow=f"t{i}", weight=1, cost=10)
    assert q.flows(0) > 1000
    assert len(_serve(q, 10_000)) == 5000
    assert q.flows(0) == 0
    assert repr(q) == "<FairQueue []>"


def test_remembered_finish_tags_stay_bounded() -> None:
    """Beside a backlogged tenant, 20,000 one-off tenants come and go: the finish tags kept
    for returning tenants are dropped once the virtual time passes them."""
    q: FairQueue[str] = FairQueue()
    order = _Order()
    for i in range(10):  # A stays backlogged: the level (and its memory) lives on
        q.push(f"a-{i}", level=0, order=order(), flow="a", weight=1, cost=100)
    for i in range(20_000):
        q.push(f"a{i}", level=0, order=order(), flow="a", weight=1, cost=100)
        q.push(f"t{i}", level=0, order=order(), flow=f"t{i}", weight=1, cost=100)
        _serve(q, 2)
        assert len(q._levels[0].finished) <= 200  # the bound under test (a private field)
    assert q.flows(0) == 1


def test_ahead_of_counts_what_a_newcomer_is_served_after() -> None:
    """With 100 of A queued, a new B waits behind about one of them; a new A behind all."""
    q: FairQueue[str] = FairQueue()
    order = _Order()
    for i in range(100):
        q.push(f"a{i}", level=0, order=order(), flow="a", weight=1, cost=100)
    q.push("batch", level=10, order=order(), flow="b", weight=1, cost=100)
    assert q.ahead_of(level=0, flow="b") <= 1
    assert q.ahead_of(level=0, flow="a") == 100
    assert q.ahead_of(level=10, flow="c") == 101


def test_pop_first_needs_first() -> None:
    q: FairQueue[str] = FairQueue()
    q.push("x", level=0, order=(0, 0), flow="a", weight=1, cost=1)
    with pytest.raises(LookupError):
        q.pop_first()


def test_first_where_skips_flows_not_wanted_inside_the_first_level() -> None:
    """``first_where`` gives the wanted flow's head with the smallest start tag, passing
    the flows before it (A, first in order) but never a higher level's waiters for a lower
    level's; ``pop_first`` then takes it and charges its flow."""
    q: FairQueue[str] = FairQueue()
    order = _Order()
    for i in range(5):
        q.push(f"a{i}", level=0, order=order(), flow="a", weight=1, cost=100)
    q.push("b0", level=0, order=order(), flow="b", weight=1, cost=100)
    q.push("c0", level=0, order=order(), flow="c", weight=1, cost=100)
    q.push("batch", level=10, order=order(), flow="d", weight=1, cost=100)
    assert q.first(_alive) == "a0"  # the tie at the start goes to the oldest flow

    def not_a(item: str) -> bool:
        return not item.startswith("a")

    assert q.first_where(_alive, not_a) == "b0"
    assert q.pop_first() == "b0"
    assert q.first_where(lambda item: item != "c0", not_a) is None  # c0 gone: dropped
    assert q.first_where(_alive, lambda item: item == "batch") is None  # level 0 first
    assert len(q) == 6 and q.flows(0) == 1
    assert _serve(q, 6) == ["a0", "a1", "a2", "a3", "a4", "batch"]


def test_slot_shares_weighted_among_the_flows_holding_slots() -> None:
    """A flow's share of the capacity is its weight over the weights of the flows holding
    slots (its own included): alone it is the whole capacity, held in full it is not below;
    a flow giving back its last slot stops counting."""
    s = SlotShares()
    for _ in range(8):
        s.take("a", 1.0)
    assert not s.below_share("a", 1.0, 8)  # alone, holding everything
    assert s.below_share("b", 1.0, 8)  # 0 of 4
    for _ in range(3):
        s.take("b", 1.0)
    assert s.below_share("b", 1.0, 8) and s.held("b") == 3  # 3 of 8 x 1/2
    s.take("b", 1.0)
    assert not s.below_share("b", 1.0, 8)  # 4 of 4
    assert s.below_share("c", 2.0, 8)  # 0 of 8 x 2/4
    for _ in range(4):
        s.give_back("b", 0.0)
    s.give_back("b", 0.0)  # one too many: nothing held, nothing changes
    assert s.held("b") == 0 and repr(s) == "<SlotShares [a: 8]>"
    assert not s.below_share("a", 1.0, 8)
    for _ in range(8):
        s.give_back("a", 0.0)
    assert repr(s) == "<SlotShares []>" and s._weights == 0.0


def test_a_flow_lingers_after_its_last_slot() -> None:
    """With ``linger``, a flow that gave back its last slot still counts among those sharing
    the pool until ``linger`` seconds later: the others' shares stay split with it (so a
    flood stays paced across a light tenant's gap between requests), and it is below its
    own share; taking a slot again ends the linger, and expiry leaves it out."""
    s = SlotShares(linger=2.0)
    for _ in range(8):
        s.take("a", 1.0)
    s.take("b", 1.0)
    s.give_back("b", 100.0)
    assert s.held("b") == 0 and repr(s) == "<SlotShares [a: 8] lingering [b]>"
    assert s.others("a") and s.others("b")
    assert not s.below_share("a", 1.0, 8)  # 8 of 8 x 1/2
    assert s.below_share("b", 1.0, 8)
    s.expire(101.9)  # still within its linger
    assert s.others("a")
    s.take("b", 1.0)  # back before it ended: held again, counted once
    s.give_back("b", 102.0)
    s.expire(103.9)
    assert s.others("a")  # the linger restarted at its last give-back
    s.expire(104.0)
    assert not s.others("a") and repr(s) == "<SlotShares [a: 8]>"
    for _ in range(8):
        s.give_back("a", 105.0)
    assert repr(s) == "<SlotShares [] lingering [a]>"
    s.expire(107.0)
    assert repr(s) == "<SlotShares []>" and s._weights == 0.0
