"""The n-gram drafter's parts: the matcher (longest match, then the earliest: the tie rule), the length
policies (fixed, by match size, the cost model), the copy-cursor re-ranker, and NGramDrafter composing
them (chain and trie drafts, per-request state). Pure host-side logic: no model needed."""

import pytest
import torch

from specdec_ops.decoding import (ByMatchLength, CopyCursor, CostModel, FixedLength, Match, NGramDrafter,
                                  find_matches)
from specdec_ops.decoding.batch import Batch
from specdec_ops.decoding.drafters import ForwardCost, MatchLengthPrior, NGramRequest, RequestStats
from specdec_ops.decoding.drafters.policies import MAX_SIZE_BUCKET, size_bucket
from specdec_ops.decoding.sampling import request_seeds


def brute_force_matches(tokens, max_n, min_n):
    """Independent definition: every earlier occurrence of the last n tokens for each n, keeping each
    continuation start with its longest n, sorted by (longest, earliest)."""
    best = {}
    for n in range(min_n, max_n + 1):
        if len(tokens) <= n:
            continue
        suffix = tokens[-n:]
        for i in range(len(tokens) - n):
            if tokens[i:i + n] == suffix:
                best[i + n] = max(best.get(i + n, 0), n)
    return sorted(((s, n) for s, n in best.items()), key=lambda x: (-x[1], x[0]))


def test_find_matches_longest_first_then_earliest():
    tokens = [1, 2, 3, 9, 2, 3, 8, 1, 2, 3, 7, 3, 5, 2, 3]
    got = [(m.start, m.size) for m in find_matches(tokens, 3, 1, limit=99)]
    assert got[0] == (3, 2)                 # "2 3" occurred at 1..2 (continuation 3) and 4..5 and 8..9
    assert got == brute_force_matches(tokens, 3, 1)
    assert got == [(3, 2), (6, 2), (10, 2), (12, 1)]
    assert [(m.start, m.size) for m in find_matches(tokens, 3, 2, limit=99)] == [(3, 2), (6, 2), (10, 2)]
    assert len(find_matches(tokens, 3, 1, limit=2)) == 2
    assert find_matches([4], 3) == [] and find_matches([4, 5], 3) == []


@pytest.mark.parametrize("seed", range(20))
def test_find_matches_equals_brute_force_on_random_sequences(seed):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 4, (int(torch.randint(2, 60, (1,), generator=g)),), generator=g).tolist()
    for max_n, min_n in ((3, 1), (4, 2), (1, 1)):
        got = [(m.start, m.size) for m in find_matches(tokens, max_n, min_n, limit=10_000)]
        assert got == brute_force_matches(tokens, max_n, min_n)
        assert all(s < len(tokens) for s, _ in got)          # never an empty continuation


def test_fixed_and_by_match_length():
    stats = [RequestStats() for _ in range(3)]
    assert FixedLength().lengths(stats, [1, 2, 3], [5, 2, 9], 4) == [4, 2, 4]
    policy = ByMatchLength((0, 2, 5))
    assert policy.lengths(stats, [1, 2, 3], [9, 9, 9], 4) == [0, 2, 4]
    assert policy.lengths(stats, [0, 7, 3], [9, 9, 1], 8) == [0, 5, 1]      # no match; longer than the table
    for bad in ((), (-1,), (1.5, 2), "ab", None):
        with pytest.raises(ValueError, match="table"):
            ByMatchLength(bad)


def test_request_stats_record_positions_reached_and_rejected():
    stats = RequestStats()
    stats.record(match_size=3, drafted=5, accepted=2)     # positions 1, 2 accepted, 3 rejected
    assert stats.reached[2][:3] == [1, 2, 0] and stats.rejected[2][:3] == [0, 1, 0]   # bins 1 | 2-3 | 4-7
    stats.record(match_size=1, drafted=4, accepted=4)     # all accepted: reached 1..4, nothing rejected
    assert stats.reached[1][:3] == [1, 2, 1] and sum(stats.rejected[1]) == 0
    stats.record(match_size=2, drafted=1, accepted=0)     # sizes 2 and 3 share bucket 2
    assert stats.reached[2][0] == 2 and stats.rejected[2][0] == 1
    stats.record(match_size=40, drafted=1, accepted=0)    # 32 and longer share the last bucket
    assert stats.reached[MAX_SIZE_BUCKET][0] == 1 and stats.rejected[MAX_SIZE_BUCKET][0] == 1


