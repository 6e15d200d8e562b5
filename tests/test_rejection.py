"""Chain rejection sampling (DESIGN.md §5.1-§5.2): every backend against
reference.py, the samplers against the exact target distribution, and every
error path."""

import pytest
import scipy.stats
import torch

import specdec_ops
from specdec_ops import reference
from specdec_ops._backend import gpu_value_rules
from specdec_ops._checks import BackendUnavailableError, rng_inputs
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import CPU_BACKENDS, HAS_TRITON, compile_ahead_of_time

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


# ------------------------------------------------------------------------------------------ engine keywords (#14)


def test_keywords_off_outputs_are_those_recorded_before_the_keywords():
    # Recorded with reference.py at 73be0e4 (before the engine keywords): off, every backend still emits
    # exactly these tokens for these seeds (accepted drafts, corrections and sampled bonus tokens).
    recorded = {
        True: ([[2, 4, -1, -1], [1, -1, -1, -1], [3, 0, 0, 2], [4, -1, -1, -1], [4, -1, -1, -1],
                [2, -1, -1, -1], [4, 4, -1, -1], [4, 2, 1, -1]], [1, 0, 3, 0, 0, 0, 1, 2]),
        False: ([[4, -1, -1, -1], [1, -1, -1, -1], [3, 0, 2, -1], [3, -1, -1, -1], [4, -1, -1, -1],
                 [2, -1, -1, -1], [3, -1, -1, -1], [1, -1, -1, -1]], [0, 0, 2, 0, 0, 0, 0, 0]),
    }
    greedy = torch.arange(8) % 4 == 1
    for draft_probs, (tokens, accepted) in recorded.items():
        args = make_batch(8, 3, 5, draft_probs=draft_probs, seed=2026, temperature=2.0)
        for backend in CPU_BACKENDS:
            out = call(args, backend, greedy)
            assert out.token_ids.tolist() == tokens and out.num_accepted.tolist() == accepted, backend
            packed = call_packed(to_packed(args), backend, k=3, greedy=greedy)
            assert packed.token_ids.tolist() == tokens, backend


def _accepting_batch(batch=12, k=3, vocab=40, seed=21, draft_probs=True):
    """A batch where most drafts are accepted (drafts = argmax of a peaked target), ragged n_b."""
    args = make_batch(batch, k, vocab, draft_probs=draft_probs, seed=seed, temperature=0.05)
    args["draft_token_ids"] = torch.argmax(args["target_probs"][:, :k], -1)
    if draft_probs:
        args["draft_probs"] = args["target_probs"][:, :k].clone()
    x = (int(args["draft_token_ids"][1, 0]) + 1) % vocab  # request 1: a draft the peaked target rejects
    args["draft_token_ids"][1, 0] = x
    args["num_draft_tokens"][1] = k
    if draft_probs:
        args["draft_probs"][1, 0] = torch.nn.functional.one_hot(torch.tensor(x), vocab).float()
    return args


@pytest.mark.parametrize("draft_probs", [True, False], ids=["draft_probs", "one_hot"])
def test_bonus_token_ids_replace_only_the_bonus_token(cpu_backend, draft_probs):
    args = _accepting_batch(draft_probs=draft_probs)
    batch, k, vocab = 12, 3, 40
    greedy = torch.arange(batch) % 3 == 0
    bonus = (torch.arange(batch, dtype=torch.int32) * 7 + 3) % vocab
    plain = call(args, cpu_backend, greedy)
    n = args["num_draft_tokens"]
    full = plain.num_accepted.long() == n
    assert full.sum() >= 4 and (~full).sum() >= 1  # both kinds of request are present
    for given in (bonus, bonus[:, None].long()):  # int32 [B] and int64 [B, 1]
        out = call(dict(args, bonus_token_ids=given), cpu_backend, greedy)
        assert torch.equal(out.num_accepted, plain.num_accepted)
        want = plain.token_ids.clone()
        rows = torch.arange(batch)[full]
        want[rows, n[full]] = bonus[full].long()
        assert torch.equal(out.token_ids, want)
        assert_same(out, call(dict(args, bonus_token_ids=given), "reference", greedy))
        packed = call_packed(dict(to_packed(args), bonus_token_ids=given), cpu_backend, k=k, greedy=greedy)
        assert_same(packed, out)


@pytest.mark.parametrize("draft_probs", [True, False], ids=["draft_probs", "one_hot"])
def test_bonus_rows_may_be_omitted_in_both_layouts(cpu_backend, draft_probs):
    # [B, K, V] and [T, V] (vLLM's layout): the same outputs as with the bonus rows, which are never read
    # (filled with NaN in the full layouts here: reading one would change the tokens or their range).
    args = _accepting_batch(draft_probs=draft_probs, seed=22)
    batch, k = 12, 3
    greedy = torch.arange(batch) % 4 == 1
    bonus = torch.arange(batch) % 40
    target = args["target_probs"].clone()
    n = args["num_draft_tokens"]
    target[torch.arange(batch), n] = float("nan")  # every request's bonus row
    with_rows = call(dict(args, target_probs=target, bonus_token_ids=bonus), cpu_backend, greedy)
    without = call(dict(args, target_probs=target[:, :k].contiguous(), bonus_token_ids=bonus), cpu_backend, greedy)
    assert_same(with_rows, without)
    assert_same(with_rows, call(dict(args, bonus_token_ids=bonus), "reference", greedy))
    packed = to_packed(dict(args, target_probs=target))
    rows = torch.cat([args["target_probs"][b, : int(n[b])] for b in range(batch)])  # [T, V], no bonus rows
    assert packed["target_probs"].shape[0] == rows.shape[0] + batch
    assert_same(call_packed(dict(packed, bonus_token_ids=bonus), cpu_backend, k=k, greedy=greedy), with_rows)
    assert_same(call_packed(dict(packed, target_probs=rows, bonus_token_ids=bonus), cpu_backend, k=k,
                            greedy=greedy), with_rows)


