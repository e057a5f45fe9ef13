#!/usr/bin/env bash
# One device call on a GPU machine: build the package, run every test (GPU ones included), run the
# benchmarks, and leave the logs and results under $OUT (default ./gpu-out) as a few files.
#   usage: scripts/gpu_check.sh [quick|full]    (quick: build + tests only)
set -u
mode=${1:-full}
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT/work"
log="$OUT/gpu_check.log"
export PYTHONUNBUFFERED=1 CUDAFORGE_CACHE_DIR="$OUT/work/cache"
step() { echo "=== $* ($(date +%T))" | tee -a "$log"; }

step build
python3 -m pip install --no-build-isolation --no-deps -e . >>"$log" 2>&1 || { tail -40 "$log"; exit 1; }
step doctor
python3 -m cudaforge doctor 2>&1 | tee -a "$log"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv 2>&1 | tee -a "$log"
step tests
python3 -m pytest -q -rs -p no:cacheprovider tests/ --junitxml="$OUT/work/junit.xml" 2>&1 | tee -a "$log" | tail -40
if [ "$mode" = full ]; then
  for bench in benchmarks/*.py; do
    step "$bench"
    timeout 900 python3 -X faulthandler "$bench" --out "$OUT/work" 2>&1 | tee -a "$log" | tail -60
  done
fi
step done
tar -czf "$OUT/results.tar.gz" -C "$OUT/work" --exclude cache . 2>>"$log"
rm -rf "$OUT/work"
