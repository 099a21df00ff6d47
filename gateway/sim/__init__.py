"""A simulated continuous-batching inference engine behind the APIs clients speak.

Used by the demo, the tests and the benchmarks in place of GPU replicas: OpenAI's chat and text
completions, embeddings and Responses API, and Anthropic's Messages API, each served natively
(with tool calls and Anthropic's prompt cache) so the gateway's pass-through meets a real
backend. The engine model and its calibration are in SIMULATOR.md. Knows nothing of the gateway
except ``gateway.tokenizers`` (in particular nothing of its front-ends, ``gateway.dialects``).

Layout: ``profiles`` (cost constants) -> ``engine`` (step loop) -> ``text`` / ``tools`` /
``prompt`` / ``cache`` (what an answer holds and costs) -> ``answer`` (the plan and the renderer
interface) -> ``completions`` / ``responses`` / ``messages`` / ``embeddings`` (each API's
parsing and shapes, with ``shapes``) -> ``respond`` (one loop, whole or streamed) -> ``app``
(ASGI) -> ``server`` / ``cli``.
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
