"""Every module of gateway.accounting declares ``__all__`` and exports exactly what it lists."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import gateway.accounting

MODULES = sorted(
    m.name for m in pkgutil.iter_modules(gateway.accounting.__path__, "gateway.accounting.")
)


@pytest.mark.parametrize("name", ["gateway.accounting", *MODULES])
def test_all_names_exist(name: str) -> None:
    module = importlib.import_module(name)
    assert sorted(set(module.__all__)) == sorted(module.__all__)
    for attr in module.__all__:
        assert hasattr(module, attr), f"{name}.{attr}"


def test_no_http_or_redis_imports() -> None:
    """A pure library: importing it pulls in no HTTP framework or Redis client of its own."""
    import ast
    from pathlib import Path

    banned = {"httpx", "aiohttp", "litestar", "redis", "starlette"}
    for path in Path(gateway.accounting.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            assert not {n.split(".")[0] for n in names} & banned, path.name