def test_bonus_rows_omitted_need_bonus_token_ids():
    args = _good()
    short = args["target_probs"][:, :3].contiguous()  # [B, K, V]
    with pytest.raises(ValueError, match="draft_token_ids"):
        call(dict(args, target_probs=short), "cpu")
    with pytest.raises(ValueError, match="target_probs.*bonus_token_ids"):
        call(dict(args, target_probs=short[:, :2], bonus_token_ids=torch.tensor([1, 2])), "cpu")
    packed = to_packed(args)
    total = packed["draft_token_ids"].shape[0]
    with pytest.raises(ValueError, match="target_probs"):
        call_packed(dict(packed, target_probs=packed["target_probs"][:total]), "cpu")


def test_gpu_clamps_bonus_ids_on_the_triton_kernel():
    # On the GPU bad bonus ids are clamped into [0, V-1] (no host sync); the Triton kernel does it, shown
    # here by launching it directly under the interpreter inside gpu_value_rules() (on CPU tensors the op
    # checks the values instead).
    if not HAS_TRITON:
        pytest.skip("triton not installed")
    from specdec_ops.rejection import _triton_padded
    args = _accepting_batch(batch=4, seed=23)
    args["num_draft_tokens"] = torch.tensor([0, 0, 2, 0])
    bonus = torch.tensor([-5, 40, 7, 10**9])
    with gpu_value_rules():
        token_ids, num_accepted = _triton_padded(args["target_probs"], args["draft_token_ids"],
                                                 args["num_draft_tokens"], args["draft_probs"], args["seeds"],
                                                 args["offsets"], None, bonus)
    assert token_ids[:, 0].tolist()[0] == 0 and token_ids[1, 0] == 39 and token_ids[3, 0] == 39
    assert int(num_accepted[2]) == 2 and token_ids[2, 2] == 7


def _placeholder_batch(draft_probs, seed):
    """Requests with -1 and V placeholders at the first, a middle and the last used slot."""
    batch, k, vocab = 12, 4, 30
    args = make_batch(batch, k, vocab, draft_probs=draft_probs, seed=seed)
    ids = torch.argmax(args["target_probs"][:, :k], -1)
    hot = torch.nn.functional.one_hot(ids, vocab).float()
    # Valid drafts accepted: p(x) >= 0.999 > q(x) (one-hot q: accepted iff u < p(x); these seeds all pass).
    args["target_probs"][:, :k] = 0.999 * hot + 0.001 * args["target_probs"][:, :k]
    if draft_probs:
        args["draft_probs"] = 0.9 * hot + 0.1 * args["draft_probs"]
    args["draft_token_ids"] = ids
    args["num_draft_tokens"] = torch.full((batch,), k)
    for b, (slot, bad) in enumerate([(0, -1), (0, vocab), (2, -1), (2, vocab), (3, -1), (3, vocab)]):
        ids[b, slot] = bad
    ids[6:, :] = -1  # whole placeholder rows
    args["num_draft_tokens"][9:] = torch.tensor([1, 2, 0])
    return args


@pytest.mark.parametrize("draft_probs", [True, False], ids=["draft_probs", "one_hot"])
def test_reject_invalid_drafts_rejects_placeholders_at_their_position(cpu_backend, draft_probs):
    args = _placeholder_batch(draft_probs, seed=31)
    greedy = torch.arange(12) % 2 == 1
    ids, n = args["draft_token_ids"], args["num_draft_tokens"]
    out = call(dict(args, reject_invalid_drafts=True), cpu_backend, greedy)
    assert_same(out, call(dict(args, reject_invalid_drafts=True), "reference", greedy))
    first_bad = [next((k for k in range(int(n[b])) if not 0 <= int(ids[b, k]) < 30), int(n[b])) for b in range(12)]
    assert (out.num_accepted <= torch.tensor(first_bad)).all()
    assert (out.num_accepted[:6] == torch.tensor([0, 0, 2, 2, 3, 3])).all()  # accepted up to the placeholder
    emitted = out.token_ids[out.token_ids >= 0]
    assert ((emitted >= 0) & (emitted < 30)).all()
    for b in range(12):  # greedy: the correction is the argmax of the placeholder's row
        a = int(out.num_accepted[b])
        if greedy[b]:
            assert int(out.token_ids[b, a]) == int(torch.argmax(args["target_probs"][b, a]))
    packed = call_packed(dict(to_packed(args), reject_invalid_drafts=True), cpu_backend, k=4, greedy=greedy)
    assert_same(packed, out)


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_invalid_drafts_still_raise_on_cpu_without_the_flag(cpu_backend, layout):
    args = _placeholder_batch(True, seed=32)
    with pytest.raises(ValueError, match="draft_token_ids"):
        if layout == "padded":
            call(args, cpu_backend)
        else:
            call_packed(to_packed(args), cpu_backend, k=4)


