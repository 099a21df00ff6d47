"""The batch runner: one per gateway process, started and stopped with the gateway.

Four small loops share the work of every active batch:

- **refresh** (every ``poll_interval``, or at once when poked): reads the active batches and
  moves each along: validating -> in_progress; all lines recorded -> finalize; cancelling ->
  stop starting lines, finalize once no lease is held; past ``expires_at`` -> expired.
- **dispatch** (when woken, and every ``DISPATCH_TICK`` while a batch is open on this
  process): claims chunks of lines (leases) and starts lines while the pacing rule of
  :mod:`gateway.batch.control` allows. A line runs through the same pipeline as a live
  request (``execute``: auth is the batch's key, class ``batch``, quotas, routing, retries,
  accounting, one usage record tagged with the batch id, request id ``<batch>_<index>``).
- **checkpoint** (every 50 ms while a batch is open on this process): makes the usage
  records of finished lines durable (``ledger.flush``), *then* records the lines' results
  (first result per line wins) and releases chunks whose lines are all recorded. A process
  killed at any point re-runs at most the lines it had not recorded; their usage records
  dedupe on the request id.
- **renew**: extends this process's leases; a lease lost to another process drops its lines.

Every loop ends when cancelled, even when the cancel was swallowed below it (redis-py's sends
under Python 3.11's ``wait_for``; see :mod:`gateway.batch.waits`), and ``stop()`` returns
within its timeout whatever the state store does.

A line answered 429 (quota, or every backend asking to wait) or 503 (no capacity, quota store
away, shutting down) is not a failure: it is tried again after ``retry_after``, until the
batch expires. Any other non-200 answer is final and goes to the error file.

This module runs the lines (dispatch, checkpoint, renew, and ``stop()``); the refresh loop and
the finalizing of a batch are its base's, :class:`~gateway.batch.lifecycle.BatchLifecycle`;
the per-batch record is :class:`~gateway.batch.work.Work`.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import os
import socket
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from gateway.auth.resolver import Identity
from gateway.batch.control import load_of, target_in_flight
from gateway.batch.lifecycle import FINALIZE_LEASE as FINALIZE_LEASE
from gateway.batch.lifecycle import BatchLifecycle
from gateway.batch.output import answer_line, error_line, request_id_of
from gateway.batch.validate import parse_line
from gateway.batch.waits import check_cancelled, wait_event, wait_until
from gateway.batch.work import Work, line_custom_id, max_held, pools_of
from gateway.errors import InvalidRequest
from gateway.pipeline import LineAnswer

if TYPE_CHECKING:
    from gateway.batch.jobs import BatchJobs
    from gateway.batch.objects import LineResult
    from gateway.ledger import Ledger
    from gateway.runtime import Runtime

__all__ = ["BatchRunner", "Execute", "LineAnswer", "LineCall"]

_log = logging.getLogger("gateway.batch")

CHECKPOINT_INTERVAL = 0.05
DISPATCH_TICK = 0.05  # re-check interactive pressure at least this often
RETRY_STATUS = frozenset({429, 503})


@dataclass(frozen=True, slots=True)
class LineCall:
    """One batch line as a request of the live pipeline."""

    identity: Identity
    batch_id: str
    request_id: str
    endpoint: str
    body: bytes


Execute = Callable[[LineCall], Awaitable[LineAnswer]]

#: the record's old name here (tests build one through it)
_Work = Work


class Host(Protocol):
    """What the runner reads of the process it runs in: the current policy snapshot, whether
    it is shutting down, and its ledger (flushed before leases are released)."""

    @property
    def runtime(self) -> Runtime: ...
    @property
    def draining(self) -> bool: ...
    @property
    def ledger(self) -> Ledger: ...


class BatchRunner(BatchLifecycle):
    """Runs the lines of every active batch in this process; see the module docstring."""

    def __init__(self, gateway: Host, jobs: BatchJobs, execute: Execute) -> None:
        self.gateway = gateway
        self.jobs = jobs
        self.execute = execute
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{os.urandom(4).hex()}"
        self._works: dict[str, Work] = {}
        self._mine: Counter[str] = Counter()  # this process's batch lines in flight, by pool
        self._wake = asyncio.Event()  # dispatch
        self._poke = asyncio.Event()  # refresh
        self._opened = asyncio.Event()  # checkpoint: a batch's work opened on this process
        self._lines: set[asyncio.Task[None]] = set()
        self._loops: dict[str, asyncio.Task[None]] = {}
        self._left: set[asyncio.Task[None]] = set()  # still running after stop(): kept referenced
        self._stopping = False
        self._turn = 0

    # -- lifecycle
    def start(self) -> None:
        for name, loop in (("refresh", self._refresh_loop), ("dispatch", self._dispatch_loop),
                           ("checkpoint", self._checkpoint_loop), ("renew", self._renew_loop)):
            self._loops[name] = asyncio.create_task(loop(), name=f"batch-{name}")

    async def stop(self, timeout: float = 10.0) -> None:
        """Start nothing new, let lines in flight finish, record them, and free this process's
        leases for the other processes; return within ``timeout`` whatever the state store
        does.

        The lines get ``timeout`` less a reserve (a quarter), the final checkpoint and the
        loops' exit share the reserve. Nothing is awaited without a bound: a task is waited
        on with ``asyncio.wait(..., timeout)``, which does not depend on the task honouring
        its cancel (see :func:`check_cancelled` for one that did not). A save or a loop still
        running at the deadline is cancelled and left behind (logged); the leases it held
        expire and another process resumes their lines, which dedupe on their request ids.
        """
        now = asyncio.get_running_loop().time
        deadline = now() + timeout
        reserve = timeout / 4
        self._stopping = True
        for name in ("refresh", "dispatch"):
            if name in self._loops:
                self._loops[name].cancel()
        await wait_until(self._lines, deadline - reserve, now)
        for task in list(self._lines):
            task.cancel()
        await wait_until(self._lines, deadline - reserve * 3 / 4, now)
        save = asyncio.create_task(self._final_save(), name="batch-final-save")
        if await wait_until({save}, deadline - reserve / 4, now):
            _log.warning("batch runner: final checkpoint unfinished at shutdown; its leases"
                         " will expire")
            save.cancel()
            self._leave({save})
        for task in self._loops.values():
            task.cancel()
        left = await wait_until(set(self._loops.values()), deadline, now)
        if left:
            _log.warning("batch runner: %s still running at shutdown",
                         ", ".join(sorted(t.get_name() for t in left)))
            self._leave(left)
        for task in self._loops.values():
            if task.done() and not task.cancelled() and task.exception() is not None:
                _log.error("batch runner: %s failed", task.get_name(),
                           exc_info=task.exception())

    def _leave(self, tasks: set[asyncio.Task[None]]) -> None:
        """Keep tasks still running after ``stop()`` referenced until they end."""
        for task in tasks:
            self._left.add(task)
            task.add_done_callback(self._left.discard)

    async def _final_save(self) -> None:
        """Record what the lines answered and give back every chunk still held."""
        try:
            await self._checkpoint()
            for work in list(self._works.values()):
                await self._release_all(work)
        except Exception:
            _log.exception("batch runner: final checkpoint failed; leases will expire")

    # -- dispatch: claim chunks and start lines at the pace the pools allow
    async def _dispatch_loop(self) -> None:
        while True:
            self._wake.clear()
            try:
                await self._dispatch()
            except Exception:
                _log.exception("batch runner: dispatch failed")
                check_cancelled()
                await asyncio.sleep(self.settings.poll_interval)
            # with no batch on this process nothing needs the tick: sleep until one opens
            await wait_event(self._wake, DISPATCH_TICK if self._works else None)

    async def _dispatch(self) -> None:
        if self.gateway.draining or self._stopping:
            return
        works = list(self._works.values())
        self._turn += 1
        if works:  # take turns: each batch gets the first pick in its turn
            shift = self._turn % len(works)
            works = works[shift:] + works[:shift]
        settings = self.settings
        for work in works:
            if work.stopping:
                continue
            runtime = self.gateway.runtime
            pools = pools_of(runtime, work.record.model)
            if pools is None:
                continue
            batch_pool, interactive = pools
            while not work.stopping:
                now = time.monotonic()
                target = target_in_flight(
                    load_of(batch_pool, now), [load_of(p, now) for p in interactive],
                    self._mine[batch_pool.name], share=settings.interactive_share,
                    floor=settings.min_in_flight, ceiling=settings.max_in_flight)
                if self._mine[batch_pool.name] >= target or work.in_flight >= int(work.cap):
                    break
                index = work.next_ready(now)
                if index is None:
                    if work.exhausted or len(work.held) >= max_held(settings):
                        break
                    claimed = await self._claim(work)
                    check_cancelled()  # stopped meanwhile: start no line of that chunk
                    if not claimed or self._stopping:
                        break
                    continue
                self._start(work, index, batch_pool.name)

    async def _claim(self, work: Work) -> bool:
        state = self.jobs.state
        chunk = await state.claim_chunk(work.record, self.owner, self.settings.lease_seconds,
                                        time.time())
        if chunk is None:
            work.exhausted = True
            return False
        lines = work.record.chunk_range(chunk)
        remaining = set(lines) - await state.done_lines(work.id, lines)
        if not remaining or work.stopping:
            await state.release_chunk(work.id, chunk, self.owner, done=not remaining)
            return not work.stopping
        work.held[chunk] = remaining
        work.ready.extend(sorted(remaining))
        return True

    def _start(self, work: Work, index: int, pool: str) -> None:
        self._mine[pool] += 1
        work.in_flight += 1
        task = asyncio.create_task(self._run_line(work, index, pool))
        self._lines.add(task)
        task.add_done_callback(self._lines.discard)

    async def _run_line(self, work: Work, index: int, pool: str) -> None:
        batch_id = work.id
        try:
            try:
                request, _ = parse_line(work.lines[index])
            except InvalidRequest as exc:  # the file was valid at upload: only if it changed
                work.results.append(error_line(batch_id, index, line_custom_id(work.lines[index]),
                                               "invalid_request", exc.message))
                return
            answer = await self.execute(LineCall(
                work.identity, batch_id, request_id_of(batch_id, index), request.url,
                request.body))
            if answer.status in RETRY_STATUS:
                if answer.status == 429:
                    work.cap = max(1.0, work.in_flight / 2)
                heapq.heappush(work.delayed,
                               (time.monotonic() + self.settings.retry_after, index))
                return
            work.cap = min(float(self.settings.max_in_flight), work.cap + 1)
            work.results.append(answer_line(batch_id, index, request.custom_id, answer.status,
                                            answer.body))
        except Exception:
            _log.exception("batch %s line %d: unexpected error; retrying later", batch_id, index)
            heapq.heappush(work.delayed, (time.monotonic() + self.settings.retry_after, index))
        finally:
            self._mine[pool] -= 1
            work.in_flight -= 1
            self._wake.set()

    # -- checkpoint: usage records durable first, then the results
    async def _checkpoint_loop(self) -> None:
        while True:
            check_cancelled()
            if not self._works:  # nothing to save or release until a batch opens here
                self._opened.clear()
                await wait_event(self._opened, None)
            await asyncio.sleep(CHECKPOINT_INTERVAL)
            try:
                await self._checkpoint()
            except Exception:
                _log.exception("batch runner: checkpoint failed; will retry")

    async def _checkpoint(self) -> None:
        pending = [(w, w.results) for w in list(self._works.values()) if w.results]
        for work, results in pending:
            work.results = []
            work.saving += len(results)
        recorded = 0
        try:
            if pending:
                await self.gateway.ledger.flush()
            for work, results in pending:
                await self.jobs.state.record_results(work.id, results)
                recorded += 1
                work.saving -= len(results)
                await self._release_finished(work, results)
        except BaseException:
            for work, results in pending[recorded:]:  # the next checkpoint tries again
                work.results[:0] = results
                work.saving -= len(results)
            raise
        for work in [w for w in self._works.values() if w.stopping]:
            if work.idle:
                await self._release_all(work)
                self._works.pop(work.id, None)
                self.poke()

    async def _release_finished(self, work: Work, results: list[LineResult]) -> None:
        """Give back the chunks whose every line now has a recorded result."""
        finished = []
        for result in results:
            chunk = result.index // work.record.chunk_lines
            remaining = work.held.get(chunk)
            if remaining is not None:
                remaining.discard(result.index)
                if not remaining:
                    finished.append(chunk)
        for chunk in finished:
            del work.held[chunk]
            await self.jobs.state.release_chunk(work.id, chunk, self.owner, done=True)
        if finished and not work.held and work.exhausted:
            self.poke()  # maybe the last lines: finalize soon

    # -- renew: keep this process's leases
    async def _renew_loop(self) -> None:
        while True:
            check_cancelled()
            await asyncio.sleep(self.settings.lease_seconds / 3)
            for work in list(self._works.values()):
                for chunk in list(work.held):
                    check_cancelled()
                    try:
                        kept = await self.jobs.state.renew_chunk(
                            work.id, chunk, self.owner, self.settings.lease_seconds, time.time())
                    except Exception:
                        _log.exception("batch %s: lease renewal failed", work.id)
                        continue
                    if not kept:
                        _log.warning("batch %s: lost the lease on chunk %d", work.id, chunk)
                        work.drop_chunk(chunk)

    def __repr__(self) -> str:
        in_flight = sum(w.in_flight for w in self._works.values())
        return (f"<BatchRunner {self.owner} [batches: {len(self._works)} | in flight: "
                f"{in_flight}]>")
