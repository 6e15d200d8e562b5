"""build_tree, the tree converters and tree_attention_bias (DESIGN.md §5.4)."""

import pytest
import torch

import specdec_ops
from specdec_ops import reference
from specdec_ops.tree import paths_to_parents, parents_to_paths, topk_grid_to_parents

TREE_BACKENDS = ["cpu", "reference"]


def random_parents(batch, n, gen, num_nodes=None, chain=False):
    """Random valid trees; padding entries (>= num_nodes) get garbage, which must be ignored."""
    parents = torch.full((batch, n), -1, dtype=torch.int64)
    for b in range(batch):
        for i in range(1, n):
            parents[b, i] = i - 1 if chain else int(torch.randint(0, i, (1,), generator=gen))
        if num_nodes is not None:
            parents[b, int(num_nodes[b]):] = torch.randint(-5, 2 * n + 1, (n - int(num_nodes[b]),), generator=gen)
    return parents


def walk_mask(parents, num_nodes):
    """bool [B, N, N] ancestor sets and depths by walking (independent of the ops' bit packing)."""
    batch, n = parents.shape
    anc = torch.zeros(batch, n, n, dtype=torch.bool)
    depth = torch.full((batch, n), -1, dtype=torch.int32)
    for b in range(batch):
        for i in range(int(num_nodes[b])):
            a, d = i, -1
            while a != -1:
                anc[b, i, a] = True
                a = int(parents[b, a])
                d += 1
            depth[b, i] = d
    return anc, depth


