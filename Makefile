# nnhal — `make help` lists the targets.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: help setup setup-tflite-runtime test test-tflite-runtime run bench bench-gpu lint clean ops cts soak fleet fuzz wheel

help:  ## Show this help
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-21s %s\n", $$1, $$2}'

PROTO_OUT := service/proto/nnhal_pb2.py service/proto/nnhal_pb2_grpc.py

setup: $(BIN)/nnhal $(PROTO_OUT)  ## Create .venv (LiteRT 2.3, numpy 2), install pinned deps (+ torch where a GPU is or NNHAL_CUDA=1), nnhal, MediaPipe + example extensions (editable), compile the numba kernels, byte-compile the sources, generate protobuf code

# Editable installs of nnhal and its extensions; setuptools' "Editable installation" notice once, not per project.
EDITABLE := --no-deps -e . -e extensions/mediapipe $(foreach d,$(wildcard extensions/examples/*/pyproject.toml),-e $(dir $(d)))
QUIET_EDITABLE := PYTHONWARNINGS="ignore:Editable installation"
#: The two venvs' editable installs write the same egg-info in the source tree: one at a time where
#: both are made at once (make -j2 setup setup-tflite-runtime, as CI does).
ONE_AT_A_TIME := $(if $(shell command -v flock),flock $(CURDIR)/.setup.lock,)

#: torch (the cuda backend, nnhal[cuda]) only where it runs: a GPU the NVIDIA driver shows, or NNHAL_CUDA=1
#: (CI: the cuda backend's lowering tested on torch's CPU device).
WANT_CUDA := $(if $(filter 1,$(NNHAL_CUDA)),1,$(if $(wildcard /proc/driver/nvidia/gpus/*),1,))

#: The project's modules compiled to bytecode (__pycache__, git-ignored), as pip does for what it installs:
#: nothing else writes it where $PYTHONDONTWRITEBYTECODE is set (as in this project's containers), and
#: then every Python process a run starts (services, tools, tests' subprocesses: hundreds per test run)
#: compiled the ~200 modules it imports from source, 0.6 s of CPU each on a 2-core AMD EPYC. Only
#: sources newer than their bytecode are compiled again: cheap before every test run.
SOURCES := hal service delegate cache nnhal extensions tests bench build_support
BYTECODE = $(1)/python -m compileall -q -j0 $(SOURCES) >/dev/null

$(BIN)/nnhal: pyproject.toml requirements.lock requirements-cuda.lock extensions/mediapipe/pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements.lock
	$(if $(WANT_CUDA),$(BIN)/pip install -q -r requirements-cuda.lock)
	$(QUIET_EDITABLE) $(ONE_AT_A_TIME) $(BIN)/pip install -q $(EDITABLE)
	$(BIN)/python -c "from hal import backends; backends.ensure_loaded()"  # compile the numba kernels for this machine, once
	$(call BYTECODE,$(BIN))
	@touch $@

$(PROTO_OUT) &: service/proto/nnhal.proto $(BIN)/nnhal
	$(BIN)/python -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. service/proto/nnhal.proto

EXTENSION_PROJECTS := extensions/mediapipe $(dir $(wildcard extensions/examples/*/pyproject.toml))

wheel: setup  ## Build dist/: the nnhal wheel (only the nnhal namespace + the nnhal, inference_diff commands), nnhal-mediapipe's and the example extensions' wheels
	rm -rf build dist/nnhal-*.whl dist/nnhal_*.whl
	$(BIN)/pip wheel -q --no-deps --no-build-isolation -w dist . $(EXTENSION_PROJECTS)

test: setup  ## Run the test suite (parallel on all cores)
	$(call BYTECODE,$(BIN))
	$(BIN)/pytest -n auto $(PYTEST_ARGS)

run: setup  ## Main job: example models through the delegate; inference_diff + benchmark vs TFLite CPU
	$(BIN)/nnhal demo

bench: setup setup-tflite-runtime  ## Benchmarks (RPC paths, cache, delegated models, float and quantized 224x224 models vs TFLite) -> bench/results.md
	$(BIN)/python -m bench.run_all

GPU_CHECK_ARGS ?=

bench-gpu:  ## The cuda backend's one GPU check (GPU_CHECK_ARGS=--quick: tiny models on torch's CPU device, < 1 min): environment, GPU tests, CTS float cases, float models vs LiteRT -> bench/results-gpu.md or $OUT/results-gpu.md
	scripts/gpu_check.sh $(GPU_CHECK_ARGS)

SOAK_SECONDS ?= 300

soak: setup  ## Soak (SOAK_SECONDS=300): 4 delegate clients while the service is killed, stopped, its cache read-only; outputs vs TFLite, RSS growth -> bench/results.md
	$(BIN)/python -m bench.soak --seconds $(SOAK_SECONDS)

FLEET_SECONDS ?= 120

fleet: setup  ## Fleet (FLEET_SECONDS=120): 3 replicas, 4 delegate clients on their list while replicas are killed and stopped in turn; throughput on 1-3 replicas -> bench/results.md
	$(BIN)/python -m bench.fleet --seconds $(FLEET_SECONDS)

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
	rm -rf $(VENV) $(TFLRT_VENV) .pytest_cache .hypothesis build dist *.egg-info $(PROTO_OUT)
	find . -name __pycache__ -type d -prune -exec rm -rf {} +

TFLRT_VENV := .venv-tflite-runtime
TFLRT_BIN  := $(TFLRT_VENV)/bin
#: What depends on the TFLite runtime: the delegate, the tools, the TFLite reader, the extensions' TFLite models.
TFLRT_TESTS ?= tests/delegate tests/tools tests/extensions tests/converted tests/test_tfl.py extensions/mediapipe/tests

setup-tflite-runtime: $(TFLRT_BIN)/nnhal $(PROTO_OUT)  ## Second venv .venv-tflite-runtime: tflite-runtime 2.14 (numpy 1.26; Python 3.11), requirements-tflite-runtime.lock

$(TFLRT_BIN)/nnhal: pyproject.toml requirements-tflite-runtime.lock extensions/mediapipe/pyproject.toml
	$(PY) -m venv $(TFLRT_VENV)
	$(TFLRT_BIN)/pip install -q --upgrade pip
	$(TFLRT_BIN)/pip install -q -r requirements-tflite-runtime.lock
	$(QUIET_EDITABLE) $(ONE_AT_A_TIME) $(TFLRT_BIN)/pip install -q $(EDITABLE)
	$(TFLRT_BIN)/python -c "from hal import backends; backends.ensure_loaded()"  # its numba's kernels, once
	$(call BYTECODE,$(TFLRT_BIN))
	@touch $@

test-tflite-runtime: setup-tflite-runtime  ## The runtime-dependent tests (TFLRT_TESTS, less those marked any_runtime) under tflite-runtime 2.14, in .venv-tflite-runtime
	$(call BYTECODE,$(TFLRT_BIN))
	PATH=$(CURDIR)/$(TFLRT_BIN):$$PATH $(TFLRT_BIN)/pytest -n auto -m "not wheel and not any_runtime" $(TFLRT_TESTS) $(PYTEST_ARGS)
