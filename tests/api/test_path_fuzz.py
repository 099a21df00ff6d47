"""The gate and the router agree on every spelling of every route (issue 34, point 1).

Hypothesis writes at least 2,000 spellings of each route the app serves: slashes doubled or
percent-encoded, letters percent-encoded in either hex case, trailing slashes, dot segments,
``;`` parameters, double encodings, malformed escapes. Each goes through the app's own edge
(:func:`gateway.app.factory._canonicalise`, as a server hands it over: ``raw_path`` as sent,
``path`` decoded once) and then through the framework's real router. Wherever the edge accepts
a spelling, the router must serve the very path the edge computed (no second normalisation),
and the admin gate must hold exactly when the route it reaches is an admin route.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from litestar.exceptions import MethodNotAllowedException, NotFoundException
from litestar.utils import normalize_path

from gateway.api.admin import is_admin_path
from gateway.app.factory import _canonicalise, create_app
from gateway.config import load_policy
from gateway.http.canonical import BadPath
from tests.helpers import policy

SPELLINGS_PER_ROUTE = 2_000

#: how a slash of the route may be written instead
_SLASHES = ["//", "///", "%2F", "%2f", "/%2F", "/./", "/../", "/%2e/", "/%2E%2E/", ";x/", "/;/",
            "\\", "%5C"]
#: how another character ``c`` may be written instead
_CHARS = ["%{:02x}", "%{:02X}", "%25{:02x}", "swapcase", "{}%00", "{}%zz"]
_TAILS = ["/", "//", "%2F", ";p=1", "?q=//admin", "?/../x"]


def _respell(c: str, how: int) -> str:
    if c == "/":
        return _SLASHES[how % len(_SLASHES)]
    form = _CHARS[how % len(_CHARS)]
    if form == "swapcase":
        return c.swapcase()
    return form.format(c) if form.startswith("{}") else form.format(ord(c))


@st.composite
def spelling(draw: st.DrawFn, path: str) -> str:
    """The route with up to four characters respelled and an optional tail: a few odd places
    per path, so that both sides of the edge are reached (every odd spelling alone is in the
    hand-written table of ``path_spellings.py``)."""
    edits = draw(st.lists(st.tuples(st.integers(0, len(path) - 1), st.integers(0, 12)),
                          max_size=4))
    chars = list(path)
    for at, how in edits:
        chars[at] = _respell(path[at], how)
    out = "".join(chars)
    tail = draw(st.integers(-4, len(_TAILS) - 1))
    out += _TAILS[tail] if tail >= 0 else ""
    return out if out.startswith("/") else "/" + out


#: spellings drawn per hypothesis example: the per-example overhead, not the checks, is what
#: costs, so each example carries a batch
BATCH = 50


def _routes(app: Any) -> list[tuple[str, str]]:
    found = []
    for route in app.routes:
        path = re.sub(r"\{[^}]*\}", "some-id", route.path)
        # an ASGI mount (the proxied routes) takes every method: spell it for both
        methods = sorted(route.methods) or ["GET", "POST"]
        found += [(m, path) for m in methods if m not in ("OPTIONS", "HEAD")]
    return found


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp: Path = tmp_path_factory.mktemp("pathfuzz")
    data = policy({"chat": ["http://127.0.0.1:9"]})
    data["store"] = {"keys_file": str(tmp / "keys.json"), "data_dir": str(tmp / "data"),
                     "spool_dir": str(tmp / "spool")}
    config = tmp / "policy.yaml"
    config.write_text(yaml.safe_dump(data))
    return create_app(load_policy(str(config)), str(config))


def _routed_to(app: Any, path: str, method: str) -> str | None:
    """The registered path of the handler the framework's router picks, None for no route."""
    try:
        _, handler, *_ = app.asgi_router.handle_routing(path=normalize_path(path),
                                                       method=method)
    except (NotFoundException, MethodNotAllowedException):
        return None
    return str(next(iter(handler.paths)))


def _check(app: Any, method: str, raw: str, root: str) -> str:
    raw_path, _, query = raw.partition("?")
    scope: dict[str, Any] = {"type": "http", "method": method, "root_path": root,
                             "raw_path": raw_path.encode("latin-1"),
                             "path": root + unquote(raw_path), "query_string": query.encode()}
    try:
        path = _canonicalise(scope)
    except BadPath:
        return "bad"
    assert scope["path"] == root + path
    routed = scope["path"].split(root, 1)[-1] if root else scope["path"]
    assert normalize_path(routed) == path, (raw, path)  # the router sees what the gate saw
    target = _routed_to(app, path, method)
    gated = is_admin_path(path)
    if path in app.fast_routes or any(path.startswith(p) for p, _ in app.prefix_routes):
        assert not gated, raw
        return "fast"
    if target is not None:
        assert gated == is_admin_path(target), (raw, path, target)
    return "admin" if gated else "public"


def test_every_route_is_covered(app: Any) -> None:
    routes = _routes(app)
    assert sum(1 for _, p in routes if is_admin_path(p)) >= 12
    assert any(p == "/v1/chat/completions" for _, p in routes)


@pytest.mark.parametrize("root", ["", "/gw"])
def test_gate_and_router_agree_on_generated_spellings(app: Any, root: str) -> None:
    routes = _routes(app)
    outcomes: dict[str, int] = {}

    for method, path in routes:
        @settings(max_examples=SPELLINGS_PER_ROUTE // BATCH, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck), derandomize=True)
        @given(raws=st.lists(spelling(path), min_size=BATCH, max_size=BATCH),
               method=st.just(method))
        def check(raws: list[str], method: str) -> None:
            for raw in raws:
                kind = _check(app, method, raw, root)
                outcomes[kind] = outcomes.get(kind, 0) + 1

        check()
    # the generator reached both sides of the edge, and every kind of route
    assert outcomes.get("bad", 0) > 1_000 and outcomes.get("admin", 0) > 1_000
    assert outcomes.get("public", 0) > 1_000 and outcomes.get("fast", 0) > 100
    assert sum(outcomes.values()) >= SPELLINGS_PER_ROUTE * len(routes)
