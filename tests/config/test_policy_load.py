"""Policy loading: good files load, bad files are refused naming the file, field and problem."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gateway.config import PolicyError, load_policy
from gateway.config.schema import policy_schema_json
from tests.helpers import REPO

GOOD = {
    "auth": {"required": False},
    "pools": [{"name": "p", "backends": [{"url": "http://127.0.0.1:9000"}]}],
    "models": [{"name": "m", "pool": "p"}],
}


def _write(tmp: Path, data: object, name: str = "policy.yaml") -> Path:
    path = tmp / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


def _with(**changes: object) -> dict[str, object]:
    data = json.loads(json.dumps(GOOD))
    data.update(changes)
    return data  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("data", "field", "problem"),
    [
        pytest.param(
            _with(
                pools=[{"name": "p", "backends": [{"url": "http://x", "max_in_flight": "many"}]}]
            ),
            "$.pools[0].backends[0].max_in_flight",
            "Expected `int`, got `str`",
            id="wrong-type",
        ),
        pytest.param(
            _with(pools=[{"name": "p", "backends": [{"url": "ftp://x"}]}]),
            "$.pools[0].backends[0].url",
            "matching regex",
            id="bad-url",
        ),
        pytest.param(
            _with(pools=[{"name": "p", "backends": []}]),
            "$.pools[0].backends",
            "length >= 1",
            id="no-backends",
        ),
        pytest.param(
            _with(pools=[{"name": "p", "backends": [{"url": "http://x", "weight": 0}]}]),
            "$.pools[0].backends[0].weight",
            "Expected `float` >",
            id="zero-weight",
        ),
        pytest.param(_with(poolz=[]), "$", "unknown field `poolz`", id="unknown-field"),
        pytest.param(
            _with(models=[{"name": "m", "pool": "nope"}]),
            "$.models[0].pool",
            "unknown pool 'nope'",
            id="unknown-pool",
        ),
        pytest.param(
            _with(models=[{"name": "m", "pool": "p"}, {"name": "m", "pool": "p"}]),
            "$.models[1].name",
            "duplicate name 'm'",
            id="duplicate-model",
        ),
        pytest.param(_with(models=[]), "$.models", "at least one model", id="no-models"),
        pytest.param(
            _with(auth={"required": True}),
            "$.auth.keys",
            "no key is configured",
            id="auth-without-keys",
        ),
        pytest.param(
            _with(auth={"keys": [{"id": "k", "sha256": "abc"}]}),
            "$.auth.keys[0].sha256",
            "matching regex",
            id="bad-hash",
        ),
        pytest.param(
            _with(server={"max_body_bytes": -1}),
            "$.server.max_body_bytes",
            "Expected `int` >",
            id="negative-limit",
        ),
        pytest.param(
            _with(console={"enabled": True, "trusted_proxies": ["10.0.0.0/8", "proxy.local"]}),
            "$.console",
            "'proxy.local' is not an address or a CIDR block",
            id="bad-trusted-proxy",
        ),
        pytest.param("pools:\n  - name: p\n   bad: [", "line ", "invalid YAML", id="bad-yaml"),
        pytest.param("- a list", "$", "expected a mapping", id="not-a-mapping"),
    ],
)
def test_invalid_policy_names_file_field_problem(
    tmp_path: Path, data: object, field: str, problem: str
) -> None:
    path = _write(tmp_path, data)
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    err = info.value
    assert err.source == str(path) or err.source == str(tmp_path / "policy.yaml")
    assert err.field.startswith(field), err
    assert problem in err.problem, err
    assert str(err).startswith(str(path))


def test_directory_merges_and_names_the_bad_file(tmp_path: Path) -> None:
    """A policy directory merges its files; an error names the file it came from."""
    _write(tmp_path, {"pools": GOOD["pools"]}, "10-pools.yaml")
    _write(tmp_path, {"models": GOOD["models"], "auth": GOOD["auth"]}, "20-models.yaml")
    policy = load_policy(tmp_path)
    assert [p.name for p in policy.pools] == ["p"] and [m.name for m in policy.models] == ["m"]
    bad = _write(tmp_path, {"models": [{"name": "x", "pool": "p", "colour": "red"}]}, "30-bad.yaml")
    with pytest.raises(PolicyError) as info:
        load_policy(tmp_path)
    assert info.value.source == str(bad)
    assert "colour" in info.value.problem


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="no such file"):
        load_policy(tmp_path / "absent.yaml")


def test_shipped_policies_are_valid(monkeypatch: pytest.MonkeyPatch) -> None:
    """policies/demo.yaml and policies/example-production.yaml load as shipped."""
    monkeypatch.setenv("GATEWAY_DEMO_KEY", "sk-gw-demo")
    for name in ("demo.yaml", "example-production.yaml"):
        policy = load_policy(REPO / "policies" / name)
        assert policy.pools and policy.models


def test_demo_policy_file_matches_embedded_demo() -> None:
    """`gateway demo` and policies/demo.yaml describe the same pools and models."""
    from gateway.cli.demo import demo_policy

    embedded = demo_policy("http://a", "http://b", "0" * 64)
    shipped = yaml.safe_load((REPO / "policies" / "demo.yaml").read_text())
    assert [p["name"] for p in embedded["pools"]] == [p["name"] for p in shipped["pools"]]
    assert embedded["models"] == shipped["models"]
    assert embedded["prices"] == shipped["prices"]
    assert embedded["plans"] == shipped["plans"] and embedded["tenants"] == shipped["tenants"]
    assert embedded["routing"] == shipped["routing"]


def test_published_schema_is_current() -> None:
    """policies/schema.json is what `gateway schema` prints (regenerate with `make schema`)."""
    assert (REPO / "policies" / "schema.json").read_text() == policy_schema_json()


@pytest.mark.process
def test_check_command(tmp_path: Path) -> None:
    """`gateway check` exits 0 on a good file and 2 with file, field and problem on a bad one."""
    good = _write(tmp_path, GOOD, "good.yaml")
    r = subprocess.run(
        [sys.executable, "-m", "gateway", "check", "--config", str(good)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0 and "ok" in r.stdout
    bad = _write(tmp_path, _with(models=[{"name": "m", "pool": "nope"}]), "bad.yaml")
    r = subprocess.run(
        [sys.executable, "-m", "gateway", "check", "--config", str(bad)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 2
    assert f"{bad}: $.models[0].pool: unknown pool 'nope'" in r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--config", str(bad), "--port", "1"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 2 and "unknown pool" in r.stderr and "Traceback" not in r.stderr