@pytest.mark.parametrize("draft_probs", [True, False], ids=["draft_probs", "one_hot"])
def test_correction_after_a_placeholder_follows_the_residual(draft_probs):
    """Chi-square at alpha = 1e-4, 40,000 requests, each with a -1 placeholder at slot 0: the correction
    ~ max(p - q, 0) normalized over q's full row, or p itself for one-hot drafts (nothing removed)."""
    vocab, batch = 8, STAT_DRAWS
    g = torch.Generator().manual_seed(43)
    p = torch.softmax(torch.randn(2, vocab, generator=g), -1)
    q = torch.softmax(torch.randn(1, vocab, generator=g), -1)
    out = specdec_ops.rejection_sample(p.expand(batch, 2, vocab).contiguous(), torch.full((batch, 1), -1),
                                       torch.ones(batch, dtype=torch.int64),
                                       q.expand(batch, 1, vocab).contiguous() if draft_probs else None,
                                       seeds=torch.arange(batch) * 31 + 5,
                                       offsets=torch.zeros(batch, dtype=torch.int64),
                                       reject_invalid_drafts=True, backend="cpu")
    assert (out.num_accepted == 0).all()
    expected = (p[0] - q[0]).clamp(min=0).double() if draft_probs else p[0].double()
    counts = torch.bincount(out.token_ids[:, 0], minlength=vocab).double()
    support = expected > 0
    assert counts[~support].sum() == 0
    stat = scipy.stats.chisquare(counts[support].numpy(), (expected[support] / expected.sum() * batch).numpy())
    assert stat.pvalue > ALPHA, (counts, expected)


def test_synthetic_rates_force_the_acceptance_length(cpu_backend):
    # Drafts the target would reject (random ids under a peaked target): the probabilities play no part.
    args = make_batch(10, 4, 30, seed=51, temperature=0.05)
    args["num_draft_tokens"] = torch.tensor([4, 3, 2, 1, 0, 4, 3, 4, 4, 3])
    greedy = torch.arange(10) % 2 == 0
    n = args["num_draft_tokens"]
    out = call(dict(args, synthetic_acceptance_rates=torch.tensor([1.0, 1.0, 0.0, 1.0])), cpu_backend, greedy)
    assert torch.equal(out.num_accepted.long(), torch.clamp(n, max=2))
    assert torch.equal(out.token_ids[:, :2][n >= 2], args["draft_token_ids"][:, :2][n >= 2])
    for b in range(10):  # greedy: the correction at a forced rejection is the argmax of its row
        if greedy[b] and n[b] >= 3:
            assert int(out.token_ids[b, 2]) == int(torch.argmax(args["target_probs"][b, 2]))
    zero = call(dict(args, synthetic_acceptance_rates=torch.zeros(6)), cpu_backend, greedy)  # R > K is allowed
    assert (zero.num_accepted == 0).all()
    # An invalid id is rejected even at rate 1, without an error on CPU in this mode (no reject_invalid_drafts).
    ids = args["draft_token_ids"].clone()
    ids[0, 1] = -1
    ids[1, 2] = 30
    bad = call(dict(args, draft_token_ids=ids, synthetic_acceptance_rates=torch.ones(4)), cpu_backend, greedy)
    assert bad.num_accepted[:2].tolist() == [1, 2] and (bad.num_accepted[2:].long() == n[2:]).all()
    packed = call_packed(dict(to_packed(dict(args, draft_token_ids=ids)), synthetic_acceptance_rates=torch.ones(4)),
                         cpu_backend, k=4, greedy=greedy)
    assert_same(packed, bad)


def test_synthetic_acceptance_lengths_follow_the_rates():
    """Chi-square at alpha = 1e-4 over 40,000 requests (half greedy), K = 4, rates r: the acceptance
    length L has P(L = j) = r_0 ... r_{j-1} (1 - r_j) for j < K and r_0 ... r_{K-1} for j = K."""
    rates = [0.8, 0.5, 0.3, 0.9]
    batch, k, vocab = STAT_DRAWS, 4, 16
    g = torch.Generator().manual_seed(52)
    p = torch.softmax(torch.randn(k + 1, vocab, generator=g), -1).expand(batch, k + 1, vocab).contiguous()
    ids = torch.randint(0, vocab, (batch, k), generator=g)
    out = specdec_ops.rejection_sample(p, ids, torch.full((batch,), k), seeds=torch.arange(batch) * 7 + 1,
                                       offsets=torch.full((batch,), 3), greedy=torch.arange(batch) % 2 == 0,
                                       synthetic_acceptance_rates=torch.tensor(rates), backend="cpu")
    expected, reach = [], 1.0
    for r in rates:
        expected.append(reach * (1 - r))
        reach *= r
    expected.append(reach)
    counts = torch.bincount(out.num_accepted.long(), minlength=k + 1).double()
    stat = scipy.stats.chisquare(counts.numpy(), (torch.tensor(expected, dtype=torch.float64) * batch).numpy())
    assert stat.pvalue > ALPHA, (counts, expected)


@pytest.mark.parametrize("draft_probs", [True, False], ids=["draft_probs", "one_hot"])
def test_correction_after_a_forced_rejection_follows_the_residual(draft_probs):
    """Chi-square at alpha = 1e-4, 40,000 requests: rate 0 rejects the draft x at position 0 whatever
    p and q; the correction ~ max(p - q, 0) normalized (one-hot: p without x)."""
    vocab, batch = 8, STAT_DRAWS
    g = torch.Generator().manual_seed(53)
    p = torch.softmax(torch.randn(2, vocab, generator=g), -1)
    q = torch.softmax(torch.randn(1, vocab, generator=g), -1)
    x = int(torch.argmax(p[0]))  # the target's favourite: a rejection there is rare without the rates
    out = specdec_ops.rejection_sample(p.expand(batch, 2, vocab).contiguous(), torch.full((batch, 1), x),
                                       torch.ones(batch, dtype=torch.int64),
                                       q.expand(batch, 1, vocab).contiguous() if draft_probs else None,
                                       seeds=torch.arange(batch) * 13 + 2,
                                       offsets=torch.zeros(batch, dtype=torch.int64),
                                       synthetic_acceptance_rates=torch.zeros(1), backend="cpu")
    assert (out.num_accepted == 0).all()
    if draft_probs:
        expected = (p[0] - q[0]).clamp(min=0).double()
    else:
        expected = p[0].double().clone()
        expected[x] = 0.0
    counts = torch.bincount(out.token_ids[:, 0], minlength=vocab).double()
    support = expected > 0
    assert counts[~support].sum() == 0
    stat = scipy.stats.chisquare(counts[support].numpy(), (expected[support] / expected.sum() * batch).numpy())
    assert stat.pvalue > ALPHA, (counts, expected)