def test_size_bucket_edges():
    expected = {0: 0, 1: 1, 2: 2, 3: 2, 4: 3, 7: 3, 8: 4, 15: 4, 16: 5, 31: 5, 32: 6, 33: 6, 1000: 6}
    assert {m: size_bucket(m) for m in expected} == expected


def test_match_length_prior_values_and_cost_model_table():
    prior = MatchLengthPrior(first=0.8, first_ratio=0.5, later=0.3, later_ratio=0.65)
    assert prior(1, 0) == pytest.approx(0.8) and prior(2, 0) == pytest.approx(0.4) and prior(4, 0) == pytest.approx(0.1)
    assert prior(1, 1) == pytest.approx(0.3) and prior(3, 5) == pytest.approx(0.3 * 0.65 ** 2)
    cost = CostModel((10.0, 1.0), prior_hazard=prior, prior_weight=2.0, optimism=0.0, decay=1.0)
    fresh = RequestStats()
    # no evidence: the hazards are the prior's for the match's size bucket
    assert cost.hazards(fresh, 1)[:3] == pytest.approx([0.8, 0.3, 0.3])
    assert cost.hazards(fresh, 5)[:3] == pytest.approx([0.2, 0.3 * 0.65 ** 2, 0.3 * 0.65 ** 2])   # 5: bucket 3
    # a longer match drafts longer from the same (empty) evidence
    short, long = (cost.lengths([fresh], [m], [32], 32)[0] for m in (2, 16))
    assert short < long
    for bad in (dict(first=1.0), dict(first=0.0), dict(later=-0.1), dict(first_ratio=0.0), dict(later_ratio=1.5),
                dict(first=True)):
        with pytest.raises(ValueError, match="MatchLengthPrior"):
            MatchLengthPrior(**bad)
    with pytest.raises(ValueError, match="prior_hazard"):
        CostModel((1, 1), prior_hazard=lambda bucket, position: 1.0)
    with pytest.raises(ValueError, match="prior_hazard"):
        CostModel((1, 1), prior_hazard="0.5")


def test_cost_model_pool_sizes():
    """pool_sizes=False: a request's rejections from short matches do not raise its long matches' hazard."""
    stats = RequestStats()
    for _ in range(10):
        stats.record(1, 4, 0)                              # one-token matches: rejected at once
    pooled = CostModel((10.0, 1.0), prior_hazard=0.3, optimism=0.0, decay=1.0)
    apart = CostModel((10.0, 1.0), prior_hazard=0.3, optimism=0.0, decay=1.0, pool_sizes=False)
    assert pooled.hazards(stats, 8)[0] > 0.5                # the request's pooled hazard pulls size 8 up
    assert apart.hazards(stats, 8)[0] == pytest.approx(0.3)  # only this size's evidence and the prior
    assert apart.hazards(stats, 1)[0] == pytest.approx((10 + 2 * 0.3) / (10 + 2))


def brute_force_best_width(survive, available, fixed, per_token):
    """argmax_c sum_b (1 + sum_{j <= min(avail_b, c)} prod_{i <= j} s_b(i)) / (fixed + per_token B (c + 1))."""
    best, width = -1.0, 0
    for c in range(max(available) + 1):
        gain = 0.0
        for s, a in zip(survive, available):
            run, total = 1.0, 1.0
            for j in range(1, min(a, c) + 1):
                run *= s(j)
                total += run
            gain += total
        value = gain / (fixed + per_token * len(available) * (c + 1))
        if value > best + 1e-12:
            best, width = value, c
    return width


