"""Every module of gateway.console declares ``__all__`` and exports exactly what it lists; the
package imports without jinja2 or the console app (the factory imports it at start)."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys

import pytest

import gateway.console

MODULES = sorted(m.name for m in pkgutil.iter_modules(gateway.console.__path__,
                                                      "gateway.console."))


@pytest.mark.parametrize("name", ["gateway.console", *MODULES])
def test_all_names_exist(name: str) -> None:
    module = importlib.import_module(name)
    assert sorted(set(module.__all__)) == sorted(module.__all__)
    for attr in module.__all__:
        assert hasattr(module, attr), f"{name}.{attr}"


@pytest.mark.process
def test_the_factory_does_not_import_the_console_app() -> None:
    """Off by default: building the gateway app loads neither jinja2 nor the console's routes."""
    code = ("import sys, gateway.app.factory; "
            "print('jinja2' in sys.modules, 'gateway.console.routes' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["False", "False"]
