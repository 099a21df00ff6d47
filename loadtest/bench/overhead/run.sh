#!/usr/bin/env bash
# Thin wrapper: run the proxy-overhead benchmark with the repo's venv from any directory.
#   loadtest/bench/overhead/run.sh --quick --skip-gateway
#   loadtest/bench/overhead/run.sh --strict --out loadtest/results/overhead.json
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
python="${PYTHON:-$repo/.venv/bin/python}"
cd "$repo"
exec "$python" -m loadtest.bench.overhead "$@"
