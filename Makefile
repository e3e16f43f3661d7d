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

# Pass CI through to recipes (pytest turns missing services into failures under CI=true).
ifdef CI
export CI
endif

.PHONY: help install lint test test-fast demo ui clean

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

test: install lint ## Lint, then every test tier against a throwaway PostgreSQL
	scripts/pg-test-cluster.sh -- $(BIN)/pytest $(PYTEST_ARGS)

test-fast: install ## Tests that need no services (pytest -m "not integration")
	$(BIN)/pytest -m "not integration" $(PYTEST_ARGS)

demo: ## (not built yet) seed demo data and run a period end to end
	@echo "make demo: not built yet; the Dagster asset graph and the demo arrive with issue 4." >&2
	@exit 1

ui: ## (not built yet) the Dagster web UI
	@echo "make ui: not built yet; the Dagster asset graph and the demo arrive with issue 4." >&2
	@exit 1

clean: ## Remove the venv, caches and .digest
	rm -rf -- "$(VENV)" .digest .pytest_cache .mypy_cache .ruff_cache .hypothesis build dist *.egg-info
	find . -path ./.git -prune -o -type d -name __pycache__ -prune -exec rm -rf {} +
