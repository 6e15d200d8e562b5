#!/usr/bin/env bash
# The one script to run on a lent GPU machine (Python 3.12, torch 2.11+cu130, no
# package index): check the preconditions, build from source, run the CUDA tests
# (then once more under compute-sanitizer memcheck), run every bench/bench_*.py
# with --device cuda. Results go under $OUT (default bench/results). Budget: under 8 minutes.
#
#   bash bench/gpu_check.sh                 # full
#   QUICK=1 bash bench/gpu_check.sh         # --quick benches
#   CHECK_ONLY=1 bash bench/gpu_check.sh    # the precondition check only (seconds)
#   PYTHON=/path/to/python bash bench/gpu_check.sh   # another interpreter than `python`
#
# Preconditions (the supported range, as setup.py enforces it): Python >= 3.11, torch >= 2.11 built with
# CUDA, Triton >= 3.6, setuptools >= 64 (>= 66.1 on Python 3.12), pytest, an nvcc of torch's CUDA major
# version (CUDA_HOME, PATH or /usr/local/cuda*/bin), a visible GPU. One line says what is missing, and the
# script exits (status 3) before spending any GPU time on a build that cannot succeed.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-$ROOT/bench/results}"
mkdir -p "$OUT"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$OUT/summary.txt"; }

# ------------------------------------------------------------------------------------------ preconditions
PYTHON="${PYTHON:-$(command -v python || command -v python3)}"
if [ -z "$PYTHON" ] || ! "$PYTHON" -c "" 2> /dev/null; then
  log "PRECONDITIONS NOT MET: no python on PATH (set PYTHON=/path/to/python)"; exit 3
fi
python() { "$PYTHON" "$@"; }   # (commands under timeout or compute-sanitizer name "$PYTHON" itself)
# nvcc: CUDA_HOME, then /usr/local/cuda, the newest /usr/local/cuda-*, then PATH (resolved: an nvcc on
# PATH may be a symlink outside its toolkit, and CUDA_HOME is derived from it below)
NVCC=""
for cand in "${CUDA_HOME:+$CUDA_HOME/bin/nvcc}" /usr/local/cuda/bin/nvcc \
            $(ls -d /usr/local/cuda-*/bin/nvcc 2>/dev/null | sort -V -r) \
            "$(readlink -f "$(command -v nvcc 2>/dev/null)" 2>/dev/null)"; do
  if [ -n "$cand" ] && [ -x "$cand" ] && [ -f "$cand" ]; then NVCC="$cand"; break; fi
done
NVCC_VERSION=""
[ -n "$NVCC" ] && NVCC_VERSION="$("$NVCC" --version 2>/dev/null | sed -n 's/.*release \([0-9][0-9.]*\).*/\1/p' | head -1)"
GPU_NAME="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
PRECHECK="$(NVCC="$NVCC" NVCC_VERSION="$NVCC_VERSION" GPU_NAME="$GPU_NAME" python - <<'PY'
import importlib.metadata as md, os, re, sys

def release(v):
    m = re.match(r"\d+(\.\d+)*", v or "")
    return tuple(int(p) for p in m.group(0).split(".")) if m else ()

