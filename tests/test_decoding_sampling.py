"""Sampling in the decode loop (DESIGN.md §5.6 / §5.7).

Proves: ``process_probs`` equals an independent brute-force definition of the processed distribution
(temperature, top-k, top-p, min-p in that order, ties kept at the boundaries, per-request parameters,
NaN logits, rows without a finite logit, greedy rows); speculative sampling with several sampled draft
positions per step is distributed as the target's sampling (chi-square over the joint of five tokens,
alpha = 1e-4, sample counts in each test), and the same test fails when the drafter reuses the
verifier's random numbers or position 0's numbers at every draft position; mixed greedy and sampled
requests in one batch; logprobs; argument errors name the argument.
"""

import math

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("scipy")
from scipy.stats import chisquare  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from specdec_ops.decoding import ModelDrafter, SpeculativeDecoder  # noqa: E402
from specdec_ops.decoding import sampling as sampling_mod  # noqa: E402
from specdec_ops.decoding.sampling import SamplingParams, process_probs  # noqa: E402

ALPHA = 1e-4


def brute_force(logits, temperature, top_k, top_p, min_p):
    """§5.7 for one row, written from the definition with Python floats (float64) and explicit loops."""
    values = [(-math.inf if math.isnan(x) else float(x)) for x in logits]
    if temperature == 0:
        best = max(range(len(values)), key=lambda i: (values[i], -i))
        return [1.0 if i == best else 0.0 for i in range(len(values))] if math.isfinite(values[best]) else \
            [0.0] * len(values)
    top = max(values)
    if not math.isfinite(top):
        return [0.0] * len(values)
    e = [math.exp(x / temperature - top / temperature) if math.isfinite(x) else 0.0 for x in values]
    p = [x / sum(e) for x in e]

    def renorm(keep):
        kept = [x if k else 0.0 for x, k in zip(p, keep)]
        return [x / sum(kept) for x in kept]

    if 0 < top_k < len(p):
        kth = sorted(p, reverse=True)[top_k - 1]
        p = renorm([x >= kth for x in p])
    if top_p < 1.0:
        # t: the largest value v whose kept mass sum(p_i for p_i >= v) reaches top_p
        t = max(v for v in set(p) if sum(x for x in p if x >= v) >= top_p - 1e-9)
        p = renorm([x >= t for x in p])
    if min_p > 0.0:
        p = renorm([x >= min_p * max(p) for x in p])
    return p


def params_for(rows):
    return SamplingParams.build(len(rows), "cpu", *[list(c) for c in zip(*rows)])


def check_rows(logits, rows):
    got = process_probs(torch.tensor(logits, dtype=torch.float32), params_for(rows))
    for b, (row, args) in enumerate(zip(logits, rows)):
        want = brute_force(row, *args)
        assert [x > 0 for x in want] == (got[b] > 0).tolist(), (b, args, got[b], want)   # the same support
        np.testing.assert_allclose(got[b].numpy(), want, atol=1e-6, rtol=1e-5)


def test_filters_keep_ties_at_the_top_k_and_top_p_boundaries():
    tie = [3.0, 2.0, 2.0, 2.0, 1.0, 0.0]
    check_rows([tie] * 7, [
        (1.0, 2, 1.0, 0.0),        # the 2nd largest is tied three ways: all three stay
        (1.0, 1, 1.0, 0.0),
        (1.0, 4, 1.0, 0.0),
        (1.0, 0, 0.5, 0.0),        # p(3) ~ 0.43 < 0.5: the tied group is needed, all of it stays
        (1.0, 0, 0.42, 0.0),       # p(3) alone reaches it
        (1.0, 0, 0.999, 0.0),
        (1.0, 2, 0.9, 0.3),
    ])


def test_top_p_keeps_the_smallest_set_reaching_top_p_not_one_fewer():
    logits = [math.log(x) for x in (0.5, 0.3, 0.15, 0.05)]
    got = process_probs(torch.tensor([logits] * 3), params_for([(1.0, 0, 0.7, 0.0), (1.0, 0, 0.8, 0.0),
                                                                 (1.0, 0, 0.81, 0.0)]))
    assert (got > 0).sum(-1).tolist() == [2, 2, 3]   # 0.5 + 0.3 = 0.8 reaches 0.7 and 0.8; 0.81 needs 0.15 too
    check_rows([logits] * 3, [(1.0, 0, 0.7, 0.0), (1.0, 0, 0.8, 0.0), (1.0, 0, 0.81, 0.0)])


@pytest.mark.parametrize("seed", range(6))
def test_process_probs_equals_brute_force_with_per_request_parameters(seed):
    g = torch.Generator().manual_seed(seed)
    batch, vocab = 12, 37
    logits = (torch.randn(batch, vocab, generator=g) * 2).round(decimals=1)   # rounding makes ties common
    logits[0, 5] = float("nan")
    logits[1] = float("-inf")                      # no finite logit: no mass
    logits[2, :30] = float("-inf")
    rows = []
    for b in range(batch):
        t = [0.0, 0.5, 1.0, 1.7][int(torch.randint(4, (1,), generator=g))]
        rows.append((t, int(torch.randint(0, 8, (1,), generator=g)),
                     [1.0, 0.9, 0.5, 0.3][int(torch.randint(4, (1,), generator=g))],
                     [0.0, 0.0, 0.05, 0.2][int(torch.randint(4, (1,), generator=g))]))
    rows[3] = (1.0, vocab, 1.0, 0.0)               # top_k >= V: off
    check_rows(logits.tolist(), rows)
    got = process_probs(logits, params_for(rows))
    assert got[1].sum() == 0
    sums = got.sum(-1)
    assert torch.allclose(sums[sums > 0], torch.ones_like(sums[sums > 0]))


