#!/usr/bin/env bash
# One device call on a GPU machine: build the package, run the tests (GPU ones included), run the
# benchmarks, and leave the logs and results under $OUT (default ./gpu-out) as a few files.
#   scripts/gpu_check.sh                 everything: tests/ and benchmarks/*.py
#   TESTS="tests/test_x.py" BENCHES="benchmarks/y.py" scripts/gpu_check.sh    a subset
#   BENCHES=none scripts/gpu_check.sh    tests only
set -u
OUT=${OUT:-$PWD/gpu-out}
TESTS=${TESTS:-tests/}
BENCHES=${BENCHES:-$(ls benchmarks/*.py)}
mkdir -p "$OUT/work"
log="$OUT/gpu_check.log"
export PYTHONUNBUFFERED=1 CUDAFORGE_CACHE_DIR="$OUT/work/cache"
step() { echo "=== $* ($(date +%T))" | tee -a "$log"; }

step build
python3 -m pip install --no-build-isolation --no-deps -e . >>"$log" 2>&1 || { tail -40 "$log"; exit 1; }
step doctor
python3 -m cudaforge doctor 2>&1 | tee -a "$log"
step "tests: $TESTS"
# shellcheck disable=SC2086
python3 -m pytest -q -rs -p no:cacheprovider $TESTS --junitxml="$OUT/work/junit.xml" 2>&1 \
  | tee -a "$log" | grep -E "passed|failed|error|FAILED|ERROR|SKIPPED" | tail -40
if [ "$BENCHES" != none ]; then
  for bench in $BENCHES; do
    step "$bench"
    timeout 900 python3 -X faulthandler "$bench" --out "$OUT/work" 2>&1 | tee -a "$log" | tail -40
  done
fi
step done
tar -czf "$OUT/results.tar.gz" -C "$OUT/work" --exclude cache . 2>>"$log"
rm -rf "$OUT/work"
