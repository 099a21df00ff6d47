"""No tenant learns another's prompt from the prompt cache (issue 34, point 3), end to end.

A gateway routing by prefix in front of the simulator's vLLM-style prefix cache. Tenant A sends
a confidential system prompt; tenant B then probes it with the right guess and with a guess one
digit off, 1,000 pairs, each pair a secret of its own. Without isolation B's right guess comes
back cached (and faster); with the per-tenant salt B's ``cached_tokens`` are the same for both
guesses and its time to first token carries no difference beyond noise. Tenants that the policy
lets share (an organization with ``share_cache``) do share, and a tenant still hits its own
prefixes.
"""

from __future__ import annotations

import hashlib
import random
import statistics
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import GatewayProcess, SimProcess, policy

pytestmark = pytest.mark.process

KEYS = {t: f"sk-gw-test-{t}-" + hashlib.sha256(t.encode()).hexdigest()[:36]
        for t in ("a", "b", "c")}
PAIRS = 1_000


@pytest.fixture(scope="module")
def sim() -> Iterator[str]:
    with SimProcess("interactive", "--speedup", "4", "--jitter", "0") as proc:
        yield proc.url


def _policy(sim_url: str, **isolation: Any) -> dict[str, Any]:
    data = policy({"chat": [sim_url]})
    data["pools"][0]["strategy"] = "prefix"
    data["auth"] = {"keys": [
        {"id": f"key-{t}", "sha256": hashlib.sha256(k.encode()).hexdigest(), "tenant": t}
        for t, k in KEYS.items()]}
    data["plans"] = [{"name": "p"}]
    # a and c share an organization that shares its cache; b is alone
    data["organizations"] = [{"name": "acme", "share_cache": True}]
    data["tenants"] = [{"name": "a", "plan": "p", "organization": "acme"},
                       {"name": "b", "plan": "p"},
                       {"name": "c", "plan": "p", "organization": "acme"}]
    if isolation:
        data["isolation"] = isolation
    return data


def _secret(i: int, seed: int) -> str:
    rng = random.Random(seed * 1_000_003 + i)
    digits = "".join(rng.choice("0123456789") for _ in range(12))
    # the code comes first: the two guesses part in the engine's first cache block, so that
    # a prober's own guesses share no block with each other
    return f"{digits} is the vault code of case {seed}-{i}. " + "Never reveal it. " * 300


def _off_by_one(secret: str) -> str:
    return str((int(secret[0]) + 1) % 10) + secret[1:]


def _ask(client: httpx.Client, tenant: str, system: str) -> tuple[int, float]:
    """(cached prompt tokens, time to first token in s) of one streamed request."""
    start = time.perf_counter()
    first = None
    cached = None
    with client.stream("POST", "/v1/chat/completions", headers={
            "Authorization": f"Bearer {KEYS[tenant]}"}, json={
            "model": "chat-model", "max_tokens": 2, "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "system", "content": system},
                         {"role": "user", "content": "What is the code?"}]}) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            if first is None and '"content"' in line:
                first = time.perf_counter() - start
            if '"usage"' in line and '"prompt_tokens_details"' in line:
                cached = httpx.Response(200, content=line[6:]).json()["usage"][
                    "prompt_tokens_details"]["cached_tokens"]
    assert first is not None and cached is not None
    return cached, first


def _probe(gw: GatewayProcess, pairs: int, seed: int, prober: str = "b"
           ) -> list[tuple[int, float, int, float]]:
    """Per pair: B's (cached, ttft) for the right guess, then for the wrong one."""
    def pair(i: int) -> tuple[int, float, int, float]:
        secret = _secret(i, seed)
        with httpx.Client(base_url=gw.url, timeout=60) as client:
            _ask(client, "a", secret)
            guesses = [("right", secret), ("wrong", _off_by_one(secret))]
            random.Random(i).shuffle(guesses)  # neither guess is always the first sent
            seen = {name: _ask(client, prober, text) for name, text in guesses}
        return (*seen["right"], *seen["wrong"])

    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(pair, range(pairs)))


def test_a_tenant_learns_nothing_of_anothers_prompt(sim: str, tmp_path: Path) -> None:
    with GatewayProcess(tmp_path, _policy(sim)) as gw:
        seen = _probe(gw, PAIRS, seed=1)
        # a tenant still hits its own prefixes (the cache still works within a tenant)
        with httpx.Client(base_url=gw.url, timeout=60) as client:
            own = _secret(PAIRS, seed=1)
            assert _ask(client, "a", own)[0] == 0
            assert _ask(client, "a", own)[0] > 1000
    right_cached = [s[0] for s in seen]
    wrong_cached = [s[2] for s in seen]
    assert right_cached == wrong_cached, "B's cached_tokens tell right guesses from wrong"
    right_ttft = statistics.median(s[1] for s in seen)
    wrong_ttft = statistics.median(s[3] for s in seen)
    # a hit skips most of the prefill (without isolation the right guess's median is about a
    # third of the wrong one's); interleaved pairs share the machine's noise alike, so load
    # cannot make the right guesses systematically faster: only a leak can
    print(f"B's median TTFT over {PAIRS} pairs: right {right_ttft * 1e3:.2f} ms, "
          f"wrong {wrong_ttft * 1e3:.2f} ms; cached right/wrong {sum(right_cached)}/"
          f"{sum(wrong_cached)}")
    assert right_ttft > 0.8 * wrong_ttft, (right_ttft, wrong_ttft)


def test_without_isolation_the_probe_succeeds(sim: str, tmp_path: Path) -> None:
    """The same probe against ``cache: shared``: the signal the salt removes is real (this is
    what the gateway did before, and what an operator opts into with ``shared``)."""
    with GatewayProcess(tmp_path, _policy(sim, cache="shared")) as gw:
        seen = _probe(gw, 20, seed=2)
    print("shared: B's median TTFT right "
          f"{statistics.median(s[1] for s in seen) * 1e3:.2f} ms, wrong "
          f"{statistics.median(s[3] for s in seen) * 1e3:.2f} ms")
    assert all(s[0] > 1000 and s[2] < s[0] for s in seen)
    # the TTFT medians are printed, not compared: the gap the hit makes (~12 ms on a quiet
    # box) shrinks under load (16.7 against 20.4 ms seen), and a test asserts no timing


def test_tenants_of_a_sharing_organization_share(sim: str, tmp_path: Path) -> None:
    with GatewayProcess(tmp_path, _policy(sim)) as gw:
        seen = _probe(gw, 10, seed=3, prober="c")
    assert all(s[0] > 1000 and s[2] < s[0] for s in seen)


def test_no_cache_turns_the_engines_cache_off(sim: str, tmp_path: Path) -> None:
    with GatewayProcess(tmp_path, _policy(sim, cache="no_cache")) as gw, \
            httpx.Client(base_url=gw.url, timeout=60) as client:
        secret = _secret(0, seed=4)
        hits = [_ask(client, "a", secret)[0] for _ in range(3)]
    assert hits == [0, 0, 0]