def _mixed_keyword_batch(seed, draft_probs):
    """Random requests mixing all three keywords: placeholders, greedy rows, synthetic rates, bonus ids."""
    batch, k, vocab = 9, 4, 24
    g = torch.Generator().manual_seed(seed)
    args = make_batch(batch, k, vocab, draft_probs=draft_probs, seed=seed, temperature=0.7)
    ids = args["draft_token_ids"]
    agree = torch.rand(batch, k, generator=g) < 0.6  # many drafts agree with the target argmax
    ids[agree] = torch.argmax(args["target_probs"][:, :k], -1)[agree]
    holes = torch.rand(batch, k, generator=g) < 0.15
    ids[holes] = torch.where(torch.rand(batch, k, generator=g) < 0.5, -1, vocab)[holes]
    greedy = torch.rand(batch, generator=g) < 0.4
    bonus = torch.randint(0, vocab, (batch, 1), generator=g)
    rates = torch.rand(k + 1, generator=g)
    return args, greedy, bonus, rates


@pytest.mark.parametrize("seed", [61, 62, 63])
@pytest.mark.parametrize("draft_probs", [True, False], ids=["draft_probs", "one_hot"])
def test_backends_agree_with_all_keywords(cpu_backend, seed, draft_probs):
    args, greedy, bonus, rates = _mixed_keyword_batch(seed, draft_probs)
    k = args["draft_token_ids"].shape[1]
    for kw in (dict(bonus_token_ids=bonus, reject_invalid_drafts=True),
               dict(reject_invalid_drafts=True, synthetic_acceptance_rates=rates),
               dict(bonus_token_ids=bonus, reject_invalid_drafts=True, synthetic_acceptance_rates=rates)):
        want = call(dict(args, **kw), "reference", greedy)
        assert_same(call(dict(args, **kw), cpu_backend, greedy), want)
        packed = dict(to_packed(args), **kw)
        assert_same(call_packed(packed, cpu_backend, k=k, greedy=greedy), want)
        if "bonus_token_ids" in kw:  # no bonus rows in either layout
            short = dict(args, target_probs=args["target_probs"][:, :k].contiguous(), **kw)
            assert_same(call(short, cpu_backend, greedy), want)
            n = args["num_draft_tokens"]
            rows = torch.cat([args["target_probs"][b, : int(n[b])] for b in range(len(n))])
            assert_same(call_packed(dict(packed, target_probs=rows), cpu_backend, k=k, greedy=greedy), want)


# ------------------------------------------------------------------------------------------ Triton: split rows
# The Triton kernel splits every request's vocabulary over `parts` programs (grid (B, parts)); the program that
# takes the last ticket merges their partials. Forced here under the interpreter with a 16-entry tile and
# V = 100: 7 tiles, the last one partial, so slices end mid-row only at V (parts=3: [0, 48), [48, 96), [96, 100)).

SPLIT_VOCAB, SPLIT_BLOCK = 100, 16
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")


def split_call(args, parts, greedy=None, block=SPLIT_BLOCK, while_loops=None, bonus_token_ids=None,
               synthetic_acceptance_rates=None, reject_invalid_drafts=False):
    """The Triton op's implementation on `parts` programs per request (padded layout)."""
    from specdec_ops.rejection import _triton_padded
    from specdec_ops.types import SampleOutput
    return SampleOutput(*_triton_padded(args["target_probs"], args["draft_token_ids"], args["num_draft_tokens"],
                                        args["draft_probs"], args["seeds"], args["offsets"], greedy,
                                        bonus_token_ids, reject_invalid_drafts, synthetic_acceptance_rates,
                                        parts=parts, block=block, while_loops=while_loops))


def split_call_packed(packed, k, parts, greedy=None, block=SPLIT_BLOCK, bonus_token_ids=None,
                      synthetic_acceptance_rates=None, reject_invalid_drafts=False):
    from specdec_ops.rejection import _triton_packed
    from specdec_ops.types import SampleOutput
    return SampleOutput(*_triton_packed(packed["target_probs"], packed["cu_num_draft_tokens"],
                                        packed["draft_token_ids"], packed["draft_probs"], packed["seeds"],
                                        packed["offsets"], greedy, k, bonus_token_ids, reject_invalid_drafts,
                                        synthetic_acceptance_rates, parts=parts, block=block))


def test_split_sizing_covers_the_row_without_empty_parts():
    from specdec_ops.rejection import _triton_parts
    assert _triton_parts(64, 126, 660) == (10, 13)   # H200: 132 SMs x 5 programs, V = 128256, BLOCK = 1024
    assert _triton_parts(8, 126, 660) == (63, 2)
    assert _triton_parts(1000, 126, 660) == (1, 126)  # more requests than resident programs: one part each
    assert _triton_parts(4, 7, 0, parts=3) == (3, 3)
    assert _triton_parts(4, 7, 0, parts=5) == (4, 2)  # 5 parts of 2 tiles would leave one empty
    assert _triton_parts(4, 7, 0, parts=50) == (7, 1)
    for tiles in range(1, 40):
        for parts in range(1, 45):
            got, per_part = _triton_parts(3, tiles, 0, parts=parts)
            assert 1 <= got <= min(parts, tiles) and (got - 1) * per_part < tiles <= got * per_part


