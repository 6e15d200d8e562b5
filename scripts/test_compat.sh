#!/usr/bin/env bash
# Compatibility run: the package built and tested at the ends of its supported range, each combination in
# a fresh venv with a fresh copy of this checkout (under build/compat/, which git ignores):
#   oldest  Python 3.12, torch 2.11.0 (CUDA build), Triton 3.6.0, setuptools 66.1.0: the lent GPU machine's
#           Python, torch and Triton, and the oldest setuptools that imports on Python 3.12
#   newest  Python 3.11, torch 2.15.0 (CUDA build), Triton 3.9.0, the newest setuptools
#   floor   Python 3.11, setuptools 64.0.0 (the declared minimum there), torch 2.13.0 CPU: the metadata and
#           build-precondition tests (tests/test_build.py) only
# For oldest and newest: `pip install --no-build-isolation -e .` (the README's command) compiling the CUDA
# kernels for sm_90 (the GPU machine's H200) when nvcc is here and the combination is in $SPECDEC_COMPAT_CUDA
# (default both; CI: oldest, the GPU machine's torch), then the CPU and Triton-interpreter tests
# of $SPECDEC_COMPAT_TESTS. CUDA torch wheels come from the package index (about 3 GB with their nvidia-*
# packages per combination, 1 to 5 minutes), so /etc/xdg/pip's cap on torch is lifted here. pip's own cache
# keeps nothing on this machine, so every wheel is first `pip download`ed into a wheelhouse,
# $SPECDEC_WHEELHOUSE (default ~/.cache/specdec_ops/wheels; files already there are not fetched again),
# and installed from it.
#
#   bash scripts/test_compat.sh            # prepare (venvs, installs) and run (build, tests) every combination
#   bash scripts/test_compat.sh prepare    # only the venvs and installs (CI runs this in the background)
#   bash scripts/test_compat.sh run        # build and test in the venvs that prepare made
#   SPECDEC_COMPAT=oldest bash scripts/test_compat.sh   # some combinations only (space-separated names; empty: none)
#
# A failed install or build always fails the run. A failing test fails it only with SPECDEC_COMPAT_STRICT=1
# (default 0: the failures are listed, and saved in build/compat/<name>/failed.txt).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
STRICT="${SPECDEC_COMPAT_STRICT:-0}"
DIR="${SPECDEC_COMPAT_DIR:-$ROOT/build/compat}"
TESTS="${SPECDEC_COMPAT_TESTS:-tests/test_build.py tests/test_rejection.py tests/test_tree_rejection.py tests/test_tree_attention.py tests/test_kv_commit.py tests/test_tree_mask.py tests/test_logits.py tests/test_triton_versions.py tests/test_triton_layout.py}"
ARCHS="${SPECDEC_COMPAT_ARCHS:-9.0}"
# The combinations that compile the CUDA kernels (space-separated; empty: none). The .cu files include no torch
# headers, so what a CUDA build adds per torch version is the op files' CUDA glue (c10/cuda, ATen/cuda headers).
CUDA_COMBOS="${SPECDEC_COMPAT_CUDA-oldest newest}"
# name python torch triton setuptools ("newest": whatever the index has that torch accepts)
COMBOS=(
  "oldest 3.12 2.11.0 3.6.0 66.1.0"
  "newest 3.11 2.15.0 3.9.0 newest"
)
FLOOR="floor 3.11 2.13.0 - 64.0.0"
SELECTED="${SPECDEC_COMPAT-oldest newest floor}"   # set and empty: none
TEST_DEPS=(numpy scipy pytest expecttest ninja)
WHEELS="${SPECDEC_WHEELHOUSE:-$HOME/.cache/specdec_ops/wheels}"
export PIP_CONSTRAINT=/dev/null   # lift /etc/xdg/pip's torch<=2.14.1 cap for these venvs
export PIP_DISABLE_PIP_VERSION_CHECK=1
unset VIRTUAL_ENV PYTHONPATH

