"""Every module of gateway.telemetry declares ``__all__`` and exports exactly what it lists."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import gateway.telemetry

MODULES = sorted(m.name for m in pkgutil.iter_modules(gateway.telemetry.__path__,
                                                      "gateway.telemetry."))


@pytest.mark.parametrize("name", ["gateway.telemetry", *MODULES])
def test_all_names_exist(name: str) -> None:
    module = importlib.import_module(name)
    assert sorted(set(module.__all__)) == sorted(module.__all__)
    for attr in module.__all__:
        assert hasattr(module, attr), f"{name}.{attr}"
