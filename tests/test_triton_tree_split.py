"""The Triton tree kernel's split first pass (triton_kernels/tree_verify.py) under the interpreter, with the
layout forced through the launcher's keywords (specdec_ops/tree_verify.py _triton_tree): several programs per
request (PARTS), first-pass tiles (VBLOCK) smaller than the row so that a row spans several tiles and rows end
inside a tile and inside a program's lanes, several lane chunks per program and several tiles per trip. Every
layout must give the C++ CPU op's and the reference's outputs token for token, and the same outputs as every
other layout (the split changes no result: sums keep their lanes' order, races merge exactly)."""

import os

import pytest
import torch

from conftest import HAS_TRITON
from test_tree_rejection import _siblings_case, assert_same, random_case, rng, run

pytestmark = pytest.mark.skipif(not HAS_TRITON or os.environ.get("TRITON_INTERPRET") != "1",
                                reason="needs triton's interpreter (CPU tensors)")

# (name, launcher keywords): vocab 37 below, so every split layout has a row that is not a multiple of its
# tile, of PARTS or of a program's lanes.
LAYOUTS = [
    ("one_program", dict(parts=1)),
    ("default", dict()),
    ("4_parts_tiles_of_16", dict(parts=4, vblock=16, chunk=4, unroll=2)),
    ("2_parts_4_chunks_unroll_3_walk_tiles_of_8", dict(parts=2, vblock=32, chunk=4, unroll=3, block=8)),
    ("8_parts_some_past_the_row", dict(parts=8, vblock=64, chunk=8, unroll=1)),
]
SPLIT = [kw for _, kw in LAYOUTS[2:]]  # the split layouts that cut the row most


def triton_split(case, **layout):
    from specdec_ops.tree_verify import _triton_tree

    return _triton_tree(case["target_probs"], case["tree_token_ids"], case["parents"], case["num_nodes"],
                        case["draft_probs"], case["seeds"], case["offsets"], case["greedy"], **layout)


def check_layouts(case, layouts=SPLIT):
    want = run(case, "cpu")
    assert_same(run(case, "reference"), want)
    for layout in layouts:
        assert_same(triton_split(case, **layout), want)
    return want


@pytest.mark.parametrize("layout", [kw for _, kw in LAYOUTS], ids=[name for name, _ in LAYOUTS])
@pytest.mark.parametrize("draft", [True, False], ids=["draft_probs", "one_hot"])
def test_random_trees_match_the_cpu_op(draft, layout):
    """Random trees with padding, greedy and sampled requests mixed, deep accepted paths and rejections."""
    case = random_case(batch=12, nodes=9, vocab=37, draft=draft, seed=31, sharp=3.0)
    want = run(case, "cpu")
    assert_same(triton_split(case, **layout), want)
    assert int(want.num_accepted.max()) >= 1 and int((want.num_accepted == 0).sum()) >= 2


def _root_child_case(batch, vocab, draft, seed, children=1):
    """The roofline scenario: the root's children carry tokens without target mass at the root (always
    rejected), then the final race at the root; the rest of p_0 is peaked on the last tokens, whose lanes lie in
    the last program."""
    gen = torch.Generator().manual_seed(seed)
    nodes = children + 2
    p = torch.softmax(torch.randn(batch, nodes, vocab, generator=gen) * 3, -1)
    q = torch.softmax(torch.randn(batch, nodes, vocab, generator=gen), -1)
    tokens = torch.randint(0, vocab, (batch, nodes), generator=gen)
    tokens[:, 0] = 0
    parents = torch.tensor([-1] + [0] * children + [1]).expand(batch, nodes).contiguous()
    p[:, 0].scatter_(1, tokens[:, 1:children + 1], 0.0)
    p = p / p.sum(-1, keepdim=True)
    seeds, offsets = rng(batch, gen)
    return dict(target_probs=p, tree_token_ids=tokens, parents=parents, num_nodes=None,
                draft_probs=q if draft else None, seeds=seeds, offsets=offsets, greedy=None)


@pytest.mark.parametrize("draft", [True, False], ids=["draft_probs", "one_hot"])
def test_root_child_rejected_then_the_race_at_the_root(draft):
    case = _root_child_case(8, 37, draft, seed=32)
    out = check_layouts(case)
    assert (out.num_accepted == 0).all()
    assert not (out.token_ids[:, 0] == case["tree_token_ids"][:, 1]).any()


