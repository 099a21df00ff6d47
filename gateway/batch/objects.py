"""The stored shapes of files and batches, and their OpenAI JSON.

``FileRecord`` and ``BatchRecord`` are what the state store keeps (they carry the tenant and
the runner's own fields); ``file_object`` and ``batch_object`` render exactly the fields the
OpenAI API returns, so the official client parses them unchanged.
"""

from __future__ import annotations

import os
from typing import Any

import msgspec

__all__ = [
    "ACTIVE",
    "FINAL",
    "ID_BYTES",
    "BatchRecord",
    "FileRecord",
    "LineResult",
    "batch_object",
    "file_object",
    "new_batch_id",
    "new_file_id",
]

#: statuses a runner still works on (or finalizes)
ACTIVE = frozenset({"validating", "in_progress", "finalizing", "cancelling"})
#: statuses that never change again
FINAL = frozenset({"completed", "failed", "expired", "cancelled"})


#: random bytes in a file or batch id: 128 bits, so an id cannot be guessed (nor found by
#: counting from one seen); a batch's output and error files are named after its id, so they
#: carry the same 128 bits
ID_BYTES = 16


def new_file_id() -> str:
    """An uploaded file's id: ``file-`` and 128 random bits (32 hex digits), no counter."""
    return "file-" + os.urandom(ID_BYTES).hex()


def new_batch_id() -> str:
    """A batch's id: ``batch_`` and 128 random bits (32 hex digits), no counter."""
    return "batch_" + os.urandom(ID_BYTES).hex()


class FileRecord(msgspec.Struct, kw_only=True):
    """An uploaded (``batch``) or generated (``batch_output``) file; its bytes live in a
    :class:`~gateway.batch.files.FileStore`."""

    id: str
    tenant: str
    bytes: int
    created_at: int
    filename: str
    purpose: str
    lines: int = 0


class BatchRecord(msgspec.Struct, kw_only=True):
    """A batch job: the OpenAI fields plus the caller's identity and the runner's bookkeeping."""

    id: str
    tenant: str
    endpoint: str
    input_file_id: str
    completion_window: str
    created_at: int
    expires_at: int
    #: lines in the input file (``request_counts.total``)
    total: int
    #: the one model every line asks for
    model: str
    #: the creating key, and its own limits: each line is admitted as that key
    key_id: str | None = None
    key_limits: dict[str, int] | None = None
    chunk_lines: int = 64
    status: str = "validating"
    completed: int = 0
    failed: int = 0
    metadata: dict[str, str] | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    in_progress_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    #: the status finalizing ends in (completed, cancelled or expired)
    final_status: str | None = None
    #: unix seconds until which a process holds the finalizing step
    final_lease: float = 0.0

    @property
    def chunks(self) -> int:
        return -(-self.total // self.chunk_lines)

    def chunk_range(self, chunk: int) -> range:
        start = chunk * self.chunk_lines
        return range(start, min(self.total, start + self.chunk_lines))


class LineResult(msgspec.Struct, array_like=True):
    """One finished line: its index, whether it goes to the output (or error) file, the line."""

    index: int
    ok: bool
    line: bytes


def file_object(record: FileRecord) -> dict[str, Any]:
    """The OpenAI ``file`` object."""
    return {
        "id": record.id,
        "object": "file",
        "bytes": record.bytes,
        "created_at": record.created_at,
        "filename": record.filename,
        "purpose": record.purpose,
        "status": "processed",
        "expires_at": None,
        "status_details": None,
    }


def batch_object(record: BatchRecord) -> dict[str, Any]:
    """The OpenAI ``batch`` object."""
    return {
        "id": record.id,
        "object": "batch",
        "endpoint": record.endpoint,
        "model": record.model,
        "errors": None,
        "input_file_id": record.input_file_id,
        "completion_window": record.completion_window,
        "status": record.status,
        "output_file_id": record.output_file_id,
        "error_file_id": record.error_file_id,
        "created_at": record.created_at,
        "in_progress_at": record.in_progress_at,
        "expires_at": record.expires_at,
        "finalizing_at": record.finalizing_at,
        "completed_at": record.completed_at,
        "failed_at": record.failed_at,
        "expired_at": record.expired_at,
        "cancelling_at": record.cancelling_at,
        "cancelled_at": record.cancelled_at,
        "request_counts": {
            "total": record.total,
            "completed": record.completed,
            "failed": record.failed,
        },
        "metadata": record.metadata,
    }