@needs_triton
@pytest.mark.parametrize("parts", [1, 2, 3, 5, 7])
@pytest.mark.parametrize("draft_probs", [True, False], ids=["draft_probs", "one_hot"])
def test_split_triton_matches_cpu_op(parts, draft_probs):
    args = make_batch(12, 4, SPLIT_VOCAB, draft_probs=draft_probs, seed=70 + parts, temperature=0.1)
    agree = torch.rand(12, 4, generator=torch.Generator().manual_seed(parts)) < 0.8
    args["draft_token_ids"][agree] = torch.argmax(args["target_probs"][:, :4], -1)[agree]  # greedy walks go on
    greedy = torch.arange(12) % 3 == 1
    want = call(args, "cpu", greedy)
    assert want.num_accepted.max() >= 2 and (want.num_accepted == 0).any()
    assert_same(split_call(args, parts, greedy), want)
    if parts == 3:
        assert_same(split_call(args, parts, greedy, while_loops=True), want)  # triton 3.6's interpreted form
        assert_same(split_call(args, parts, greedy, block=4), want)  # 25 tiles of 4: 3 parts of 9, 9, 7


@needs_triton
@pytest.mark.parametrize("parts", [1, 3])
def test_split_race_skips_no_possible_winner(parts):
    # The race keeps one running best across tiles and skips the log of entries that provably cannot beat it
    # (race_tile_update). Rows whose winners come late or early, or are decided by the noise alone, raced in
    # tiles of 4 (25 tiles, 3 parts of 9, 9, 7): a skip test that drops a possible winner, or a tie that moves
    # the winner to a later tile, changes a token. Each request rejects its one-hot draft at row 0 (p(x) = 0):
    # the correction is the race over p without x. All-zero rows race over p without mass: the first index.
    batch, vocab = 30, SPLIT_VOCAB
    idx = torch.arange(vocab, dtype=torch.float32)
    shapes = [torch.full((vocab,), 0.01),                          # equal masses: the noise decides
              torch.exp(-idx / 10), torch.exp(-(vocab - idx) / 10),  # winners early / late in the row
              torch.where(idx % 7 == 3, 0.0, 1.0 + (idx % 5)),     # zeros among ties of five masses
              torch.where(idx >= 90, 1.0, 1e-6),                   # everything in the last tiles
              torch.zeros(vocab)]                                  # no mass anywhere
    p = torch.zeros(batch, 2, vocab)
    ids = torch.zeros(batch, 1, dtype=torch.int64)
    for b in range(batch):
        row = shapes[b % len(shapes)].clone()
        x = (7 * b) % vocab
        row[x] = 0.0
        p[b, 0] = row / row.sum() if row.sum() > 0 else row
        ids[b, 0] = x
    args = dict(target_probs=p, draft_token_ids=ids, num_draft_tokens=torch.ones(batch, dtype=torch.int64),
                draft_probs=None, seeds=torch.arange(batch) * 7919 + 3, offsets=torch.arange(batch) % 3)
    want = call(args, "reference")
    assert (want.num_accepted == 0).all() and len(set(want.token_ids[:, 0].tolist())) > 12
    assert (want.token_ids[5::6, 0] == 0).all()  # the all-zero rows
    assert_same(split_call(args, parts, block=4), want)


@needs_triton
@pytest.mark.parametrize("parts, block", [(1, 4), (3, 16)])
def test_split_one_hot_residual_drops_the_rejected_draft_in_its_tile(parts, block):
    # A rejected one-hot draft x leaves max(p - q, 0) = 0 at x and p elsewhere: only the tile holding x changes
    # (_race_tile), so x at a tile's first or last entry, in the row's partial last tile (vocab 101), or in a
    # part's first tile must still be dropped there and nowhere else. x holds 0.6 of the mass: without the
    # change there it would win most races. The rows after the rejection are never read (bonus row zero).
    vocab = SPLIT_VOCAB + 1
    spots = [0, 3, 4, block - 1, block, 2 * block, 33, 34, 47, 48, 64, 95, 96, 99, 100]
    batch = 3 * len(spots)
    p = torch.zeros(batch, 2, vocab)
    ids = torch.zeros(batch, 1, dtype=torch.int64)
    for b in range(batch):
        x = spots[b % len(spots)]
        p[b, 0] = 0.4 / (vocab - 1)
        p[b, 0, x] = 0.6
        ids[b, 0] = x
    args = dict(target_probs=p, draft_token_ids=ids, num_draft_tokens=torch.ones(batch, dtype=torch.int64),
                draft_probs=None, seeds=torch.arange(batch) * 31 + 11, offsets=torch.zeros(batch, dtype=torch.int64))
    want = call(args, "cpu")
    rejected = want.num_accepted == 0
    assert rejected.sum() >= 10 and len({spots[b % len(spots)] for b in rejected.nonzero().flatten().tolist()}) >= 8
    assert (want.token_ids[rejected, 0] != ids[rejected, 0]).all()
    assert_same(split_call(args, parts, block=block), want)


def _peaked(batch, k, peaks):
    """p one-hot (mass 1) at peaks[b][row]: every race and argmax has one possible winner."""
    p = torch.zeros(batch, k + 1, SPLIT_VOCAB)
    for b, row in enumerate(peaks):
        for r, i in enumerate(row):
            p[b, r, i] = 1.0
    return p


