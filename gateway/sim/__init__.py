"""A simulated continuous-batching inference engine behind an OpenAI-compatible API.

Used by the demo, the tests and the benchmarks in place of GPU replicas. The engine model and its
calibration are in SIMULATOR.md. Knows nothing of the gateway except ``gateway.tokenizers``.

Layout: ``profiles`` (cost constants) -> ``engine`` (step loop) -> ``text`` / ``shapes`` /
``completions`` / ``embeddings`` (what is answered) -> ``app`` (ASGI) -> ``server`` / ``cli``.
"""

from __future__ import annotations

from gateway.sim.app import SimApp
from gateway.sim.config import SimConfig, build_config
from gateway.sim.engine import Engine, QueueFullError, RequestState, SimRequest
from gateway.sim.faults import FaultConfig
from gateway.sim.profiles import PROFILES, Profile, get_profile
from gateway.sim.server import SimServer, run, spawn

__all__ = [
    "PROFILES",
    "Engine",
    "FaultConfig",
    "Profile",
    "QueueFullError",
    "RequestState",
    "SimApp",
    "SimConfig",
    "SimRequest",
    "SimServer",
    "build_config",
    "get_profile",
    "run",
    "spawn",
]
