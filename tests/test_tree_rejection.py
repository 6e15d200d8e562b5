"""Tree verification (DESIGN.md §5.3): every backend against reference.py, the
statistics of the sampler, the chain special case, greedy, errors, opcheck and
torch.compile.

Statistical tests: chi-square goodness of fit at alpha = 1e-4 per tested node,
30,000 draws (requests) per mode, fixed seeds.
"""

import pytest
import torch
from scipy import stats

import specdec_ops
from specdec_ops import reference
from specdec_ops._backend import gpu_value_rules
from specdec_ops._checks import BackendUnavailableError
from conftest import compile_ahead_of_time

ALPHA = 1e-4
NUM_DRAWS = 30_000


# ---------------------------------------------------------------------------------------------- helpers


def full_tree(branching: int, depth: int) -> list[int]:
    """Parents of a complete tree in breadth-first order (node 0 the root)."""
    parents, level = [-1], [0]
    for _ in range(depth):
        nxt = []
        for u in level:
            for _ in range(branching):
                parents.append(u)
                nxt.append(len(parents) - 1)
        level = nxt
    return parents


def random_parents(batch: int, nodes: int, gen: torch.Generator) -> torch.Tensor:
    parents = torch.full((batch, nodes), -1, dtype=torch.int64)
    for i in range(1, nodes):
        parents[:, i] = torch.randint(0, i, (batch,), generator=gen)
    return parents


def rng(batch: int, gen: torch.Generator):
    return (torch.randint(0, 2**62, (batch,), generator=gen),
            torch.randint(0, 2**40, (batch,), generator=gen))


def random_case(batch=6, nodes=9, vocab=37, *, draft=True, greedy=True, padded=True, seed=0, dtype=torch.float32,
                sharp=2.0):
    """Random trees, probabilities and drafts; children of some nodes carry argmax tokens so greedy walks go deep."""
    gen = torch.Generator().manual_seed(seed)
    parents = random_parents(batch, nodes, gen)
    p = torch.softmax(torch.randn(batch, nodes, vocab, generator=gen) * sharp, -1)
    q = torch.softmax(torch.randn(batch, nodes, vocab, generator=gen), -1)
    tokens = torch.randint(0, vocab, (batch, nodes), generator=gen)
    lucky = torch.rand(batch, nodes, generator=gen) < 0.5
    argmax_parent = torch.gather(p.argmax(-1), 1, parents.clamp(min=0))
    tokens = torch.where(lucky, argmax_parent, tokens)
    tokens[:, 0] = 0
    num_nodes = torch.randint(1, nodes + 1, (batch,), generator=gen) if padded else None
    if padded:
        parents = torch.where(torch.arange(nodes) < num_nodes[:, None], parents, -1)
    greedy_mask = torch.rand(batch, generator=gen) < 0.4 if greedy else None
    seeds, offsets = rng(batch, gen)
    return dict(target_probs=p.to(dtype), tree_token_ids=tokens, parents=parents, num_nodes=num_nodes,
                draft_probs=q.to(dtype) if draft else None, seeds=seeds, offsets=offsets, greedy=greedy_mask)


def run(case, backend, **overrides):
    args = dict(case, **overrides)
    return specdec_ops.tree_rejection_sample(
        args["target_probs"], args["tree_token_ids"], args["parents"], args["num_nodes"], args["draft_probs"],
        seeds=args["seeds"], offsets=args["offsets"], greedy=args["greedy"], backend=backend)


def assert_same(a, b):
    for name, x, y in zip(("token_ids", "accepted_path", "num_accepted"), a, b):
        assert x.dtype == y.dtype, name
        assert torch.equal(x, y), f"{name} differs:\n{x}\n{y}"


def check_structure(out, parents, tree_tokens, vocab, num_nodes=None):
    """accepted_path follows tree edges from the root, token_ids are its tokens then one final token, -1 after."""
    batch, nodes = parents.shape
    assert out.token_ids.dtype == torch.int64 and out.accepted_path.dtype == torch.int32
    assert out.num_accepted.dtype == torch.int32
    for b in range(batch):
        k = int(out.num_accepted[b])
        n = nodes if num_nodes is None else int(num_nodes[b])
        path = out.accepted_path[b].tolist()
        toks = out.token_ids[b].tolist()
        assert 0 <= k < n
        assert path[0] == 0
        for j in range(k):
            assert path[j + 1] < n and int(parents[b, path[j + 1]]) == path[j]
            assert toks[j] == int(tree_tokens[b, path[j + 1]])
        assert 0 <= toks[k] < vocab
        assert all(v == -1 for v in path[k + 1:]) and all(v == -1 for v in toks[k + 1:])


