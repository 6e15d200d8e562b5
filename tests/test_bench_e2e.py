"""bench/bench_e2e.py's ceiling drafters (--ceiling) on a tiny random-weight HF Llama model.

Proves: the perfect drafter (ReplayDrafter) reproduces plain greedy decoding token for token with every
draft accepted and one verify forward per window of 1 + k tokens; the perfect copier drafts only the
longest start of the true continuation found in the request's tokens (``longest_copy``, checked against
a brute-force search over every substring), the perfect prompt lookup only the longest one that follows an
earlier occurrence of the last token (``longest_match_continuation``, against every n-gram match's
continuation); the drafts are as long as the cost table makes worth most.
"""

import os
import random
import sys

import pytest

pytest.importorskip("transformers")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from bench_e2e import ReplayDrafter, longest_copy, longest_match_continuation  # noqa: E402

from specdec_ops.decoding import ForwardCost, SpeculativeDecoder  # noqa: E402
from test_decoding import reference_greedy as greedy, tiny_llama  # noqa: E402


@pytest.fixture(scope="module")
def target():
    return tiny_llama(2, seed=0)


def brute_force_copy(tokens, cont):
    subs = {()} | {tuple(tokens[i:j]) for i in range(len(tokens)) for j in range(i + 1, len(tokens) + 1)}
    return max(n for n in range(len(cont) + 1) if tuple(cont[:n]) in subs)


def test_longest_copy_equals_a_brute_force_search():
    rng = random.Random(0)
    for _ in range(300):
        tokens = [rng.randrange(4) for _ in range(rng.randrange(0, 12))]
        cont = [rng.randrange(4) for _ in range(rng.randrange(0, 8))]
        assert longest_copy(tokens, cont) == brute_force_copy(tokens, cont), (tokens, cont)
    assert longest_copy([1, 2, 3, 9, 1, 2], [1, 2, 3, 4]) == 3      # a longer run later in cont than the tail
    assert longest_copy([7, 7], [7, 7, 7]) == 2                       # never past the end of the tokens


def brute_force_match(tokens, cont):
    """Longest start of cont equal to the continuation of some n-gram match (n >= 1) of tokens' suffix."""
    best = 0
    for n in range(1, len(tokens)):
        for end in range(n - 1, len(tokens) - 1):
            if tokens[end - n + 1:end + 1] == tokens[len(tokens) - n:]:
                follow = tokens[end + 1:]
                best = max(best, max(i for i in range(len(cont) + 1) if cont[:i] == follow[:i]))
    return best


def test_longest_match_continuation_equals_every_ngram_matchs_continuation():
    rng = random.Random(1)
    for _ in range(300):
        tokens = [rng.randrange(3) for _ in range(rng.randrange(0, 12))]
        cont = [rng.randrange(3) for _ in range(rng.randrange(0, 8))]
        got = longest_match_continuation(tokens, cont)
        assert got == brute_force_match(tokens, cont), (tokens, cont)
        assert got <= longest_copy(tokens, cont)
    # the run [2, 3] occurs in the tokens, but not after an occurrence of the last token 9
    assert longest_match_continuation([1, 2, 3, 4, 9], [2, 3]) == 0 and longest_copy([1, 2, 3, 4, 9], [2, 3]) == 2
    assert longest_match_continuation([9, 2, 3, 4, 9], [2, 3, 5]) == 2
    assert longest_match_continuation([9, 9], [9, 9, 9]) == 1       # never past the end of the tokens


def test_perfect_drafter_reproduces_greedy_with_every_draft_accepted(target):
    prompt, new, k = [3, 9, 14, 2, 9, 14], 40, 8
    expected = greedy(target, prompt, new)
    drafter = ReplayDrafter(ForwardCost({1: 1.0, 9: 1.0}))       # wider windows cost no more: always k
    drafter.reference = (prompt, expected)
    out = SpeculativeDecoder(target, drafter, num_speculative_tokens=k).generate([prompt], max_new_tokens=new)
    assert out.sequences[0] == expected
    assert out.stats.accepted_tokens == out.stats.draft_tokens > 0
    # the prefill emits one token, then every forward 1 + k until fewer are left
    assert out.stats.target_forwards == -(-(new - 1) // (k + 1))


def test_perfect_drafter_drafts_the_length_worth_most(target):
    prompt, new, k = [3, 9, 14, 2], 30, 8
    expected = greedy(target, prompt, new)
    # tokens per cost: 1 / 1.0, 2 / 1.1, 3 / 3.0 ... : two-token windows (one draft) are worth most
    drafter = ReplayDrafter(ForwardCost({1: 1.0, 2: 1.1, 3: 3.0, 9: 27.0}))
    drafter.reference = (prompt, expected)
    out = SpeculativeDecoder(target, drafter, num_speculative_tokens=k).generate([prompt], max_new_tokens=new)
    assert out.sequences[0] == expected
    assert out.stats.target_forwards == -(-(new - 1) // 2)                # one draft token per forward,
    assert out.stats.draft_tokens == (new - 1) // 2                      # none in the last


@pytest.mark.parametrize("mode, brute_force", [("copy_only", brute_force_copy), ("match_only", brute_force_match)],
                         ids=["copier: what the context holds", "prompt lookup: what follows a match"])
def test_ceiling_drafters_draft_only_what_they_may(target, mode, brute_force):
    prompt, new, k = [5, 6, 7, 8, 10, 11, 12, 13, 14, 15], 30, 8
    expected = greedy(target, prompt, new)
    drafter = ReplayDrafter(ForwardCost({1: 1.0, 9: 1.0}), **{mode: True})
    drafter.reference = (prompt, expected)
    proposed = []
    propose = drafter.propose

    def record(batch, k, tree, sampling):
        draft = propose(batch, k, tree, sampling)
        history = list(batch.history[0])
        done = len(history) - len(prompt)
        proposed.append((history, int(draft.num_nodes[0]) - 1, expected[done:done + k]))
        return draft

    drafter.propose = record
    out = SpeculativeDecoder(target, drafter, num_speculative_tokens=k).generate([prompt], max_new_tokens=new)
    assert out.sequences[0] == expected
    assert out.stats.accepted_tokens == out.stats.draft_tokens
    for history, n, cont in proposed:
        remaining = new - (len(history) - len(prompt))
        assert n == min(brute_force(history, cont), max(remaining - 1, 0))


def test_ceiling_modes_exclude_each_other():
    with pytest.raises(ValueError, match="exclude"):
        ReplayDrafter(ForwardCost({1: 1.0}), copy_only=True, match_only=True)
