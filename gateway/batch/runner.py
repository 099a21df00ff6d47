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
under Python 3.11's ``wait_for``; see ``_check_cancelled``), and ``stop()`` returns within its
timeout whatever the state store does.

A line answered 429 (quota, or every backend asking to wait) or 503 (no capacity, quota store
away, shutting down) is not a failure: it is tried again after ``retry_after``, until the
batch expires. Any other non-200 answer is final and goes to the error file.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import os
import socket
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from gateway.auth.resolver import Identity
from gateway.batch.control import load_of, target_in_flight
from gateway.batch.objects import BatchRecord, FileRecord, LineResult
from gateway.batch.output import answer_line, error_line, request_id_of
from gateway.batch.validate import iter_lines, parse_line
from gateway.errors import InvalidRequest
from gateway.pipeline import LineAnswer

if TYPE_CHECKING:
    from gateway.batch.jobs import BatchJobs
    from gateway.config.model import Batch as BatchSettings
    from gateway.ledger import Ledger
    from gateway.routing.pool import PoolState
    from gateway.runtime import Runtime

__all__ = ["BatchRunner", "Execute", "LineAnswer", "LineCall"]

_log = logging.getLogger("gateway.batch")

CHECKPOINT_INTERVAL = 0.05
DISPATCH_TICK = 0.05  # re-check interactive pressure at least this often
FINALIZE_LEASE = 120.0  # seconds one process holds the finalizing step
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


@dataclass(eq=False)
class _Work:
    """This process's share of one batch (per process, not shared)."""

    record: BatchRecord
    lines: list[bytes]
    identity: Identity
    held: dict[int, set[int]] = field(default_factory=dict)  # chunk -> lines not yet recorded
    ready: deque[int] = field(default_factory=deque)
    delayed: list[tuple[float, int]] = field(default_factory=list)  # (monotonic, line) heap
    results: list[LineResult] = field(default_factory=list)  # waiting for the checkpoint
    saving: int = 0  # results a checkpoint took and has not recorded yet
    in_flight: int = 0
    exhausted: bool = False  # no chunk left to claim (until the next refresh)
    stopping: bool = False  # cancelling or expiring: start nothing new
    cap: float = 0.0  # own in-flight cap (halved on quota refusals)

    @property
    def id(self) -> str:
        return self.record.id

    @property
    def idle(self) -> bool:
        """Nothing running and every result recorded: only then may the batch be released or
        finalized (a checkpoint between taking results and recording them is not idle, or a
        finalize would miss those lines while the counts include them)."""
        return self.in_flight == 0 and not self.results and self.saving == 0

    def next_ready(self, now: float) -> int | None:
        if self.delayed and self.delayed[0][0] <= now:
            return heapq.heappop(self.delayed)[1]
        return self.ready.popleft() if self.ready else None

    def drop_chunk(self, chunk: int) -> None:
        lines = self.held.pop(chunk, set())
        self.ready = deque(i for i in self.ready if i not in lines)
        self.delayed = [d for d in self.delayed if d[1] not in lines]
        heapq.heapify(self.delayed)


class Host(Protocol):
    """What the runner reads of the process it runs in: the current policy snapshot, whether
    it is shutting down, and its ledger (flushed before leases are released)."""

    @property
    def runtime(self) -> Runtime: ...
    @property
    def draining(self) -> bool: ...
    @property
    def ledger(self) -> Ledger: ...