# ---------------------------------------------------------------------------------------------- agreement


@pytest.mark.parametrize("draft", [True, False], ids=["draft_probs", "one_hot"])
def test_backends_match_reference(cpu_backend, draft):
    case = random_case(batch=6, nodes=9, vocab=37, draft=draft, seed=1)
    want = run(case, "reference")
    check_structure(want, case["parents"], case["tree_token_ids"], 37, case["num_nodes"])
    assert_same(run(case, cpu_backend), want)


@pytest.mark.parametrize("draft", [True, False], ids=["draft_probs", "one_hot"])
def test_cpu_matches_reference_many_random_trees(draft):
    case = random_case(batch=400, nodes=24, vocab=50, draft=draft, seed=2, sharp=3.0)
    out = run(case, "cpu")
    assert_same(out, run(case, "reference"))
    check_structure(out, case["parents"], case["tree_token_ids"], 50, case["num_nodes"])
    # the cases exercise deep paths, rejections and acceptances
    assert int(out.num_accepted.max()) >= 3 and float(out.num_accepted.float().mean()) > 0.5


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_inputs(dtype):
    for draft in (True, False):
        case = random_case(batch=40, nodes=10, vocab=33, draft=draft, seed=3, dtype=dtype)
        assert_same(run(case, "cpu"), run(case, "reference"))


def test_mixed_probability_dtypes_are_read_as_float32(cpu_backend):
    # a float16 target with float32 (or bfloat16) draft probabilities: both read as float32, as rejection_sample
    case = random_case(batch=8, nodes=9, vocab=40, draft=True, seed=6)
    case["target_probs"] = case["target_probs"].half()
    want = run(case, "reference", target_probs=case["target_probs"].float())
    assert_same(run(case, cpu_backend), want)
    if cpu_backend != "triton":       # the Triton interpreter has no bfloat16 arithmetic
        got = run(case, cpu_backend, draft_probs=case["draft_probs"].bfloat16())
        assert_same(got, run(case, "reference", target_probs=case["target_probs"].float(),
                             draft_probs=case["draft_probs"].bfloat16().float()))
    with pytest.raises(specdec_ops.SpecDecArgumentError, match="draft_probs"):
        run(case, cpu_backend, draft_probs=case["draft_probs"].double())


def test_int32_index_inputs(cpu_backend):
    case = random_case(batch=4, nodes=7, vocab=16, seed=4)
    want = run(case, "reference")
    got = run(case, cpu_backend, tree_token_ids=case["tree_token_ids"].int(), parents=case["parents"].int(),
              num_nodes=case["num_nodes"].int())
    assert_same(got, want)


def test_nan_and_negative_probabilities_are_zero_mass(cpu_backend):
    case = random_case(batch=6, nodes=7, vocab=16, seed=5, greedy=False)
    p, q = case["target_probs"].clone(), case["draft_probs"].clone()
    p[..., :4] = float("nan")
    p[..., 4:8] = -1.0
    q[..., :2] = float("nan")
    for draft in (q, None):
        out = run(case, cpu_backend, target_probs=p, draft_probs=draft)
        assert_same(out, run(case, "reference", target_probs=p, draft_probs=draft))
        emitted = out.token_ids[out.token_ids >= 0]
        assert bool((emitted >= 8).all())


def _siblings_case(batch, p_root, q_root, tokens, seed=0):
    """Root with children 1.. (tokens[0], tokens[1], ...), every node's rows p_root / q_root."""
    nodes, vocab = len(tokens) + 1, len(p_root)
    gen = torch.Generator().manual_seed(seed)
    seeds, offsets = rng(batch, gen)
    return dict(target_probs=torch.tensor(p_root).expand(batch, nodes, vocab).contiguous(),
                tree_token_ids=torch.tensor([0] + tokens).expand(batch, nodes).contiguous(),
                parents=torch.tensor([-1] + [0] * len(tokens)).expand(batch, nodes).contiguous(), num_nodes=None,
                draft_probs=torch.tensor(q_root).expand(batch, nodes, vocab).contiguous(), seeds=seeds,
                offsets=offsets, greedy=None)