def test_cost_model_drafts_long_after_acceptance_nothing_after_rejection():
    cost = CostModel((10.0, 1.0), prior_hazard=0.3, prior_weight=1.0, optimism=0.0, decay=1.0)
    fresh = RequestStats()
    prior = cost.lengths([fresh], [3], [32], 32)[0]
    assert prior == brute_force_best_width([lambda j: 0.7], [32], 10.0, 1.0)
    good, bad = RequestStats(), RequestStats()
    for _ in range(20):
        good.record(3, 32, 32)                             # every 32-token draft accepted
        bad.record(1, 4, 0)                                # every one-token-match draft rejected at once
    assert cost.lengths([good], [3], [32], 32) == [32]
    assert cost.lengths([bad], [1], [32], 32) == [0]
    assert cost.lengths([good], [3], [7], 32) == [7]       # never more than available
    assert cost.lengths([good], [0], [32], 32) == [0]      # no match: nothing
    # the expected-tokens curve is 1 + sum of survival products of the smoothed hazards
    e = cost.expected_tokens(good, 3, 4)
    h = cost.hazards(good, 3)
    assert e[0] == 1.0 and e[2] == pytest.approx(1 + (1 - h[0]) + (1 - h[0]) * (1 - h[1]))
    # a batch shares the widest draft's cost: one request's long draft is cut when the others gain nothing
    batch = [good] + [bad] * 7
    width = cost.lengths(batch, [3] + [1] * 7, [32] * 8, 32)
    survive_good = lambda j: 1 - h[j.bit_length() - 1]   # noqa: E731
    hb = cost.hazards(bad, 1)
    survive_bad = lambda j: 1 - hb[min(j.bit_length() - 1, 7)]   # noqa: E731
    expected = brute_force_best_width([survive_good] + [survive_bad] * 7, [32] * 8, 10.0, 1.0)
    assert width == [expected] * 8 and expected < 32
    for bad_cost in ((0, 1), (1, -1), (1,), "x", (True, 1)):
        with pytest.raises(ValueError, match="forward_cost"):
            CostModel(bad_cost)
    with pytest.raises(ValueError, match="prior_hazard"):
        CostModel((1, 1), prior_hazard=1.0)


def make_batch(prompts, max_new_tokens=32):
    return Batch(prompts, max_new_tokens, set(), request_seeds(0, len(prompts), "cpu"), 128, torch.device("cpu"))


def emit(batch, tokens):
    """Append `tokens` to request 0 (what the loop's emit does)."""
    batch.emit(torch.tensor([tokens]), torch.tensor([len(tokens) - 1], dtype=torch.int32))


def test_ngram_defaults_are_classic_prompt_lookup():
    """NGramDrafter(n=3, k=None): the best match (longest, then earliest) drafts k tokens of its continuation."""
    seq = [7, 8, 9, 1, 2, 3, 4, 5, 40, 7, 8, 9, 6, 6, 8, 9]
    batch = make_batch([seq, [5, 6], [1, 2, 1]])
    draft = NGramDrafter().propose(batch, 4, None, None)
    assert draft.chain and draft.num_nodes.tolist() == [5, 1, 3]
    assert draft.tokens[0].tolist() == [9, 1, 2, 3, 4]     # "8 9" at 1..2 (earliest of two 2-gram matches)
    assert draft.tokens[2, :3].tolist() == [1, 2, 1]       # a one-token match: the 2 tokens left after it
    assert NGramDrafter(k=1).propose(batch, 4, None, None).num_nodes.tolist() == [2, 1, 2]
    capped = make_batch([seq], max_new_tokens=3)           # 3 more tokens at most: 2 drafts + 1
    assert NGramDrafter().propose(capped, 8, None, None).num_nodes.tolist() == [3]


