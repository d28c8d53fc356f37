# Single entry point: `make up` sets everything up and runs the stack, `make test` tests it.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
MODEL ?=
MAX_LENGTH ?= 512
REPOSITORY := model_repository
EXPORTED := $(REPOSITORY)/bge_onnx/1/model_int8.onnx
export HF_HUB_OFFLINE ?= 1

.PHONY: help setup export triton up down test test-fast lint typecheck check clean

help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

setup: $(STAMP) ## create .venv and install the pinned dependencies

export: $(STAMP) ## export MODEL (hub id or directory; default all-MiniLM-L6-v2) into model_repository/
	$(PY) -m export --model "$(MODEL)" --repository $(REPOSITORY) --max-length $(MAX_LENGTH)

$(EXPORTED): | $(STAMP)
	$(PY) -m export --model "$(MODEL)" --repository $(REPOSITORY) --max-length $(MAX_LENGTH)

triton: $(EXPORTED) ## run Triton in the foreground (ports: TRITON_HTTP_PORT/GRPC_PORT/METRICS_PORT)
	$(PY) -m localtriton serve --repository $(REPOSITORY)

up: $(EXPORTED) ## set up, export the default model if missing, start Triton in the background
	$(PY) -m localtriton start --repository $(REPOSITORY)

down: ## stop what `make up` started
	@if [ -x $(PY) ]; then $(PY) -m localtriton stop; fi

test: $(STAMP) ## the whole suite: real export, real Triton
	$(PY) -m pytest

test-fast: $(STAMP) ## unit tests only
	$(PY) -m pytest -m "not slow"

lint: $(STAMP) ## ruff
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

typecheck: $(STAMP) ## mypy --strict
	$(PY) -m mypy

check: $(STAMP) ## format, typecheck, lint
	$(PY) -m ruff format .
	$(PY) -m mypy
	$(PY) -m ruff check .

clean: down ## remove the venv, generated models and run state
	rm -rf $(VENV) .run .pytest_cache .mypy_cache .ruff_cache
	rm -f $(REPOSITORY)/bge_onnx/1/*.onnx $(REPOSITORY)/bge_onnx/1/parity.json $(REPOSITORY)/bge_tokenizer/1/tokenizer.json
