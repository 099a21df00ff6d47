"""Imports run one way: api -> pipeline -> stages -> stores/clients -> config/types.

The contract is in ``pyproject.toml`` (``[tool.importlinter]``); this runs it on the tree, and
shows that it fails when a back-import is added (on a copy of the package).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

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
    assert "1 kept, 0 broken" in run.stdout


def test_a_back_import_breaks_it(tmp_path: Path) -> None:
    shutil.copytree(REPO / "gateway", tmp_path / "gateway",
                    ignore=shutil.ignore_patterns("__pycache__", "bpe"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    store = tmp_path / "gateway" / "quota" / "memory.py"
    store.write_text(store.read_text() + "\nfrom gateway.api import proxy  # a back-import\n")
    run = _lint(tmp_path)
    assert run.returncode != 0, run.stdout
    assert "gateway.quota is not allowed to import gateway.api" in run.stdout