def test_ngram_trie_merges_matches_best_first():
    seq = [7, 8, 9, 1, 2, 3, 4, 5, 40, 9, 50, 51, 52, 7, 8, 9]    # (7,8,9) -> 1 2 3 4 ..; (9) -> 50 51 ..
    draft = NGramDrafter(length=ByMatchLength((1, 2, 3))).propose(make_batch([seq]), 8, 16, None)
    assert not draft.chain and draft.num_nodes.tolist() == [1 + 3 + 1]
    assert draft.tokens[0, 1:5].tolist() == [1, 2, 3, 50] and draft.parents[0, :5].tolist() == [-1, 0, 1, 2, 0]
    small = NGramDrafter().propose(make_batch([seq]), 8, 3, None)   # the budget caps the nodes
    assert small.num_nodes.tolist() == [4]


def test_copy_cursor_prefers_the_match_that_resumes_the_copied_text():
    """After the output replaced a token of the text it copies, the match resuming right behind the cursor
    beats the earliest match; commit moves the cursor behind the last accepted token's source."""
    source = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19]               # positions 5 .. 14
    seq = [14, 60, 61, 62, 63] + source + [10, 11, 12, 40, 14]       # copied 10 11 12, replaced 13 by 40, then 14
    plain = NGramDrafter(k=3)
    assert plain.propose(make_batch([seq]), 5, None, None).tokens[0, 1:].tolist() == [60, 61, 62]  # earliest
    drafter = NGramDrafter(k=3, rerank=[CopyCursor(4)])
    batch = make_batch([seq])
    drafter.reset(batch, 64, 100)
    drafter.requests[0].cursor = 8                                   # the copy stopped matching at 13 (position 8)
    draft = drafter.propose(batch, 5, None, None)
    assert draft.tokens[0, 1:].tolist() == [15, 16, 17]              # resumes at position 10
    drafter.commit(torch.tensor([[0, 1, 2, -1]]), torch.tensor([2], dtype=torch.int32))
    assert drafter.requests[0].cursor == 12                          # 15 16 accepted: next source token is 17
    drafter.commit(torch.tensor([[0, -1, -1, -1]]), torch.tensor([0], dtype=torch.int32))
    assert drafter.requests[0].cursor == 10                          # none accepted: the continuation's start
    far = NGramDrafter(k=3, rerank=[CopyCursor(1)])
    far.reset(batch, 64, 100)
    far.requests[0].cursor = 8                                       # position 10 is outside the window
    assert far.propose(batch, 5, None, None).tokens[0, 1:].tolist() == [60, 61, 62]
    tree = drafter.propose(batch, 5, 8, None)                        # the trie puts the resumed match first
    assert tree.tokens[0, 1:4].tolist() == [15, 16, 17]
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="window"):
            CopyCursor(bad)


def test_ngram_state_is_per_request_and_follows_keep():
    batch = make_batch([[1, 2, 3, 1, 2], [5, 6, 5], [9, 9]])
    drafter = NGramDrafter(length=ByMatchLength((3,)))
    drafter.reset(batch, 64, 100)
    assert drafter.propose(batch, 4, None, None).num_nodes.tolist() == [4, 3, 2]
    drafter.commit(torch.tensor([[0, 1, -1, -1], [0, -1, -1, -1], [0, -1, -1, -1]]),
                   torch.tensor([1, 0, 0], dtype=torch.int32))
    assert all(isinstance(r, NGramRequest) for r in drafter.requests)
    first = drafter.requests[0]
    assert sum(first.stats.reached[2]) == 2 and sum(first.stats.rejected[2]) == 1   # 2-gram match, 1 of 3 accepted
    drafter.keep(torch.tensor([0, 2]))
    assert len(drafter.requests) == 2 and drafter.requests[0] is first


def test_ngram_argument_errors_name_the_argument():
    for kwargs, name in ((dict(n=0), "n must"), (dict(k=0), "k must"), (dict(min_n=4), "min_n"),
                         (dict(length=3), "length"), (dict(rerank=[1]), "rerank"), (dict(max_matches=0),
                                                                                  "max_matches")):
        with pytest.raises(ValueError, match=name):
            NGramDrafter(**kwargs)
    assert Match(3, 2).start == 3


