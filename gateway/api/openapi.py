"""The gateway's OpenAPI 3.1 document: every route it serves, built from the code's own facts.

Generated, not hand-kept: the proxied routes come from
:data:`~gateway.dialects.shape.ENDPOINTS` and their request bodies list exactly the fields
:func:`~gateway.dialects.chat.parse.parse_request` checks (``additionalProperties`` stays
open: every other field passes through); the bounds (:data:`~gateway.dialects.body.MAX_DEPTH`,
the body limit) and the model names come from the
policy. Errors are the one OpenAI shape of :mod:`gateway.errors`. Two bearer schemes: an API
key (static or managed) for ``/v1``, the admin token for ``/admin``.

:func:`openapi_document` builds the dict, :func:`openapi_bytes` encodes it once per policy, and
:func:`openapi_handlers` serves it as ``GET /openapi.json`` (unauthenticated, like ``/healthz``:
it holds no secret, only the policy's public model names).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec
from litestar import Request, Response, get

from gateway.api.admin import is_admin_credential
from gateway.dialects.body import MAX_DEPTH
from gateway.dialects.shape import ENDPOINTS

if TYPE_CHECKING:
    from collections.abc import Callable

    from gateway.config import Policy
    from gateway.runtime import Runtime

__all__ = ["openapi_bytes", "openapi_document", "openapi_handlers"]

_JSON = "application/json"
_ERROR_REF = {"$ref": "#/components/schemas/Error"}
_API: list[dict[str, list[str]]] = [{"apiKey": []}]
_ADMIN: list[dict[str, list[str]]] = [{"adminToken": []}]
_NONE: list[dict[str, list[str]]] = []

#: what each status means, for the responses every operation may give
_STATUS = {
    "400": "Invalid request: bad JSON, wrong types, missing fields, nesting deeper than "
           f"{MAX_DEPTH} levels, a repeated top-level key",
    "401": "Missing, malformed or unknown credential",
    "404": "Unknown object, model or route",
    "405": "Wrong method",
    "409": "The action does not apply in the current state",
    "413": "Body over the limit",
    "422": "The new policy is invalid; the old one is kept",
    "429": "A quota or the backend said slow down (Retry-After)",
    "502": "The backend failed or answered garbage",
    "503": "No backend available, the quota store or the ledger database is away, or the "
           "gateway is draining",
    "504": "The backend timed out",
}


def _error(status: str) -> dict[str, Any]:
    return {"description": _STATUS[status], "content": {_JSON: {"schema": _ERROR_REF}}}


def _errors(*statuses: str) -> dict[str, Any]:
    return {s: _error(s) for s in statuses}


def _ok(description: str, media: str = _JSON, schema: dict[str, Any] | None = None
        ) -> dict[str, Any]:
    return {"description": description,
            "content": {media: {"schema": schema or {"type": "object"}}}}


def _op(summary: str, responses: dict[str, Any], security: list[Any], *,
        body: dict[str, Any] | None = None, params: list[dict[str, Any]] | None = None,
        op_id: str) -> dict[str, Any]:
    op: dict[str, Any] = {"operationId": op_id, "summary": summary, "security": security,
                          "responses": responses}
    if body is not None:
        op["requestBody"] = {"required": True, "content": body}
    if params:
        op["parameters"] = params
    return op


def _param(name: str, where: str, schema: dict[str, Any], required: bool = False,
           description: str = "") -> dict[str, Any]:
    p: dict[str, Any] = {"name": name, "in": where, "required": required or where == "path",
                         "schema": schema}
    if description:
        p["description"] = description
    return p


_STR = {"type": "string"}
_POS_INT = {"type": ["integer", "null"], "minimum": 1}
_OPT_STR = {"type": ["string", "null"]}


def _proxy_body(input_field: str, streams: bool, models: list[str]) -> dict[str, Any]:
    """The fields parse_request checks; everything else passes through untouched."""
    model: dict[str, Any] = {"type": "string", "description": "a public model name"}
    if models:
        model["examples"] = models
    props: dict[str, Any] = {
        "model": model,
        "max_tokens": _POS_INT,
        "max_completion_tokens": _POS_INT,
        "n": _POS_INT,
        "user": {"type": "string"},
    }
    if input_field == "messages":
        props["messages"] = {
            "type": "array", "minItems": 1,
            "items": {"type": "object", "required": ["role"], "additionalProperties": True,
                      "properties": {"role": {"type": "string"},
                                     "content": {"type": ["string", "array", "null"]}}},
        }
    else:
        props[input_field] = {"oneOf": [
            {"type": "string"},
            {"type": "array", "minItems": 1, "items": {"type": "string"}},
            {"type": "array", "minItems": 1, "items": {"type": "integer"}},
            {"type": "array", "minItems": 1,
             "items": {"type": "array", "items": {"type": "integer"}}},
        ]}
    if streams:
        props["stream"] = {"type": ["boolean", "null"]}
        props["stream_options"] = {"type": ["object", "null"], "additionalProperties": True,
                                   "properties": {"include_usage": {"type": "boolean"}}}
    return {"type": "object", "required": ["model", input_field], "properties": props,
            "additionalProperties": True}


def _proxy_paths(models: list[str]) -> dict[str, Any]:
    paths: dict[str, Any] = {}
    for path, endpoint in ENDPOINTS.items():
        ok: dict[str, Any] = {"description": "The backend's answer, relayed",
                              "content": {_JSON: {"schema": {"type": "object"}}}}
        if endpoint.streams:
            ok["content"]["text/event-stream"] = {"schema": {"type": "string"}}
        schema = _proxy_body(endpoint.input_field, endpoint.streams, models)
        paths[path] = {"post": _op(
            f"OpenAI {endpoint.operation}, proxied to a backend of the model's pool",
            {"200": ok, **_errors("400", "401", "404", "413", "429", "502", "503", "504")},
            _API, body={_JSON: {"schema": schema}}, op_id=endpoint.operation)}
    return paths


#: a page of usage rows (each: the group's values, every counter, the cost as a decimal)
_USAGE_PAGE: dict[str, Any] = {
    "type": "object", "required": ["object", "data", "has_more", "next"],
    "properties": {
        "object": {"type": "string", "enum": ["list"]}, "tenant": _STR,
        "from": _STR, "to": _STR, "group_by": {"type": "array", "items": _STR},
        "data": {"type": "array", "items": {"type": "object"}},
        "has_more": {"type": "boolean"}, "next": _OPT_STR,
    },
}


def _usage_params(*, admin: bool = False) -> list[dict[str, Any]]:
    """The query parameters of ``/v1/usage`` and ``/admin/usage``."""
    dims = "hour, day, month, tenant, key, model, class, version, batch, team, organization"
    default = "tenant,day,model,class (one tenant: day,model,class)" if admin else \
        "day,model,class"
    return [
        _param("from", "query", _STR, description="start (inclusive): ISO date, or time on "
               "the hour; UTC unless a zone is given (default: today 00:00 UTC)"),
        _param("to", "query", _STR, description="end (exclusive), as from (default: "
               "tomorrow 00:00 UTC); at most 400 days after from"),
        _param("start", "query", _STR, description="the old spelling: first UTC day, "
               "YYYY-MM-DD (not with from/to)"),
        _param("end", "query", _STR, description="the old spelling: last UTC day, inclusive "
               "(default start)"),
        _param("group_by", "query", _STR, description=f"comma-separated, any of {dims} "
               f"(default {default}; empty: one total row)"),
        _param("limit", "query", {"type": "integer", "minimum": 1, "maximum": 10_000},
               description="rows per page (default 1000)"),
        _param("after", "query", _STR, description="the `next` of the previous page"),
    ]


def _v1_paths() -> dict[str, Any]:
    file_id = _param("file_id", "path", _STR)
    batch_id = _param("batch_id", "path", _STR)
    model_id = _param("model_id", "path", _STR)
    response_id = _param("response_id", "path", _STR)
    read = _errors("401", "404")
    stored = _errors("401", "404", "503")
    upload = {"multipart/form-data": {"schema": {
        "type": "object", "required": ["file", "purpose"],
        "properties": {"file": {"type": "string", "format": "binary"},
                       "purpose": {"type": "string", "enum": ["batch"]}}}}}
    batch = {_JSON: {"schema": {
        "type": "object", "required": ["input_file_id", "endpoint", "completion_window"],
        "additionalProperties": True,
        "properties": {
            "input_file_id": _STR,
            "endpoint": {"type": "string", "enum": list(ENDPOINTS)},
            "completion_window": {"type": "string", "enum": ["24h"]},
            "metadata": {"type": ["object", "null"], "maxProperties": 16,
                         "additionalProperties": {"type": "string", "maxLength": 512}},
        }}}}
    usage_params = _usage_params()
    return {
        "/v1/models": {"get": _op("The public model names", {
            "200": _ok("A list of models"), **_errors("401")}, _API, op_id="listModels")},
        "/v1/models/{model_id}": {"get": _op("One model", {
            "200": _ok("The model"), **read}, _API, params=[model_id], op_id="getModel")},
        "/v1/responses/{response_id}": {
            "get": _op("A stored response of the caller's tenant (Responses API, store: true)",
                       {"200": _ok("The response object"), **stored}, _API,
                       params=[response_id], op_id="getResponse"),
            "delete": _op("Delete a stored response", {
                "200": _ok("Deleted: {id, object: response, deleted: true}"), **stored}, _API,
                params=[response_id], op_id="deleteResponse"),
        },
        "/v1/responses/{response_id}/input_items": {"get": _op(
            "The input items of a stored response's request, a page at a time", {
                "200": _ok("A list of input items"), **_errors("400", "401", "404", "503")},
            _API, params=[
                response_id,
                _param("limit", "query", {"type": "integer", "minimum": 1, "maximum": 100},
                       description="items per page (default 20)"),
                _param("order", "query", {"type": "string", "enum": ["asc", "desc"]},
                       description="default desc"),
                _param("after", "query", _STR, description="an item id"),
                _param("before", "query", _STR, description="an item id")],
            op_id="listResponseInputItems")},
        "/v1/files": {"post": _op("Upload a batch input file (JSONL, validated line by line)", {
            "200": _ok("The file object"), **_errors("400", "401", "413")}, _API,
            body=upload, op_id="uploadFile")},
        "/v1/files/{file_id}": {
            "get": _op("A file's metadata", {"200": _ok("The file object"), **read}, _API,
                       params=[file_id], op_id="getFile"),
            "delete": _op("Delete a file", {"200": _ok("Deleted"), **read}, _API,
                          params=[file_id], op_id="deleteFile"),
        },
        "/v1/files/{file_id}/content": {"get": _op("A file's content", {
            "200": _ok("The JSONL content", "application/jsonl", {"type": "string"}), **read},
            _API, params=[file_id], op_id="getFileContent")},
        "/v1/batches": {
            "post": _op("Create a batch from an uploaded file", {
                "200": _ok("The batch object"), **_errors("400", "401", "404")}, _API,
                body=batch, op_id="createBatch"),
            "get": _op("The caller's batches, newest first", {
                "200": _ok("A list of batches"), **_errors("400", "401")}, _API,
                params=[_param("after", "query", _STR),
                        _param("limit", "query", {"type": "integer", "minimum": 1,
                                                  "maximum": 100})],
                op_id="listBatches"),
        },
        "/v1/batches/{batch_id}": {"get": _op("One batch", {
            "200": _ok("The batch object"), **read}, _API, params=[batch_id],
            op_id="getBatch")},
        "/v1/batches/{batch_id}/cancel": {"post": _op("Cancel a batch", {
            "200": _ok("The batch object"), **_errors("400", "401", "404")}, _API,
            params=[batch_id], op_id="cancelBatch")},
        "/v1/usage": {"get": _op("The caller's own usage (its key's tenant), from the hourly "
                                 "rollups", {
            "200": _ok("Usage rows", schema=_USAGE_PAGE), **_errors("400", "401", "503")},
            _API, params=usage_params, op_id="getUsage")},
    }


def _admin_paths() -> dict[str, Any]:
    admin = _errors("400", "401", "404")
    key = {_JSON: {"schema": {
        "type": "object", "required": ["tenant"], "additionalProperties": True,
        "properties": {
            "tenant": _STR, "name": _STR,
            "expires": {"type": ["string", "null"],
                        "description": "ISO 8601 time or a duration such as 30d"},
            "default_class": _OPT_STR, "allow_class_header": {"type": "boolean"},
            "limits": {"type": ["object", "null"], "additionalProperties": True},
        }}}}
    tenant = _param("tenant", "query", _STR)
    return {
        "/admin/reload": {"post": _op("Reload the policy from its file", {
            "200": _ok("Reloaded"), "422": _ok("Rejected; the old policy is kept"), **admin},
            _ADMIN, op_id="adminReload")},
        "/admin/stats": {"post": _op("Pools, backends, retries, shadow traffic", {
            "200": _ok("Live state"), **admin}, _ADMIN, op_id="adminStats")},
        "/admin/keys": {
            "post": _op("Create a managed API key (shown once)", {
                "201": _ok("The key"), **admin}, _ADMIN, body=key, op_id="adminCreateKey"),
            "get": _op("List managed keys (never the secret)", {
                "200": _ok("Keys", schema={"type": "array"}), **admin}, _ADMIN,
                params=[tenant], op_id="adminListKeys"),
        },
        "/admin/keys/{key_id}/revoke": {"post": _op("Revoke a managed key", {
            "200": _ok("The revoked key"), **admin}, _ADMIN,
            params=[_param("key_id", "path", _STR)], op_id="adminRevokeKey")},
        "/admin/usage": {"get": _op("Usage of every tenant (or one), from the hourly rollups", {
            "200": _ok("Usage rows", schema=_USAGE_PAGE), **admin, **_errors("503")}, _ADMIN,
            params=[*_usage_params(admin=True),
                    _param("tenant", "query", _STR, description="only this tenant (default: "
                           "every tenant, grouped by tenant first)")],
            op_id="adminUsage")},
        "/admin/usage/export": {"get": _op("Every usage record in a time range", {
            "200": {"description": "JSON lines or CSV",
                    "content": {"application/x-ndjson": {"schema": {"type": "string"}},
                                "text/csv": {"schema": {"type": "string"}}}}, **admin},
            _ADMIN, params=[
                _param("start_ms", "query", {"type": "integer"}, required=True),
                _param("end_ms", "query", {"type": "integer"}, required=True), tenant,
                _param("format", "query", {"type": "string", "enum": ["jsonl", "csv"]})],
            op_id="adminUsageExport")},
        "/admin/usage/reconcile": {"get": _op("Check a tenant's day: records against rollups", {
            "200": _ok("Every drifting (hour, group, counter) with both figures"), **admin,
            **_errors("503")}, _ADMIN, params=[
                _param("tenant", "query", _STR, required=True),
                _param("day", "query", _STR, required=True, description="YYYY-MM-DD")],
            op_id="adminUsageReconcile")},
        "/admin/audit": {"get": _op("This worker's latest admin requests, newest first", {
            "200": _ok("Audit entries", schema={"type": "array"}), **admin}, _ADMIN,
            params=[_param("limit", "query", {"type": "integer", "minimum": 1,
                                              "maximum": 1000})], op_id="adminAudit")},
        "/admin/rollouts": {"get": _op("Every progressive rollout and its state", {
            "200": _ok("Rollouts", schema={"type": "array"}), **admin, **_errors("503")},
            _ADMIN, op_id="adminRollouts")},
        "/admin/rollouts/{model}": {"get": _op("One model's rollout", {
            "200": _ok("The rollout"), **admin, **_errors("503")}, _ADMIN,
            params=[_param("model", "path", _STR)], op_id="adminRollout")},
        "/admin/rollouts/{model}/{action}": {"post": _op(
            "Act on a rollout (pause, resume, promote, rollback, ...)", {
                "200": _ok("The rollout"), **admin, **_errors("409", "503")}, _ADMIN,
            params=[_param("model", "path", _STR), _param("action", "path", _STR)],
            op_id="adminRolloutAction")},
        "/admin/shadow/{model}": {"get": _op("Shadow traffic's comparisons for a model", {
            "200": _ok("The comparison summary"), **admin}, _ADMIN,
            params=[_param("model", "path", _STR)], op_id="adminShadow")},
    }


def _ops_paths() -> dict[str, Any]:
    return {
        "/healthz": {"get": _op("The process is alive", {"200": _ok("ok")}, _NONE,
                                op_id="healthz")},
        "/readyz": {"get": _op("Policy loaded and every pool has a reachable backend", {
            "200": _ok("Ready"), "503": _ok("Not ready (or draining)")}, _NONE,
            op_id="readyz")},
        "/metrics": {"get": _op("Prometheus metrics", {
            "200": {"description": "Prometheus text format",
                    "content": {"text/plain": {"schema": {"type": "string"}}}}}, _NONE,
            op_id="metrics")},
    }


def openapi_document(policy: Policy, *, admin: bool = False) -> dict[str, Any]:
    """The OpenAPI 3.1 document of a gateway serving ``policy``: the admin API only with
    ``admin`` (the document served to a caller with the admin token), since the routes and
    parameters of an API are a map for whoever probes it."""
    models = [m.name for m in policy.models]
    error = {"type": "object", "required": ["error"], "properties": {"error": {
        "type": "object", "required": ["message", "type", "param", "code"],
        "properties": {"message": _STR, "type": _STR, "param": _OPT_STR, "code": _OPT_STR}}}}
    return {
        "openapi": "3.1.0",
        "info": {"title": "llm-gateway", "version": "1",
                 "description": "One OpenAI-compatible endpoint in front of many inference "
                                f"backends. Request bodies up to "
                                f"{policy.server.max_body_bytes} bytes, nesting at most "
                                f"{MAX_DEPTH} levels, each top-level key once."},
        "paths": {**_proxy_paths(models), **_v1_paths(),
                  **(_admin_paths() if admin else {}), **_ops_paths()},
        "components": {
            "schemas": {"Error": error},
            "securitySchemes": {
                "apiKey": {"type": "http", "scheme": "bearer",
                           "description": "a static or managed API key (sk-gw-...)"},
                **({"adminToken": {"type": "http", "scheme": "bearer",
                                   "description": "$GATEWAY_ADMIN_TOKEN"}} if admin else {}),
            },
        },
    }


def openapi_bytes(policy: Policy, *, admin: bool = False) -> bytes:
    """The document encoded as JSON (build it once per policy, not per request)."""
    return msgspec.json.encode(openapi_document(policy, admin=admin))


def openapi_handlers(current: Callable[[], Runtime]) -> list[Any]:
    """``GET /openapi.json``, re-encoded only when a reload changed the policy; the admin
    routes are in it only for a caller that sends the admin token."""
    # the policy it was built for (kept alive), the public bytes, the admin bytes
    built: list[Any] = [None, b"", b""]

    @get("/openapi.json", sync_to_thread=False)
    def openapi(request: Request[Any, Any, Any]) -> Response[bytes]:
        policy = current().policy
        if built[0] is not policy:
            built[:] = [policy, openapi_bytes(policy), openapi_bytes(policy, admin=True)]
        sent = request.headers.get("authorization")
        admin = is_admin_credential(sent.encode("latin-1") if sent is not None else None)
        return Response(built[2] if admin else built[1], media_type=_JSON)

    return [openapi]
