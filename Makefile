# digest_pipeline developer and CI entry points. `make` (or `make help`) lists the targets.
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help
.DELETE_ON_ERROR:

VENV ?= .venv
PY = $(VENV)/bin/python
BIN = $(VENV)/bin
# Interpreter used only to create the venv: python3.11 when available, else python3.
PYTHON_BOOTSTRAP ?= $(shell command -v python3.11 2>/dev/null || command -v python3 2>/dev/null)
# Extra arguments for pytest, e.g. `make test PYTEST_ARGS='-k ledger -x'`.
PYTEST_ARGS ?=
# pytest-xdist processes for the no-service tier (its tests share no server; the tiers that do
# truncate one PostgreSQL schema, so they run in one process).
PYTEST_WORKERS ?= 2
# A PYTEST_ARGS selection may leave one tier empty: pytest's "no tests collected" (5) is not a
# failure of that tier.
ALLOW_EMPTY = || [ $$? -eq 5 ]
# The project's Dagster instance (runs, partitions, check results): git-ignored, under .digest/.
DAGSTER_HOME ?= $(CURDIR)/.digest/dagster_home
DEMO_CUSTOMERS ?= 300
UI_PORT ?= 3000
# Extra arguments for the benchmarks, e.g. `make bench BENCH_ARGS='--only e2e --large'`.
BENCH_ARGS ?=

# Pass CI through to recipes (pytest turns missing services into failures under CI=true).
ifdef CI
export CI
endif

.PHONY: help install lint docs validate test test-fast chaos bench demo ui clean

help: ## List the targets
	@echo "Targets:"
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-10s %s\n", $$1, $$2}' $(MAKEFILE_LIST)
	@echo "Variables: VENV=$(VENV)  PYTEST_ARGS='$(PYTEST_ARGS)'"

$(VENV)/.installed: pyproject.toml
	@test -n "$(PYTHON_BOOTSTRAP)" || { echo "error: neither python3.11 nor python3 found" >&2; exit 1; }
	test -x $(PY) || $(PYTHON_BOOTSTRAP) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install -e '.[dev]'
	touch $@

install: $(VENV)/.installed ## Create the venv and install the project with dev extras

lint: install ## ruff check, ruff format --check, import contracts, mypy
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy

docs: install ## Build the documentation site (mkdocs, strict: a broken link fails) into site/
	$(BIN)/mkdocs build --strict

validate: install ## Load the Dagster definitions as `dagster dev` would (workspace.yaml)
	env -u DAGSTER_HOME $(BIN)/dagster definitions validate -w workspace.yaml

test: install lint docs validate ## Lint, build the docs, validate, then every test tier against a throwaway PostgreSQL and Redis
	scripts/debian-test-tools.sh
	$(BIN)/pytest -m "not integration" -n $(PYTEST_WORKERS) --dist loadscope $(PYTEST_ARGS) $(ALLOW_EMPTY)
	scripts/pg-test-cluster.sh -- scripts/redis-test-server.sh -- $(BIN)/pytest -m integration $(PYTEST_ARGS) $(ALLOW_EMPTY)

test-fast: install ## Tests that need no services (pytest -m "not integration"), on PYTEST_WORKERS processes
	$(BIN)/pytest -m "not integration" -n $(PYTEST_WORKERS) --dist loadscope $(PYTEST_ARGS)

chaos: install ## SIGKILL delivery workers on a throwaway PostgreSQL; check once-only delivery (long run)
	scripts/pg-test-cluster.sh -- scripts/redis-test-server.sh -- $(BIN)/python -m benchmarks.chaos --customers 5000 --workers 4 --rounds 10

bench: install ## Scale benchmarks on a throwaway PostgreSQL; tables + .digest/bench/*.json
	scripts/pg-test-cluster.sh -- scripts/redis-test-server.sh -- $(BIN)/python -m benchmarks $(BENCH_ARGS)

demo: install ## Seed demo data and run the latest complete week end to end (SQLite + outbox)
	DAGSTER_HOME=$(DAGSTER_HOME) $(BIN)/digest seed --customers $(DEMO_CUSTOMERS) --seed 7
	DAGSTER_HOME=$(DAGSTER_HOME) $(BIN)/digest run --period latest
	@echo
	@echo "Next: 'make ui' and open http://127.0.0.1:$(UI_PORT) (asset group 'digest'),"
	@echo "      '.venv/bin/digest status --period latest' for the ledger's view."

ui: install ## The Dagster web UI and daemon on 127.0.0.1 with the demo's instance
	DAGSTER_HOME=$(DAGSTER_HOME) $(PY) -m digest_pipeline.instance >/dev/null
	DAGSTER_HOME=$(DAGSTER_HOME) $(BIN)/dagster dev -h 127.0.0.1 -p $(UI_PORT) -w workspace.yaml

clean: ## Remove the venv, caches and .digest
	rm -rf -- "$(VENV)" .digest site .pytest_cache .mypy_cache .ruff_cache .hypothesis build dist *.egg-info
	find . -path ./.git -prune -o -type d -name __pycache__ -prune -exec rm -rf {} +
