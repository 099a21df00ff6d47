"""OTLP/HTTP span export with a lean protobuf encoder.

The OpenTelemetry SDK's OTLP exporter builds a protobuf message object per span, attribute and
value, in Python, before serialising them; for the gateway's spans (a SERVER span with ~35
attributes and a CLIENT span per attempt) that was ~1.5 million instructions per sampled request
(callgrind), three times what the whole proxied request costs. :func:`encode_spans` writes the
same ``ExportTraceServiceRequest`` straight to protobuf wire bytes (~10x fewer instructions;
``tests/telemetry/test_otlp_encode.py`` checks that decoding them gives the message the SDK's
encoder builds, field for field).

:class:`OTLPExporter` is the SDK's ``OTLPSpanExporter`` with only the encoding replaced: endpoint,
headers, compression, timeouts, TLS, retries and back-off stay the SDK's, read from the standard
``OTEL_EXPORTER_OTLP_*`` variables. It sends through the SDK exporter's HTTP client when the
installed SDK has the one this was written against (1.45; a test pins that) and otherwise falls
back to the SDK's own ``export``, which is slower but equivalent.

Wire format (opentelemetry-proto ``trace/v1/trace.proto``, ``common/v1/common.proto``): every
message is a run of ``tag, value`` pairs; tag = field number << 3 | wire type (0 varint,
1 fixed64, 2 length-delimited, 5 fixed32); sub-messages, strings and bytes are length-delimited.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import SpanExportResult

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

__all__ = ["OTLPExporter", "encode_spans"]

_pack_double = struct.Struct("<d").pack
_pack_fixed64 = struct.Struct("<Q").pack
_pack_fixed32 = struct.Struct("<I").pack

# Span.flags (field 16, fixed32): the "has is_remote" bit, plus "is remote" for a remote parent
_FLAGS_HAS_IS_REMOTE = 0x100
_FLAGS_IS_REMOTE = 0x200
_SPAN_FLAGS = {False: b"\x85\x01" + _pack_fixed32(_FLAGS_HAS_IS_REMOTE),
               True: b"\x85\x01" + _pack_fixed32(_FLAGS_HAS_IS_REMOTE | _FLAGS_IS_REMOTE)}
_TRUE = b"\x10\x01"  # AnyValue.bool_value = true
_FALSE = b"\x10\x00"


def _varint(n: int) -> bytes:
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL = [_varint(n) for n in range(16384)]  # most lengths and many int values


def _len(n: int) -> bytes:
    return _SMALL[n] if n < 16384 else _varint(n)


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: tag, length, payload."""
    return tag + _len(len(payload)) + payload


def _int(value: int) -> bytes:
    """AnyValue.int_value (int64: negatives as 64-bit two's complement)."""
    if 0 <= value < 16384:
        return b"\x18" + _SMALL[value]
    return b"\x18" + _varint(value & 0xFFFFFFFFFFFFFFFF)


def _any(value: Any) -> bytes:
    """An AnyValue's body (the SDK's types: str, bool, int, float, bytes, sequences, mappings)."""
    kind = type(value)
    if kind is str:
        raw: bytes = value.encode()
        return b"\x0a" + _len(len(raw)) + raw
    if kind is bool:
        return _TRUE if value else _FALSE
    if kind is int:
        return _int(value)
    if kind is float:
        return b"\x21" + _pack_double(value)
    if isinstance(value, bytes):
        return _field(b"\x3a", value)
    if isinstance(value, Sequence):  # ArrayValue { repeated AnyValue values = 1 }
        return _field(b"\x2a", b"".join(_field(b"\x0a", _any(v)) for v in value))
    if isinstance(value, Mapping):  # KeyValueList { repeated KeyValue values = 1 }
        return _field(b"\x32", b"".join(_field(b"\x0a", _key_value(k, v))
                                        for k, v in value.items()))
    # the subclasses of the plain types (enums, str subclasses) the type checks above skipped
    for base in (bool, int, float, str):
        if isinstance(value, base):
            return _any(base(value))
    return _any(str(value))