say() { echo "[compat $(date +%H:%M:%S)] $*"; }

find_python() {  # find_python 3.12 -> a python3.12 executable (PATH first, then pyenv), else nothing
  local v="$1" p last=""
  # (a pyenv shim on PATH may exist and still refuse to run: try each candidate)
  p="$(command -v "python$v" 2>/dev/null)" && "$p" -c "" 2> /dev/null && { echo "$p"; return; }
  for p in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$v".*/bin/python"$v"; do
    [ -x "$p" ] && "$p" -c "" 2> /dev/null && last="$p"
  done
  [ -n "$last" ] && echo "$last"
}

selected() { [[ " $SELECTED " == *" $1 "* ]]; }

prepare_one() {  # prepare_one name python torch triton setuptools
  local name="$1" pyv="$2" torch="$3" triton="$4" st="$5" py venv="$DIR/$1/venv"
  py="$(find_python "$pyv")"
  if [ -z "$py" ]; then
    say "$name: no Python $pyv here; using python3.11 instead"; py="$(find_python 3.11)"
  fi
  rm -rf "${DIR:?}/$name"; mkdir -p "$DIR/$name"
  "$py" -m venv "$venv" || return 1
  local st_spec="setuptools==$st"; [ "$st" = newest ] && st_spec="setuptools"
  local pkgs=("$st_spec" wheel "torch==$torch" "${TEST_DEPS[@]}")
  [ "$triton" != "-" ] && pkgs+=("triton==$triton")
  mkdir -p "$WHEELS"
  fetch() {  # fetch [pip install options] packages: download into the wheelhouse, install from it
    "$venv/bin/pip" download -q -d "$WHEELS" "$@" && \
      "$venv/bin/pip" install -q --upgrade --no-index --find-links "$WHEELS" "$@"
  }
  if [ "$name" = floor ]; then
    # torch 2.13 asks for setuptools >= 77; installed without its dependencies to keep the floor setuptools.
    fetch "$st_spec" pytest filelock typing-extensions sympy networkx jinja2 fsspec numpy || return 1
    fetch --no-deps "torch==$torch" || return 1
  else
    fetch "${pkgs[@]}" || return 1
  fi
  # The sources as this checkout has them (tracked and untracked, not ignored: no build outputs).
  mkdir -p "$DIR/$name/src"
  if git -C "$ROOT" rev-parse --git-dir > /dev/null 2>&1; then
    git -C "$ROOT" ls-files -z --cached --others --exclude-standard \
      | tar -C "$ROOT" --null --ignore-failed-read -T - -cf - 2> /dev/null | tar -C "$DIR/$name/src" -xf -
  else
    cp -r "$ROOT"/{setup.py,pyproject.toml,README.md,LICENSE,CMakeLists.txt,csrc,specdec_ops,triton_kernels,tests} \
      "$DIR/$name/src/"
  fi
  echo "$py" > "$DIR/$name/python"
}

prepare() {
  local pids=() names=() spec name rc=0 i
  for spec in "${COMBOS[@]}" "$FLOOR"; do
    read -r name _ <<< "$spec"
    selected "$name" || continue
    say "$name: preparing (log: $DIR/$name.prepare.log)"
    mkdir -p "$DIR"
    # shellcheck disable=SC2086
    prepare_one $spec > "$DIR/$name.prepare.log" 2>&1 &
    pids+=($!); names+=("$name")
  done
  for i in "${!pids[@]}"; do
    if wait "${pids[$i]}"; then
      say "${names[$i]}: prepared"
    else
      say "${names[$i]}: PREPARE FAILED (tail of $DIR/${names[$i]}.prepare.log follows)"
      grep -v "is ignored" "$DIR/${names[$i]}.prepare.log" | tail -15; rc=1
    fi
  done
  return $rc
}

