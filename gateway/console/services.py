"""The gateway's parts the console's actions use: the managed key store, the quota store (for
the limits in use), the rollouts, the batch jobs and the admin audit log.

The app factory hands them to :func:`gateway.console.console_edge` (a test may build its own
:class:`Services`). Each part may be missing (None): the console then says so instead of
offering the action.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.auth.keystore import KeyStore
    from gateway.batch import BatchJobs
    from gateway.console.audit_log import AuditTrail
    from gateway.quota.base import QuotaStore
    from gateway.rollouts import Rollouts

__all__ = ["Services"]


@dataclass(frozen=True, slots=True)
class Services:
    """What the console acts on beside the policy and the ledger."""

    audit: AuditTrail
    keystore: KeyStore | None = None
    quota: QuotaStore | None = None
    rollouts: Rollouts | None = None
    batches: BatchJobs | None = None
