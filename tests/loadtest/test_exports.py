"""Every module of the load tester declares ``__all__`` and exports exactly what it lists.

That none imports the gateway is checked, on every module of the tool, in test_http_only.py.
"""

from __future__ import annotations

import importlib

import pytest

MODULES = [
    "cli",
    "client",
    "compare",
    "cost",
    "engines",
    "engines.build",
    "engines.llama_server",
    "engines.tiny_model",
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

