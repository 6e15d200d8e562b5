"""Chain rejection sampling (DESIGN.md §5.1-§5.2): every backend against
reference.py, the samplers against the exact target distribution, and every
error path."""

import pytest
import scipy.stats
import torch

import specdec_ops
from specdec_ops import reference
from specdec_ops._checks import BackendUnavailableError, rng_inputs
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import HAS_TRITON, compile_ahead_of_time

ALPHA = 1e-4  # significance level of every statistical test here


def make_batch(batch, k, vocab, *, draft_probs=True, dtype=torch.float32, seed=0, temperature=1.0, ragged=True):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(batch, k + 1, vocab, generator=g) / temperature, -1)
    q = torch.softmax(torch.randn(batch, k, vocab, generator=g) / temperature, -1)
    ids = torch.multinomial(q.reshape(-1, vocab), 1, generator=g).reshape(batch, k)
    n = torch.randint(0, k + 1, (batch,), generator=g) if ragged else torch.full((batch,), k)
    seeds = torch.randint(0, 2**62, (batch,), generator=g)
    offsets = torch.randint(0, 2**40, (batch,), generator=g)
    return dict(target_probs=p.to(dtype), draft_token_ids=ids, num_draft_tokens=n,
                draft_probs=q.to(dtype) if draft_probs else None, seeds=seeds, offsets=offsets)


def call(args, backend, greedy=None):
    a = dict(args)
    return specdec_ops.rejection_sample(a.pop("target_probs"), a.pop("draft_token_ids"), a.pop("num_draft_tokens"),
                                        a.pop("draft_probs"), greedy=greedy, backend=backend, **a)