def test_one_hot_race_excludes_the_rejected_children():
    """Without draft probs the first pass races at the root before the walk knows which children it rejects:
    it must leave out exactly the rejected children's tokens. The root's three children hold most of p_0 (so a
    race that kept them would emit them), one of them in every layout's last program, and are often all
    rejected; an accepted child's token is emitted as the accepted token."""
    batch, vocab = 12, 37
    gen = torch.Generator().manual_seed(223)  # 5 of the 12 requests reject all three children
    nodes = 5
    kids = torch.tensor([3, 20, 36])
    p = torch.rand(batch, nodes, vocab, generator=gen) * 0.01
    p[:, 0, kids] = torch.tensor([0.3, 0.3, 0.3])
    p = p / p.sum(-1, keepdim=True)
    tokens = torch.zeros(batch, nodes, dtype=torch.int64)
    tokens[:, 1:4] = kids
    tokens[:, 4] = 5
    parents = torch.tensor([-1, 0, 0, 0, 2]).expand(batch, nodes).contiguous()
    seeds, offsets = rng(batch, gen)
    case = dict(target_probs=p, tree_token_ids=tokens, parents=parents, num_nodes=None, draft_probs=None,
                seeds=seeds, offsets=offsets, greedy=None)
    out = check_layouts(case)
    rejected_all = out.num_accepted == 0
    assert int(rejected_all.sum()) >= 4
    assert not torch.isin(out.token_ids[rejected_all, 0], kids).any()


def test_one_hot_last_token_with_mass_is_kept():
    """The walk does not zero the last entry of p' with mass: the root's children y (1.0) and x (inf) are both
    rejected (u * inf < 1 and u * inf < inf are false); y is zeroed, x, the only entry left with mass, is kept,
    so the final race (which left out both children's tokens) must emit x."""
    batch, vocab = 6, 37
    p = torch.full((batch, 3, vocab), 1.0 / vocab)
    p[:, 0] = 0.0
    p[:, 0, 30] = 1.0
    p[:, 0, 35] = float("inf")
    seeds, offsets = rng(batch, torch.Generator().manual_seed(34))
    case = dict(target_probs=p, tree_token_ids=torch.tensor([0, 30, 35]).expand(batch, 3).contiguous(),
                parents=torch.tensor([-1, 0, 0]).expand(batch, 3).contiguous(), num_nodes=None, draft_probs=None,
                seeds=seeds, offsets=offsets, greedy=None)
    out = check_layouts(case)
    assert out.num_accepted.eq(0).all() and out.token_ids[:, 0].eq(35).all()


@pytest.mark.parametrize("draft", [True, False], ids=["draft_probs", "one_hot"])
def test_second_sibling_after_a_rejection(draft):
    """Every visited node's first child has a token of zero target mass: the walk goes on to a later sibling
    after a rejection (with draft probs, against the updated residual, whose sum at the first rejection is the
    split pass's); several depths."""
    batch, vocab = 12, 37
    gen = torch.Generator().manual_seed(238)  # 8 or 9 of the 12 requests accept a later sibling at the root
    parents = [-1, 0, 0, 0, 2, 2, 3, 3, 5, 5]
    nodes = len(parents)
    first_children = {1: 0, 4: 2, 6: 3, 8: 5}
    p = torch.softmax(torch.randn(batch, nodes, vocab, generator=gen) * 3, -1)
    q = torch.softmax(torch.randn(batch, nodes, vocab, generator=gen), -1)
    tokens = torch.randint(0, vocab, (batch, nodes), generator=gen)
    parent_argmax = p.argmax(-1)[:, [max(u, 0) for u in parents]]
    tokens = torch.where(torch.rand(batch, nodes, generator=gen) < 0.6, parent_argmax, tokens)
    tokens[:, 0] = 0
    rows = torch.arange(batch)
    for child, parent in first_children.items():
        p[rows, parent, tokens[:, child]] = 0.0
    p = p / p.sum(-1, keepdim=True)
    seeds, offsets = rng(batch, gen)
    case = dict(target_probs=p, tree_token_ids=tokens, parents=torch.tensor(parents).expand(batch, nodes).contiguous(),
                num_nodes=None, draft_probs=q if draft else None, seeds=seeds, offsets=offsets, greedy=None)
    out = check_layouts(case)
    assert int((out.accepted_path[:, 1] >= 2).sum()) >= 4 and int((out.num_accepted >= 2).sum()) >= 1
    # the siblings case of test_tree_rejection: a second sibling always accepted against the residual
    siblings = _siblings_case(6, [0.0, 0.3, 0.7], [0.5, 0.2, 0.3], [0, 1], seed=12)
    if not draft:
        siblings["draft_probs"] = None
    check_layouts(siblings)


