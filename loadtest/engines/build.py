"""Where ``llama-server`` is cached, and building it on demand.

The cache dir is ``$GATEWAY_ENGINE_CACHE``, else ``~/.cache/llm-gateway/llama.cpp-<VERSION>``: the
same default as ``deploy/engines/build-llama-server.sh``, which does the building (so ``make
llama-server``, CI and these helpers share one cache). The script needs a checkout; an installed
``loadtest`` without one can still use a cache that some checkout built.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

__all__ = [
    "BUILD_SCRIPT",
    "VERSION",
    "EngineNotBuilt",
    "build_engine",
    "cache_dir",
    "find_server_binary",
    "require_server_binary",
]

VERSION = "0.3.36"
"""llama-cpp-python's version on PyPI whose vendored llama.cpp is built."""

BUILD_SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "engines" / "build-llama-server.sh"

_HINT = "run `make llama-server` (deploy/engines/build-llama-server.sh; ~10-15 min on 2 cores)"


class EngineNotBuilt(RuntimeError):
    """``llama-server`` (or the files the model writer needs) is not in the cache dir."""


def cache_dir() -> Path:
    """``$GATEWAY_ENGINE_CACHE``, else ``~/.cache/llm-gateway/llama.cpp-<VERSION>``."""
    env = os.environ.get("GATEWAY_ENGINE_CACHE")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "llm-gateway" / f"llama.cpp-{VERSION}"


def find_server_binary() -> Path | None:
    """The cached ``llama-server``, or None when it has not been built."""
    path = cache_dir() / "bin" / "llama-server"
    return path if path.is_file() and os.access(path, os.X_OK) else None


def require_server_binary() -> Path:
    """The cached ``llama-server``; :class:`EngineNotBuilt` (saying how to build it) if absent."""
    path = find_server_binary()
    if path is None:
        raise EngineNotBuilt(f"llama-server is not built in {cache_dir()}: {_HINT}")
    return path


def build_engine(*, timeout: float | None = 3600.0, quiet: bool = False) -> Path:
    """Build ``llama-server`` into the cache unless it is there (a no-op then); returns its path.

    Runs the build script (it takes a lock, so concurrent callers build once). Raises
    :class:`EngineNotBuilt` when there is no script (no checkout) or the build fails.
    """
    if not BUILD_SCRIPT.is_file():
        found = find_server_binary()
        if found is not None:
            return found
        raise EngineNotBuilt(f"llama-server is not built in {cache_dir()} and {BUILD_SCRIPT} "
                             "is not here (build it from a checkout of the repository)")
    env = dict(os.environ, GATEWAY_ENGINE_CACHE=str(cache_dir()))
    try:
        done = subprocess.run(
            ["bash", str(BUILD_SCRIPT)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL if quiet else None,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise EngineNotBuilt(f"building llama-server took over {timeout:.0f} s "
                             f"(log: {cache_dir() / 'build.log'})") from None
    if done.returncode != 0:
        raise EngineNotBuilt(f"building llama-server failed (exit {done.returncode}); "
                             f"log: {cache_dir() / 'build.log'}")
    return require_server_binary()
