"""The typed policy model: the single source of truth for what a policy file may say.

Every section has defaults, so a policy directory may split sections across files; the loader
(``gateway.config.load``) merges them and then runs the cross-field checks in ``validate``. The
JSON Schema published as ``policies/schema.json`` is generated from these types.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

__all__ = [
    "ApiKey",
    "Auth",
    "Backend",
    "Model",
    "Policy",
    "Pool",
    "Server",
    "Timeouts",
]

Name = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:/@-]+$")]
PositiveFloat = Annotated[float, msgspec.Meta(gt=0)]
PositiveInt = Annotated[int, msgspec.Meta(gt=0)]


class _Base(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """Policy structs reject unknown fields, so a typo is an error rather than a silent default."""


class Backend(_Base, frozen=True):
    """One inference server (vLLM, SGLang, TGI, llama.cpp, Ollama or a hosted API)."""

    url: Annotated[str, msgspec.Meta(pattern=r"^https?://[^/\s]+(/\S*)?$")]
    name: Name | None = None
    weight: PositiveFloat = 1.0
    max_in_flight: PositiveInt = 256
    #: environment variable holding the backend's API key; sent as ``Authorization: Bearer``
    api_key_env: str | None = None

    @property
    def label(self) -> str:
        return self.name or self.url


class Pool(_Base, frozen=True):
    """A set of backends serving one request class."""

    name: Name
    backends: Annotated[list[Backend], msgspec.Meta(min_length=1)]
    request_class: Name = msgspec.field(name="class", default="interactive")


class Model(_Base, frozen=True):
    """A public model name clients ask for, mapped to a pool and the name the backend knows."""

    name: Name
    pool: Name
    #: the model name sent to the backend; defaults to the public name
    backend_model: str | None = None
    owned_by: str = "gateway"

    @property
    def upstream_name(self) -> str:
        return self.backend_model or self.name


class Timeouts(_Base, frozen=True):
    """Upstream timeouts, in seconds."""

    connect: PositiveFloat = 5.0
    #: until the backend's response headers (for streams: headers, not the first token)
    first_byte: PositiveFloat = 120.0
    #: the longest silence allowed between two chunks of a response
    idle: PositiveFloat = 120.0
    #: the whole request
    total: PositiveFloat = 900.0


class Server(_Base, frozen=True):
    """Limits of the HTTP edge and the upstream hop."""

    max_body_bytes: PositiveInt = 8 * 1024 * 1024
    #: how long SIGTERM waits for in-flight requests and streams before cancelling them
    drain_timeout: Annotated[float, msgspec.Meta(ge=0)] = 30.0
    timeouts: Timeouts = msgspec.field(default_factory=Timeouts)
    #: keep-alive connections kept open per backend when idle
    keepalive_per_backend: PositiveInt = 256
    #: readiness: how often /readyz may re-check backend reachability, in seconds
    ready_check_interval: PositiveFloat = 5.0
    #: the upstream HTTP client: the lean built-in HTTP/1.1 client, or aiohttp
    upstream_client: Literal["native", "aiohttp"] = "native"


class ApiKey(_Base, frozen=True):
    """A static API key, stored only as the sha256 of the key (or read from an env variable)."""

    id: Name
    sha256: Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{64}$")] | None = None
    key_env: str | None = None


class Auth(_Base, frozen=True):
    """Who may call the gateway. Tenants and managed keys extend this."""

    #: when false, requests without a key are served (a local demo or a trusted sidecar)
    required: bool = True
    keys: list[ApiKey] = msgspec.field(default_factory=list)


class Policy(_Base, frozen=True):
    """A whole policy: what the gateway serves and how."""

    version: Literal[1] = 1
    server: Server = msgspec.field(default_factory=Server)
    auth: Auth = msgspec.field(default_factory=Auth)
    pools: list[Pool] = msgspec.field(default_factory=list)
    models: list[Model] = msgspec.field(default_factory=list)