def test_cost_model_uses_measured_costs_between_points():
    """A measured table: linear between points, extended past the last one; a width whose forward costs much
    more per token (here 2 tokens, nearly two forwards) is skipped for a wider one worth its cost."""
    cost = CostModel({1: 10.0, 2: 20.0, 3: 25.0, 4: 26.0, 8: 28.0}, optimism=0.0, decay=1.0)
    assert cost.cost(1) == 10.0 and cost.cost(6) == pytest.approx(27.0) and cost.cost(16) == pytest.approx(32.0)
    good = RequestStats()
    for _ in range(20):
        good.record(3, 3, 2)           # two of three accepted: the third position is often rejected
    lengths = {a: cost.lengths([good], [3], [a], 32)[0] for a in (1, 2, 3)}
    assert lengths[1] == 0 and lengths[3] == 3     # one draft costs 2x a forward, two 2.5x; three cost 2.6x, emit ~2.7
    with pytest.raises(ValueError, match="forward_cost"):
        CostModel({0: 1.0})
    with pytest.raises(ValueError, match="forward_cost"):
        CostModel({1: -1.0})


def test_cost_model_hazards_are_optimistic_where_evidence_is_thin():
    """Optimistic hazards are h - optimism * sqrt(h (1 - h) / (n + w)), h the smoothed hazard, n the drafts
    that reached the bin: the bonus shrinks as evidence grows. They are used only to explore: where the
    estimates find no draft worth its cost, a short draft (what the cheapest window for one token holds:
    4 nodes here, as on a CPU) is tried when it is worth its cost optimistically."""
    table = {1: 1.0, 2: 1.9, 3: 2.2, 4: 1.6, 8: 2.0, 17: 2.8}
    policy = CostModel(table, prior_hazard=0.5, prior_weight=2.0, optimism=0.5, decay=1.0)
    fresh = RequestStats()
    assert policy.hazards(fresh, 2)[0] == pytest.approx(0.5)
    assert policy.hazards(fresh, 2, optimistic=True)[0] == pytest.approx(0.5 - 0.5 * (0.25 / 2.0) ** 0.5)
    assert policy.hazards(fresh, 2)[1] == pytest.approx(0.5 - 0.5 * (0.25 / 2.0) ** 0.5)   # deeper: always
    seen = RequestStats()
    for _ in range(6):
        seen.record(2, 1, 0)                      # six one-token drafts, all rejected: bin 0 reached 6 times
    pooled = (6 + 2 * 0.5) / (6 + 2)
    h = (6 + 2 * pooled) / (6 + 2)
    assert policy.hazards(seen, 2)[0] == pytest.approx(h)
    assert policy.hazards(seen, 2, optimistic=True)[0] == pytest.approx(h - 0.5 * (h * (1 - h) / 8) ** 0.5)
    doubtful = CostModel(table, prior_hazard=0.65, optimism=0.5)
    mean_only = CostModel(table, prior_hazard=0.65, optimism=0.0)
    assert mean_only.lengths([fresh], [2], [16], 16) == [0]
    assert doubtful.lengths([fresh], [2], [16], 16) == [3]          # explores with the 4-node window's 3 tokens
    assert doubtful.lengths([fresh], [2], [2], 16) == [2]
    assert CostModel(table, prior_hazard=0.95).lengths([fresh], [2], [16], 16) == [0]   # not worth it even so
    for kwargs, name in ((dict(optimism=-1.0), "optimism"), (dict(decay=0.0), "decay"), (dict(decay=1.5), "decay"),
                         (dict(shared_decay=0.0), "shared_decay")):
        with pytest.raises(ValueError, match=name):
            CostModel((1, 1), **kwargs)


