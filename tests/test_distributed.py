"""Vocab-parallel verification (DESIGN.md §5.8): the sharded ops on gloo worlds of 2, 3 and 4
processes against the unsharded §5.7 op (reference and cpu backends), token for token.

Each world size spawns one world (module-scoped fixture) that runs every case, since
process start-up dominates; the tests below then check parts of its results. The
per-shard helpers (Philox keyed by the global index, the radix select) are tested
in-process.
"""

import pytest
import scipy.stats
import torch

import specdec_ops
from specdec_ops import distributed, reference

from dist_harness import run_world, sharded_calls

ALPHA = 1e-4  # significance level of the statistical test here


# ---------------------------------------------------------------------------------------------- cases


def make_case(seed, batch, k, vocab, bounds, *, layout="padded", draft_probs=False, filters=(), greedy="mix",
              logprobs=True, dtype=torch.float32, specials=False):
    """One random verification problem, as the sharded workers and the unsharded op both take it."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, k + 1, vocab, generator=g) * 2.5
    q = torch.softmax(torch.randn(batch, k, vocab, generator=g) * 2, -1)
    drafts = torch.multinomial(q.reshape(-1, vocab), 1, generator=g).reshape(batch, k)
    # Half the requests draft the target's argmax, so that long accepted runs happen too.
    drafts[::2] = logits[::2, :k].argmax(-1)
    n = torch.randint(0, k + 1, (batch,), generator=g)
    kwargs = dict(seeds=torch.randint(0, 2**62, (batch,), generator=g),
                  offsets=torch.randint(0, 2**40, (batch,), generator=g), return_logprobs=logprobs)
    temperature = torch.rand(batch, generator=g) * 1.5 + 0.3
    if greedy == "mix":
        temperature[1::3] = 0.0
    elif greedy == "all":
        temperature[:] = 0.0
    kwargs["temperature"] = temperature
    if "top_k" in filters:
        top_k = torch.randint(1, 9, (batch,), generator=g)
        top_k[::4] = 0  # off
        top_k[2::5] = vocab + 3  # off (>= V)
        kwargs["top_k"] = top_k
    if "top_p" in filters:
        top_p = torch.rand(batch, generator=g) * 0.8 + 0.15
        top_p[3::4] = 1.0  # off
        kwargs["top_p"] = top_p
    if "min_p" in filters:
        min_p = torch.rand(batch, generator=g) * 0.3
        min_p[1::4] = 0.0  # off
        kwargs["min_p"] = min_p
    if specials:
        # Ties for the maximum on two different ranks (first index wins), top-k ties at the boundary,
        # NaN logits (count as -inf), a row with no finite logit, and the first and last ids drafted.
        lo, hi = bounds[1] - 1 if bounds[1] > 0 else 0, vocab - 1
        logits[0, 0, lo] = logits[0, 0, hi] = logits[0, 0].max() + 1.0
        logits[1, :, 2:6] = 9.0
        logits[2, 0, ::3] = float("nan")
        logits[batch - 1, min(1, k)] = float("-inf")
        drafts[0, 0] = hi
        drafts[batch - 1, 0] = 0
    case = {"bounds": bounds, "layout": layout, "logits": logits.to(dtype),
            "draft_probs": q.to(dtype) if draft_probs else None}
    if layout == "padded":
        case["kwargs"] = dict(kwargs, draft_token_ids=drafts, num_draft_tokens=n)
        return case
    # Packed: request b's n_b drafts and n_b + 1 rows.
    rows, ids, qrows = [], [], []
    for b in range(batch):
        nb = int(n[b])
        rows.append(case["logits"][b, : nb + 1])
        ids.append(drafts[b, :nb])
        qrows.append(q[b, :nb].to(dtype))
    cu = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(n, 0)])
    case["logits"] = torch.cat(rows)
    case["draft_probs"] = torch.cat(qrows) if draft_probs else None
    case["kwargs"] = dict(kwargs, cu_num_draft_tokens=cu, draft_token_ids=torch.cat(ids), max_num_draft_tokens=k)
    return case


def make_tree_case(seed, batch, nodes, vocab, bounds, *, draft_probs=False, filters=(), greedy="mix"):
    """A random tree per request: node i's parent drawn in [0, i); half the nodes carry their
    parent row's argmax (long accepted paths), the others a token drawn from q at the parent."""
    case = make_case(seed, batch, nodes - 1, vocab, bounds, draft_probs=False, filters=filters, greedy=greedy)
    g = torch.Generator().manual_seed(seed + 1)
    logits = case["logits"]
    q = torch.softmax(torch.randn(batch, nodes, vocab, generator=g) * 2, -1)
    parents = torch.full((batch, nodes), -1, dtype=torch.int64)
    tokens = torch.zeros(batch, nodes, dtype=torch.int64)
    for i in range(1, nodes):
        parents[:, i] = torch.randint(0, i, (batch,), generator=g)
        drawn = torch.multinomial(q[torch.arange(batch), parents[:, i]], 1, generator=g)[:, 0]
        favourite = logits[torch.arange(batch), parents[:, i]].argmax(-1)
        tokens[:, i] = torch.where(torch.rand(batch, generator=g) < 0.5, favourite, drawn)
    num_nodes = torch.randint(1, nodes + 1, (batch,), generator=g)
    kw = {key: v for key, v in case["kwargs"].items() if key not in ("draft_token_ids", "num_draft_tokens")}
    case.update(layout="tree", draft_probs=q if draft_probs else None,
                kwargs=dict(kw, tree_token_ids=tokens, parents=parents, num_nodes=num_nodes))
    return case