def unpack(mask, n):
    j = torch.arange(n)
    return ((mask[:, :, j // 64] >> (j % 64)) & 1).bool()


@pytest.mark.parametrize("backend", TREE_BACKENDS)
@pytest.mark.parametrize("n", [1, 7, 64, 65, 130, 1024])
def test_build_tree_bits_and_depths_match_ancestor_walk(backend, n):
    gen = torch.Generator().manual_seed(n)
    batch = 3
    num_nodes = torch.tensor([n, max(1, n // 2), max(0, n - 3)])
    parents = random_parents(batch, n, gen, num_nodes)
    info = specdec_ops.build_tree(parents, num_nodes, backend=backend)
    assert info.mask.dtype == torch.int64 and info.mask.shape == (batch, n, (n + 63) // 64)
    assert info.depth.dtype == torch.int32 and info.depth.shape == (batch, n)
    anc, depth = walk_mask(parents, num_nodes)
    assert torch.equal(unpack(info.mask, n), anc)
    assert torch.equal(info.depth, depth)
    # bits past N in the last word stay clear
    total_bits = sum(bin(int(w) & (2**64 - 1)).count("1") for w in info.mask.flatten())
    assert total_bits == int(anc.sum())


@pytest.mark.parametrize("backend", TREE_BACKENDS)
def test_build_tree_chain_of_1024_is_lower_triangular(backend):
    n = 1024
    parents = torch.arange(-1, n - 1)[None]
    info = specdec_ops.build_tree(parents, backend=backend)
    assert torch.equal(unpack(info.mask, n)[0], torch.ones(n, n, dtype=torch.bool).tril())
    assert torch.equal(info.depth[0], torch.arange(n, dtype=torch.int32))
    assert int(info.mask[0, n - 1, 15]) == -1  # bit 63 set: the int64 word is all ones


def test_build_tree_cpu_equals_reference_int32_inputs_and_no_num_nodes():
    gen = torch.Generator().manual_seed(1)
    parents = random_parents(4, 100, gen).to(torch.int32)
    got = specdec_ops.build_tree(parents, backend="cpu")
    want = reference.build_tree(parents.long())
    assert torch.equal(got.mask, want[0]) and torch.equal(got.depth, want[1])
    ragged = specdec_ops.build_tree(parents, torch.tensor([100, 3, 0, 1], dtype=torch.int32))
    assert (ragged.depth[2] == -1).all() and (ragged.mask[2] == 0).all()
    assert ragged.depth[3].tolist() == [0] + [-1] * 99


def test_build_tree_default_backend_on_cpu_is_the_cpp_kernel():
    info = specdec_ops.build_tree(torch.tensor([[-1, 0, 0, 1]]))
    assert info.mask[0, :, 0].tolist() == [1, 3, 5, 11] and info.depth[0].tolist() == [0, 1, 1, 2]
    assert isinstance(info, specdec_ops.TreeInfo)


@pytest.mark.parametrize("backend", TREE_BACKENDS)
@pytest.mark.parametrize("bad_row, element", [
    ([0, 0, 1], "parents[1, 0]"),      # root not -1
    ([-1, 1, 1], "parents[1, 1]"),     # self
    ([-1, 0, 2], "parents[1, 2]"),     # self
    ([-1, 2, 0], "parents[1, 1]"),     # forward
    ([-1, 0, -2], "parents[1, 2]"),    # < -1
    ([-1, -1, 0], "parents[1, 1]"),    # second root
])
def test_build_tree_malformed_parents_raise_naming_the_element(backend, bad_row, element):
    parents = torch.tensor([[-1, 0, 1], bad_row])
    with pytest.raises(ValueError, match=r"parents\[1, \d\]") as err:
        specdec_ops.build_tree(parents, backend=backend)
    assert element in str(err.value)


@pytest.mark.parametrize("backend", TREE_BACKENDS)
def test_build_tree_checks_num_nodes_and_ignores_padding_parents(backend):
    parents = torch.tensor([[-1, 0, 7, -9]])
    info = specdec_ops.build_tree(parents, torch.tensor([2]), backend=backend)
    assert info.depth[0].tolist() == [0, 1, -1, -1]
    for bad in (5, -1):
        with pytest.raises(ValueError, match="num_nodes"):
            specdec_ops.build_tree(parents, torch.tensor([bad]), backend=backend)


@pytest.mark.parametrize("backend", TREE_BACKENDS)
def test_build_tree_argument_errors_name_the_argument(backend):
    with pytest.raises(ValueError, match="parents"):
        specdec_ops.build_tree(torch.tensor([-1, 0]), backend=backend)
    with pytest.raises(ValueError, match="parents"):
        specdec_ops.build_tree(torch.tensor([[-1.0, 0.0]]), backend=backend)
    with pytest.raises(ValueError, match="num_nodes"):
        specdec_ops.build_tree(torch.tensor([[-1, 0]]), torch.tensor([2, 2]), backend=backend)
    with pytest.raises(ValueError, match="num_nodes"):
        specdec_ops.build_tree(torch.tensor([[-1, 0]]), torch.tensor([2.0]), backend=backend)


def test_build_tree_native_op_checks_and_empty_shapes():
    with pytest.raises(ValueError, match="parents must be 2-D"):  # a shape: ValueError, as every op's checks
        torch.ops.specdec.build_tree(torch.tensor([-1, 0]), None)
    mask, depth = torch.ops.specdec.build_tree(torch.empty(0, 5, dtype=torch.int64), None)
    assert mask.shape == (0, 5, 1) and depth.shape == (0, 5)
    mask, depth = torch.ops.specdec.build_tree(torch.empty(2, 0, dtype=torch.int64), None)
    assert mask.shape == (2, 0, 0)


def test_build_tree_opcheck():
    gen = torch.Generator().manual_seed(3)
    parents = random_parents(2, 70, gen)
    torch.library.opcheck(torch.ops.specdec.build_tree.default, (parents, torch.tensor([70, 5])))
    torch.library.opcheck(torch.ops.specdec.build_tree.default, (parents.int(), None))


def test_build_tree_and_bias_compile_fullgraph():
    parents = torch.tensor([[-1, 0, 0, 1, 1], [-1, 0, 1, 2, 3]])

    def f(parents, num_nodes, prefix_lens):
        info = specdec_ops.build_tree(parents, num_nodes)
        pos = prefix_lens[:, None] + info.depth
        return specdec_ops.tree_attention_bias(info.mask, prefix_lens, 16), pos

    args = (parents, torch.tensor([5, 4]), torch.tensor([3, 9]))
    compiled = torch.compile(f, fullgraph=True)
    got, want = compiled(*args), f(*args)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.cuda
def test_build_tree_cuda_matches_cpu_and_treats_bad_parents_as_root():
    gen = torch.Generator().manual_seed(5)
    for n in (7, 65, 1024):
        num_nodes = torch.tensor([n, n // 2])
        parents = random_parents(2, n, gen, num_nodes)
        got = specdec_ops.build_tree(parents.cuda(), num_nodes.cuda())
        want = specdec_ops.build_tree(parents, num_nodes, backend="cpu")
        assert torch.equal(got.mask.cpu(), want.mask) and torch.equal(got.depth.cpu(), want.depth)
    bad = torch.tensor([[5, 0, 7, -3, 3]]).cuda()  # root ignored; 7 and -3 -> root
    info = specdec_ops.build_tree(bad, torch.tensor([9]).cuda())  # num_nodes clamped to N
    want = specdec_ops.build_tree(torch.tensor([[-1, 0, 0, 0, 3]]), backend="cpu")
    assert torch.equal(info.mask.cpu(), want.mask) and torch.equal(info.depth.cpu(), want.depth)


# ---------------------------------------------------------------------------------------------- converters


def test_paths_to_parents_medusa_order():
    paths = [(1,), (0,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]
    parents = paths_to_parents(paths)
    assert parents.tolist() == [-1, 0, 0, 1, 1, 2, 3]
    assert parents_to_paths(parents) == sorted(paths, key=lambda p: (len(p), p))


def test_paths_parents_round_trip_random_trees():
    gen = torch.Generator().manual_seed(7)
    for n in (1, 2, 9, 60):
        parents = random_parents(1, n, gen)[0]
        paths = parents_to_paths(parents)
        rebuilt = paths_to_parents(paths)
        # same tree up to renumbering in Medusa order: compare as path sets and ancestor counts
        assert sorted(parents_to_paths(rebuilt)) == sorted(paths)
        assert paths_to_parents(parents_to_paths(rebuilt)).tolist() == rebuilt.tolist()
        assert rebuilt.shape == (n,)


@pytest.mark.parametrize("paths, match", [
    ([(0,), (0, 0), (0, 0)], "twice"),
    ([(0, 1)], "no parent path"),
    ([(0,), ()], "empty"),
    ([(-1,)], "negative"),
])
def test_paths_to_parents_errors(paths, match):
    with pytest.raises(ValueError, match=match):
        paths_to_parents(paths)


def test_parents_to_paths_rejects_malformed_parents():
    with pytest.raises(ValueError, match=r"parents\[2\]"):
        parents_to_paths([-1, 0, 2])


def _grid_parent(flat, beams, topk):
    """Parent (flat index, -1 root) of a grid candidate, from the grid's definition."""
    if flat < topk:
        return -1
    step = 1 + (flat - topk) // (topk * topk)
    local = (flat - topk) % (topk * topk)
    prev_local = int(beams[step - 1, local // topk])
    return prev_local + (0 if step == 1 else topk + (step - 2) * topk * topk)


def test_topk_grid_to_parents_random_selections():
    gen = torch.Generator().manual_seed(11)
    topk, steps, batch = 3, 4, 5
    beams = torch.stack([torch.stack([torch.randperm(topk if s == 0 else topk * topk, generator=gen)[:topk]
                                      for s in range(steps - 1)]) for _ in range(batch)])
    grid = topk + (steps - 1) * topk * topk
    selected = []
    for b in range(batch):  # a parent-closed random set of 8 candidates
        chosen = set()
        while len(chosen) < 8:
            c = int(torch.randint(0, grid, (1,), generator=gen))
            path = []
            while c != -1 and c not in chosen:
                path.append(c)
                c = _grid_parent(c, beams[b], topk)
            if len(chosen) + len(path) <= 8:
                chosen.update(path)
        perm = torch.randperm(8, generator=gen)
        selected.append(torch.tensor(sorted(chosen))[perm])
    selected = torch.stack(selected)
    parents, grid_index = topk_grid_to_parents(selected, beams, topk)
    assert parents.shape == (batch, 9) and grid_index.shape == (batch, 9)
    for b in range(batch):
        assert grid_index[b, 0] == -1 and parents[b, 0] == -1
        assert grid_index[b, 1:].tolist() == sorted(selected[b].tolist())
        for i in range(1, 9):
            gp = _grid_parent(int(grid_index[b, i]), beams[b], topk)
            assert int(grid_index[b, int(parents[b, i])]) == gp
    specdec_ops.build_tree(parents)  # valid parents (raises otherwise)


def test_topk_grid_to_parents_makes_no_host_to_device_copy(monkeypatch):
    # Defect: it built a device tensor from a Python list (a host-to-device copy, a sync on
    # the GPU) although its docstring promises none. Shown on the meta device: no tensor from
    # host data, no copy between devices, no read of a value on the host.
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            moves = func.__name__.startswith("_to_copy") and kwargs.get("device", args[0].device) != args[0].device
            self.names.append(str(func) + ("(device)" if moves else ""))
            return func(*args, **kwargs)

    beams = torch.tensor([[[0, 1], [2, 3]]])
    selected = torch.tensor([[0, 1, 3, 4, 7]])
    meta_selected, meta_beams = selected.to("meta"), beams.to("meta")
    from_host = []
    real_tensor = torch.tensor
    monkeypatch.setattr(torch, "tensor", lambda *a, **k: from_host.append(a) or real_tensor(*a, **k))
    with Record() as record:
        parents, grid_index = topk_grid_to_parents(meta_selected, meta_beams, 2)
    assert parents.device.type == "meta" and not from_host
    syncing = [n for n in record.names if "(device)" in n or "_local_scalar_dense" in n or "nonzero" in n]
    assert not syncing, syncing
    # grid 0, 1: step 0; 3 = beam 0's child 1, 4 = beam 1's child 0; 7 = child 1 of beam 0 of step 2 (grid 4)
    assert topk_grid_to_parents(selected, beams, 2)[0].tolist() == [[-1, 0, 0, 1, 2, 4]]


def test_topk_grid_to_parents_hand_example_and_errors():
    # topk 2, 3 steps. Step 0: candidates 0, 1. Step 1 beams = step-0 candidates [1, 0]:
    # flat 2, 3 are children of 1; 4, 5 children of 0. Step 2 beams = step-1 locals [3, 0] (flat 5, 2):
    # flat 6, 7 children of 5; 8, 9 children of 2.
    beams = torch.tensor([[[1, 0], [3, 0]]])
    parents, grid_index = topk_grid_to_parents(torch.tensor([[8, 1, 2, 0, 5, 6]]), beams, 2)
    assert grid_index.tolist() == [[-1, 0, 1, 2, 5, 6, 8]]
    assert parents.tolist() == [[-1, 0, 0, 2, 1, 4, 3]]
    with pytest.raises(ValueError, match="selected"):
        topk_grid_to_parents(torch.tensor([[6, 0]]), beams, 2)  # 6's parent 5 not selected
    with pytest.raises(ValueError, match="selected"):
        topk_grid_to_parents(torch.tensor([[10]]), beams, 2)  # outside the grid
    with pytest.raises(ValueError, match="beam_indices"):
        topk_grid_to_parents(torch.tensor([[0]]), beams, 3)


# ---------------------------------------------------------------------------------------------- bias


@pytest.mark.parametrize("n", [1, 5, 70])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tree_attention_bias_matches_reference(n, dtype):
    gen = torch.Generator().manual_seed(n)
    num_nodes = torch.tensor([n, max(1, n - 2), 1])
    info = specdec_ops.build_tree(random_parents(3, n, gen, num_nodes), num_nodes)
    prefix_lens = torch.tensor([0, 4, 9], dtype=torch.int32)
    for kv_len in (n + 9, n + 20, 3):
        bias = specdec_ops.tree_attention_bias(info.mask, prefix_lens, kv_len, dtype)
        assert bias.shape == (3, 1, n, kv_len) and bias.dtype == dtype
        assert torch.equal(bias, reference.tree_attention_bias(info.mask, prefix_lens, kv_len, dtype))


def test_tree_attention_bias_semantics():
    info = specdec_ops.build_tree(torch.tensor([[-1, 0, 0, 1, -1]]), torch.tensor([4]))
    bias = specdec_ops.tree_attention_bias(info.mask, torch.tensor([2]), 9)[0, 0]
    visible = (bias == 0).int().tolist()
    assert visible == [
        [1, 1, 1, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 1, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 1, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0, 0, 0],  # padding row: prefix only
    ]
    assert set(bias.unique().tolist()) == {0.0, float("-inf")}


def test_tree_attention_bias_argument_errors():
    info = specdec_ops.build_tree(torch.tensor([[-1, 0]]))
    with pytest.raises(ValueError, match="mask"):
        specdec_ops.tree_attention_bias(info.mask.int(), torch.tensor([0]), 4)
    with pytest.raises(ValueError, match="mask"):
        specdec_ops.tree_attention_bias(torch.zeros(1, 2, 2, dtype=torch.int64), torch.tensor([0]), 4)
    with pytest.raises(ValueError, match="prefix_lens"):
        specdec_ops.tree_attention_bias(info.mask, torch.tensor([0, 1]), 4)
    with pytest.raises(ValueError, match="kv_len"):
        specdec_ops.tree_attention_bias(info.mask, torch.tensor([0]), -1)
    with pytest.raises(ValueError, match="dtype"):
        specdec_ops.tree_attention_bias(info.mask, torch.tensor([0]), 4, torch.int32)


def test_tree_attention_bias_refuses_negative_prefix_lens_on_cpu():
    # Defect: a negative prefix length gave rows of -inf only (NaN out of SDPA).
    info = specdec_ops.build_tree(torch.tensor([[-1, 0, 0]]))
    with pytest.raises(specdec_ops.SpecDecArgumentError, match=r"prefix_lens\[0\] = -1"):
        specdec_ops.tree_attention_bias(info.mask, torch.tensor([-1]), 5)


@pytest.mark.cuda
def test_tree_attention_bias_clamps_negative_prefix_lens_on_the_gpu():
    info = specdec_ops.build_tree(torch.tensor([[-1, 0, 0], [-1, 0, 1]], device="cuda"))
    bias = specdec_ops.tree_attention_bias(info.mask, torch.tensor([-4, 0], device="cuda"), 5)
    want = specdec_ops.tree_attention_bias(info.mask, torch.tensor([0, 0], device="cuda"), 5)
    assert torch.equal(bias, want) and bool((bias == 0).any(-1).all())
