"""One request's quota reservation, held from admission to its settle.

``Admission`` owns it: ``reserve`` before forwarding, a lease renewal timer while the request
runs, and ``settle`` (or ``cancel``) exactly once on every exit path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from gateway.quota.base import QuotaRequest

if TYPE_CHECKING:
    from gateway.quota.base import Decision, QuotaStore, Reservation

__all__ = ["Admission"]

_log = logging.getLogger("gateway.quota")


class Admission:
    """One request's quota reservation (per request, not shared)."""

    __slots__ = ("_renewer", "_settled", "_timer", "reservation", "store")

    def __init__(self, store: QuotaStore) -> None:
        self.store = store
        self.reservation: Reservation | None = None
        self._settled = False
        self._renewer: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None

    async def reserve(self, request: QuotaRequest) -> Decision:
        decision = await self.store.reserve(request)
        if decision.admitted and decision.reservation is not None:
            self.reservation = decision.reservation
            if decision.reservation.renew_every > 0:
                # a timer, not a task: most requests end long before the first renewal
                self._timer = asyncio.get_running_loop().call_later(
                    decision.reservation.renew_every, self._start_renewing)
        return decision

    def _start_renewing(self) -> None:
        self._timer = None
        if not self._settled:
            self._renewer = asyncio.get_running_loop().create_task(self._renew())

    async def _renew(self) -> None:
        res = self.reservation
        assert res is not None
        while True:
            try:
                if not await self.store.renew(res):
                    _log.warning("quota lease of %s could not be renewed", res.request_id)
            except Exception as exc:  # an outage: the slot may lapse, the stream goes on
                _log.warning("quota lease renewal failed for %s: %s", res.request_id, exc)
            await asyncio.sleep(res.renew_every)

    async def settle(self, actual_tokens: int | None, actual_cost: int = 0) -> None:
        """Once: the real tokens and cost (None = never reached a backend: cancel)."""
        if self._settled or self.reservation is None:
            return
        self._settled = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._renewer
        try:
            if actual_tokens is None:
                await self.store.cancel(self.reservation)
            else:
                await self.store.settle(self.reservation, actual_tokens, actual_cost)
        except Exception as exc:  # the store queues failed settles; never fail the response
            _log.warning("quota settle failed for %s: %s", self.reservation.request_id, exc)
