"""The policy's process settings: the HTTP edge, shared state, batch jobs and the console.

``server:``, ``store:``, ``batch:`` and ``console:`` in a policy: client connection bounds and
upstream hop settings, where limits, keys and the usage ledger live, how batch files are
bounded and the batch runner paces itself, and whether the web console is served.
"""

from __future__ import annotations

import ipaddress
from typing import Annotated, Literal

import msgspec

from gateway.config.base import PolicyStruct, PositiveFloat, PositiveInt
from gateway.config.routing import Timeouts

__all__ = [
    "Batch",
    "CallLimits",
    "ClientLimits",
    "Console",
    "Server",
    "Store",
]


class ClientLimits(PolicyStruct, frozen=True):
    """Bounds on what one client connection may hold, per worker process (the HTTP edge).

    The header and body timeouts and the idle bound are enforced by the native server
    protocol; under ``http_protocol: uvicorn`` only ``keep_alive_timeout`` and
    ``max_connections`` apply (uvicorn has no header or body timeout).
    """

    #: open client connections per worker; beyond it a new connection is answered 503 and
    #: closed at once (``null``: no limit)
    max_connections: PositiveInt | None = 10_000
    #: seconds a connection may sit idle between requests (bytes that start no request, such
    #: as bare CRLFs, do not count as activity)
    keep_alive_timeout: PositiveFloat = 75.0
    #: seconds a client may take to send a request's line and headers once it has started
    header_timeout: PositiveFloat = 30.0
    #: seconds a client may take to send a request's whole body once its headers are in
    #: (time the gateway spends not reading, under back-pressure, is not counted): a client
    #: sending a byte every 2 s is answered 408 and closed
    body_timeout: PositiveFloat = 60.0


class CallLimits(PolicyStruct, frozen=True):
    """The per-key limit of the routes that work per call but are not inference (token
    counting, stored-response reads, usage queries): a token bucket per key and worker."""

    #: calls per minute per key and worker process (``null``: no limit)
    rpm: PositiveInt | None = 300
    #: calls a key may make at once before the per-minute rate applies (``null``: ``rpm``)
    burst: PositiveInt | None = None

    @property
    def bucket(self) -> int:
        """The bucket's size: ``burst``, or a minute's worth of calls."""
        return self.burst or self.rpm or 1


class Server(PolicyStruct, frozen=True):
    """Limits of the HTTP edge and the upstream hop."""

    max_body_bytes: PositiveInt = 8 * 1024 * 1024
    #: how long SIGTERM waits for in-flight requests and streams before cancelling them
    drain_timeout: Annotated[float, msgspec.Meta(ge=0)] = 30.0
    timeouts: Timeouts = msgspec.field(default_factory=Timeouts)
    #: client connections: how many, how long idle, how long to send headers and body
    limits: ClientLimits = msgspec.field(default_factory=ClientLimits)
    #: keep-alive connections kept open per backend when idle
    keepalive_per_backend: PositiveInt = 256
    #: readiness: how often /readyz may re-check backend reachability, in seconds
    ready_check_interval: PositiveFloat = 5.0
    #: seconds between checks of the policy file for changes (0 = no watching; SIGHUP and
    #: POST /admin/reload still reload)
    watch_interval: Annotated[float, msgspec.Meta(ge=0)] = 2.0
    #: the upstream HTTP client: the lean built-in HTTP/1.1 client, or aiohttp
    upstream_client: Literal["native", "aiohttp"] = "native"
    #: the HTTP/1.1 server protocol under uvicorn: the gateway's lean one, or uvicorn's own
    #: httptools protocol (``uvicorn``); uvicorn runs the sockets, workers and drain either way
    http_protocol: Literal["native", "uvicorn"] = "native"
    #: the per-key limit of count_tokens, stored-response reads and usage queries
    call_limits: CallLimits = msgspec.field(default_factory=CallLimits)


