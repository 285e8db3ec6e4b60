#!/usr/bin/env bash
# The GPU session's one command (bench/gpu_check.py says what it checks and where the results go).
#   scripts/gpu_check.sh --download   here, once: the wheels the GPU machine lacks, into .whl/ (ignored by git;
#                                     the device tool's `carry` takes it there)
#   scripts/gpu_check.sh [ARGS]       there (or here): install .whl/ into /tmp/site when the interpreter lacks
#                                     them, generate the protobuf code, run python -m bench.gpu_check ARGS
# PYTHON: the interpreter (default .venv/bin/python where it exists, else python3: the GPU machine's).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
# The recipe's wheels (shared/gpu/README.md: the delegate with LiteRT, the service) and pytest's for the GPU tests.
WHEELS=(ai-edge-litert==2.3.0 flatbuffers==25.12.19 blake3==1.0.11 grpcio-health-checking==1.85.1 tflite==2.18.0
        grpcio-tools==1.85.1 grpcio==1.85.1 protobuf==7.36.2 tqdm==4.70.1 threadpoolctl==3.6.0
        pytest==9.2.0 pluggy==1.7.0 iniconfig==2.3.1 packaging==26.4 pygments==2.21.0
        hypothesis==6.170.15 sortedcontainers==2.4.0)
if [ "${1:-}" = --download ]; then
  P=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
     --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
  for w in "${WHEELS[@]}"; do
    "$PYTHON" -m pip download -q --no-deps "${P[@]}" -d .whl "$w"
  done
  du -sh .whl
  exit 0
fi
SITE=/tmp/site
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
NEEDED="import grpc_tools, google.protobuf, flatbuffers, blake3, tflite, tqdm, pytest, hypothesis, grpc_health
try:
    import ai_edge_litert
except ImportError:
    import tflite_runtime"
if ! "$PYTHON" -c "$NEEDED" 2>/dev/null; then
  ls .whl/*.whl >/dev/null 2>&1 || { echo "gpu_check.sh: modules missing and no .whl/ (scripts/gpu_check.sh --download)" >&2; exit 2; }
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl
fi
"$PYTHON" -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. service/proto/nnhal.proto
exec "$PYTHON" -m bench.gpu_check "$@"
