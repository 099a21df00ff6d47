"""Prompt caches kept per tenant (issue 34, point 3): the salt, the body the engine gets, the
prefix index and the simulator's cache, each alone."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.auth.cache_salt import SECRET_FILE, CacheSalts, load_secret
from gateway.config.model import Policy
from gateway.routing.prefix import prompt_hashes
from gateway.sim.prefix_cache import block_hashes
from gateway.upstream.cache_isolation import isolate_body


def _policy(tmp: Path, **extra: Any) -> Policy:
    data = {"store": {"data_dir": str(tmp)}, **extra}
    return msgspec.convert(data, Policy)


def test_salts_are_per_tenant_unless_the_policy_shares(tmp_path: Path) -> None:
    policy = _policy(
        tmp_path,
        organizations=[{"name": "acme", "share_cache": True}, {"name": "solo"}],
        teams=[{"name": "red", "organization": "acme"}],
        plans=[{"name": "p"}],
        tenants=[{"name": "a1", "plan": "p", "organization": "acme"},
                 {"name": "a2", "plan": "p", "team": "red"},
                 {"name": "s1", "plan": "p", "organization": "solo"},
                 {"name": "s2", "plan": "p", "organization": "solo"},
                 {"name": "g1", "plan": "p", "cache_group": "g"},
                 {"name": "g2", "plan": "p", "organization": "solo", "cache_group": "g"}])
    salts = CacheSalts(policy, b"secret")
    assert salts.salt("a1") == salts.salt("a2")  # the organization shares (a team's too)
    assert salts.salt("s1") != salts.salt("s2")  # this one does not
    assert salts.salt("g1") == salts.salt("g2")  # a cache group does, across organizations
    assert salts.salt("unknown") != salts.salt("other-unknown")
    assert salts.salt(None) == salts.salt(None) != salts.salt("a1")
    assert len({salts.salt(t) for t in ("a1", "s1", "s2", "g1", "x")}) == 5
    assert all(len(salts.salt(t)) == 32 for t in ("a1", "x"))
    # the secret is the salt: another secret, other salts; the tenant name alone is not enough
    assert CacheSalts(policy, b"other").salt("s1") != salts.salt("s1")


def test_the_secret_is_made_once_and_kept_private(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GATEWAY_CACHE_SALT_SECRET", raising=False)
    policy = _policy(tmp_path / "data")
    first = load_secret(policy)
    path = tmp_path / "data" / SECRET_FILE
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert load_secret(policy) == first and len(first) == 64
    monkeypatch.setenv("GATEWAY_CACHE_SALT_SECRET", "from-env")
    assert load_secret(policy) == b"from-env"
    # a policy that never salts never touches its data directory
    CacheSalts(_policy(tmp_path / "untouched"), lambda: load_secret(policy))
    assert not (tmp_path / "untouched").exists()


def test_the_engine_gets_the_tenants_salt_and_never_the_clients() -> None:
    plain = msgspec.json.encode({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    salted = msgspec.json.decode(isolate_body(plain, "salt", "s" * 32))
    assert salted["cache_salt"] == "s" * 32 and salted["model"] == "m"
    sent = msgspec.json.encode({"model": "m", "cache_salt": "mine", "cache_prompt": True,
                                "messages": [{"role": "user", "content": '"cache_salt"'}]})
    out = msgspec.json.decode(isolate_body(sent, "salt", "t" * 32))
    assert out["cache_salt"] == "t" * 32 and "cache_prompt" not in out
    assert out["messages"][0]["content"] == '"cache_salt"'
    assert msgspec.json.decode(isolate_body(sent, "no_cache", "t"))["cache_prompt"] is False
    assert "cache_salt" not in msgspec.json.decode(isolate_body(sent, "no_cache", "t"))
    assert "cache_salt" not in msgspec.json.decode(isolate_body(sent, "shared", "t"))
    assert isolate_body(plain, "shared", "t") == plain  # nothing to do: the same bytes
    assert msgspec.json.decode(isolate_body(b' {  } \n', "salt", "t")) == {"cache_salt": "t"}


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=3),
    max_leaves=12)


@settings(max_examples=400, deadline=None)
@given(body=st.dictionaries(st.sampled_from(["model", "cache_salt", "cache_prompt", "x",
                                             "messages", "cache_salt_x"]), _JSON),
       mode=st.sampled_from(["salt", "no_cache", "shared"]), spaced=st.booleans())
def test_isolating_a_body_equals_editing_its_object(body: dict[str, Any], mode: Any,
                                                    spaced: bool) -> None:
    """Differential: the byte-level splice against the decoded object edited by hand."""
    raw = msgspec.json.encode(body)
    if spaced:
        raw = raw.replace(b":", b": ", 1) + b"  "
    want = {k: v for k, v in body.items() if k not in ("cache_salt", "cache_prompt")}
    if mode == "salt":
        want["cache_salt"] = "salt-value"
    elif mode == "no_cache":
        want["cache_prompt"] = False
    assert msgspec.json.decode(isolate_body(raw, mode, "salt-value")) == want


def test_the_prefix_index_keeps_each_salts_prefixes_apart() -> None:
    payload = {"messages": [{"role": "system", "content": "secret " * 200}]}
    bare, a, b = (prompt_hashes(payload, 256, salt) for salt in (None, "a", "b"))
    assert len(bare) == len(a) == len(b) > 3
    assert not set(a) & set(b) and not set(a) & set(bare)
    assert prompt_hashes(payload, 256, "a") == a  # the same tenant finds its own prefixes


def test_the_simulators_cache_hits_only_its_own_salt() -> None:
    tokens = list(range(100))
    assert block_hashes(tokens, 16, "a") == block_hashes(tokens, 16, "a")
    assert not set(block_hashes(tokens, 16, "a")) & set(block_hashes(tokens, 16, "b"))
    assert not set(block_hashes(tokens, 16, "a")) & set(block_hashes(tokens, 16))