def test_child_with_zero_target_and_draft_mass_is_rejected(cpu_backend):
    # Accept child c iff u * q_u(x_c) < p'(x_c), strictly: p(x) = q(x) = 0 must be rejected
    # (the mutant `<=` accepts it); nothing is left of the residual, so the final token is
    # drawn from p: 1 or 2.
    case = _siblings_case(32, [0.0, 0.5, 0.5], [0.0, 0.5, 0.5], [0], seed=11)
    out = run(case, cpu_backend)
    assert_same(out, run(case, "reference"))
    assert (out.num_accepted == 0).all() and (out.accepted_path[:, 1] == -1).all()
    assert ((out.token_ids[:, 0] == 1) | (out.token_ids[:, 0] == 2)).all()


def test_second_sibling_sees_the_normalized_residual(cpu_backend):
    # Child 1 (token 0, p(0) = 0) is always rejected, so child 2 is always tried, against the
    # normalized residual p' = norm(max(p - q, 0)) = norm([0, .1, .4]) = [0, .2, .8]: accept iff
    # u * q(1) = u * .2 < .2, i.e. always. Without the normalizer update (p' = [0, .1, .4])
    # it would be accepted only when u < .5.
    case = _siblings_case(64, [0.0, 0.3, 0.7], [0.5, 0.2, 0.3], [0, 1], seed=12)
    out = run(case, cpu_backend)
    assert_same(out, run(case, "reference"))
    assert out.accepted_path[:, :2].tolist() == [[0, 2]] * 64
    assert (out.num_accepted == 1).all() and (out.token_ids[:, 0] == 1).all()


@pytest.mark.parametrize("draft", [True, False], ids=["draft_probs", "one_hot"])
def test_backends_match_reference_when_later_siblings_are_tried(cpu_backend, draft):
    # Random trees whose every node's first child carries a token of zero target mass: it is
    # rejected by construction, so every visited node with two or more children tries a second
    # sibling after a rejection (with draft_probs, against the updated residual).
    batch, vocab = 48, 16
    gen = torch.Generator().manual_seed(13)
    parents = [-1, 0, 0, 0, 2, 2, 3, 3, 5, 5]  # first children: 1 (of 0), 4 (of 2), 6 (of 3), 8 (of 5)
    nodes = len(parents)
    first_children = {1: 0, 4: 2, 6: 3, 8: 5}
    p = torch.softmax(torch.randn(batch, nodes, vocab, generator=gen) * 3, -1)
    q = torch.softmax(torch.randn(batch, nodes, vocab, generator=gen), -1)
    tokens = torch.randint(0, vocab, (batch, nodes), generator=gen)
    parent_argmax = p.argmax(-1)[:, [max(u, 0) for u in parents]]
    tokens = torch.where(torch.rand(batch, nodes, generator=gen) < 0.5, parent_argmax, tokens)  # likely accepted
    tokens[:, 0] = 0
    rows = torch.arange(batch)
    for child, parent in first_children.items():
        p[rows, parent, tokens[:, child]] = 0.0
    p = p / p.sum(-1, keepdim=True)
    seeds, offsets = rng(batch, gen)
    case = dict(target_probs=p, tree_token_ids=tokens, parents=torch.tensor(parents).expand(batch, nodes).contiguous(),
                num_nodes=None, draft_probs=q if draft else None, seeds=seeds, offsets=offsets, greedy=None)
    want = run(case, "reference")
    assert_same(run(case, cpu_backend), want)
    check_structure(want, case["parents"], tokens, vocab)
    assert not (want.accepted_path == 1).any()           # the first child is never accepted ...
    assert int((want.accepted_path[:, 1] >= 2).sum()) >= batch // 4  # ... and later siblings often are


def test_nan_draft_probs_are_zero_mass(cpu_backend):
    # q_u(x) = NaN counts as 0: child x is accepted whatever u iff p'(x) > 0.
    batch, vocab = 24, 10
    case = random_case(batch=batch, nodes=5, vocab=vocab, seed=14, greedy=False, padded=False)
    q = case["draft_probs"].clone()
    rows = torch.arange(batch)
    first = case["tree_token_ids"][:, 1]
    case["parents"] = torch.tensor([-1, 0, 1, 1, 0]).expand(batch, 5).contiguous()
    q[rows, 0, first] = float("nan")
    q[:, 1] = float("nan")
    q[:, :, 3] = -1.0
    out = run(case, cpu_backend, draft_probs=q)
    assert_same(out, run(case, "reference", draft_probs=q))
    emitted = out.token_ids[out.token_ids >= 0]
    assert ((emitted >= 0) & (emitted < vocab)).all()
    alive = case["target_probs"][rows, 0, first] > 0
    assert (out.accepted_path[alive, 1] == 1).all()  # node 1 (q = NaN at its token, p > 0) accepted