@pytest.mark.parametrize("draft", [True, False], ids=["draft_probs", "one_hot"])
def test_all_accepted_down_to_a_leaf_then_the_bonus_race(draft):
    """A chain whose every token has all the mass of its parent's row (and of q): accepted to the leaf at
    depth 4, where the bonus race runs (with draft probs that race is the first pass: no rejection came
    before it)."""
    batch, vocab, depth = 6, 37, 4
    gen = torch.Generator().manual_seed(36)
    tokens = torch.randint(0, vocab, (batch, depth + 1), generator=gen)
    tokens[:, 0] = 0
    p = torch.softmax(torch.randn(batch, depth + 1, vocab, generator=gen), -1)
    rows = torch.arange(batch)
    for u in range(depth):
        p[:, u] = 0.0
        p[rows, u, tokens[:, u + 1]] = 1.0
    parents = torch.arange(-1, depth).expand(batch, depth + 1).contiguous()
    seeds, offsets = rng(batch, gen)
    case = dict(target_probs=p, tree_token_ids=tokens, parents=parents, num_nodes=None,
                draft_probs=p.clone() if draft else None, seeds=seeds, offsets=offsets, greedy=None)
    out = check_layouts(case)
    assert out.num_accepted.eq(depth).all()
    assert out.accepted_path.tolist() == [list(range(depth + 1))] * batch


def test_residual_without_mass_falls_back_to_the_target():
    """p = q at the root and the child's token has no mass in either: the child is rejected and the residual
    max(p - q, 0) is empty, so the update is not committed and the race runs over p_0 (the split pass raced
    over the empty residual: its race must not be used)."""
    case = _siblings_case(12, [0.0, 0.25, 0.5, 0.25] + [0.0] * 33, [0.0, 0.25, 0.5, 0.25] + [0.0] * 33, [0], seed=37)
    out = check_layouts(case)
    assert out.num_accepted.eq(0).all()
    assert ((out.token_ids[:, 0] >= 1) & (out.token_ids[:, 0] <= 3)).all()
    assert len(set(out.token_ids[:, 0].tolist())) == 3


def test_greedy_ties_across_programs_take_the_first_index():
    """Greedy requests: the argmax of p_0 is the split pass's; equal maxima at indices in different programs'
    lanes (and tiles) must give the first index, as row_argmax does. A child carries it: accepted, then the
    next rows' argmax (the walk's own loop)."""
    batch, vocab = 8, 37
    gen = torch.Generator().manual_seed(38)
    p = torch.rand(batch, 3, vocab, generator=gen) * 0.1
    p[:, 0, [36, 9, 22]] = 0.5       # ties: 9 < 22 < 36, in different programs for every split layout
    tokens = torch.tensor([0, 9, 4]).expand(batch, 3).contiguous()
    parents = torch.tensor([-1, 0, 1]).expand(batch, 3).contiguous()
    seeds, offsets = rng(batch, gen)
    case = dict(target_probs=p, tree_token_ids=tokens, parents=parents, num_nodes=None, draft_probs=None,
                seeds=seeds, offsets=offsets, greedy=torch.ones(batch, dtype=torch.bool))
    out = check_layouts(case)
    assert out.accepted_path[:, 1].eq(1).all() and out.token_ids[:, 0].eq(9).all()
    assert torch.equal(out.token_ids[:, 1], p[:, 1].argmax(-1))


def test_layout_checks():
    from specdec_ops.tree_verify import _tree_layout

    cpu = torch.device("cpu")
    assert _tree_layout(4, 37, cpu) == (64, 64, 2, 32, 1)
    assert _tree_layout(4, 3, cpu) == (4, 4, 1, 4, 1)
    for bad in (dict(parts=3), dict(parts=4, vblock=16, chunk=8), dict(chunk=2, parts=2, vblock=8), dict(unroll=0)):
        with pytest.raises(ValueError):
            _tree_layout(4, 37, cpu, **bad)


def test_parts_on_a_gpu_fill_the_device_once(monkeypatch):
    """On an H200 (132 SMs): 8 programs per request at B = 64, fewer as the batch alone fills the device;
    bench/roofline.py models the same choice."""
    import types

    from specdec_ops import tree_verify
    from test_roofline import roofline

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: types.SimpleNamespace(
        multi_processor_count=132))
    gpu = torch.device("cuda")
    for batch, parts in ((1, 8), (64, 8), (132, 4), (264, 2), (300, 1), (600, 1)):
        assert tree_verify._tree_parts(batch, 4096, 512, gpu) == parts
        assert roofline._tree_triton_parts(batch) == parts
    layout = tree_verify._tree_layout(64, 128256, gpu)
    assert layout == (1024, 4096, 8, 512, 2)
    assert tree_verify._tree_layout(64, 37, gpu) == (64, 64, 1, 64, 2)
