"""A tenant's batch jobs on its page: the newest 50, read from the gateway's batch store the
way ``GET /v1/batches`` reads them (the tenant from the session, never from the request), so
another tenant's batches never show."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gateway.errors import GatewayError

if TYPE_CHECKING:
    from gateway.batch import BatchJobs

__all__ = ["BatchRow", "BatchSection", "batch_section"]

#: batches listed, newest first
SHOWN = 50
_log = logging.getLogger("gateway.console")


@dataclass(frozen=True, slots=True)
class BatchRow:
    """One batch as the page shows it."""

    id: str
    status: str
    endpoint: str
    created: str
    completed: str
    total: int
    done: int
    failed: int
    output_file_id: str | None
    error_file_id: str | None


@dataclass(frozen=True, slots=True)
class BatchSection:
    """The page's batches section (``enabled``: the gateway keeps batch jobs; ``error``: the
    store did not answer)."""

    enabled: bool
    rows: list[BatchRow] = field(default_factory=list)
    error: str | None = None


def _when(seconds: int | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(seconds)) if seconds else ""


async def batch_section(batches: BatchJobs | None, tenant: str) -> BatchSection:
    """``tenant``'s newest batches (the API's own listing)."""
    if batches is None:
        return BatchSection(False)
    try:
        records, _ = await batches.list(tenant, None, SHOWN)
    except (GatewayError, OSError) as exc:
        _log.warning("console: the batches of %s could not be read: %s", tenant[:128], exc)
        return BatchSection(True, error="The batch store is not answering; try again shortly.")
    return BatchSection(True, [
        BatchRow(r.id, r.status, r.endpoint, _when(r.created_at),
                 _when(r.completed_at or r.failed_at or r.cancelled_at or r.expired_at),
                 r.total, r.completed, r.failed, r.output_file_id, r.error_file_id)
        for r in records])
