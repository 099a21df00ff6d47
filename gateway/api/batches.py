"""``/v1/batches``: create, retrieve, list (newest first, ``after``/``limit``) and cancel.

Every batch belongs to the caller's tenant; another tenant's batch id gets the same 404 as an
unknown one. The lines run in the background (:class:`~gateway.batch.BatchRunner`) through
the same pipeline as live requests (``gateway.app.state.line_executor`` is that bridge).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from litestar import Request, Response, get, post

from gateway.api.files import identify, json_response
from gateway.batch import batch_object
from gateway.dialects.body import decode_object

if TYPE_CHECKING:
    from collections.abc import Callable

    from gateway.batch import BatchJobs
    from gateway.runtime import Runtime

__all__ = ["batch_handlers"]

def batch_handlers(current: Callable[[], Runtime], jobs: BatchJobs,
                   poke: Callable[[], None]) -> list[Any]:
    """Route handlers over the policy in force and the batch jobs; ``poke`` wakes the runner
    (a new or cancelled batch is picked up at once)."""

    @post("/v1/batches", status_code=200)
    async def create(request: Request[Any, Any, Any]) -> Response[bytes]:
        identity = await identify(current, request)
        body = decode_object(await request.body())
        record = await jobs.create(identity, body.get("input_file_id"), body.get("endpoint"),
                                   body.get("completion_window"), body.get("metadata"),
                                   current().models.keys())
        poke()
        return json_response(batch_object(record))

    @get("/v1/batches/{batch_id:str}")
    async def retrieve(request: Request[Any, Any, Any], batch_id: str) -> Response[bytes]:
        identity = await identify(current, request)
        return json_response(batch_object(await jobs.batch(identity.tenant, batch_id)))

    @get("/v1/batches")
    async def listing(request: Request[Any, Any, Any], after: str | None = None,
                      limit: int = 20) -> Response[bytes]:
        identity = await identify(current, request)
        records, more = await jobs.list(identity.tenant, after, limit)
        data = [batch_object(r) for r in records]
        return json_response({
            "object": "list", "data": data, "has_more": more,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
        })

    @post("/v1/batches/{batch_id:str}/cancel", status_code=200)
    async def cancel(request: Request[Any, Any, Any], batch_id: str) -> Response[bytes]:
        identity = await identify(current, request)
        record = await jobs.cancel(identity.tenant, batch_id)
        poke()
        return json_response(batch_object(record))

    return [create, retrieve, listing, cancel]
