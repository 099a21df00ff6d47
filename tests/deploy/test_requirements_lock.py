"""deploy/requirements.lock pins every runtime dependency of the image within pyproject's ranges."""

from __future__ import annotations

import re
import tomllib

import pytest

from tests.deploy._util import DEPLOY, REPO

packaging_requirements = pytest.importorskip("packaging.requirements")

LOCK = DEPLOY / "requirements.lock"
EXTRA = ["opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-http"]


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins() -> dict[str, str]:
    result: dict[str, str] = {}
    for line in LOCK.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)", line)
        assert match, f"not an exact pin: {line!r}"
        name = canonical(match.group(1))
        assert name not in result, f"{name} pinned twice"
        result[name] = match.group(2)
    return result


def runtime_requirements() -> list[packaging_requirements.Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    reqs = [packaging_requirements.Requirement(r) for r in project["dependencies"]]
    return reqs + [packaging_requirements.Requirement(r) for r in EXTRA]


def test_every_line_is_an_exact_pin_and_the_project_is_not_in_it() -> None:
    assert "llm-gateway" not in pins()


@pytest.mark.parametrize("req", runtime_requirements(), ids=str)
def test_runtime_dependency_is_pinned_within_range(
    req: packaging_requirements.Requirement,
) -> None:
    # markers are evaluated for the image: Linux, CPython 3.11
    env = {"sys_platform": "linux", "platform_system": "Linux", "python_version": "3.11"}
    if req.marker is not None and not req.marker.evaluate(env):
        pytest.skip(f"{req} does not apply on Linux")
    locked = pins()
    name = canonical(req.name)
    assert name in locked, f"{req.name} is missing: run deploy/lock-requirements.sh"
    assert req.specifier.contains(locked[name], prereleases=True), (
        f"{req.name}=={locked[name]} is outside pyproject's {req.specifier}"
    )
    if "hiredis" in req.extras:
        assert "hiredis" in locked
