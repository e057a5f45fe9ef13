#!/usr/bin/env bash
# One device call on a GPU machine: build the package, run the tests (GPU ones included), the
# main job (`cudaforge demo`) and the benchmarks, and leave the logs and results under $OUT
# (default ./gpu-out) as a few files.
#   scripts/gpu_check.sh                  everything
#   TESTS="tests/test_x.py" BENCHES="benchmarks/y.py --flag" scripts/gpu_check.sh   a subset
#   TESTS=none DEMO=0 BENCHES=none        skip a part
# BENCHES holds benchmark commands (script and arguments) separated by ';'; each gets --out.
set -u
OUT=${OUT:-$PWD/gpu-out}
TESTS=${TESTS:-tests/}
DEMO=${DEMO:-1}
BENCHES=${BENCHES:-benchmarks/compile_and_launch.py;benchmarks/evaluate.py --ncu --paper-jobs 7;benchmarks/profile_vs_ncu.py --paper-ncu --diagnose}
mkdir -p "$OUT/work"
log="$OUT/gpu_check.log"
export PYTHONUNBUFFERED=1 CUDAFORGE_CACHE_DIR="$OUT/work/cache"
step() { echo "=== $* ($(date +%T))" | tee -a "$log"; }

step build
python3 -m pip install --no-build-isolation --no-deps -e . >>"$log" 2>&1 || { tail -40 "$log"; exit 1; }
step doctor
python3 -m cudaforge doctor 2>&1 | tee -a "$log"
if [ "$TESTS" != none ]; then
  step "tests: $TESTS"
  # shellcheck disable=SC2086
  timeout "${TEST_TIMEOUT:-420}" python3 -m pytest -q -rs -p no:cacheprovider $TESTS \
    --junitxml="$OUT/work/junit.xml" 2>&1 | tee -a "$log" \
    | grep -E "passed|failed|error|FAILED|ERROR|SKIPPED|Timeout" | tail -40
fi
if [ "$DEMO" = 1 ]; then
  step "cudaforge demo"
  timeout 300 python3 -m cudaforge demo --out "$OUT/work/demo" 2>&1 | tee -a "$log" | tail -25
fi
if [ "$BENCHES" != none ]; then
  IFS=';' read -ra benches <<<"$BENCHES"
  for bench in "${benches[@]}"; do
    step "$bench"
    # shellcheck disable=SC2086
    timeout "${BENCH_TIMEOUT:-900}" python3 -X faulthandler $bench --out "$OUT/work" 2>&1 \
      | tee -a "$log" | tail -40
  done
fi
step done
tar -czf "$OUT/results.tar.gz" -C "$OUT/work" --exclude cache . 2>>"$log"
rm -rf "$OUT/work"
