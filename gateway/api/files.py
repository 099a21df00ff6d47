"""``/v1/files``: upload a batch input file, read its metadata or content, delete it.

Every file belongs to the caller's tenant (from the API key); another tenant's file id gets
the same 404 as an unknown one. Uploads are multipart (``purpose=batch``, ``file``) as the
OpenAI client sends them, limited to ``batch.max_file_bytes`` and validated line by line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec
from litestar import Request, Response, delete, get, post
from litestar.datastructures import UploadFile

from gateway.auth.resolver import Identity
from gateway.batch import file_object
from gateway.errors import InvalidRequest

if TYPE_CHECKING:
    from collections.abc import Callable

    from gateway.batch import BatchJobs
    from gateway.runtime import Runtime

__all__ = ["file_handlers", "identify", "json_response"]

_enc = msgspec.json.Encoder()
#: room for the multipart framing and the other form fields around the file
_FORM_SLACK = 64 * 1024


def json_response(body: Any, status: int = 200) -> Response[bytes]:
    return Response(_enc.encode(body), status_code=status, media_type="application/json")


async def identify(current: Callable[[], Runtime], request: Request[Any, Any, Any]
                   ) -> Identity:
    """The caller, from ``Authorization: Bearer``; 401 as for every other route."""
    header = request.headers.get("authorization")
    identity = await current().resolver.authenticate(header.encode() if header else None)
    return identity if identity is not None else Identity("", "anonymous")


def file_handlers(current: Callable[[], Runtime], jobs: BatchJobs) -> list[Any]:
    """Route handlers over the policy in force and the batch jobs' files."""
    limit = current().policy.batch.max_file_bytes + _FORM_SLACK

    @post("/v1/files", request_max_body_size=limit, status_code=200)
    async def upload(request: Request[Any, Any, Any]) -> Response[bytes]:
        identity = await identify(current, request)
        form = await request.form()
        purpose = form.get("purpose")
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            raise InvalidRequest("'file' is required (multipart/form-data)", param="file")
        if not isinstance(purpose, str):
            raise InvalidRequest("'purpose' is required", param="purpose")
        data = await upload.read()
        record = await jobs.upload(identity.tenant, upload.filename or "batch.jsonl", purpose,
                                   data, current().models.keys())
        return json_response(file_object(record))

    @get("/v1/files/{file_id:str}")
    async def retrieve(request: Request[Any, Any, Any], file_id: str) -> Response[bytes]:
        identity = await identify(current, request)
        return json_response(file_object(await jobs.file(identity.tenant, file_id)))

    @get("/v1/files/{file_id:str}/content")
    async def content(request: Request[Any, Any, Any], file_id: str) -> Response[bytes]:
        identity = await identify(current, request)
        data = await jobs.content(identity.tenant, file_id)
        return Response(data, media_type="application/jsonl")

    @delete("/v1/files/{file_id:str}", status_code=200)
    async def remove(request: Request[Any, Any, Any], file_id: str) -> Response[bytes]:
        identity = await identify(current, request)
        await jobs.delete_file(identity.tenant, file_id)
        return json_response({"id": file_id, "object": "file", "deleted": True})

    return [upload, retrieve, content, remove]
