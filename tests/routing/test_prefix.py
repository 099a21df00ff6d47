"""Prefix-cache-aware routing: the prompt's chunk hashes, the bounded index, the pick."""

from __future__ import annotations

import itertools
import random
import sys
import tracemalloc
from typing import Any

import msgspec
import pytest

from gateway.config import Backend, Model, Policy, Pool, RequestClass
from gateway.config.load import PolicyError, parse_policy
from gateway.config.model import PrefixRouting
from gateway.routing.pick import pick_prefix
from gateway.routing.pool import PoolState
from gateway.routing.prefix import PrefixIndex, prompt_hashes
from gateway.routing.router import Router

BLOCK = 64


def _pool(n: int = 4, max_in_flight: int = 100, **prefix: Any) -> PoolState:
    backends = [Backend(url=f"http://b{i}", max_in_flight=max_in_flight) for i in range(n)]
    return PoolState(Pool(name="p", backends=backends, strategy="prefix",
                          prefix=PrefixRouting(block_bytes=BLOCK, **prefix)))


def _conversation(rng: random.Random, system: str, turns: int) -> list[list[dict[str, str]]]:
    """The message lists a chat client sends at turns 1..n, each re-sending its history."""
    messages = [{"role": "system", "content": system}]
    out = []
    for t in range(turns):
        messages.append({"role": "user", "content": f"question {t} {rng.random()} " * 8})
        out.append(list(messages))
        messages.append({"role": "assistant", "content": f"answer {t} {rng.random()} " * 20})
    return out


# -- hashing ------------------------------------------------------------------------------------


def test_turn_n_plus_1_shares_every_chunk_of_turn_n() -> None:
    """A conversation's next turn starts with all of the previous turn's full chunks."""
    turns = _conversation(random.Random(1), "be brief " * 50, 5)
    hashes = [prompt_hashes({"messages": m}, BLOCK) for m in turns]
    for before, after in itertools.pairwise(hashes):
        assert len(after) > len(before)
        assert after[: len(before)] == before
    other = prompt_hashes({"messages": _conversation(random.Random(2), "be long " * 50, 1)[0]},
                          BLOCK)
    assert other[0] != hashes[0][0]


def test_chunks_are_chained_and_partial_chunks_left_out() -> None:
    data = {"prompt": "x" * (3 * BLOCK)}  # JSON adds the two quotes: 3 full chunks + 2 bytes
    a = prompt_hashes(data, BLOCK)
    assert len(a) == 3
    assert len(set(a)) == 3  # equal bytes at different depths hash differently
    assert prompt_hashes({"prompt": "y" + "x" * (3 * BLOCK - 1)}, BLOCK)[2] != a[2]
    assert prompt_hashes({}, BLOCK) == []
    # tools and system text come first, as a chat template renders them
    with_tools = prompt_hashes({"tools": [{"name": "t" * 100}], **data}, BLOCK)
    assert with_tools[0] != a[0]


# -- the index ----------------------------------------------------------------------------------


def test_index_memory_is_bounded() -> None:
    """However many prompts pass, the index keeps at most max_entries chunk hashes, the least
    recently used dropped first, and its memory stops growing."""
    pool = _pool(max_entries=2000)
    index = pool.prefix_index
    assert index is not None
    rng = random.Random(3)
    tracemalloc.start()
    peaks = []
    for i in range(60):
        for _ in range(20):
            prompt = {"messages": [{"role": "user", "content": f"{rng.random()}" * 300}]}
            index.record(pool.backends[i % 4], prompt_hashes(prompt, BLOCK))
        assert len(index) <= 2000
        peaks.append(tracemalloc.get_traced_memory()[0])
    tracemalloc.stop()
    assert len(index) == 2000
    assert peaks[-1] < peaks[10] * 1.2  # flat once full
    assert sys.getsizeof(index._entries) < 2000 * 200  # ~100 bytes a chunk hash