def unsharded(case, backend):
    """The §5.7 op on the full logits."""
    kw = dict(case["kwargs"])
    if case["layout"] == "tree":
        return specdec_ops.tree_rejection_sample_logits(case["logits"], kw.pop("tree_token_ids"), kw.pop("parents"),
                                                        kw.pop("num_nodes"), case["draft_probs"], backend=backend,
                                                        **kw)
    if case["layout"] == "padded":
        return specdec_ops.rejection_sample_logits(case["logits"], kw.pop("draft_token_ids"),
                                                   kw.pop("num_draft_tokens"), case["draft_probs"],
                                                   backend=backend, **kw)
    return specdec_ops.rejection_sample_logits_packed(case["logits"], kw.pop("cu_num_draft_tokens"),
                                                      kw.pop("draft_token_ids"), case["draft_probs"],
                                                      backend=backend, **kw)


FILTER_SETS = [(), ("top_k",), ("top_p",), ("min_p",), ("top_k", "top_p", "min_p")]


def equality_cases(world, bounds_list, seed0):
    cases, labels = [], []
    seed = seed0
    for bounds in bounds_list:
        vocab = bounds[-1]
        for layout in ("padded", "packed"):
            for filters in FILTER_SETS:
                for draft_probs in (False, True):
                    seed += 1
                    greedy = "none" if seed % 3 == 0 else "mix"
                    cases.append(make_case(seed, 6, 3, vocab, bounds, layout=layout, draft_probs=draft_probs,
                                           filters=filters, greedy=greedy, specials=seed % 2 == 0))
                    labels.append(f"world={world} bounds={bounds} {layout} filters={filters or 'none'} "
                                  f"draft_probs={draft_probs} greedy={greedy} specials={seed % 2 == 0}")
    # bf16 logits and an all-greedy batch.
    bounds = bounds_list[0]
    cases.append(make_case(seed + 1, 5, 2, bounds[-1], bounds, dtype=torch.bfloat16, filters=("top_p",)))
    labels.append(f"world={world} bf16 logits")
    cases.append(make_case(seed + 2, 5, 2, bounds[-1], bounds, greedy="all", draft_probs=True))
    labels.append(f"world={world} all greedy")
    cases.append(residual_fallback_case(seed + 3, bounds))
    labels.append(f"world={world} residual without mass (draft_probs = the processed target, draft off its support)")
    for filters in ((), ("top_k", "top_p", "min_p")):
        for draft_probs in (False, True):
            seed += 1
            cases.append(make_tree_case(seed, 5, 7, bounds[-1], bounds, draft_probs=draft_probs, filters=filters))
            labels.append(f"world={world} tree filters={filters or 'none'} draft_probs={draft_probs}")
    for layout in ("padded", "packed"):  # the CUDA path's fixed-shape arithmetic, on CPU tensors
        cases.append(dict(make_case(seed + 4, 6, 3, bounds[-1], bounds, layout=layout, draft_probs=True,
                                    filters=("top_k", "top_p", "min_p"), specials=True), fixed_shapes=True))
        labels.append(f"world={world} {layout} all filters, fixed shapes (no CPU compaction, as on CUDA)")
    more, more_labels = engine_cases(seed + 10, bounds)
    cases += empty_cases(bounds)
    labels += [f"world={world} empty batch {layout}" for layout in ("padded", "packed", "tree")]
    return cases + more, labels + [f"world={world} {label}" for label in more_labels]


