"""A real inference engine for tests and benchmarks: llama.cpp's ``llama-server`` on a tiny model.

- :mod:`loadtest.engines.build`: where the engine is cached (outside the tree) and how it is built
  (``deploy/engines/build-llama-server.sh``, ``make llama-server``).
- :mod:`loadtest.engines.tiny_model`: a tiny llama GGUF with random weights and the real GPT-2
  tokenizer, written once per parameter set into the cache.
- :mod:`loadtest.engines.llama_server`: a ``llama-server`` process on a free loopback port, ready
  when the context manager yields.

``python -m loadtest engine`` runs one in the foreground to point ``probe``/``sweep`` at. None of
it imports the gateway: the engine is a backend like any other, reached over HTTP.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__all__ = [
    "EngineNotBuilt",
    "LlamaServer",
    "TinyModelSpec",
    "build_engine",
    "cache_dir",
    "find_server_binary",
    "tiny_model_path",
]

# loaded on first use (PEP 562), so ``python -m loadtest.engines.tiny_model`` runs its module once
_WHERE = {
    "EngineNotBuilt": "build",
    "build_engine": "build",
    "cache_dir": "build",
    "find_server_binary": "build",
    "LlamaServer": "llama_server",
    "TinyModelSpec": "tiny_model",
    "tiny_model_path": "tiny_model",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_WHERE[name]}"), name)