class BatchRunner:
    """Runs the lines of every active batch in this process; see the module docstring."""

    def __init__(self, gateway: Host, jobs: BatchJobs, execute: Execute) -> None:
        self.gateway = gateway
        self.jobs = jobs
        self.execute = execute
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{os.urandom(4).hex()}"
        self._works: dict[str, _Work] = {}
        self._mine: Counter[str] = Counter()  # this process's batch lines in flight, by pool
        self._wake = asyncio.Event()  # dispatch
        self._poke = asyncio.Event()  # refresh
        self._opened = asyncio.Event()  # checkpoint: a batch's work opened on this process
        self._lines: set[asyncio.Task[None]] = set()
        self._loops: dict[str, asyncio.Task[None]] = {}
        self._left: set[asyncio.Task[None]] = set()  # still running after stop(): kept referenced
        self._stopping = False
        self._turn = 0

    @property
    def settings(self) -> BatchSettings:
        return self.gateway.runtime.policy.batch

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
        its cancel (see :func:`_check_cancelled` for one that did not). A save or a loop still
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
        await _wait_until(self._lines, deadline - reserve, now)
        for task in list(self._lines):
            task.cancel()
        await _wait_until(self._lines, deadline - reserve * 3 / 4, now)
        save = asyncio.create_task(self._final_save(), name="batch-final-save")
        if await _wait_until({save}, deadline - reserve / 4, now):
            _log.warning("batch runner: final checkpoint unfinished at shutdown; its leases"
                         " will expire")
            save.cancel()
            self._leave({save})
        for task in self._loops.values():
            task.cancel()
        left = await _wait_until(set(self._loops.values()), deadline, now)
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

    def poke(self) -> None:
        """Look at the batches now (a batch was created or cancelled here)."""
        self._poke.set()

    # -- refresh: move batches along
    async def _refresh_loop(self) -> None:
        while True:
            self._poke.clear()
            try:
                await self._refresh()
            except Exception:
                _log.exception("batch runner: refresh failed")
            await _wait_event(self._poke, self.settings.poll_interval)

    async def _refresh(self) -> None:
        state = self.jobs.state
        active = await state.active_batches()
        for batch_id in active:
            _check_cancelled()
            record = await state.get_batch(batch_id)
            if record is not None:
                await self._advance(record, time.time())
        for batch_id in [b for b in self._works if b not in active]:
            work = self._works[batch_id]
            if work.idle:
                del self._works[batch_id]

    async def _advance(self, record: BatchRecord, now: float) -> None:
        state = self.jobs.state
        status = record.status
        work = self._works.get(record.id)
        if status in ("validating", "in_progress", "cancelling") and now >= record.expires_at:
            await self._stop_work(work)
            if work is None or work.idle:
                await self._finalize(record, "expired")
            return
        if status == "validating":
            await state.transition(record.id, ("validating",),
                                   {"status": "in_progress", "in_progress_at": int(now)})
            record = await state.get_batch(record.id) or record
            status = record.status
        if status == "in_progress":
            if record.completed + record.failed >= record.total:
                await self._finalize(record, "completed")
                return
            if not await self._key_usable(record):
                return
            if work is None:
                work = await self._open_work(record)
                if work is None:
                    return
            work.record = record
            work.exhausted = False  # a dead process's lease may have expired meanwhile
            self._wake.set()
        elif status == "cancelling":
            await self._stop_work(work)
            if record.id not in self._works and await state.leases_held(record.id, now) == 0:
                await self._finalize(record, "cancelled")
        elif status == "finalizing" and record.final_lease < now:
            await self._finalize(record, record.final_status or "completed")

    async def _key_usable(self, record: BatchRecord) -> bool:
        """A batch runs only while the key that created it may still be used: a revoked or
        expired key's batch is cancelled (lines in flight finish and are billed; no new line
        starts), within the key cache's bound."""
        if record.key_id is None:  # made without a key (keys not required): nothing to check
            return True
        try:
            usable = await self.gateway.runtime.resolver.key_usable(record.key_id)
        except Exception as exc:  # the key store is away: keep going, check again later
            _log.warning("batch %s: cannot check key %s: %s", record.id, record.key_id, exc)
            return True
        if usable:
            return True
        _log.warning("batch %s: key %s was revoked or expired; cancelling the batch",
                     record.id, record.key_id)
        await self.jobs.state.transition(record.id, ("validating", "in_progress"),
                                         {"status": "cancelling",
                                          "cancelling_at": int(time.time())})
        self._wake.set()
        return False

    async def _open_work(self, record: BatchRecord) -> _Work | None:
        try:
            data = await self.jobs.files.get(record.input_file_id)
        except FileNotFoundError:
            _log.error("batch %s: input file %s is gone; failing the batch", record.id,
                       record.input_file_id)
            await self.jobs.state.transition(
                record.id, ("in_progress",), {"status": "failed", "failed_at": int(time.time())})
            return None
        identity = Identity(record.key_id or "", record.tenant, limits=record.key_limits)
        lines = [line for _, line in iter_lines(data)]
        work = _Work(record, lines, identity, cap=float(self.settings.max_in_flight))
        self._works[record.id] = work
        self._opened.set()
        return work

    async def _stop_work(self, work: _Work | None) -> None:
        if work is None:
            return
        work.stopping = True
        work.ready.clear()
        work.delayed.clear()
        if work.idle:
            await self._release_all(work)
            self._works.pop(work.id, None)

    async def _release_all(self, work: _Work) -> None:
        for chunk in list(work.held):
            await self.jobs.state.release_chunk(work.id, chunk, self.owner, done=False)
        work.held.clear()

    # -- finalize: write the output and error files, end in a final status
    async def _finalize(self, record: BatchRecord, final: str) -> None:
        state = self.jobs.state
        now = time.time()
        changes: dict[str, object] = {"status": "finalizing", "final_status": final,
                                      "final_lease": now + FINALIZE_LEASE}
        if record.finalizing_at is None:
            changes["finalizing_at"] = int(now)
        if not await state.transition(record.id, ("validating", "in_progress", "cancelling"),
                                      changes, retake_final=True, now=now):
            return
        self._works.pop(record.id, None)
        try:
            if final == "expired":
                await self._expire_rest(record)
            results = await state.results(record.id)
            files = {}
            for ok, kind in ((True, "output"), (False, "error")):
                lines = [r.line for r in results if r.ok is ok]
                if lines:
                    files[f"{kind}_file_id"] = await self._write_file(record, kind, lines)
            done: dict[str, object] = {"status": final, f"{final}_at": int(time.time()),
                                       **files}
            await state.transition(record.id, ("finalizing",), done)
            _log.info("batch %s %s: %d results", record.id, final, len(results))
        except Exception:
            _log.exception("batch %s: finalizing failed; another try after the lease",
                           record.id)

    async def _expire_rest(self, record: BatchRecord) -> None:
        """Lines without a result when the window closed go to the error file."""
        done = await self.jobs.state.done_lines(record.id, range(record.total))
        data = await self.jobs.files.get(record.input_file_id)
        rest: list[LineResult] = []
        for index, (_, line) in enumerate(iter_lines(data)):
            if index not in done:
                custom_id = _custom_id(line)
                rest.append(error_line(record.id, index, custom_id, "batch_expired",
                                       "This request could not be executed before the"
                                       " completion window expired."))
        await self.jobs.state.record_results(record.id, rest)

    async def _write_file(self, record: BatchRecord, kind: str, lines: list[bytes]) -> str:
        file_id = f"file-{record.id.removeprefix('batch_')}-{kind}"
        data = b"\n".join(lines) + b"\n"
        await self.jobs.files.put(file_id, data)
        await self.jobs.state.put_file(FileRecord(
            id=file_id, tenant=record.tenant, bytes=len(data), created_at=int(time.time()),
            filename=f"{record.id}_{kind}.jsonl", purpose="batch_output", lines=len(lines)))
        return file_id

    # -- dispatch: claim chunks and start lines at the pace the pools allow
    async def _dispatch_loop(self) -> None:
        while True:
            self._wake.clear()
            try:
                await self._dispatch()
            except Exception:
                _log.exception("batch runner: dispatch failed")
                _check_cancelled()
                await asyncio.sleep(self.settings.poll_interval)
            # with no batch on this process nothing needs the tick: sleep until one opens
            await _wait_event(self._wake, DISPATCH_TICK if self._works else None)

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
            pools = _pools_of(runtime, work.record.model)
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
                    if work.exhausted or len(work.held) >= _max_held(settings):
                        break
                    claimed = await self._claim(work)
                    _check_cancelled()  # stopped meanwhile: start no line of that chunk
                    if not claimed or self._stopping:
                        break
                    continue
                self._start(work, index, batch_pool.name)

    async def _claim(self, work: _Work) -> bool:
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

    def _start(self, work: _Work, index: int, pool: str) -> None:
        self._mine[pool] += 1
        work.in_flight += 1
        task = asyncio.create_task(self._run_line(work, index, pool))
        self._lines.add(task)
        task.add_done_callback(self._lines.discard)

    async def _run_line(self, work: _Work, index: int, pool: str) -> None:
        batch_id = work.id
        try:
            try:
                request, _ = parse_line(work.lines[index])
            except InvalidRequest as exc:  # the file was valid at upload: only if it changed
                work.results.append(error_line(batch_id, index, _custom_id(work.lines[index]),
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
            _check_cancelled()
            if not self._works:  # nothing to save or release until a batch opens here
                self._opened.clear()
                await _wait_event(self._opened, None)
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

    async def _release_finished(self, work: _Work, results: list[LineResult]) -> None:
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
            _check_cancelled()
            await asyncio.sleep(self.settings.lease_seconds / 3)
            for work in list(self._works.values()):
                for chunk in list(work.held):
                    _check_cancelled()
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


def _check_cancelled() -> None:
    """Raise the CancelledError of a cancel this task was sent and never received.

    Something below a loop can swallow its cancel. Python 3.11's ``asyncio.wait_for`` returns
    the inner result instead of raising when its task is cancelled in the loop turn between
    the inner awaitable finishing and ``wait_for`` waking up; redis-py sends every command
    under ``asyncio.wait_for(..., socket_timeout)``, so a cancel landing there is lost. The
    task then stays marked "cancelling" with no CancelledError to come, and worse, every
    ``asyncio.timeout`` entered afterwards counts that cancel as its own and turns its expiry
    into a TimeoutError: a loop waiting under a timeout runs forever (#14 point 18: the
    gateway never exited). Every loop calls this between its steps and before it waits. A
    background loop never uncancels, so a non-zero count is always a cancel to honour.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def _wait_event(event: asyncio.Event, seconds: float | None) -> None:
    """Wait until ``event`` is set, at most ``seconds`` (None: no bound); a cancel already
    sent (and swallowed below) ends the wait at once instead of being taken for this
    timeout's own."""
    _check_cancelled()
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await event.wait()


async def _wait_until(
    tasks: set[asyncio.Task[None]], deadline: float, now: Callable[[], float]
) -> set[asyncio.Task[None]]:
    """Wait for ``tasks`` until ``deadline`` (on the loop's clock); the ones still running.

    ``asyncio.wait`` returns at its timeout whether or not the tasks honour a cancel."""
    pending = {t for t in tasks if not t.done()}
    if pending:
        _, pending = await asyncio.wait(pending, timeout=max(0.0, deadline - now()))
    return pending


def _max_held(settings: BatchSettings) -> int:
    """Chunks one process holds at once: enough to fill its in-flight ceiling, and one more."""
    return -(-settings.max_in_flight // settings.chunk_lines) + 1


def _pools_of(runtime: Runtime, model_name: str) -> tuple[PoolState, list[PoolState]] | None:
    """The batch pool of a model and its interactive pools (which batch work yields to)."""
    model = runtime.models.get(model_name)
    if model is None:
        return None
    pools = runtime.router.pools
    batch_pool = pools[model.pool_for("batch")]
    names = sorted({model.pool, *model.pools.values()})
    interactive = [pools[n] for n in names if pools[n].request_class != "batch"]
    return batch_pool, interactive


def _custom_id(line: bytes) -> str:
    try:
        return parse_line(line)[0].custom_id
    except InvalidRequest:
        return ""
