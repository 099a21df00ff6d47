# Two commands on a fresh Debian machine with python3 (>= 3.11) and make:
#   make demo   - install into .venv and run the gateway demo on embedded defaults
#   make test   - install into .venv and run the whole test suite (lint, types, imports, docs, tests)
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
# the documentation site (mkdocs.yml, docs/): `make docs` serves it, `make docs-build` builds it
DOCS_ADDR ?= 127.0.0.1:8001
SITE_DIR ?= .site
# mkdocs-material prints a banner about MkDocs 2.0 on every run unless this is set
MKDOCS := NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs

.PHONY: demo test pytest lint schema system-deps llama-server clean bench-overhead docs docs-build

$(BIN)/python:
	@$(PY) -m venv $(VENV) 2>/dev/null || { \
	  echo "python3-venv is missing; installing it with apt-get"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv && \
	  rm -rf $(VENV) && $(PY) -m venv $(VENV); }

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[test,loadtest,deploy]"
	@touch $(STAMP)

# redis-server and the PostgreSQL server for the quota and ledger tests (they start their own on
# free ports); Debian keeps initdb off PATH, under /usr/lib/postgresql/<version>/bin; chromium and
# its driver for the console's browser test (tests/console)
system-deps:
	@command -v redis-server >/dev/null 2>&1 || { \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server; }
	@command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql; }
	@command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1 || { \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; }

# llama.cpp's llama-server, the real engine of tests/engines and the benchmarks (loadtest/engines):
# built once (~10-15 min on 2 cores) into $GATEWAY_ENGINE_CACHE, by default
# ~/.cache/llm-gateway/llama.cpp-0.3.36, outside the tree; a no-op once it is there
llama-server: | $(BIN)/python
	@PYTHON=$(BIN)/python bash deploy/engines/build-llama-server.sh

# the coding agents of tests/agents (Claude Code, Codex CLI, opencode, aider), each at a pinned
# version, into $GATEWAY_AGENTS_CACHE (~/.cache/llm-gateway/agents, ~1.9 GB, ~1-2 min), outside
# the tree; a no-op once there (tests/agents installs them itself under CI)
agents:
	@PYTHON=$(PY) bash deploy/agents/install-agents.sh >/dev/null

demo: $(STAMP)
	$(BIN)/gateway demo

lint: $(STAMP)
	$(BIN)/ruff check gateway loadtest tests docs/hooks
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(MKDOCS) build --strict --site-dir $(SITE_DIR)

# the console's browser test saves its screenshots there (the run's artifacts)
CONSOLE_SCREENSHOT_DIR ?= $(CURDIR)/.artifacts/screenshots
export CONSOLE_SCREENSHOT_DIR

# pytest in parallel workers (pytest-xdist): a module's tests stay on one worker, so its
# servers start once (PYTEST_WORKERS=0 runs them in this process, one after the other)
PYTEST_WORKERS ?= 2
pytest: $(STAMP) system-deps llama-server
	$(BIN)/python -m pytest $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadscope)

test: lint pytest

schema: $(STAMP)
	$(BIN)/gateway schema -o policies/schema.json

# serve the docs with live reload (DOCS_ADDR=host:port to change where)
docs: $(STAMP)
	$(MKDOCS) serve --dev-addr $(DOCS_ADDR)

# build the docs as CI does: any warning (a broken link or anchor, a page not in nav) fails
docs-build: $(STAMP)
	$(MKDOCS) build --strict --site-dir $(SITE_DIR)

bench-overhead: $(STAMP)
	$(BIN)/python -m loadtest.bench.overhead

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache $(SITE_DIR) .artifacts