def test_process_probs_on_windows_indexes_parameters_by_dim_0():
    logits = torch.randn(3, 4, 11)
    rows = [(1.0, 3, 1.0, 0.0), (0.0, 0, 1.0, 0.0), (0.7, 0, 0.6, 0.1)]
    got = process_probs(logits, params_for(rows))
    for b in range(3):
        for n in range(4):
            np.testing.assert_allclose(got[b, n].numpy(), brute_force(logits[b, n].tolist(), *rows[b]), atol=1e-6)


def test_sampling_arguments_are_checked_by_name():
    for kwargs, name in ((dict(temperature=-1.0), "temperature"), (dict(temperature=float("nan")), "temperature"),
                         (dict(temperature=float("inf")), "temperature"), (dict(top_p=0.0), "top_p"),
                         (dict(top_p=1.5), "top_p"), (dict(top_k=-1), "top_k"), (dict(top_k=1.5), "top_k"),
                         (dict(min_p=1.0), "min_p"), (dict(min_p=-0.1), "min_p"),
                         (dict(temperature=[1.0, 0.5]), "temperature must be one value or a list"),
                         (dict(top_p=[0.5, 2.0, 0.5]), r"top_p\[1\]")):
        with pytest.raises(ValueError, match=name):
            SamplingParams.build(3, "cpu", **kwargs)


def test_numpy_scalars_and_tensors_are_values_like_lists():
    want = SamplingParams.build(3, "cpu", temperature=[0.5, 0.0, 1.5], top_k=[3, 0, 7], top_p=0.9, min_p=0.0)
    for kwargs in (dict(temperature=np.array([0.5, 0.0, 1.5], dtype=np.float32), top_k=np.array([3, 0, 7]),
                        top_p=np.float32(0.9), min_p=np.float64(0.0)),
                   dict(temperature=torch.tensor([0.5, 0.0, 1.5]), top_k=torch.tensor([3, 0, 7]),
                        top_p=torch.tensor(0.9), min_p=0)):
        got = SamplingParams.build(3, "cpu", **{k: list(v) if isinstance(v, np.ndarray) else v
                                                for k, v in kwargs.items()})
        for field in ("temperature", "top_k", "top_p", "min_p", "greedy"):
            assert torch.equal(getattr(got, field), getattr(want, field)), field
        assert (got.uses_top_k, got.uses_top_p, got.all_greedy) == (want.uses_top_k, want.uses_top_p, False)
    for kwargs, name in ((dict(temperature=True), "temperature"), (dict(top_k=[1, np.bool_(True), 2]), "top_k"),
                         (dict(top_p=torch.ones(3, 1)), "top_p must be one value or"),
                         (dict(top_k=np.float64(2.0)), "top_k")):
        with pytest.raises(ValueError, match=name):
            SamplingParams.build(3, "cpu", **kwargs)


# ------------------------------------------------------------------------------------ distribution tests


def tiny_llama(seed, vocab, hidden=16, scale=8.0):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      bos_token_id=None, eos_token_id=None, pad_token_id=None, attn_implementation="sdpa")
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():          # sharpen the random model so its distributions are far from uniform
        model.lm_head.weight.mul_(scale)
    return model


@pytest.fixture(scope="module")
def models():
    torch.set_num_threads(1)
    return tiny_llama(3, vocab=4), tiny_llama(4, vocab=4)


def joint_distribution(target, prompt, length, row):
    """p(x1 .. x_length) of the target's processed sampling, enumerating every prefix (float64)."""
    vocab = target.config.vocab_size
    joint = {(): 1.0}
    for _ in range(length):
        prefixes = list(joint)
        with torch.inference_mode():
            logits = target(torch.tensor([prompt + list(p) for p in prefixes])).logits[:, -1].double()
        nxt = {}
        for p, lg in zip(prefixes, logits.tolist()):
            probs = brute_force(lg, *row)
            for tok in range(vocab):
                if probs[tok] > 0:
                    nxt[p + (tok,)] = joint[p] * probs[tok]
        joint = nxt
    return joint


