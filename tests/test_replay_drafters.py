"""bench/replay_drafters.py: the decode loop replayed against plain greedy decoding's tokens.

Proves: the replay's verify forwards and tokens equal SpeculativeDecoder's on a tiny random-weight HF
Llama for drafters whose choices do not depend on timings (classic prompt lookup, a length table with the
copy cursor); the accepted path is the longest start of the draft equal to the true continuation, in a
chain and in a tree (a second sibling taken after the first is wrong); the hazard table counts positions
reached and rejections as defined; the ceilings bound the replayed drafters on a synthetic prompt set.
"""

import os
import sys

import pytest

pytest.importorskip("transformers")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from replay_drafters import accepted_path, hazards, replay, run_all, summarize  # noqa: E402

from specdec_ops.decoding import ByMatchLength, CopyCursor, ForwardCost, NGramDrafter, SpeculativeDecoder  # noqa: E402
from test_decoding import reference_greedy as greedy, tiny_llama  # noqa: E402


@pytest.fixture(scope="module")
def target():
    return tiny_llama(2, seed=0)


@pytest.mark.parametrize("make, k", [(lambda: NGramDrafter(n=3, k=4), 4),
                                     (lambda: NGramDrafter(n=2, length=ByMatchLength((1, 3, 6)),
                                                           rerank=[CopyCursor(4)]), 6)])
def test_replay_counts_the_forwards_the_decoder_runs(target, make, k):
    for prompt in ([3, 9, 14, 2, 9, 14, 3, 9], [5, 6, 7, 5, 6, 7, 5, 6, 8, 1]):
        new = 40
        expected = greedy(target, prompt, new)
        out = SpeculativeDecoder(target, make(), num_speculative_tokens=k).generate([prompt], max_new_tokens=new,
                                                                                    eos_token_id=[])
        assert out.sequences[0] == expected
        replayed = replay(make(), prompt, expected, ForwardCost({1: 1.0, 8: 2.0}), k, set())
        assert replayed["tokens"] == len(expected)
        assert replayed["forwards"] == out.stats.target_forwards
        assert out.stats.accepted_tokens > 0                  # the case drafts something that is accepted


def test_accepted_path_chain_and_tree():
    # chain: root, then drafts 5, 6, 7; the truth diverges at the third draft
    assert accepted_path([0, 5, 6, 7], None, 4, [5, 6, 9, 1]) == [0, 1, 2]
    assert accepted_path([0, 5, 6, 7], None, 4, [5, 6, 7, 1]) == [0, 1, 2, 3]     # all accepted
    assert accepted_path([0, 5, 6, 7], None, 4, [4]) == [0]                       # first draft wrong
    assert accepted_path([0, 5, 6, 7], None, 3, [5, 6, 7]) == [0, 1, 2]           # node 3 is padding
    assert accepted_path([0, 5, 6, 7], None, 4, [5]) == [0, 1]                    # the truth ends first
    # tree: root -> 5 (1), root -> 8 (2), 8 -> 9 (3), 5 -> 9 (4): the second sibling after the first is wrong
    tokens, parents = [0, 5, 8, 9, 9], [-1, 0, 0, 2, 1]
    assert accepted_path(tokens, parents, 5, [8, 9, 4]) == [0, 2, 3]
    assert accepted_path(tokens, parents, 5, [5, 9, 4]) == [0, 1, 4]
    assert accepted_path(tokens, parents, 4, [5, 9, 4]) == [0, 1]                  # node 4 is padding
    assert accepted_path(tokens, parents, 5, [7]) == [0]


def test_hazards_count_reached_and_rejected():
    # tokens 0 1 2 3 4 1 2 | 3 4 9 (prompt | generated; the first generated token is the prefill's).
    # t = 8, known ..1 2 3: longest match 1 2 3 (size 3, bucket 2) continues 4 1 against the truth 4 9:
    #   position 1 reached and accepted, position 2 reached and rejected
    # t = 9, known ..1 2 3 4: longest match 1 2 3 4 (size 4, bucket 3) continues 1 against 9: rejected
    tune = {"split": "tune", "ids": [0, 1, 2, 3, 4, 1, 2], "generated": [3, 4, 9]}
    refs = {"prompts": [tune, {**tune, "split": "heldout"}]}
    table = hazards(refs)
    assert table == {"2,0": {"reached": 1, "rejected": 0, "rate": 0.0},
                     "2,1": {"reached": 1, "rejected": 1, "rate": 1.0},
                     "3,0": {"reached": 1, "rejected": 1, "rate": 1.0}}   # the held-out copy is not counted


def test_ceilings_bound_the_drafters_on_a_synthetic_set():
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 9, 9, 4, 5, 6]
    generated = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 9, 10, 11, 1, 2, 3, 4, 5]
    refs = {"eos": None, "prompts": [
        {"set": "s", "category": c, "split": "tune", "ids": prompt, "generated": generated}
        for c in ("rewrite", "open")]}
    cost = {1: 1.0, 4: 1.2, 8: 1.5, 16: 2.0, 32: 3.0}
    names = ["lookup", "ngram", "n3", "default", "match", "copy", "oracle"]
    rows = run_all(refs, cost, names, fresh=True, step_overhead=0.0)
    forwards = {r["method"]: r["forwards"] for r in rows if r["category"] == "rewrite"}
    assert forwards["plain"] == len(generated) - 1
    assert forwards["oracle"] <= forwards["copy"] <= forwards["match"]
    assert forwards["match"] <= min(forwards[m] for m in ("lookup", "ngram", "n3", "default"))
    assert all(r["tokens"] == len(generated) for r in rows)
    summary = summarize(rows, names)["s"]
    assert summary["rewrite"]["plain"]["vs_plain"] == 1.0 and summary["rewrite"]["lookup"]["vs_lookup"] == 1.0
    assert summary["grounded"]["oracle"]["vs_plain"] >= summary["grounded"]["copy"]["vs_plain"] > 1.0
