"""Verification from logits (DESIGN.md §5.7): process_logits against an independent brute-force
definition (numpy, sorting), every backend against reference.py, the fused ops against
rejection_sample(process_logits(...)), the samplers against the processed target distribution
(chi-square), logprobs, and every error path."""

import math

import numpy as np
import pytest
import scipy.stats
import torch

import specdec_ops
from specdec_ops import reference
from specdec_ops._checks import SpecDecArgumentError
from specdec_ops.logits import _TRITON_OPS

from conftest import HAS_TRITON, compile_ahead_of_time

ALPHA = 1e-4  # significance level of every statistical test here
STAT_DRAWS = 40_000  # requests per statistical test
F32_MAX = float(np.finfo(np.float32).max)

# Backends that run on CPU tensors here (triton: the interpreter).
BACKENDS = ["cpu", "reference"] + (["triton"] if HAS_TRITON else [])
TREE_BACKENDS = BACKENDS


# ---------------------------------------------------------------------------------------------- brute force


def brute_force_row(row, temperature, top_k, top_p, min_p):
    """§5.7 written out directly in float64 numpy, with sorting: the test's own definition."""
    x = np.asarray(row, dtype=np.float64).copy()
    x[np.isnan(x)] = -np.inf
    x[x == np.inf] = F32_MAX
    vocab = x.size
    if not np.isfinite(x).any():
        return np.zeros(vocab)
    if temperature == 0:
        out = np.zeros(vocab)
        out[int(np.argmax(x))] = 1.0  # numpy's argmax: the first maximal index
        return out
    p = np.exp((x - x.max()) / temperature)
    p /= p.sum()
    if 0 < top_k < vocab:
        kth = np.sort(p)[::-1][top_k - 1]
        p = np.where(p >= kth, p, 0.0)
        p /= p.sum()
    if top_p < 1:
        for v in np.sort(np.unique(p[p > 0]))[::-1]:  # candidate thresholds, most likely first
            if p[p >= v].sum() >= top_p:
                p = np.where(p >= v, p, 0.0)
                break
        p /= p.sum()
    if min_p > 0:
        p = np.where(p >= min_p * p.max(), p, 0.0)
        p /= p.sum()
    return p


def brute_force(logits, temperature=None, top_k=None, top_p=None, min_p=None):
    """[R, ..., V] float64 numpy; the parameters are lists/tensors indexed by dim 0 (or None)."""
    rows = logits.float().reshape(logits.shape[0], -1, logits.shape[-1]).numpy()
    out = np.zeros(rows.shape)
    get = lambda v, r, d: d if v is None else float(v[r])  # noqa: E731
    for r in range(rows.shape[0]):
        for j in range(rows.shape[1]):
            out[r, j] = brute_force_row(rows[r, j], get(temperature, r, 1.0), int(get(top_k, r, 0)),
                                        get(top_p, r, 1.0), get(min_p, r, 0.0))
    return out.reshape(logits.shape)


def assert_matches_brute_force(probs, expected):
    probs = probs.double().numpy()
    assert np.array_equal(probs > 0, expected > 0), np.argwhere((probs > 0) != (expected > 0))[:5]
    np.testing.assert_allclose(probs, expected, rtol=2e-5, atol=1e-7)


# ---------------------------------------------------------------------------------------------- inputs


