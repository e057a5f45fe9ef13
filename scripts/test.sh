#!/usr/bin/env bash
# The test suite: sets up .venv if needed (scripts/setup.sh), then runs pytest. GPU tests run
# where a GPU is visible and are skipped elsewhere, each with its reason printed.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q -rs tests "$@"