def to_packed(args):
    p, ids, n, q = args["target_probs"], args["draft_token_ids"], args["num_draft_tokens"], args["draft_probs"]
    rows, drafts, qrows = [], [], []
    for b in range(p.shape[0]):
        nb = int(n[b])
        rows.append(p[b, : nb + 1])
        drafts.append(ids[b, :nb])
        if q is not None:
            qrows.append(q[b, :nb])
    cu = torch.zeros(p.shape[0] + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(n, 0)
    return dict(target_probs=torch.cat(rows), cu_num_draft_tokens=cu, draft_token_ids=torch.cat(drafts),
                draft_probs=torch.cat(qrows) if q is not None else None, seeds=args["seeds"],
                offsets=args["offsets"])


def call_packed(packed, backend, k=None, greedy=None):
    a = dict(packed)
    return specdec_ops.rejection_sample_packed(a.pop("target_probs"), a.pop("cu_num_draft_tokens"),
                                               a.pop("draft_token_ids"), a.pop("draft_probs"), greedy=greedy,
                                               max_num_draft_tokens=k, backend=backend, **a)


def assert_same(a, b):
    assert torch.equal(a.token_ids, b.token_ids), (a.token_ids, b.token_ids)
    assert torch.equal(a.num_accepted, b.num_accepted)


# ------------------------------------------------------------------------------------------ random numbers


def test_philox_matches_published_known_answers():
    # Random123 known-answer vectors for Philox4x32-10.
    zero = reference.philox4x32_10(0, 0, 0, 0, 0, 0)
    assert [int(w) for w in zero] == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    ones = reference.philox4x32_10(*([0xFFFFFFFF] * 6))
    assert [int(w) for w in ones] == [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]


def test_uniforms_lie_strictly_inside_unit_interval():
    extremes = reference.bits_to_uniform(torch.tensor([0, 0xFFFFFFFF]))
    assert 0.0 < float(extremes[0]) and float(extremes[1]) < 1.0
    u = reference.philox_uniform(7, 3, 2, reference.PURPOSE_RESIDUAL, torch.arange(100_000))
    assert float(u.min()) > 0.0 and float(u.max()) < 1.0
    # 100,000 uniforms, Kolmogorov-Smirnov against U(0, 1) at alpha.
    assert scipy.stats.kstest(u.double().numpy(), "uniform").pvalue > ALPHA


# ------------------------------------------------------------------------------------------ backends agree


@pytest.mark.parametrize("draft_probs", [True, False], ids=["draft_probs", "one_hot"])
@pytest.mark.parametrize("vocab", [5, 8193])
def test_backend_matches_reference(cpu_backend, draft_probs, vocab):
    args = make_batch(6, 3, vocab, draft_probs=draft_probs, seed=vocab, temperature=0.3)
    greedy = torch.tensor([False, True, False, False, True, False])
    assert_same(call(args, cpu_backend, greedy), call(args, "reference", greedy))


def test_backend_matches_reference_large_vocab(cpu_backend):
    args = make_batch(2, 2, 151936, seed=1, temperature=0.05, ragged=False)
    assert_same(call(args, cpu_backend), call(args, "reference"))


def test_high_acceptance_batch_matches_reference(cpu_backend):
    # Drafts equal to a peaked target: most drafts accepted, bonus rows exercised.
    args = make_batch(8, 4, 64, seed=3, temperature=0.05)
    args["draft_probs"] = args["target_probs"][:, :4].clone()
    args["draft_token_ids"] = torch.argmax(args["target_probs"][:, :4], -1)
    out = call(args, cpu_backend)
    assert_same(out, call(args, "reference"))
    assert int(out.num_accepted.sum()) > 0


@pytest.mark.parametrize("draft_probs", [True, False], ids=["draft_probs", "one_hot"])
def test_packed_matches_padded(cpu_backend, draft_probs):
    args = make_batch(7, 4, 50, draft_probs=draft_probs, seed=11, temperature=0.5)
    greedy = torch.tensor([True, False, False, True, False, False, False])
    padded = call(args, cpu_backend, greedy)
    packed = call_packed(to_packed(args), cpu_backend, k=4, greedy=greedy)
    assert_same(padded, packed)


def test_mixed_probability_dtypes_and_int32_seeds(cpu_backend):
    # float16 target with float32 draft probabilities: both read as float32; int32 seeds widen to int64.
    args = make_batch(4, 3, 40, seed=12, temperature=0.5)
    args["target_probs"] = args["target_probs"].half()
    args["seeds"] = args["seeds"] % 2**31
    want = call(dict(args, target_probs=args["target_probs"].float()), "reference")
    assert_same(call(dict(args, seeds=args["seeds"].to(torch.int32)), cpu_backend), want)


def test_packed_width_defaults_to_largest_request():
    args = make_batch(3, 4, 20, seed=2)
    args["num_draft_tokens"] = torch.tensor([1, 2, 0])
    out = call_packed(to_packed(args), "cpu")
    assert out.token_ids.shape == (3, 3)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_inputs(cpu_backend, dtype):
    if cpu_backend == "triton" and dtype == torch.bfloat16:
        pytest.skip("the Triton interpreter has no bfloat16 arithmetic")
    args = make_batch(5, 3, 300, dtype=dtype, seed=4, temperature=0.3)
    assert_same(call(args, cpu_backend), call(args, "reference"))


def test_request_result_independent_of_batch_composition(cpu_backend):
    args = make_batch(6, 3, 40, seed=5, temperature=0.5)
    greedy = torch.tensor([False, True, False, False, False, True])
    full = call(args, cpu_backend, greedy)
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    permuted = call({k: (v[perm] if v is not None else None) for k, v in args.items()}, cpu_backend, greedy[perm])
    assert torch.equal(permuted.token_ids, full.token_ids[perm])
    for b in (0, 4):
        alone = call({k: (v[b: b + 1] if v is not None else None) for k, v in args.items()}, cpu_backend,
                     greedy[b: b + 1])
        assert torch.equal(alone.token_ids[0], full.token_ids[b])


def test_same_seeds_reproduce_and_offsets_refresh():
    args = make_batch(64, 3, 100, seed=6)
    a, b = call(args, "cpu"), call(args, "cpu")
    assert_same(a, b)
    args["offsets"] = args["offsets"] + 1
    c = call(args, "cpu")
    assert not torch.equal(a.token_ids, c.token_ids)


def test_default_seeds_and_offsets():
    args = make_batch(4, 2, 30, seed=7)
    args.pop("seeds"), args.pop("offsets")
    out = specdec_ops.rejection_sample(**args)
    assert out.token_ids.dtype == torch.int64 and out.num_accepted.dtype == torch.int32
    torch.manual_seed(123)
    a = specdec_ops.rejection_sample(**args)
    torch.manual_seed(123)
    b = specdec_ops.rejection_sample(**args)
    assert_same(a, b)


class _RecordOps(TorchDispatchMode):
    """The aten ops a call runs, with their arguments."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls.append((str(func), args, kwargs or {}))
        return func(*args, **(kwargs or {}))


def test_default_seeds_are_drawn_on_the_device():
    # Defect: seeds=None drew on the host and copied to the GPU each call (a blocking
    # host-to-device copy that also breaks graph capture). Off the CPU the draw happens on
    # the device: no copy between devices (shown on the meta device).
    with _RecordOps() as record:
        seeds, offsets = rng_inputs(None, None, 3, torch.device("meta"), "target_probs")
    assert seeds.device.type == "meta" and seeds.dtype == torch.int64 and offsets.device.type == "meta"
    copies = [name for name, args, kwargs in record.calls if "lift_fresh" in name
              or (name.startswith("aten._to_copy") and kwargs.get("device", args[0].device) != args[0].device)]
    assert not copies, copies
    cpu_seeds, _ = rng_inputs(None, None, 3, torch.device("cpu"), "target_probs")  # CPU: the host generator
    assert cpu_seeds.device.type == "cpu"


def test_default_seeds_are_refused_under_cuda_graph_capture(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(specdec_ops.SpecDecArgumentError, match="seeds=None.*CUDA graph capture"):
        rng_inputs(None, None, 2, torch.device("cuda"), "target_probs")


@pytest.mark.cuda
def test_default_seeds_under_capture_are_refused_by_the_op():
    p = torch.softmax(torch.randn(2, 2, 16, device="cuda"), -1)
    ids, n = torch.zeros(2, 1, dtype=torch.int64, device="cuda"), torch.ones(2, dtype=torch.int64, device="cuda")
    specdec_ops.rejection_sample(p, ids, n, seeds=torch.zeros(2, dtype=torch.int64, device="cuda"))  # warm up
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(specdec_ops.SpecDecArgumentError, match="seeds=None"):
        with torch.cuda.graph(graph):
            specdec_ops.rejection_sample(p, ids, n)


# ------------------------------------------------------------------------------------------ semantics


def argmax_walk(p, ids, n):
    """Plain greedy verification, written independently of the package."""
    out = []
    for k in range(n):
        best = int(torch.argmax(p[k]))
        if int(ids[k]) != best:
            return out + [best]
        out.append(int(ids[k]))
    return out + [int(torch.argmax(p[n]))]


def test_greedy_equals_argmax_walk_in_mixed_batch(cpu_backend):
    args = make_batch(10, 4, 30, seed=8, temperature=0.3)
    # Make some drafts agree with the target argmax so greedy requests accept several.
    args["draft_token_ids"][::2] = torch.argmax(args["target_probs"][::2, :4], -1)
    args["draft_token_ids"][::4, 2] = (args["draft_token_ids"][::4, 2] + 1) % 30
    greedy = torch.arange(10) % 3 != 2
    out = call(args, cpu_backend, greedy)
    for b in range(10):
        n = int(args["num_draft_tokens"][b])
        toks = out.token_ids[b, : int(out.num_accepted[b]) + 1].tolist()
        if greedy[b]:
            assert toks == argmax_walk(args["target_probs"][b], args["draft_token_ids"][b], n)
        assert (out.token_ids[b, int(out.num_accepted[b]) + 1:] == -1).all()
        alone = call({k: (v[b: b + 1] if v is not None else None) for k, v in args.items()}, cpu_backend,
                     greedy[b: b + 1])
        assert torch.equal(alone.token_ids[0], out.token_ids[b])


def test_greedy_ties_pick_first_index():
    p = torch.zeros(1, 2, 6)
    p[0, :, 2] = p[0, :, 4] = 0.5
    out = specdec_ops.rejection_sample(p, torch.tensor([[4]]), torch.tensor([1]), greedy=torch.tensor([True]))
    assert out.token_ids.tolist() == [[2, -1]]


def test_nan_and_negative_probabilities_count_as_zero(cpu_backend):
    vocab = 16
    p = torch.softmax(torch.randn(4, 3, vocab), -1)
    p[:, :, 3] = float("nan")
    p[:, :, 5] = -1.0
    p[1] = float("nan")  # a request whose rows have no mass at all
    ids = torch.tensor([[3, 5], [1, 2], [5, 3], [0, 1]])
    args = dict(target_probs=p, draft_token_ids=ids, num_draft_tokens=torch.tensor([2, 2, 2, 2]), draft_probs=None,
                seeds=torch.arange(4), offsets=torch.zeros(4, dtype=torch.int64))
    out = call(args, cpu_backend)
    assert_same(out, call(args, "reference"))
    emitted = out.token_ids[out.token_ids >= 0]
    assert ((emitted >= 0) & (emitted < vocab)).all()
    assert not ((out.token_ids == 3) | (out.token_ids == 5)).any()
    assert out.token_ids[1].tolist() == [0, -1, -1]  # no mass anywhere: rejected, first index


def test_draft_with_zero_target_and_draft_mass_is_rejected(cpu_backend):
    # Accept iff u * q(x) < p(x), strictly: x with p(x) = q(x) = 0 must be rejected whatever u
    # (the mutant `u * q(x) <= p(x)` accepts it). The residual max(p - q, 0) has no mass, so the
    # correction is drawn from p: token 1 or 2. Padded and packed.
    batch = 16
    p = torch.tensor([[0.0, 0.5, 0.5], [0.2, 0.3, 0.5]]).expand(batch, 2, 3).contiguous()
    q = torch.tensor([[0.0, 0.5, 0.5]]).expand(batch, 1, 3).contiguous()
    args = dict(target_probs=p, draft_token_ids=torch.zeros(batch, 1, dtype=torch.int64),
                num_draft_tokens=torch.ones(batch, dtype=torch.int64), draft_probs=q,
                seeds=torch.arange(batch), offsets=torch.arange(batch) * 7)
    for out in (call(args, cpu_backend), call_packed(to_packed(args), cpu_backend, k=1)):
        assert (out.num_accepted == 0).all()
        assert ((out.token_ids[:, 0] == 1) | (out.token_ids[:, 0] == 2)).all()
        assert (out.token_ids[:, 1] == -1).all()
        assert_same(out, call(args, "reference"))


def test_nan_and_negative_draft_probs_count_as_zero(cpu_backend):
    # DESIGN §4: NaN or negative probabilities count as zero mass, in draft_probs too. A draft x
    # with q(x) = NaN has q(x) = 0: accepted whatever u iff p(x) > 0, and the residual
    # max(p - q, 0) uses q = 0 there (so a rejected x with p(x) = 0 is never the correction).
    batch, k, vocab = 24, 3, 12
    gen = torch.Generator().manual_seed(41)
    p = torch.softmax(torch.randn(batch, k + 1, vocab, generator=gen), -1)
    q = torch.softmax(torch.randn(batch, k, vocab, generator=gen), -1)
    ids = torch.randint(0, vocab, (batch, k), generator=gen)
    rows = torch.arange(batch)
    q[rows, 0, ids[:, 0]] = float("nan")                   # every first draft has q(x) = NaN
    q[:, :, 7] = -0.25                                      # negative entries elsewhere
    q[rows[::3], 1] = float("nan")                          # whole NaN rows
    dead = rows % 2 == 1
    p[rows[dead], 0, ids[dead, 0]] = 0.0                    # odd requests: p(x) = 0 at the first draft
    args = dict(target_probs=p, draft_token_ids=ids, num_draft_tokens=torch.full((batch,), k), draft_probs=q,
                seeds=torch.arange(batch) + 100, offsets=torch.zeros(batch, dtype=torch.int64))
    out = call(args, cpu_backend)
    assert_same(out, call(args, "reference"))
    assert_same(call_packed(to_packed(args), cpu_backend, k=k), out)
    emitted = out.token_ids[out.token_ids >= 0]
    assert ((emitted >= 0) & (emitted < vocab)).all()
    assert (out.num_accepted[~dead] >= 1).all()             # q(x) = NaN, p(x) > 0: accepted
    assert (out.num_accepted[dead] == 0).all()              # q(x) = NaN, p(x) = 0: rejected ...
    assert (out.token_ids[dead, 0] != ids[dead, 0]).all()   # ... and x is not the correction


def test_zero_drafts_emit_the_bonus_token(cpu_backend):
    args = make_batch(3, 2, 10, seed=9)
    args["num_draft_tokens"] = torch.zeros(3, dtype=torch.int64)
    out = call(args, cpu_backend)
    assert (out.num_accepted == 0).all() and (out.token_ids[:, 0] >= 0).all() and (out.token_ids[:, 1:] == -1).all()


def test_empty_batch_and_zero_width(cpu_backend):
    out = specdec_ops.rejection_sample(torch.rand(0, 3, 5), torch.zeros(0, 2, dtype=torch.int64),
                                       torch.zeros(0, dtype=torch.int64), backend=cpu_backend)
    assert out.token_ids.shape == (0, 3) and out.num_accepted.shape == (0,)
    out = specdec_ops.rejection_sample(torch.softmax(torch.randn(2, 1, 5), -1), torch.zeros(2, 0, dtype=torch.int64),
                                       torch.zeros(2, dtype=torch.int64), backend=cpu_backend)
    assert out.token_ids.shape == (2, 1) and (out.token_ids >= 0).all()


# ------------------------------------------------------------------------------------------ statistics

STAT_DRAWS = 40_000  # requests per statistical test (>= 30,000 draws as required)


def _chain_distribution_case(draft_probs: bool):
    vocab, k = 8, 3
    g = torch.Generator().manual_seed(42)
    p = torch.softmax(torch.randn(k + 1, vocab, generator=g), -1)
    p[:, 6] = 0.0  # a token of zero target probability must never appear
    p = p / p.sum(-1, keepdim=True)
    q = torch.softmax(torch.randn(k, vocab, generator=g) * 1.5, -1)
    batch = STAT_DRAWS
    target = p.expand(batch, k + 1, vocab).contiguous()
    if draft_probs:
        drafts = torch.stack([torch.multinomial(q[j], batch, replacement=True, generator=g) for j in range(k)], 1)
        qs = q.expand(batch, k, vocab).contiguous()
    else:
        drafts = torch.tensor([[2, 6, 1]]).expand(batch, k).contiguous()  # fixed one-hot drafts (draft 1 impossible)
        qs = None
    out = specdec_ops.rejection_sample(target, drafts, torch.full((batch,), k), qs,
                                       seeds=torch.arange(batch, dtype=torch.int64) * 7919 + 1,
                                       offsets=torch.full((batch,), 5, dtype=torch.int64), backend="cpu")
    return p, q, drafts, out


@pytest.mark.parametrize("draft_probs", [True, False], ids=["draft_probs", "one_hot"])
def test_emitted_tokens_follow_target_at_every_position(draft_probs):
    """Chi-square at alpha = 1e-4 with 40,000 requests: at every position k, among the requests
    that reach k, the token emitted there (accepted draft, correction or bonus) ~ p_k."""
    p, q, drafts, out = _chain_distribution_case(draft_probs)
    vocab = p.shape[-1]
    tokens, acc = out.token_ids, out.num_accepted
    assert not (tokens == 6).any()
    for k in range(p.shape[0]):
        reached = acc >= k
        counts = torch.bincount(tokens[reached, k], minlength=vocab).double()
        support = p[k] > 0
        assert counts[~support].sum() == 0
        if int(reached.sum()) < 500:
            continue
        probs = p[k][support].double()
        expected = probs / probs.sum() * counts.sum()
        stat = scipy.stats.chisquare(counts[support].numpy(), expected.numpy())
        assert stat.pvalue > ALPHA, (k, counts, expected)


@pytest.mark.parametrize("draft_probs", [True, False], ids=["draft_probs", "one_hot"])
def test_acceptance_rate_matches_theory(draft_probs):
    """Binomial test at alpha = 1e-4, 40,000 requests: P(accept at k | reach k) = sum(min(p_k, q_k))
    with draft probabilities and p_k(x_k) with one-hot drafts."""
    p, q, drafts, out = _chain_distribution_case(draft_probs)
    acc = out.num_accepted
    for k in range(q.shape[0]):
        reached = int((acc >= k).sum())
        accepted = int((acc >= k + 1).sum())
        rate = float(torch.minimum(p[k], q[k]).sum()) if draft_probs else float(p[k, int(drafts[0, k])])
        if reached == 0:
            continue
        if rate == 0.0:
            assert accepted == 0
            continue
        assert scipy.stats.binomtest(accepted, reached, rate).pvalue > ALPHA, (k, accepted, reached, rate)


# ------------------------------------------------------------------------------------------ errors


def _good():
    return make_batch(2, 3, 10, seed=0)


@pytest.mark.parametrize("field,value,match", [
    ("target_probs", torch.rand(2, 4), "target_probs"),
    ("target_probs", torch.rand(2, 4, 10).double(), "target_probs"),
    ("draft_token_ids", torch.zeros(2, 2, dtype=torch.int64), "draft_token_ids"),
    ("draft_token_ids", torch.zeros(2, 3), "draft_token_ids"),
    ("num_draft_tokens", torch.zeros(3, dtype=torch.int64), "num_draft_tokens"),
    ("num_draft_tokens", torch.zeros(2, dtype=torch.float32), "num_draft_tokens"),
    ("draft_probs", torch.rand(2, 3, 11), "draft_probs"),
    ("draft_probs", torch.rand(2, 3, 10).double(), "draft_probs"),
    ("seeds", torch.zeros(2, dtype=torch.float32), "seeds"),
    ("offsets", torch.zeros(3, dtype=torch.int64), "offsets"),
])
def test_bad_shapes_and_dtypes_name_the_argument(field, value, match):
    args = _good()
    args[field] = value
    with pytest.raises(ValueError, match=match):
        call(args, None)


def test_bad_greedy_and_backend():
    args = _good()
    with pytest.raises(ValueError, match="greedy"):
        call(args, None, greedy=torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ValueError, match="backend"):
        call(args, "vulkan")
    with pytest.raises(BackendUnavailableError, match="cuda"):
        call(args, "cuda")
    with pytest.raises(ValueError, match="device"):
        specdec_ops.rejection_sample(args["target_probs"], args["draft_token_ids"].to("meta"),
                                     args["num_draft_tokens"])


@pytest.mark.parametrize("bad", ["id_high", "id_negative", "count_high", "count_negative"])
def test_bad_values_raise_value_error_on_cpu(cpu_backend, bad):
    args = _good()
    if bad == "id_high":
        args["num_draft_tokens"] = torch.tensor([3, 3])
        args["draft_token_ids"][1, 2] = 10
        match = "draft_token_ids"
    elif bad == "id_negative":
        args["num_draft_tokens"] = torch.tensor([3, 3])
        args["draft_token_ids"][0, 0] = -1
        match = "draft_token_ids"
    elif bad == "count_high":
        args["num_draft_tokens"] = torch.tensor([4, 1])
        match = "num_draft_tokens"
    else:
        args["num_draft_tokens"] = torch.tensor([1, -1])
        match = "num_draft_tokens"
    with pytest.raises(ValueError, match=match):
        call(args, cpu_backend)


def test_padding_slots_may_hold_any_id(cpu_backend):
    args = _good()
    args["num_draft_tokens"] = torch.tensor([1, 0])
    args["draft_token_ids"][:, 1:] = -1
    args["draft_token_ids"][1, 0] = 10**6
    assert_same(call(args, cpu_backend), call(args, "reference"))


@pytest.mark.parametrize("bad", ["cu_start", "cu_decreasing", "cu_end", "too_many"])
def test_bad_packed_values_raise_value_error(cpu_backend, bad):
    packed = to_packed(dict(_good(), num_draft_tokens=torch.tensor([3, 2])))
    cu = packed["cu_num_draft_tokens"].clone()
    k = 3
    if bad == "cu_start":
        cu[0] = 1
    elif bad == "cu_decreasing":
        cu[1] = cu[2] + 1
    elif bad == "cu_end":
        packed["draft_token_ids"] = packed["draft_token_ids"][:-1]
        packed["target_probs"] = packed["target_probs"][:-1]
        if packed["draft_probs"] is not None:
            packed["draft_probs"] = packed["draft_probs"][:-1]
    else:
        k = 2
    packed["cu_num_draft_tokens"] = cu
    with pytest.raises(ValueError, match="cu_num_draft_tokens|max_num_draft_tokens|target_probs"):
        call_packed(packed, cpu_backend, k=k)


def test_packed_shape_errors():
    packed = to_packed(_good())
    with pytest.raises(ValueError, match="target_probs"):
        specdec_ops.rejection_sample_packed(packed["target_probs"][:-1], packed["cu_num_draft_tokens"],
                                            packed["draft_token_ids"])
    with pytest.raises(ValueError, match="cu_num_draft_tokens"):
        specdec_ops.rejection_sample_packed(packed["target_probs"], packed["cu_num_draft_tokens"].float(),
                                            packed["draft_token_ids"])
    with pytest.raises(ValueError, match="max_num_draft_tokens"):
        specdec_ops.rejection_sample_packed(packed["target_probs"], packed["cu_num_draft_tokens"],
                                            packed["draft_token_ids"], max_num_draft_tokens=-1)


def test_op_level_checks_raise_value_error_naming_element():
    args = _good()
    args["num_draft_tokens"] = torch.tensor([3, 3])
    args["draft_token_ids"][1, 1] = 99
    with pytest.raises(ValueError, match=r"draft_token_ids.*99"):
        torch.ops.specdec.rejection_sample(args["target_probs"], args["draft_token_ids"], args["num_draft_tokens"],
                                           args["draft_probs"], args["seeds"], args["offsets"], None)
    with pytest.raises(ValueError, match="num_draft_tokens"):  # a shape: ValueError
        torch.ops.specdec.rejection_sample(args["target_probs"], args["draft_token_ids"], args["seeds"][:1],
                                           None, args["seeds"], args["offsets"], None)


# ------------------------------------------------------------------------------------------ torch integration


def _op_samples():
    args = make_batch(3, 2, 12, seed=1)
    packed = to_packed(args)
    greedy = torch.tensor([True, False, False])
    padded_args = (args["target_probs"], args["draft_token_ids"], args["num_draft_tokens"], args["draft_probs"],
                   args["seeds"], args["offsets"], greedy)
    packed_args = (packed["target_probs"], packed["cu_num_draft_tokens"], packed["draft_token_ids"],
                   packed["draft_probs"], packed["seeds"], packed["offsets"], None, 2)
    return padded_args, packed_args


@pytest.mark.parametrize("suffix", ["", "_triton"])
def test_opcheck(suffix):
    if suffix and not HAS_TRITON:
        pytest.skip("triton not installed")
    padded_args, packed_args = _op_samples()
    torch.library.opcheck(getattr(torch.ops.specdec, "rejection_sample" + suffix).default, padded_args)
    torch.library.opcheck(getattr(torch.ops.specdec, "rejection_sample_packed" + suffix).default, packed_args)


def test_torch_compile_fullgraph():
    args = make_batch(4, 3, 32, seed=2)

    @torch.compile(fullgraph=True)
    def step(target_probs, draft_token_ids, num_draft_tokens, draft_probs, seeds, offsets):
        out = specdec_ops.rejection_sample(target_probs, draft_token_ids, num_draft_tokens, draft_probs,
                                           seeds=seeds, offsets=offsets)
        return out.token_ids, out.num_accepted

    ids, n = step(**args)
    eager = call(args, "cpu")
    assert torch.equal(ids, eager.token_ids) and torch.equal(n, eager.num_accepted)


# ------------------------------------------------------------------------------------------ CUDA (skipped here)


def _to(args, device):
    return {k: (v.to(device) if v is not None else None) for k, v in args.items()}


@pytest.mark.cuda
@pytest.mark.parametrize("draft_probs", [True, False])
@pytest.mark.parametrize("vocab", [7, 8193, 151936])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_equals_cpu(draft_probs, vocab, dtype):
    args = make_batch(16, 4, vocab, draft_probs=draft_probs, dtype=dtype, seed=vocab, temperature=0.3)
    greedy = torch.arange(16) % 4 == 0
    cpu = call(args, "cpu", greedy)
    gpu = call(_to(args, "cuda"), "cuda", greedy.cuda())
    # Rare floating-point ties in the race may differ (logf ulps): require near-total agreement.
    same = (gpu.token_ids.cpu() == cpu.token_ids).all(-1).float().mean()
    assert same >= 0.99
    assert torch.equal(gpu.num_accepted.cpu(), cpu.num_accepted)
    packed = call_packed(_to(to_packed(args), "cuda"), "cuda", k=4, greedy=greedy.cuda())
    assert torch.equal(packed.token_ids, gpu.token_ids)
    if HAS_TRITON:
        tri = call(_to(args, "cuda"), "triton", greedy.cuda())
        assert (tri.token_ids == gpu.token_ids).all(-1).float().mean() >= 0.99


@pytest.mark.cuda
def test_cuda_bad_values_are_safe():
    args = make_batch(4, 3, 50, seed=3)
    args["draft_token_ids"][0, 0] = 10**9
    args["draft_token_ids"][1, 1] = -5
    args["num_draft_tokens"] = torch.tensor([3, 3, 99, -2])
    out = call(_to(args, "cuda"), "cuda")
    torch.cuda.synchronize()
    t = out.token_ids.cpu()
    assert int(out.num_accepted[0]) == 0 and int(out.num_accepted[1]) <= 1
    assert ((t == -1) | ((t >= 0) & (t < 50))).all()


@pytest.mark.cuda
def test_cuda_graph_capture_and_replay():
    args = _to(make_batch(8, 4, 1000, seed=4), "cuda")
    greedy = torch.zeros(8, dtype=torch.bool, device="cuda")
    call(args, "cuda", greedy)  # warm-up
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call(args, "cuda", greedy)
    for step in range(3):
        args["offsets"].add_(1)
        graph.replay()
        torch.cuda.synchronize()
        expected = call(args, "cuda", greedy)
        assert torch.equal(out.token_ids, expected.token_ids)


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
def test_triton_kernel_compiles_for_sm90_without_a_gpu():
    """The interpreter does not run Triton's code generator: compile every variant of the kernel to
    sm_90 ahead of time, so what only the real compiler rejects fails here."""
    compile_ahead_of_time("aot_rejection_kernel.py")