def test_root_only_and_num_nodes_one(cpu_backend):
    case = random_case(batch=5, nodes=6, vocab=20, seed=6, padded=False)
    ones = torch.ones(5, dtype=torch.int64)
    out = run(case, cpu_backend, num_nodes=ones)
    assert_same(out, run(case, "reference", num_nodes=ones))
    assert out.num_accepted.tolist() == [0] * 5 and out.accepted_path[:, 1:].eq(-1).all()
    # N = 1: the bonus token of the root row, as rejection_sample with K = 0 draws it
    single = {k: (v[:, :1] if k in ("target_probs", "tree_token_ids", "parents", "draft_probs") and v is not None
                  else v) for k, v in case.items()}
    single["num_nodes"] = None
    out = run(single, cpu_backend)
    chain = specdec_ops.rejection_sample(single["target_probs"], torch.zeros(5, 0, dtype=torch.int64),
                                         torch.zeros(5, dtype=torch.int64), seeds=case["seeds"],
                                         offsets=case["offsets"], greedy=case["greedy"], backend=cpu_backend)
    assert torch.equal(out.token_ids, chain.token_ids) and out.num_accepted.eq(0).all()


# ---------------------------------------------------------------------------------------------- statistics


def _statistical_case(draft: bool, seed: int):
    """NUM_DRAWS requests on one fixed tree (branching 3, depth 3, 40 nodes) over V = 6.

    p_u and q_u are fixed per node, with exact zeros in p; with draft_probs the
    children's tokens are drawn i.i.d. from q of their parent per request, without
    they are 3 fixed distinct tokens per node (the same in every request, so a bias
    towards or against a child's token is not averaged away).
    """
    gen = torch.Generator().manual_seed(seed)
    parents1 = torch.tensor(full_tree(3, 3))
    nodes, vocab = parents1.numel(), 6
    p1 = torch.rand(nodes, vocab, generator=gen) + 0.3
    p1[torch.rand(nodes, vocab, generator=gen) < 0.2] = 0.0   # tokens of zero probability
    p1[:, 0] = p1[:, 0].clamp(min=0.3)                          # every row keeps mass
    p1 /= p1.sum(-1, keepdim=True)
    q1 = torch.softmax(torch.randn(nodes, vocab, generator=gen), -1)
    batch = NUM_DRAWS
    parents = parents1.repeat(batch, 1)
    if draft:
        # child c drawn from q of its parent
        picks = torch.multinomial(q1[parents1[1:]], batch, replacement=True, generator=gen)  # [N-1, B]
        tokens = torch.cat([torch.zeros(batch, 1, dtype=torch.int64), picks.T], 1)
    else:
        tokens1 = torch.zeros(nodes, dtype=torch.int64)
        for u in range(nodes):
            children = [c for c in range(1, nodes) if int(parents1[c]) == u]
            if children:
                tokens1[children] = torch.randperm(vocab, generator=gen)[: len(children)]
        tokens = tokens1.repeat(batch, 1)
    seeds, offsets = rng(batch, gen)
    return dict(target_probs=p1.expand(batch, -1, -1).contiguous(), tree_token_ids=tokens, parents=parents,
                num_nodes=None, draft_probs=q1.expand(batch, -1, -1).contiguous() if draft else None,
                seeds=seeds, offsets=offsets, greedy=None), p1


@pytest.mark.parametrize("draft", [True, False], ids=["draft_probs", "one_hot"])
def test_chi_square_every_node_emits_its_target_distribution(draft):
    """For every node u, the token emitted after u (the accepted child's token or the final
    token) is distributed as p_u given that the path reaches u. alpha = 1e-4 per node,
    30,000 draws; nodes reached fewer than 300 times are not tested (expected counts >= 5)."""
    case, p1 = _statistical_case(draft, seed=10 + draft)
    out = run(case, "cpu")
    assert_same(out, run(case, "reference"))   # the vectorized reference agrees at scale
    nodes, vocab = p1.shape
    path, toks = out.accepted_path.long(), out.token_ids
    reached = path >= 0
    tested = 0
    for u in range(nodes):
        at_u = reached & (path == u)                  # position j of u on the path; token j follows u
        emitted = toks[at_u]
        if emitted.numel() < 300:
            continue
        counts = torch.bincount(emitted, minlength=vocab).double()
        support = p1[u] > 0
        assert counts[~support].sum() == 0, f"node {u} emitted a token of zero probability"
        expected = p1[u][support].double() * emitted.numel()
        assert float(expected.min()) >= 5
        pvalue = stats.chisquare(counts[support].numpy(), expected.numpy() * counts[support].sum().item()
                                 / expected.sum().item()).pvalue
        assert pvalue > ALPHA, f"node {u}: chi-square p = {pvalue:.2e} ({counts.tolist()} vs {p1[u].tolist()})"
        tested += 1
    assert tested >= 10   # root, its 3 children and most of depth 2 at least
    # acceptance actually happens at every depth
    assert int(out.num_accepted.max()) == 3