def mixed_params(batch, gen, vocab):
    """Per-request parameters mixing greedy, temperature, top-k, top-p, min-p and combinations."""
    t = torch.tensor([[1.0, 0.0, 0.7, 1.3, 0.5, 0.9][b % 6] for b in range(batch)])
    k = torch.tensor([[0, 0, 5, 0, 3, max(1, vocab // 3)][b % 6] for b in range(batch)])
    p = torch.tensor([[1.0, 0.5, 0.8, 0.6, 1.0, 0.9][b % 6] for b in range(batch)])
    m = torch.tensor([[0.0, 0.2, 0.05, 0.0, 0.1, 0.02][b % 6] for b in range(batch)])
    return dict(temperature=t, top_k=k, top_p=p, min_p=m)


def make_batch(batch, k, vocab, *, draft_probs=True, dtype=torch.float32, seed=0, scale=2.0, ragged=True):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, k + 1, vocab, generator=g) * scale
    q = torch.softmax(torch.randn(batch, k, vocab, generator=g), -1)
    ids = torch.multinomial(q.reshape(-1, vocab), 1, generator=g).reshape(batch, k)
    # some drafts are the target's argmax so that chains get accepted
    lucky = torch.rand(batch, k, generator=g) < 0.5
    ids = torch.where(lucky, logits[:, :k].argmax(-1), ids)
    n = torch.randint(0, k + 1, (batch,), generator=g) if ragged else torch.full((batch,), k)
    return dict(target_logits=logits.to(dtype), draft_token_ids=ids, num_draft_tokens=n,
                draft_probs=q.to(dtype) if draft_probs else None,
                seeds=torch.randint(0, 2**62, (batch,), generator=g),
                offsets=torch.randint(0, 2**40, (batch,), generator=g), **mixed_params(batch, g, vocab))


def call(args, backend, return_logprobs=True):
    a = dict(args)
    return specdec_ops.rejection_sample_logits(a.pop("target_logits"), a.pop("draft_token_ids"),
                                               a.pop("num_draft_tokens"), a.pop("draft_probs"),
                                               return_logprobs=return_logprobs, backend=backend, **a)


def to_packed(args):
    p, ids, n, q = args["target_logits"], args["draft_token_ids"], args["num_draft_tokens"], args["draft_probs"]
    rows, drafts, qrows = [], [], []
    for b in range(p.shape[0]):
        nb = int(n[b])
        rows.append(p[b, : nb + 1])
        drafts.append(ids[b, :nb])
        if q is not None:
            qrows.append(q[b, :nb])
    cu = torch.zeros(p.shape[0] + 1, dtype=torch.int64)
    cu[1:] = torch.cumsum(n, 0)
    out = {k: v for k, v in args.items() if k not in ("target_logits", "draft_token_ids", "num_draft_tokens",
                                                       "draft_probs")}
    return dict(out, target_logits=torch.cat(rows), cu_num_draft_tokens=cu, draft_token_ids=torch.cat(drafts),
                draft_probs=torch.cat(qrows) if q is not None else None)


def call_packed(packed, backend, k, return_logprobs=True):
    a = dict(packed)
    return specdec_ops.rejection_sample_logits_packed(
        a.pop("target_logits"), a.pop("cu_num_draft_tokens"), a.pop("draft_token_ids"), a.pop("draft_probs"),
        max_num_draft_tokens=k, return_logprobs=return_logprobs, backend=backend, **a)


def random_tree(batch, nodes, vocab, *, draft_probs=True, dtype=torch.float32, seed=0, scale=2.0):
    g = torch.Generator().manual_seed(seed)
    parents = torch.full((batch, nodes), -1, dtype=torch.int64)
    for i in range(1, nodes):
        parents[:, i] = torch.randint(0, i, (batch,), generator=g)
    logits = torch.randn(batch, nodes, vocab, generator=g) * scale
    q = torch.softmax(torch.randn(batch, nodes, vocab, generator=g), -1)
    tokens = torch.randint(0, vocab, (batch, nodes), generator=g)
    lucky = torch.rand(batch, nodes, generator=g) < 0.5
    tokens = torch.where(lucky, torch.gather(logits.argmax(-1), 1, parents.clamp(min=0)), tokens)
    num_nodes = torch.randint(1, nodes + 1, (batch,), generator=g)
    parents = torch.where(torch.arange(nodes) < num_nodes[:, None], parents, -1)
    return dict(target_logits=logits.to(dtype), tree_token_ids=tokens, parents=parents, num_nodes=num_nodes,
                draft_probs=q.to(dtype) if draft_probs else None,
                seeds=torch.randint(0, 2**62, (batch,), generator=g),
                offsets=torch.randint(0, 2**40, (batch,), generator=g), **mixed_params(batch, g, vocab))


def call_tree(args, backend, return_logprobs=True):
    a = dict(args)
    return specdec_ops.tree_rejection_sample_logits(
        a.pop("target_logits"), a.pop("tree_token_ids"), a.pop("parents"), a.pop("num_nodes"), a.pop("draft_probs"),
        return_logprobs=return_logprobs, backend=backend, **a)


def assert_same(a, b, logprobs=True):
    for name in a._fields:
        x, y = getattr(a, name), getattr(b, name)
        if name == "logprobs":
            if logprobs:
                assert torch.equal(torch.isnan(x), torch.isnan(y)), (x, y)
                torch.testing.assert_close(x, y, atol=1e-4, rtol=0, equal_nan=True)
            continue
        assert x.dtype == y.dtype and torch.equal(x, y), f"{name} differs:\n{x}\n{y}"


PARAMS = ("temperature", "top_k", "top_p", "min_p")


# ---------------------------------------------------------------------------------------------- process_logits


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_process_logits_matches_brute_force(backend, dtype):
    g = torch.Generator().manual_seed(1)
    logits = (torch.randn(12, 2, 40, generator=g) * 3).to(dtype)
    params = mixed_params(12, g, 40)
    probs = specdec_ops.process_logits(logits, **params, backend=backend)
    assert probs.dtype == torch.float32 and probs.shape == logits.shape
    assert_matches_brute_force(probs, brute_force(logits, **params))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("logits,params,kept", [
    # top-k: ties at the k-th value are all kept
    ([3.0, 2.0, 2.0, 2.0, 1.0, 0.0], dict(top_k=2), 4),
    ([3.0, 2.0, 2.0, 2.0, 1.0, 0.0], dict(top_k=4), 4),
    ([3.0, 2.0, 2.0, 2.0, 1.0, 0.0], dict(top_k=5), 5),
    ([0.0, 1.0, 2.0, 3.0], dict(top_k=1), 1),
    # top-p: probabilities 0.4, 0.2, 0.2, 0.1, 0.1 (ties at the boundary kept)
    ([math.log(4), math.log(2), math.log(2), 0.0, 0.0], dict(top_p=0.39), 1),
    ([math.log(4), math.log(2), math.log(2), 0.0, 0.0], dict(top_p=0.5), 3),
    ([math.log(4), math.log(2), math.log(2), 0.0, 0.0], dict(top_p=0.85), 5),
    # top-p "one too few": 0.5, 0.3, 0.2 needs all three above 0.8
    ([math.log(5), math.log(3), math.log(2)], dict(top_p=0.79), 2),
    ([math.log(5), math.log(3), math.log(2)], dict(top_p=0.81), 3),
    ([math.log(5), math.log(3), math.log(2)], dict(top_p=0.49), 1),
    ([math.log(5), math.log(3), math.log(2)], dict(top_p=0.51), 2),
    # min-p: keeps p >= min_p * max p, ties of the maximum kept
    ([2.0, 2.0, 1.0, 0.0], dict(min_p=0.5), 2),
    ([math.log(5), math.log(3), math.log(2)], dict(min_p=0.59), 2),
    ([math.log(5), math.log(3), math.log(2)], dict(min_p=0.61), 1),
    ([math.log(5), math.log(3), math.log(2)], dict(min_p=0.39), 3),
    # order: top-k first (keeps 0.5, 0.3 -> 0.625, 0.375), then top-p 0.6 keeps one
    ([math.log(5), math.log(3), math.log(2)], dict(top_k=2, top_p=0.6), 1),
    # ... whereas top-p 0.6 alone needs two
    ([math.log(5), math.log(3), math.log(2)], dict(top_p=0.6), 2),
    # min-p after top-p: renormalizing does not move the threshold relative to the maximum
    ([math.log(5), math.log(3), math.log(2)], dict(top_p=0.9, min_p=0.5), 2),
])
def test_process_logits_boundaries(backend, logits, params, kept):
    x = torch.tensor([logits], dtype=torch.float32)
    tensors = {k: torch.tensor([v]) for k, v in params.items()}
    probs = specdec_ops.process_logits(x, **tensors, backend=backend)
    assert int((probs > 0).sum()) == kept, probs
    assert_matches_brute_force(probs, brute_force(x, **tensors))


@pytest.mark.parametrize("backend", BACKENDS)
def test_process_logits_special_values_and_greedy(backend):
    inf, nan = float("inf"), float("nan")
    x = torch.tensor([
        [1.0, nan, 3.0, -inf, 3.0],        # NaN counts as -inf; greedy picks the first of the tied maxima
        [-inf, -inf, nan, -inf, -inf],     # no finite logit: no mass
        [0.0, inf, 1.0, inf, -inf],        # +inf entries share the mass
        [5.0, 1.0, 2.0, 3.0, 4.0],         # temperature 0 ignores the filters
    ])
    t = torch.tensor([0.0, 1.0, 0.5, 0.0])
    k = torch.tensor([0, 2, 0, 1])
    probs = specdec_ops.process_logits(x, temperature=t, top_k=k, backend=backend)
    expected = torch.tensor([[0, 0, 1, 0, 0], [0, 0, 0, 0, 0], [0, 0.5, 0, 0.5, 0], [1, 0, 0, 0, 0]],
                            dtype=torch.float32)
    torch.testing.assert_close(probs, expected)
    assert_matches_brute_force(probs, brute_force(x, temperature=t, top_k=k))


@pytest.mark.parametrize("backend", BACKENDS)
def test_infinite_temperature_is_the_uniform_limit(backend):
    """temperature = +inf is a valid value (> 0, not NaN): the limit of softmax(l / T), uniform over the finite
    logits (the kernels take it as FLT_MAX). -inf and NaN logits keep no mass; the reference computed
    -inf / inf = NaN and returned a NaN row."""
    inf, nan = float("inf"), float("nan")
    x = torch.tensor([[1.0, -inf, 0.0], [nan, 2.0, -3.0]])
    t = torch.tensor([inf, inf])
    probs = specdec_ops.process_logits(x, temperature=t, backend=backend)
    torch.testing.assert_close(probs, torch.tensor([[0.5, 0.0, 0.5], [0.0, 0.5, 0.5]]))
    out = specdec_ops.rejection_sample_logits(x[:, None], torch.zeros(2, 0, dtype=torch.int64),
                                              torch.zeros(2, dtype=torch.int64), temperature=t,
                                              seeds=torch.tensor([3, 4]), return_logprobs=True, backend=backend)
    assert out.token_ids[0, 0] in (0, 2) and out.token_ids[1, 0] in (1, 2), out.token_ids
    torch.testing.assert_close(out.logprobs, torch.full((2, 1), math.log(0.5)))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("vocab", [1, 2, 3])
def test_vocabularies_below_a_philox_block(backend, vocab):
    """V < 4: the Triton launchers once sized a vocab tile of next_pow2(V) = 1 or 2 and refused it (a tile holds
    whole Philox blocks of 4). The three ops with filters equal the reference."""
    g = torch.Generator().manual_seed(vocab)
    x = torch.randn(2, 3, vocab, generator=g)
    kw = dict(temperature=torch.tensor([0.7, 0.0]), top_k=torch.tensor([1, 0]), top_p=torch.tensor([0.5, 1.0]))
    rng = dict(seeds=torch.tensor([1, 2]), offsets=torch.tensor([0, 3]))
    for b in (backend, "reference"):
        probs = specdec_ops.process_logits(x[:, 0], **kw, backend=b)
        chain = specdec_ops.rejection_sample_logits(x, torch.zeros(2, 2, dtype=torch.int64), torch.tensor([2, 1]), **kw,
                                                    **rng, return_logprobs=True, backend=b)
        tree = specdec_ops.tree_rejection_sample_logits(x, torch.zeros(2, 3, dtype=torch.int64),
                                                        torch.tensor([[-1, 0, 0]] * 2), **kw, **rng, backend=b)
        if b == backend:
            got = (probs, chain, tree)
    torch.testing.assert_close(got[0], probs)
    assert torch.equal(got[1].token_ids, chain.token_ids) and torch.equal(got[2].token_ids, tree.token_ids)
    torch.testing.assert_close(got[1].logprobs, chain.logprobs, equal_nan=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_top_p_reaches_its_mass_within_two_to_the_minus_twenty(backend):
    """top-p's documented tolerance (README, TOP_P_SLACK): the smallest set whose mass is >= top_p (1 - 2^-20)
    of the row's. With p = [0.75, 0.25], top_p 2^-21 above 0.75 (relative) keeps the first entry only, 2^-19
    above keeps both; the chain op with logprobs sees the same sets (the draft 1 is kept or not)."""
    x = torch.log(torch.tensor([[0.75, 0.25]] * 2))
    top_p = torch.tensor([0.75 * (1 + 2.0 ** -21), 0.75 * (1 + 2.0 ** -19)])
    probs = specdec_ops.process_logits(x, top_p=top_p, backend=backend)
    torch.testing.assert_close(probs, torch.tensor([[1.0, 0.0], [0.75, 0.25]]))
    out = specdec_ops.rejection_sample_logits(x.view(2, 1, 2).expand(2, 2, 2), torch.ones(2, 1, dtype=torch.int64),
                                              torch.ones(2, dtype=torch.int64), top_p=top_p,
                                              seeds=torch.tensor([5, 6]), return_logprobs=True, backend=backend)
    assert out.num_accepted[0] == 0 and out.token_ids[0, 0] == 0, out  # the draft 1 is outside the kept set
    assert out.logprobs[0, 0] == 0.0
    if out.num_accepted[1] == 1:  # accepted with probability p(1) = 0.25 (one-hot draft)
        torch.testing.assert_close(out.logprobs[1, 0], torch.tensor(math.log(0.25)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_process_logits_scalars_mean_every_row(backend):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 4, 30, generator=g)
    a = specdec_ops.process_logits(x, temperature=0.6, top_k=7, top_p=0.9, min_p=0.01, backend=backend)
    b = specdec_ops.process_logits(x, temperature=torch.full((3,), 0.6), top_k=torch.full((3,), 7),
                                   top_p=torch.full((3,), 0.9), min_p=torch.full((3,), 0.01), backend=backend)
    assert torch.equal(a, b)
    assert torch.equal(specdec_ops.process_logits(x, backend=backend),
                       specdec_ops.process_logits(x, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0,
                                                  backend=backend))


@pytest.mark.parametrize("backend", BACKENDS)
def test_ops_without_rows_return_empty_outputs(backend):
    # R = 0 / B = 0 on every backend, the reference included (its reshape to [R, -1, V] was ambiguous)
    for shape in ((0, 8), (0, 3, 8)):
        probs = specdec_ops.process_logits(torch.randn(shape), temperature=torch.zeros(0), top_p=torch.ones(0),
                                           backend=backend)
        assert probs.shape == shape and probs.dtype == torch.float32
    out = specdec_ops.tree_rejection_sample_logits(torch.randn(0, 4, 8), torch.zeros(0, 4, dtype=torch.int64),
                                                   torch.full((0, 4), -1), return_logprobs=True, backend=backend)
    assert [(tuple(x.shape), x.dtype) for x in out] == [((0, 4), torch.int64), ((0, 4), torch.int32),
                                                        ((0,), torch.int32), ((0, 4), torch.float32)]
    out = specdec_ops.rejection_sample_logits(torch.randn(0, 3, 8), torch.zeros(0, 2, dtype=torch.int64),
                                              torch.zeros(0, dtype=torch.int64), return_logprobs=True,
                                              backend=backend)
    assert [(tuple(x.shape), x.dtype) for x in out] == [((0, 3), torch.int64), ((0,), torch.int32),
                                                        ((0, 3), torch.float32)]


def test_top_k_beyond_int64_is_off():
    # >= V is off, and so is a Python int no int64 holds (it raised a bare OverflowError)
    x = torch.randn(2, 30, generator=torch.Generator().manual_seed(4))
    want = specdec_ops.process_logits(x, backend="cpu")
    for top_k in (2 ** 70, [2 ** 70, 2 ** 64]):
        assert torch.equal(specdec_ops.process_logits(x, top_k=top_k, backend="cpu"), want)
    with pytest.raises(specdec_ops.SpecDecArgumentError, match="top_k"):
        specdec_ops.process_logits(x, top_k=-2 ** 70)


@pytest.mark.parametrize("name", ["temperature", "top_k", "top_p", "min_p"])
def test_a_bool_sampling_parameter_is_refused(name):
    # True is an int to Python: it read as top_k 1 (or temperature 1.0) instead of naming the mistake
    x = torch.randn(2, 30)
    for value in (True, False):
        with pytest.raises(specdec_ops.SpecDecArgumentError, match=f"{name} must be a number.*bool"):
            specdec_ops.process_logits(x, **{name: value})
        with pytest.raises(specdec_ops.SpecDecArgumentError, match=name):
            specdec_ops.rejection_sample_logits(torch.randn(2, 2, 30), torch.zeros(2, 1, dtype=torch.int64),
                                                torch.ones(2, dtype=torch.int64), **{name: value})


@pytest.mark.parametrize("vocab", [1, 2, 255, 256, 257, 1024, 1025, 8193])
def test_process_logits_tile_boundary_vocab_sizes(vocab):
    g = torch.Generator().manual_seed(vocab)
    x = torch.randn(6, vocab, generator=g) * 4
    params = mixed_params(6, g, vocab)
    expected = brute_force(x, **params)
    for backend in BACKENDS:
        assert_matches_brute_force(specdec_ops.process_logits(x, **params, backend=backend), expected)


def test_process_logits_bf16_ties_at_top_k_boundary():
    # bfloat16 logits tie often: every backend keeps all entries equal to the k-th value.
    g = torch.Generator().manual_seed(5)
    x = torch.randint(-4, 5, (8, 200), generator=g).to(torch.bfloat16) * 0.5
    params = dict(top_k=torch.arange(1, 9) * 7, top_p=torch.linspace(0.3, 1.0, 8))
    expected = brute_force(x, **params)
    for backend in BACKENDS:
        assert_matches_brute_force(specdec_ops.process_logits(x, **params, backend=backend), expected)


# ---------------------------------------------------------------------------------------------- backends agree


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "reference"])
@pytest.mark.parametrize("draft_probs", [True, False], ids=["draft_probs", "one_hot"])
@pytest.mark.parametrize("vocab", [5, 257, 1025])
def test_backend_matches_reference(backend, draft_probs, vocab):
    args = make_batch(12, 3, vocab, draft_probs=draft_probs, seed=vocab)
    assert_same(call(args, backend), call(args, "reference"))


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "reference"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_logits(backend, dtype):
    args = make_batch(12, 3, 100, seed=7, dtype=dtype)
    assert_same(call(args, backend), call(args, "reference"))
    # float32 draft probabilities with half-precision logits are read as they are
    args["draft_probs"] = args["draft_probs"].float()
    assert_same(call(args, backend), call(args, "reference"))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("draft_probs", [True, False], ids=["draft_probs", "one_hot"])
def test_equals_rejection_sample_of_processed_logits(backend, draft_probs):
    """The contract of §5.7: the fused op is rejection_sample(process_logits(...)) for the same seeds."""
    args = make_batch(24, 4, 64, draft_probs=draft_probs, seed=11)
    fused = call(args, backend)
    probs = specdec_ops.process_logits(args["target_logits"], *(args[n] for n in PARAMS), backend="cpu")
    plain = specdec_ops.rejection_sample(probs, args["draft_token_ids"], args["num_draft_tokens"],
                                         args["draft_probs"], seeds=args["seeds"], offsets=args["offsets"],
                                         greedy=args["temperature"] == 0, backend="cpu")
    assert torch.equal(fused.token_ids, plain.token_ids) and torch.equal(fused.num_accepted, plain.num_accepted)
    assert int(fused.num_accepted.sum()) > 0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("draft_probs", [True, False], ids=["draft_probs", "one_hot"])
def test_packed_equals_padded_and_processed(backend, draft_probs):
    args = make_batch(10, 4, 50, draft_probs=draft_probs, seed=13)
    padded = call(args, backend)
    packed_args = to_packed(args)
    packed = call_packed(packed_args, backend, k=4)
    assert_same(padded, packed)
    counts = args["num_draft_tokens"] + 1
    row_params = [torch.repeat_interleave(args[n], counts) for n in PARAMS]
    probs = specdec_ops.process_logits(packed_args["target_logits"], *row_params, backend="cpu")
    plain = specdec_ops.rejection_sample_packed(probs, packed_args["cu_num_draft_tokens"],
                                                packed_args["draft_token_ids"], packed_args["draft_probs"],
                                                seeds=args["seeds"], offsets=args["offsets"],
                                                greedy=args["temperature"] == 0, max_num_draft_tokens=4,
                                                backend="cpu")
    assert torch.equal(packed.token_ids, plain.token_ids)


@pytest.mark.parametrize("backend", TREE_BACKENDS)
@pytest.mark.parametrize("draft_probs", [True, False], ids=["draft_probs", "one_hot"])
def test_tree_equals_tree_rejection_sample_of_processed_logits(backend, draft_probs):
    case = random_tree(12, 9, 40, draft_probs=draft_probs, seed=17)
    fused = call_tree(case, backend)
    probs = specdec_ops.process_logits(case["target_logits"], *(case[n] for n in PARAMS), backend="cpu")
    plain = specdec_ops.tree_rejection_sample(probs, case["tree_token_ids"], case["parents"], case["num_nodes"],
                                              case["draft_probs"], seeds=case["seeds"], offsets=case["offsets"],
                                              greedy=case["temperature"] == 0, backend="cpu")
    for name in ("token_ids", "accepted_path", "num_accepted"):
        assert torch.equal(getattr(fused, name), getattr(plain, name)), name
    assert int(fused.num_accepted.sum()) > 0
    if backend != "reference":
        assert_same(fused, call_tree(case, "reference"))


@pytest.mark.parametrize("backend", [b for b in TREE_BACKENDS if b != "reference"])
def test_tree_half_precision_and_float32_draft(backend):
    case = random_tree(8, 7, 64, seed=19, dtype=torch.bfloat16)
    assert_same(call_tree(case, backend), call_tree(case, "reference"))
    case["draft_probs"] = case["draft_probs"].float()
    assert_same(call_tree(case, backend), call_tree(case, "reference"))


# ---------------------------------------------------------------------------------------------- logprobs


@pytest.mark.parametrize("backend", BACKENDS)
def test_logprobs_are_log_of_processed_target_at_emitted_tokens(backend):
    args = make_batch(12, 3, 60, seed=23)
    out = call(args, backend)
    probs = brute_force(args["target_logits"], *(args[n] for n in PARAMS))
    raw = torch.log_softmax(args["target_logits"].double(), -1)
    for b in range(12):
        k = int(out.num_accepted[b])
        for i in range(4):
            t = int(out.token_ids[b, i])
            if i > k:
                assert t == -1 and math.isnan(float(out.logprobs[b, i]))
                continue
            want = float(raw[b, i, t]) if float(args["temperature"][b]) == 0 else math.log(probs[b, i, t])
            assert abs(float(out.logprobs[b, i]) - want) < 1e-4, (b, i, float(out.logprobs[b, i]), want)


def test_return_logprobs_false_gives_none_and_same_tokens():
    args = make_batch(6, 3, 30, seed=29)
    with_lp, without = call(args, "cpu"), call(args, "cpu", return_logprobs=False)
    assert without.logprobs is None
    assert torch.equal(with_lp.token_ids, without.token_ids)
    case = random_tree(4, 5, 30, seed=29)
    assert call_tree(case, "cpu", return_logprobs=False).logprobs is None


# ---------------------------------------------------------------------------------------------- greedy


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_requests_walk_the_raw_argmax_in_a_mixed_batch(backend):
    args = make_batch(12, 4, 40, seed=31, ragged=False)
    args["target_logits"][1, :, 3:5] = 10.0  # ties at the top of a greedy request: the first index wins
    args["top_k"][:] = 1  # ignored by greedy requests
    out = call(args, backend)
    argmax = args["target_logits"].argmax(-1)
    for b in range(12):
        if float(args["temperature"][b]) != 0:
            continue
        k = 0
        while k < 4 and int(args["draft_token_ids"][b, k]) == int(argmax[b, k]):
            k += 1
        assert int(out.num_accepted[b]) == k
        assert out.token_ids[b, : k + 1].tolist() == args["draft_token_ids"][b, :k].tolist() + [int(argmax[b, k])]


def test_request_result_independent_of_batch_composition():
    args = make_batch(8, 3, 50, seed=37)
    full = call(args, "cpu")
    perm = torch.randperm(8, generator=torch.Generator().manual_seed(0))
    permuted = {k: (v[perm] if isinstance(v, torch.Tensor) else v) for k, v in args.items()}
    out = call(permuted, "cpu")
    assert torch.equal(out.token_ids, full.token_ids[perm])
    assert torch.equal(out.logprobs.isnan(), full.logprobs[perm].isnan())


# ---------------------------------------------------------------------------------------------- statistics


FILTERS = {
    "temperature": dict(temperature=0.7),
    "top_k": dict(top_k=4),
    "top_p": dict(top_p=0.8),
    "min_p": dict(min_p=0.1),
    "combined": dict(temperature=0.8, top_k=6, top_p=0.9, min_p=0.05),
}


def _stat_logits(rows, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=g) * 1.5
    logits[:, 3] = float("-inf")  # a token of zero probability must never appear
    logits[:, 5] = float("nan")
    return logits


@pytest.mark.parametrize("draft_probs", [True, False], ids=["draft_probs", "one_hot"])
@pytest.mark.parametrize("filt", list(FILTERS))
def test_chain_emits_processed_target_at_every_position(filt, draft_probs):
    """Chi-square at alpha = 1e-4 with 40,000 requests (K = 2, V = 12): at every position k, among
    the requests that reach k, the emitted token ~ the processed target of row k, computed by the
    brute-force definition above."""
    vocab, k, batch = 12, 2, STAT_DRAWS
    logits1 = _stat_logits(k + 1, vocab, seed=list(FILTERS).index(filt) * 2 + draft_probs)
    params = FILTERS[filt]
    expected = brute_force(logits1[None], **{n: [v] for n, v in params.items()})[0]  # [K+1, V]
    g = torch.Generator().manual_seed(7)
    if draft_probs:
        q = torch.softmax(torch.randn(k, vocab, generator=g), -1)
        drafts = torch.stack([torch.multinomial(q[j], batch, replacement=True, generator=g) for j in range(k)], 1)
        qs = q.expand(batch, k, vocab).contiguous()
    else:
        # one-hot drafts: the most likely token at position 0, a filtered-out token at position 1
        drafts = torch.tensor([[int(np.argmax(expected[0])), int(np.argmin(expected[1]))]]).expand(batch, k)
        qs = None
    out = specdec_ops.rejection_sample_logits(
        logits1.expand(batch, k + 1, vocab).contiguous(), drafts.contiguous(), torch.full((batch,), k), qs,
        **params, seeds=torch.arange(batch, dtype=torch.int64) * 7919 + 1,
        offsets=torch.full((batch,), 3, dtype=torch.int64), backend="cpu")
    tokens, acc = out.token_ids, out.num_accepted
    tested = 0
    for pos in range(k + 1):
        reached = acc >= pos
        counts = torch.bincount(tokens[reached, pos], minlength=vocab).double().numpy()
        support = expected[pos] > 0
        assert counts[~support].sum() == 0, (pos, counts, expected[pos])
        if reached.sum() < 500:
            continue
        exp_counts = expected[pos][support] * counts.sum()
        if support.sum() > 1:
            assert scipy.stats.chisquare(counts[support], exp_counts).pvalue > ALPHA, (pos, counts, expected[pos])
        tested += 1
    assert tested >= 2


@pytest.mark.parametrize("draft_probs", [True, False], ids=["draft_probs", "one_hot"])
@pytest.mark.parametrize("filt", list(FILTERS))
def test_tree_emits_processed_target_at_every_node(filt, draft_probs):
    """Chi-square at alpha = 1e-4 with 40,000 requests on a fixed tree (branching 2, depth 2, V = 10):
    for every node u reached >= 500 times, the token emitted after u ~ the processed target of u."""
    parents1 = torch.tensor([-1, 0, 0, 1, 1, 2, 2])
    nodes, vocab, batch = 7, 10, STAT_DRAWS
    logits1 = _stat_logits(nodes, vocab, seed=list(FILTERS).index(filt) * 2 + 10 + draft_probs)
    params = FILTERS[filt]
    expected = brute_force(logits1[None], **{n: [v] for n, v in params.items()})[0]  # [N, V]
    g = torch.Generator().manual_seed(9)
    if draft_probs:
        q1 = torch.softmax(torch.randn(nodes, vocab, generator=g), -1)
        picks = torch.multinomial(q1[parents1[1:]], batch, replacement=True, generator=g)  # [N-1, B]
        tokens = torch.cat([torch.zeros(batch, 1, dtype=torch.int64), picks.T], 1)
        qs = q1.expand(batch, -1, -1).contiguous()
    else:
        tokens1 = torch.zeros(nodes, dtype=torch.int64)
        for u in range(nodes):
            children = [c for c in range(1, nodes) if int(parents1[c]) == u]
            order = np.argsort(-expected[u], kind="stable")
            tokens1[children] = torch.tensor(order[: len(children)].copy())  # the two most likely tokens
        tokens = tokens1.repeat(batch, 1)
        qs = None
    out = specdec_ops.tree_rejection_sample_logits(
        logits1.expand(batch, -1, -1).contiguous(), tokens, parents1.repeat(batch, 1), None, qs, **params,
        seeds=torch.arange(batch, dtype=torch.int64) * 104729 + 5, offsets=torch.zeros(batch, dtype=torch.int64),
        backend="cpu")
    path, toks = out.accepted_path.long(), out.token_ids
    tested = 0
    for u in range(nodes):
        emitted = toks[(path >= 0) & (path == u)]
        if emitted.numel() < 500:
            continue
        counts = torch.bincount(emitted, minlength=vocab).double().numpy()
        support = expected[u] > 0
        assert counts[~support].sum() == 0, (u, counts, expected[u])
        if support.sum() > 1:
            assert scipy.stats.chisquare(counts[support], expected[u][support] * counts.sum()).pvalue > ALPHA, \
                (u, counts, expected[u])
        tested += 1
    assert tested >= 3


# ---------------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize("name,value", [
    ("temperature", -0.5), ("temperature", float("nan")), ("top_k", -1), ("top_p", 0.0), ("top_p", 1.5),
    ("top_p", float("nan")), ("min_p", 1.0), ("min_p", -0.1), ("min_p", float("nan")),
])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("as_tensor", [False, True], ids=["scalar", "tensor"])
def test_bad_parameter_values_raise_naming_the_argument(name, value, backend, as_tensor):
    args = make_batch(3, 2, 10, seed=41)
    if as_tensor:
        v = args[name].clone()
        v[1] = value
    else:
        v = value
    args[name] = v
    with pytest.raises(SpecDecArgumentError, match=name):
        call(args, backend)
    with pytest.raises(SpecDecArgumentError, match=name):
        specdec_ops.process_logits(args["target_logits"], **{n: args[n] for n in PARAMS}, backend=backend)
    case = random_tree(3, 4, 10, seed=41)
    case[name] = v
    with pytest.raises(SpecDecArgumentError, match=name):
        call_tree(case, backend)


@pytest.mark.parametrize("name,value", [
    ("temperature", torch.ones(4)), ("temperature", torch.ones(3, dtype=torch.int64)),
    ("top_k", torch.ones(3)), ("top_k", torch.ones(2, dtype=torch.int64)), ("top_k", 2.5),
    ("top_p", torch.ones(3, 1)), ("min_p", torch.zeros(3, dtype=torch.int32)),
    ("target_logits", torch.zeros(3, 3, 10, dtype=torch.float64)), ("target_logits", torch.zeros(3, 10)),
    ("draft_token_ids", torch.zeros(3, 3, dtype=torch.int64)), ("num_draft_tokens", torch.zeros(3)),
    ("draft_probs", torch.zeros(3, 2, 11)), ("seeds", torch.zeros(2, dtype=torch.int64)),
])
def test_bad_shapes_and_dtypes_name_the_argument(name, value):
    args = make_batch(3, 2, 10, seed=43)
    args[name] = value
    with pytest.raises(SpecDecArgumentError, match=name):
        call(args, "cpu")


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_index_values_raise_on_cpu(backend):
    args = make_batch(3, 2, 10, seed=47, ragged=False)
    bad = dict(args, draft_token_ids=args["draft_token_ids"].clone())
    bad["draft_token_ids"][1, 1] = 10
    with pytest.raises(SpecDecArgumentError, match="draft_token_ids"):
        call(bad, backend)
    with pytest.raises(SpecDecArgumentError, match="num_draft_tokens"):
        call(dict(args, num_draft_tokens=torch.tensor([0, 3, 1])), backend)
    packed = to_packed(args)
    with pytest.raises(SpecDecArgumentError, match="cu_num_draft_tokens"):
        call_packed(dict(packed, cu_num_draft_tokens=torch.tensor([0, 2, 1, 6])), backend, k=2)
    if backend not in TREE_BACKENDS:
        return
    case = random_tree(2, 4, 10, seed=47)
    case["parents"] = torch.tensor([[-1, 0, 2, 1], [-1, 0, 0, 0]])
    case["num_nodes"] = None
    with pytest.raises(SpecDecArgumentError, match="parents"):
        call_tree(case, backend)


def test_op_level_parameter_checks_raise_value_error():
    args = make_batch(2, 2, 10, seed=53)
    with pytest.raises(ValueError, match="top_p"):
        torch.ops.specdec.rejection_sample_logits.default(
            args["target_logits"], args["draft_token_ids"], args["num_draft_tokens"], None, None, None,
            torch.tensor([0.5, 2.0]), None, args["seeds"], args["offsets"], False)


def test_op_level_index_checks_raise_value_error_also_compiled():
    """The C++ ops check the lengths and the trees on CPU tensors themselves, as the probability ops do: a direct
    call, and a wrapper under torch.compile (which reads no values in Python), raise naming the argument."""
    args = make_batch(3, 2, 10, seed=47, ragged=False)
    logits, ids, seeds, offsets = args["target_logits"], args["draft_token_ids"], args["seeds"], args["offsets"]
    op = torch.ops.specdec
    with pytest.raises(ValueError, match=r"num_draft_tokens\[1\] = 3 is outside \[0, K = 2\]"):
        op.rejection_sample_logits.default(logits, ids, torch.tensor([0, 3, 1]), None, None, None, None, None,
                                           seeds, offsets, False)
    packed = to_packed(args)
    for cu, message in (([0, 2, 1, 6], "must be non-decreasing"), ([1, 2, 4, 6], r"cu_num_draft_tokens\[0\]"),
                        ([0, 3, 4, 6], "more than max_num_draft_tokens = 2"), ([0, 2, 4, 5], "must equal")):
        with pytest.raises(ValueError, match=message):
            op.rejection_sample_logits_packed.default(packed["target_logits"], torch.tensor(cu),
                                                      packed["draft_token_ids"], None, None, None, None, None, seeds,
                                                      offsets, False, 2)
    case = random_tree(2, 4, 10, seed=47)
    tree_args = (case["target_logits"], case["tree_token_ids"])
    for parents, num_nodes, message in (([[-1, 0, 2, 1], [-1, 0, 0, 0]], None, r"parents\[0, 2\] = 2"),
                                        ([[-1, 0, 0, 1], [-1, 0, 0, 0]], [4, 0], r"num_nodes\[1\] = 0")):
        with pytest.raises(ValueError, match=message):
            op.tree_rejection_sample_logits.default(
                *tree_args, torch.tensor(parents), None if num_nodes is None else torch.tensor(num_nodes), None,
                None, None, None, None, case["seeds"], case["offsets"], False)

    @torch.compile(fullgraph=True, backend="aot_eager")
    def compiled(cu):
        return specdec_ops.rejection_sample_logits_packed(
            packed["target_logits"], cu, packed["draft_token_ids"], seeds=seeds, max_num_draft_tokens=2).token_ids

    with pytest.raises(Exception, match="more than max_num_draft_tokens = 2"):
        compiled(torch.tensor([0, 3, 4, 6]))


# ---------------------------------------------------------------------------------------------- engine keywords (#14)

ENGINE_BACKENDS = BACKENDS


def with_bonus(args, seed=0, shape_b1=False, dtype=torch.int64):
    batch, vocab = args["target_logits"].shape[0], args["target_logits"].shape[-1]
    ids = torch.randint(0, vocab, (batch,), generator=torch.Generator().manual_seed(seed)).to(dtype)
    return ids[:, None] if shape_b1 else ids


def drop_bonus_rows_padded(args):
    """[B, K, V]: the bonus rows removed (a copy here, to prove they are never needed)."""
    k = args["draft_token_ids"].shape[1]
    return dict(args, target_logits=args["target_logits"][:, :k].contiguous())


def drop_bonus_rows_packed(packed):
    """[T, V]: vLLM's layout, request b owning rows cu[b] .. cu[b+1] - 1."""
    cu = packed["cu_num_draft_tokens"]
    keep = torch.cat([torch.arange(int(cu[b]) + b, int(cu[b + 1]) + b) for b in range(cu.shape[0] - 1)])
    return dict(packed, target_logits=packed["target_logits"][keep].contiguous())


@pytest.mark.parametrize("backend", ENGINE_BACKENDS)
@pytest.mark.parametrize("draft_probs", [True, False], ids=["draft_probs", "one_hot"])
def test_bonus_token_ids_replace_only_the_bonus_token(backend, draft_probs):
    args = make_batch(18, 3, 40, draft_probs=draft_probs, seed=71)
    plain = call(args, backend)
    bonus = with_bonus(args, seed=3)
    out = call(dict(args, bonus_token_ids=bonus), backend)
    n = args["num_draft_tokens"]
    full = plain.num_accepted == n
    assert full.any() and (~full).any()
    assert torch.equal(out.num_accepted, plain.num_accepted)
    rows = torch.arange(n.shape[0])
    expected = plain.token_ids.clone()
    expected[rows[full], n[full]] = bonus[full]
    assert torch.equal(out.token_ids, expected)
    expected_lp = plain.logprobs.clone()
    expected_lp[rows[full], n[full]] = float("nan")
    torch.testing.assert_close(out.logprobs, expected_lp, equal_nan=True, atol=0, rtol=0)
    # [B, 1] int32 (vLLM's shape) is the same
    same = call(dict(args, bonus_token_ids=bonus.to(torch.int32)[:, None]), backend)
    assert_same(same, out)


@pytest.mark.parametrize("backend", ENGINE_BACKENDS)
@pytest.mark.parametrize("draft_probs", [True, False], ids=["draft_probs", "one_hot"])
def test_bonus_rows_may_be_omitted_in_both_layouts(backend, draft_probs):
    args = make_batch(14, 3, 33, draft_probs=draft_probs, seed=73)
    args["bonus_token_ids"] = with_bonus(args, seed=5)
    with_rows = call(args, backend)
    assert_same(call(drop_bonus_rows_padded(args), backend), with_rows)
    packed = to_packed(args)
    assert_same(call_packed(packed, backend, k=3), with_rows)
    no_rows = drop_bonus_rows_packed(packed)
    assert no_rows["target_logits"].shape[0] == packed["draft_token_ids"].shape[0]
    assert_same(call_packed(no_rows, backend, k=3), with_rows)


def test_bonus_rows_are_never_read():
    """NaN-poisoned bonus rows change nothing (they are not read), whereas without bonus_token_ids they do."""
    args = make_batch(12, 2, 20, seed=75, ragged=False)
    args["bonus_token_ids"] = with_bonus(args, seed=6)
    ref = call(args, "cpu")
    poisoned = dict(args, target_logits=args["target_logits"].clone())
    poisoned["target_logits"][:, 2] = float("nan")
    for backend in ENGINE_BACKENDS:
        assert_same(call(poisoned, backend), ref)


def _place_invalid(args, vocab, clean=()):
    """-1 and V placeholders at the first, a middle and the last used slot of several requests (not in the
    requests ``clean``)."""
    ids = args["draft_token_ids"].clone()
    n = args["num_draft_tokens"]
    for b in range(ids.shape[0]):
        nb = int(n[b])
        if nb == 0 or b in clean:
            continue
        slot = [0, nb // 2, nb - 1][b % 3]
        ids[b, slot] = -1 if b % 2 else vocab
    return dict(args, draft_token_ids=ids)


@pytest.mark.parametrize("backend", ENGINE_BACKENDS)
@pytest.mark.parametrize("draft_probs", [True, False], ids=["draft_probs", "one_hot"])
def test_reject_invalid_drafts_rejects_placeholders(backend, draft_probs):
    vocab = 30
    args = make_batch(18, 4, vocab, draft_probs=draft_probs, seed=77, ragged=False)
    args["num_draft_tokens"] = torch.tensor([4, 3, 2, 4, 1, 3] * 3)
    bad = _place_invalid(args, vocab)
    with pytest.raises(SpecDecArgumentError, match="draft_token_ids"):
        call(bad, backend)  # without the flag: an error on CPU
    out = call(dict(bad, reject_invalid_drafts=True), backend)
    ref = call(dict(bad, reject_invalid_drafts=True), "reference")
    assert_same(out, ref)
    first_bad = ((bad["draft_token_ids"] < 0) | (bad["draft_token_ids"] >= vocab)).int().argmax(1)
    assert (out.num_accepted <= first_bad).all()
    assert ((out.token_ids >= -1) & (out.token_ids < vocab)).all()
    # the correction at the placeholder: argmax (greedy) or a race over max(p - q, 0) (p for one-hot drafts),
    # recomputed here from the processed rows and the §5.1 numbers
    probs = specdec_ops.process_logits(args["target_logits"], *(args[n] for n in PARAMS), backend="reference")
    checked = 0
    for b in range(18):
        j = int(first_bad[b])
        if int(out.num_accepted[b]) != j:
            continue
        p = reference.prob_mass(probs[b, j])
        if float(args["temperature"][b]) == 0:
            expected = int(torch.argmax(p))
        else:
            q = reference.prob_mass(args["draft_probs"][b, j]) if draft_probs else torch.zeros(vocab)
            residual = torch.clamp(p - q, min=0.0)
            mass = residual if bool((residual > 0).any()) else p
            expected = reference.race_sample(mass, int(args["seeds"][b]), int(args["offsets"][b]), j,
                                             reference.PURPOSE_RESIDUAL)
        assert int(out.token_ids[b, j]) == expected, b
        checked += 1
    assert checked >= 6
    packed = to_packed(dict(bad, reject_invalid_drafts=True))
    assert_same(call_packed(packed, backend, k=4), out)
    with pytest.raises(SpecDecArgumentError, match="draft_token_ids"):
        call_packed(dict(packed, reject_invalid_drafts=False), backend, k=4)


@pytest.mark.parametrize("backend", ENGINE_BACKENDS)
def test_reject_invalid_drafts_changes_nothing_on_valid_ids(backend):
    args = make_batch(10, 3, 25, seed=79)
    assert_same(call(dict(args, reject_invalid_drafts=True), backend), call(args, backend))


@pytest.mark.parametrize("backend", ENGINE_BACKENDS)
def test_synthetic_rates_force_acceptance_lengths(backend):
    vocab = 20
    args = make_batch(12, 4, vocab, seed=81)
    n = args["num_draft_tokens"]
    forced = dict(args, synthetic_acceptance_rates=torch.tensor([1.0, 1.0, 0.0, 1.0]))
    out = call(forced, backend)
    assert torch.equal(out.num_accepted, torch.minimum(n, torch.tensor(2)).int())
    # logprobs of the accepted drafts too (greedy requests: not the argmax's)
    assert_same(out, call(forced, "reference"))
    # accepted slots keep the draft ids (whatever the target thinks of them, greedy requests too)
    for b in range(12):
        k = int(out.num_accepted[b])
        assert torch.equal(out.token_ids[b, :k], args["draft_token_ids"][b, :k])
    out0 = call(dict(args, synthetic_acceptance_rates=torch.zeros(4)), backend)
    assert (out0.num_accepted == 0).all()
    # an invalid id is rejected even at rate 1 (no error on CPU)
    bad = _place_invalid(args, vocab)
    out1 = call(dict(bad, synthetic_acceptance_rates=torch.ones(5)), backend)
    invalid = (bad["draft_token_ids"] < 0) | (bad["draft_token_ids"] >= vocab)
    used = torch.arange(4) < n[:, None]
    first = torch.where((invalid & used).any(1), (invalid & used).int().argmax(1), n)
    assert torch.equal(out1.num_accepted, first.int())
    assert_same(out1, call(dict(bad, synthetic_acceptance_rates=torch.ones(5)), "reference"))


def test_synthetic_acceptance_lengths_follow_the_geometric_law():
    """Chi-square at alpha = 1e-4 with 40,000 requests (K = 3, V = 16, half of them greedy): the number of
    accepted drafts follows P(L = j) = r_0 ... r_{j-1} (1 - r_j), P(L = 3) = r_0 r_1 r_2."""
    rates = torch.tensor([0.8, 0.5, 0.3])
    batch, k, vocab = STAT_DRAWS, 3, 16
    g = torch.Generator().manual_seed(83)
    logits = torch.randn(1, k + 1, vocab, generator=g).expand(batch, k + 1, vocab).contiguous()
    drafts = torch.randint(0, vocab, (batch, k), generator=g)
    out = specdec_ops.rejection_sample_logits(
        logits, drafts, torch.full((batch,), k), temperature=(torch.arange(batch) % 2).float(),
        seeds=torch.arange(batch, dtype=torch.int64) * 104729 + 5, synthetic_acceptance_rates=rates, backend="cpu")
    counts = torch.bincount(out.num_accepted.long(), minlength=k + 1).double().numpy()
    r = rates.double().numpy()
    expected = np.array([1 - r[0], r[0] * (1 - r[1]), r[0] * r[1] * (1 - r[2]), r[0] * r[1] * r[2]]) * batch
    assert scipy.stats.chisquare(counts, expected).pvalue > ALPHA, (counts, expected)


@pytest.mark.parametrize("draft_probs", [True, False], ids=["draft_probs", "one_hot"])
def test_synthetic_correction_is_distributed_as_the_residual(draft_probs):
    """Chi-square at alpha = 1e-4 with 40,000 requests (V = 12, top-p 0.9): rate 0 at position 0 forces a
    rejection there; the emitted token ~ norm(max(p - q, 0)) with p the brute-force processed target (one-hot
    drafts: p without the draft token)."""
    batch, vocab = STAT_DRAWS, 12
    logits = _stat_logits(2, vocab, seed=85)
    expected_p = brute_force(logits[None], top_p=[0.9])[0, 0]
    g = torch.Generator().manual_seed(87)
    if draft_probs:
        q = torch.softmax(torch.randn(vocab, generator=g), -1)
        drafts = torch.multinomial(q, batch, replacement=True, generator=g)[:, None]
        residual = np.maximum(expected_p - q.double().numpy(), 0.0)
        qs = q.expand(batch, 1, vocab).contiguous()
    else:
        x = int(np.argmax(expected_p))
        drafts = torch.full((batch, 1), x)
        residual = expected_p.copy()
        residual[x] = 0.0
        qs = None
    residual /= residual.sum()
    out = specdec_ops.rejection_sample_logits(
        logits.expand(batch, 2, vocab).contiguous(), drafts, torch.ones(batch, dtype=torch.int64), qs, top_p=0.9,
        seeds=torch.arange(batch, dtype=torch.int64) * 7919 + 11, synthetic_acceptance_rates=torch.zeros(1),
        backend="cpu")
    assert (out.num_accepted == 0).all()
    counts = torch.bincount(out.token_ids[:, 0], minlength=vocab).double().numpy()
    support = residual > 0
    assert counts[~support].sum() == 0, (counts, residual)
    assert scipy.stats.chisquare(counts[support], residual[support] * batch).pvalue > ALPHA, (counts, residual)


@pytest.mark.parametrize("backend", [b for b in ENGINE_BACKENDS if b != "reference"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_engine_keywords_mixed_match_reference(backend, seed):
    """Random batches mixing all three keywords, padded and packed, with and without bonus rows. Every other
    request keeps its drafts free of placeholders, so that chains with drafts are accepted to the end and
    take the external bonus id (not only requests without drafts)."""
    vocab, k = 37, 4
    args = make_batch(15, k, vocab, draft_probs=seed != 1, seed=90 + seed)
    g = torch.Generator().manual_seed(seed)
    clean = range(1, 15, 2)
    args = _place_invalid(args, vocab, clean=clean)
    args.update(bonus_token_ids=with_bonus(args, seed=seed), reject_invalid_drafts=True,
                synthetic_acceptance_rates=torch.rand(k + seed, generator=g) if seed != 2 else None)
    ref = call(args, "reference")
    n = args["num_draft_tokens"]
    full = [b for b in clean if 0 < int(n[b]) == int(ref.num_accepted[b])]
    assert full, "no request with drafts was accepted to the end: the bonus id after a full chain is untested"
    for b in full:
        assert int(ref.token_ids[b, int(n[b])]) == int(args["bonus_token_ids"][b])
    assert_same(call(args, backend), ref)
    assert_same(call(drop_bonus_rows_padded(args), backend), ref)
    packed = to_packed(args)
    assert_same(call_packed(packed, backend, k=k), ref)
    assert_same(call_packed(drop_bonus_rows_packed(packed), backend, k=k), ref)
    no_bonus = dict(args, bonus_token_ids=None)
    assert_same(call(no_bonus, backend), call(no_bonus, "reference"))


@pytest.mark.parametrize("backend", ENGINE_BACKENDS)
def test_engine_keyword_errors(backend):
    args = make_batch(3, 2, 10, seed=93)
    for bad in (torch.tensor([1, 2]), torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1, 10, 2]),
                torch.tensor([[1, -1, 2]]), torch.tensor([[1], [-1], [2]]), torch.tensor([1, 2, 3], device="meta")):
        with pytest.raises(SpecDecArgumentError, match="bonus_token_ids"):
            call(dict(args, bonus_token_ids=bad), backend)
    for bad in (torch.tensor([0.5]), torch.tensor([0.5, 0.5], dtype=torch.float64), torch.tensor([0.5, 1.5]),
                torch.tensor([float("nan"), 0.5]), torch.tensor([[0.5, 0.5]]), torch.tensor([-0.1, 0.5]),
                torch.tensor([0.5, 0.5], device="meta")):
        with pytest.raises(SpecDecArgumentError, match="synthetic_acceptance_rates"):
            call(dict(args, synthetic_acceptance_rates=bad), backend)
    with pytest.raises(SpecDecArgumentError, match="reject_invalid_drafts"):
        call(dict(args, reject_invalid_drafts=1), backend)
    # [B, K, V] without bonus_token_ids, [T, V] without them: the bonus rows are needed
    with pytest.raises(SpecDecArgumentError, match="bonus rows may be omitted only when bonus_token_ids"):
        call(drop_bonus_rows_padded(args), backend)
    packed = to_packed(args)
    with pytest.raises(SpecDecArgumentError, match="target_logits"):
        call_packed(drop_bonus_rows_packed(packed), backend, k=2)
    with pytest.raises(SpecDecArgumentError, match="bonus_token_ids"):
        call_packed(dict(packed, bonus_token_ids=torch.tensor([0, 10, 1])), backend, k=2)
    with pytest.raises(SpecDecArgumentError, match="synthetic_acceptance_rates"):
        call_packed(dict(packed, synthetic_acceptance_rates=torch.tensor([0.1])), backend, k=2)


def test_op_level_engine_keyword_checks():
    args = make_batch(2, 2, 10, seed=95)
    base = (args["target_logits"], args["draft_token_ids"], args["num_draft_tokens"], None, None, None, None, None,
            args["seeds"], args["offsets"], False)
    with pytest.raises(ValueError, match="bonus_token_ids"):
        torch.ops.specdec.rejection_sample_logits.default(*base, torch.tensor([0, 10]), None)
    with pytest.raises(ValueError, match="synthetic_acceptance_rates"):
        torch.ops.specdec.rejection_sample_logits.default(*base, None, torch.tensor([0.5, 2.0]))
    with pytest.raises(TypeError, match="synthetic_acceptance_rates"):
        torch.ops.specdec.rejection_sample_logits.default(*base, None, torch.tensor([0.5, 0.5], dtype=torch.float64))


# ---------------------------------------------------------------------------------------------- torch.library


def _op_samples():
    """(op, args) pairs. opcheck compares outputs without equal_nan, so the samples returning
    logprobs have no padding (K = 0, a root-only tree); the others cover drafts and trees."""
    samples = []
    for k, lp in ((2, False), (0, True)):
        args = make_batch(3, k, 12, seed=1, ragged=False)
        params = tuple(args[n] for n in PARAMS)
        samples.append(("process_logits", (args["target_logits"], *params)))
        samples.append(("rejection_sample_logits", (args["target_logits"], args["draft_token_ids"],
                                                    args["num_draft_tokens"], args["draft_probs"], *params,
                                                    args["seeds"], args["offsets"], lp)))
        packed = to_packed(args)
        samples.append(("rejection_sample_logits_packed", (packed["target_logits"], packed["cu_num_draft_tokens"],
                                                           packed["draft_token_ids"], None, *params, args["seeds"],
                                                           args["offsets"], lp, k)))
    # the engine keywords (#14): external bonus tokens without bonus rows (both layouts), synthetic rates
    args = make_batch(3, 2, 12, seed=3, ragged=False)
    params = tuple(args[n] for n in PARAMS)
    bonus, rates = torch.tensor([1, 5, 11]), torch.tensor([0.9, 0.4, 0.2])
    samples.append(("rejection_sample_logits", (args["target_logits"][:, :2].contiguous(), args["draft_token_ids"],
                                                args["num_draft_tokens"], args["draft_probs"], *params, args["seeds"],
                                                args["offsets"], False, bonus, rates)))
    packed = drop_bonus_rows_packed(to_packed(args))
    samples.append(("rejection_sample_logits_packed", (packed["target_logits"], packed["cu_num_draft_tokens"],
                                                       packed["draft_token_ids"], None, *params, args["seeds"],
                                                       args["offsets"], False, 2, bonus[:, None], None)))
    for nodes, lp in ((4, False), (1, True)):
        case = random_tree(3, nodes, 12, seed=1)
        samples.append(("tree_rejection_sample_logits", (
            case["target_logits"], case["tree_token_ids"], case["parents"], case["num_nodes"], case["draft_probs"],
            *(case[n] for n in PARAMS), case["seeds"], case["offsets"], lp)))
    return samples


@pytest.mark.parametrize("suffix", ["", "_triton"])
def test_opcheck(suffix):
    if suffix and not HAS_TRITON:
        pytest.skip("needs triton")
    for op, args in _op_samples():
        if suffix and op not in _TRITON_OPS:
            continue
        torch.library.opcheck(getattr(torch.ops.specdec, op + suffix).default, args)


def test_torch_compile_fullgraph():
    args = make_batch(4, 3, 32, seed=2)

    @torch.compile(fullgraph=True)
    def step(target_logits, draft_token_ids, num_draft_tokens, draft_probs, temperature, top_k, top_p, min_p, seeds,
             offsets):
        out = specdec_ops.rejection_sample_logits(target_logits, draft_token_ids, num_draft_tokens, draft_probs,
                                                  temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                                                  seeds=seeds, offsets=offsets, return_logprobs=True)
        probs = specdec_ops.process_logits(target_logits, temperature, top_k, top_p, min_p)
        return out.token_ids, out.num_accepted, out.logprobs, probs

    ids, n, lp, probs = step(**args)
    eager = call(args, "cpu")
    assert torch.equal(ids, eager.token_ids) and torch.equal(n, eager.num_accepted)
    torch.testing.assert_close(lp, eager.logprobs, equal_nan=True)
    assert torch.equal(probs, specdec_ops.process_logits(args["target_logits"], *(args[n] for n in PARAMS)))


def test_torch_compile_fullgraph_engine_keywords():
    """vLLM's call: packed [T, V] logits without bonus rows, [B, 1] bonus ids, placeholders, synthetic rates."""
    args = _place_invalid(make_batch(4, 3, 32, seed=5), 32)
    packed = drop_bonus_rows_packed(to_packed(args))
    bonus, rates = with_bonus(args, seed=4, shape_b1=True), torch.tensor([0.9, 0.5, 0.2])

    @torch.compile(fullgraph=True)
    def step(target_logits, cu, draft_token_ids, temperature, seeds, bonus, rates):
        out = specdec_ops.rejection_sample_logits_packed(
            target_logits, cu, draft_token_ids, temperature=temperature, seeds=seeds, return_logprobs=True,
            max_num_draft_tokens=3, bonus_token_ids=bonus, reject_invalid_drafts=True,
            synthetic_acceptance_rates=rates)
        return out.token_ids, out.num_accepted, out.logprobs

    inputs = (packed["target_logits"], packed["cu_num_draft_tokens"], packed["draft_token_ids"],
              args["temperature"], args["seeds"], bonus, rates)
    ids, n, lp = step(*inputs)
    eager = specdec_ops.rejection_sample_logits_packed(
        *inputs[:3], temperature=args["temperature"], seeds=args["seeds"], return_logprobs=True,
        max_num_draft_tokens=3, bonus_token_ids=bonus, reject_invalid_drafts=True, synthetic_acceptance_rates=rates,
        backend="reference")
    assert torch.equal(ids, eager.token_ids) and torch.equal(n, eager.num_accepted)
    torch.testing.assert_close(lp, eager.logprobs, equal_nan=True)


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
def test_triton_kernels_compile_for_sm90_without_a_gpu():
    """The interpreter does not run Triton's code generator: compile every variant of the logits
    kernels to sm_90 ahead of time, so what only the real compiler rejects fails here."""
    compile_ahead_of_time("aot_logits_kernel.py")


# ---------------------------------------------------------------------------------------------- CUDA (skipped here)


def _to(args, device):
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in args.items()}


@pytest.mark.cuda
@pytest.mark.parametrize("draft_probs", [True, False], ids=["draft_probs", "one_hot"])
@pytest.mark.parametrize("vocab", [7, 1025, 8193, 151936])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_equals_cpu(draft_probs, vocab, dtype):
    args = make_batch(24, 4, vocab, draft_probs=draft_probs, dtype=dtype, seed=vocab)
    cpu = call(args, "cpu")
    gpu_backends = ["cuda"] + (["triton"] if "rejection_sample_logits" in _TRITON_OPS else [])
    for backend in gpu_backends:
        gpu = call(_to(args, "cuda"), backend)
        # rare floating-point near-ties (sums in another order, expf ulps) may differ
        same = (gpu.token_ids.cpu() == cpu.token_ids).all(-1).float().mean()
        assert same >= 0.95, backend
        both = (gpu.token_ids.cpu() == cpu.token_ids) & (cpu.token_ids >= 0)
        torch.testing.assert_close(gpu.logprobs.cpu()[both], cpu.logprobs[both], atol=1e-4, rtol=0)
        packed = call_packed(_to(to_packed(args), "cuda"), backend, k=4)
        assert torch.equal(packed.token_ids, gpu.token_ids)
        probs = specdec_ops.process_logits(args["target_logits"].cuda(), *(args[n].cuda() for n in PARAMS),
                                           backend=backend)
        ref = specdec_ops.process_logits(args["target_logits"], *(args[n] for n in PARAMS), backend="cpu")
        torch.testing.assert_close(probs.cpu(), ref, atol=1e-6, rtol=1e-4)


EDGE_TEMPERATURES = [1e-40, 1e-30, 0.02, 1.0, 30.0, 3e38]  # a subnormal T (1 / T overflows), the largest T


def edge_temperature_batch(vocab, dtype, draft_probs):
    """Sampled requests at extreme temperatures, no filters, with non-finite logits in some rows, and
    drafts the target rarely accepts: the races (residual and bonus) run at every temperature."""
    batch = 2 * len(EDGE_TEMPERATURES)
    args = make_batch(batch, 3, vocab, draft_probs=draft_probs, dtype=dtype, seed=vocab + 7, ragged=False)
    for name in ("top_k", "top_p", "min_p"):
        args.pop(name)
    args["temperature"] = torch.tensor(EDGE_TEMPERATURES * 2)
    logits = args["target_logits"]
    logits[1::3, :, 5] = float("nan")
    logits[2::3, :, 9] = float("inf")
    logits[::4, :, : vocab // 2] = float("-inf")
    args["draft_token_ids"] = torch.where(torch.arange(3) % 2 == 0, args["draft_token_ids"], 0)
    return args


@pytest.mark.parametrize("draft_probs", [True, False], ids=["draft_probs", "one_hot"])
def test_edge_temperatures_match_reference(draft_probs):
    args = edge_temperature_batch(301, torch.float32, draft_probs)
    ours, ref = call(args, "cpu"), call(args, "reference")
    assert torch.equal(ours.token_ids, ref.token_ids) and torch.equal(ours.num_accepted, ref.num_accepted)
    torch.testing.assert_close(ours.logprobs, ref.logprobs, atol=1e-4, rtol=0, equal_nan=True)


@pytest.mark.cuda
@pytest.mark.parametrize("draft_probs", [True, False], ids=["draft_probs", "one_hot"])
@pytest.mark.parametrize("vocab", [1025, 151936])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_edge_temperatures_equal_cpu(draft_probs, vocab, dtype):
    """Extreme temperatures on the GPU: at a subnormal one 1 / T overflows, at tiny ones every entry but the
    max is -inf, at huge ones every p is about equal; the tokens are the C++ op's, in the single-block and
    the split kernel alike."""
    args = edge_temperature_batch(vocab, dtype, draft_probs)
    cpu = call(args, "cpu")
    split = call(_to(args, "cuda"), "cuda")
    assert (split.token_ids.cpu() == cpu.token_ids).all(-1).float().mean() >= 0.95
    # the two smallest temperatures make a row's distribution one-hot at its max: no near-ties
    sure = torch.tensor([t <= 1e-30 for t in EDGE_TEMPERATURES * 2])
    assert torch.equal(split.token_ids.cpu()[sure], cpu.token_ids[sure])
    big = _single_block_batch()
    many = {k: (v.repeat(-(-big // v.shape[0]), *([1] * (v.dim() - 1)))[:big] if isinstance(v, torch.Tensor) else v)
            for k, v in args.items()}
    single = call(_to(many, "cuda"), "cuda")
    assert torch.equal(single.token_ids[: split.token_ids.shape[0]], split.token_ids)


@pytest.mark.cuda
def test_cuda_bad_values_are_clamped_safely():
    args = make_batch(6, 3, 50, seed=3)
    args["temperature"] = torch.tensor([-1.0, float("nan"), float("inf"), 0.5, 1.0, 1.0])
    args["top_k"] = torch.tensor([-5, 10**6, 3, 0, 0, 0])
    args["top_p"] = torch.tensor([float("nan"), 2.0, -1.0, 0.0, 1.0, 1.0])
    args["min_p"] = torch.tensor([-1.0, 5.0, float("nan"), 0.0, 0.0, 1.0])
    args["draft_token_ids"][0, 0] = 10**9
    args["num_draft_tokens"] = torch.tensor([3, 3, 99, -2, 1, 1])
    for backend in ["cuda"] + (["triton"] if "rejection_sample_logits" in _TRITON_OPS else []):
        out = call(_to(args, "cuda"), backend)
        torch.cuda.synchronize()
        t = out.token_ids.cpu()
        assert ((t == -1) | ((t >= 0) & (t < 50))).all()
        assert int(out.num_accepted[0]) <= 3


@pytest.mark.cuda
def test_cuda_graph_capture_and_replay():
    args = _to(make_batch(8, 4, 1000, seed=4), "cuda")
    call(args, "cuda")  # warm-up
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call(args, "cuda")
    for _ in range(3):
        args["offsets"].add_(1)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out.token_ids, call(args, "cuda").token_ids)


def _unfiltered(args, temperature):
    """Filters off by absence (the split kernel) and by value (top_p = 1: its kFiltered variant, no filter on)."""
    absent = dict(args, temperature=temperature, top_k=None, top_p=None, min_p=None)
    by_value = dict(absent, top_p=torch.ones(temperature.shape[0], device=temperature.device))
    return absent, by_value


def _assert_identical(a, b):
    assert torch.equal(a.token_ids, b.token_ids) and torch.equal(a.num_accepted, b.num_accepted)
    torch.testing.assert_close(a.logprobs, b.logprobs, atol=0, rtol=0, equal_nan=True)


def _single_block_batch():
    """A batch too large for two blocks per request to be resident at once (at most 32 blocks of 128 threads
    per SM): the launcher runs the single-block kernel for it (logits_split.h logits_split_for)."""
    return torch.cuda.get_device_properties(0).multi_processor_count * 32 + 1


def _requests(args, lo, hi):
    """Requests lo..hi-1 of a padded batch (every per-request tensor sliced)."""
    batch = args["draft_token_ids"].shape[0]
    return {k: (v[lo:hi] if isinstance(v, torch.Tensor) and v.shape[:1] == (batch,) else v) for k, v in args.items()}


@pytest.mark.cuda
@pytest.mark.parametrize("draft_probs", [True, False], ids=["draft_probs", "one_hot"])
@pytest.mark.parametrize("vocab", [1025, 8193])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("filtered", [False, True], ids=["no_filters", "filters"])
def test_cuda_split_kernel_equals_single_block(draft_probs, vocab, dtype, filtered):
    """Requests are independent: a batch too large for the split kernel runs the single-block kernel, and
    slices of it small enough run the split kernel. Without filters they agree bit for bit (tokens, counts,
    logprobs: the kept mass rounds in the same order, logits_split.h); with mixed filters (top-k, top-p,
    min-p) the split threshold comes from fixed-point masses and the single-block one from float atomics,
    so rare near-ties may differ; the split kernel gives the same result on every run."""
    big = _single_block_batch()
    args = _to(make_batch(big, 4, vocab, draft_probs=draft_probs, dtype=dtype, seed=vocab + big), "cuda")
    if not filtered:
        args, _ = _unfiltered(args, torch.tensor([0.0, 1.0, 0.7, 1.3], device="cuda").repeat(big)[:big])
    whole = call(args, "cuda")
    same = 0
    for lo in range(0, big, 64):
        part = _requests(args, lo, min(lo + 64, big))
        split = call(part, "cuda")
        _assert_identical(split, call(part, "cuda"))  # deterministic
        piece = _requests(dict(token_ids=whole.token_ids, num_accepted=whole.num_accepted,
                               logprobs=whole.logprobs, draft_token_ids=args["draft_token_ids"]), lo, lo + 64)
        if not filtered:
            assert torch.equal(split.token_ids, piece["token_ids"])
            assert torch.equal(split.num_accepted, piece["num_accepted"])
            torch.testing.assert_close(split.logprobs, piece["logprobs"], atol=0, rtol=0, equal_nan=True)
        same += int((split.token_ids == piece["token_ids"]).all(-1).sum())
    assert same >= 0.99 * big


def top_p_early_batch(vocab, dtype, draft_probs, batch=64):
    """Rows whose filters are top-p (and min-p in an eighth of them), every draft's logit set so that it holds
    e^o / (1 + e^o) of its row's other mass, o uniform in [-3, 5]: drafts from 5% to almost all of the mass, on
    both sides of the early acceptance's margin (logits_split.h top_p_keeps_surely) and of top-p's cut (every
    request with top_p 0.5 has a large rival entry, which top-p may keep alone, and every one with min-p one that
    makes min-p drop the draft)."""
    args = make_batch(batch, 4, vocab, draft_probs=draft_probs, seed=vocab + 5, ragged=False)
    g = torch.Generator().manual_seed(vocab)
    logits, ids = args["target_logits"], args["draft_token_ids"]
    t = torch.tensor([1.0, 0.7]).repeat(batch // 2)
    rows = torch.arange(batch)[:, None].expand(batch, 4)
    cols = torch.arange(4)[None].expand(batch, 4)
    logits[rows, cols, ids] = -float("inf")
    lse = torch.logsumexp(logits[:, :4] / t[:, None, None], -1)
    logits[rows, cols, ids] = t[:, None] * (lse + torch.rand(batch, 4, generator=g) * 8 - 3)
    # a rival entry: in the requests with top_p 0.5 e^r of the rest's mass (r in [3, 6]), so that top-p drops
    # some drafts that hold a large share; in those with min-p (0.6) e^d times the draft's (d in [0.6, 2]), so
    # that min-p drops every draft there, whatever top-p keeps
    b = torch.arange(batch)[:, None]
    over = torch.where(b % 4 == 1, t[:, None] * (lse + 3 + 3 * torch.rand(batch, 4, generator=g)),
                       logits[rows, cols, ids] + t[:, None] * (0.6 + 1.4 * torch.rand(batch, 4, generator=g)))
    logits[rows, cols, (ids + 1) % vocab] = torch.where((b % 4 == 1) | (b % 8 == 6), over,
                                                        logits[rows, cols, (ids + 1) % vocab])
    args["target_logits"] = logits.to(dtype)
    args["temperature"] = t
    args["top_k"] = None
    args["top_p"] = torch.tensor([0.9, 0.5, 0.99, 0.8]).repeat(batch // 4)
    args["min_p"] = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.6, 0.0]).repeat(batch // 8)
    return args


@pytest.mark.cuda
@pytest.mark.parametrize("draft_probs", [True, False], ids=["draft_probs", "one_hot"])
@pytest.mark.parametrize("vocab", [1025, 128256])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_top_p_early_acceptance_is_the_full_paths(draft_probs, vocab, dtype):
    """Without logprobs, a draft row whose filters are top-p (and min-p) is accepted before its select when top-p
    surely keeps the draft and the test against the sum over every entry accepts it (logits_split.h
    top_p_accepts_early); with logprobs every row runs the select and the kept mass. The split kernel gives the
    same tokens both ways (the early test never accepts what the full path rejects, and rejects only into the full
    path; a bonus row at temperature 1 takes the early bonus token, the filtered race's winner up to a
    floating-point near-tie: its scores divide by another sum), and the C++ op's up to near-ties."""
    args = top_p_early_batch(vocab, dtype, draft_probs)
    cuda = _to(args, "cuda")
    fast = call(cuda, "cuda", return_logprobs=False)
    full = call(cuda, "cuda", return_logprobs=True)
    assert torch.equal(fast.token_ids, full.token_ids) and torch.equal(fast.num_accepted, full.num_accepted)
    assert float(fast.num_accepted.float().mean()) > 0.8  # drafts accepted: rows for the early test
    cpu = call(args, "cpu", return_logprobs=False)
    assert (fast.token_ids.cpu() == cpu.token_ids).all(-1).float().mean() >= 0.95
    packed = call_packed(_to(to_packed(args), "cuda"), "cuda", k=4, return_logprobs=False)
    assert torch.equal(packed.token_ids, fast.token_ids)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_top_p_early_bonus_is_distributed_as_the_kept_entries(dtype):
    """Every draft accepted (its logit 40 above the rest), so the bonus row gives the last token. At temperature 1
    with top-p (and min-p) the split kernel races the bonus row without its select and keeps the winner where top-p
    surely keeps it (logits_split.h top_p_verdict_above), racing again above a winner it drops, into the full path
    after 4 rounds. Chi-square at alpha 1e-4 over 64 x 160 draws per setting against process_logits' distribution
    on a flat row (V = 1025): top_p 0.9 keeps about 9 winners in 10, 0.5 half of them, 0.05 needs more rounds than
    it gets; min-p drops winners top-p keeps. With logprobs every row runs the select: the same tokens up to
    near-ties."""
    vocab, batch, calls = 1025, 64, 160
    g = torch.Generator().manual_seed(5)
    row = torch.randn(vocab, generator=g).to(dtype).float()
    for top_p, min_p in ((0.9, 0.0), (0.5, 0.0), (0.05, 0.0), (0.9, 0.3)):
        logits = torch.randn(batch, 3, vocab, generator=g)
        ids = torch.randint(0, vocab, (batch, 2), generator=g)
        logits[torch.arange(batch)[:, None], torch.arange(2)[None], ids] = 40.0
        logits[:, 2] = row
        args = dict(target_logits=logits.to(dtype).cuda(), draft_token_ids=ids.cuda(),
                    num_draft_tokens=torch.full((batch,), 2).cuda(), draft_probs=None,
                    top_p=torch.full((batch,), top_p).cuda(), min_p=torch.full((batch,), min_p).cuda())
        counts = torch.zeros(vocab, dtype=torch.float64)
        same = 0
        for c in range(calls):
            seeds = (torch.arange(batch) * 7919 + c * 104729 + 11).cuda()
            fast = call(dict(args, seeds=seeds), "cuda", return_logprobs=False)
            full = call(dict(args, seeds=seeds), "cuda", return_logprobs=True)
            assert bool((fast.num_accepted == 2).all())
            counts += torch.bincount(fast.token_ids[:, 2].cpu(), minlength=vocab).double()
            same += int((fast.token_ids == full.token_ids).all(-1).sum())
        assert same >= 0.999 * batch * calls, (top_p, min_p, same)
        expected = specdec_ops.process_logits(row[None], torch.tensor([1.0]), None, torch.tensor([top_p]),
                                              torch.tensor([min_p]), backend="cpu")[0].double()
        support = expected > 0
        assert counts[~support].sum() == 0, (top_p, min_p)
        total = counts.sum()
        assert scipy.stats.chisquare(counts[support].numpy(), (expected[support] * total).numpy()).pvalue > ALPHA, \
            (top_p, min_p)


def test_top_p_early_batch_reaches_both_sides_of_the_margin():
    """The batch the GPU test above runs, on the CPU op: drafts of top-p rows accepted with a share of the
    unfiltered mass above 1 - top_p + 2% (where the early test may accept) and below (where only the select
    can), rejections, and drafts with a large share that top-p drops (a larger rival): what an early test
    without its keep test would accept."""
    counts = torch.zeros(4, dtype=torch.int64)
    for draft_probs in (False, True):
        args = top_p_early_batch(1025, torch.float32, draft_probs=draft_probs)
        out = call(args, "cpu", return_logprobs=False)
        logits, ids = args["target_logits"], args["draft_token_ids"]
        share = torch.softmax(logits[:, :4] / args["temperature"][:, None, None], -1).gather(2, ids[..., None])[..., 0]
        accepted = torch.arange(4)[None] < out.num_accepted[:, None]
        wide = share > 1 - args["top_p"][:, None] + 0.02
        probs = specdec_ops.process_logits(logits[:, :4], args["temperature"], None, args["top_p"], args["min_p"])
        dropped = probs.gather(2, ids[..., None])[..., 0] == 0
        counts += torch.tensor([int((accepted & wide).sum()), int((accepted & ~wide).sum()),
                                int((out.num_accepted < 4).sum()), int((dropped & (share > 0.15)).sum())])
    assert counts[0] >= 100 and counts[1] >= 5 and counts[2] >= 20 and counts[3] >= 10, counts


@pytest.mark.cuda
@pytest.mark.parametrize("draft_probs", [True, False], ids=["draft_probs", "one_hot"])
@pytest.mark.parametrize("vocab,batch", [(1025, 8), (128256, 64), (151936, 200), (40, 3)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_filters_off_by_value_equal_absent_bit_for_bit(draft_probs, vocab, batch, dtype):
    """Filter tensors that filter nothing (top_p = 1) run the split kernel's kFiltered variant; the same
    batch without filter tensors its plain variant: the same tokens, counts and logprobs bit for bit.
    Temperatures mix greedy, 1 and others."""
    args = _to(make_batch(batch, 4, vocab, draft_probs=draft_probs, dtype=dtype, seed=vocab + batch), "cuda")
    temperature = torch.tensor([0.0, 1.0, 0.7, 1.3], device="cuda").repeat(batch)[:batch]
    absent, by_value = _unfiltered(args, temperature)
    _assert_identical(call(absent, "cuda"), call(by_value, "cuda"))
    packed_absent, packed_value = (_to(to_packed(_to(a, "cpu")), "cuda") for a in (absent, by_value))
    _assert_identical(call_packed(packed_absent, "cuda", k=4), call_packed(packed_value, "cuda", k=4))
    # every draft rejected at once (the residual race on row 0) and all accepted (the bonus race)
    for ids in (args["draft_token_ids"].neg().sub(1), args["target_logits"][:, :4].float().argmax(-1)):
        a, v = dict(absent, draft_token_ids=ids), dict(by_value, draft_token_ids=ids)
        _assert_identical(call(a, "cuda"), call(v, "cuda"))


@pytest.mark.cuda
@pytest.mark.parametrize("filtered", [False, True], ids=["no_filters", "filters"])
def test_cuda_split_kernel_graph_capture_and_replay(filtered):
    args = _to(make_batch(64, 4, 32000, seed=5, dtype=torch.bfloat16), "cuda")  # mixed filters
    absent = args if filtered else _unfiltered(args, torch.ones(64, device="cuda"))[0]
    call(absent, "cuda")  # warm-up
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call(absent, "cuda")
    for _ in range(3):
        absent["offsets"].add_(1)
        graph.replay()
        torch.cuda.synchronize()
        _assert_identical(out, call(absent, "cuda"))


@pytest.mark.cuda
@pytest.mark.parametrize("draft_probs", [True, False], ids=["draft_probs", "one_hot"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_tree_equals_cpu(draft_probs, dtype):
    case = random_tree(16, 9, 1025, draft_probs=draft_probs, dtype=dtype, seed=61)
    cpu = call_tree(case, "cpu")
    for backend in ["cuda"] + (["triton"] if "tree_rejection_sample_logits" in _TRITON_OPS else []):
        gpu = call_tree(_to(case, "cuda"), backend)
        same = (gpu.token_ids.cpu() == cpu.token_ids).all(-1).float().mean()
        assert same >= 0.9, backend
        both = (gpu.token_ids.cpu() == cpu.token_ids) & (cpu.token_ids >= 0)
        torch.testing.assert_close(gpu.logprobs.cpu()[both], cpu.logprobs[both], atol=1e-4, rtol=0)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_engine_keywords_equal_cpu(dtype):
    """The engine keywords (#14) on the GPU backends: equal to the CPU op (floating-point near-ties aside),
    bonus rows omitted in both layouts read in place, bad values handled without a host sync."""
    vocab, k = 1025, 4
    clean = make_batch(24, k, vocab, dtype=dtype, seed=97)
    args = _place_invalid(clean, vocab)
    args.update(bonus_token_ids=with_bonus(args, seed=9), reject_invalid_drafts=True,
                synthetic_acceptance_rates=torch.tensor([0.9, 0.7, 0.5, 0.3]))
    cpu = call(args, "cpu")
    for backend in ["cuda"] + (["triton"] if "rejection_sample_logits" in _TRITON_OPS else []):
        gpu = call(_to(args, "cuda"), backend)
        assert (gpu.token_ids.cpu() == cpu.token_ids).all(-1).float().mean() >= 0.95, backend
        assert_same(call(_to(drop_bonus_rows_padded(args), "cuda"), backend), gpu)
        packed = to_packed(args)
        assert_same(call_packed(_to(drop_bonus_rows_packed(packed), "cuda"), backend, k=k), gpu)
        assert_same(call_packed(_to(packed, "cuda"), backend, k=k), gpu)
        # GPU: bonus ids clamped into [0, V), a NaN rate never accepts
        bad = _to(dict(args, bonus_token_ids=torch.tensor([-5, vocab + 3] * 12),
                       synthetic_acceptance_rates=torch.tensor([float("nan"), 1.0, 1.0, 1.0])), "cuda")
        out = call(bad, backend)
        assert (out.num_accepted == 0).all()
        full = call(dict(bad, draft_token_ids=clean["draft_token_ids"].cuda(),
                         synthetic_acceptance_rates=torch.ones(k, device="cuda")), backend)
        n = args["num_draft_tokens"].cuda()
        done = full.num_accepted == n
        assert done.all()
        last = full.token_ids.gather(1, n[:, None].long())[:, 0]
        expected = torch.tensor([0, vocab - 1] * 12, device="cuda")
        assert torch.equal(last[done], expected[done])


# ------------------------------------------------------------------------------- Triton chain split (no filters)


def _split_cases():
    """Requests that reach every branch of the split walk: greedy and sampled, a rejection at 0, at 2, a full
    acceptance (bonus race), no drafts, an out-of-vocabulary draft, a row without a finite logit, NaN and inf
    logits, and a draft row whose residual has no mass (q == p there: the race falls back to p)."""
    g = torch.Generator().manual_seed(11)
    batch, k, vocab = 9, 4, 203  # 203: not a multiple of the tile (16) nor of the chunk (48)
    logits = torch.randn(batch, k + 1, vocab, generator=g) * 3
    drafts = torch.randint(0, vocab, (batch, k), generator=g)
    drafts[:5] = logits[:5, :k].argmax(-1)          # greedy requests 1, 3 accept; sampled ones often
    drafts[4, 2] = vocab + 7                          # out of the vocabulary: rejected at 2
    logits[5, 1] = float("-inf")                       # no finite logit on request 5's row 1
    logits[2, 0] = float("-inf")                       # nor on request 2's bonus row: every score is 0, entry 0
                                                       # wins (a combine preferring a later chunk on ties fails)
    logits[6, 0, 17] = float("nan")
    logits[6, 0, 150] = float("inf")                   # the maximum sits in a later chunk
    num = torch.tensor([4, 4, 0, 3, 4, 4, 2, 4, 1])
    temperature = torch.tensor([1.0, 0.0, 0.8, 0.0, 1.2, 1.0, 0.7, 1.0, 0.0])
    q = torch.softmax(torch.randn(batch, k, vocab, generator=g) * 2, -1)
    # request 7, row 0: q is p itself, so max(p - q, 0) has no mass (up to rounding: p has no underflow here)
    q[7, 0] = torch.softmax(logits[7, 0].double() / 1.0, -1).float()
    seeds = torch.arange(batch, dtype=torch.int64) * 3 + 1
    return logits, drafts, num, temperature, q, seeds


@pytest.mark.skipif("rejection_sample_logits" not in _TRITON_OPS, reason="triton not installed")
@pytest.mark.parametrize("draft_probs", [False, True])
@pytest.mark.parametrize("logprobs", [False, True])
@pytest.mark.parametrize("chunk", [16, 48, 256])
def test_triton_split_chain_equals_the_cpu_op(draft_probs, logprobs, chunk):
    """The split pair (chunk partials, then walk + race over chunks with a ticket) against the C++ op, chunk
    sizes from one tile per chunk to one chunk per row, other offsets (other random numbers: races and acceptances
    land elsewhere) at the middle size without log-probabilities."""
    from specdec_ops.logits import _launch_chain

    logits, drafts, num, temperature, q, seeds = _split_cases()
    q = q if draft_probs else None
    for offset in range(3 if chunk == 48 and not logprobs else 1):
        offsets = torch.full((logits.shape[0],), offset, dtype=torch.int64)
        ref = specdec_ops.rejection_sample_logits(logits, drafts, num, q, temperature=temperature, seeds=seeds,
                                                  offsets=offsets, return_logprobs=logprobs, reject_invalid_drafts=True,
                                                  backend="cpu")
        ids, accepted, lps = _launch_chain(logits, drafts, num, q, (temperature, None, None, None), seeds, offsets,
                                           logprobs, logits.shape[0], drafts.shape[1], packed=False, bonus_rows=True,
                                           bonus_token_ids=None, rates=None, chunk=chunk, block=16)
        assert torch.equal(ids, ref.token_ids), (offset, ids, ref.token_ids)
        assert torch.equal(accepted, ref.num_accepted)
        if logprobs:
            torch.testing.assert_close(lps, ref.logprobs, rtol=0, atol=1e-5, equal_nan=True)


@pytest.mark.skipif("rejection_sample_logits" not in _TRITON_OPS, reason="triton not installed")
@pytest.mark.parametrize("race_group", [2, 3, 13, 20])
def test_triton_split_chain_race_groups_equal_the_cpu_op(race_group):
    """The walk kernel's race over several chunks a program (RACE_GROUP: 13 chunks of 16 in 7, 5, 1 and 1
    programs, the last one's group past the row's end) against the C++ op, with and without draft probs and
    log-probabilities: the programs' winners merge into the race over the whole row."""
    from specdec_ops.logits import _launch_chain

    logits, drafts, num, temperature, q, seeds = _split_cases()
    for dp, logprobs, offset in ((None, False, 0), (q, True, 1), (q, False, 2)):
        offsets = torch.full((logits.shape[0],), offset, dtype=torch.int64)
        ref = specdec_ops.rejection_sample_logits(logits, drafts, num, dp, temperature=temperature, seeds=seeds,
                                                  offsets=offsets, return_logprobs=logprobs,
                                                  reject_invalid_drafts=True, backend="cpu")
        ids, accepted, lps = _launch_chain(logits, drafts, num, dp, (temperature, None, None, None), seeds, offsets,
                                           logprobs, logits.shape[0], drafts.shape[1], packed=False, bonus_rows=True,
                                           bonus_token_ids=None, rates=None, chunk=16, block=16, race_group=race_group)
        assert torch.equal(ids, ref.token_ids), (offset, ids, ref.token_ids)
        assert torch.equal(accepted, ref.num_accepted)
        if logprobs:
            torch.testing.assert_close(lps, ref.logprobs, rtol=0, atol=1e-5, equal_nan=True)


def test_chain_race_group_only_past_a_wave():
    """chain_race_group: 2 chunks a race program once one chunk per program would take more than a wave (6
    programs per SM), else 1; 1 for a single chunk."""
    from specdec_ops.logits import chain_race_group

    assert chain_race_group(64, 16, 132) == 2        # 1024 programs > 792
    assert chain_race_group(48, 16, 132) == 1        # 768: one wave
    assert chain_race_group(64, 16, 200) == 1
    assert chain_race_group(4096, 1, 132) == 1       # one chunk
    assert chain_race_group(8, 16, 132) == 1


@pytest.mark.skipif("rejection_sample_logits" not in _TRITON_OPS, reason="triton not installed")
@pytest.mark.parametrize("has_t", [True, False], ids=["temperature", "unit"])
def test_triton_chunk_partials_against_float64(has_t):
    """chain_row_partials_kernel alone, chunks of 4 tiles of 16: (max, first argmax, sum of exp((x - max) / T))
    per chunk against float64. Rows where the max is raised in a later tile (the running sum must be rescaled),
    ties of the max across tiles (first index), leading tiles without a finite logit, a chunk without any,
    +inf (the largest float32) and NaN (-inf) entries, tiny and large temperatures, greedy rows (T = 0: the sum
    at T = 1). Without a temperature tensor the argmax is not computed (every request samples at T = 1 and
    the walk never reads it): the chunk's first index stands in its place."""
    from specdec_ops.triton_kernels.logits import chain_row_partials_kernel

    g = torch.Generator().manual_seed(5)
    batch, k, chunk, block = 6, 1, 64, 16
    vocab = 2 * chunk + 37                               # 3 chunks, the last one partial
    x = torch.randn(batch, k + 1, vocab, generator=g) * 4
    x[0, 0, :chunk] = torch.linspace(-20, 5, chunk)    # the max rises in every tile of chunk 0
    x[1, 0, [3, 20, 40]] = 30.0                        # ties of the max in tiles 0, 1, 2 -> 3
    x[1, 1, 70:100] = 30.0                             # ties inside chunk 1 from its first tile on -> 70
    x[2, 0, :40] = float("-inf")                       # leading tiles without a finite logit
    x[2, 0, 40] = float("nan")
    x[2, 1, chunk:2 * chunk] = float("-inf")           # chunk 1 without a finite logit
    x[3, 0, 50] = float("inf")                         # the largest float32: the max, every other entry 0
    x[3, 1, chunk + 5] = float("nan")
    temperature = torch.tensor([1.0, 0.0, 0.7, 2.5, 1e-3, 40.0])
    num = torch.ones(batch, dtype=torch.int64)
    chunks = -(-vocab // chunk)
    part_max = torch.full((batch * (k + 1), chunks), 7.0)
    part_arg = torch.full((batch * (k + 1), chunks), -9, dtype=torch.int64)
    part_sum = torch.full((batch * (k + 1), chunks), 7.0)
    chain_row_partials_kernel[(batch * (k + 1), chunks)](
        x, num, temperature, part_max, part_arg, part_sum, vocab, k, batch * k, 1,
        PACKED=False, HAS_T=has_t, HAS_BONUS=False, TREE=False, CHUNKS=chunks, CHUNK=chunk, PART_BLOCK=block)
    flat = x.reshape(batch * (k + 1), vocab).double()
    flat = torch.where(flat.isnan(), float("-inf"), flat).clamp(max=torch.finfo(torch.float32).max)
    for j in range(batch * (k + 1)):
        t = float(temperature[j // (k + 1)]) if has_t else 1.0
        t = t if t > 0 else 1.0
        for c in range(chunks):
            seg = flat[j, c * chunk:(c + 1) * chunk]
            m = float(seg.max())
            assert float(part_max[j, c]) == m, (j, c)
            if m == float("-inf"):
                assert float(part_sum[j, c]) == 0.0, (j, c)
                want_arg = c * chunk
            else:
                want = float(torch.exp((seg - m) / t).sum())
                assert abs(float(part_sum[j, c]) - want) <= 1e-5 * want, (j, c, float(part_sum[j, c]), want)
                want_arg = c * chunk + int((seg == m).nonzero()[0]) if has_t else c * chunk
            assert int(part_arg[j, c]) == want_arg, (j, c, int(part_arg[j, c]), want_arg)


@pytest.mark.skipif("rejection_sample_logits" not in _TRITON_OPS, reason="triton not installed")
def test_triton_split_chain_packed_bonus_ids_and_rates_equal_the_cpu_op():
    """Packed rows without bonus rows (external bonus ids), then synthetic acceptance rates, on several chunks."""
    from specdec_ops.logits import _launch_chain

    logits, drafts, num, temperature, q, seeds = _split_cases()
    batch, k = drafts.shape[0], drafts.shape[1]
    cu = torch.cat([torch.zeros(1, dtype=torch.int64), num.cumsum(0)])
    packed_drafts = torch.cat([drafts[b, :num[b]] for b in range(batch)])
    packed_q = torch.cat([q[b, :num[b]] for b in range(batch)])
    packed_rows = torch.cat([logits[b, :num[b]] for b in range(batch)])        # no bonus rows
    bonus = torch.arange(batch, dtype=torch.int64) * 7 + 3
    offsets = torch.zeros(batch, dtype=torch.int64)
    for dp in (None, packed_q):
        ref = specdec_ops.rejection_sample_logits_packed(
            packed_rows, cu, packed_drafts, dp, temperature=temperature, seeds=seeds, offsets=offsets,
            return_logprobs=True, max_num_draft_tokens=k, bonus_token_ids=bonus, reject_invalid_drafts=True,
            backend="cpu")
        ids, accepted, lps = _launch_chain(packed_rows, packed_drafts, cu, dp, (temperature, None, None, None), seeds,
                                           offsets, True, batch, k, packed=True, bonus_rows=False,
                                           bonus_token_ids=bonus, rates=None, chunk=32, block=16)
        assert torch.equal(ids, ref.token_ids) and torch.equal(accepted, ref.num_accepted)
        torch.testing.assert_close(lps, ref.logprobs, rtol=0, atol=1e-5, equal_nan=True)
    rates = torch.tensor([0.9, 0.5, 0.2, 0.7])
    for offset in range(2):
        offsets = torch.full((batch,), offset, dtype=torch.int64)
        ref = specdec_ops.rejection_sample_logits(logits, drafts, num, temperature=temperature, seeds=seeds,
                                                  offsets=offsets, synthetic_acceptance_rates=rates,
                                                  reject_invalid_drafts=True, backend="cpu")
        ids, accepted, _ = _launch_chain(logits, drafts, num, None, (temperature, None, None, None), seeds, offsets,
                                         False, batch, k, packed=False, bonus_rows=True, bonus_token_ids=None,
                                         rates=rates, chunk=48, block=16)
        assert torch.equal(ids, ref.token_ids) and torch.equal(accepted, ref.num_accepted)


def _fused_call(logits, drafts, num, q, temperature, seeds, offsets, fused=True, chunk=48, **kw):
    from specdec_ops.logits import _launch_chain

    packed = kw.pop("packed", False)
    batch = kw.pop("batch", drafts.shape[0])
    k = kw.pop("k", drafts.shape[-1])
    ids, accepted, _ = _launch_chain(logits, drafts, num, q, (temperature, None, None, None), seeds, offsets, False,
                                     batch, k, packed=packed, bonus_rows=kw.pop("bonus_rows", True),
                                     bonus_token_ids=kw.pop("bonus_token_ids", None), rates=None, chunk=chunk,
                                     block=kw.pop("block", 16), fused=fused, **kw)
    return ids, accepted


@pytest.mark.skipif("rejection_sample_logits" not in _TRITON_OPS, reason="triton not installed")
@pytest.mark.parametrize("dtype,vocab", [(torch.bfloat16, 204), (torch.bfloat16, 202), (torch.bfloat16, 203),
                                         (torch.float16, 204), (torch.float32, 203)],
                         ids=["bf16-quads", "bf16-pairs", "bf16-odd", "fp16", "fp32"])
def test_triton_fused_chain_equals_the_split_pair_and_the_cpu_op(dtype, vocab):
    """chain_fused_kernel (one launch: the chunks' partials with the bonus race in the same pass, then the
    request programs' walk and, after a rejection, their race) against the two-kernel path and the C++ op, on
    _split_cases' rows (greedy and sampled, rejections at 0 and 2, full acceptance, no drafts, an
    out-of-vocabulary draft, rows without a finite logit, NaN and inf, a residual without mass) in the logits'
    dtype; bfloat16 with an even vocabulary reads pairs of entries as 32-bit words (bf16_pairs), and its bonus
    race, with a vocabulary of a multiple of 4, quads as 64-bit words (bf16_quads, the random bits of a quad in
    its thread); with an odd one entry by entry. Chunks of 48 (3 tiles: the running max rises across tiles);
    then chunks of 96 with the race after a rejection over chunks of 48, one or two a program."""
    logits, drafts, num, temperature, q, seeds = _split_cases()
    logits = torch.cat([logits, logits[..., :1] - 1.0], -1)[..., :vocab].to(dtype)
    drafts = drafts.clamp(max=vocab + 7)
    q = torch.softmax(torch.randn(*drafts.shape, vocab, generator=torch.Generator().manual_seed(3)) * 2, -1)
    for dp in (None, q.to(dtype)):
        for offset in range(3):
            offsets = torch.full((logits.shape[0],), offset, dtype=torch.int64)
            ref = specdec_ops.rejection_sample_logits(logits, drafts, num, dp, temperature=temperature, seeds=seeds,
                                                      offsets=offsets, reject_invalid_drafts=True, backend="cpu")
            fused = _fused_call(logits, drafts, num, dp, temperature, seeds, offsets)
            split = _fused_call(logits, drafts, num, dp, temperature, seeds, offsets, fused=False)
            assert torch.equal(fused[0], split[0]) and torch.equal(fused[1], split[1]), (offset, fused, split)
            # partials over chunks of 96 (2 of the rejection race's 48: as fused_chunk's long chunks race after a
            # rejection over chunks of SPLIT_CHUNK), the race group 2 or 1 (one offset: the interpreter's time)
            for group in (1, 2) if offset == 0 else ():
                longer = _fused_call(logits, drafts, num, dp, temperature, seeds, offsets, chunk=96, race_chunk=48,
                                     race_group=group)
                assert torch.equal(longer[0], fused[0]) and torch.equal(longer[1], fused[1]), (offset, group)
            assert torch.equal(fused[0], ref.token_ids), (offset, dp is None, fused[0], ref.token_ids)
            assert torch.equal(fused[1], ref.num_accepted)


@pytest.mark.skipif("rejection_sample_logits" not in _TRITON_OPS, reason="triton not installed")
def test_triton_fused_chain_bonus_race_across_tiles_and_chunks():
    """The fused bonus race on rows whose maximum rises from tile to tile and from chunk to chunk (the running
    best rescaled with the sum, the chunks' winners rescaled to the row's max before they are compared): the
    bonus token of 48 requests without drafts, a third of them at other temperatures, equals the C++ op's
    (a race that kept an earlier tile's score unscaled, or compared the chunks' scores as they are, favours
    the row's start). Then the same rows in bfloat16: read as quads (rows 8-byte aligned), from views 4 bytes
    off (pairs) and 2 bytes off (entry by entry)."""
    batch, vocab = 48, 320
    g = torch.Generator().manual_seed(5)
    logits = (torch.linspace(-4.0, 4.0, vocab) + torch.randn(batch, 1, vocab, generator=g)).contiguous()
    drafts = torch.zeros(batch, 0, dtype=torch.int64)
    num = torch.zeros(batch, dtype=torch.int64)
    seeds = torch.arange(batch, dtype=torch.int64) * 7 + 2
    offsets = torch.zeros(batch, dtype=torch.int64)
    temperature = torch.tensor([1.0, 0.6, 1.7] * (batch // 3))
    flat = logits.to(torch.bfloat16).flatten()
    for rows in (logits, logits.to(torch.bfloat16),
                 torch.cat([torch.zeros(2, dtype=flat.dtype), flat])[2:].view(batch, 1, vocab),
                 torch.cat([torch.zeros(1, dtype=flat.dtype), flat])[1:].view(batch, 1, vocab)):
        ref = specdec_ops.rejection_sample_logits(rows, drafts, num, temperature=temperature, seeds=seeds,
                                                  offsets=offsets, backend="cpu")
        ids, _ = _fused_call(rows, drafts, num, None, temperature, seeds, offsets, chunk=64, k=0)
        assert torch.equal(ids, ref.token_ids), (rows.dtype, ids[:, 0], ref.token_ids[:, 0])
        assert len(set((ref.token_ids[:, 0] // 64).tolist())) >= 3  # winners in several chunks


@pytest.mark.skipif("rejection_sample_logits" not in _TRITON_OPS, reason="triton not installed")
@pytest.mark.parametrize("vocab", [14, 16], ids=["pairs", "quads"])
def test_triton_fused_bonus_race_emits_the_target(vocab):
    """Chi-square at alpha = 1e-4 with 1,200 requests (no drafts, V = 14 or 16 in 2 chunks of 8 over tiles of
    4, bf16 logits, temperature 0.8; few requests: the interpreter runs 2 programs a request, 20 ms each): the
    fused bonus race's token ~ softmax(logits / T), computed here in float64 from the same bf16 values; the
    race over entries one by one (V = 14: chunk_partials_race) and over quads (V = 16: the quads' race)."""
    batch, t = 1200, 0.8
    row = (torch.randn(vocab, generator=torch.Generator().manual_seed(21)) * 1.5).to(torch.bfloat16)
    logits = row.expand(batch, 1, vocab).contiguous()
    ids, _ = _fused_call(logits, torch.zeros(batch, 0, dtype=torch.int64), torch.zeros(batch, dtype=torch.int64),
                         None, torch.full((batch,), t), torch.arange(batch, dtype=torch.int64) * 7919 + 3,
                         torch.zeros(batch, dtype=torch.int64), chunk=8, k=0, block=4)
    counts = torch.bincount(ids[:, 0], minlength=vocab).double().numpy()
    expected = torch.softmax(row.double() / t, -1).numpy() * batch
    assert scipy.stats.chisquare(counts, expected).pvalue > ALPHA, (counts, expected)


@pytest.mark.skipif("rejection_sample_logits" not in _TRITON_OPS, reason="triton not installed")
def test_triton_fused_chain_packed_rows_and_bonus_ids():
    """chain_fused_kernel on packed rows, with bonus rows and without (external bonus ids: the bonus row is never
    read, the walk stops after the last draft), with and without draft probabilities, against the C++ op."""
    logits, drafts, num, temperature, q, seeds = _split_cases()
    batch, k = drafts.shape
    cu = torch.cat([torch.zeros(1, dtype=torch.int64), num.cumsum(0)])
    packed_drafts = torch.cat([drafts[b, :num[b]] for b in range(batch)])
    packed_q = torch.cat([q[b, :num[b]] for b in range(batch)])
    with_bonus = torch.cat([logits[b, :num[b] + 1] for b in range(batch)])
    without = torch.cat([logits[b, :num[b]] for b in range(batch)])
    bonus = torch.arange(batch, dtype=torch.int64) * 7 + 3
    offsets = torch.ones(batch, dtype=torch.int64)
    for dp in (None, packed_q):
        for rows, bonus_ids in ((with_bonus, None), (without, bonus)):
            ref = specdec_ops.rejection_sample_logits_packed(
                rows, cu, packed_drafts, dp, temperature=temperature, seeds=seeds, offsets=offsets,
                max_num_draft_tokens=k, bonus_token_ids=bonus_ids, reject_invalid_drafts=True, backend="cpu")
            ids, accepted = _fused_call(rows, packed_drafts, cu, dp, temperature, seeds, offsets, chunk=32,
                                        packed=True, batch=batch, k=k, bonus_rows=bonus_ids is None,
                                        bonus_token_ids=bonus_ids)
            assert torch.equal(ids, ref.token_ids) and torch.equal(accepted, ref.num_accepted), (ids, ref.token_ids)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_draft_without_mass_under_both_models_is_rejected(backend):
    """A draft whose target logit is -inf (p(x) = 0) and whose draft probability is 0 too: u q(x) < p(x) is
    0 < 0, so it is rejected whatever the uniform (an acceptance test turned `<=` accepts it), on every
    backend and, on Triton, the one-launch path and the split pair alike; the rows after it are never used."""
    batch, k, vocab = 6, 3, 64
    g = torch.Generator().manual_seed(9)
    logits = torch.randn(batch, k + 1, vocab, generator=g)
    drafts = torch.randint(1, vocab, (batch, k), generator=g)
    drafts[:, 0] = 0
    logits[:, 0, 0] = float("-inf")
    q = torch.softmax(torch.randn(batch, k, vocab, generator=g), -1)
    q[:, 0, 0] = 0.0
    q[:, 0] /= q[:, 0].sum(-1, keepdim=True)
    num = torch.full((batch,), k, dtype=torch.int64)
    seeds = torch.arange(batch, dtype=torch.int64)
    for offset in range(4):
        offsets = torch.full((batch,), offset, dtype=torch.int64)
        out = specdec_ops.rejection_sample_logits(logits, drafts, num, q, temperature=torch.ones(batch), seeds=seeds,
                                                  offsets=offsets, backend=backend)
        assert (out.num_accepted == 0).all(), out.num_accepted
        assert (out.token_ids[:, 0] != 0).all() and (out.token_ids[:, 1:] == -1).all()
        if backend == "triton":
            split = _fused_call(logits, drafts, num, q, torch.ones(batch), seeds, offsets, fused=False, chunk=32)
            assert torch.equal(split[0], out.token_ids)


def test_fused_chunks_grow_with_the_batch():
    """chain_fused_kernel's chunk (fused_chunk): SPLIT_CHUNK doubled while the batch's bonus rows still split into
    at least FUSED_BONUS_PROGRAMS programs, at most FUSED_CHUNK_MAX, never past the row; shapes alone decide."""
    from specdec_ops.logits import FUSED_BONUS_PROGRAMS, FUSED_CHUNK_MAX, SPLIT_CHUNK, fused_chunk

    assert (SPLIT_CHUNK, FUSED_CHUNK_MAX, FUSED_BONUS_PROGRAMS) == (8192, 32768, 256)
    assert fused_chunk(64, 128256) == 32768   # 4 chunks a row: 256 bonus programs
    assert fused_chunk(63, 128256) == 16384
    assert fused_chunk(32, 128256) == 16384
    assert fused_chunk(16, 128256) is None    # 8192 (_split_sizes' default)
    assert fused_chunk(1024, 32768) == 16384  # 2 chunks: the row is not one chunk
    assert fused_chunk(4096, 100) is None and fused_chunk(1, 10 ** 6) is None


@pytest.mark.skipif("rejection_sample_logits" not in _TRITON_OPS, reason="triton not installed")
def test_triton_chain_without_filters_launches_one_kernel(monkeypatch):
    """Without filter tensors, logprobs or synthetic rates the chain runs chain_fused_kernel alone (the split
    pair's kernels would fail here); logprobs still take the split pair."""
    import specdec_ops.triton_kernels.logits as kernels

    class Refused:
        def __getitem__(self, grid):
            raise AssertionError("a split kernel was launched")

    logits, drafts, num, temperature, q, seeds = _split_cases()
    offsets = torch.zeros(drafts.shape[0], dtype=torch.int64)
    ref = specdec_ops.rejection_sample_logits(logits, drafts, num, q, temperature=temperature, seeds=seeds,
                                              offsets=offsets, reject_invalid_drafts=True, backend="cpu")
    monkeypatch.setattr(kernels, "chain_row_partials_kernel", Refused())
    monkeypatch.setattr(kernels, "chain_walk_race_kernel", Refused())
    out = specdec_ops.rejection_sample_logits(logits, drafts, num, q, temperature=temperature, seeds=seeds,
                                              offsets=offsets, reject_invalid_drafts=True, backend="triton")
    assert torch.equal(out.token_ids, ref.token_ids)
    with pytest.raises(AssertionError, match="split kernel"):
        specdec_ops.rejection_sample_logits(logits, drafts, num, q, temperature=temperature, seeds=seeds,
                                            offsets=offsets, return_logprobs=True, reject_invalid_drafts=True,
                                            backend="triton")


@pytest.mark.skipif("rejection_sample_logits" not in _TRITON_OPS, reason="triton not installed")
def test_triton_split_chain_race_winner_in_every_chunk():
    """Which chunk holds the race's winner varies with the seed; the combined winner must be the race's over the
    whole row (the C++ op's) for each (a combine that misses a chunk fails)."""
    from specdec_ops.logits import _launch_chain

    batch, vocab = 32, 130
    logits = torch.zeros(batch, 1, vocab)            # uniform rows: every entry can win the bonus race
    drafts = torch.zeros(batch, 0, dtype=torch.int64)
    num = torch.zeros(batch, dtype=torch.int64)
    seeds = torch.arange(batch, dtype=torch.int64)
    offsets = torch.zeros(batch, dtype=torch.int64)
    temperature = torch.ones(batch)
    ref = specdec_ops.rejection_sample_logits(logits, drafts, num, temperature=temperature, seeds=seeds,
                                              offsets=offsets, backend="cpu")
    ids, _, _ = _launch_chain(logits, drafts, num, None, (temperature, None, None, None), seeds, offsets, False,
                              batch, 0, packed=False, bonus_rows=True, bonus_token_ids=None, rates=None, chunk=16,
                              block=16)
    assert torch.equal(ids, ref.token_ids)
    assert len(set((ref.token_ids[:, 0] // 16).tolist())) >= 6  # winners spread over the chunks


@pytest.mark.skipif("rejection_sample_logits" not in _TRITON_OPS, reason="triton not installed")
def test_triton_exp_reference_turns_sums_to_the_row_max():
    """The fused chunk programs sum 2^(x s - c), c = m s rounded once (one fused multiply-add an entry), and
    multiply by exp_reference(m, c, s) = 2^(c - m s) to hold the sum of 2^((x - m) s). On a GPU m s - c is the
    product's rounding error (a fused multiply-add); here, under the interpreter, m s rounds first, so
    references c a few ulps off fl(m s) stand in for it: the factor must be 2^(c - fl(m s)) (a flipped sign
    or a missing ln 2 misses by 4e-5 at m s = 144)."""
    from race_skip_probe import exp_reference_probe

    scale = 1.4426950408889634 / 0.7
    m = torch.tensor([3.1, -7.25, 100.3, 0.5, 42.0, -0.0625] * 5, dtype=torch.float32)
    ms = (m * torch.tensor(scale, dtype=torch.float32))  # float32 products, as the interpreter rounds them
    steps = torch.arange(-2, 3, dtype=torch.float32).repeat_interleave(6)
    c = ms + steps * torch.finfo(torch.float32).eps * ms.abs()  # whole ulps or near them, both signs
    out = torch.empty_like(m)
    exp_reference_probe[(1,)](m, c, out, scale, m.numel(), BLOCK=32)
    expected = torch.exp2(c.double() - ms.double())
    assert (expected - 1).abs().max() > 1e-6  # the references are off fl(m s)
    torch.testing.assert_close(out.double(), expected, rtol=2e-7, atol=0)


def _skip_probe(x, bits, q, m, inv_t, best, total, residual, logits):
    from race_skip_probe import probe

    n = x.numel()
    out = torch.full((n,), 7, dtype=torch.int8)
    probe[(1,)](x, bits, q, out, m, inv_t, best, total, int(residual), n, LOGITS=logits,
                BLOCK=1 << (n - 1).bit_length())
    return out.bool()


def _boundary_entries(n, g):
    """(random bits as int32, d) for entries of mass best w (1 + d), w = 1 - u: a quarter with any u and d in
    [-0.03, 0.01]; a quarter with w in [1e-4, 3e-2] (where the skip test comes closest to best) and d in
    [-0.03, 0.003]; an eighth with w in [2^-24, 2^-16] and d in [-4e-6, 1e-6] (where only the margin of
    race_cut keeps a skipped score below best); a quarter with any u and d in [-3e-3, 3e-3]; an eighth far
    below (d = -0.5)."""
    def rand(k, lo, hi):
        return lo + (hi - lo) * torch.rand(k, generator=g, dtype=torch.float64)

    def bits_near_one(k, lo, hi):  # w log-uniform in [lo, hi]: k = the uniform's top 23 bits
        w = torch.exp(rand(k, math.log(lo), math.log(hi)))
        top = ((1 - w) * 2**23).floor().clamp(0, 2**23 - 1).to(torch.int64)
        return (top << 9) | torch.randint(0, 512, (k,), generator=g)

    q4, q8 = n // 4, n // 8
    bits = torch.randint(0, 2**32, (n,), dtype=torch.int64, generator=g)
    bits[q4: 2 * q4] = bits_near_one(q4, 1e-4, 3e-2)
    bits[2 * q4: 2 * q4 + q8] = bits_near_one(q8, 2.0**-24, 2.0**-16)
    d = torch.cat([rand(q4, -0.03, 0.01), rand(q4, -0.03, 0.003), rand(q8, -4e-6, 1e-6),
                   rand(n - 2 * q4 - 2 * q8, -3e-3, 3e-3), torch.full((q8,), -0.5, dtype=torch.float64)])
    return torch.where(bits >= 2**31, bits - 2**32, bits).to(torch.int32), d


def _race_scores(x, bits, q, m, temperature, total, residual, logits):
    """Exact-path race scores, 2^-20 above their float32 value: r / -log(u) with r the mass (logits: p =
    exp(z) / total, z = (x - m) / T in float32; minus q for a residual) and u the uniform of the bits."""
    u = reference.bits_to_uniform(bits.to(torch.int64) & 0xFFFFFFFF).double()
    if logits:
        xs = torch.where(x.isnan(), float("-inf"), x).clamp(max=torch.finfo(torch.float32).max)
        z = (xs - torch.tensor(m)) / torch.tensor(temperature) if temperature != 1.0 else xs - torch.tensor(m)
        p = (torch.exp(z.double()).float() / torch.tensor(total, dtype=torch.float32)).double()
        mass = (p - q.double()).clamp(min=0) if residual else p
    else:
        mass = x.double().clamp(min=0).nan_to_num(0.0)
    return (mass / -torch.log(u)).float().double() * (1 + 2.0**-20)


@pytest.mark.skipif("rejection_sample_logits" not in _TRITON_OPS, reason="triton not installed")
def test_triton_race_skip_tests_never_skip_a_possible_winner():
    """The races' skip tests (rejection.py race_cut / race_skips_probs; logits.py race_exp2_args / race_skips)
    on entries built around the boundary (_boundary_entries: mass = best w (1 + d), w = 1 - u, most of them
    where the test comes closest to best), for large and small maxima (|m| up to 1e4), temperatures, totals
    and residuals against q. Every skipped entry must score at most best even with its score raised by 2^-20;
    far below the boundary nearly every entry must be skipped, near it hundreds (non-vacuous); NaN and +inf
    logits, a race whose best is not above 1e-30, a row without mass and best = inf skip nothing. Killed
    mutants: b = ... + m a, C without its 2e-5, the bits shifted by 8, a residual threshold of 2 q, the best
    guard dropped. The margins that only cover the GPU's approximate ex2 and roundings (b's offsets, a's
    factor 1 - 2^-20) cannot fail here: the interpreter's exp2 is numpy's."""
    g = torch.Generator().manual_seed(3)
    n = 512
    checked = near = 0
    for case in range(24):
        logits = case % 3 != 2
        m = [0.0, 5.25, -7.125, 1.0e4, -3.0e3, 31.5][case % 6]
        temperature = [1.0, 0.37, 2.5][case % 4 % 3] if logits else 1.0
        inv_t = float(torch.tensor(1.0) / torch.tensor(temperature, dtype=torch.float32))
        total = [1.0, 17.5, 1.0e5, 0.75][case % 4] if logits else 1.0
        best = [1e-3, 0.05, 0.4, 0.9, 2e-6][case % 5] / total  # masses up to 1 / total: logits x <= m
        residual = logits and case % 4 == 1
        bits, d = _boundary_entries(n, g)
        w = 1 - reference.bits_to_uniform(bits.to(torch.int64) & 0xFFFFFFFF).double()
        mass = best * w * (1 + d)
        q = torch.zeros(n)
        if residual:  # r = p - q with q a quarter to twice r: p = r + q
            q = (mass * torch.rand(n, generator=g, dtype=torch.float64) * 2).clamp(max=0.9).float()
            mass = mass + q.double()
        if logits:
            x = (m + torch.log((mass * total).clamp(min=1e-300)) * temperature).float()
            x[-4:] = torch.tensor([float("nan"), float("inf"), m, float("-inf")])
            mass_ok = (mass * total <= 1).clone()
            mass_ok[-4:] = True
        else:
            x = mass.float()
            x[-2:] = torch.tensor([float("nan"), 0.0])
            mass_ok = torch.ones(n, dtype=torch.bool)
        skip = _skip_probe(x, bits, q, m, inv_t, best, total, residual, logits)
        score = _race_scores(x, bits, q, m, temperature, total, residual, logits)
        bad = skip & mass_ok & (score > best)
        assert not bad.any(), (case, x[bad][:4], score[bad][:4] / best)
        if logits:
            assert not skip[-4] and not skip[-3], case  # NaN, +inf
        else:
            assert not skip[-2], case
        far = skip[7 * n // 8: n - 4].float().mean()
        assert far > 0.9, (case, far)
        checked += int(skip.sum())
        near += int((skip & (score > 0.98 * best)).sum())
        for empty_best, empty_total in ((-1.0, total), (0.0, total), (1e-31, total), (best, 0.0), (float("inf"), total)):
            if logits or empty_total == total:
                assert not _skip_probe(x, bits, q, m, inv_t, empty_best, empty_total, residual, logits).any(), case
    assert checked > 24 * n // 4 and near > 200, (checked, near)


# ------------------------------------------------------------------------------- Triton chain split (filters)


def _filter_case(batch=6, k=3, vocab=203, seed=21):
    """Requests of every filter shape (mixed_params: greedy; top-p + min-p; top-k + top-p + min-p; top-p alone;
    top-k + min-p with top-p off by value; the three with top-k a third of the vocabulary), several chunks
    a row, ties across chunks at a top-k boundary (request 2's row 0: eight equal logits in four chunks, top-k
    5 cuts through them: all eight are kept), and a top-p kept set spread over every chunk (request 3's row 1:
    flat logits)."""
    args = make_batch(batch, k, vocab, seed=seed)
    logits = args["target_logits"]
    logits[2, 0, [10, 60, 70, 120, 130, 190, 195, 200]] = 9.0
    logits[3, 1] = torch.linspace(0.0, 0.5, vocab)[torch.randperm(vocab, generator=torch.Generator().manual_seed(1))]
    return args


def _split_call(args, chunk=64, block=16, radix_block=16, return_logprobs=True, **over):
    """_launch_chain on padded args with small chunks and tiles; `over` replaces sampling parameters (None: absent)."""
    from specdec_ops.logits import _launch_chain

    a = dict(args, **over)
    ids, accepted, lps = _launch_chain(
        a["target_logits"], a["draft_token_ids"], a["num_draft_tokens"], a["draft_probs"],
        tuple(a[n] for n in PARAMS), a["seeds"], a["offsets"], return_logprobs, a["draft_token_ids"].shape[0],
        a["draft_token_ids"].shape[1], packed=False, bonus_rows=True, bonus_token_ids=None, rates=None, chunk=chunk,
        block=block, radix_block=radix_block)
    return ids, accepted, lps


def _cpu(args, **over):
    return call(dict(args, **over), "cpu")


@pytest.mark.skipif("rejection_sample_logits" not in _TRITON_OPS, reason="triton not installed")
@pytest.mark.parametrize("present", ["top_k", "top_p", "min_p", "top_k,top_p", "top_k,min_p", "top_k,top_p,min_p"])
def test_triton_split_filters_equal_the_cpu_op(present):
    """The split rows with filters (8 radix launches per select present, the kept mass, the walk) against the C++
    op, for each set of filter tensors present (each launches another sequence of passes: top-k's last pick
    read after top-p's passes, top-p's floor from top-k), rows of 4 chunks of 64: tokens and counts exactly,
    log-probabilities within 1e-5."""
    args = _filter_case()
    over = {n: None for n in ("top_k", "top_p", "min_p") if n not in present.split(",")}
    ref = _cpu(args, **over)
    ids, accepted, lps = _split_call(args, **over)
    assert torch.equal(ids, ref.token_ids), (ids, ref.token_ids)
    assert torch.equal(accepted, ref.num_accepted)
    torch.testing.assert_close(lps, ref.logprobs, rtol=0, atol=1e-5, equal_nan=True)


@pytest.mark.slow
@pytest.mark.skipif("rejection_sample_logits" not in _TRITON_OPS, reason="triton not installed")
def test_triton_split_filters_one_hot_and_chunk_sizes():
    """One-hot drafts, other random numbers (offsets), a chunk of one radix tile (13 chunks a row), temperature 1
    on some requests (the radix tiles' path without the division)."""
    args = _filter_case(seed=23)
    args["draft_probs"] = None
    args["offsets"] = args["offsets"] + 5
    args["temperature"] = torch.tensor([1.0, 0.0, 1.0, 1.3, 1.0, 0.9])
    ref = _cpu(args)
    ids, accepted, lps = _split_call(args, chunk=16, block=16, radix_block=16)
    assert torch.equal(ids, ref.token_ids) and torch.equal(accepted, ref.num_accepted), (ids, ref.token_ids)
    torch.testing.assert_close(lps, ref.logprobs, rtol=0, atol=1e-5, equal_nan=True)


@pytest.mark.slow
@pytest.mark.skipif("rejection_sample_logits" not in _TRITON_OPS, reason="triton not installed")
def test_triton_split_filters_keep_exactly_the_processed_support():
    """Every emitted token lies in the processed target's support (the brute-force definition): bonus rows of
    flat and peaked logits with every filter, 4 chunks of one tile; a threshold one key too high or too low (a pick that
    reads the wrong slot or floor) emits tokens outside it or the wrong ones across the seeds."""
    g = torch.Generator().manual_seed(3)
    batch, vocab = 24, 203
    scale = torch.tensor([0.3, 3.0])[torch.arange(batch) % 2][:, None, None]  # flat and peaked rows
    logits = torch.randn(batch, 1, vocab, generator=g) * scale
    params = dict(temperature=torch.full((batch,), 0.9), top_k=torch.tensor([0, 7, 60, 0] * 6),
                  top_p=torch.tensor([0.5, 1.0, 0.7, 0.95] * 6), min_p=torch.tensor([0.0, 0.0, 0.05, 0.2] * 6))
    args = dict(target_logits=logits, draft_token_ids=torch.zeros(batch, 0, dtype=torch.int64),
                num_draft_tokens=torch.zeros(batch, dtype=torch.int64), draft_probs=None,
                seeds=torch.arange(batch, dtype=torch.int64), offsets=torch.zeros(batch, dtype=torch.int64), **params)
    ids, _, lps = _split_call(args, block=64, radix_block=64)
    ref = _cpu(args)
    assert torch.equal(ids, ref.token_ids)
    probs = brute_force(logits, *(params[n] for n in PARAMS))
    for b in range(batch):
        token = int(ids[b, 0])
        assert probs[b, 0, token] > 0, (b, token)
        assert abs(float(lps[b, 0]) - math.log(probs[b, 0, token])) < 1e-4, b


@pytest.mark.slow
@pytest.mark.skipif("rejection_sample_logits" not in _TRITON_OPS, reason="triton not installed")
def test_triton_split_filters_packed_bonus_ids_and_rates():
    """Packed rows without bonus rows (external bonus ids) and synthetic rates, with every filter, on 4 chunks of
    one tile (64 entries)."""
    from specdec_ops.logits import _launch_chain

    args = _filter_case(seed=29)
    packed = to_packed(args)
    batch, k = args["draft_token_ids"].shape
    bonus = torch.arange(batch, dtype=torch.int64) * 5 + 1
    rows = torch.cat([args["target_logits"][b, : int(args["num_draft_tokens"][b])] for b in range(batch)])
    params = tuple(args[n] for n in PARAMS)
    ref = specdec_ops.rejection_sample_logits_packed(
        rows, packed["cu_num_draft_tokens"], packed["draft_token_ids"], packed["draft_probs"],
        **dict(zip(PARAMS, params)),
        seeds=args["seeds"], offsets=args["offsets"], return_logprobs=True, max_num_draft_tokens=k,
        bonus_token_ids=bonus, backend="cpu")
    ids, accepted, lps = _launch_chain(rows, packed["draft_token_ids"], packed["cu_num_draft_tokens"],
                                       packed["draft_probs"], params, args["seeds"], args["offsets"], True, batch, k,
                                       packed=True, bonus_rows=False, bonus_token_ids=bonus, rates=None, chunk=64,
                                       block=64, radix_block=64)
    assert torch.equal(ids, ref.token_ids) and torch.equal(accepted, ref.num_accepted)
    torch.testing.assert_close(lps, ref.logprobs, rtol=0, atol=1e-5, equal_nan=True)
    rates = torch.tensor([0.9, 0.4, 0.6])
    ref = specdec_ops.rejection_sample_logits(args["target_logits"], args["draft_token_ids"], args["num_draft_tokens"],
                                              **dict(zip(PARAMS, params)), seeds=args["seeds"],
                                              offsets=args["offsets"], synthetic_acceptance_rates=rates, backend="cpu")
    ids, accepted, _ = _launch_chain(args["target_logits"], args["draft_token_ids"], args["num_draft_tokens"], None,
                                     params, args["seeds"], args["offsets"], False, batch, k, packed=False,
                                     bonus_rows=True, bonus_token_ids=None, rates=rates, chunk=64, block=64,
                                     radix_block=64)
    assert torch.equal(ids, ref.token_ids) and torch.equal(accepted, ref.num_accepted)


@pytest.mark.skipif("rejection_sample_logits" not in _TRITON_OPS, reason="triton not installed")
@pytest.mark.parametrize("draft_probs", [True, False], ids=["draft_probs", "one_hot"])
def test_triton_top_p_early_acceptance_is_the_full_paths(draft_probs, monkeypatch):
    """Without logprobs the split Triton kernels take top-p's early acceptance (chain_row_accepts_early: the row's
    select skipped, tau = -1 for the walk); with logprobs every row runs its select. Same tokens bit for bit, the
    C++ op's, padded (and packed), rows of 3 chunks of one tile (512, 512 and 1 entries); and the early path ran on
    a good share of the draft rows. (Tiles of 512, not 64: the interpreter's time grows with the tiles and chunks
    it loops over; several tiles a chunk are test_triton_split_filters_equal_the_cpu_op's.)"""
    from specdec_ops.logits import _launch_chain

    taus = recorded_thresholds(monkeypatch)
    args = top_p_early_batch(1025, torch.bfloat16, draft_probs, batch=8)
    params = tuple(args[n] for n in PARAMS)
    batch, k = args["draft_token_ids"].shape
    outs = [_launch_chain(args["target_logits"], args["draft_token_ids"], args["num_draft_tokens"],
                          args["draft_probs"], params, args["seeds"], args["offsets"], logprobs, batch, k, packed=False,
                          bonus_rows=True, bonus_token_ids=None, rates=None, chunk=512, block=512, radix_block=512)
            for logprobs in (False, True)]
    early = taus[0].view(batch, k + 1)[:, :k] < 0
    assert not (taus[1] < 0).any() and int(early.sum()) >= 6
    # a draft outside its row's processed support (top-p or min-p drops it) is never accepted early, reached by the
    # walk or not
    probs = specdec_ops.process_logits(args["target_logits"][:, :k], args["temperature"], None, args["top_p"],
                                       args["min_p"])
    dropped = probs.gather(2, args["draft_token_ids"][..., None])[..., 0] == 0
    assert int(dropped.sum()) >= 4 and not (early & dropped).any()
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    cpu = call(args, "cpu", return_logprobs=False)
    assert torch.equal(outs[0][0], cpu.token_ids) and torch.equal(outs[0][1], cpu.num_accepted)
    if draft_probs:
        packed = call_packed(to_packed(args), "triton", k=k, return_logprobs=False)
        assert torch.equal(packed.token_ids, cpu.token_ids)


def recorded_thresholds(monkeypatch):
    """A list that receives every Triton chain call's thresholds (tau [rows], from _launch_filters)."""
    import specdec_ops.logits as logits_module

    taus = []
    launch = logits_module._launch_filters

    def recording(*a, **k):
        tau, kept = launch(*a, **k)
        taus.append(tau.clone())
        return tau, kept

    monkeypatch.setattr(logits_module, "_launch_filters", recording)
    return taus


def top_p_bonus_batch(vocab, dtype, draft_probs, batch=16, seed=0):
    """Chains every draft of which holds nearly all its row's mass (e^6 to e^10 times the rest: top-p's early
    acceptance takes them), so that the bonus row emits; bonus rows of N(0, 4) logits under top-p from 0.3 to
    0.99 (its race winner kept or dropped). Request 3 has top-k on, request 5 min-p, request 6 is greedy and
    request 7 drafts a token of almost no mass (rejected): none of them takes the early bonus token."""
    g = torch.Generator().manual_seed(seed)
    k = 3
    logits = torch.randn(batch, k + 1, vocab, generator=g) * 2
    ids = torch.randint(0, vocab, (batch, k), generator=g)
    t = torch.tensor([1.0, 0.7]).repeat(batch // 2)
    rows, cols = torch.arange(batch)[:, None].expand(batch, k), torch.arange(k)[None].expand(batch, k)
    logits[rows, cols, ids] = -float("inf")
    lse = torch.logsumexp(logits[:, :k] / t[:, None, None], -1)
    logits[rows, cols, ids] = t[:, None] * (lse + 6 + torch.rand(batch, k, generator=g) * 4)
    logits[7, 1, ids[7, 1]] = -30.0
    q = None
    if draft_probs:
        q = torch.softmax(torch.randn(batch, k, vocab, generator=g), -1)
        q[rows, cols, ids] = 0.5
    t[6] = 0.0
    top_k = torch.zeros(batch, dtype=torch.int64)
    top_k[3] = 40
    min_p = torch.zeros(batch)
    min_p[5] = 0.01
    return dict(target_logits=logits.to(dtype), draft_token_ids=ids, num_draft_tokens=torch.full((batch,), k),
                draft_probs=None if q is None else q.to(dtype), temperature=t, top_k=top_k,
                top_p=torch.tensor([0.9, 0.5, 0.99, 0.8, 0.3, 0.95, 0.7, 0.6]).repeat(batch // 8), min_p=min_p,
                seeds=torch.arange(batch) * 7 + 3 + seed, offsets=torch.arange(batch) * 11)


@pytest.mark.skipif("rejection_sample_logits" not in _TRITON_OPS, reason="triton not installed")
@pytest.mark.parametrize("draft_probs,dtype", [(False, torch.float32), (True, torch.bfloat16)],
                         ids=["one_hot-fp32", "draft_probs-bf16"])
def test_triton_top_p_early_bonus_token_is_the_full_paths(draft_probs, dtype, monkeypatch):
    """Top-p's early bonus token (specdec_ops/logits.py _launch_early_bonus: the bonus row's race over every entry,
    kept where top-p surely keeps its winner) against the full paths, the C++ op's (it has no early path: every
    row its select, then the race over the kept entries): the same tokens bit for bit, padded and packed, over
    seeds where top-p keeps and drops the winner (a dropped winner's request takes the Triton full path in the
    same launch). The requests it decides skip the select (their bonus rows get no threshold); those with top-k or
    min-p on, greedy, or with a draft the early acceptance does not take, never take it. Two chunks a row of one
    512-entry tile each (the interpreter's time grows with the tiles it loops over: tiles of 64 took ~140 s a
    seed, of 256 ~40 s). (A launch without the early bonus token, compared too, equalled the C++ op wherever this
    one does: the Triton full path's tokens are test_triton_top_p_early_acceptance_is_the_full_paths'.)"""
    from specdec_ops.logits import _launch_chain

    taus = recorded_thresholds(monkeypatch)
    decided = 0
    for seed in range(2):   # 7 to 10 of each seed's 12 eligible requests are decided early (seeds 0-3)
        args = top_p_bonus_batch(1000, dtype, draft_probs, seed=seed)
        params = tuple(args[n] for n in PARAMS)
        batch, k = args["draft_token_ids"].shape
        stats = {}
        taus.clear()
        ids, accepted, _ = _launch_chain(args["target_logits"], args["draft_token_ids"], args["num_draft_tokens"],
                                         args["draft_probs"], params, args["seeds"], args["offsets"], False, batch, k,
                                         packed=False, bonus_rows=True, bonus_token_ids=None, rates=None, chunk=512,
                                         block=512, radix_block=512, early_bonus_token=True, stats=stats)
        bonus_tau = taus[0].view(batch, k + 1)[:, k]
        done = stats["done"].bool()
        assert not done[[3, 5, 6, 7]].any() and (stats["bonus_w"][[3, 5, 6, 7]] == -1).all()
        sampled_top_p = torch.ones(batch, dtype=torch.bool)
        sampled_top_p[[3, 5, 6, 7]] = False
        assert (bonus_tau[done] == 0).all() and (bonus_tau[sampled_top_p & ~done] > 0).all()
        decided += int(done.sum())
        cpu = call(args, "cpu", return_logprobs=False)
        assert torch.equal(ids, cpu.token_ids) and torch.equal(accepted, cpu.num_accepted), seed
        packed = call_packed(to_packed(args), "triton", k=k, return_logprobs=False)
        assert torch.equal(packed.token_ids, cpu.token_ids)
    # both paths ran: 12 eligible requests a seed, a few of whose winners top-p drops
    assert 8 <= decided <= 22, decided


@pytest.mark.skipif("tree_rejection_sample_logits" not in _TRITON_OPS, reason="triton not installed")
@pytest.mark.parametrize("draft_probs", [True, pytest.param(False, marks=pytest.mark.slow)],
                         ids=["draft_probs", "one_hot"])
def test_triton_tree_split_filters_equal_the_cpu_op(draft_probs):
    """Trees with filter tensors: every node's row statistics from the split kernels (4 chunks of one 64-entry
    tile a row, all filters mixed per request, ragged node counts), combined by the walk where it enters a node,
    against the C++ op: tokens and paths exactly, log-probabilities within 1e-5."""
    from specdec_ops.logits import _triton_tree

    args = random_tree(6, 6, 203, draft_probs=draft_probs, seed=41)
    ref = call_tree(args, "cpu")
    ids, path, accepted, lps = _triton_tree(
        args["target_logits"], args["tree_token_ids"], args["parents"], args["num_nodes"], args["draft_probs"],
        *(args[n] for n in PARAMS), args["seeds"], args["offsets"], True, chunk=64, block=64, radix_block=64)
    assert torch.equal(ids, ref.token_ids), (ids, ref.token_ids)
    assert torch.equal(path, ref.accepted_path) and torch.equal(accepted, ref.num_accepted)
    assert int(accepted.sum()) > 0
    torch.testing.assert_close(lps, ref.logprobs, rtol=0, atol=1e-5, equal_nan=True)


# ---------------------------------------------------------------------------------------------- radix keys


def _radix_keys_np(values):
    """uint32 radix keys (triton_kernels/logits.py radix_key) of float32 values without NaN, written out in
    numpy: a negative value's 31 low bits flipped, plus 2^31 (-0.0 just below +0.0)."""
    bits = np.asarray(values, dtype=np.float32).view(np.int32).astype(np.int64)
    signed = np.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    return signed + 2**31


@pytest.mark.parametrize("dtype,passes", [(torch.bfloat16, 4), (torch.float16, 5)])
def test_radix_passes_cover_every_bit_that_varies(dtype, passes):
    """The premise of the Triton selects' pass counts (specdec_ops/logits.py _radix_passes): over every bit
    pattern of the type widened to float32 (NaN as -inf, as radix_key reads it), the key bits below the last
    pass are 0 for non-negative values and all ones for negative ones, so the upper bits alone tell the values
    apart and the low bits are restored from the sign (threshold_key)."""
    from specdec_ops.logits import _radix_passes

    assert _radix_passes(dtype) == passes and _radix_passes(torch.float32) == 8
    values = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype).float().numpy()
    values = np.where(np.isnan(values), -np.inf, values)
    keys = _radix_keys_np(values)
    assert np.all(np.diff(keys[np.argsort(values, kind="stable")].astype(np.float64)) >= 0)  # order kept
    low_bits = 32 - 4 * passes
    low = keys & ((1 << low_bits) - 1)
    assert np.all(np.where(keys >= 2**31, low == 0, low == (1 << low_bits) - 1))
    distinct_values = np.unique(values.view(np.int32)).size  # bit patterns (-0.0 apart from +0.0)
    assert np.unique(keys >> low_bits).size == distinct_values  # upper bits distinct per distinct value
    if passes > 1:  # one pass fewer would merge values (so the count is the fewest that works)
        assert np.unique(keys >> (low_bits + 4)).size < distinct_values


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_triton_threshold_key_decodes_the_radix_pick(dtype):
    """threshold_key of an entry's radix key cut to the selects' bits is z's key of that entry: negative values
    (low bits restored as ones), +-0, +-inf, NaN, subnormals, at temperature 1 and 0.7."""
    from specdec_ops.logits import _radix_passes
    from threshold_probe import probe

    tiny = torch.finfo(dtype).tiny
    x = torch.tensor([-3.25, -1.0, -0.0, 0.0, 0.5, 2.0, 7.75, float("inf"), float("-inf"), float("nan"),
                      tiny, -tiny, tiny / 4, torch.finfo(dtype).max, -torch.finfo(dtype).max], dtype=torch.float32)
    x = torch.cat([x, torch.randn(49, generator=torch.Generator().manual_seed(2)) * 5]).to(dtype)
    for temperature in (1.0, 0.7):
        out = torch.empty(x.numel(), dtype=torch.int64)
        want = torch.empty_like(out)
        probe[(1,)](x, out, want, 8.0, temperature, x.numel(), PASSES=_radix_passes(dtype), BLOCK=64)
        assert torch.equal(out, want), (x, out, want)


def _adjacent_rows(dtype, rows=6, vocab=48):
    """Rows of consecutive representable values of `dtype` (around 0.3, -1.7 and 12, shuffled): every pair of
    neighbours differs in the lowest bit of the type, where a select with a pass too few cannot tell them apart."""
    g = torch.Generator().manual_seed(8)
    out = []
    for r in range(rows):
        base = torch.tensor([0.3, -1.7, 12.0][r % 3], dtype=dtype)
        vals = [base]
        for _ in range(vocab - 1):
            vals.append(torch.nextafter(vals[-1], torch.tensor(float("inf"), dtype=dtype)))
        row = torch.stack(vals)
        out.append(row[torch.randperm(vocab, generator=g)])
    return torch.stack(out)


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_triton_filters_on_adjacent_values_equal_the_cpu_op(dtype):
    """process_logits and the split chain rows over logits whose values are all neighbours in their type, top-k
    and top-p cutting between two neighbours (temperature 1e-3: they still differ in probability): the kept
    sets equal the C++ op's (a select with one pass fewer than the type needs keeps whole groups of
    neighbours)."""
    if dtype != torch.float32:
        pytest.importorskip("numpy")
    x = _adjacent_rows(dtype)
    rows = x.shape[0]
    temperature = torch.full((rows,), 1e-3 if dtype == torch.float32 else 0.02)
    params = dict(temperature=temperature, top_k=torch.tensor([1, 5, 0, 17, 0, 3]),
                  top_p=torch.tensor([1.0, 1.0, 0.5, 0.9, 0.999, 0.3]))
    want = specdec_ops.process_logits(x, **params, backend="cpu")
    got = specdec_ops.process_logits(x, **params, backend="triton")
    assert torch.equal(got > 0, want > 0), ((got > 0).sum(-1), (want > 0).sum(-1))
    torch.testing.assert_close(got, want, rtol=2e-5, atol=1e-7)
    # the split path: bonus rows only (no drafts), 3 chunks of 16 a row
    args = dict(target_logits=x[:, None], draft_token_ids=torch.zeros(rows, 0, dtype=torch.int64),
                num_draft_tokens=torch.zeros(rows, dtype=torch.int64), draft_probs=None,
                seeds=torch.arange(rows, dtype=torch.int64), offsets=torch.zeros(rows, dtype=torch.int64),
                min_p=None, **params)
    ref = _cpu(args)
    ids, _, lps = _split_call(args, chunk=16, block=16, radix_block=16)
    assert torch.equal(ids, ref.token_ids)
    torch.testing.assert_close(lps, ref.logprobs, rtol=0, atol=1e-5, equal_nan=True)


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
def test_triton_filters_keep_the_ties_rounding_makes():
    """Distinct bfloat16 logits whose z = (x - max) / T round to one float32 value (x - max rounds away their
    difference next to a max of 1e10; T = 1e12 leaves them probability 0.99 each) are tied in p, so top-k 2
    keeps all five entries and top-p keeps them all or only the max: the Triton selects run on the raw logits'
    keys, and their threshold must be z's (a threshold compared on the raw keys keeps two)."""
    x = torch.tensor([[1e10, 1.0, 2.0, 3.0, 4.0]] * 3, dtype=torch.bfloat16)
    params = dict(temperature=torch.full((3,), 1e12), top_k=torch.tensor([2, 0, 2]),
                  top_p=torch.tensor([1.0, 0.3, 0.5]))
    want = specdec_ops.process_logits(x, **params, backend="cpu")
    assert (want > 0).sum(-1).tolist() == [5, 5, 5]  # C++: all tied after the max (top-p 0.3 needs two entries)
    assert torch.equal(specdec_ops.process_logits(x, **params, backend="triton") > 0, want > 0)
    args = dict(target_logits=x[:, None], draft_token_ids=torch.zeros(3, 0, dtype=torch.int64),
                num_draft_tokens=torch.zeros(3, dtype=torch.int64), draft_probs=None,
                seeds=torch.arange(3, dtype=torch.int64), offsets=torch.zeros(3, dtype=torch.int64), min_p=None,
                **params)
    ref = _cpu(args)
    ids, _, lps = _split_call(args, chunk=16, block=16, radix_block=16)
    assert torch.equal(ids, ref.token_ids)
    torch.testing.assert_close(lps, ref.logprobs, rtol=0, atol=1e-5, equal_nan=True)