def run_policy(policy, steps, accept):
    """Drive a policy as NGramDrafter does, one request with a 2-token match every step: lengths, then
    observe (every step, drafted 0 included). ``accept(step, drafted)`` says how many drafts are accepted.
    Returns the lengths drafted per step."""
    stats, drafted = RequestStats(), []
    for step in range(steps):
        n = policy.lengths([stats], [2], [16], 16)[0]
        policy.observe(stats, 2, n, accept(step, n) if n else 0)
        drafted.append(n)
    return drafted


def test_cost_model_drafts_again_after_early_rejections():
    """Rejections early on stop drafting for a while, not for good: the evidence fades while the request
    does not draft, and the optimistic hazard lets it try again; once drafts are accepted it drafts long.
    A policy that never drafts again after a run of rejections (no decay, no optimism) fails this."""
    policy = CostModel({1: 1.0, 4: 1.6, 8: 2.0, 17: 2.8}, prior_hazard=0.5)
    drafted = run_policy(policy, 200, lambda step, n: 0 if step < 40 else n)   # the text turns copyable at 40
    assert drafted[0] > 0                                       # a fresh request explores
    assert any(n == 0 for n in drafted[:40])                    # rejections stop it ...
    assert sum(n > 0 for n in drafted[:40]) < 20
    assert any(n > 0 for n in drafted[40:100])                  # ... for a while only
    assert all(n >= 12 for n in drafted[150:])                  # accepted drafts: long ones
    locked = CostModel({1: 1.0, 4: 1.6, 8: 2.0, 17: 2.8}, prior_hazard=0.5, optimism=0.0, decay=1.0,
                       shared_decay=1.0)
    assert not any(run_policy(locked, 200, lambda step, n: 0 if step < 40 else n)[40:])


def test_cost_model_keeps_drafting_costs_low_where_nothing_is_accepted():
    """Exploration is bounded: with every draft rejected, at most about one step in eight drafts."""
    policy = CostModel({1: 1.0, 4: 1.6, 8: 2.0, 17: 2.8}, prior_hazard=0.5)
    drafted = run_policy(policy, 400, lambda step, n: 0)
    assert sum(n > 0 for n in drafted[50:]) <= 350 / 8


def test_forward_cost_follows_the_loops_timings():
    """A start-up table that is wrong (4 tokens timed at 10x during a load spike) is outvoted once the loop
    has timed that width min_samples times; untimed points follow the load seen on timed ones."""
    cost = ForwardCost({1: 1.0, 4: 10.0, 8: 2.0}, window=4, min_samples=3)
    assert cost(4) == pytest.approx(4.0)                   # never more than 4 one-token forwards
    assert cost(2) == pytest.approx(2.0) and cost(6) == pytest.approx(3.0)   # between 4 (capped) and 8
    for _ in range(3):
        cost.observe(4, 1.5)
    assert cost(4) == pytest.approx(1.5)
    busy = ForwardCost({1: 1.0, 2: 1.2, 8: 2.0})
    for _ in range(5):
        busy.observe(1, 2.0)                               # the machine got twice as slow
    assert busy(1) == pytest.approx(2.0) and busy(8) == pytest.approx(4.0) and busy(2) == pytest.approx(2.4)
    cost.observe(4, 0.0)                                   # ignored
    assert len(cost.samples[4]) == 3
    for kwargs in (dict(window=0), dict(min_samples=0), dict(window=2, min_samples=3)):
        with pytest.raises(ValueError, match="window|min_samples"):
            ForwardCost({1: 1.0}, **kwargs)


