"""Coding agents against ``gateway serve`` on the demo's policy and simulators (issue 40).

The agents (Claude Code, Codex CLI, opencode, aider, each at the version pinned in
``deploy/agents/install-agents.sh``) live in a cache outside the tree (``make agents``
installs them, ~1.9 GB, ~1-2 min). Run alone, a test of an agent that is not installed
skips with the reason, except under CI (``CI=true``) or with ``GATEWAY_AGENTS_INSTALL=1``:
then they are installed once, before the first test runs (outside any test's timeout), and an
agent that fails to install fails its tests.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agents.harness import (
    Installed,
    agent_binaries,
    demo_gateway,
    must_install,
)
from tests.agents.proxy import RecordingProxy
from tests.helpers import GatewayProcess
from tests.process_marker import starts_process

_found: dict[str, Installed] | None = None
_install_log = ""


def _agents(install: bool) -> dict[str, Installed]:
    global _found, _install_log
    if _found is None or (install and len(_found) < 4):
        _found, _install_log = agent_binaries(install)
    return _found


def pytest_collection_finish(session: pytest.Session) -> None:
    """Install before the tests run, so the install's minutes count against no test."""
    if must_install() and any(item.get_closest_marker("agents") for item in session.items):
        _agents(install=True)


@pytest.fixture(scope="session")
@starts_process
def installed() -> dict[str, Installed]:
    return _agents(install=must_install())


@pytest.fixture()
def binary(agent: str, installed: dict[str, Installed]) -> Path:
    """The agent's binary, or a skip (a failure under CI) when it is not installed."""
    found = installed.get(agent)
    if found is not None:
        return found.binary
    if must_install():
        pytest.fail(f"{agent} did not install:\n{_install_log[-3000:]}")
    pytest.skip(f"{agent} is not installed: run `make agents` (deploy/agents/install-agents.sh; "
                "~1.9 GB in ~/.cache/llm-gateway/agents), or set GATEWAY_AGENTS_INSTALL=1")


@pytest.fixture(scope="module")
@starts_process
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    with demo_gateway(tmp_path_factory.mktemp("agents-gateway")) as gw:
        yield gw


@pytest.fixture(scope="module")
def proxy(gateway: GatewayProcess) -> Iterator[RecordingProxy]:
    with RecordingProxy(gateway.url) as p:
        yield p
