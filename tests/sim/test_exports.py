"""Every module of gateway.sim declares ``__all__`` and exports exactly what it lists."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import gateway.sim

MODULES = sorted(
    m.name
    for m in pkgutil.iter_modules(gateway.sim.__path__, "gateway.sim.")
    if m.name != "gateway.sim.__main__"
)


@pytest.mark.parametrize("name", ["gateway.sim", *MODULES])
def test_all_names_exist(name: str) -> None:
    module = importlib.import_module(name)
    assert sorted(set(module.__all__)) == sorted(module.__all__)
    for attr in module.__all__:
        assert hasattr(module, attr), f"{name}.{attr}"


def test_cli_parses_flags() -> None:
    """The CLI accepts every documented flag and maps them onto settings."""
    import argparse

    from gateway.sim.cli import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(
        [
            "--port",
            "0",
            "--profile",
            "batch",
            "--model",
            "a",
            "--model",
            "b",
            "--speedup",
            "3",
            "--jitter",
            "0",
            "--slots",
            "8",
            "--step-tokens",
            "512",
            "--kv-tokens",
            "9000",
            "--queue-limit",
            "5",
            "--default-max-tokens",
            "9",
            "--encoding",
            "cl100k_base",
            "--error-status",
            "502",
            "--error-rate",
            "0.5",
            "--extra-latency-ms",
            "1",
            "--stall-ms",
            "2",
            "--disconnect-after",
            "3",
            "--retry-after",
            "4",
            "--strict-models",
        ]
    )
    assert args.models == ["a", "b"] and args.max_running == 8 and args.retry_after == 4
