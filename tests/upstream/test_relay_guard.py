"""The relay's bounded ``send`` (``_Guarded``): a write that waits ``client_stall`` for the
client is cancelled, a stream that keeps moving is not, and the check costs no timer per chunk
(the end-to-end behaviour, on real sockets, is ``test_relay_client_stall.py``)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from gateway.timers.deadlines import DeadlineWheel, wheel
from gateway.upstream.relay import _Expired, _Guarded, _Stalled

PART = b"data: x\n\n"
BODY = {"type": "http.response.body", "body": PART, "more_body": True}


async def test_a_write_that_waits_past_client_stall_is_cancelled() -> None:
    blocked = asyncio.get_running_loop().create_future()  # the client stops reading
    calls = 0

    async def send(message: Any) -> None:
        nonlocal calls
        calls += 1
        if calls > 1:
            await blocked

    guarded = _Guarded(send, time.monotonic() + 600, stall=0.2)
    try:
        async with asyncio.timeout(20):  # generous: the bound is 0.2 s
            await guarded(BODY)  # progress: not a stall
            with pytest.raises(_Stalled):
                await guarded(BODY)
        assert guarded.stalled and not guarded.expired
        # the waiting write is not counted as sent
        assert (guarded.sent, guarded.chunks) == (len(PART), 1)
        with pytest.raises(_Stalled):  # nothing more is sent (no error event, no end)
            await guarded(BODY)
        assert not asyncio.current_task().cancelling()  # type: ignore[union-attr]
    finally:
        guarded.close()


async def test_writes_that_progress_are_never_cut_and_arm_no_timer_per_chunk(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two seconds of writes, each waiting a little for the client, with a 1 s bound: every one
    goes out, and the stall check was armed a handful of times, not once per write."""
    adds = 0
    real_add = DeadlineWheel.add

    def counting_add(self: DeadlineWheel, delay: float, callback: Any) -> int:
        nonlocal adds
        adds += 1
        return real_add(self, delay, callback)

    monkeypatch.setattr(DeadlineWheel, "add", counting_add)

    entries = 0

    async def send(message: Any) -> None:
        nonlocal entries
        entries = max(entries, len(wheel()))
        await asyncio.sleep(0.02)  # back-pressure: the client reads, slowly

    guarded = _Guarded(send, time.monotonic() + 600, stall=1.0)
    try:
        writes = 0
        started = time.monotonic()
        while time.monotonic() - started < 2.0:
            await guarded(BODY)
            writes += 1
        assert not guarded.stalled
        assert guarded.chunks == writes and guarded.sent == writes * len(PART)
        assert writes > 20
        assert adds <= 1 + 10, (adds, writes)  # the deadline, then ~one check a second
        assert entries == 1  # one wheel entry: the deadline, or a check before it
    finally:
        guarded.close()
    assert len(wheel()) == 0  # close leaves nothing on the wheel


async def test_the_deadline_still_cuts_a_write_before_its_stall_bound() -> None:
    async def send(message: Any) -> None:
        await asyncio.Event().wait()  # never

    guarded = _Guarded(send, time.monotonic() + 0.2, stall=5.0)
    try:
        async with asyncio.timeout(20):
            with pytest.raises(_Expired):
                await guarded(BODY)
        assert guarded.expired and not guarded.stalled
    finally:
        guarded.close()


async def test_no_stall_bound_arms_nothing() -> None:
    async def send(message: Any) -> None:
        pass

    guarded = _Guarded(send, time.monotonic() + 600)  # client_stall unset: unbounded
    try:
        for _ in range(10):
            await guarded(BODY)
        assert len(wheel()) == 1  # the deadline only
    finally:
        guarded.close()
