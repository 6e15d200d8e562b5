#!/usr/bin/env bash
# Everything on a fresh machine: venv, torch, build (every .cu compiled for
# TORCH_CUDA_ARCH_LIST, default 8.0;9.0, when torch has CUDA and nvcc exists),
# then the tests: pytest (Triton kernels under TRITON_INTERPRET=1 without a GPU,
# CUDA tests skip) and the host-side C++ tests through ctest.
set -euo pipefail
# shellcheck source=scripts/setup_env.sh
. "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"
# (CI: the compatibility run's CUDA build waits for this file, so as to reuse this build's cubins; .ci/run)
# (and the tests run without the cache's nvcc).
if [ -n "${SPECDEC_BUILT_MARKER:-}" ]; then
  touch "$SPECDEC_BUILT_MARKER"; unset SPECDEC_BUILT_MARKER PYTORCH_NVCC SPECDEC_NVCC_CACHE_LOG
fi
if python -c "import torch, sys; sys.exit(0 if torch.version.cuda else 1)" && [ -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ] \
   && [ "${SPECDEC_NO_CUDA:-0}" = "0" ]; then
  python -c "from specdec_ops import _ops; assert _ops.cuda_kernels_built(), 'the CUDA kernels were not built'"
fi

echo "== host-side C++ tests (ctest; at ${SECONDS} s)"
cmake -S "$ROOT" -B "$ROOT/build/ctest" -DSPECDEC_BUILD_LIBRARY=OFF > /dev/null
cmake --build "$ROOT/build/ctest" -j "${MAX_JOBS:-2}" > /dev/null
ctest --test-dir "$ROOT/build/ctest" --output-on-failure

echo "== pytest (at ${SECONDS} s)"
export TRITON_INTERPRET="${TRITON_INTERPRET:-$(python -c 'import torch; print(0 if torch.cuda.is_available() else 1)')}"
# Two pytest workers (pytest-xdist) keep both cores busy; SPECDEC_TEST_WORKERS=1 runs in one process. Each
# worker's torch gets one thread, so that two workers do not oversubscribe the cores.
WORKERS="${SPECDEC_TEST_WORKERS:-2}"
XDIST=()
if [ "$WORKERS" != 1 ] && python -c "import xdist" 2> /dev/null; then
  XDIST=(-n "$WORKERS" --dist worksteal)
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
fi
# The 20 slowest tests are listed at the end: where the run's time goes (the target for all of CI is 25 minutes).
python -m pytest -q -p no:cacheprovider --durations=20 "${XDIST[@]}" "$ROOT/tests" "$@"
