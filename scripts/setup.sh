#!/usr/bin/env bash
# Set up a development environment in ./.venv: system headers (libcurl), PyTorch (the CPU build on
# machines without a GPU), the CUDA wheels that carry NVRTC/CUPTI and their headers, the test
# tools (Ray too, for tests/test_cluster.py), and cudaforge itself in editable mode. Safe to run
# again.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "setup: cudaforge needs Python 3.11+ (its C core uses the 3.11 C API); $python is" \
    "$("$python" -V 2>&1); set PYTHON to a newer one" >&2
  exit 1
fi

if ! echo '#include <curl/curl.h>' | cc -E -x c - >/dev/null 2>&1; then
  echo "setup: installing libcurl's headers (apt-get install libcurl4-openssl-dev)"
  if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq libcurl4-openssl-dev >/dev/null
  else sudo apt-get update -qq && sudo apt-get install -y -qq libcurl4-openssl-dev >/dev/null; fi
fi
[ -x .venv/bin/python ] || "$python" -m venv .venv
pip() { .venv/bin/python -m pip "$@"; }
pip install -q --upgrade pip setuptools wheel
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1; then pip install -q torch
  else pip install -q torch==2.13.0; fi   # the CPU build
fi
pip install -q "nvidia-cuda-nvrtc==13.0.*" "nvidia-cuda-cupti==13.0.*" "nvidia-cuda-runtime==13.0.*" \
  numpy einops pytest nbclient nbformat ipykernel ray transformers
pip install -q --no-build-isolation -e .
echo "setup: done (.venv/bin/cudaforge doctor shows what this machine offers)"
