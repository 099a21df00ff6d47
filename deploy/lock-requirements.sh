#!/usr/bin/env bash
# Regenerate deploy/requirements.lock: `pip freeze` of a throw-away venv that holds only the
# gateway's runtime dependencies (pyproject.toml) plus the OpenTelemetry SDK and OTLP/HTTP exporter.
# Run it with the same minor Python as the image's base (3.11): markers and wheels differ by version.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-python3}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$PY" -m venv "$tmp/venv"
"$tmp/venv/bin/pip" install -q --upgrade pip
"$tmp/venv/bin/pip" install -q . opentelemetry-sdk opentelemetry-exporter-otlp-proto-http
{
  sed -n '1,/^# Regenerate/p' deploy/requirements.lock
  "$tmp/venv/bin/pip" freeze --exclude llm-gateway
} > "$tmp/requirements.lock"
mv "$tmp/requirements.lock" deploy/requirements.lock
echo "wrote deploy/requirements.lock ($(grep -c '==' deploy/requirements.lock) pins)"
