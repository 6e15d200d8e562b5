#!/usr/bin/env bash
# vLLM's own rejection-sampler tests with specdec_ops installed as vLLM's sampler, on a CPU machine.
#
#   bash scripts/test_vllm.sh [prepare|run|all]      (default: all)
#
# prepare: a venv with vllm==$SPECDEC_VLLM_VERSION (it pins its own torch; about 10 GB and 3 to 7 minutes
#          the first time), this checkout built (CPU kernels) and installed into it, and vLLM's test file
#          taken from vLLM's source distribution (kept in $SPECDEC_WHEELHOUSE, fetched once).
# run:     vLLM's tests/v1/sample/test_rejection_sampler.py with DEVICE_TYPE switched to "cpu" and the
#          adapter installed by scripts/vllm/conftest.py (which also routes two CUDA-only helpers upstream
#          of the sampler to vLLM's PyTorch versions), then tests/test_vllm_adapter.py (our comparison of
#          vLLM's sampler and ours on shared inputs). SPECDEC_VLLM_ADAPTER=0 runs vLLM's tests against
#          vLLM's own sampler instead (the baseline).
# The venv lives in $SPECDEC_VLLM_DIR (default build/vllm); SPECDEC_FRESH=1 recreates it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VERSION="${SPECDEC_VLLM_VERSION:-0.33.0}"
DIR="${SPECDEC_VLLM_DIR:-$ROOT/build/vllm}"
VENV="$DIR/venv"
WHEELS="${SPECDEC_WHEELHOUSE:-$HOME/.cache/specdec_ops/wheels}"
SDIST="$WHEELS/vllm-$VERSION.tar.gz"
export PIP_DISABLE_PIP_VERSION_CHECK=1
unset VIRTUAL_ENV PYTHONPATH

say() { echo "[vllm $(date +%H:%M:%S)] $*"; }

prepare() {
  local t0=$SECONDS py
  py="$(command -v python3.11 || command -v python3)"
  if [ "${SPECDEC_FRESH:-0}" = 1 ] || [ ! -x "$VENV/bin/python" ] \
     || ! "$VENV/bin/python" -c "import vllm, sys; sys.exit(vllm.__version__ != '$VERSION')" 2> /dev/null; then
    rm -rf "$VENV"; mkdir -p "$DIR"
    say "venv: $py, vllm==$VERSION"
    "$py" -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip setuptools wheel
    "$VENV/bin/pip" install -q "vllm==$VERSION" pytest scipy ninja setuptools-rust setuptools-scm
  fi
  say "vllm $("$VENV/bin/python" -c 'import vllm; print(vllm.__version__)'), torch $("$VENV/bin/python" -c 'import torch; print(torch.__version__)')"

  # This checkout's sources (tracked and untracked, not ignored), built and installed (CPU kernels).
  rm -rf "$DIR/src"; mkdir -p "$DIR/src"
  if git -C "$ROOT" rev-parse --git-dir > /dev/null 2>&1; then
    git -C "$ROOT" ls-files -z --cached --others --exclude-standard \
      | tar -C "$ROOT" --null --ignore-failed-read -T - -cf - 2> /dev/null | tar -C "$DIR/src" -xf -
  else
    cp -r "$ROOT"/{setup.py,pyproject.toml,README.md,LICENSE,CMakeLists.txt,csrc,specdec_ops,triton_kernels,tests,scripts} \
      "$DIR/src/"
  fi
  say "building specdec_ops (CPU kernels) into the venv"
  (cd "$DIR/src" && SPECDEC_NO_CUDA=1 MAX_JOBS="${MAX_JOBS:-2}" \
     "$VENV/bin/pip" install -q --no-build-isolation --no-deps .) > "$DIR/build.log" 2>&1 \
    || { tail -30 "$DIR/build.log"; say "BUILD FAILED"; return 1; }

  # vLLM's tests ship in its source distribution only.
  if [ ! -s "$SDIST" ]; then
    mkdir -p "$WHEELS"
    say "fetching vLLM's source distribution (for its tests)"
    "$VENV/bin/pip" download -q --no-build-isolation --no-binary :all: --no-deps -d "$WHEELS" "vllm==$VERSION"
  fi
  rm -rf "$DIR/t"; mkdir -p "$DIR/t"
  tar -C "$DIR/t" --strip-components=1 -xzf "$SDIST" \
    "vllm-$VERSION/tests/__init__.py" "vllm-$VERSION/tests/v1/__init__.py" \
    "vllm-$VERSION/tests/v1/sample/__init__.py" "vllm-$VERSION/tests/v1/sample/utils.py" \
    "vllm-$VERSION/tests/v1/sample/test_rejection_sampler.py"
  local f="$DIR/t/tests/v1/sample/test_rejection_sampler.py"
  grep -q '^DEVICE_TYPE = current_platform.device_type$' "$f" \
    || { say "vLLM's test file has no 'DEVICE_TYPE = current_platform.device_type' line to switch to CPU"; return 1; }
  sed -i 's/^DEVICE_TYPE = current_platform.device_type$/DEVICE_TYPE = "cpu"/' "$f"
  cp "$ROOT/scripts/vllm/conftest.py" "$DIR/t/conftest.py"
  cp "$ROOT/tests/test_vllm_adapter.py" "$DIR/t/test_vllm_adapter.py"
  say "prepared in $((SECONDS - t0)) s"
}

run() {
  local t0=$SECONDS rc=0
  [ -x "$VENV/bin/python" ] && [ -f "$DIR/t/conftest.py" ] || { say "not prepared: run '$0 prepare' first"; return 1; }
  # vLLM runs its Triton kernels (FLy, recovered-token sampling) under the interpreter only when it sees
  # no CUDA device; the installed specdec_ops is imported from the venv, never from this checkout.
  cd "$DIR/t"
  say "vLLM's tests/v1/sample/test_rejection_sampler.py (adapter: ${SPECDEC_VLLM_ADAPTER:-1})"
  CUDA_VISIBLE_DEVICES="" TRITON_INTERPRET=1 "$VENV/bin/python" -m pytest -q -p no:cacheprovider -rfE \
    tests/v1/sample/test_rejection_sampler.py "$@" || rc=$?
  say "tests/test_vllm_adapter.py (vLLM's sampler and ours on shared inputs)"
  CUDA_VISIBLE_DEVICES="" TRITON_INTERPRET=1 "$VENV/bin/python" -m pytest -q -p no:cacheprovider -rfE \
    test_vllm_adapter.py || rc=$?
  say "done in $((SECONDS - t0)) s (exit $rc)"
  return $rc
}

case "${1:-all}" in
  prepare) prepare ;;
  run) shift; run "$@" ;;
  all) shift || true; prepare && run "$@" ;;
  *) echo "usage: $0 [prepare|run|all] [pytest args for run]" >&2; exit 2 ;;
esac