def chi_square_pvalue(sequences, joint):
    cells = {s: i for i, s in enumerate(joint)}
    observed = np.zeros(len(cells))
    for s in sequences:
        assert tuple(s) in cells, f"{s} has probability 0 under the target"      # filtered tokens never appear
        observed[cells[tuple(s)]] += 1
    expected = np.array([joint[s] for s in cells]) * len(sequences)
    big = expected >= 5                          # pool the sparse cells
    obs = np.append(observed[big], observed[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    keep = exp > 0
    return chisquare(obs[keep], exp[keep] * obs[keep].sum() / exp[keep].sum()).pvalue


ROWS = [(1.0, 0, 1.0, 0.0), (0.7, 3, 0.9, 0.05)]


def sample_sequences(models, samples_per_row, tree=None, seed=1234):
    """One batch: samples_per_row copies of the prompt per parameter row of ROWS (per-request parameters),
    5 new tokens each: the prefill draws the first, then chain drafts of 3 sampled tokens per step."""
    target, drafter = models
    rows = [r for r in ROWS for _ in range(samples_per_row)]
    params = {name: [r[i] for r in rows] for i, name in enumerate(("temperature", "top_k", "top_p", "min_p"))}
    decoder = SpeculativeDecoder(target, ModelDrafter(drafter, branch=2), num_speculative_tokens=3, tree=tree)
    out = decoder.generate([[1, 2, 3]] * len(rows), max_new_tokens=5, seed=seed, eos_token_id=[], **params)
    assert all(len(s) == 5 for s in out.sequences)
    return out, [out.sequences[i * samples_per_row:(i + 1) * samples_per_row] for i in range(len(ROWS))]


@pytest.mark.parametrize("tree", [None, 4], ids=["chain", "tree"])
def test_sampled_output_is_distributed_as_the_target_with_several_draft_positions_per_step(models, tree):
    """Joint of 5 tokens (4**5 cells): 12000 samples per parameter row, chi-square alpha 1e-4. In the chain
    case each verify step checks up to 3 sampled draft tokens, so positions 1 and 2 must draw fresh noise."""
    out, groups = sample_sequences(models, 12000, tree)
    assert out.stats.accepted_tokens > out.stats.draft_tokens // 10 and out.stats.draft_tokens > 24000 * 2
    for row, seqs in zip(ROWS, groups):
        assert chi_square_pvalue(seqs, joint_distribution(models[0], [1, 2, 3], 5, row)) > ALPHA, row


@pytest.mark.parametrize("bug", ["drafter-uses-verifier-seeds", "every-position-reuses-position-0"])
def test_the_distribution_test_catches_correlated_random_numbers(models, monkeypatch, bug):
    """The test above would fail if the drafter drew from the verifier's stream, or reused draft position 0's
    numbers at every position: with either bug the chi-square p-value falls below alpha (12000 samples)."""
    if bug == "drafter-uses-verifier-seeds":
        monkeypatch.setattr("specdec_ops.decoding.drafters.model.stream_seeds", lambda seeds, stream: seeds)
        monkeypatch.setattr("specdec_ops.decoding.drafters.model.draft_offsets", lambda offsets, position: offsets)
    else:
        monkeypatch.setattr("specdec_ops.decoding.drafters.model.draft_offsets",
                            lambda offsets, position: sampling_mod.draft_offsets(offsets, 0))
    _, groups = sample_sequences(models, 12000)
    pvalue = chi_square_pvalue(groups[0], joint_distribution(models[0], [1, 2, 3], 5, ROWS[0]))
    assert pvalue < ALPHA, pvalue


def test_mixed_greedy_and_sampled_requests_and_logprobs(models):
    target, drafter = models
    prompts = [[1, 2, 3], [0, 1], [1, 2, 3], [2]]
    temperature, top_k = [0.0, 1.0, 0.7, 0.0], [0, 0, 3, 5]
    out = SpeculativeDecoder(target, ModelDrafter(drafter), num_speculative_tokens=3).generate(
        prompts, max_new_tokens=8, temperature=temperature, top_k=top_k, seed=5, eos_token_id=[], logprobs=True)
    for b in (0, 3):                                  # greedy rows: the target's greedy decoding
        ids = torch.tensor([prompts[b]])
        greedy = target.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=0,
                                 attention_mask=torch.ones_like(ids))[0, len(prompts[b]):].tolist()
        assert out.sequences[b] == greedy
    for b, seq in enumerate(out.sequences):           # logprobs: under the processed target row that emitted it
        with torch.inference_mode():
            logits = target(torch.tensor([prompts[b] + seq])).logits[0, len(prompts[b]) - 1:-1].double()
        for i, tok in enumerate(seq):
            if temperature[b] == 0:
                want = torch.log_softmax(logits[i], -1)[tok].item()
            else:
                want = math.log(brute_force(logits[i].tolist(), temperature[b], top_k[b], 1.0, 0.0)[tok])
            assert out.logprobs[b][i] == pytest.approx(want, abs=1e-4), (b, i)
    assert SpeculativeDecoder(target, ModelDrafter(drafter)).generate(prompts, max_new_tokens=2).logprobs is None


def test_sampling_is_reproducible_per_seed(models):
    target, drafter = models
    dec = SpeculativeDecoder(target, ModelDrafter(drafter), num_speculative_tokens=3)
    runs = [dec.generate([[1, 2, 3]] * 4, max_new_tokens=10, temperature=1.0, seed=s, eos_token_id=[]).sequences
            for s in (7, 7, 8)]
    assert runs[0] == runs[1] and runs[0] != runs[2]