@needs_triton
@pytest.mark.parametrize("parts", [2, 3, 7])
def test_split_winners_at_the_ends_of_slices(parts):
    # Winners at the first and last entries of the slices (47, 48, 95, 96, 99 with 3 parts; 63, 64 with 2;
    # 15, 16, ... with 7): a part that skips its slice's first or last tile, or the row's partial last tile,
    # loses them. Sampling: one-hot drafts rejected at row 0 (p(x) = 0), the correction is the peak; all
    # accepted, the bonus is the peak. Greedy: the walk follows the peaks to the bonus row's.
    ends = [0, 15, 16, 47, 48, 63, 64, 95, 96, 99]
    batch, k = len(ends), 2
    peaks = [[e, ends[(i + 3) % len(ends)], ends[(i + 5) % len(ends)]] for i, e in enumerate(ends)]
    p = _peaked(batch, k, peaks)
    rejected = torch.tensor([[(row[0] + 1) % SPLIT_VOCAB, 0] for row in peaks])
    accepted = torch.tensor([row[:k] for row in peaks])
    base = dict(target_probs=p, num_draft_tokens=torch.full((batch,), k), draft_probs=None,
                seeds=torch.arange(batch) + 5, offsets=torch.zeros(batch, dtype=torch.int64))
    for ids, greedy, want_tokens, want_accepted in (
            (rejected, None, [[row[0], -1, -1] for row in peaks], [0] * batch),
            (accepted, None, peaks, [k] * batch),
            (accepted, torch.ones(batch, dtype=torch.bool), peaks, [k] * batch),
            (rejected, torch.ones(batch, dtype=torch.bool), [[row[0], -1, -1] for row in peaks], [0] * batch)):
        args = dict(base, draft_token_ids=ids)
        out = split_call(args, parts, greedy)
        assert out.token_ids.tolist() == want_tokens and out.num_accepted.tolist() == want_accepted
        assert_same(out, call(args, "cpu", greedy))


@needs_triton
@pytest.mark.parametrize("parts", [2, 3, 7])
def test_split_ties_take_the_first_index_across_parts(parts):
    # Equal maxima in different parts (greedy), and rows without any mass (every score 0: token 0): the
    # merge keeps the smallest index among the largest scores, as one program over the row would.
    batch = 4
    p = torch.zeros(batch, 2, SPLIT_VOCAB)
    p[0, 0, [47, 48, 99]] = 0.25   # greedy ties across parts 0, 1, 2 (3 parts) -> 47
    p[1, 0, [20, 99]] = 0.5        # -> 20
    p[2, 0, 99] = p[2, 0, 98] = 0.5  # -> 98
    p[0:3, 1, 5] = 1.0
    # request 3: sampling, draft rejected at 0 on a row with no mass at all (NaN, negative, zero): token 0
    p[3, 0, :] = float("nan")
    p[3, 0, 50:] = -1.0
    args = dict(target_probs=p, draft_token_ids=torch.tensor([[99], [99], [99], [7]]),
                num_draft_tokens=torch.ones(batch, dtype=torch.int64), draft_probs=None,
                seeds=torch.arange(batch), offsets=torch.zeros(batch, dtype=torch.int64))
    greedy = torch.tensor([True, True, True, False])
    out = split_call(args, parts, greedy)
    assert out.token_ids[:, 0].tolist() == [47, 20, 98, 0] and out.num_accepted.tolist() == [0, 0, 0, 0]
    assert_same(out, call(args, "cpu", greedy))


@needs_triton
@pytest.mark.parametrize("parts", [1, 2, 3])
def test_split_greedy_scan_two_tiles_per_trip(parts):
    # slice_argmax folds two tiles per trip, the first then the second, into one running best per lane: a
    # lane sees index i, then i + BLOCK, then i + 2 BLOCK. Ties within one lane across the two tiles of a trip
    # (3, 19), from a trip's second tile to the next trip's first (18, 34), across a part's end that falls
    # inside a trip (3 parts of 3 tiles: part 0's second trip reads tiles 2 and 3, tile 3 is part 1's), and
    # in the row's last, partial tile (97, 99): the first index wins, as a scan of the row in order.
    ties = [[3, 19], [18, 34], [40, 50], [97, 99], [50, 47]]
    batch = len(ties)
    p = torch.full((batch, 2, SPLIT_VOCAB), 1e-4)
    for b, at in enumerate(ties):
        p[b, 0, at] = 0.5
    p[:, 1, 5] = 1.0
    args = dict(target_probs=p, draft_token_ids=torch.zeros(batch, 1, dtype=torch.int64),
                num_draft_tokens=torch.ones(batch, dtype=torch.int64), draft_probs=None,
                seeds=torch.arange(batch), offsets=torch.zeros(batch, dtype=torch.int64))
    greedy = torch.ones(batch, dtype=torch.bool)
    want = [min(at) for at in ties]
    for while_loops in (None, True):  # the launcher's form (for on triton >= 3.8), then the while form
        out = split_call(args, parts, greedy, while_loops=while_loops)
        assert out.token_ids[:, 0].tolist() == want and out.num_accepted.tolist() == [0] * batch
    assert_same(out, call(args, "cpu", greedy))


@needs_triton
@pytest.mark.parametrize("parts", [1, 3, 7])
def test_split_residual_without_mass_races_over_p(parts):
    # q == p on the draft row and p(x) = 0: x is rejected (u q(x) < p(x) fails) and max(p - q, 0) has no
    # mass, so the correction is the race over p (the last program reruns it over the whole row).
    args = make_batch(8, 2, SPLIT_VOCAB, draft_probs=True, seed=81, ragged=False)
    p, q, ids = args["target_probs"], args["draft_probs"], args["draft_token_ids"]
    for b in range(8):
        p[b, 0, ids[b, 0]] = 0.0
        q[b, 0] = p[b, 0]
    want = call(args, "cpu")
    assert (want.num_accepted == 0).all()
    assert torch.equal(want.token_ids, call(args, "reference").token_ids)
    corrections = want.token_ids[:, 0]
    assert (p[torch.arange(8), 0, corrections] > 0).all() and len(set(corrections.tolist())) > 2  # raced over p
    assert_same(split_call(args, parts), want)