_KEYS: dict[str, bytes] = {}  # attribute key -> its encoded KeyValue.key field
#: (key, str value) -> the length-prefixed KeyValue: most string attributes (operation, model,
#: pool, class, backend, tenant, outcome, addresses) repeat from request to request
_STRINGS: dict[tuple[str, str], bytes] = {}
_CACHE_LIMIT = 4096  # entries per cache; past it a cache starts over (never grows unbounded)


def _key(key: str) -> bytes:
    head = _KEYS.get(key)
    if head is None:
        head = _field(b"\x0a", key.encode())
        if len(_KEYS) >= _CACHE_LIMIT:
            _KEYS.clear()
        _KEYS[key] = head
    return head


def _key_value(key: str, value: Any) -> bytes:
    body = _any(value)
    return _key(key) + b"\x12" + _len(len(body)) + body


def _attributes(tag: bytes, attributes: Mapping[str, Any] | None) -> list[bytes]:
    """One ``tag`` field per attribute (repeated KeyValue)."""
    if not attributes:
        return []
    out = []
    strings, keys, small = _STRINGS, _KEYS, _SMALL
    for key, value in attributes.items():
        kind = type(value)
        if kind is int and 0 <= value < 16384:  # counts, ports, statuses: inline
            number = small[value]
            head = keys.get(key) or _key(key)
            body = head + b"\x12" + small[len(number) + 1] + b"\x18" + number
            out.append(tag + small[len(body)] + body)
        elif kind is str:
            kv = strings.get((key, value))
            if kv is None:
                body = _key_value(key, value)
                kv = _len(len(body)) + body
                if len(strings) >= _CACHE_LIMIT:
                    strings.clear()
                strings[key, value] = kv
            out.append(tag + kv)
        else:
            body = _key_value(key, value)
            out.append(tag + _len(len(body)) + body)
    return out


def _encode_span(span: ReadableSpan) -> bytes:
    context = span.context
    assert context is not None
    parts = [b"\x0a\x10" + context.trace_id.to_bytes(16, "big"),
             b"\x12\x08" + context.span_id.to_bytes(8, "big")]
    state = context.trace_state
    if state:
        parts.append(_field(b"\x1a", ",".join(f"{k}={v}" for k, v in state.items()).encode()))
    parent = span.parent
    if parent is not None:
        parts.append(b"\x22\x08" + parent.span_id.to_bytes(8, "big"))
    parts.append(_field(b"\x2a", span.name.encode()))
    kind = span.kind.value + 1  # SDK SpanKind INTERNAL=0.. ; OTLP SPAN_KIND_INTERNAL=1..
    parts.append(b"\x30" + _SMALL[kind])
    if span.start_time:
        parts.append(b"\x39" + _pack_fixed64(span.start_time))
    if span.end_time:
        parts.append(b"\x41" + _pack_fixed64(span.end_time))
    parts += _attributes(b"\x4a", span.attributes)
    if span.dropped_attributes:
        parts.append(b"\x50" + _varint(span.dropped_attributes))
    for event in span.events:
        body = [b"\x09" + _pack_fixed64(event.timestamp), _field(b"\x12", event.name.encode())]
        body += _attributes(b"\x1a", event.attributes)
        if event.dropped_attributes:
            body.append(b"\x20" + _varint(event.dropped_attributes))
        parts.append(_field(b"\x5a", b"".join(body)))
    if span.dropped_events:
        parts.append(b"\x60" + _varint(span.dropped_events))
    for link in span.links:
        body = [b"\x0a\x10" + link.context.trace_id.to_bytes(16, "big"),
                b"\x12\x08" + link.context.span_id.to_bytes(8, "big")]
        body += _attributes(b"\x22", link.attributes)
        if link.dropped_attributes:
            body.append(b"\x28" + _varint(link.dropped_attributes))
        body.append(b"\x35" + _pack_fixed32(
            _FLAGS_HAS_IS_REMOTE | (_FLAGS_IS_REMOTE if link.context.is_remote else 0)))
        parts.append(_field(b"\x6a", b"".join(body)))
    if span.dropped_links:
        parts.append(b"\x70" + _varint(span.dropped_links))
    status = span.status
    status_body = b""
    if status.description:
        status_body += _field(b"\x12", status.description.encode())
    if status.status_code.value:
        status_body += b"\x18" + _SMALL[status.status_code.value]
    parts.append(_field(b"\x7a", status_body))
    parts.append(_SPAN_FLAGS[bool(parent is not None and parent.is_remote)])
    return b"".join(parts)


