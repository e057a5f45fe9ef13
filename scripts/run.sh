#!/usr/bin/env bash
# The main job on a fresh machine: set up ./.venv (scripts/setup.sh), then `cudaforge demo`:
# on a GPU, the shipped kernels are proven against PyTorch, timed and profiled; without one, they
# are compiled for sm_90. With $CUDAFORGE_LLM (e.g. openai:o3) and its key set, the agents also
# forge one problem. Arguments go to `cudaforge demo` (e.g. --out DIR, --llm MODEL).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/cudaforge demo "$@"