# ---------------------------------------------------------------------------------------------- greedy


def argmax_walk(p, tokens, parents, n):
    """A plain greedy walk: follow the first child whose token is argmax p_u, else emit argmax p_u."""
    u, path, out = 0, [0], []
    while True:
        best = int(torch.argmax(reference.prob_mass(p[u])))
        nxt = next((c for c in range(u + 1, n) if int(parents[c]) == u and int(tokens[c]) == best), None)
        out.append(best)
        if nxt is None:
            return path, out
        path.append(nxt)
        u = nxt


def test_greedy_is_argmax_walk(cpu_backend):
    case = random_case(batch=6, nodes=10, vocab=24, seed=7)
    case["greedy"] = torch.ones(6, dtype=torch.bool)
    # duplicate argmax children: the first one in index order must win
    case["tree_token_ids"][:, 2] = case["tree_token_ids"][:, 1]
    case["parents"][:, 2] = case["parents"][:, 1]
    out = run(case, cpu_backend)
    for b in range(6):
        n = int(case["num_nodes"][b])
        path, toks = argmax_walk(case["target_probs"][b], case["tree_token_ids"][b], case["parents"][b], n)
        k = len(path) - 1
        assert out.accepted_path[b, : k + 1].tolist() == path and int(out.num_accepted[b]) == k
        assert out.token_ids[b, : k + 1].tolist() == toks
    assert int(out.num_accepted.max()) >= 2


def test_mixed_greedy_and_sampled_batch(cpu_backend):
    case = random_case(batch=8, nodes=8, vocab=20, seed=8)
    mask = torch.tensor([True, False, True, False, False, True, False, True])
    mixed = run(case, cpu_backend, greedy=mask)
    all_greedy = run(case, cpu_backend, greedy=torch.ones(8, dtype=torch.bool))
    sampled = run(case, cpu_backend, greedy=None)
    for got, want in ((mixed, all_greedy), (mixed, sampled)):
        rows = mask if want is all_greedy else ~mask
        for x, y in zip(got, want):
            assert torch.equal(x[rows], y[rows])


# ---------------------------------------------------------------------------------------------- randomness


def test_batch_permutation_and_running_alone(cpu_backend):
    case = random_case(batch=6, nodes=8, vocab=20, seed=9)
    out = run(case, cpu_backend)
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    permuted = {k: (v[perm] if isinstance(v, torch.Tensor) else v) for k, v in case.items()}
    assert_same(run(permuted, cpu_backend), tuple(t[perm] for t in out))
    b = 4
    alone = {k: (v[b: b + 1] if isinstance(v, torch.Tensor) else v) for k, v in case.items()}
    assert_same(run(alone, cpu_backend), tuple(t[b: b + 1] for t in out))


def test_seeds_and_offsets_drive_the_randomness():
    case = random_case(batch=200, nodes=8, vocab=20, seed=11, greedy=False)
    base = run(case, "cpu")
    assert_same(run(case, "cpu"), base)                                   # deterministic
    moved = run(case, "cpu", offsets=case["offsets"] + 1)
    assert not torch.equal(moved.token_ids, base.token_ids)              # fresh numbers per step
    torch.manual_seed(0)
    drawn = run(case, "cpu", seeds=None, offsets=None)                    # seeds from torch's generator
    check_structure(drawn, case["parents"], case["tree_token_ids"], 20, case["num_nodes"])


# ---------------------------------------------------------------------------------------------- chain case


def _chain_case(batch, k, vocab, seed, dyadic):
    gen = torch.Generator().manual_seed(seed)
    if dyadic:   # rows of multiples of 1/256 that sum to exactly 1 in any order
        w = torch.randint(0, 8, (batch, k + 1, vocab), generator=gen).float()
        w[..., 0] += 1
        units = (w / w.sum(-1, keepdim=True) * 256).floor()
        units[..., 0] += 256 - units.sum(-1)
        p = units / 256
    else:
        p = torch.softmax(torch.randn(batch, k + 1, vocab, generator=gen) * 2, -1)
    q = torch.softmax(torch.randn(batch, k + 1, vocab, generator=gen), -1)
    drafts = torch.randint(0, vocab, (batch, k), generator=gen)
    lucky = torch.rand(batch, k, generator=gen) < 0.5
    drafts = torch.where(lucky, p[:, :k].argmax(-1), drafts)
    n = torch.randint(0, k + 1, (batch,), generator=gen)
    greedy = torch.rand(batch, generator=gen) < 0.3
    seeds, offsets = rng(batch, gen)
    return p, q, drafts, n, greedy, seeds, offsets


