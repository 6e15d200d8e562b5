"""pytest configuration for running vLLM's own rejection-sampler tests on a CPU machine with
specdec_ops installed as the sampler (scripts/test_vllm.sh copies this file beside vLLM's tests).

Only what is upstream of the sampler is adjusted, never the sampler or the tests' expectations:
- vLLM pins host memory for penalty tensors (no pinned memory without CUDA): PIN_MEMORY is False;
- vLLM's Triton top-k/top-p kernel asks the CUDA platform for its compute units: the tests' logits
  go through vLLM's own PyTorch top-k/top-p implementation instead.
SPECDEC_VLLM_ADAPTER=0 runs the same tests against vLLM's own sampler (the baseline).
"""

import os

import torch  # noqa: F401  (before vLLM: its platform detection imports torch)
import vllm.utils.torch_utils as _torch_utils
import vllm.v1.sample.ops.penalties as _penalties
import vllm.v1.sample.rejection_sampler as _rs
from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

_torch_utils.PIN_MEMORY = False
_penalties.PIN_MEMORY = False


def _top_k_top_p(logits, k, p, has_topp_only_rows=True):
    if k is None and p is None:
        return logits
    return apply_top_k_top_p_pytorch(logits, k, p, allow_cpu_sync=True)


_rs.apply_top_k_top_p = _top_k_top_p

if os.environ.get("SPECDEC_VLLM_ADAPTER", "1") != "0":
    from specdec_ops.integrations import vllm as _adapter

    _adapter.install()
    assert _adapter.installed()


def pytest_report_header(config):
    mode = "specdec_ops adapter installed" if os.environ.get("SPECDEC_VLLM_ADAPTER", "1") != "0" \
        else "vLLM's own sampler (baseline)"
    return f"vLLM rejection sampler under test: {mode}"
