"""The row of a usage read: one group's rollup sums, as ``SqlLedger.usage_rows`` answers them.

The rows are built by the rollup query (``sql/usage_query.py``) from ``usage_hourly``; this
module holds only their shape, so the API and the tests can name it without the SQL.
"""

from __future__ import annotations

import msgspec

__all__ = ["UsageRow"]


class UsageRow(msgspec.Struct, kw_only=True):
    """Totals of one group; a dimension not grouped by is None (so is an empty key, version,
    batch, team or organization in the rollup query's rows: use the group_by to tell them
    apart). ``hour``/``day``/``month`` are ISO labels (``2024-05-01T13:00:00Z``,
    ``2024-05-01``, ``2024-05``)."""

    tenant: str | None = None
    hour: str | None = None
    day: str | None = None
    month: str | None = None
    key_id: str | None = None
    model: str | None = None
    request_class: str | None = None
    version: str | None = None
    batch_id: str | None = None
    team: str | None = None
    organization: str | None = None
    requests: int = 0
    system: int = 0
    history: int = 0
    new: int = 0
    tools: int = 0
    cached: int = 0
    output: int = 0
    prompt_total: int = 0
    cost_micros: int = 0
    #: requests whose tokens were the gateway's estimate
    estimated: int = 0
    #: of ``prompt_total``, tokens written to the backend's cache; of ``output``, reasoning
    cache_write: int = 0
    reasoning: int = 0
    #: requests whose outcome was not ``completed``
    failed: int = 0
    #: the lines of ``cost_micros``
    cost_system: int = 0
    cost_history: int = 0
    cost_new: int = 0
    cost_tools: int = 0
    cost_output: int = 0
    cost_reasoning: int = 0
    cost_cached: int = 0
    cost_cache_write: int = 0