def dist(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None

missing, have = [], []
py = sys.version.split()[0]
(missing if sys.version_info < (3, 11) else have).append(f"python {py}" + (" (need >= 3.11)" if sys.version_info < (3, 11) else ""))
min_st = (66, 1) if sys.version_info >= (3, 12) else (64,)
st = dist("setuptools")
if st is None or release(st) < min_st:
    missing.append(f"setuptools >= {'.'.join(map(str, min_st))} (found {st or 'none'}; pip install -U setuptools)")
else:
    have.append(f"setuptools {st}")
torch_cuda = None
try:
    import torch
    if release(torch.__version__) < (2, 11):
        missing.append(f"torch >= 2.11 (found {torch.__version__})")
    elif torch.version.cuda is None:
        missing.append(f"a CUDA build of torch (found {torch.__version__}, a CPU build)")
    else:
        torch_cuda = torch.version.cuda
        have.append(f"torch {torch.__version__} (CUDA {torch_cuda})")
    gpu_ok = torch.cuda.is_available()
except Exception as exc:
    missing.append(f"torch >= 2.11 ({type(exc).__name__}: {exc})".replace("\n", " "))
    gpu_ok = False
tr = dist("triton")
if tr is None or release(tr) < (3, 6):
    missing.append(f"triton >= 3.6 (found {tr or 'none'})")
else:
    have.append(f"triton {tr}")
if dist("pytest") is None:
    missing.append("pytest (the CUDA tests need it)")
nvcc, nvcc_v = os.environ["NVCC"], os.environ["NVCC_VERSION"]
if not nvcc:
    missing.append("nvcc (none in CUDA_HOME, PATH or /usr/local/cuda*/bin: the CUDA kernels cannot be built)")
elif torch_cuda and nvcc_v.split(".")[0] != torch_cuda.split(".")[0]:
    missing.append(f"an nvcc for CUDA {torch_cuda.split('.')[0]}.x ({nvcc} is CUDA {nvcc_v or '?'})")
else:
    have.append(f"nvcc {nvcc_v} ({nvcc})")
gpu = os.environ["GPU_NAME"]
if not gpu_ok:
    missing.append(f"a visible GPU (nvidia-smi: {gpu or 'none'}; torch.cuda.is_available() is False)")
else:
    have.append(f"GPU {gpu or '?'}")
if missing:
    print("PRECONDITIONS NOT MET: missing " + "; ".join(missing) + " | found: " + ", ".join(have))
    sys.exit(1)
print("preconditions ok: " + ", ".join(have))
PY
)"
PRECHECK_RC=$?
log "$PRECHECK"
[ $PRECHECK_RC -eq 0 ] || exit 3
# the build uses the nvcc found above (setup.py would otherwise look in /usr/local/cuda only)
export CUDA_HOME="${CUDA_HOME:-$(dirname "$(dirname "$NVCC")")}"
if ! python -c "import ninja" 2> /dev/null && ! command -v ninja > /dev/null; then
  log "note: ninja not installed: the build compiles one file at a time"
fi
[ -n "${CHECK_ONLY:-}" ] && exit 0

log "device: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null)"
log "python $(python --version 2>&1), torch $(python -c 'import torch; print(torch.__version__)')"

log "build (TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST)"
if ! MAX_JOBS="${MAX_JOBS:-16}" timeout 300 "$PYTHON" setup.py build_ext --inplace > "$OUT/build.log" 2>&1; then
  log "BUILD FAILED (tail of build.log follows)"; tail -30 "$OUT/build.log" | tee -a "$OUT/summary.txt"; exit 1
fi
python -c "from specdec_ops import _ops; assert _ops.cuda_kernels_built(); print('CUDA kernels built')" \
  2>&1 | tee -a "$OUT/summary.txt"

if python -c "import pytest" 2>/dev/null; then
  log "CUDA tests"
  timeout 240 "$PYTHON" -m pytest -q -p no:cacheprovider -m cuda tests > "$OUT/cuda_tests.log" 2>&1
  log "pytest -m cuda exit $?: $(tail -1 "$OUT/cuda_tests.log")"
  SANITIZER="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)"
  if [ -n "$SANITIZER" ]; then
    log "CUDA tests under compute-sanitizer memcheck (graph tests excluded)"
    timeout 200 "$SANITIZER" --tool memcheck --error-exitcode 9 "$PYTHON" -m pytest -q -p no:cacheprovider -m cuda \
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
  timeout "${BENCH_TIMEOUT:-150}" "$PYTHON" "$bench" --device cuda ${QUICK:+--quick} --json "$OUT/$name.json" \
    > "$OUT/$name.log" 2>&1
  log "$name exit $?"
  tail -40 "$OUT/$name.log" >> "$OUT/summary.txt"
done
log "roofline: predicted next to measured"
timeout "${ROOFLINE_TIMEOUT:-240}" python bench/roofline.py --measure --json "$OUT/roofline.json" \
  > "$OUT/roofline.log" 2>&1
log "roofline exit $?"
cat "$OUT/roofline.log" >> "$OUT/summary.txt"   # the whole table (one row per kernel and shape)
log "done"
