"""pytest configuration for running vLLM's own rejection-sampler tests on a CPU machine with
specdec_ops installed as the sampler (scripts/test_vllm.sh copies this file beside vLLM's tests).

Only what is upstream of the sampler is adjusted, never the sampler or the tests' expectations:
- vLLM pins host memory for penalty tensors (no pinned memory without CUDA): PIN_MEMORY is False;
- vLLM's Triton top-k/top-p kernel asks the CUDA platform for its compute units: the tests' logits
  go through vLLM's own PyTorch top-k/top-p implementation instead;
- vLLM's `expand_batch_to_tokens` (per-request temperature, top-k, top-p repeated per draft token, before
  the sampler) runs its Triton kernel with one program per request, which the interpreter takes about 3 ms
  each: in the distribution test, with its thousands of requests per call, that was 370 of the file's 380 s.
  The same expansion runs in PyTorch here (tests/test_vllm_adapter.py checks it against vLLM's kernel).
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


def _expand_batch_to_tokens(x, cu_num_tokens, num_tokens, replace_from=0, replace_to=0):
    """vLLM's expand_batch_to_tokens: request i's x[i] (replace_from replaced by replace_to) at positions
    cu_num_tokens[i - 1] .. cu_num_tokens[i] - 1 of a [num_tokens] tensor of x's dtype."""
    assert cu_num_tokens.shape[0] == x.shape[0]
    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1).long())
    values = torch.where(x == replace_from, torch.full_like(x, replace_to), x)
    out = x.new_zeros(num_tokens)
    end = int(cu_num_tokens[-1]) if x.shape[0] else 0
    out[:end] = values.repeat_interleave(counts)
    return out


_rs.expand_batch_to_tokens = _expand_batch_to_tokens

if os.environ.get("SPECDEC_VLLM_ADAPTER", "1") != "0":
    from specdec_ops.integrations import vllm as _adapter

    _adapter.install()
    assert _adapter.installed()


def pytest_report_header(config):
    mode = "specdec_ops adapter installed" if os.environ.get("SPECDEC_VLLM_ADAPTER", "1") != "0" \
        else "vLLM's own sampler (baseline)"
    return f"vLLM rejection sampler under test: {mode}"
