# nnhal — `make help` lists the targets.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: help setup test test-litert run bench lint clean ops cts soak fuzz wheel

help:  ## Show this help
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

PROTO_OUT := service/proto/nnhal_pb2.py service/proto/nnhal_pb2_grpc.py

setup: $(BIN)/nnhal $(PROTO_OUT)  ## Create .venv, install pinned deps and nnhal (editable), compile the numba kernels, generate protobuf code

$(BIN)/nnhal: pyproject.toml requirements.lock
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements.lock
	$(BIN)/pip install -q --no-deps -e .
	$(BIN)/pip install -q --no-deps $(foreach d,$(wildcard extensions/examples/*/pyproject.toml),-e $(dir $(d)))
	$(BIN)/python -c "from hal import backends; backends.ensure_loaded()"  # warm-up: compile the numba kernels
	@touch $@

$(PROTO_OUT) &: service/proto/nnhal.proto $(BIN)/nnhal
	$(BIN)/python -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. service/proto/nnhal.proto

EXAMPLE_EXTENSIONS := $(dir $(wildcard extensions/examples/*/pyproject.toml))

wheel: setup  ## Build dist/: the nnhal wheel (only the nnhal namespace + the nnhal, inference_diff commands) and the example extensions' wheels
	rm -rf build dist/nnhal-*.whl
	$(BIN)/pip wheel -q --no-deps --no-build-isolation -w dist . $(EXAMPLE_EXTENSIONS)

test: setup  ## Run the test suite (parallel on all cores)
	$(BIN)/pytest -n auto $(PYTEST_ARGS)

run: setup  ## Main job: example models through the delegate; inference_diff + benchmark vs TFLite CPU
	$(BIN)/nnhal demo

bench: setup  ## Benchmarks (RPC paths, cache, delegated models, float and quantized 224x224 models vs TFLite) -> bench/results.md
	$(BIN)/python -m bench.run_all

SOAK_SECONDS ?= 300

soak: setup  ## Soak (SOAK_SECONDS=300): 4 delegate clients while the service is killed, stopped, its cache read-only; outputs vs TFLite, RSS growth -> bench/results.md
	$(BIN)/python -m bench.soak --seconds $(SOAK_SECONDS)

FUZZ_CASES ?= 10000
FUZZ_SECONDS ?= 1200
FUZZ_SEED ?= 1

fuzz: setup  ## Fuzz (FUZZ_CASES=10000 FUZZ_SECONDS=1200): mutated models, requests and .tflite bytes vs real services -> bench/results.md
	$(BIN)/python -m tests.fuzz --cases $(FUZZ_CASES) --seconds $(FUZZ_SECONDS) --seed $(FUZZ_SEED)

lint: setup  ## ruff
	$(BIN)/ruff check hal service delegate extensions cache nnhal tests bench build_support setup.py

cts: setup  ## NNAPI CTS corpus (cts/), in-process then through a real service: a table per operation
	$(BIN)/nnhal cts
	$(BIN)/nnhal cts --service

ops: setup  ## Supported (operation, operand type) matrix
	$(BIN)/nnhal ops

clean:  ## Remove the venv and caches
	rm -rf $(VENV) $(LITERT_VENV) .pytest_cache .hypothesis build dist *.egg-info $(PROTO_OUT)
	find . -name __pycache__ -type d -prune -exec rm -rf {} +

LITERT_VENV := .venv-litert

test-litert: $(PROTO_OUT)  ## Delegate tests against ai-edge-litert 2.3 (numpy 2) in a second venv
	test -x $(LITERT_VENV)/bin/python || $(PY) -m venv $(LITERT_VENV)
	$(LITERT_VENV)/bin/pip install -q --upgrade pip
	$(LITERT_VENV)/bin/pip install -q ai-edge-litert==2.3.0 "numpy>=2" grpcio==1.85.1 grpcio-health-checking==1.85.1 \
		protobuf==7.36.2 flatbuffers==25.12.19 tflite==2.18.0 blake3==1.0.11 pytest==9.2.0 hypothesis==6.170.15
	$(LITERT_VENV)/bin/pip install -q --no-deps -e .
	PATH=$(CURDIR)/$(LITERT_VENV)/bin:$$PATH $(LITERT_VENV)/bin/pytest tests/delegate tests/test_tfl.py $(PYTEST_ARGS)