def empty_cases(bounds):
    """No request at all (B = 0), padded, packed and tree: the unsharded op's empty outputs."""
    vocab, k = bounds[-1], 2
    kw = dict(seeds=torch.zeros(0, dtype=torch.int64), offsets=torch.zeros(0, dtype=torch.int64),
              temperature=torch.zeros(0), top_p=torch.zeros(0) + 0.5, return_logprobs=True)
    none = torch.zeros(0, dtype=torch.int64)
    return [{"bounds": bounds, "layout": "padded", "logits": torch.zeros(0, k + 1, vocab), "draft_probs": None,
             "kwargs": dict(kw, draft_token_ids=torch.zeros(0, k, dtype=torch.int64), num_draft_tokens=none)},
            {"bounds": bounds, "layout": "packed", "logits": torch.zeros(0, vocab), "draft_probs": None,
             "kwargs": dict(kw, cu_num_draft_tokens=torch.zeros(1, dtype=torch.int64), draft_token_ids=none,
                            max_num_draft_tokens=k)},
            {"bounds": bounds, "layout": "tree", "logits": torch.zeros(0, 3, vocab), "draft_probs": None,
             "kwargs": dict(kw, tree_token_ids=torch.zeros(0, 3, dtype=torch.int64),
                            parents=torch.full((0, 3), -1, dtype=torch.int64), num_nodes=None)}]


def engine_cases(seed, bounds):
    """The engine keywords (issue #14): external bonus tokens (bonus rows kept and omitted), placeholder
    draft ids rejected, synthetic acceptance rates; and a target without any row (K = 0, bonus only)."""
    cases, labels = [], []
    vocab = bounds[-1]
    for layout in ("padded", "packed"):
        for omit in (False, True):
            seed += 1
            case = make_case(seed, 6, 3, vocab, bounds, layout=layout, draft_probs=omit, filters=("top_k", "top_p"))
            kw = case["kwargs"]
            g = torch.Generator().manual_seed(seed)
            kw.update(bonus_token_ids=torch.randint(0, vocab, (6, 1), generator=g), reject_invalid_drafts=True)
            if omit:
                kw["synthetic_acceptance_rates"] = torch.tensor([0.9, 0.6, 0.4])
            ids = kw["draft_token_ids"].clone()
            if layout == "padded":
                ids[0, 0], ids[2, 1], ids[4, 2] = -1, vocab, -1
                if omit:
                    case["logits"] = case["logits"][:, :3].contiguous()
            else:
                cu = kw["cu_num_draft_tokens"]
                ids[0], ids[-1] = -1, vocab
                if omit:
                    keep = torch.cat([torch.arange(int(cu[b]) + b, int(cu[b + 1]) + b) for b in range(6)])
                    case["logits"] = case["logits"][keep].contiguous()
            kw["draft_token_ids"] = ids
            cases.append(case)
            labels.append(f"engine keywords {layout} bonus rows omitted={omit} synthetic={omit}")
    case = make_case(seed + 1, 4, 0, vocab, bounds)
    case["logits"] = case["logits"][:, :0].contiguous()
    case["kwargs"]["bonus_token_ids"] = torch.tensor([0, vocab - 1, 3, 5])
    cases.append(case)
    labels.append("engine keywords: no rows at all (K = 0, bonus only)")
    return cases, labels


def residual_fallback_case(seed, bounds):
    """q = the processed target itself and a draft token the target's top-k filtered out: the draft is
    rejected (p(x) = 0), max(p - q, 0) has no mass, and the token is drawn from p instead (§5.2)."""
    case = make_case(seed, 4, 2, bounds[-1], bounds, draft_probs=True, filters=("top_k",), greedy="none")
    kw = case["kwargs"]
    kw["top_k"] = torch.full((4,), 3)
    q = specdec_ops.process_logits(case["logits"][:, :2], kw["temperature"], kw["top_k"])
    kw["draft_token_ids"] = q.argmin(-1)  # p(x) = q(x) = 0
    kw["num_draft_tokens"] = torch.tensor([2, 1, 2, 2])
    case["draft_probs"] = q
    return case


# V not divisible by the world size, uneven shards, an empty shard, shards not starting at multiples of 4.
WORLD_BOUNDS = {
    2: [[0, 20, 37], [0, 0, 41]],
    3: [[0, 13, 14, 41], [0, 7, 30, 37]],
    4: [[0, 5, 30, 31, 53]],
}


