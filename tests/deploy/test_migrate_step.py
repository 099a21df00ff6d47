"""The deploy files' migrate step, run for real: ``gateway db migrate --config <policy>`` (what
compose's ``ledger-migrate`` service and the Kubernetes init container run) against our own
PostgreSQL, with only the environment those containers get (``GATEWAY_LEDGER_URL``: no client
keys, no Redis), twice (a pod restarted, replicas starting together), then ``db status``.

The policies are the compose one (deploy/policies) and the one in the rendered Kubernetes
ConfigMap; only their store paths are moved into the test's directory (the container paths
do not exist on this machine).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.ledger.sql import SCHEMA_VERSION
from tests.deploy._util import DEPLOY, KUSTOMIZE_DIRS, load_yaml, render_kustomization
from tests.deploy.test_compose import MIGRATE_COMMAND, services
from tests.deploy.test_kubernetes import init_container
from tests.ports import free_port

pytestmark = pytest.mark.process

REPO = Path(__file__).resolve().parents[2]


def compose_policy() -> dict[str, Any]:
    files = sorted((DEPLOY / "policies").glob("*.yaml"))
    assert len(files) == 1, files  # one file: nothing to merge
    data: dict[str, Any] = load_yaml(files[0])
    return data


def kubernetes_policy() -> dict[str, Any]:
    docs = render_kustomization(KUSTOMIZE_DIRS["base"])
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap"
             and d["metadata"]["name"].startswith("llm-gateway-policies")]
    (text,) = cm["data"].values()
    data: dict[str, Any] = yaml.safe_load(text)
    return data


def run_gateway(args: list[str], url: str) -> subprocess.CompletedProcess[str]:
    """``gateway ...`` as the container runs it: its environment is the ledger URL alone."""
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO), "GATEWAY_LEDGER_URL": url}
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True,
                          env=env, timeout=120, check=False)


@pytest.mark.parametrize("which", ["compose", "kubernetes"])
def test_migrate_step_migrates_once_with_the_containers_env(
    which: str, postgres_url: str, tmp_path: Path
) -> None:
    if which == "compose":
        svc = services()["ledger-migrate"]
        command = [*svc["entrypoint"], *svc["command"]]
        data = compose_policy()
    else:
        command = init_container(render_kustomization(KUSTOMIZE_DIRS["base"]))["command"]
        data = kubernetes_policy()
    assert command == MIGRATE_COMMAND
    data["store"] = {**data["store"], "spool_dir": str(tmp_path / "spool"),
                     "data_dir": str(tmp_path / "data")}
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "gateway.yaml").write_text(yaml.safe_dump(data), encoding="utf-8")
    # `gateway db migrate --config /etc/gateway/policies`, with this copy of the folder
    args = [*command[:-1], str(policies)]

    before = run_gateway([*args[:2], "status", *args[3:]], postgres_url)
    assert before.returncode == 1, before.stderr  # an empty database: not this gateway's
    first = run_gateway(args, postgres_url)
    assert first.returncode == 0, first.stderr
    assert f"now at {SCHEMA_VERSION}" in first.stdout
    again = run_gateway(args, postgres_url)
    assert again.returncode == 0, again.stderr
    assert f"already at schema version {SCHEMA_VERSION}" in again.stdout
    status = run_gateway([*args[:2], "status", *args[3:]], postgres_url)
    assert status.returncode == 0, status.stderr


def test_migrate_step_fails_while_the_database_is_away(tmp_path: Path) -> None:
    """Nothing listens: the step exits non-zero (compose stops, Kubernetes retries the init
    container) instead of letting a gateway start on an unknown schema; the password in the
    URL is never printed."""
    port = free_port()  # nothing listens there
    data = compose_policy()
    data["store"] = {**data["store"], "spool_dir": str(tmp_path / "spool")}
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "gateway.yaml").write_text(yaml.safe_dump(data), encoding="utf-8")
    out = run_gateway([*MIGRATE_COMMAND[:-1], str(policies)],
                      f"postgresql://gateway:secret-pw@127.0.0.1:{port}/gateway")
    assert out.returncode != 0
    assert "secret-pw" not in out.stdout + out.stderr
