"""skinny_linear (csrc/linear, specdec_ops/linear.py): F.linear for few rows on the CPU, every code path.

Each path this CPU has (scalar always; AVX2 and AVX-512 where present) is compared with a float64
product, over shapes that reach every remainder of the kernel's tiles: rows 1-17 (pairs of rows, a row
left over, the one-row and two-row tiles), in_features not a multiple of the vector width (the masked
tail) and weights at every float offset within a cache line (the masked head that aligns the weight
loads), out_features not a multiple of the tiles' rows (the one-row tiles), with and without bias. The
tolerance scales with sum_i |x_i w_i|, the size of a rounding error of any summation order.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import specdec_ops
from specdec_ops.linear import ISAS, skinny_linear, skinny_linear_isa

AVAILABLE = ISAS[:ISAS.index(skinny_linear_isa()) + 1]


def expected(x, w, b):
    """float64 product and the scale of its rounding error (sum of |x_i w_i|)."""
    exact = F.linear(x.double(), w.double(), None if b is None else b.double())
    scale = F.linear(x.double().abs(), w.double().abs()) + (0 if b is None else b.double().abs())
    return exact, scale


def assert_linear(out, x, w, b):
    exact, scale = expected(x, w, b)
    assert out.dtype == torch.float32 and out.shape == exact.shape and out.is_contiguous()
    err = (out.double() - exact).abs()
    bound = 1e-6 * scale * max(w.shape[1], 1) ** 0.5 + 1e-30
    assert bool((err <= bound).all()), f"max error {float((err / bound).max()):.2f} x the bound"


def aligned_offset(t: torch.Tensor) -> int:
    return t.data_ptr() % 64


@pytest.mark.parametrize("isa", AVAILABLE)
@pytest.mark.parametrize("rows", list(range(1, 18)) + [24, 32, 33, 43])
def test_matches_float64_for_every_row_count(isa, rows):
    gen = torch.Generator().manual_seed(rows)
    for in_features, out_features in ((64, 48), (37, 19), (576, 40)):
        x = torch.randn(rows, in_features, generator=gen)
        w = torch.randn(out_features, in_features, generator=gen)
        b = torch.randn(out_features, generator=gen)
        assert_linear(skinny_linear(x, w, b, isa=isa), x, w, b)
        assert_linear(skinny_linear(x, w, isa=isa), x, w, None)


@pytest.mark.parametrize("isa", AVAILABLE)
@pytest.mark.parametrize("in_features", [1, 7, 8, 15, 16, 17, 31, 33, 100])
def test_every_weight_offset_and_tail(isa, in_features):
    """The weight at each of the 16 float offsets within a 64-byte line (the masked head), x at another
    offset (the kernel re-lays x out to match), in_features around the vector widths (the masked tail;
    with the broadcast tiles of 5-12 rows, a group of 4 weight elements cut short);
    out_features 1..35 cover the 16-, 12-, 8-, 4- and one-row tiles and their remainders; rows 1-3 the dot
    tiles, 5 and 12 the broadcast tiles of groups of 4 (1 and 3 vectors), 20 those of single elements."""
    gen = torch.Generator().manual_seed(in_features)
    for out_features in (1, 3, 8, 13, 16, 20, 35):
        buffer = torch.randn(out_features * in_features + 64, generator=gen)
        xbuffer = torch.randn(20 * in_features + 64, generator=gen)
        for shift in range(16):
            w = buffer[shift:shift + out_features * in_features].view(out_features, in_features)
            x = xbuffer[5:5 + 20 * in_features].view(20, in_features)
            b = torch.randn(out_features, generator=gen)
            for r in (1, 2, 3, 5, 12, 20):
                assert_linear(skinny_linear(x[:r], w, b, isa=isa), x[:r], w, b)
        assert {aligned_offset(buffer[s:]) for s in range(16)} == set(range(0, 64, 4))


@pytest.mark.parametrize("isa", AVAILABLE)
def test_strided_and_batched_inputs(isa):
    """x with leading dimensions, x rows further apart than in_features, a weight that is a column slice
    (its rows further apart) and a transposed weight (copied): F.linear's result and shape."""
    gen = torch.Generator().manual_seed(7)
    w_full = torch.randn(24, 50, generator=gen)
    x = torch.randn(2, 3, 40, generator=gen)
    b = torch.randn(24, generator=gen)
    w = w_full[:, 5:45]
    out = skinny_linear(x, w, b, isa=isa)
    assert out.shape == (2, 3, 24)
    assert_linear(out.reshape(6, 24), x.reshape(6, 40), w, b)
    wide = torch.randn(4, 70, generator=gen)
    assert_linear(skinny_linear(wide[:, 10:50], w, b, isa=isa), wide[:, 10:50], w, b)
    wt = torch.randn(40, 24, generator=gen).T
    assert_linear(skinny_linear(x[0], wt, None, isa=isa), x[0], wt, None)