@needs_triton
@pytest.mark.parametrize("draft_probs", [True, False], ids=["draft_probs", "one_hot"])
def test_split_all_accepted_races_over_the_bonus_row(draft_probs):
    args = _accepting_batch(batch=10, k=3, vocab=SPLIT_VOCAB, seed=82, draft_probs=draft_probs)
    args["num_draft_tokens"] = torch.tensor([3, 3, 2, 1, 0, 3, 3, 2, 3, 1])
    want = call(args, "cpu")
    full = want.num_accepted.long() == args["num_draft_tokens"]
    assert full.sum() >= 6 and (~full).any()
    for parts in (2, 3, 7):
        assert_same(split_call(args, parts), want)


@needs_triton
@pytest.mark.parametrize("draft_probs", [True, False], ids=["draft_probs", "one_hot"])
def test_split_packed_layout_and_keywords(draft_probs):
    args = make_batch(9, 4, SPLIT_VOCAB, draft_probs=draft_probs, seed=83, temperature=0.5)
    ids = args["draft_token_ids"]
    agree = torch.rand(9, 4, generator=torch.Generator().manual_seed(83)) < 0.6
    ids[agree] = torch.argmax(args["target_probs"][:, :4], -1)[agree]
    ids[2, 1] = -1  # placeholders: rejected at their position
    ids[5, 0] = SPLIT_VOCAB
    greedy = torch.arange(9) % 3 == 0
    bonus = (torch.arange(9) * 11 + 3) % SPLIT_VOCAB
    rates = torch.tensor([0.9, 0.7, 0.5, 0.8])
    packed = to_packed(args)
    n = args["num_draft_tokens"]
    rows = torch.cat([args["target_probs"][b, : int(n[b])] for b in range(9)])  # [T, V]: no bonus rows
    for kw in ({}, dict(bonus_token_ids=bonus), dict(synthetic_acceptance_rates=rates),
               dict(bonus_token_ids=bonus, synthetic_acceptance_rates=rates)):
        want = call(dict(args, reject_invalid_drafts=True, **kw), "reference", greedy)
        for parts in ((2, 3) if not kw else (3,)):  # 3: slices of unequal length
            op_kw = dict(kw, reject_invalid_drafts=True)  # the -1 and V placeholders
            assert_same(split_call(args, parts, greedy, **op_kw), want)
            assert_same(split_call_packed(packed, 4, parts, greedy, **op_kw), want)
            if "bonus_token_ids" in kw:  # the bonus rows omitted in both layouts
                short = dict(args, target_probs=args["target_probs"][:, :4].contiguous())
                assert_same(split_call(short, parts, greedy, **op_kw), want)
                assert_same(split_call_packed(dict(packed, target_probs=rows), 4, parts, greedy, **op_kw), want)


@pytest.mark.parametrize("field,value,match", [
    ("bonus_token_ids", torch.tensor([1, 2, 3]), "bonus_token_ids"),
    ("bonus_token_ids", torch.tensor([[1, 2], [3, 4]]), "bonus_token_ids"),
    ("bonus_token_ids", torch.tensor([1.0, 2.0]), "bonus_token_ids"),
    ("bonus_token_ids", torch.tensor([1, 10]), r"bonus_token_ids\[1\] = 10"),
    ("bonus_token_ids", torch.tensor([-1, 2]), r"bonus_token_ids\[0\] = -1"),
    ("synthetic_acceptance_rates", torch.ones(2), "synthetic_acceptance_rates"),
    ("synthetic_acceptance_rates", torch.ones(3, dtype=torch.float64), "synthetic_acceptance_rates"),
    ("synthetic_acceptance_rates", torch.tensor([0.5, 1.5, 0.0]), r"synthetic_acceptance_rates\[1\]"),
    ("synthetic_acceptance_rates", torch.tensor([0.5, 0.5, float("nan")]), r"synthetic_acceptance_rates\[2\]"),
    ("reject_invalid_drafts", 1, "reject_invalid_drafts"),
])
@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_bad_keywords_name_the_argument(cpu_backend, layout, field, value, match):
    args = dict(_good(), **{field: value})
    with pytest.raises(specdec_ops.SpecDecArgumentError, match=match):
        if layout == "padded":
            call(args, cpu_backend)
        else:
            call_packed(dict(to_packed(_good()), **{field: value}), cpu_backend, k=3)
    with pytest.raises(ValueError, match="device"):
        call(dict(_good(), bonus_token_ids=torch.tensor([1, 2], device="meta")), cpu_backend)


def test_op_level_keyword_checks():
    # The C++ op checks the keywords' values itself (direct calls, no Python wrapper).
    args = _good()
    fixed = (args["target_probs"], args["draft_token_ids"], torch.tensor([3, 3]), None, args["seeds"],
             args["offsets"], None)
    op = torch.ops.specdec.rejection_sample.default
    with pytest.raises(ValueError, match=r"bonus_token_ids\[1\] = 10"):
        op(*fixed, torch.tensor([[0], [10]]))
    with pytest.raises(ValueError, match=r"synthetic_acceptance_rates\[0\]"):
        op(*fixed, None, False, torch.tensor([-0.5, 0.5, 0.5]))
    with pytest.raises(TypeError, match="synthetic_acceptance_rates"):
        op(*fixed, None, False, torch.ones(3, dtype=torch.float64))
    ids = args["draft_token_ids"].clone()
    ids[0, 1] = -1
    bad_ids = (args["target_probs"], ids) + fixed[2:]
    with pytest.raises(ValueError, match="draft_token_ids"):
        op(*bad_ids)
    token_ids, num_accepted = op(*bad_ids, None, True)
    assert int(num_accepted[0]) <= 1


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