@pytest.mark.parametrize("draft", [True, False], ids=["draft_probs", "one_hot"])
def test_chain_shaped_tree_equals_rejection_sample(cpu_backend, draft):
    """Node k+1 is the child of node k: the tree op reproduces rejection_sample exactly (one-hot:
    with rows summing to exactly 1, where u * sum(p') < p'(x) is the chain's u < p(x))."""
    batch = 6 if cpu_backend == "triton" else 300
    k, vocab = 4, 24
    p, q, drafts, n, greedy, seeds, offsets = _chain_case(batch, k, vocab, seed=12, dyadic=not draft)
    chain = specdec_ops.rejection_sample(p, drafts, n, q[:, :k] if draft else None, seeds=seeds, offsets=offsets,
                                         greedy=greedy, backend=cpu_backend)
    parents = torch.arange(-1, k).repeat(batch, 1)
    parents = torch.where(torch.arange(k + 1) <= n[:, None], parents, -1)
    tokens = torch.cat([torch.zeros(batch, 1, dtype=torch.int64), drafts], 1)
    tree = specdec_ops.tree_rejection_sample(p, tokens, parents, n + 1, q if draft else None, seeds=seeds,
                                             offsets=offsets, greedy=greedy, backend=cpu_backend)
    assert torch.equal(tree.token_ids, chain.token_ids)
    assert torch.equal(tree.num_accepted, chain.num_accepted)
    expected_path = torch.where(torch.arange(k + 1) <= chain.num_accepted[:, None], torch.arange(k + 1), -1)
    assert torch.equal(tree.accepted_path, expected_path.int())
    if batch > 100:
        assert 0 < int(chain.num_accepted.sum()) < int(n.sum())


# ---------------------------------------------------------------------------------------------- GPU-safe values


def test_bad_values_get_the_gpu_behaviour_in_triton_and_reference():
    """Called as ops inside gpu_value_rules() (the impl's CPU value checks off), Triton follows the
    documented GPU behaviour of the reference: a malformed parent is the root, a token outside [0, V) is
    rejected, num_nodes is clamped into [1, N]."""
    pytest.importorskip("triton")
    case = random_case(batch=4, nodes=6, vocab=16, seed=13, padded=False, greedy=False)
    case["parents"][0, 3] = 5          # later node
    case["parents"][1, 2] = -7         # negative
    case["parents"][2, 0] = 3          # root entry ignored
    case["tree_token_ids"][1, 1] = 16  # outside the vocabulary
    case["tree_token_ids"][3, 2] = -2
    case["num_nodes"] = torch.tensor([0, 6, 99, 4])
    fixed = dict(case, parents=case["parents"].clone(), num_nodes=torch.tensor([1, 6, 6, 4]))
    fixed["parents"][0, 3] = 0
    fixed["parents"][1, 2] = 0
    want = reference.tree_rejection_sample(*(fixed[k] for k in ("target_probs", "tree_token_ids", "parents",
                                                                 "num_nodes", "draft_probs")),
                                           seeds=case["seeds"], offsets=case["offsets"])
    for draft in (case["draft_probs"], None):
        args = (case["target_probs"], case["tree_token_ids"], case["parents"], case["num_nodes"], draft,
                case["seeds"], case["offsets"], None)
        ref = reference.tree_rejection_sample(*args[:5], seeds=case["seeds"], offsets=case["offsets"])
        with gpu_value_rules():
            assert_same(torch.ops.specdec.tree_rejection_sample_triton(*args), ref)
        emitted = ref.token_ids[ref.token_ids >= 0]
        assert bool(((emitted >= 0) & (emitted < 16)).all())
        if draft is not None:
            assert_same(ref, want)


# ---------------------------------------------------------------------------------------------- errors


def _valid(batch=2, nodes=4, vocab=8):
    return random_case(batch=batch, nodes=nodes, vocab=vocab, seed=14)


