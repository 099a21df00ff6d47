"""Signed webhook deliveries from a bounded queue, retried with back-off, off the request path.

:meth:`WebhookSender.submit` only puts the delivery on a bounded queue (never blocks, never
awaits); a full queue drops it and counts ``dropped``. A few worker tasks drain the queue and
POST each body, retrying connect errors, timeouts, 408, 425, 429 and 5xx answers with
exponential back-off and jitter (a ``Retry-After`` of a 429/503 is honoured up to the maximum
delay); any other answer is final. Redirects are not followed.

Every POST carries::

    Content-Type: application/json
    X-Gateway-Event: budget.threshold
    X-Gateway-Delivery: <the alert's id: the same on every retry and from every replica>
    X-Gateway-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>." + body)>

``t`` is the time of that attempt. A receiver recomputes the HMAC over the timestamp, a dot and
the raw body bytes with the shared secret, compares in constant time, and refuses a ``t`` far
from its clock (replays); :func:`verify` does exactly that.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import aiohttp

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = [
    "DELIVERY_HEADER",
    "EVENT_HEADER",
    "SIGNATURE_HEADER",
    "Delivery",
    "Outcome",
    "WebhookSender",
    "sign",
    "verify",
]

_log = logging.getLogger("gateway.alerts.webhook")

SIGNATURE_HEADER = "X-Gateway-Signature"
EVENT_HEADER = "X-Gateway-Event"
DELIVERY_HEADER = "X-Gateway-Delivery"

#: what happened to a delivery (the ``outcome`` label of the webhook metric)
Outcome = Literal["delivered", "retried", "failed", "dropped"]

_RETRYABLE = frozenset({408, 425, 429, 500, 502, 503, 504})


def sign(secret: bytes, timestamp: int, body: bytes) -> str:
    """The ``X-Gateway-Signature`` value of ``body`` sent at ``timestamp``."""
    mac = hmac.new(secret, b"%d." % timestamp + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


def verify(secret: bytes, header: str, body: bytes, *, now: float | None = None,
           tolerance: float = 300.0) -> bool:
    """Whether ``header`` signs ``body`` with ``secret`` within ``tolerance`` seconds of now.

    Any malformed header (no ``t`` or ``v1``, a timestamp that is not an integer, a signature
    that is not hex, non-ASCII bytes) is False, never an exception: a receiver calls this on
    whatever arrived. A valid signature can be replayed inside the tolerance window, so
    receivers deduplicate on the ``X-Gateway-Delivery`` id (stable across retries of one
    delivery) as well as checking the signature.
    """
    fields = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
    try:
        timestamp = int(fields["t"])
        given = fields["v1"].encode("ascii")
    except (KeyError, ValueError, UnicodeEncodeError):
        return False
    if abs((time.time() if now is None else now) - timestamp) > tolerance:
        return False
    expected = sign(secret, timestamp, body).rpartition("v1=")[2].encode("ascii")
    return hmac.compare_digest(expected, given)


@dataclass(frozen=True, slots=True)
class Delivery:
    """One POST to make: where, the signing secret, the body and its stable id."""

    url: str
    secret: bytes
    body: bytes
    id: str
    #: the ``X-Gateway-Event`` header
    event: str = "budget.threshold"

    def __repr__(self) -> str:  # never the secret, nor a URL that may hold a token
        return f"<Delivery {self.id}>"


class WebhookSender:
    """A bounded queue of deliveries and the tasks that make them.

    Args:
        queue_size: deliveries waiting at most; beyond it ``submit`` drops (and counts).
        workers: deliveries in progress at once (each retries on its own).
        attempts: tries per delivery, the first included.
        base_delay: the pause after the first failure, seconds; doubled per failure.
        max_delay: the longest pause.
        timeout: bound of one attempt (connect, send, answer), seconds.
        on_outcome: called with each :data:`Outcome` (metrics); must not block.
    """

    def __init__(self, *, queue_size: int = 1000, workers: int = 2, attempts: int = 6,
                 base_delay: float = 1.0, max_delay: float = 60.0, timeout: float = 10.0,
                 on_outcome: Callable[[Outcome], None] | None = None) -> None:
        self._queue: asyncio.Queue[Delivery] = asyncio.Queue(maxsize=queue_size)
        self._workers = workers
        self._attempts = attempts
        self._base_delay = base_delay
        self._max_delay = max_delay
        self._timeout = timeout
        self._on_outcome = on_outcome
        self._tasks: list[asyncio.Task[None]] = []
        self._session: aiohttp.ClientSession | None = None
        self._closed = False

    def __repr__(self) -> str:
        return (f"<WebhookSender [queued: {self._queue.qsize()} | "
                f"workers: {len(self._tasks)}]>")

    @property
    def queued(self) -> int:
        return self._queue.qsize()

    def submit(self, delivery: Delivery) -> bool:
        """Queue a delivery; False (and a ``dropped`` count) when the queue is full or closed."""
        if self._closed:
            self._count("dropped")
            return False
        try:
            self._queue.put_nowait(delivery)
        except asyncio.QueueFull:
            _log.warning("budget alert webhook queue full; dropped %s", delivery.id)
            self._count("dropped")
            return False
        return True

    def start(self) -> None:
        """Start the workers (on the running loop)."""
        if self._tasks:
            return
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._work()) for _ in range(self._workers)]

    async def aclose(self, drain: float = 2.0) -> None:
        """Stop taking deliveries, give the queue up to ``drain`` seconds, then stop."""
        self._closed = True
        if self._tasks:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(drain):
                    await self._queue.join()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        left = self._queue.qsize()
        if left:
            _log.warning("budget alert webhooks: %d deliveries not made at shutdown", left)
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- the workers ----------------------------------------------------------------------

    async def _work(self) -> None:
        while True:
            delivery = await self._queue.get()
            try:
                await self._deliver(delivery)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug must not end the worker
                _log.exception("budget alert webhook %s failed", delivery.id)
                self._count("failed")
            finally:
                self._queue.task_done()

    async def _deliver(self, delivery: Delivery) -> None:
        for attempt in range(1, self._attempts + 1):
            retry, wait, why = await self._post(delivery)
            if not retry:
                return
            if attempt == self._attempts:
                _log.warning("budget alert webhook %s failed after %d attempts: %s",
                             delivery.id, attempt, why)
                self._count("failed")
                return
            self._count("retried")
            await asyncio.sleep(wait if wait is not None else self._pause(attempt))

    def _pause(self, attempt: int) -> float:
        """Exponential back-off with jitter: half to all of ``base * 2**(attempt-1)``."""
        delay = min(self._max_delay, self._base_delay * 2.0 ** min(attempt - 1, 30))
        return delay * random.uniform(0.5, 1.0)

    async def _post(self, delivery: Delivery) -> tuple[bool, float | None, str]:
        """One attempt: (retry?, the receiver's Retry-After if it gave one, why it failed)."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self._timeout))
        headers = {
            "Content-Type": "application/json",
            EVENT_HEADER: delivery.event,
            DELIVERY_HEADER: delivery.id,
            SIGNATURE_HEADER: sign(delivery.secret, int(time.time()), delivery.body),
        }
        try:
            async with self._session.post(delivery.url, data=delivery.body, headers=headers,
                                          allow_redirects=False) as answer:
                await answer.read()
                status = answer.status
                retry_after = answer.headers.get("Retry-After", "")
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            return True, None, type(exc).__name__
        if 200 <= status < 300:
            self._count("delivered")
            return False, None, ""
        if status not in _RETRYABLE:
            _log.warning("budget alert webhook %s refused with %d; not retried",
                         delivery.id, status)
            self._count("failed")
            return False, None, f"HTTP {status}"
        wait = None
        if retry_after.isdigit():
            wait = min(float(retry_after), self._max_delay)
        return True, wait, f"HTTP {status}"

    def _count(self, outcome: Outcome) -> None:
        if self._on_outcome is not None:
            try:
                self._on_outcome(outcome)
            except Exception:
                _log.exception("budget alert webhook outcome hook failed")