def _op_samples_with_keywords():
    """The engine keywords on, the bonus rows omitted ([B, K, V] and [T, V])."""
    padded_args, packed_args = _op_samples()
    keywords = (torch.tensor([[4], [5], [6]]), True, torch.tensor([0.9, 0.2, 0.5]))
    padded_args = (padded_args[0][:, :2].contiguous(),) + padded_args[1:] + keywords
    total = packed_args[2].shape[0]
    packed_args = (packed_args[0][:total].contiguous(),) + packed_args[1:] + keywords
    return padded_args, packed_args


@pytest.mark.parametrize("keywords", [False, True], ids=["plain", "keywords"])
@pytest.mark.parametrize("suffix", ["", "_triton"])
def test_opcheck(suffix, keywords):
    if suffix and not HAS_TRITON:
        pytest.skip("triton not installed")
    padded_args, packed_args = _op_samples_with_keywords() if keywords else _op_samples()
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


def test_torch_compile_fullgraph_with_keywords():
    args = _accepting_batch(batch=4, k=3, vocab=32, seed=24)
    args["target_probs"] = args["target_probs"][:, :3].contiguous()  # no bonus rows
    bonus, rates = torch.tensor([[1], [2], [3], [4]]), torch.tensor([1.0, 0.5, 0.5])

    @torch.compile(fullgraph=True)
    def step(target_probs, draft_token_ids, num_draft_tokens, draft_probs, seeds, offsets, bonus, rates):
        out = specdec_ops.rejection_sample(target_probs, draft_token_ids, num_draft_tokens, draft_probs,
                                           seeds=seeds, offsets=offsets, bonus_token_ids=bonus,
                                           reject_invalid_drafts=True, synthetic_acceptance_rates=rates)
        return out.token_ids, out.num_accepted

    ids, n = step(**args, bonus=bonus, rates=rates)
    eager = call(dict(args, bonus_token_ids=bonus, reject_invalid_drafts=True, synthetic_acceptance_rates=rates),
                 "cpu")
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
@pytest.mark.parametrize("draft_probs", [True, False], ids=["draft_probs", "one_hot"])
@pytest.mark.parametrize("vocab", [24, 8193])
def test_cuda_keywords_equal_cpu(draft_probs, vocab):
    # Every keyword combination on the GPU against the C++ CPU kernel, padded and packed, with and
    # without bonus rows; the Triton kernel on the GPU too.
    args, greedy, bonus, rates = _mixed_keyword_batch(70 + vocab, draft_probs)
    if vocab != 24:
        args = make_batch(9, 4, vocab, draft_probs=draft_probs, seed=vocab, temperature=0.3)
        args["draft_token_ids"][::3, 1] = -1
    k = args["draft_token_ids"].shape[1]
    n = args["num_draft_tokens"]
    rows = torch.cat([args["target_probs"][b, : int(n[b])] for b in range(len(n))])
    for kw in (dict(bonus_token_ids=bonus, reject_invalid_drafts=True),
               dict(reject_invalid_drafts=True, synthetic_acceptance_rates=rates),
               dict(bonus_token_ids=bonus, reject_invalid_drafts=True, synthetic_acceptance_rates=rates)):
        cpu = call(dict(args, **kw), "cpu", greedy)
        gpu_kw = {key: (v.cuda() if isinstance(v, torch.Tensor) else v) for key, v in kw.items()}
        gpu = call(dict(_to(args, "cuda"), **gpu_kw), "cuda", greedy.cuda())
        assert torch.equal(gpu.num_accepted.cpu(), cpu.num_accepted)
        assert (gpu.token_ids.cpu() == cpu.token_ids).all(-1).float().mean() >= 0.99  # rare logf ulps ties
        packed = call_packed(dict(_to(to_packed(args), "cuda"), **gpu_kw), "cuda", k=k, greedy=greedy.cuda())
        assert torch.equal(packed.token_ids, gpu.token_ids)
        if "bonus_token_ids" in kw:
            short = call(dict(_to(args, "cuda"), target_probs=args["target_probs"][:, :k].contiguous().cuda(),
                              **gpu_kw), "cuda", greedy.cuda())
            assert torch.equal(short.token_ids, gpu.token_ids)
            flat = call_packed(dict(_to(to_packed(args), "cuda"), target_probs=rows.cuda(), **gpu_kw), "cuda", k=k,
                               greedy=greedy.cuda())
            assert torch.equal(flat.token_ids, gpu.token_ids)
        if HAS_TRITON:
            tri = call(dict(_to(args, "cuda"), **gpu_kw), "triton", greedy.cuda())
            assert torch.equal(tri.num_accepted, gpu.num_accepted)
            assert (tri.token_ids == gpu.token_ids).all(-1).float().mean() >= 0.99


@pytest.mark.cuda
@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_cuda_bad_keyword_values_are_safe(backend):
    # GPU: bonus ids clamped into [0, V-1], NaN rates never accept, rates outside [0, 1] used as given.
    if backend == "triton" and not HAS_TRITON:
        pytest.skip("triton not installed")
    args = _to(make_batch(4, 2, 50, seed=5), "cuda")
    args["num_draft_tokens"] = torch.tensor([0, 0, 2, 2], device="cuda")
    bonus = torch.tensor([-3, 10**6, 7, 8], device="cuda")
    out = call(dict(args, bonus_token_ids=bonus, synthetic_acceptance_rates=torch.tensor([2.0, -1.0], device="cuda")),
               backend)
    assert out.token_ids[:2, 0].tolist() == [0, 49] and out.num_accepted.tolist() == [0, 0, 1, 1]
    nan = call(dict(args, synthetic_acceptance_rates=torch.full((2,), float("nan"), device="cuda")), backend)
    assert nan.num_accepted.tolist() == [0, 0, 0, 0]


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
