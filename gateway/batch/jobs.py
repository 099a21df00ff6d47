"""Batch jobs as the API sees them: upload, read and delete files; create, read, list and
cancel batches. Every object belongs to one tenant; another tenant's id answers 404 exactly
like an unknown one. The work itself is done by :class:`~gateway.batch.runner.BatchRunner`.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from gateway.batch.errors import BatchNotCancellable, ObjectNotFound
from gateway.batch.files import FileStore, LocalFileStore
from gateway.batch.objects import (
    FINAL,
    BatchRecord,
    FileRecord,
    new_batch_id,
    new_file_id,
)
from gateway.batch.redis import RedisBatchState
from gateway.batch.sqlite import SqliteBatchState
from gateway.batch.validate import Limits, validate_file
from gateway.dialects.shape import ENDPOINTS
from gateway.errors import InvalidRequest

if TYPE_CHECKING:
    from collections.abc import Collection

    from gateway.auth.resolver import Identity
    from gateway.batch.state import BatchState
    from gateway.config.model import Batch as BatchSettings

__all__ = ["BatchJobs", "make_batch_jobs"]

WINDOWS = {"24h": 86_400}


def make_batch_jobs(settings: BatchSettings, redis_url: str | None) -> BatchJobs:
    """State in Redis when a URL is given, else SQLite in ``files_dir``; files on local disk."""
    state: BatchState = (RedisBatchState.from_url(redis_url) if redis_url
                         else SqliteBatchState(settings.files_dir))
    return BatchJobs(settings, LocalFileStore(settings.files_dir), state)


def _limits(settings: BatchSettings) -> Limits:
    return Limits(max_file_bytes=settings.max_file_bytes, max_lines=settings.max_lines,
                  max_line_bytes=settings.max_line_bytes, report_errors=settings.report_errors)


class BatchJobs:
    """Files and batches of every tenant, behind tenant checks."""

    def __init__(self, settings: BatchSettings, files: FileStore, state: BatchState) -> None:
        self.settings = settings
        self.files = files
        self.state = state

    # -- files
    async def upload(
        self, tenant: str, filename: str, purpose: str, data: bytes, models: Collection[str]
    ) -> FileRecord:
        """Validate a ``purpose=batch`` file line by line and store it."""
        if purpose != "batch":
            raise InvalidRequest(f"purpose must be 'batch', got {purpose!r}", param="purpose")
        summary = validate_file(data, _limits(self.settings), models)
        record = FileRecord(id=new_file_id(), tenant=tenant, bytes=len(data),
                            created_at=int(time.time()), filename=filename, purpose=purpose,
                            lines=summary.lines)
        await self.files.put(record.id, data)
        await self.state.put_file(record)
        return record

    async def file(self, tenant: str, file_id: str) -> FileRecord:
        record = await self.state.get_file(file_id)
        if record is None or record.tenant != tenant:
            raise ObjectNotFound(f"No such File object: {file_id}", param="file_id")
        return record

    async def content(self, tenant: str, file_id: str) -> bytes:
        await self.file(tenant, file_id)
        try:
            return await self.files.get(file_id)
        except FileNotFoundError:
            raise ObjectNotFound(f"No such File object: {file_id}", param="file_id") from None

    async def delete_file(self, tenant: str, file_id: str) -> None:
        await self.file(tenant, file_id)
        await self.state.delete_file(file_id)
        await self.files.delete(file_id)

    # -- batches
    async def create(
        self,
        identity: Identity,
        input_file_id: Any,
        endpoint: Any,
        completion_window: Any,
        metadata: Any,
        models: Collection[str],
    ) -> BatchRecord:
        """Check the request and re-validate the input file against the endpoint."""
        if not isinstance(input_file_id, str):
            raise InvalidRequest("'input_file_id' is required", param="input_file_id")
        if not isinstance(endpoint, str):
            raise InvalidRequest("'endpoint' is required", param="endpoint")
        if not isinstance(completion_window, str) or completion_window not in WINDOWS:
            raise InvalidRequest(f"'completion_window' must be one of {', '.join(WINDOWS)}",
                                 param="completion_window")
        _check_metadata(metadata)
        source = await self.file(identity.tenant, input_file_id)
        if source.purpose != "batch":
            raise InvalidRequest(f"file {input_file_id} has purpose {source.purpose!r}, not"
                                 " 'batch'", param="input_file_id")
        if endpoint not in ENDPOINTS:
            raise InvalidRequest(f"'endpoint' must be one of {', '.join(ENDPOINTS)}",
                                 param="endpoint")
        data = await self.content(identity.tenant, input_file_id)
        summary = validate_file(data, _limits(self.settings), models, endpoint)
        now = int(time.time())
        record = BatchRecord(
            id=new_batch_id(), tenant=identity.tenant, endpoint=endpoint,
            input_file_id=input_file_id, completion_window=completion_window, created_at=now,
            expires_at=now + WINDOWS[completion_window], total=summary.lines,
            model=summary.model, key_id=identity.key_id, key_limits=identity.limits,
            chunk_lines=self.settings.chunk_lines, metadata=metadata,
        )
        await self.state.create_batch(record)
        return record

    async def batch(self, tenant: str, batch_id: str) -> BatchRecord:
        record = await self.state.get_batch(batch_id)
        if record is None or record.tenant != tenant:
            raise ObjectNotFound(f"No such Batch object: {batch_id}", param="batch_id")
        return record

    async def list(
        self, tenant: str, after: str | None, limit: int
    ) -> tuple[list[BatchRecord], bool]:
        if not 1 <= limit <= 100:
            raise InvalidRequest("'limit' must be between 1 and 100", param="limit")
        return await self.state.list_batches(tenant, after, limit)

    async def cancel(self, tenant: str, batch_id: str) -> BatchRecord:
        """Stop starting lines; the runner finalizes once the lines in flight are done."""
        record = await self.batch(tenant, batch_id)
        if record.status in ("cancelling", "cancelled"):
            return record
        if record.status in FINAL or record.status == "finalizing":
            raise BatchNotCancellable(f"batch {batch_id} is {record.status}; it cannot be"
                                      " cancelled", param="batch_id")
        now = int(time.time())
        if not await self.state.transition(batch_id, ("validating", "in_progress"),
                                           {"status": "cancelling", "cancelling_at": now}):
            return await self.batch(tenant, batch_id)
        return await self.batch(tenant, batch_id)

    async def open(self) -> None:
        await self.state.open()

    async def close(self) -> None:
        await self.state.close()

    def __repr__(self) -> str:
        return f"<BatchJobs [files: {self.files!r} | state: {self.state!r}]>"


def _check_metadata(metadata: Any) -> None:
    if metadata is None:
        return
    if not isinstance(metadata, dict) or len(metadata) > 16 or not all(
        isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= 512
        for k, v in metadata.items()
    ):
        raise InvalidRequest("'metadata' must map at most 16 keys (<= 64 chars) to strings"
                             " (<= 512 chars)", param="metadata")