newer_on_index() {  # newer_on_index venv package tested-version: a note when the index has a newer release
  local latest
  latest="$(timeout 60 "$1/bin/pip" index versions "$2" 2>/dev/null | sed -n 's/^[^ ]* (\(.*\))$/\1/p' | head -1)"
  if [ -n "$latest" ] && [ "$latest" != "$3" ]; then
    say "note: $2 $latest is on the index, newer than the $3 tested as newest (update COMBOS in $0)"
  fi
}

run_one() {  # run_one name python torch triton setuptools; returns 1 when the build fails, 2 when tests fail
  local name="$1" torch="$3" triton="$4" work="$DIR/$1" venv="$DIR/$1/venv"
  [ -x "$venv/bin/python" ] && [ -d "$work/src" ] || { say "$name: not prepared (run prepare first)"; return 1; }
  local py="$venv/bin/python" versions
  versions="$("$py" - <<'PY'
import importlib.metadata as m, sys
def v(name):
    try:
        return m.version(name)
    except m.PackageNotFoundError:
        return "-"
print(f"python {sys.version.split()[0]}, torch {v('torch')}, triton {v('triton')}, setuptools {v('setuptools')}, "
      f"numpy {v('numpy')}")
PY
)"
  say "$name: $versions"
  [ "$name" = newest ] && { newer_on_index "$venv" torch "$torch"; newer_on_index "$venv" triton "$triton"; }
  cd "$work/src" || return 1
  if [ "$name" = floor ]; then
    # Metadata, license and the build's own precondition checks under the oldest setuptools.
    "$py" -m pytest -q -p no:cacheprovider -rf tests/test_build.py > "$work/pytest.log" 2>&1
    local rc=$?
    say "$name: pytest tests/test_build.py: $(tail -1 "$work/pytest.log" | tr -d '=' | sed 's/^ *//')"
    cd "$ROOT"; [ $rc -eq 0 ] || { grep -E "^(FAILED|ERROR)" "$work/pytest.log"; return 2; }
    return 0
  fi
  local cuda=0
  if [ "${SPECDEC_NO_CUDA:-0}" = "0" ] && [[ " $CUDA_COMBOS " == *" $name "* ]] && [ -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ] \
     && "$py" -c "import torch, sys; sys.exit(0 if torch.version.cuda else 1)"; then cuda=1; fi
  say "$name: pip install --no-build-isolation -e . ($([ $cuda = 1 ] && echo "CUDA kernels for sm_${ARCHS/./}, " )log: $work/build.log)"
  local t0=$SECONDS nvcc_env=() reused=""
  # CI (.ci/run): the build's nvcc is $SPECDEC_COMPAT_NVCC, ptxas's cache (scripts/nvcc_cache.py). A .cu file
  # identical, with all it includes, here and in $SPECDEC_NVCC_CACHE_ORIGINAL (the checkout the main build
  # compiled) is compiled as the original's: its PTX then matches the main build's byte for byte, and the main
  # build's cubin is reused instead of running ptxas on it again.
  if [ $cuda = 1 ] && [ -n "${SPECDEC_COMPAT_NVCC:-}" ]; then
    nvcc_env=(PYTORCH_NVCC="$SPECDEC_COMPAT_NVCC" SPECDEC_NVCC_CACHE_LOG="$work/nvcc-cache.log")
    [ -n "${SPECDEC_NVCC_CACHE_ORIGINAL:-}" ] && nvcc_env+=(SPECDEC_NVCC_CACHE_REDIRECT="$work/src=$SPECDEC_NVCC_CACHE_ORIGINAL")
    rm -f "$work/nvcc-cache.log"
  fi
  if ! env "${nvcc_env[@]}" SPECDEC_NO_CUDA=$((1 - cuda)) TORCH_CUDA_ARCH_LIST="$ARCHS" MAX_JOBS="${MAX_JOBS:-2}" \
       "$venv/bin/pip" install --no-build-isolation -e . > "$work/build.log" 2>&1; then
    say "$name: BUILD FAILED (tail of $work/build.log follows)"; grep -v "is ignored" "$work/build.log" | tail -25
    cd "$ROOT"; return 1
  fi
  if ! "$py" -c "import sys; from specdec_ops import _ops; sys.exit(0 if _ops.cuda_kernels_built() == bool($cuda) else 1)"; then
    say "$name: BUILD WRONG: CUDA kernels built != $cuda"; cd "$ROOT"; return 1
  fi
  if [ ${#nvcc_env[@]} -gt 0 ]; then
    local hits runs
    hits=$(cat "$work/nvcc-cache.log" 2> /dev/null | grep -c "^\[nvcc-cache [0-9:]*\] ptxas .*: HIT ")
    runs=$(cat "$work/nvcc-cache.log" 2> /dev/null | grep -c "^\[nvcc-cache [0-9:]*\] ptxas .*: \(HIT\|MISS\) ")
    reused=" ($hits of $runs cubins reused from the main build's, ptxas not run: $work/nvcc-cache.log)"
  fi
  say "$name: built in $((SECONDS - t0)) s$reused"
  t0=$SECONDS
  # shellcheck disable=SC2086
  TRITON_INTERPRET=1 "$py" -m pytest -q -p no:cacheprovider -m "not slow and not cuda" -rfE $TESTS \
    > "$work/pytest.log" 2>&1
  local rc=$?
  grep -E "^(FAILED|ERROR) " "$work/pytest.log" | sed -E 's/ - .*//' > "$work/failed.txt"
  say "$name: pytest ($((SECONDS - t0)) s): $(tail -1 "$work/pytest.log" | tr -d '=' | sed 's/^ *//')"
  cd "$ROOT"
  if [ $rc -ne 0 ]; then
    say "$name: failing tests by test function (all ids in $work/failed.txt):"
    sed -E 's/^(FAILED|ERROR) //; s/\[.*//' "$work/failed.txt" | sort | uniq -c | sed 's/^/    /'
    say "$name: distinct errors:"
    grep -E "^E +[A-Za-z_.]*(Error|Exception)\b" "$work/pytest.log" | sed -E 's/^E +//' | sort | uniq -c | sort -rn \
      | head -5 | cut -c1-220 | sed 's/^/    /'
    return 2
  fi
}

run() {
  # The combinations run side by side (the Triton interpreter is single-threaded Python: two runs share the cores
  # well), each into its own log, printed whole and in order once all are done.
  local spec name rc worst=0 pids=() names=() i
  for spec in "${COMBOS[@]}" "$FLOOR"; do
    read -r name _ <<< "$spec"
    selected "$name" || continue
    mkdir -p "$DIR/$name"
    # shellcheck disable=SC2086
    ( run_one $spec; rc=$?; echo "$rc" > "$DIR/$name/status"; exit $rc ) > "$DIR/$name.run.log" 2>&1 &
    pids+=($!); names+=("$name")
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}"; rc=$?
    cat "$DIR/${names[$i]}.run.log"
    [ $rc -eq 1 ] && worst=1
    [ $rc -eq 2 ] && [ $worst -eq 0 ] && worst=2
  done
  if [ $worst -eq 1 ]; then say "FAILED: an install or build failed"; return 1; fi
  if [ $worst -eq 2 ]; then
    if [ "$STRICT" = "1" ]; then say "FAILED: compat tests failed (SPECDEC_COMPAT_STRICT=1)"; return 1; fi
    say "compat tests failed (listed above); not failing the run: SPECDEC_COMPAT_STRICT=1 makes them fatal"
  fi
  return 0
}

t_start=$SECONDS
case "${1:-all}" in
  prepare) prepare ;;
  run) run ;;
  all) prepare && run ;;
  *) echo "usage: $0 [prepare|run|all]" >&2; exit 2 ;;
esac
rc=$?
say "done in $((SECONDS - t_start)) s (exit $rc)"
exit $rc
