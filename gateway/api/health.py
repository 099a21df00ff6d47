"""``/healthz`` (the process is alive) and ``/readyz`` (config loaded, pools reachable).

Readiness asks whether each pool has at least one backend that accepts a TCP connection. The
answer, when good, is cached for ``server.ready_check_interval`` so a probe storm does not
become a connect storm against the backends; a bad answer is re-checked on every probe.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from collections.abc import Callable

    from gateway.routing.backend import BackendState
    from gateway.runtime import Runtime

__all__ = ["Readiness"]


async def _reachable(backend: BackendState, timeout: float) -> bool:
    parts = urlsplit(backend.config.url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        async with asyncio.timeout(timeout):
            _, writer = await asyncio.open_connection(parts.hostname, port)
    except (OSError, TimeoutError):
        return False
    writer.close()
    return True


class Readiness:
    """Cached readiness of a runtime's pools."""

    def __init__(self, current: Callable[[], Runtime], timeout: float = 1.0) -> None:
        self.current = current
        self.timeout = timeout
        self._checked_at = 0.0
        self._result: dict[str, bool] = {}

    async def pools(self) -> dict[str, bool]:
        """Pool name -> has a reachable backend."""
        now = time.monotonic()
        stale = now - self._checked_at >= self.current().policy.server.ready_check_interval
        # a failure is re-checked on every probe, so recovery shows at once
        if stale or not all(self._result.values()):
            result: dict[str, bool] = {}
            for name, pool in self.current().router.pools.items():
                checks = await asyncio.gather(*(_reachable(b, self.timeout) for b in pool.backends))
                result[name] = any(checks)
            self._result, self._checked_at = result, now
        return self._result
