"""A Triton kernel for tests/test_logits.py: threshold_key of entries' radix keys cut to a select's bits, beside
z's key of the same entries (jit helpers resolve their names in their module's globals: the probe lives here)."""

import triton
import triton.language as tl

from specdec_ops.triton_kernels.logits import logit_value, order_key, radix_key, scaled_tile, threshold_key


@triton.jit
def probe(x_ptr, out_ptr, want_ptr, m, temperature, n, PASSES: tl.constexpr, BLOCK: tl.constexpr):
    idx = tl.arange(0, BLOCK)
    raw = tl.load(x_ptr + idx, mask=idx < n, other=0.0).to(tl.float32)
    prefix = radix_key(raw) >> (32 - 4 * PASSES) << (32 - 4 * PASSES)
    tl.store(out_ptr + idx, threshold_key(prefix, m, temperature, PASSES), mask=idx < n)
    tl.store(want_ptr + idx, order_key(scaled_tile(logit_value(raw), m, temperature)), mask=idx < n)