def test_forward_cost_pads_to_a_cheaper_wider_window():
    """On a CPU 2-3 tokens cost more than 4: a 1-token draft is verified in a 4-token window, whose cost the
    policy then uses for widths 2 and 3."""
    cost = ForwardCost({1: 13.0, 2: 25.0, 3: 27.0, 4: 20.0, 8: 30.0})
    assert cost.cheapest(1, 1) == (1, 13.0)
    assert cost.cheapest(1, 2) == (4, 20.0) and cost.cheapest(1, 3) == (4, 20.0) and cost.cheapest(1, 4) == (4, 20.0)
    assert cost.cheapest(1, 5) == (5, pytest.approx(22.5))
    assert cost.cheapest(2, 2) == (2, 20.0)                # two requests of 2 nodes: a 4-token forward
    assert cost.cheapest(2, 1) == (2, 20.0)                # 2 x 1 tokens cost more than 2 x 2
    # never past the loop's window (`limit`: 1 + k, what its KV cache holds): the cheapest within it
    assert cost.cheapest(1, 2, 4) == (4, 20.0) and cost.cheapest(1, 2, 3) == (2, 25.0)
    assert cost.cheapest(1, 3, 2) == (3, 27.0)             # a limit below the width pads nothing
    policy = CostModel(cost)
    assert policy.padded_width(2, 1) == 4 and policy.padded_width(6, 1) == 6
    assert policy.padded_width(2, 1, 3) == 2 and policy.padded_width(2, 1, 4) == 4
    batch = make_batch([[5, 6, 7, 5]])                     # "5" matched at 0: continuation 6 7 5 (3 tokens)
    draft = NGramDrafter(length=policy).propose(batch, 3, None, None)   # k = 3: the whole continuation
    assert draft.tokens.shape == (1, 4) and draft.num_nodes.tolist() == [4] and draft.tokens[0].tolist() == [5, 6, 7, 5]
    for k in (1, 2):  # a window of 1 + k at most: 2 or 3 tokens cost more than nothing, so no draft
        draft = NGramDrafter(length=policy).propose(batch, k, None, None)
        assert draft.tokens.shape[1] <= 1 + k and draft.num_nodes.tolist() == [1]


def test_ngram_drafts_stop_before_end_of_sequence():
    """Tokens after an EOS are never emitted: a continuation is cut before the first EOS (chain and trie)."""
    seq = [7, 8, 1, 2, 99, 3, 4, 7, 8]
    batch = Batch([seq], 32, {99}, request_seeds(0, 1, "cpu"), 128, torch.device("cpu"))
    draft = NGramDrafter().propose(batch, 6, None, None)
    assert draft.num_nodes.tolist() == [3] and draft.tokens[0].tolist() == [8, 1, 2]
    trie = NGramDrafter().propose(batch, 6, 8, None)
    assert trie.num_nodes.tolist() == [3] and trie.tokens[0, :3].tolist() == [8, 1, 2]
    assert NGramDrafter().propose(make_batch([seq]), 6, None, None).num_nodes.tolist() == [7]   # no EOS set


class RecordingPolicy(FixedLength):
    def __init__(self):
        self.forwards, self.observed = [], []

    def observe(self, stats, match_size, drafted, accepted):
        self.observed.append((match_size, drafted, accepted))

    def observe_forward(self, tokens, seconds):
        self.forwards.append((tokens, seconds))


def test_ngram_feeds_the_policy_every_step_and_the_verify_time():
    """commit() reports every request every step (drafted 0 too: the cost model's evidence fades then) and
    the wall time since propose() for the forward's tokens."""
    batch = make_batch([[1, 2, 3, 1, 2], [5, 6]])
    policy = RecordingPolicy()
    drafter = NGramDrafter(length=policy)
    drafter.reset(batch, 64, 100)
    draft = drafter.propose(batch, 2, None, None)
    assert draft.num_nodes.tolist() == [3, 1]
    drafter.commit(torch.tensor([[0, 1, -1], [0, -1, -1]]), torch.tensor([1, 0], dtype=torch.int32))
    assert policy.observed == [(2, 2, 1), (0, 0, 0)]
    assert len(policy.forwards) == 1 and policy.forwards[0][0] == 6 and policy.forwards[0][1] > 0
    drafter.commit(torch.tensor([[0, -1, -1], [0, -1, -1]]), torch.tensor([0, 0], dtype=torch.int32))
    assert len(policy.forwards) == 1                      # one timing per proposal
