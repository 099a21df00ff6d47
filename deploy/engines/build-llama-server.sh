#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` (the real engine for tests and benchmarks) once and caches it
# outside the tree, reused across runs:
#
#   deploy/engines/build-llama-server.sh        # or: make llama-server
#
# Cache dir: ${GATEWAY_ENGINE_CACHE:-$HOME/.cache/llm-gateway/llama.cpp-0.3.36}. It ends up holding
#   bin/llama-server                        the engine
#   gguf-py/                                llama.cpp's GGUF writer (loadtest/engines/tiny_model.py)
#   models/ggml-vocab-gpt-2.gguf            the GPT-2 tokenizer the tiny test models use
#   llama_cpp_python-0.3.36.tar.gz          the sdist the engine is built from
#   build.log                               the last build's output
# When bin/llama-server is there and runs, the script only prints its path (stdout's last line).
#
# The llama.cpp source is the one vendored in llama-cpp-python's sdist on PyPI (0.3.36): a copy of
# the sdist already in the cache dir, or $GATEWAY_LLAMA_SDIST, is used as is; else pip downloads it.
# The build happens in a temp dir under the cache dir and is moved into place at the end, so an
# interrupted build leaves nothing half-made. cmake comes from apt-get when it is missing.
#
# Environment:
#   GATEWAY_ENGINE_CACHE      the cache dir (above)
#   GATEWAY_LLAMA_SDIST       a pre-downloaded llama_cpp_python-0.3.36.tar.gz to use
#   GATEWAY_ENGINE_JOBS       parallel compile jobs (default: nproc, at most 2 -- shared machines)
#   GATEWAY_ENGINE_NATIVE     ON (default): -march=native; the cache lives on the machine that
#                             built it, and a binary that no longer runs here is rebuilt. OFF: a
#                             portable build (slower kernels).
#   GATEWAY_ENGINE_CMAKE_ARGS extra cmake configure arguments
#   PYTHON                    the python whose pip downloads the sdist (default: .venv's, python3)
set -euo pipefail

VERSION=0.3.36
CACHE="${GATEWAY_ENGINE_CACHE:-$HOME/.cache/llm-gateway/llama.cpp-$VERSION}"
BIN="$CACHE/bin/llama-server"
SDIST_NAME="llama_cpp_python-$VERSION.tar.gz"
JOBS="${GATEWAY_ENGINE_JOBS:-$(( $(nproc) < 2 ? $(nproc) : 2 ))}"
NATIVE="${GATEWAY_ENGINE_NATIVE:-ON}"

log() { echo "build-llama-server: $*" >&2; }

# a cached binary counts only if it runs here (a -march=native build moved to another CPU dies
# with SIGILL) and the model writer's files are there too
cache_ok() {
  [ -x "$BIN" ] && [ -d "$CACHE/gguf-py/gguf" ] && [ -f "$CACHE/models/ggml-vocab-gpt-2.gguf" ] \
    && "$BIN" --version >/dev/null 2>&1
}

if cache_ok; then
  echo "$BIN"
  exit 0
fi

mkdir -p "$CACHE"
# one build at a time per cache dir (two pytest sessions, or make and a test fixture)
exec 9>"$CACHE/.build.lock"
if ! flock -n 9; then
  log "another build holds $CACHE/.build.lock; waiting for it"
  flock 9
fi
if cache_ok; then
  echo "$BIN"
  exit 0
fi

if ! command -v cmake >/dev/null 2>&1 || ! command -v c++ >/dev/null 2>&1; then
  log "cmake or a C++ compiler is missing; installing them with apt-get"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq cmake g++ make
fi

SDIST="$CACHE/$SDIST_NAME"
if [ ! -s "$SDIST" ]; then
  if [ -n "${GATEWAY_LLAMA_SDIST:-}" ] && [ -s "$GATEWAY_LLAMA_SDIST" ]; then
    log "using $GATEWAY_LLAMA_SDIST"
    cp "$GATEWAY_LLAMA_SDIST" "$SDIST.tmp.$$" && mv "$SDIST.tmp.$$" "$SDIST"
  else
    if [ -z "${PYTHON:-}" ]; then
      here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
      if [ -x "$here/.venv/bin/python" ]; then PYTHON="$here/.venv/bin/python"; else PYTHON=python3; fi
    fi
    log "downloading llama-cpp-python==$VERSION (sdist) with $PYTHON -m pip"
    dl="$(mktemp -d "$CACHE/.download.XXXXXX")"
    "$PYTHON" -m pip download -q "llama-cpp-python==$VERSION" --no-binary :all: --no-deps -d "$dl"
    mv "$dl/$SDIST_NAME" "$SDIST"
    rm -rf "$dl"
  fi
fi

WORK="$(mktemp -d "$CACHE/.build.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
log "building llama-server in $WORK (-j$JOBS, GGML_NATIVE=$NATIVE; ~10+ minutes on 2 cores)"
log "build output: $CACHE/build.log"
start=$(date +%s)
tar xzf "$SDIST" -C "$WORK"
SRC="$(echo "$WORK"/llama_cpp_python-*/vendor/llama.cpp)"

# shellcheck disable=SC2086  # GATEWAY_ENGINE_CMAKE_ARGS is a list of arguments
if ! {
  cmake -B "$WORK/build" -S "$SRC" \
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE="$NATIVE" -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    ${GATEWAY_ENGINE_CMAKE_ARGS:-} &&
  cmake --build "$WORK/build" --target llama-server -j"$JOBS"
} >"$WORK/build.log" 2>&1; then
  cp "$WORK/build.log" "$CACHE/build.log"
  tail -n 40 "$CACHE/build.log" >&2
  log "build FAILED; full log in $CACHE/build.log"
  exit 1
fi

# assemble the result beside the cache, then move each piece into place with a rename; models/
# also holds the tiny models written from the vocab (loadtest/engines/tiny_model.py): kept
STAGE="$WORK/stage"
mkdir -p "$STAGE/bin" "$CACHE/models"
cp "$WORK/build/bin/llama-server" "$STAGE/bin/llama-server"
"$STAGE/bin/llama-server" --version >/dev/null 2>&1 || { log "the built llama-server does not run"; exit 1; }
cp -r "$SRC/gguf-py" "$STAGE/gguf-py"
cp "$SRC/models/ggml-vocab-gpt-2.gguf" "$CACHE/models/.ggml-vocab-gpt-2.gguf.$$"
mv "$CACHE/models/.ggml-vocab-gpt-2.gguf.$$" "$CACHE/models/ggml-vocab-gpt-2.gguf"
for part in gguf-py bin; do   # bin last: its presence marks a complete cache
  rm -rf "$CACHE/$part.old"
  if [ -e "$CACHE/$part" ]; then mv "$CACHE/$part" "$CACHE/$part.old"; fi
  mv "$STAGE/$part" "$CACHE/$part"
  rm -rf "$CACHE/$part.old"
done
cp "$WORK/build.log" "$CACHE/build.log"
log "built in $(( $(date +%s) - start ))s"
echo "$BIN"
