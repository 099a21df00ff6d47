"""``/v1/batches``: create, retrieve, list (newest first, ``after``/``limit``) and cancel.

Every batch belongs to the caller's tenant; another tenant's batch id gets the same 404 as an
unknown one. The lines run in the background (:class:`~gateway.batch.BatchRunner`) through
the same proxy handlers as live requests: ``line_executor`` is that bridge.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from litestar import Request, Response, get, post

from gateway.api.files import identify, json_response
from gateway.batch import LineAnswer, batch_object
from gateway.pipeline import Inbound
from gateway.request.parse import ENDPOINTS, decode_object

if TYPE_CHECKING:
    from gateway.app.state import Gateway
    from gateway.batch import Execute, LineCall
    from gateway.pipeline import Pipeline

__all__ = ["batch_handlers", "line_executor"]

def line_executor(pipeline: Pipeline) -> Execute:
    """Run a batch line through the pipeline, as a request of the key that made the batch."""

    async def execute(line: LineCall) -> LineAnswer:
        body = line.body

        async def read(limit: int) -> bytes:
            return body

        result = await pipeline.run_line(Inbound(
            method="POST", endpoint=ENDPOINTS[line.endpoint],
            headers=[(b"content-length", str(len(body)).encode())], read_body=read,
            identity=line.identity, request_class="batch", request_id=line.request_id,
            batch_id=line.batch_id))
        return LineAnswer(result.status, result.body)

    return execute


def batch_handlers(gateway: Gateway) -> list[Any]:
    """Route handlers bound to one gateway."""
    jobs = gateway.batches

    def poke() -> None:
        if gateway.batch_runner is not None:
            gateway.batch_runner.poke()

    @post("/v1/batches", status_code=200)
    async def create(request: Request[Any, Any, Any]) -> Response[bytes]:
        identity = await identify(gateway, request)
        body = decode_object(await request.body())
        record = await jobs.create(identity, body.get("input_file_id"), body.get("endpoint"),
                                   body.get("completion_window"), body.get("metadata"),
                                   gateway.runtime.models.keys())
        poke()
        return json_response(batch_object(record))

    @get("/v1/batches/{batch_id:str}")
    async def retrieve(request: Request[Any, Any, Any], batch_id: str) -> Response[bytes]:
        identity = await identify(gateway, request)
        return json_response(batch_object(await jobs.batch(identity.tenant, batch_id)))

    @get("/v1/batches")
    async def listing(request: Request[Any, Any, Any], after: str | None = None,
                      limit: int = 20) -> Response[bytes]:
        identity = await identify(gateway, request)
        records, more = await jobs.list(identity.tenant, after, limit)
        data = [batch_object(r) for r in records]
        return json_response({
            "object": "list", "data": data, "has_more": more,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
        })

    @post("/v1/batches/{batch_id:str}/cancel", status_code=200)
    async def cancel(request: Request[Any, Any, Any], batch_id: str) -> Response[bytes]:
        identity = await identify(gateway, request)
        record = await jobs.cancel(identity.tenant, batch_id)
        poke()
        return json_response(batch_object(record))

    return [create, retrieve, listing, cancel]
