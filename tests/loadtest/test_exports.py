"""Every module of the load tester declares ``__all__`` and exports exactly what it lists."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

MODULES = [
    "cli",
    "client",
    "compare",
    "cost",
    "monitor",
    "plots",
    "probe",
    "replay",
    "report",
    "soak",
    "stats",
    "sweep",
    "trace",
    "workload",
]


@pytest.mark.parametrize("name", MODULES)
def test_all_names_exist(name: str) -> None:
    module = importlib.import_module(f"loadtest.{name}")
    assert sorted(set(module.__all__)) == sorted(module.__all__)
    for attr in module.__all__:
        assert hasattr(module, attr), f"{name}.{attr}"


def test_no_gateway_imports() -> None:
    """The tool talks HTTP only: no module imports the gateway's internals."""
    import sys

    for name in MODULES:
        importlib.import_module(f"loadtest.{name}")
    source = "".join(
        Path(importlib.import_module(f"loadtest.{n}").__file__ or "").read_text() for n in MODULES
    )
    assert "from gateway" not in source and "import gateway" not in source
    assert "loadtest.cli" in sys.modules
