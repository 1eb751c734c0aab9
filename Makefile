# One entry point for everything a developer or CI runs.
#   make test   create .venv if needed, install with dev extras, lint, type-check, layer-check, test
#   make demo   the main job on its embedded default
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: test lint typecheck layers proto-check crd-check pytest demo proto clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

test: $(STAMP) lint typecheck layers proto-check crd-check pytest

lint: $(STAMP)
	$(BIN)/ruff check src tests bench tools

typecheck: $(STAMP)
	$(BIN)/mypy

layers: $(STAMP)
	$(BIN)/lint-imports

proto-check: $(STAMP)
	@if [ -f tools/gen_proto.py ]; then $(BIN)/python tools/gen_proto.py --check; fi

crd-check: $(STAMP)
	$(BIN)/python tools/gen_crds.py --check

proto: $(STAMP)
	$(BIN)/python tools/gen_proto.py

pytest: $(STAMP)
	$(BIN)/pytest -q

demo: $(STAMP)
	$(BIN)/tessera simulate --cluster 4x8xA100-SXM4-80GB --report simulation-report.html

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
