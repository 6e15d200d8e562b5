"""Triton kernels across Triton versions (3.6 .. 3.9; run this file with PYTHONPATH=/path/to/other/triton too):
the grouped Philox tile against reference.py, the chain and tree kernels on bfloat16 inputs under the interpreter
(they load bf16 and compute in float32) and on the race's corner cases (residual without mass, vocabularies
smaller than a Philox block), all bitwise against reference.py."""

import pytest
import torch

import specdec_ops
from specdec_ops import reference

from conftest import HAS_TRITON

pytestmark = pytest.mark.skipif(not HAS_TRITON, reason="needs triton")


if HAS_TRITON:
    import triton
    import triton.language as tl

    from specdec_ops.triton_kernels.philox import philox_tile

    @triton.jit
    def philox_tile_kernel(seeds_ptr, offsets_ptr, out_ptr, position, purpose, start, BLOCK: tl.constexpr):
        tile = philox_tile(tl.load(seeds_ptr), tl.load(offsets_ptr), position, purpose, start, BLOCK)
        tl.store(out_ptr + tl.arange(0, BLOCK), tile.to(tl.int32, bitcast=True))


@pytest.mark.parametrize("seed,offset,position,purpose,start", [
    (0, 0, 0, 0, 0),
    (2**62 + 12345, 2**40 + 7, 3, 1, 128),
    (-5, -(2**35), 17, 2, 4096),   # int64 seeds/offsets are taken as their uint64 bits
])
def test_philox_tile_equals_reference_bits_entry_by_entry(seed, offset, position, purpose, start):
    block = 64
    out = torch.empty(block, dtype=torch.int32)
    philox_tile_kernel[(1,)](torch.tensor([seed]), torch.tensor([offset]), out, position, purpose, start, BLOCK=block)
    want = reference.philox_bits(seed & (2**64 - 1), offset & (2**64 - 1), position, purpose,
                                 torch.arange(start, start + block))
    assert torch.equal(out.to(torch.int64) & 0xFFFFFFFF, want)


def _chain(args, backend):
    return specdec_ops.rejection_sample(args["p"], args["ids"], args["n"], args["q"], seeds=args["seeds"],
                                        offsets=args["offsets"], backend=backend)


def _chain_case(batch, k, vocab, dtype, draft, seed):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(batch, k + 1, vocab, generator=g) * 2, -1).to(dtype)
    q = torch.softmax(torch.randn(batch, k, vocab, generator=g) * 2, -1).to(dtype)
    ids = torch.randint(0, vocab, (batch, k), generator=g)
    return dict(p=p, q=q if draft else None, ids=ids, n=torch.randint(0, k + 1, (batch,), generator=g),
                seeds=torch.randint(0, 2**62, (batch,), generator=g), offsets=torch.randint(0, 2**40, (batch,), generator=g))


def _same_chain(a, b):
    assert torch.equal(a.token_ids, b.token_ids) and torch.equal(a.num_accepted, b.num_accepted), (a, b)


@pytest.mark.parametrize("draft", [True, False], ids=["draft_probs", "one_hot"])
def test_chain_kernel_bfloat16_under_the_interpreter_matches_reference(draft):
    case = _chain_case(6, 3, 300, torch.bfloat16, draft, seed=11)
    _same_chain(_chain(case, "triton"), _chain(case, "reference"))


@pytest.mark.parametrize("draft", [True, False], ids=["draft_probs", "one_hot"])
def test_tree_kernel_bfloat16_under_the_interpreter_matches_reference(draft):
    g = torch.Generator().manual_seed(5)
    batch, nodes, vocab = 5, 7, 40
    parents = torch.tensor([-1, 0, 0, 1, 1, 2, 3]).repeat(batch, 1)
    p = torch.softmax(torch.randn(batch, nodes, vocab, generator=g) * 2, -1).to(torch.bfloat16)
    q = torch.softmax(torch.randn(batch, nodes, vocab, generator=g) * 2, -1).to(torch.bfloat16) if draft else None
    tokens = torch.randint(0, vocab, (batch, nodes), generator=g)
    seeds = torch.randint(0, 2**62, (batch,), generator=g)
    offsets = torch.randint(0, 2**40, (batch,), generator=g)
    got, want = (specdec_ops.tree_rejection_sample(p, tokens, parents, draft_probs=q, seeds=seeds, offsets=offsets,
                                                   backend=backend) for backend in ("triton", "reference"))
    for a, b in zip(got, want):
        assert torch.equal(a, b), (got, want)


def test_residual_without_mass_falls_back_to_the_target_race():
    """p == q at the rejected row and the draft has p = q = 0 there: rejected, max(p - q, 0) has no mass,
    the residual race reruns over p (the same noise)."""
    case = _chain_case(8, 2, 37, torch.float32, True, seed=3)
    case["q"] = case["p"][:, :2].clone()
    case["q"][:, :, 5] = 0.0
    case["p"][:, :2, 5] = 0.0
    case["ids"][:, 0] = 5
    case["n"][:] = 2
    got, want = _chain(case, "triton"), _chain(case, "reference")
    _same_chain(got, want)
    assert torch.equal(want.num_accepted, torch.zeros(8, dtype=torch.int32))


@pytest.mark.parametrize("vocab", [1, 2, 3, 5])
@pytest.mark.parametrize("draft", [True, False], ids=["draft_probs", "one_hot"])
def test_vocabularies_smaller_than_a_philox_block(vocab, draft):
    case = _chain_case(6, 2, vocab, torch.float32, draft, seed=vocab)
    _same_chain(_chain(case, "triton"), _chain(case, "reference"))