def test_index_forgets_least_recently_used() -> None:
    pool = _pool(max_entries=10)
    index = pool.prefix_index
    assert index is not None
    a, b = pool.backends[:2]
    old = list(range(100, 106))
    new = list(range(200, 206))
    index.record(a, old)
    index.record(b, new)  # 12 > 10: the two oldest of ``old`` go, its tail
    assert index.depth_of(index.depths(old), a) == 4
    assert index.depth_of(index.depths(new), b) == 6
    index.record(a, new[:3])  # refreshed, and now held by two backends
    depths = index.depths(new)
    assert (index.depth_of(depths, a), index.depth_of(depths, b)) == (3, 6)
    index.record(a, list(range(300, 304)))  # 4 more: old's remaining 4 go (oldest first)
    assert index.depths(old) == {}


def test_depths_of_several_backends() -> None:
    """Each backend's depth is the length of the prompt's prefix it was sent."""
    pool = _pool(n=4)
    index = pool.prefix_index
    assert index is not None
    prompt = list(range(1000, 1040))
    for backend, depth in zip(pool.backends, (5, 2, 40, 0), strict=True):
        index.record(backend, prompt[:depth])
    index.record(pool.backends[3], [7, 8, 9])  # another prompt
    depths = index.depths(prompt)
    assert [index.depth_of(depths, b) for b in pool.backends] == [5, 2, 40, 0]
    assert index.depths(prompt[:1]) == {1: 1, 2: 1, 4: 1}
    assert index.depths([]) == {} and index.depths([1]) == {}


# -- the pick -----------------------------------------------------------------------------------


def test_picks_the_longest_cached_prefix() -> None:
    pool = _pool()
    index = pool.prefix_index
    assert index is not None
    _b0, b1, b2, b3 = pool.backends
    index.record(b1, [1, 2])
    index.record(b2, [1, 2, 3, 4])
    index.record(b3, [9])
    picked = pool.try_pick(0.0, prefix=[1, 2, 3, 4, 5])
    assert picked is b2
    # a tie on depth goes to the lower load
    index.record(b1, [1, 2, 3, 4])
    assert pool.try_pick(0.0, prefix=[1, 2, 3, 4]) is b1  # b2 has one in flight now


def test_bounded_load_overrides_the_cache() -> None:
    """The holder of the prefix is passed over once its load exceeds bounded_load x (mean + 1);
    the next deepest within the bound takes it."""
    pool = _pool(bounded_load=1.25)
    index = pool.prefix_index
    assert index is not None
    b0, b1, _b2, _b3 = pool.backends
    index.record(b0, [1, 2, 3])
    index.record(b1, [1, 2])
    b0.in_flight = 6  # mean 1.5, limit 1.25 * 2.5 = 3.1: b0 + 1 is over
    assert pool.try_pick(0.0, prefix=[1, 2, 3]) is b1


@pytest.mark.parametrize("state", ["full", "ejected", "retry_after"])
def test_never_picks_a_full_or_ejected_backend_whatever_its_score(state: str) -> None:
    """The only backend holding the prompt's prefix is full / ejected / told us to wait: the
    request goes elsewhere, and once every backend is out, nowhere."""
    pool = _pool(n=2, max_in_flight=1)
    index = pool.prefix_index
    assert index is not None
    holder, other = pool.backends
    hashes = list(range(50))
    index.record(holder, hashes)
    if state == "full":
        holder.in_flight = 1
    elif state == "ejected":
        holder.ejected_until = 100.0
    else:
        holder.not_before = 100.0
    for _ in range(20):
        picked = pool.try_pick(1.0, prefix=hashes)
        if picked is None:
            break
        assert picked is other
        picked.release()
    other.in_flight = 1
    assert pool.try_pick(1.0, prefix=hashes) is None


def test_pick_prefix_only_chooses_among_candidates() -> None:
    """The pure pick never returns a backend it was not given, however deep its match."""
    pool = _pool(n=3)
    rng = random.Random(0)
    deep, a, b = pool.backends
    for _ in range(100):
        picked = pick_prefix([a, b], lambda x: 100 if x is deep else 0, 1.25, rng)
        assert picked in (a, b)
    assert pick_prefix([], lambda x: 1, 1.25, rng) is None