#: id -> (resource, its encoding): a process has one or two, so each is encoded once. Keyed by
#: identity, not by value: ``Resource.__hash__`` serialises the attributes to JSON on each call.
_RESOURCES: dict[int, tuple[Resource, bytes]] = {}


def _resource(resource: Resource) -> bytes:
    cached = _RESOURCES.get(id(resource))
    if cached is not None and cached[0] is resource:
        return cached[1]
    encoded = b"".join(_attributes(b"\x0a", resource.attributes))
    if len(_RESOURCES) < 16:
        _RESOURCES[id(resource)] = (resource, encoded)
    return encoded


def _scope(scope: InstrumentationScope | None) -> bytes:
    if scope is None:
        return b""
    body = _field(b"\x0a", scope.name.encode()) if scope.name else b""
    if scope.version:
        body += _field(b"\x12", scope.version.encode())
    body += b"".join(_attributes(b"\x1a", scope.attributes))
    return body


def encode_spans(spans: Sequence[ReadableSpan]) -> bytes:
    """``ExportTraceServiceRequest`` wire bytes of ``spans``, grouped by resource and scope
    (by identity: the spans of one pipeline share both objects)."""
    groups: dict[int, tuple[Resource, dict[int, tuple[Any, list[bytes]]]]] = {}
    for span in spans:
        resource = span.resource
        group = groups.get(id(resource))
        if group is None:
            group = groups[id(resource)] = (resource, {})
        scope = span.instrumentation_scope or None
        scoped = group[1].get(id(scope))
        if scoped is None:
            scoped = group[1][id(scope)] = (scope, [])
        scoped[1].append(_encode_span(span))
    out = []
    for resource, by_id in groups.values():
        body = [_field(b"\x0a", _resource(resource))]
        for scope, encoded in by_id.values():
            scope_body = [_field(b"\x0a", _scope(scope))]
            scope_body += [_field(b"\x12", s) for s in encoded]
            if scope is not None and scope.schema_url:
                scope_body.append(_field(b"\x1a", scope.schema_url.encode()))
            body.append(_field(b"\x12", b"".join(scope_body)))
        if resource.schema_url:
            body.append(_field(b"\x1a", resource.schema_url.encode()))
        out.append(_field(b"\x0a", b"".join(body)))
    return b"".join(out)


class OTLPExporter(OTLPSpanExporter):
    """The SDK's OTLP/HTTP span exporter, encoding with :func:`encode_spans`."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        client = getattr(self, "_client", None)
        if client is None or self._shutdown or not hasattr(client, "export"):
            return super().export(spans)  # another SDK version: its own (slower) path
        try:
            data = encode_spans(spans)
        except Exception:  # an attribute type the encoder does not know: let the SDK try
            return super().export(spans)
        result = client.export(data)
        return SpanExportResult.SUCCESS if result.success else SpanExportResult.FAILURE

    @staticmethod
    def fast_path_available() -> bool:
        """Whether the installed SDK exporter has the HTTP client this class sends through."""
        from opentelemetry.exporter.otlp.common.http import _OTLPHTTPClient

        return hasattr(_OTLPHTTPClient, "export")