@pytest.mark.parametrize("field,value,match", [
    ("target_probs", torch.rand(2, 4), "target_probs"),
    ("target_probs", torch.rand(2, 4, 8, dtype=torch.float64), "target_probs"),
    ("target_probs", torch.rand(2, 0, 8), "target_probs"),
    ("target_probs", torch.rand(2, 4, 0), "target_probs"),
    ("tree_token_ids", torch.zeros(2, 5, dtype=torch.int64), "tree_token_ids"),
    ("tree_token_ids", torch.zeros(2, 4), "tree_token_ids"),
    ("parents", torch.zeros(2, 3, dtype=torch.int64), "parents"),
    ("parents", torch.zeros(4, dtype=torch.int64), "parents"),
    ("parents", torch.zeros(2, 4, dtype=torch.int16), "parents"),
    ("num_nodes", torch.ones(3, dtype=torch.int64), "num_nodes"),
    ("num_nodes", torch.ones(2), "num_nodes"),
    ("draft_probs", torch.rand(2, 4, 7), "draft_probs"),
    ("draft_probs", torch.rand(2, 4, 8, dtype=torch.float64), "draft_probs"),   # float16 is read as float32
    ("seeds", torch.zeros(3, dtype=torch.int64), "seeds"),
    ("seeds", torch.zeros(2, dtype=torch.float32), "seeds"),
    ("offsets", torch.zeros(2, 1, dtype=torch.int64), "offsets"),
    ("greedy", torch.zeros(2, dtype=torch.int64), "greedy"),
    ("greedy", torch.zeros(3, dtype=torch.bool), "greedy"),
])
def test_bad_arguments_raise_naming_them(cpu_backend, field, value, match):
    case = _valid()
    with pytest.raises(ValueError, match=match):
        run(case, cpu_backend, **{field: value})


@pytest.mark.parametrize("where,match", [
    ("root", r"parents\[1, 0\]"),
    ("later", r"parents\[1, 2\]"),
    ("self", r"parents\[0, 3\]"),
    ("negative", r"parents\[1, 1\]"),
    ("token_high", r"tree_token_ids\[0, 2\]"),
    ("token_negative", r"tree_token_ids\[1, 3\]"),
    ("num_nodes_zero", r"num_nodes\[0\]"),
    ("num_nodes_high", r"num_nodes\[1\]"),
])
def test_bad_values_raise_value_error_on_cpu(cpu_backend, where, match):
    case = _valid()
    case["num_nodes"] = torch.tensor([4, 4])
    case["parents"] = torch.tensor([[-1, 0, 0, 1], [-1, 0, 1, 1]])
    par, tok, nn = case["parents"], case["tree_token_ids"], case["num_nodes"]
    if where == "root":
        par[1, 0] = 0
    elif where == "later":
        par[1, 2] = 3
    elif where == "self":
        par[0, 3] = 3
    elif where == "negative":
        par[1, 1] = -1
    elif where == "token_high":
        tok[0, 2] = 8
    elif where == "token_negative":
        tok[1, 3] = -1
    elif where == "num_nodes_zero":
        nn[0] = 0
    else:
        nn[1] = 5
    with pytest.raises(ValueError, match=match):
        run(case, cpu_backend)


def test_padding_nodes_are_not_checked(cpu_backend):
    case = _valid()
    case["num_nodes"] = torch.tensor([2, 3])
    case["parents"] = torch.tensor([[-1, 0, 9, -5], [-1, 0, 1, 7]])
    case["tree_token_ids"] = torch.tensor([[0, 1, 99, -3], [5, 2, 3, 1000]])
    assert_same(run(case, cpu_backend), run(case, "reference"))


def test_unknown_or_unavailable_backend():
    case = _valid()
    with pytest.raises(ValueError, match="backend"):
        run(case, "tpu")
    with pytest.raises(BackendUnavailableError):
        run(case, "cuda")


# ---------------------------------------------------------------------------------------------- op surface


def _op_args(case):
    return (case["target_probs"], case["tree_token_ids"], case["parents"], case["num_nodes"],
            case["draft_probs"], case["seeds"], case["offsets"], case["greedy"])


@pytest.mark.parametrize("op_name", ["tree_rejection_sample", "tree_rejection_sample_triton"])
def test_opcheck(op_name):
    if op_name.endswith("triton"):
        pytest.importorskip("triton")
    op = getattr(torch.ops.specdec, op_name).default
    for draft in (True, False):
        case = random_case(batch=2, nodes=4, vocab=8, draft=draft, seed=15)
        torch.library.opcheck(op, _op_args(case))
        full = random_case(batch=2, nodes=4, vocab=8, draft=draft, seed=15, padded=False, greedy=False)
        torch.library.opcheck(op, _op_args(full))


