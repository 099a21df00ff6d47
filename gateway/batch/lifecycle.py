"""Moving each active batch along its statuses, and ending it with its result files.

The refresh loop of :class:`~gateway.batch.runner.BatchRunner` (its base,
:class:`BatchLifecycle`): validating -> in_progress; a revoked key's batch -> cancelling;
cancelling -> cancelled once no lease is held; past ``expires_at`` -> expired; all lines
recorded -> completed. Ending a batch takes the finalizing step under a lease (one process does
it, another retakes it if that one dies), sends the lines an expired batch never ran to the
error file, writes the output and error files and records the final status. Running the lines
(dispatch, checkpoint, lease renewal) is the runner's own.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from gateway.auth.resolver import Identity
from gateway.batch.objects import FileRecord, LineResult
from gateway.batch.output import error_line
from gateway.batch.validate import iter_lines
from gateway.batch.waits import check_cancelled, wait_event
from gateway.batch.work import Work, line_custom_id

if TYPE_CHECKING:
    from gateway.batch.jobs import BatchJobs
    from gateway.batch.objects import BatchRecord
    from gateway.batch.runner import Host
    from gateway.config.model import Batch as BatchSettings

__all__ = ["FINALIZE_LEASE", "BatchLifecycle"]

_log = logging.getLogger("gateway.batch")

FINALIZE_LEASE = 120.0  # seconds one process holds the finalizing step


class BatchLifecycle:
    """The refresh side of :class:`~gateway.batch.runner.BatchRunner`, which sets these."""

    gateway: Host
    jobs: BatchJobs
    owner: str  # this process's name on the leases it holds
    _works: dict[str, Work]
    _wake: asyncio.Event  # dispatch
    _poke: asyncio.Event  # refresh
    _opened: asyncio.Event  # checkpoint: a batch's work opened on this process

    @property
    def settings(self) -> BatchSettings:
        return self.gateway.runtime.policy.batch

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
            await wait_event(self._poke, self.settings.poll_interval)

    async def _refresh(self) -> None:
        state = self.jobs.state
        active = await state.active_batches()
        for batch_id in active:
            check_cancelled()
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

    async def _open_work(self, record: BatchRecord) -> Work | None:
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
        work = Work(record, lines, identity, cap=float(self.settings.max_in_flight))
        self._works[record.id] = work
        self._opened.set()
        return work

    async def _stop_work(self, work: Work | None) -> None:
        if work is None:
            return
        work.stopping = True
        work.ready.clear()
        work.delayed.clear()
        if work.idle:
            await self._release_all(work)
            self._works.pop(work.id, None)

    async def _release_all(self, work: Work) -> None:
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
                custom_id = line_custom_id(line)
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
