#!/usr/bin/env bash
# The one script to run on a lent GPU machine (Python 3.12, torch 2.11+cu130, no
# package index): build from source, run the CUDA tests (then once more under
# compute-sanitizer memcheck), run every bench/bench_*.py with --device cuda.
# Results go under $OUT (default bench/results). Budget: under 8 minutes.
#
#   bash bench/gpu_check.sh            # full
#   QUICK=1 bash bench/gpu_check.sh    # --quick benches
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-$ROOT/bench/results}"
mkdir -p "$OUT"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$OUT/summary.txt"; }

log "device: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null)"
log "python $(python --version 2>&1), torch $(python -c 'import torch; print(torch.__version__)')"

log "build (TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST)"
if ! MAX_JOBS="${MAX_JOBS:-16}" timeout 300 python setup.py build_ext --inplace > "$OUT/build.log" 2>&1; then
  log "BUILD FAILED (tail of build.log follows)"; tail -30 "$OUT/build.log" | tee -a "$OUT/summary.txt"; exit 1
fi
python -c "from specdec_ops import _ops; assert _ops.cuda_kernels_built(); print('CUDA kernels built')" \
  2>&1 | tee -a "$OUT/summary.txt"

if python -c "import pytest" 2>/dev/null; then
  log "CUDA tests"
  timeout 240 python -m pytest -q -p no:cacheprovider -m cuda tests > "$OUT/cuda_tests.log" 2>&1
  log "pytest -m cuda exit $?: $(tail -1 "$OUT/cuda_tests.log")"
  SANITIZER="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)"
  if [ -n "$SANITIZER" ]; then
    log "CUDA tests under compute-sanitizer memcheck (graph tests excluded)"
    timeout 200 "$SANITIZER" --tool memcheck --error-exitcode 9 python -m pytest -q -p no:cacheprovider -m cuda \
      -k "not graph" -x tests > "$OUT/memcheck.log" 2>&1
    log "memcheck exit $?: $(grep -E 'ERROR SUMMARY|passed|failed' "$OUT/memcheck.log" | tail -2 | tr '\n' ' ')"
  else
    log "compute-sanitizer not found: memcheck skipped"
  fi
else
  log "pytest not installed: CUDA tests skipped"
fi

for bench in bench/bench_*.py; do
  name="$(basename "$bench" .py)"
  [ "$name" = "bench_e2e" ] && [ -z "${WITH_E2E:-}" ] && continue
  log "$name"
  timeout "${BENCH_TIMEOUT:-150}" python "$bench" --device cuda ${QUICK:+--quick} --json "$OUT/$name.json" \
    > "$OUT/$name.log" 2>&1
  log "$name exit $?"
  tail -40 "$OUT/$name.log" >> "$OUT/summary.txt"
done
log "roofline: predicted next to measured"
timeout "${ROOFLINE_TIMEOUT:-240}" python bench/roofline.py --measure --json "$OUT/roofline.json" \
  > "$OUT/roofline.log" 2>&1
log "roofline exit $?"
head -20 "$OUT/roofline.log" >> "$OUT/summary.txt"
log "done"
