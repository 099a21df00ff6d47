"""Settings of one simulator process: the engine profile plus what the HTTP layer needs.

:func:`build_config` takes flat keyword overrides (the CLI's and ``run()``'s) and routes each to
the profile, the fault defaults or the server settings, so callers need not know which is which.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from gateway.sim.faults import FaultConfig
from gateway.sim.profiles import Profile, get_profile

__all__ = ["SimConfig", "build_config"]


@dataclass(frozen=True, kw_only=True)
class SimConfig:
    """Everything a :class:`gateway.sim.app.SimApp` and its engine are built from."""

    profile: Profile
    #: Served model names; the first labels the metrics.
    models: tuple[str, ...] = ("sim-model",)
    #: Answer 404 for a model not in ``models`` (default: accept any name, as a backend would).
    strict_models: bool = False
    speedup: float = 1.0
    jitter: float = 0.05
    seed: int | None = None
    default_max_tokens: int = 64
    #: a text answer ends by itself (finish ``stop``) after ``default_max_tokens`` when the
    #: request's limit allows more, as a chat model's answer rarely fills its limit (the demo
    #: sets it: an agent takes an answer cut at its limit for an error); off: a text answer is
    #: exactly the request's limit long, which tests of exact counts rely on
    natural_length: bool = False
    #: tiktoken encoding for prompt counts.
    encoding: str = "o200k_base"
    embedding_dim: int = 256
    #: Prefixes the Messages API's prompt cache remembers (``cache_control`` breakpoints).
    prompt_cache_entries: int = 256
    #: Automatic prefix caching in the engine (vLLM's default; ``prefix_cache.py``).
    prefix_caching: bool = True
    faults: FaultConfig = field(default_factory=FaultConfig)


_PROFILE_FIELDS = frozenset(f.name for f in dataclasses.fields(Profile)) - {"name"}
_FAULT_FIELDS = frozenset(f.name for f in dataclasses.fields(FaultConfig))
_CONFIG_FIELDS = frozenset(f.name for f in dataclasses.fields(SimConfig)) - {"profile", "faults"}


def build_config(profile: str | Profile = "interactive", **overrides: Any) -> SimConfig:
    """A config from a profile name and flat overrides; ``None`` values keep the default.

    ``models`` may be a string or a sequence. Unknown keys raise ``TypeError`` like a bad kwarg.
    """
    given = {k: v for k, v in overrides.items() if v is not None}
    unknown = set(given) - _PROFILE_FIELDS - _FAULT_FIELDS - _CONFIG_FIELDS
    if unknown:
        raise TypeError(f"unknown simulator settings: {', '.join(sorted(unknown))}")
    prof = get_profile(profile, **{k: v for k, v in given.items() if k in _PROFILE_FIELDS})
    faults = FaultConfig(**{k: v for k, v in given.items() if k in _FAULT_FIELDS})
    settings = {k: v for k, v in given.items() if k in _CONFIG_FIELDS}
    models = settings.get("models")
    if isinstance(models, str):
        settings["models"] = (models,)
    elif models is not None:
        settings["models"] = tuple(models) or SimConfig.models
    return SimConfig(profile=prof, faults=faults, **settings)