class Store(PolicyStruct, frozen=True):
    """Where shared state lives: Redis when a URL is configured, else in this process."""

    #: environment variable holding the Redis URL (redis:// or rediss://); unset = embedded
    redis_url_env: str = "GATEWAY_REDIS_URL"
    #: Redis Cluster instead of a single Redis
    cluster: bool = False
    #: on a Redis outage: "open" falls back to local limits (each process's share), "closed"
    #: answers 503
    outage: Literal["open", "closed"] = "open"
    #: no request waits on Redis longer than this, in seconds
    timeout: PositiveFloat = 0.25
    #: gateway processes sharing the limits (each gets 1/processes of them when failing open)
    processes: PositiveInt = 1
    #: where managed API keys live without Redis (a JSON file); default: no managed keys
    keys_file: str | None = None
    #: environment variable holding the ledger database URL (postgresql://... or
    #: sqlite:///path); unset = SQLite at ``<data_dir>/ledger.db``
    ledger_url_env: str = "GATEWAY_LEDGER_URL"
    #: this process's own files: the embedded SQLite ledger (``ledger.db``)
    data_dir: str = "./gateway-data"
    #: "auto" (the default): "process" where ``spool_dir`` is on this host's own disk, else
    #: "commit" (a network share keeps no promise the database's commit does not keep
    #: better). "process": the record is written to the local journal in ``spool_dir`` before
    #: the response's last bytes (a killed process cannot lose it: the page cache is the
    #: kernel's), its fdatasync follows in the background within a group (a host crash in
    #: that window may lose it). "commit": a response's last bytes go out only once its usage
    #: record is durable in the database (committed, or fsync'd to the spool while it is
    #: away; one commit serves every request that finished meanwhile); "journal": once the
    #: record is fsync'd to the local journal (one fsync per group; the records reach the
    #: database in the background batches of "buffered", and a dead process's journal is
    #: replayed at the next start): survives SIGKILL like "commit", not the loss of the disk;
    #: "buffered": records are flushed every 50 ms after the response, and a SIGKILL may lose
    #: the last ~50 ms
    ledger_durability: Literal["auto", "commit", "journal", "process", "buffered"] = "auto"
    #: apply missing ledger schema migrations at start (else run ``gateway db migrate``;
    #: the embedded SQLite ledger always migrates its own file)
    ledger_migrate: bool = False
    #: the longest a response waits for its usage record, seconds: a flush the database has
    #: not committed within it (less 0.25 s for the spool's write) goes to the spool, and a
    #: record neither can take by then fails its response with 503 ``usage_not_recorded``
    ledger_timeout: PositiveFloat = 2.0
    #: the local spool: usage records wait here (fsync'd) while the ledger database is away
    spool_dir: str = "./gateway-spool"
    #: days raw usage records are kept (whole day partitions are dropped); the hourly
    #: rollups that usage queries read are kept
    usage_retention_days: PositiveInt = 90
    #: hours a stored response (Responses API ``store: true``, the default) can be retrieved
    #: and continued with ``previous_response_id``; 720 = 30 days, as OpenAI keeps them
    responses_ttl_hours: PositiveFloat = 720.0


class Batch(PolicyStruct, frozen=True):
    """OpenAI batch jobs: file limits, where files live, and how the runner paces itself."""

    #: uploaded and generated files (and, without Redis, the batch state database)
    files_dir: str = "./gateway-files"
    #: an uploaded batch file larger than this is refused (413)
    max_file_bytes: PositiveInt = 100 * 1024 * 1024
    #: requests (lines) per batch file, at most
    max_lines: PositiveInt = 50_000
    #: one line's request body, at most
    max_line_bytes: PositiveInt = 1024 * 1024
    #: how many line problems a refusal lists
    report_errors: PositiveInt = 20
    #: run batches in this process (false: this replica only serves the API)
    run: bool = True
    #: lines per lease: a process claims this many lines at a time
    chunk_lines: PositiveInt = 64
    #: a lease not renewed for this long is taken over by another process
    lease_seconds: PositiveFloat = 30.0
    #: how often each process looks for new, cancelled or finished batches
    poll_interval: PositiveFloat = 0.5
    #: batch lines in flight in one process, at most
    max_in_flight: PositiveInt = 512
    #: batch lines in flight in one process while interactive traffic is pressed (>= 1 keeps
    #: batches moving)
    min_in_flight: Annotated[int, msgspec.Meta(ge=0)] = 1
    #: interactive pools count as pressed above this share of their capacity (or with a queue)
    interactive_share: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.8
    #: seconds a line refused for quota or capacity (429/503) waits before it is tried again
    retry_after: PositiveFloat = 1.0


class Console(PolicyStruct, frozen=True):
    """The web console served at ``/console`` (``gateway/console/``): off unless enabled."""

    enabled: bool = False
    #: minutes a console session lasts from its sign-in (then it must sign in again)
    session_minutes: PositiveFloat = 30.0
    #: the session cookie's ``Secure`` flag: ``auto`` when the request came over https to the
    #: gateway itself; ``always`` behind a proxy that ends TLS (the gateway then sees http,
    #: the browser https); ``never`` only for plain-http tests
    secure_cookie: Literal["auto", "always", "never"] = "auto"
    #: the proxies in front of the gateway (addresses or CIDR blocks): from a peer among them,
    #: the console takes the client's address from ``X-Forwarded-For`` (the last hop not
    #: among them), for the sign-in bound and the audit log; from any other peer, the peer's
    trusted_proxies: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for entry in self.trusted_proxies:
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError as exc:
                raise ValueError(f"console.trusted_proxies: {entry!r} is not an address or "
                                 f"a CIDR block") from exc
