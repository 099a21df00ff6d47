#!/usr/bin/env bash
# Installs the coding agents that tests/agents runs against the gateway, each at a pinned version,
# into a cache outside the tree, reused across runs (a no-op for an agent already there):
#
#   deploy/agents/install-agents.sh                     # all four (or: make agents)
#   deploy/agents/install-agents.sh claude codex        # some of them
#   deploy/agents/install-agents.sh --check             # install nothing: list what is there
#
# Cache dir: ${GATEWAY_AGENTS_CACHE:-$HOME/.cache/llm-gateway/agents}, one folder per agent and
# version:
#   claude-code-<v>/   npm --prefix: @anthropic-ai/claude-code (its native binary comes in the
#                      registry's platform package, @anthropic-ai/claude-code-linux-x64)
#   codex-<v>/         npm --prefix: @openai/codex (native binary in its platform package)
#   opencode-<v>/      npm --prefix: opencode-ai (native binary in opencode-linux-x64)
#   aider-chat-<v>/    a venv of its own: aider-chat pins ~100 exact dependencies (numpy, openai,
#                      litellm, ...) that conflict with the gateway's, so it never shares .venv
# Each folder gets an `.installed` stamp only once its binary ran (`--version`), so an
# interrupted install is redone. An install goes to a temp folder beside it and is moved into
# place at the end.
#
# stdout: one line per agent that is installed, `NAME<TAB>BINARY<TAB>VERSION` (NAME: claude,
# codex, opencode, aider); progress goes to stderr. Without --check a failed install exits 1
# (after trying the others).
#
# Environment:
#   GATEWAY_AGENTS_CACHE   the cache dir (above)
#   PYTHON                 the python that makes aider's venv (default python3; aider-chat
#                          0.86 needs >=3.10,<3.13)
set -euo pipefail

CLAUDE_CODE_VERSION=2.1.332
CODEX_VERSION=0.171.0
OPENCODE_VERSION=1.18.33
AIDER_VERSION=0.86.2

CACHE="${GATEWAY_AGENTS_CACHE:-$HOME/.cache/llm-gateway/agents}"
PY="${PYTHON:-python3}"

log() { echo "install-agents: $*" >&2; }

check=0
names=()
for arg in "$@"; do
  case "$arg" in
    --check) check=1 ;;
    claude|codex|opencode|aider) names+=("$arg") ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) log "unknown argument: $arg (agents: claude codex opencode aider)"; exit 2 ;;
  esac
done
[ ${#names[@]} -gt 0 ] || names=(claude codex opencode aider)

# name -> folder, binary inside it, package spec
dir_of() {
  case "$1" in
    claude) echo "$CACHE/claude-code-$CLAUDE_CODE_VERSION" ;;
    codex) echo "$CACHE/codex-$CODEX_VERSION" ;;
    opencode) echo "$CACHE/opencode-$OPENCODE_VERSION" ;;
    aider) echo "$CACHE/aider-chat-$AIDER_VERSION" ;;
  esac
}
bin_in() {
  case "$1" in
    claude) echo "node_modules/.bin/claude" ;;
    codex) echo "node_modules/.bin/codex" ;;
    opencode) echo "node_modules/.bin/opencode" ;;
    aider) echo "venv/bin/aider" ;;
  esac
}
version_of() {
  case "$1" in
    claude) echo "$CLAUDE_CODE_VERSION" ;;
    codex) echo "$CODEX_VERSION" ;;
    opencode) echo "$OPENCODE_VERSION" ;;
    aider) echo "$AIDER_VERSION" ;;
  esac
}
npm_spec() {
  case "$1" in
    claude) echo "@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION" ;;
    codex) echo "@openai/codex@$CODEX_VERSION" ;;
    opencode) echo "opencode-ai@$OPENCODE_VERSION" ;;
  esac
}

# the binary runs (`--version`), in a scratch HOME, with no update check or telemetry
SCRATCH_HOME="$(mktemp -d)"
trap 'rm -rf "$SCRATCH_HOME"' EXIT
runs() {
  local bin="$1"
  [ -x "$bin" ] || return 1
  HOME="$SCRATCH_HOME" DISABLE_AUTOUPDATER=1 CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 \
    OPENCODE_DISABLE_AUTOUPDATE=1 timeout 60 "$bin" --version >/dev/null 2>&1
}

installed() {
  local dir bin
  dir="$(dir_of "$1")"
  bin="$dir/$(bin_in "$1")"
  [ -f "$dir/.installed" ] && runs "$bin"
}

install_one() {
  local name="$1" dir tmp bin start
  dir="$(dir_of "$name")"
  bin="$(bin_in "$name")"
  mkdir -p "$CACHE"
  # one install at a time per cache (two pytest sessions, or make and a test fixture)
  exec 9>"$CACHE/.$name.lock"
  flock 9
  if installed "$name"; then return 0; fi
  start=$SECONDS
  if [ "$name" = aider ]; then
    # the venv's scripts name its absolute path, so it is made at its final place (the stamp,
    # written last, tells a whole install from an interrupted one)
    rm -rf "$dir"
    log "aider: python venv at $dir (aider-chat==$AIDER_VERSION; ~100 pinned dependencies)"
    "$PY" -m venv "$dir/venv" >&2
    "$dir/venv/bin/python" -m pip install -q --disable-pip-version-check \
      "aider-chat==$AIDER_VERSION" >&2
  else
    tmp="$(mktemp -d "$dir.tmp.XXXXXX")"
    log "$name: npm install $(npm_spec "$name") into $dir"
    # postinstall scripts run: Claude Code's and opencode's link the native binary that came in
    # the platform package (nothing is downloaded from elsewhere)
    npm install --prefix "$tmp" --no-audit --no-fund --no-update-notifier --loglevel=error \
      "$(npm_spec "$name")" >&2
    rm -rf "$dir"
    mv "$tmp" "$dir"
  fi
  if ! runs "$dir/$bin"; then
    log "$name: $dir/$bin does not run"
    return 1
  fi
  touch "$dir/.installed"
  log "$name: installed in $((SECONDS - start)) s, $(du -sh "$dir" | cut -f1)"
}

status=0
for name in "${names[@]}"; do
  if [ $check -eq 0 ] && ! installed "$name"; then
    install_one "$name" || { log "$name: install failed"; status=1; continue; }
  fi
  if installed "$name"; then
    printf '%s\t%s\t%s\n' "$name" "$(dir_of "$name")/$(bin_in "$name")" "$(version_of "$name")"
  fi
done
exit $status
