"""specdec_ops as vLLM's rejection sampler (specdec_ops.integrations.vllm), against vLLM's own.

Runs where vLLM 0.33 is installed (scripts/test_vllm.sh makes such a venv and runs this file there);
elsewhere only the clear-ImportError test runs. On shared random inputs:
- greedy requests give identical tokens;
- sampled requests agree in distribution: two-sample chi-square (alpha 1e-4) of vLLM's and our
  acceptance lengths and first emitted tokens, and ours against the exact law, computed here from p
  and q without either sampler;
- seeded requests are reproducible from their torch.Generator and do not depend on the batch.
"""

import importlib
import importlib.util
import math
import sys
import types

import pytest
import torch

ALPHA = 1e-4
HAS_VLLM = importlib.util.find_spec("vllm") is not None


def test_import_error_is_clear_without_vllm(monkeypatch):
    """Without vLLM (or with another version) importing the adapter says what is needed."""
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` raise ImportError
    monkeypatch.delitem(sys.modules, "specdec_ops.integrations.vllm", raising=False)
    with pytest.raises(ImportError, match=r"needs vLLM 0\.33\.x.*pip install vllm==0\.33\.0"):
        importlib.import_module("specdec_ops.integrations.vllm")


def test_import_error_names_the_supported_version(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(__version__="0.34.1"))
    monkeypatch.delitem(sys.modules, "specdec_ops.integrations.vllm", raising=False)
    with pytest.raises(ImportError, match=r"supports vLLM 0\.33\.x .*found vLLM 0\.34\.1"):
        importlib.import_module("specdec_ops.integrations.vllm")


# The rest compares against vLLM itself.
needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed (scripts/test_vllm.sh runs these)")
if HAS_VLLM:
    from specdec_ops.integrations import vllm as adapter
    from vllm.v1.sample import rejection_sampler as vllm_rs
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata

def metadata(temperature, generators=None):
    """A SamplingMetadata with only what rejection_sample reads (temperature None = all greedy)."""
    all_greedy = temperature is None
    empty = torch.tensor([])
    return SamplingMetadata(
        temperature=temperature, all_greedy=all_greedy,
        all_random=not all_greedy and bool((temperature != 0).all()), top_p=None, top_k=None,
        generators=generators or {}, max_num_logprobs=None, no_penalties=True, prompt_token_ids=None,
        frequency_penalties=empty, presence_penalties=empty, repetition_penalties=empty, output_token_ids=[],
        spec_token_ids=[], allowed_token_ids_mask=None, bad_words_token_ids={}, logitsprocs=LogitsProcessors())


def packed(num_draft):
    """vLLM's inclusive cu_num_draft_tokens [B] for the per-request draft counts."""
    return torch.tensor(num_draft, dtype=torch.int32).cumsum(0).to(torch.int32)


def call(fn, drafts, num_draft, max_spec_len, draft_probs, logits, bonus, meta, **kw):
    return fn(drafts, num_draft, max_spec_len, packed(num_draft), draft_probs, logits, bonus, meta, **kw)


@needs_vllm
def test_install_uninstall_swaps_vllms_function():
    adapter.uninstall()
    assert vllm_rs.rejection_sample is adapter._VLLM_REJECTION_SAMPLE and not adapter.installed()
    adapter.install()
    adapter.install()  # idempotent
    assert vllm_rs.rejection_sample is adapter.rejection_sample and adapter.installed()
    adapter.uninstall()
    assert vllm_rs.rejection_sample is adapter._VLLM_REJECTION_SAMPLE
    adapter.register()  # the entry point installs
    assert adapter.installed()
    adapter.uninstall()


@needs_vllm
def test_entry_point_is_declared():
    """pyproject.toml declares the vllm.general_plugins entry point VLLM_PLUGINS=specdec_ops selects."""
    from importlib.metadata import entry_points
    eps = [ep for ep in entry_points(group="vllm.general_plugins") if ep.name == "specdec_ops"]
    assert len(eps) == 1 and eps[0].value == "specdec_ops.integrations.vllm:register"


@needs_vllm
@pytest.mark.parametrize("all_greedy", [True, False])
@pytest.mark.parametrize("with_draft_probs", [False, True])
def test_greedy_rows_identical(all_greedy, with_draft_probs):
    torch.manual_seed(0)
    batch, k, vocab = 12, 4, 50
    num_draft = [k, 0, 1, 3, k, 2, k, 1, 0, k, 3, k]
    total = sum(num_draft)
    logits = torch.randn(total, vocab) * 3
    argmax = logits.argmax(-1)
    # drafts: half the positions the target's argmax (accepted under greedy), half random
    drafts = torch.where(torch.rand(total) < 0.6, argmax, torch.randint(0, vocab, (total,))).to(torch.int32)
    draft_probs = torch.softmax(torch.randn(total, vocab), -1) if with_draft_probs else None
    bonus = torch.randint(0, vocab, (batch, 1))
    if all_greedy:
        meta = metadata(None)
        greedy = torch.ones(batch, dtype=torch.bool)
    else:
        greedy = torch.arange(batch) % 2 == 0
        meta = metadata(torch.where(greedy, 0.0, 1.0))
    ours = call(adapter.rejection_sample, drafts, num_draft, k, draft_probs, logits, bonus, meta)
    theirs = call(adapter._VLLM_REJECTION_SAMPLE, drafts, num_draft, k, draft_probs, logits.clone(), bonus, meta)
    assert ours.dtype == torch.int32 and ours.shape == (batch, k + 1)
    assert torch.equal(ours[greedy], theirs[greedy])


def exact_laws(p, q, k):
    """For one request drafting k tokens from q with target p at every position (no bonus row
    difference): P(accepted = j) for j = 0..k, and the law of the first emitted token (p itself).
    Computed from p and q only."""
    beta = float(torch.minimum(p, q).sum())  # chance a draft from q is accepted at one position
    lengths = [(beta ** j) * (1 - beta) for j in range(k)] + [beta ** k]
    return torch.tensor(lengths, dtype=torch.float64), p.double()


def chi2_pvalue(observed, expected_probs):
    from scipy.stats import chisquare
    keep = expected_probs > 0
    assert observed[~keep].sum() == 0, "an outcome of probability 0 was observed"
    exp = expected_probs[keep] / expected_probs[keep].sum() * float(observed.sum())
    return chisquare(observed[keep].double().numpy(), exp.numpy()).pvalue


def two_sample_pvalue(a, b):
    from scipy.stats import chi2_contingency
    table = torch.stack([a, b]).double()
    table = table[:, table.sum(0) > 0]
    return chi2_contingency(table.numpy()).pvalue


@needs_vllm
def test_sampled_requests_agree_in_distribution():
    """N identical requests (V=8, K=3, drafts sampled from q): acceptance lengths and first tokens of
    vLLM's sampler and ours, two-sample chi-square, and ours against the exact law (alpha 1e-4)."""
    torch.manual_seed(1)
    n, k, vocab = 3000, 3, 8
    p = torch.softmax(torch.randn(vocab) * 1.5, -1)
    q = torch.softmax(torch.randn(vocab) * 1.5, -1)
    logits = p.log().expand(n * k, vocab).contiguous()
    draft_probs = q.expand(n * k, vocab).contiguous()
    drafts = torch.multinomial(q, n * k, replacement=True).to(torch.int32)
    bonus = torch.zeros(n, 1, dtype=torch.int64)
    meta = metadata(torch.ones(n))
    ours = call(adapter.rejection_sample, drafts, [k] * n, k, draft_probs, logits, bonus, meta)
    theirs = call(adapter._VLLM_REJECTION_SAMPLE, drafts, [k] * n, k, draft_probs, logits.clone(), bonus, meta)

    def stats(out):
        accepted = (out != -1).sum(1) - 1
        first = out[:, 0].long()
        return torch.bincount(accepted, minlength=k + 1), torch.bincount(first, minlength=vocab)

    (acc_o, first_o), (acc_t, first_t) = stats(ours), stats(theirs)
    law_len, law_first = exact_laws(p, q, k)
    assert two_sample_pvalue(acc_o, acc_t) > ALPHA
    assert two_sample_pvalue(first_o, first_t) > ALPHA
    assert chi2_pvalue(acc_o, law_len) > ALPHA
    assert chi2_pvalue(first_o, law_first) > ALPHA


@needs_vllm
def test_seeded_requests_reproducible_and_batch_independent():
    torch.manual_seed(2)
    batch, k, vocab = 6, 3, 40
    logits = torch.randn(batch * k, vocab)
    drafts = torch.randint(0, vocab, (batch * k,), dtype=torch.int32)
    bonus = torch.randint(0, vocab, (batch, 1))

    def run(seeded):
        gens = {i: torch.Generator().manual_seed(100 + i) for i in seeded}
        return call(adapter.rejection_sample, drafts, [k] * batch, k, None, logits, bonus,
                    metadata(torch.ones(batch), gens))

    a, b = run([0, 2, 5]), run([0, 2, 5])
    assert torch.equal(a[[0, 2, 5]], b[[0, 2, 5]])
    # request 2 alone gives what it gave inside the batch (vLLM's sampler draws one tensor for all)
    alone = call(adapter.rejection_sample, drafts[2 * k:3 * k], [k], k, None, logits[2 * k:3 * k], bonus[2:3],
                 metadata(torch.ones(1), {0: torch.Generator().manual_seed(102)}))
    assert torch.equal(alone[0], a[2])


@needs_vllm
def test_placeholder_and_synthetic_through_the_adapter():
    vocab, k = 30, 3
    logits = torch.full((2 * k, vocab), -5.0)
    logits[:, 7] = 5.0
    drafts = torch.tensor([7, -1, 7, 7, 7, 7], dtype=torch.int32)
    bonus = torch.tensor([[11], [12]])
    for meta in (metadata(None), metadata(torch.ones(2))):
        out = call(adapter.rejection_sample, drafts, [k, k], k, None, logits, bonus, meta)
        assert out[0, 0] == 7 and out[0, 1] != -1 and (out[0, 2:] == -1).all()  # the -1 is rejected
        rates = torch.tensor([1.0, 1.0, 0.0, 0.5])
        syn = call(adapter.rejection_sample, drafts, [k, k], k, None, logits, bonus, meta,
                   synthetic_mode=True, synthetic_conditional_rates=rates)
        assert (syn[1, :2] == 7).all() and syn[1, 2] != -1 and syn[1, 3] == -1  # rate 0 at position 2
        full = call(adapter.rejection_sample, drafts, [k, k], k, None, logits, bonus, meta,
                    synthetic_mode=True, synthetic_conditional_rates=torch.ones(k))
        assert full[1].tolist() == [7, 7, 7, 12]  # all accepted: vLLM's bonus token


@needs_vllm
def test_fly_is_delegated_to_vllm(monkeypatch):
    seen = {}

    def fake(*args, **kw):
        seen.update(kw)
        return torch.zeros(1, 2, dtype=torch.int32)

    monkeypatch.setattr(adapter, "_VLLM_REJECTION_SAMPLE", fake)
    out = call(adapter.rejection_sample, torch.tensor([1], dtype=torch.int32), [1], 1, None, torch.zeros(1, 4),
               torch.zeros(1, 1, dtype=torch.int64), metadata(None), fly_window_size=2, fly_entropy_threshold=0.3)
    assert out.shape == (1, 2) and seen["fly_window_size"] == 2 and seen["fly_entropy_threshold"] == 0.3
    assert math.isfinite(seen["fly_entropy_threshold"])


@needs_vllm
def test_harness_expansion_equals_vllms_kernel():
    """scripts/vllm/conftest.py runs vLLM's expand_batch_to_tokens in PyTorch (its Triton kernel is slow under
    the interpreter): the same values as vLLM's kernel wherever that writes, for every dtype it expands."""
    from vllm.v1.sample import rejection_sampler as rs

    g = torch.Generator().manual_seed(11)
    for dtype in (torch.float32, torch.int32, torch.int64):
        for batch in (1, 5, 40):
            counts = torch.randint(0, rs.MAX_SPEC_LEN + 1, (batch,), generator=g)
            cu = counts.cumsum(0).to(torch.int32)
            x = torch.randint(0, 4, (batch,), generator=g).to(dtype)
            n = int(cu[-1])
            for replace in ((0, 0), (0, 1), (2, 7)):
                got = rs.expand_batch_to_tokens(x, cu, n, replace_from=replace[0], replace_to=replace[1])
                want = torch.full((n,), -1, dtype=dtype)
                rs._expand(want, x, cu, replace[0], replace[1])
                assert got.dtype == dtype and torch.equal(got, want), (dtype, batch, replace, got, want)
