"""Stopping the batch runner while its state store hangs: ``stop()`` returns within its
timeout and every background loop of the runner ends (#14 point 18).

Found as ``gateway serve`` hanging at shutdown after a failed start with ``GATEWAY_REDIS_URL``
set. The cause: redis-py sends each command under ``asyncio.wait_for(..., socket_timeout)``,
and Python 3.11's ``wait_for`` *returns the result* instead of raising when its task is
cancelled in the one loop turn after the send finished. The refresh loop's cancel was lost
that way; the task stayed marked "cancelling", and from then on every
``asyncio.timeout(poll_interval)`` around its wait counted that cancel as its own and turned
its expiry into a TimeoutError: the loop never ended and ``stop()`` waited on it forever.

Everything here is real: a redis-server frozen with SIGSTOP (a TCP connect still succeeds in
the kernel's backlog and a command is still sent; no answer ever comes), the Redis batch
state, a gateway built from a policy, the runner's own loops.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from gateway.app.state import Gateway
from gateway.auth.resolver import Identity
from gateway.batch.files import LocalFileStore
from gateway.batch.jobs import BatchJobs
from gateway.batch.redis import RedisBatchState
from gateway.batch.runner import BatchRunner, LineAnswer, LineCall
from gateway.config.load import parse_policy
from tests.batch.common import MODEL, batch_policy, jsonl
from tests.redis_servers import RedisProc

BOUND = 60.0  # generous: a loaded box; a lost cancel means "never", not "late"


@pytest.fixture
async def gateway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Gateway]:
    """A gateway of two pools (its quota and ledger in memory: only the batch state is in
    the Redis under test)."""
    monkeypatch.delenv("GATEWAY_REDIS_URL", raising=False)
    data = batch_policy("http://127.0.0.1:9", "http://127.0.0.1:9", tmp_path / "files",
                        poll_interval=0.05, lease_seconds=3.0, chunk_lines=4,
                        max_in_flight=4)
    gw = Gateway(parse_policy(data))
    try:
        yield gw
    finally:
        gw.access_log.close()


async def answer(call: LineCall) -> LineAnswer:
    """A line's answer, after a little while (so lines are in flight when the runner stops)."""
    await asyncio.sleep(0.05)
    return LineAnswer(200, b'{"ok": true}')


def state_of(redis: RedisProc, socket_timeout: float | None) -> RedisBatchState:
    return RedisBatchState(Redis.from_url(redis.url, socket_timeout=socket_timeout,
                                          socket_connect_timeout=socket_timeout))


def runner_of(gateway: Gateway, state: RedisBatchState) -> BatchRunner:
    settings = gateway.runtime.policy.batch
    return BatchRunner(gateway, BatchJobs(settings, LocalFileStore(settings.files_dir), state),
                       answer)


async def stop_and_check(runner: BatchRunner, timeout: float) -> None:
    """``stop()`` returns, and then every loop task of the runner is done."""
    loops = list(runner._loops.values())
    stop = asyncio.create_task(runner.stop(timeout=timeout))
    await asyncio.wait([stop], timeout=BOUND)
    assert stop.done(), "stop() did not return"
    stop.result()
    await asyncio.wait(loops, timeout=BOUND)
    assert [t.get_name() for t in loops if not t.done()] == []


async def close(state: RedisBatchState) -> None:
    with contextlib.suppress(Exception):
        await asyncio.wait_for(state.close(), 10)


async def test_a_loop_whose_cancel_redis_swallowed_ends(
    gateway: Gateway, own_redis: RedisProc
) -> None:
    """The refresh loop is cancelled once (as ``stop()`` does first), a few loop turns after
    it started, at every turn of a range that covers its first command's send: at one of
    them the cancel lands in ``wait_for``'s window and is lost. Nothing cancels it again; it
    must end by itself (its command times out, and then the loop sees the cancel)."""
    own_redis.signal(signal.SIGSTOP)
    for turns in range(40):
        state = state_of(own_redis, socket_timeout=1.0)
        runner = runner_of(gateway, state)
        runner.start()
        for _ in range(turns):
            await asyncio.sleep(0)
        refresh = runner._loops["refresh"]
        refresh.cancel()
        await asyncio.wait([refresh], timeout=BOUND)
        assert refresh.done(), f"the refresh loop cancelled after {turns} turns kept running"
        await stop_and_check(runner, timeout=5.0)
        await close(state)


async def test_stop_right_after_start_while_redis_hangs(
    gateway: Gateway, own_redis: RedisProc
) -> None:
    """A gateway whose start failed stops its runner a few turns after starting it (#14
    point 18): ``stop()`` returns and every loop ends, at every turn of the range."""
    own_redis.signal(signal.SIGSTOP)
    for turns in range(40):
        state = state_of(own_redis, socket_timeout=1.0)
        runner = runner_of(gateway, state)
        runner.start()
        for _ in range(turns):
            await asyncio.sleep(0)
        await stop_and_check(runner, timeout=5.0)
        await close(state)


async def test_stop_is_bounded_while_redis_hangs_mid_batch(
    gateway: Gateway, own_redis: RedisProc
) -> None:
    """A batch running, then Redis frozen: its commands now never answer (no socket timeout),
    so the final checkpoint and the lease releases hang. ``stop()`` still returns within its
    timeout and the loops end; the leases left behind expire (another process resumes)."""
    state = state_of(own_redis, socket_timeout=None)
    jobs = runner_of(gateway, state).jobs
    upload = await jobs.upload("acme", "in.jsonl", "batch", jsonl(400), [MODEL])
    batch = await jobs.create(Identity("test", "acme"), upload.id, "/v1/chat/completions",
                              "24h", None, [MODEL])
    runner = BatchRunner(gateway, jobs, answer)
    runner.start()
    deadline = time.monotonic() + BOUND
    while not (await state.get_batch(batch.id) or batch).completed:  # lines are running
        assert time.monotonic() < deadline, "the batch never started"
        await asyncio.sleep(0.05)
    own_redis.signal(signal.SIGSTOP)
    await asyncio.sleep(0.3)  # the loops are now inside commands that never answer
    await stop_and_check(runner, timeout=2.0)
    own_redis.signal(signal.SIGCONT)
    await close(state)