def test_torch_compile_fullgraph_cpu():
    case = random_case(batch=4, nodes=7, vocab=16, seed=16)

    def step(p, tokens, parents, num_nodes, q, seeds, offsets, greedy):
        out = specdec_ops.tree_rejection_sample(p, tokens, parents, num_nodes, q, seeds=seeds, offsets=offsets,
                                                greedy=greedy)
        return out.token_ids, out.accepted_path, out.num_accepted

    compiled = torch.compile(step, fullgraph=True, backend="eager")
    assert_same(compiled(*_op_args(case)), run(case, "cpu"))
    compiled_inductor = torch.compile(step, fullgraph=True)
    assert_same(compiled_inductor(*_op_args(case)), run(case, "cpu"))


# ---------------------------------------------------------------------------------------------- CUDA


def _to_cuda(case):
    return {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in case.items()}


@pytest.mark.cuda
@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("draft", [True, False], ids=["draft_probs", "one_hot"])
def test_gpu_backends_match_reference(backend, draft):
    for vocab, nodes in ((37, 9), (8193, 24), (128256, 16)):
        case = random_case(batch=32, nodes=nodes, vocab=vocab, draft=draft, seed=17)
        gpu = run(_to_cuda(case), backend)
        assert gpu.token_ids.is_cuda
        assert_same(tuple(t.cpu() for t in gpu), run(case, "cpu"))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_half_precision(dtype):
    case = random_case(batch=32, nodes=16, vocab=4099, seed=18, dtype=dtype)
    assert_same(tuple(t.cpu() for t in run(_to_cuda(case), "cuda")), run(case, "cpu"))


@pytest.mark.cuda
@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_gpu_bad_values_are_safe(backend):
    case = random_case(batch=4, nodes=6, vocab=16, seed=13, padded=False, greedy=False)
    case["parents"][0, 3] = 5
    case["parents"][1, 2] = -7
    case["tree_token_ids"][1, 1] = 16
    case["tree_token_ids"][3, 2] = -2
    case["num_nodes"] = torch.tensor([0, 6, 99, 4])
    for draft in (case["draft_probs"], None):
        args = _op_args(dict(case, draft_probs=draft))
        ref = reference.tree_rejection_sample(*args[:5], seeds=case["seeds"], offsets=case["offsets"])
        op = torch.ops.specdec.tree_rejection_sample if backend == "cuda" else \
            torch.ops.specdec.tree_rejection_sample_triton
        got = op(*(a.cuda() if isinstance(a, torch.Tensor) else a for a in args))
        torch.cuda.synchronize()
        assert_same(tuple(t.cpu() for t in got), ref)


@pytest.mark.cuda
@pytest.mark.parametrize("batch", [1, 64, 600], ids=lambda b: f"B{b}")
@pytest.mark.parametrize("draft", [True, False], ids=["draft_probs", "one_hot"])
def test_cuda_split_across_blocks_matches_cpu(batch, draft):
    """The CUDA kernel splits each request over up to 8 blocks (fewer when the batch alone fills the device:
    one at B=600 on an H200), sized from the SM count: every layout gives the CPU kernel's outputs, also with
    rows that are not 16-byte aligned (V odd) and sharp rows (many rejected siblings, residual updates)."""
    for vocab, sharp in ((5001, 2.0), (4096, 6.0)):
        case = random_case(batch=batch, nodes=6, vocab=vocab, draft=draft, seed=23 + batch, sharp=sharp)
        assert_same(tuple(t.cpu() for t in run(_to_cuda(case), "cuda")), run(case, "cpu"))


@pytest.mark.cuda
def test_cuda_large_trees_keep_their_node_arrays_in_the_workspace():
    """Above 2048 nodes the per-block node arrays move from shared memory to the workspace."""
    for draft in (True, False):
        case = random_case(batch=2, nodes=2100, vocab=64, draft=draft, seed=29)
        assert_same(tuple(t.cpu() for t in run(_to_cuda(case), "cuda")), run(case, "cpu"))


@pytest.mark.cuda
def test_cuda_graph_replay_with_new_offsets():
    case = _to_cuda(random_case(batch=8, nodes=16, vocab=1000, seed=19))
    run(case, "cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run(case, "cuda")
    case["offsets"].add_(1)
    graph.replay()
    torch.cuda.synchronize()
    want = run({k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in case.items()}, "cpu")
    assert_same(tuple(t.cpu() for t in out), want)


def test_triton_kernel_compiles_for_sm90_without_a_gpu():
    """The interpreter does not run Triton's code generator: compile the kernel's variants to sm_90
    ahead of time, so what only the real compiler rejects fails here."""
    pytest.importorskip("triton")
    compile_ahead_of_time("aot_tree_verify_kernel.py")
