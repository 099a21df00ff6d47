"""The policy JSON Schema, generated from the typed model (``gateway schema``)."""

from __future__ import annotations

import json

import msgspec

from gateway.config.model import Policy

__all__ = ["policy_schema", "policy_schema_json"]


def policy_schema() -> dict[str, object]:
    schema: dict[str, object] = msgspec.json.schema(Policy)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "LLM gateway policy"
    return schema


def policy_schema_json() -> str:
    return json.dumps(policy_schema(), indent=2, sort_keys=True) + "\n"