def test_multi_turn_chat_stays_on_one_backend_under_bounded_load() -> None:
    """200 conversations of 2-8 turns, interleaved, with requests held open so load builds up:
    most turns after the first land where the previous turn went, and no backend carries more
    than the bound allows."""
    pool = _pool(n=4, max_in_flight=10_000, bounded_load=1.25)
    pool._rng = random.Random(7)  # least loaded's draws for first turns: the same every run
    rng = random.Random(7)
    systems = [f"system prompt {i} " * 60 for i in range(5)]
    convos = [_conversation(rng, rng.choice(systems), rng.randint(2, 8)) for _ in range(200)]
    last: dict[int, Any] = {}
    stayed = moved = 0
    open_requests: list[Any] = []
    queue = [(c, t) for c, turns in enumerate(convos) for t in range(len(turns))]
    queue.sort(key=lambda ct: (ct[1], rng.random()))  # turn 1 of all, then turn 2, ...
    for c, t in queue:
        backend = pool.try_pick(0.0, prefix=prompt_hashes({"messages": convos[c][t]}, BLOCK))
        assert backend is not None
        if t:
            if backend is last[c]:
                stayed += 1
            else:
                moved += 1
        last[c] = backend
        open_requests.append(backend)
        loads = [b.in_flight for b in pool.backends]
        mean = sum(loads) / 4
        assert max(loads) <= 1.25 * (mean + 1) + 1
        if len(open_requests) > 40:  # ~40 in flight: the oldest finishes
            open_requests.pop(0).release()
    assert stayed > 0.85 * (stayed + moved), (stayed, moved)  # 88-94% over seeds


def test_least_loaded_scatters_the_same_turns() -> None:
    """The baseline the previous test beats: least loaded sends next turns anywhere."""
    pool = PoolState(Pool(name="p", backends=[Backend(url=f"http://b{i}") for i in range(4)]))
    rng = random.Random(7)
    convo = _conversation(rng, "s " * 100, 30)
    picks = {pool.try_pick(0.0, prefix=prompt_hashes({"messages": m}, BLOCK)) for m in convo}
    assert len(picks) > 1


# -- policy and router --------------------------------------------------------------------------


def test_policy_keys() -> None:
    data = {"pools": [{"name": "p", "backends": [{"url": "http://x"}], "strategy": "prefix"}]}
    pool = parse_policy(data).pools[0]
    assert pool.prefix_routing == PrefixRouting()
    data["pools"][0]["prefix"] = {"block_bytes": 128, "max_entries": 500, "bounded_load": 1.5}
    assert parse_policy(data).pools[0].prefix_routing == PrefixRouting(
        block_bytes=128, max_entries=500, bounded_load=1.5)
    data["pools"][0]["strategy"] = "round_robin"
    with pytest.raises(PolicyError, match="needs strategy: prefix"):
        parse_policy(data)
    data["pools"][0]["strategy"] = "prefix"
    data["pools"][0]["prefix"] = {"block_bytes": 0}
    with pytest.raises(PolicyError):
        parse_policy(data)


def test_router_computes_hashes_once_and_only_for_prefix_pools() -> None:
    def policy(strategy: str) -> Policy:
        return msgspec.convert({
            "pools": [{"name": "p", "strategy": strategy,
                       "backends": [{"url": "http://a"}, {"url": "http://b"}]}],
            "models": [{"name": "m", "pool": "p"}],
            "classes": [{"name": "interactive"}],
        }, Policy)

    payload = {"messages": [{"role": "user", "content": "z" * 2000}]}
    router = Router(policy("prefix"))
    model: Model = router.policy.models[0]
    route = router.route_request(model, "interactive", None, payload)
    assert route.prefix == prompt_hashes(payload, PrefixRouting().block_bytes)
    assert route.prefix
    plain = Router(policy("least_loaded"))
    assert plain.route_request(plain.policy.models[0], "interactive", None, payload).prefix is None
    assert isinstance(router.classes["interactive"], RequestClass)


def test_index_ignores_a_backend_of_another_pool() -> None:
    pool, stranger = _pool(n=2), _pool(n=1).backends[0]
    index = pool.prefix_index
    assert isinstance(index, PrefixIndex)
    index.record(stranger, [1, 2])
    assert len(index) == 0 and index.depth_of({1: 2}, stranger) == 0