def test_paths_agree_and_threads_do_not_change_the_result():
    """Every path computes the same products (to rounding), and the result does not depend on how many
    threads share the output rows (bit for bit: each output is one tile's dot product wherever the
    threads' ranges end)."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(5, 96, generator=gen)
    w = torch.randn(4100, 96, generator=gen)
    outs = [skinny_linear(x, w, isa=isa) for isa in AVAILABLE]
    for out in outs:
        assert_linear(out, x, w, None)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = skinny_linear(x, w)
        torch.set_num_threads(2)
        two = skinny_linear(x, w)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)


def test_empty_shapes():
    w = torch.randn(6, 8)
    assert skinny_linear(torch.randn(0, 8), w).shape == (0, 6)
    assert skinny_linear(torch.randn(2, 0, 8), w).shape == (2, 0, 6)
    assert skinny_linear(torch.randn(3, 8), torch.randn(0, 8)).shape == (3, 0)
    bias = torch.randn(4)
    out = skinny_linear(torch.randn(3, 0), torch.randn(4, 0), bias)   # empty dot products: the bias
    assert torch.equal(out, bias.expand(3, 4))
    assert torch.equal(skinny_linear(torch.randn(3, 0), torch.randn(4, 0)), torch.zeros(3, 4))


@pytest.mark.parametrize("call,name", [
    (lambda x, w, b: skinny_linear(x.double(), w, b), "x must be float32"),
    (lambda x, w, b: skinny_linear(x, w.half(), b), "weight must be float32"),
    (lambda x, w, b: skinny_linear(x, w, b.double()), "bias must be float32"),
    (lambda x, w, b: skinny_linear(x[:, :7], w, b), "x must have shape [..., in_features = 8]"),
    (lambda x, w, b: skinny_linear(x, w[0], b), "weight must be 2-D"),
    (lambda x, w, b: skinny_linear(x, w, b[:3]), "bias must have shape [out_features]"),
    (lambda x, w, b: skinny_linear(x, w, b[None]), "bias must be 1-D"),
    (lambda x, w, b: skinny_linear(x[0, 0], w, b), "x must have at least 1 dimension"),
    (lambda x, w, b: skinny_linear(x.to("meta"), w, b), "x must be on the CPU"),
    (lambda x, w, b: skinny_linear(x, w, b.to("meta")), "bias must be on the CPU"),
    (lambda x, w, b: skinny_linear(x.numpy(), w, b), "x must be a torch.Tensor"),
    (lambda x, w, b: skinny_linear(x, w, b, isa="sse2"), "isa must be None or one of"),
])
def test_bad_input_raises_naming_it(call, name):
    x, w, b = torch.randn(2, 8), torch.randn(5, 8), torch.randn(5)
    with pytest.raises(specdec_ops.SpecDecArgumentError) as info:
        call(x, w, b)
    assert name in str(info.value)


def test_an_isa_this_cpu_lacks_is_refused():
    best = ISAS.index(skinny_linear_isa())
    with pytest.raises(ValueError, match="isa must be -1"):
        torch.ops.specdec.skinny_linear.default(torch.randn(1, 4), torch.randn(2, 4), None, 3)
    if best < len(ISAS) - 1:
        with pytest.raises(specdec_ops.SpecDecArgumentError, match="isa must be -1"):
            skinny_linear(torch.randn(1, 4), torch.randn(2, 4), isa=ISAS[best + 1])


def test_opcheck_and_compile():
    x, w, b = torch.randn(3, 16), torch.randn(10, 16), torch.randn(10)
    torch.library.opcheck(torch.ops.specdec.skinny_linear.default, (x, w, b, -1))
    torch.library.opcheck(torch.ops.specdec.skinny_linear.default, (x[None], w, None, -1))
    compiled = torch.compile(lambda x, w, b: skinny_linear(x, w, b) * 2, fullgraph=True, backend="eager")
    assert torch.equal(compiled(x, w, b), skinny_linear(x, w, b) * 2)
