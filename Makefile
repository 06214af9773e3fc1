# The two commands a newcomer needs:  `make demo`  and  `make test`.
# Both create the virtualenv and build (or reuse) the sandbox binaries first.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test venv sandbox-binaries lint unit crds bench clean

demo: venv sandbox-binaries
	$(BIN)/python -m tidal.sandbox demo

test: venv sandbox-binaries lint
	$(BIN)/pytest

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@echo "[make] creating $(VENV) and installing tidal with its dev dependencies"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip uv
	$(BIN)/uv pip install -q --python $(BIN)/python -e '.[dev]'
	@touch $@

sandbox-binaries:
	bash e2e/sandbox/build-binaries.sh

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy tidal/operator tidal/runtime tidal/sandbox
	$(BIN)/lint-imports

# Regenerate crds/ from the pydantic models (a test fails when they drift).
crds: venv
	$(BIN)/python -m tidal.operator.crdgen crds/

unit: venv
	$(BIN)/pytest -m "not sandbox"

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