def inconsistent_cases(world):
    """Calls that must raise on every rank: shards with a gap, an overlap, a wrong vocab_size on one
    rank, and one rank passing top_k where the others do not."""
    base = make_case(99, 3, 2, 30, [0] + [10 * (r + 1) for r in range(world - 1)] + [30])
    starts = base["bounds"][:-1]
    gap = dict(base, vocab_start=[s + (1 if r == world - 1 else 0) for r, s in enumerate(starts)])
    overlap = dict(base, vocab_start=[s - (1 if r == 1 else 0) for r, s in enumerate(starts)])
    size = dict(base, vocab_size=[30] * (world - 1) + [31])
    top_k = dict(base, per_rank_kwargs=[{}] * (world - 1) + [{"top_k": torch.full((3,), 2)}])
    bad_top_p = dict(base, per_rank_kwargs=[{"top_p": torch.full((3,), 1.5)}] + [{"top_p": torch.full((3,), 0.5)}]
                     * (world - 1))
    # Errors other than the argument checks' own, on the last rank only: the others must raise, not wait for it.
    junk_temperature = dict(base, per_rank_kwargs=[{}] * (world - 1) + [{"temperature": [1.0, "x", 1.0]}])
    list_logits = dict(base, list_logits_ranks=(world - 1,))
    check_gap = dict(gap, check_only=True)
    return ([gap, overlap, size, top_k, bad_top_p, junk_temperature, list_logits, check_gap],
            ["gap", "overlap", "vocab_size", "top_k on one rank", "bad top_p on rank 0",
             "junk temperature on the last rank", "logits a list on the last rank", "check_vocab_shards gap"])


def comm_cases(world):
    """The same batch shape with V = 41 and V = 4001 (all filters): the bytes sent must not change."""
    cases = []
    for vocab in (41, 4001):
        bounds = [round(vocab * r / world) for r in range(world + 1)]
        cases.append(make_case(5, 4, 3, vocab, bounds, draft_probs=True, filters=("top_k", "top_p", "min_p")))
    return cases


STAT_REQUESTS = 6000  # requests (one sample each) in the chi-square test
STAT_LOGITS = torch.tensor([2.0, 1.5, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -2.0, 3.0, -3.0, 0.2])


def stat_case():
    """STAT_REQUESTS copies of one request with different seeds: n = 1 with the draft token 9 (the
    most likely one) and top_k 6, top_p 0.9, temperature 0.8; the first emitted token is p-distributed."""
    vocab, batch = STAT_LOGITS.shape[0], STAT_REQUESTS
    logits = STAT_LOGITS.expand(batch, 2, vocab).clone()
    kwargs = dict(draft_token_ids=torch.full((batch, 1), 9), num_draft_tokens=torch.ones(batch, dtype=torch.int64),
                  temperature=torch.full((batch,), 0.8), top_k=torch.full((batch,), 6),
                  top_p=torch.full((batch,), 0.9), seeds=torch.arange(batch, dtype=torch.int64) * 7919 + 1,
                  offsets=torch.zeros(batch, dtype=torch.int64))
    return {"bounds": [0, 5, vocab], "layout": "padded", "logits": logits, "draft_probs": None, "kwargs": kwargs}


def _world_results(world):
    eq, eq_labels = equality_cases(world, WORLD_BOUNDS[world], seed0=100 * world)
    bad, bad_labels = inconsistent_cases(world)
    # A valid call after the failing ones: a raise leaves the world usable (nothing half-done).
    after, _ = equality_cases(world, [WORLD_BOUNDS[world][0]], seed0=7)
    after = [dict(after[0], check_only=True), after[0]]  # check_vocab_shards passes on a good tiling
    extra = comm_cases(world) + ([stat_case()] if world == 2 else [])
    results = run_world(world, sharded_calls, eq + bad + after + extra)
    n_fixed = len(eq) + len(bad) + len(after)
    return {"eq": (eq, eq_labels), "bad": (bad, bad_labels), "after": after,
            "results": [r[:n_fixed] for r in results], "comm": [r[n_fixed:n_fixed + 2] for r in results],
            "stat": [r[n_fixed + 2:] for r in results], "world": world}


@pytest.fixture(scope="module", params=[2, 3, 4], ids=lambda w: f"world{w}")
def world(request):
    return _world_results(request.param)


# ---------------------------------------------------------------------------------------------- tests


