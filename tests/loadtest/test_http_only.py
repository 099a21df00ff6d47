"""The validation tool talks HTTP only, and everything else in ``loadtest/`` is a benchmark.

``python -m loadtest`` is pointed at any OpenAI-compatible endpoint, so none of its modules may
import the gateway: a shared constant or type would tie the tool to this checkout and let it
measure the gateway from the inside. Benchmarks that do call gateway internals live in
``loadtest/bench/``. The rule of ``loadtest/README.md`` is checked here on the source (with
``ast``, so imports inside functions and under ``TYPE_CHECKING`` count too): every module outside
``loadtest/bench/`` is part of the tool (reachable from ``python -m loadtest``) and imports
neither ``gateway`` nor ``loadtest.bench``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import loadtest

TOOL_ROOT = Path(loadtest.__file__).resolve().parent
BENCH = TOOL_ROOT / "bench"
ENTRY_POINTS = ("loadtest", "loadtest.__main__", "loadtest.cli")
FORBIDDEN = ("gateway", "loadtest.bench")


def _module_name(path: Path, root: Path) -> str:
    parts = [root.name, *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(tree: ast.AST, module: str, is_package: bool) -> list[tuple[int, str]]:
    """Every module name ``tree`` imports, relative imports resolved against ``module``.

    ``importlib.import_module("...")`` and ``__import__("...")`` with a literal name count too.
    """
    package = module if is_package else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
        elif (isinstance(node, ast.Call) and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and ((isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                   or (isinstance(node.func, ast.Name) and node.func.id == "__import__"))):
            found.append((node.lineno, node.args[0].value))
    return found


def _is_forbidden(name: str) -> bool:
    return any(name == bad or name.startswith(bad + ".") for bad in FORBIDDEN)


def tool_modules(root: Path) -> dict[str, Path]:
    """The validation tool's modules: every ``.py`` under ``root`` outside ``root/bench``."""
    return {_module_name(p, root): p for p in sorted(root.rglob("*.py"))
            if (root / "bench") not in p.parents}


def violations(root: Path) -> list[str]:
    """``path:line imports NAME``, once per import of ``gateway`` or ``loadtest.bench``."""
    bad: dict[str, str] = {}
    for name, path in tool_modules(root).items():
        tree = ast.parse(path.read_text(), str(path))
        for line, imported in _imported(tree, name, path.name == "__init__.py"):
            if _is_forbidden(imported):
                bad.setdefault(f"{path.relative_to(root.parent)}:{line}", imported)
    return sorted(f"{where} imports {imported}" for where, imported in bad.items())


def unreachable(root: Path) -> list[str]:
    """Tool modules that ``python -m loadtest`` never imports (so they belong in ``bench/``)."""
    modules = tool_modules(root)
    seen: set[str] = set()
    todo = [m for m in ENTRY_POINTS if m in modules]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        path = modules[name]
        tree = ast.parse(path.read_text(), str(path))
        for _, imported in _imported(tree, name, path.name == "__init__.py"):
            if imported in modules and imported not in seen:
                todo.append(imported)
    return sorted(set(modules) - seen)


def test_validation_tool_never_imports_gateway() -> None:
    names = tool_modules(TOOL_ROOT)
    assert {"loadtest.cli", "loadtest.client", "loadtest.sweep"} <= set(names), names
    assert not any(n.startswith("loadtest.bench") for n in names)
    assert violations(TOOL_ROOT) == []


def test_every_tool_module_is_part_of_the_tool() -> None:
    """A module ``python -m loadtest`` does not use is a benchmark or its helper: ``bench/``."""
    assert unreachable(TOOL_ROOT) == []


def test_benchmarks_live_in_bench() -> None:
    """The benchmarks that import gateway internals are under ``loadtest/bench/``."""
    for name in ("accounting_bench", "ledger_bench", "quota_bench", "telemetry_bench"):
        source = (BENCH / f"{name}.py").read_text()
        assert "from gateway" in source, name
    assert (BENCH / "overhead" / "__main__.py").is_file()
    assert (BENCH / "__init__.py").is_file()


def _fake_tool(tmp_path: Path, body: str, name: str = "client.py") -> Path:
    root = tmp_path / "loadtest"
    (root / "bench").mkdir(parents=True)
    (root / "__init__.py").write_text('"""Tool."""\n')
    (root / "cli.py").write_text("from loadtest import client\n")
    (root / "bench" / "__init__.py").write_text("")
    (root / "bench" / "x_bench.py").write_text("from gateway.quota import Limits\n")
    (root / name).write_text(body)
    return root


@pytest.mark.parametrize("body", [
    "import gateway\n",
    "import gateway.quota as q\n",
    "from gateway.accounting import PromptCounter\n",
    "from gateway import errors\n",
    "def f():\n    from gateway.ledger import UsageRecord\n",
    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gateway.context import X\n",
    "import importlib\nm = importlib.import_module('gateway.quota')\n",
    "m = __import__('gateway')\n",
    "from loadtest.bench.redis_local import redis_server\n",
    "from .bench import quota_bench\n",
])
def test_check_catches_every_form_of_import(tmp_path: Path, body: str) -> None:
    """The check fails on each way a module could reach the gateway (so it is not vacuous)."""
    root = _fake_tool(tmp_path, body)
    assert len(violations(root)) == 1, violations(root)
    assert violations(root)[0].startswith("loadtest/client.py:")


@pytest.mark.parametrize("body", [
    "import aiohttp\n",
    "from loadtest.stats import percentile\n",
    "from . import stats\n",
    "import gateways_of_the_world\n",
    "cmd = ['python', '-m', 'gateway', 'serve']\n",
])
def test_check_allows_http_only_code(tmp_path: Path, body: str) -> None:
    """Starting ``gateway serve`` by module name, or a name that only starts alike, is fine."""
    assert violations(_fake_tool(tmp_path, body)) == []


def test_unreachable_module_is_reported(tmp_path: Path) -> None:
    root = _fake_tool(tmp_path, "import aiohttp\n")
    (root / "loose_bench.py").write_text("import aiohttp\n")
    assert unreachable(root) == ["loadtest.loose_bench"]
