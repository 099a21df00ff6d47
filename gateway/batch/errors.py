"""Errors of the batch API, OpenAI-shaped like every gateway error.

    GatewayError
    ├── InvalidRequest (400)
    │   ├── BatchFileInvalid        a batch file's lines fail validation (line numbers listed)
    │   └── BatchNotCancellable     the batch is already final
    ├── BodyTooLarge (413)
    │   └── BatchFileTooLarge       over ``batch.max_file_bytes``
    └── ObjectNotFound (404)        no such file or batch *for this tenant*
"""

from __future__ import annotations

from gateway.errors import BodyTooLarge, GatewayError, InvalidRequest

__all__ = ["BatchFileInvalid", "BatchFileTooLarge", "BatchNotCancellable", "ObjectNotFound"]


class ObjectNotFound(GatewayError):
    """A file or batch that does not exist, or belongs to another tenant (the same answer)."""

    status = 404
    type = "invalid_request_error"
    code = "not_found"


class BatchFileInvalid(InvalidRequest):
    code = "invalid_batch_file"


class BatchNotCancellable(InvalidRequest):
    code = "batch_not_cancellable"


class BatchFileTooLarge(BodyTooLarge):
    """An upload over ``batch.max_file_bytes``."""