def _same(a, b, label, logprobs=True):
    assert torch.equal(a["token_ids"], b.token_ids), f"{label}: token_ids\n{a['token_ids']}\n{b.token_ids}"
    assert torch.equal(a["num_accepted"], b.num_accepted), label
    if hasattr(b, "accepted_path"):
        assert torch.equal(a["accepted_path"], b.accepted_path), label
    if logprobs and b.logprobs is not None:
        torch.testing.assert_close(a["logprobs"], b.logprobs, rtol=1e-5, atol=1e-5, equal_nan=True, msg=label)


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_every_rank_equals_unsharded_op(world, backend):
    cases, labels = world["eq"]
    for i, (case, label) in enumerate(zip(cases, labels)):
        expected = unsharded(case, backend)
        for rank, per_rank in enumerate(world["results"]):
            _same(per_rank[i], expected, f"{label} rank={rank} backend={backend}")


def test_ranks_agree_bit_for_bit(world):
    cases, _ = world["eq"]
    first = world["results"][0]
    for per_rank in world["results"][1:]:
        for i in range(len(cases)):
            assert torch.equal(per_rank[i]["token_ids"], first[i]["token_ids"])
            assert torch.equal(per_rank[i]["logprobs"].nan_to_num(7.0), first[i]["logprobs"].nan_to_num(7.0))


def test_inconsistent_shards_raise_on_every_rank(world):
    cases, labels = world["eq"]
    bad, bad_labels = world["bad"]
    last = world["world"] - 1
    expected_words = {"gap": "do not tile", "overlap": "do not tile", "vocab_size": "vocab_size differs",
                      "top_k on one rank": "optional arguments", "bad top_p on rank 0": "rank(s) [0] rejected",
                      "junk temperature on the last rank": f"SpecDecArgumentError: rank(s) [{last}] rejected",
                      "logits a list on the last rank": f"SpecDecArgumentError: rank(s) [{last}] rejected",
                      "check_vocab_shards gap": "do not tile"}
    own_error = {("bad top_p on rank 0", 0): "top_p[0] = 1.5 must be in (0, 1]",
                 ("junk temperature on the last rank", last): "Error",
                 ("logits a list on the last rank", last): "local_logits must be a torch.Tensor, got list"}
    for j, label in enumerate(bad_labels):
        for rank, per_rank in enumerate(world["results"]):
            got = per_rank[len(cases) + j]
            assert "error" in got, f"{label}: rank {rank} did not raise"
            words = own_error.get((label, rank), expected_words[label])
            assert words in got["error"], got["error"]
    # The world stays usable after the raises; check_vocab_shards accepts a good tiling.
    expected = unsharded(world["after"][1], "reference")
    for per_rank in world["results"]:
        assert per_rank[-2] == {"checked": True}
        _same(per_rank[-1], expected, "call after the raises")


def test_bytes_sent_do_not_grow_with_vocab(world):
    """V = 41 and V = 4001 with the same B, K and filters send the same bytes: no collective carries a
    vocabulary-sized tensor."""
    for per_rank in world["comm"]:
        small, large = per_rank
        assert small["stats"]["bytes_sent"] == large["stats"]["bytes_sent"] > 0
        assert small["stats"]["collectives"] == large["stats"]["collectives"]


def _processed(logits, temperature, top_k, top_p):
    """§5.7 steps 1-3 by sorting (independent of the code under test), float64."""
    p = torch.softmax(logits.double() / temperature, -1)
    order = torch.argsort(p, descending=True)
    keep = torch.zeros_like(p, dtype=torch.bool)
    keep[order[:top_k]] = True
    p = torch.where(keep, p, 0.0)
    p = p / p.sum()
    sorted_p = p[order]
    mass = torch.cumsum(sorted_p, 0)
    cut = int((mass < top_p).sum())  # the smallest prefix reaching top_p (no ties in STAT_LOGITS' top set)
    keep = torch.zeros_like(keep)
    keep[order[: cut + 1]] = True
    p = torch.where(keep, p, 0.0)
    return p / p.sum()


