"""Imports run one way: api -> pipeline -> stages -> stores/clients -> config/types, and among
the stages as ARCHITECTURE.md says (which stage knows nothing of which).

The contracts are in ``pyproject.toml`` (``[tool.importlinter]``); this runs it on the tree, and
shows that it fails when a back-import is added (on a copy of the package).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.process

REPO = Path(__file__).resolve().parent.parent
LINT = Path(sys.executable).with_name("lint-imports")


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([str(LINT), "--config", str(root / "pyproject.toml"), "--no-cache"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=300,
                          check=False)


def test_the_tree_keeps_the_contract() -> None:
    run = _lint(REPO)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "3 kept, 0 broken" in run.stdout


def _copy(tmp_path: Path) -> Path:
    shutil.copytree(REPO / "gateway", tmp_path / "gateway",
                    ignore=shutil.ignore_patterns("__pycache__", "bpe"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def _add_import(root: Path, module: str, line: str) -> None:
    path = root / "gateway" / module
    path.write_text(path.read_text() + f"\n{line}  # the import under test\n")


def test_a_back_import_breaks_it(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    _add_import(root, "quota/memory.py", "from gateway.api import proxy")
    run = _lint(root)
    assert run.returncode != 0, run.stdout
    assert "gateway.quota is not allowed to import gateway.api" in run.stdout


@pytest.mark.parametrize(("module", "line", "message"), [
    # quota knows nothing of routing (siblings kept apart)
    ("quota/memory.py", "from gateway.routing import fair",
     "gateway.quota is not allowed to import gateway.routing"),
    # a lower stage never imports a higher one: the ledger knows nothing of the dialects
    ("ledger/export.py", "from gateway.dialects import shape",
     "gateway.ledger is not allowed to import gateway.dialects"),
    # accounting knows nothing of HTTP
    ("accounting/prices.py", "from gateway.http import errors",
     "gateway.accounting is not allowed to import gateway.http"),
])
def test_a_stage_importing_what_it_must_not_know_breaks_it(
        tmp_path: Path, module: str, line: str, message: str) -> None:
    root = _copy(tmp_path)
    _add_import(root, module, line)
    run = _lint(root)
    assert run.returncode != 0, run.stdout
    assert message in run.stdout.replace("\n", " ")
