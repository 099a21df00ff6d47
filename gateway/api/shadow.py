"""``GET /admin/shadow/{model}``: how a model's shadow answers compare with the primary's.

Behind the admin gate like every ``/admin`` route (see ``api/admin.py``). The figures are this
worker's (``ShadowComparisons`` lives in each process; under ``--workers N`` each worker
reports the requests it mirrored): counts and agreement rate since the process started, by
shadow version, and over its last comparisons the TTFT and duration quantiles of both sides
with their shadow / primary ratios, the output-token ratio, the status mix, and the last few
disagreeing examples, with their texts only for tenants whose ``record_content`` is on.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from litestar import get

from gateway.errors import ModelNotFound

if TYPE_CHECKING:
    from collections.abc import Callable

    from gateway.runtime import Runtime
    from gateway.upstream.shadow_compare import ShadowComparisons

__all__ = ["shadow_handlers"]

_log = logging.getLogger("gateway.admin")


def shadow_handlers(current: Callable[[], Runtime], comparisons: ShadowComparisons
                    ) -> list[Any]:
    """The shadow report's route handler, bound to the process's comparisons."""

    @get("/admin/shadow/{model:str}")
    async def shadow_report(model: str) -> dict[str, Any]:
        configured = current().models.get(model)
        if configured is None and model not in comparisons.models():
            raise ModelNotFound(f"no model {model!r} in the policy and no shadow comparisons "
                                "for it", param="model")
        _log.info("admin: shadow report of model %s", model)
        shadow = configured.shadow if configured is not None else None
        return {**comparisons.summary(model),
                "shadow": None if shadow is None else {
                    "pool": shadow.pool, "share": shadow.share, "version": shadow.label,
                    "agree_similarity": shadow.agree_similarity}}

    return [shadow_report]