def test_sharded_sampler_matches_processed_distribution(world):
    """Chi-square (alpha 1e-4, 6000 requests, one emitted token each): after the draft 9 (accepted or
    replaced by the residual race across both shards) the first token is distributed as the processed p."""
    if world["world"] != 2:
        pytest.skip("run on the 2-process world only")
    got = world["stat"][0][0]["token_ids"][:, 0]
    p = _processed(STAT_LOGITS, 0.8, 6, 0.9)
    counts = torch.bincount(got, minlength=p.shape[0]).double()
    support = p > 0
    assert counts[~support].sum() == 0, "a filtered token was emitted"
    expected = p[support] * STAT_REQUESTS
    _, pvalue = scipy.stats.chisquare(counts[support].numpy(), expected.numpy())
    assert pvalue > ALPHA, (counts, expected)


# ---------------------------------------------------------------------------------------------- in-process helpers


def test_philox_keyed_by_global_index_matches_reference():
    """The per-shard Philox equals reference.philox_uniform_rows at the same global ids, for shards
    that start off a multiple of 4, and 64-bit seeds and offsets."""
    g = torch.Generator().manual_seed(3)
    seeds = torch.randint(-2**63, 2**63 - 1, (5,), generator=g)
    offsets = torch.randint(0, 2**62, (5,), generator=g)
    position = torch.tensor([0, 1, 7, 2**31, 3])
    index = torch.arange(13, 71)
    for purpose in (0, 1, 2):
        expected = reference.philox_uniform_rows(seeds, offsets, position, purpose, index)
        got = distributed._philox_uniform(seeds, offsets, position, purpose, index)
        assert torch.equal(got, expected)
    for start, length in ((13, 58), (0, 4), (6, 1), (9, 0)):
        got = distributed._philox_uniform_span(seeds, offsets, position, 1, start, length, "cpu")
        assert torch.equal(got, reference.philox_uniform_rows(seeds, offsets, position, 1,
                                                              torch.arange(start, start + length)))
    purposes = torch.tensor([0, 1, 2, 1, 0])
    got = distributed._philox_uniform(seeds, offsets, position, purposes, index)
    for b in range(5):
        expected = reference.philox_uniform_rows(seeds[b:b + 1], offsets[b:b + 1], position[b:b + 1],
                                                 int(purposes[b]), index)
        assert torch.equal(got[b], expected[0])


def _top_p_key(keys, e, member, top_p):
    """reference.process_row's top-p threshold, on given keys."""
    sorted_keys, order = torch.sort(keys[member], descending=True)
    cum = torch.cumsum(e[member][order].double(), 0)
    last = torch.ones_like(sorted_keys, dtype=torch.bool)
    last[:-1] = sorted_keys[:-1] != sorted_keys[1:]
    reach = last & (cum >= top_p * float(cum[-1]))
    return sorted_keys[reach][0] if bool(reach.any()) else sorted_keys[-1]


def test_radix_select_equals_reference_thresholds():
    """Top-k: the key of the k-th largest z (ties kept); top-p over the top-k survivors: the largest key
    whose mass reaches top_p (top_p 0: the maximum only), with ties, underflowing e and -inf entries."""
    g = torch.Generator().manual_seed(4)
    z = -torch.rand(6, 300, generator=g) * 30
    z[0, :50] = z[0, 0]  # a tie group
    z[1, ::2] = float("-inf")
    z[2, :5] = -200.0  # e underflows to 0, the key still counts
    z[:, 7] = 0.0  # the maximum, e = 1
    keys = distributed._order_key(z)
    assert torch.equal(keys.long(), reference.order_keys(z) - 2**31)  # the kernels' order keys, signed
    e = torch.exp(z)
    k = torch.tensor([1, 5, 17, 50, 299, 3])
    tau_k = distributed._radix_select(keys, rows=6, k=k)
    assert torch.equal(tau_k, torch.stack([torch.topk(keys[r], int(k[r])).values[-1] for r in range(6)]))
    # The CPU path's candidates: each row's top max(k) only, as 1-D entries with their rows.
    cand = torch.topk(keys, int(k.max()), dim=1).values
    row_id = torch.arange(6).repeat_interleave(cand.shape[1])
    assert torch.equal(distributed._radix_select(cand.reshape(-1), rows=6, row_id=row_id, k=k), tau_k)
    survivors = keys >= tau_k[:, None]
    for top_p in (0.0, 0.1, 0.5, 0.9, 0.99):
        p = torch.full((6,), top_p)
        for member in (None, survivors):
            got = distributed._radix_select(keys, rows=6, member=member, mass=e.double(), top_p=p)
            m = torch.ones_like(keys, dtype=torch.bool) if member is None else member
            expected = torch.stack([_top_p_key(keys[r], e[r], m[r], top_p) for r in range(6)])
            assert torch.equal(got, expected), (top_p, member is None)
