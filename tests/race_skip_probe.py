"""A Triton kernel for tests/test_logits.py: the races' skip tests (triton_kernels/rejection.py race_cut,
race_skips_probs; triton_kernels/logits.py race_exp2_args, race_skips) on given entries against a given best
score (jit helpers resolve their names in their module's globals: the probe lives here), and the fused
kernel's exponent reference (triton_kernels/logits.py exp_reference)."""

import triton
import triton.language as tl

from specdec_ops.triton_kernels.logits import exp_reference, race_exp2_args, race_skips
from specdec_ops.triton_kernels.rejection import race_cut, race_skips_probs


@triton.jit
def probe(x_ptr, bits_ptr, q_ptr, out_ptr, m, inv_t, best, total, residual, n, LOGITS: tl.constexpr,
          BLOCK: tl.constexpr):
    """out[i] = 1 where entry i is skipped: LOGITS, a logit x (the race of logits.py split_race, residual
    against q when `residual`); else a mass (race_tile_update)."""
    idx = tl.arange(0, BLOCK)
    inside = idx < n
    x = tl.load(x_ptr + idx, mask=inside, other=0.0)
    bits = tl.load(bits_ptr + idx, mask=inside, other=0).to(tl.uint32, bitcast=True)
    cut_a, cut_c = race_cut(best, total)
    if LOGITS:
        exp_a, exp_b = race_exp2_args(m, inv_t)
        q = tl.load(q_ptr + idx, mask=inside, other=0.0)
        q_total = q * tl.where(residual != 0, total * 0.99999904632568359375, 0.0)
        skip = race_skips(x, bits, exp_a, exp_b, cut_a, cut_c, q_total)
    else:
        skip = race_skips_probs(x, bits, cut_a, cut_c)
    tl.store(out_ptr + idx, skip.to(tl.int8), mask=inside)


@triton.jit
def exp_reference_probe(m_ptr, c_ptr, out_ptr, scale, n, BLOCK: tl.constexpr):
    """out[i] = exp_reference(m[i], c[i], scale)."""
    idx = tl.arange(0, BLOCK)
    inside = idx < n
    out = exp_reference(tl.load(m_ptr + idx, mask=inside, other=0.0), tl.load(c_ptr + idx, mask=inside, other=0.0),
                        scale)
    tl.store(out_ptr + idx, out, mask=inside)
