"""The decode loop (specdec_ops.decoding, DESIGN.md §5.6) on tiny random-weight HF Llama models.

Proves: greedy output equals the target's own generate(do_sample=False) token for token (chain and
tree, n-gram and model drafters, default_setup, a ragged batch of 3 prompts, EOS stops); the target's
KV cache after several steps equals a plain forward over the committed tokens; one target forward per
step and no re-forward of accepted tokens; finished requests leave the batch; every forward of the loop
and the model drafter takes its slot range from host lengths (no device read), equal to the device's; the
layering (drafters never import the loop; importing the package registers nothing with transformers); the
tree attention backend as a decoder keyword; clear errors for bad input; the engine example in README.md
runs.
Matching, length policies, re-rankers: tests/test_drafters.py. Sampling: tests/test_decoding_sampling.py.
"""

import os
import re

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM  # noqa: E402

import specdec_ops  # noqa: E402
from specdec_ops.decoding import (ByMatchLength, CopyCursor, CostModel, ForwardCost, GenerateOutput,  # noqa: E402
                                  ModelDrafter, NGramDrafter, SpeculativeDecoder, default_setup,
                                  measure_forward_cost)
from specdec_ops.decoding.forward import cache_kwarg  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models: one torch thread (conftest.py)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB = 100
PROMPTS = [[5, 17, 23, 42, 5, 17, 23, 8, 61, 5, 17], [3], [70, 71, 72, 73, 70, 71]]  # ragged, one of length 1


def tiny_llama(layers: int, seed: int, vocab: int = VOCAB, hidden: int = 32) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      bos_token_id=None, eos_token_id=None, pad_token_id=None, attn_implementation="sdpa")
    return LlamaForCausalLM(cfg).eval()




@pytest.fixture(scope="module")
def target():
    return tiny_llama(2, seed=0)


@pytest.fixture(scope="module")
def small_drafter():
    return tiny_llama(1, seed=1)


def reference_greedy(model, prompt, max_new_tokens, eos=None):
    ids = torch.tensor([prompt])
    out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos,
                         pad_token_id=0, attention_mask=torch.ones_like(ids))
    return out[0, len(prompt):].tolist()


def make_drafter(kind, target, small_drafter):
    if kind == "ngram":
        return NGramDrafter(n=3)
    if kind == "ngram-bymatch":
        return NGramDrafter(n=3, length=ByMatchLength((0, 2, 5)), rerank=[CopyCursor(4)])
    if kind == "ngram-cost":
        return NGramDrafter(n=3, length=CostModel((4.0, 1.0)), rerank=[CopyCursor(4)])
    if kind == "default_setup":
        return default_setup(target)["drafter"]
    if kind == "model":
        return ModelDrafter(small_drafter)
    return ModelDrafter(target)  # "self": the target drafts for itself, so long paths get accepted


# ---------------------------------------------------------------------------------------------- greedy


@pytest.mark.parametrize("tree", [None, 6], ids=["chain", "tree"])
def test_cpu_forwards_of_several_tokens_attend_grouped_kv_heads_without_copies(target, monkeypatch, tree):
    """The target has 4 query heads on 2 KV heads: the loop's prefill and verify forwards over several tokens
    (and the self-drafting ModelDrafter's) never run transformers' repeat_kv, and leave the model on "sdpa"."""
    from transformers.integrations import sdpa_attention

    def refuse(hidden, n_rep):
        raise AssertionError("repeat_kv ran in a loop forward")

    expected = [reference_greedy(target, p, 12) for p in PROMPTS]
    monkeypatch.setattr(sdpa_attention, "repeat_kv", refuse)
    decoder = SpeculativeDecoder(target, ModelDrafter(target), num_speculative_tokens=3, tree=tree)
    out = decoder.generate(PROMPTS, max_new_tokens=12, eos_token_id=[])
    assert out.sequences == expected
    assert out.stats.accepted_tokens > 0
    assert target.config._attn_implementation == "sdpa"


@pytest.mark.parametrize("tree", [None, 6], ids=["chain", "tree"])
@pytest.mark.parametrize("kind", ["ngram", "ngram-bymatch", "ngram-cost", "default_setup", "model", "self"])
def test_greedy_equals_target_generate_on_ragged_batch(target, small_drafter, kind, tree):
    max_new = 20
    expected = [reference_greedy(target, p, max_new) for p in PROMPTS]
    decoder = SpeculativeDecoder(target, make_drafter(kind, target, small_drafter), num_speculative_tokens=3,
                                 tree=tree)
    out = decoder.generate(PROMPTS, max_new_tokens=max_new, eos_token_id=[])
    assert isinstance(out, GenerateOutput)
    assert out.sequences == expected
    stats = out.stats
    assert stats.generated_tokens == 3 * max_new
    assert stats.target_forwards <= max_new
    assert stats.step_tokens == stats.generated_tokens - 3                  # the prefill emits the first tokens
    assert stats.mean_accepted_length == pytest.approx(stats.step_tokens / stats.request_steps)
    assert stats.tokens_per_second > 0
    if kind == "self":  # the target drafting for itself: many drafts accepted, far fewer forwards
        assert stats.accepted_tokens >= max_new
        assert stats.target_forwards < max_new * 0.6
        if tree is None:  # greedy chain: every draft matches (the drafter's cache rollback keeps it exact)
            assert stats.accepted_tokens == stats.draft_tokens


def test_cost_model_never_pads_past_the_loops_window(target):
    """A forward cost where wide windows are cheapest (as a loaded machine's timings can make them) pads
    drafts to the cheapest width, but never past 1 + num_speculative_tokens: the KV cache holds no more
    (a padded window of 11 once overflowed a cache sized for 4 near the end of max_new_tokens)."""
    cost = ForwardCost({1: 10.0, 2: 10.0, 4: 10.0, 8: 10.0, 16: 1.0, 32: 1.0})
    drafter = NGramDrafter(n=3, length=CostModel(cost), rerank=[CopyCursor(4)])
    decoder = SpeculativeDecoder(target, drafter, num_speculative_tokens=3)
    widths = []
    propose = drafter.propose

    def recorded(batch, k, tree, sampling):
        draft = propose(batch, k, tree, sampling)
        widths.append(draft.tokens.shape[1])
        return draft

    drafter.propose = recorded
    out = decoder.generate(PROMPTS, max_new_tokens=20, eos_token_id=[])
    assert out.sequences == [reference_greedy(target, p, 20) for p in PROMPTS]
    assert widths and max(widths) <= 4


def test_a_drafters_own_draft_length_fits_the_cache(target):
    """NGramDrafter(k=8) drafts up to 8 tokens whatever num_speculative_tokens says: the loop sizes its
    cache for the longer of the two."""
    prompts = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [9, 9, 9, 9, 9, 9, 9, 9]]
    decoder = SpeculativeDecoder(target, NGramDrafter(n=2, k=8), num_speculative_tokens=1)
    out = decoder.generate(prompts, max_new_tokens=24, eos_token_id=[])
    assert out.sequences == [reference_greedy(target, p, 24) for p in prompts]
    # a request near its end (high start) beside one drafting 8 tokens (a window of 9) must still fit
    assert decoder.cache.capacity >= max(map(len, prompts)) + 24 + 9


@pytest.mark.parametrize("tree", [None, 5], ids=["chain", "tree"])
@pytest.mark.parametrize("kind", ["ngram", "self"])
def test_greedy_eos_stops_each_request(target, small_drafter, kind, tree):
    max_new = 16
    free = [reference_greedy(target, p, max_new) for p in PROMPTS]
    eos = free[0][4]  # a token request 0 emits early; others may or may not emit it
    expected = [reference_greedy(target, p, max_new, eos=eos) for p in PROMPTS]
    assert expected[0][-1] == eos and len(expected[0]) <= 5
    decoder = SpeculativeDecoder(target, make_drafter(kind, target, small_drafter), num_speculative_tokens=4,
                                 tree=tree)
    out = decoder.generate(PROMPTS, max_new_tokens=max_new, eos_token_id=eos)
    assert out.sequences == expected
    # accepted tokens are the emitted drafts: a step emits its accepted drafts and one token more, unless the
    # EOS cuts it inside the drafts (once per request at most); drafts accepted after the EOS do not count
    s = out.stats
    assert s.generated_tokens == sum(map(len, expected))
    assert 0 <= s.accepted_tokens + s.request_steps + len(PROMPTS) - s.generated_tokens <= len(PROMPTS)


@pytest.mark.parametrize("tree", [None, 4], ids=["chain", "tree"])
def test_drafts_accepted_after_an_eos_are_not_counted(target, tree):
    """The target drafting for itself: the first step's 4 drafts are all accepted, the second of them an EOS;
    the request emits 3 tokens (the prefill's and 2 drafts), so 2 accepted tokens, not 4."""
    prompt = PROMPTS[0]
    eos = reference_greedy(target, prompt, 8)[2]
    out = SpeculativeDecoder(target, ModelDrafter(target), num_speculative_tokens=4, tree=tree).generate(
        [prompt], max_new_tokens=8, eos_token_id=eos)
    assert out.sequences == [reference_greedy(target, prompt, 8, eos=eos)] and len(out.sequences[0]) == 3
    s = out.stats
    assert (s.target_forwards, s.accepted_tokens, s.generated_tokens) == (1, 2, 3)
    assert s.mean_accepted_length == 2.0


@pytest.mark.parametrize("k,tree", [(4, 1), (4, 2), (6, 3), (3, 12)])
def test_model_drafter_trees_near_the_end_fit_and_stay_within_each_request(target, small_drafter, k, tree):
    """ModelDrafter's tree expands `branch` nodes per level and forwards them in its own cache: up to
    1 + branch (k - 1) slots past the root, more than the loop's window of 1 + tree (a window of 13 in a
    cache sized for 3 once overflowed near max_new_tokens). Each request's paths stay within the tokens it
    may still emit (remaining - 1), so no accepted draft is ever cut by max_new_tokens."""
    prompts = [[5, 17, 23], [3, 9], [70, 71, 72, 73]]
    max_new = [32, 7, 19]
    for drafter in (ModelDrafter(small_drafter), ModelDrafter(target)):
        decoder = SpeculativeDecoder(target, drafter, num_speculative_tokens=k, tree=tree)
        proposals = []
        propose = drafter.propose

        def recorded(batch, k, tree, sampling):
            draft = propose(batch, k, tree, sampling)
            _, depth = specdec_ops.build_tree(draft.parents, draft.num_nodes)
            nodes = torch.arange(draft.tokens.shape[1])[None] < draft.num_nodes[:, None]
            proposals.append((batch.remaining(), torch.where(nodes, depth, 0).amax(1).tolist()))
            return draft

        drafter.propose = recorded
        for m in max_new:
            out = decoder.generate(prompts, max_new_tokens=m, eos_token_id=[])
            assert out.sequences == [reference_greedy(target, p, m) for p in prompts]
            s = out.stats
            assert s.accepted_tokens + s.request_steps + len(prompts) == s.generated_tokens == m * len(prompts)
        assert all(d <= max(r - 1, 0) for remaining, depths in proposals for r, d in zip(remaining, depths))
        assert any(max(depths) < k for _, depths in proposals)      # the end of a request was reached


def test_greedy_accepts_tensor_prompts_and_long_drafts(target):
    prompts = torch.tensor([PROMPTS[0][:6], PROMPTS[2]])
    expected = [reference_greedy(target, p, 12) for p in prompts.tolist()]
    out = SpeculativeDecoder(target, ModelDrafter(target), num_speculative_tokens=7).generate(
        prompts, max_new_tokens=12, eos_token_id=[])
    assert out.sequences == expected


def test_greedy_with_specdec_tree_attention_kernel_path():
    """The GPU route: the target runs "specdec_tree" attention (tree_attention over the ragged cache with the
    bitmask) instead of SDPA over the additive bias; the backend is a decoder keyword (the CPU kernel here)."""
    specdec_ops.register_hf_attention()
    model = tiny_llama(2, seed=0)
    expected = [reference_greedy(model, p, 12) for p in PROMPTS]
    with pytest.raises(ValueError, match="tree_attention_backend"):
        SpeculativeDecoder(model, ModelDrafter(model), tree_attention_backend="cpu")   # not switched yet
    model.set_attn_implementation("specdec_tree")
    with pytest.raises(ValueError, match="tree_attention_backend"):
        SpeculativeDecoder(model, ModelDrafter(model), tree_attention_backend="fast")
    for tree in (None, 6):
        decoder = SpeculativeDecoder(model, ModelDrafter(model), num_speculative_tokens=3, tree=tree,
                                     tree_attention_backend="cpu")
        calls = []
        kernel = specdec_ops.tree_attention

        def counted(*args, **kwargs):     # the glue looks tree_attention up in specdec_ops at each call
            calls.append(kwargs.get("backend"))
            return kernel(*args, **kwargs)

        specdec_ops.tree_attention = counted
        try:
            out = decoder.generate(PROMPTS, max_new_tokens=12, eos_token_id=[])
        finally:
            specdec_ops.tree_attention = kernel
        assert out.sequences == expected
        assert out.stats.accepted_tokens > 0
        assert calls and set(calls) == {"cpu"}


def test_importing_the_package_registers_nothing_and_drafters_never_import_the_loop():
    import ast
    import subprocess
    import sys

    code = ("import transformers, specdec_ops, specdec_ops.decoding; "
            "from transformers import AttentionInterface; "
            "print('specdec_tree' in AttentionInterface._global_mapping)")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.stdout.strip() == "False", out.stderr
    floor = {"types", "batch", "forward", "sampling"}
    base = os.path.join(ROOT, "specdec_ops", "decoding")
    for folder, allowed in ((base, None), (os.path.join(base, "drafters"), floor)):
        for name in os.listdir(folder):
            if not name.endswith(".py"):
                continue
            tree = ast.parse(open(os.path.join(folder, name)).read())
            imported = {(node.module or "").split(".")[-1] for node in ast.walk(tree)
                        if isinstance(node, ast.ImportFrom) and node.level > 0}
            if name[:-3] in floor:           # the floor imports nothing of the loop or the drafters
                assert not imported & {"decoder", "drafters", "setup", "model", "ngram", "policies"}, name
            if allowed is not None:          # drafters: the floor and each other, never the loop
                assert "decoder" not in imported and "setup" not in imported, name


# ------------------------------------------------------------------------------------- cache and work


class _Spy:
    """Wraps a drafter: at each proposal, checks the target cache against a plain forward."""

    def __init__(self, inner, decoder_ref, target):
        self.inner, self.decoder_ref, self.target = inner, decoder_ref, target
        self.vocab_size = getattr(inner, "vocab_size", None)
        self.checked_steps = 0
        self.step = 0

    def reset(self, *a):
        self.inner.reset(*a)

    def commit(self, *a):
        self.inner.commit(*a)

    def keep(self, *a):
        self.inner.keep(*a)

    def propose(self, batch, *a):
        self.step += 1
        if self.step in (3, 5):
            cache = self.decoder_ref[0].cache
            for b in range(len(batch.ids)):
                committed = batch.tokens[b, :int(batch.lengths[b]) - 1]
                assert int(cache.seq_lens[b]) == committed.numel()
                plain = DynamicCache(config=self.target.config)
                self.target(committed[None], use_cache=True, **{cache_kwarg(self.target): plain})
                for layer in range(len(cache.keys)):
                    n = committed.numel()
                    torch.testing.assert_close(cache.keys[layer][b, :, :n], plain.layers[layer].keys[0],
                                               atol=1e-5, rtol=1e-5)
                    torch.testing.assert_close(cache.values[layer][b, :, :n], plain.layers[layer].values[0],
                                               atol=1e-5, rtol=1e-5)
            drafter = self.inner
            if isinstance(drafter, ModelDrafter):   # the drafter's own cache: its committed entries are exact too
                for b in range(len(batch.ids)):
                    n = int(drafter.cache.seq_lens[b])
                    plain = DynamicCache(config=drafter.model.config)
                    drafter.model(batch.tokens[b, :n][None], use_cache=True, **{cache_kwarg(drafter.model): plain})
                    for layer in range(len(drafter.cache.keys)):
                        torch.testing.assert_close(drafter.cache.keys[layer][b, :, :n], plain.layers[layer].keys[0],
                                                   atol=1e-5, rtol=1e-5)
                        torch.testing.assert_close(drafter.cache.values[layer][b, :, :n],
                                                   plain.layers[layer].values[0], atol=1e-5, rtol=1e-5)
            self.checked_steps += 1
        return self.inner.propose(batch, *a)


@pytest.mark.parametrize("tree", [None, 6], ids=["chain", "tree"])
def test_kv_cache_after_steps_equals_plain_forward_over_committed_tokens(target, tree):
    holder = []
    spy = _Spy(ModelDrafter(target), holder, target)
    decoder = SpeculativeDecoder(target, spy, num_speculative_tokens=3, tree=tree)
    holder.append(decoder)
    with torch.inference_mode():
        out = decoder.generate(PROMPTS, max_new_tokens=24, eos_token_id=[])
    assert spy.checked_steps == 2
    assert out.stats.accepted_tokens > 0


@pytest.mark.parametrize("tree", [None, 6], ids=["chain", "tree"])
def test_model_drafter_keeps_the_accepted_entries_it_forwarded(target, tree):
    """After verification the drafter keeps the K/V of accepted nodes it forwarded itself (chain: in place;
    tree: moved by kv_commit), so its next catch-up forward reads fewer tokens than were emitted."""
    pending = []

    class Recorder(ModelDrafter):
        def _catch_up(self, batch):
            pending.append(int((batch.lengths - self.cache.seq_lens.long()).sum()))
            return super()._catch_up(batch)

    expected = [reference_greedy(target, p, 20) for p in PROMPTS]
    out = SpeculativeDecoder(target, Recorder(target), num_speculative_tokens=4, tree=tree).generate(
        PROMPTS, max_new_tokens=20, eos_token_id=[])
    assert out.sequences == expected
    emitted = out.stats.step_tokens                 # tokens emitted by verify steps: what a drafter keeping
    reread = sum(pending[1:])                       # only the root would re-read, bonus tokens included
    assert out.stats.accepted_tokens > 0 and reread <= emitted - out.stats.accepted_tokens // 2


def test_one_target_forward_per_step_no_reforward_and_finished_requests_leave(target):
    shapes = []
    hook = target.model.register_forward_pre_hook(lambda mod, args, kw: shapes.append(tuple(kw["input_ids"].shape)),
                                                  with_kwargs=True)
    drafts = []

    class Recorder(NGramDrafter):
        def propose(self, *a):
            draft = super().propose(*a)
            drafts.append(tuple(draft.tokens.shape))
            return draft

    try:
        free = [reference_greedy(target, p, 16) for p in PROMPTS]
        eos = free[0][2]
        expected = [reference_greedy(target, p, 16, eos=eos) for p in PROMPTS]
        shapes.clear()
        out = SpeculativeDecoder(target, Recorder(), num_speculative_tokens=3).generate(
            PROMPTS, max_new_tokens=16, eos_token_id=eos)
    finally:
        hook.remove()
    assert out.sequences == expected
    assert shapes[0] == (3, len(PROMPTS[0]))                          # prefill: the prompts, first token
    assert len(shapes) == out.stats.target_forwards + 1                # then one verify forward per step
    assert shapes[1:] == drafts                                        # over exactly [root, drafts]: accepted
    assert out.stats.accepted_tokens > 0                               # tokens are never fed again
    batch_sizes = [b for b, _ in drafts]
    assert batch_sizes[0] == 3 and batch_sizes == sorted(batch_sizes, reverse=True)
    finished_early = sum(len(s) < 16 for s in expected)
    assert finished_early >= 1 and batch_sizes[-1] <= 3 - finished_early


@pytest.mark.parametrize("temperature", [0.0, 0.9], ids=["greedy", "sampled"])
@pytest.mark.parametrize("tree", [None, 5], ids=["chain", "tree"])
@pytest.mark.parametrize("kind", ["ngram", "model", "self"])
def test_every_forward_takes_its_slot_range_from_the_host(target, small_drafter, kind, tree, temperature,
                                                          monkeypatch):
    """The loop and the model drafter hand every forward the (min, max) of its window's start slots from host
    lengths, so that no forward reads the device; each range equals the device tensor's (prefill, verify,
    the drafter's catch-up, chain and tree windows), and the drafter's host lengths equal its cache's at every
    step, while requests of a ragged batch finish at different steps (EOS) and leave."""
    import specdec_ops.decoding.forward as fw

    ranges = []

    def checked(start, given):
        assert given is not None, "a forward of the loop read its slot range from the device"
        assert tuple(given) == tuple(torch.stack(torch.aminmax(start)).tolist())
        ranges.append(given)
        return given

    class Checked(ModelDrafter):
        def propose(self, batch, *args):
            assert self.lengths == self.cache.seq_lens.tolist()
            return super().propose(batch, *args)

    free = [reference_greedy(target, p, 16) for p in PROMPTS]
    eos = free[0][2]
    drafter = NGramDrafter(n=3) if kind == "ngram" else Checked(small_drafter if kind == "model" else target)
    monkeypatch.setattr(fw, "_start_range", checked)
    out = SpeculativeDecoder(target, drafter, num_speculative_tokens=3, tree=tree).generate(
        PROMPTS, max_new_tokens=16, eos_token_id=eos, temperature=temperature, seed=3)
    assert len(ranges) >= out.stats.target_forwards + 1
    assert any(lo != hi for lo, hi in ranges)              # ragged: the general path's ranges are checked too
    if temperature == 0:
        assert out.sequences == [reference_greedy(target, p, 16, eos=eos) for p in PROMPTS]
        assert sum(len(s) < 16 for s in out.sequences) >= 1   # a request left the batch early
    if kind == "ngram" and tree is None and temperature == 0:   # the start-up timing's forwards too
        ranges.clear()
        measure_forward_cost(target, prefix=8, widths=(1, 4), repeat=1)
        assert len(ranges) == 1 + 2 * 4   # widths 1 and 4 timed through the narrow product and through F.linear


@pytest.mark.parametrize("keep_limit", [None, 0], ids=["logits_to_keep", "all-rows"])
def test_forward_logits_at_equals_full_logits_rows(target, keep_limit, monkeypatch):
    """forward(logits_at=...) (the prefill's and the drafter catch-up's one row per request) equals the rows
    of the full logits, whether the model projects only those positions or every one."""
    from specdec_ops.decoding import forward as forward_mod

    if keep_limit is not None:
        monkeypatch.setattr(forward_mod, "_KEEP_LIMIT", keep_limit)
    prompts = [PROMPTS[0], PROMPTS[2]]
    width = max(len(p) for p in prompts)
    tokens = torch.tensor([p + [0] * (width - len(p)) for p in prompts])
    at = torch.tensor([len(p) - 1 for p in prompts])
    with torch.inference_mode():
        results = []
        for logits_at in (None, at):
            cache = forward_mod.RaggedKVCache(target, 2, 32, torch.device("cpu"), torch.float32)
            mask, depth = forward_mod.chain_tree(width, 2, tokens.device)
            results.append(forward_mod.forward(target, cache, tokens, cache.seq_lens, depth, mask,
                                               logits_at=logits_at))
    full, rows = results
    assert rows.shape == (2, VOCAB) and rows.dtype == torch.float32
    torch.testing.assert_close(rows, full[torch.arange(2), at], atol=1e-5, rtol=1e-5)


@pytest.fixture
def one_thread():
    """torch on one intra-op thread for the test (skinny_linear is used only there), then as it was."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 6, 16, 32, 33])
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("kernel", ["skinny", "mm"])
def test_narrow_linear_is_linear(rows, bias, kernel, monkeypatch, one_thread):
    """narrow_linear over 1..narrow_rows() rows equals F.linear to rounding, has F.linear's shape and is
    contiguous; other row counts and dtypes are not its to compute (None). Inside narrow_linears an
    nn.Linear layer gives the same, and bit for bit F.linear where narrow_linear declines. Both products:
    the skinny_linear kernel (up to SKINNY_ROWS rows, where it is vectorized and torch runs one thread)
    and W @ x^T (up to NARROW_ROWS rows, one row padded to two; elsewhere)."""
    import torch.nn.functional as F

    from specdec_ops.decoding import forward as forward_mod
    from specdec_ops.decoding.forward import narrow_linear, narrow_linears, narrow_rows

    assert (forward_mod.SKINNY_ROWS, forward_mod.NARROW_ROWS) == (32, 5)
    if kernel == "skinny" and not forward_mod._skinny_kernel():
        pytest.skip("skinny_linear is not vectorized on this CPU")
    if kernel == "mm":
        monkeypatch.setattr(forward_mod, "_skinny_kernel", lambda: False)
    limit = narrow_rows()
    assert limit == (32 if kernel == "skinny" else 5)
    used = []
    skinny = torch.ops.specdec.skinny_linear.default

    class Recording:
        def default(self, *args):
            used.append(args[0].shape)
            return skinny(*args)

    monkeypatch.setattr(torch.ops.specdec, "skinny_linear", Recording())
    gen = torch.Generator().manual_seed(rows)
    layer = torch.nn.Linear(40, 48, bias=bias)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(48, 40, generator=gen))
        if bias:
            layer.bias.copy_(torch.randn(48, generator=gen))
    w, b = layer.weight.detach(), None if layer.bias is None else layer.bias.detach()
    for shape in ((rows, 40), (1, rows, 40)):
        x = torch.randn(*shape, generator=gen)
        exact = x.double() @ w.double().T + (b.double() if bias else 0)
        out = narrow_linear(x, w, b)
        with torch.no_grad(), narrow_linears(layer):
            in_layer = layer(x)
        assert narrow_linear(x.bfloat16(), w.bfloat16()) is None
        if rows > limit:  # not taken: bit for bit F.linear
            assert out is None
            assert torch.equal(in_layer, F.linear(x, w, b))
            continue
        assert out.shape == (*shape[:-1], 48) and out.is_contiguous()
        torch.testing.assert_close(out.double(), exact, atol=1e-4, rtol=1e-5)
        assert torch.equal(in_layer, out)
    assert len(used) == (4 if kernel == "skinny" and rows <= limit else 0)
    assert narrow_linear(torch.randn(2, 39), w) is None  # F.linear's own shape error is kept
    if bias:
        assert narrow_linear(torch.randn(2, 40), w, b.double()) is None   # and its dtype error


def test_narrow_linears_is_scoped_to_its_thread_and_model():
    """narrow_linears gives exactly the plain nn.Linear layers of its model (not subclasses, not a layer with
    a forward of its own, not other models) the narrow product while open, on its thread only (another
    thread calling the model meanwhile gets F.linear bit for bit), and leaves every layer as it was when
    the last context closes: nested contexts, an exception inside, a forward installed by someone else."""
    import threading

    import torch.nn.functional as F

    from specdec_ops.decoding import forward as forward_mod

    class OwnLinear(torch.nn.Linear):
        pass

    gen = torch.Generator().manual_seed(0)
    hooked = torch.nn.Linear(40, 40)
    marker = []

    def own_forward(x):  # a hook library's instance forward: left in place, never replaced
        marker.append(True)
        return F.linear(x, hooked.weight, hooked.bias)

    hooked.forward = own_forward
    model = torch.nn.Sequential(torch.nn.Linear(40, 48), OwnLinear(48, 40), hooked, torch.nn.Linear(40, 40))
    other = torch.nn.Linear(40, 40)
    x = torch.randn(1, 40, generator=gen)

    def narrowed(layer):
        return getattr(layer.__dict__.get("forward"), "__func__", None) is forward_mod._narrow_forward

    with torch.no_grad():
        plain = model(x)
        opened, release, seen = threading.Event(), threading.Event(), {}

        def elsewhere():
            if opened.wait(30):
                seen["out"] = model(x)
                seen["narrowed"] = [narrowed(m) for m in model]
            release.set()

        thread = threading.Thread(target=elsewhere, daemon=True)
        thread.start()
        try:
            with forward_mod.narrow_linears(model):
                assert [narrowed(m) for m in model] == [True, False, False, True]
                assert model[2].forward is own_forward and not narrowed(other)
                narrow = model(x)
                first = model[0](x)  # one row: the narrow product, not F.linear's
                assert torch.equal(first, forward_mod.narrow_linear(x, model[0].weight, model[0].bias))
                assert torch.equal(model[1](first), F.linear(first, model[1].weight, model[1].bias))
                with forward_mod.narrow_linears(model):
                    pass
                assert narrowed(model[0])  # the outer context still holds it
                opened.set()
                assert release.wait(30)
        finally:
            opened.set()
            thread.join(30)
        assert seen["narrowed"] == [True, False, False, True]
        assert torch.equal(seen["out"], plain)  # the other thread: F.linear exactly
        torch.testing.assert_close(narrow, plain, atol=1e-5, rtol=1e-5)
        assert not any(narrowed(m) for m in model) and model[2].forward is own_forward and marker
        assert all("forward" not in m.__dict__ for m in (model[0], model[1], model[3]))
        with pytest.raises(ZeroDivisionError):
            with forward_mod.narrow_linears(model):
                1 / 0
        assert not any(narrowed(m) for m in model) and model[2].forward is own_forward
        assert forward_mod._NARROW.depth == 0 and not forward_mod._NARROW_OPEN


def test_skinny_linear_only_on_one_thread(monkeypatch):
    """skinny_linear runs on one thread: with more torch threads narrow_linear multiplies W @ x^T (the BLAS's
    parallel product) and forwards narrow up to NARROW_ROWS rows only."""
    from specdec_ops.decoding import forward as forward_mod

    monkeypatch.setattr(forward_mod, "_skinny_kernel", lambda: True)
    calls = []
    monkeypatch.setattr(torch.ops.specdec, "skinny_linear",
                        type("Recording", (), {"default": staticmethod(lambda *a: calls.append(a) or
                                                                       torch.zeros(a[0].shape[0], a[1].shape[0]))})())
    threads = torch.get_num_threads()
    x, w = torch.randn(3, 8), torch.randn(4, 8)
    try:
        torch.set_num_threads(2)
        assert forward_mod.narrow_rows() == forward_mod.NARROW_ROWS
        torch.testing.assert_close(forward_mod.narrow_linear(x, w), x @ w.T, atol=1e-5, rtol=1e-5)
        assert forward_mod.narrow_linear(torch.randn(6, 8), w) is None and not calls
        torch.set_num_threads(1)
        assert forward_mod.narrow_rows() == forward_mod.SKINNY_ROWS
        forward_mod.narrow_linear(x, w)
        assert len(calls) == 1
    finally:
        torch.set_num_threads(threads)


def test_linear_choice_keeps_f_linear_at_its_rows(monkeypatch, one_thread):
    """Inside narrow_linears(model), a row count in linear_choice(model).blas_rows runs F.linear (bit for bit,
    the kernel not called), the others the kernel; nested contexts of two models each apply their own model's
    choice, and the outer one's is back when the inner closes."""
    import torch.nn.functional as F

    from specdec_ops.decoding import forward as forward_mod

    monkeypatch.setattr(forward_mod, "_skinny_kernel", lambda: True)
    calls = []
    monkeypatch.setattr(torch.ops.specdec, "skinny_linear",
                        type("Recording", (), {"default": staticmethod(lambda *a: calls.append(a[0].shape[0]) or
                                                                       torch.zeros(a[0].shape[0], a[1].shape[0]))})())
    gen = torch.Generator().manual_seed(0)
    first, second = torch.nn.Linear(8, 4), torch.nn.Linear(8, 4)
    forward_mod.linear_choice(first).blas_rows = frozenset({2})
    assert forward_mod.linear_choice(second).blas_rows == frozenset()
    x2, x3 = torch.randn(2, 8, generator=gen), torch.randn(3, 8, generator=gen)
    with torch.no_grad():
        with forward_mod.narrow_linears(first):
            assert torch.equal(first(x2), F.linear(x2, first.weight, first.bias)) and calls == []
            first(x3)
            assert calls == [3]
            with forward_mod.narrow_linears(second):
                second(x2)
                assert calls == [3, 2]
            assert torch.equal(first(x2), F.linear(x2, first.weight, first.bias)) and calls == [3, 2]
    assert forward_mod._NARROW.blas_rows == frozenset() and forward_mod._NARROW.depth == 0


def test_measure_forward_cost_keeps_the_faster_product_path(target, monkeypatch, one_thread):
    """measure_forward_cost times each width of CALIBRATED_ROWS through the kernel and through F.linear and
    keeps the faster in linear_choice(model).blas_rows; the table holds the kept path's time; without
    calibrate nothing is timed twice and the choice stays; with two threads (W @ x^T) the rows above the
    timed ones up to NARROW_ROWS follow the largest timed one. A clock that
    advances by a cost per (width, path) stands in for the forward's time."""
    from specdec_ops.decoding import forward as forward_mod
    from specdec_ops.decoding import setup as setup_mod

    monkeypatch.setattr(forward_mod, "_skinny_kernel", lambda: True)
    costs = {(1, "narrow"): 2.0, (1, "blas"): 3.0, (2, "narrow"): 5.0, (2, "blas"): 4.0,
             (3, "narrow"): 6.0, (3, "blas"): 6.5, (4, "narrow"): 7.0, (4, "blas"): 7.5, (8, "narrow"): 9.0}
    clock, runs = [0.0], []
    real_forward = setup_mod.forward

    def timed_forward(model, cache, ids, *args, **kwargs):
        width = ids.shape[1]
        if width <= 8:  # (the prefill, 12 tokens, is not timed)
            path = "blas" if width in forward_mod.linear_choice(model).blas_rows else "narrow"
            clock[0] += costs[width, path]
            runs.append((width, path))
        return real_forward(model, cache, ids, *args, **kwargs)

    monkeypatch.setattr(setup_mod, "forward", timed_forward)
    monkeypatch.setattr(setup_mod.time, "perf_counter", lambda: clock[0])
    choice = forward_mod.linear_choice(target)
    saved = choice.blas_rows
    try:
        choice.blas_rows = frozenset({1})
        table = setup_mod.measure_forward_cost(target, prefix=12, widths=(1, 2, 3, 4, 8), repeat=2)
        assert choice.blas_rows == frozenset({2})
        assert table == {1: 2.0, 2: 4.0, 3: 6.0, 4: 7.0, 8: 9.0}
        assert runs.count((2, "blas")) == runs.count((2, "narrow")) == 3 and (8, "blas") not in runs
        runs.clear()
        assert setup_mod.measure_forward_cost(target, prefix=12, widths=(1, 2), repeat=1,
                                              calibrate=False) == {1: 2.0, 2: 4.0}
        assert sorted(set(runs)) == [(1, "narrow"), (2, "blas")] and choice.blas_rows == frozenset({2})
        runs.clear()   # two threads: W @ x^T up to NARROW_ROWS rows, timed against F.linear as well, and the rows
        torch.set_num_threads(2)   # above the timed ones follow the largest timed one
        assert forward_mod.narrow_rows() == forward_mod.NARROW_ROWS == 5
        choice.blas_rows = frozenset()
        setup_mod.measure_forward_cost(target, prefix=12, widths=(1, 2), repeat=1)
        assert choice.blas_rows == frozenset({2, 3, 4, 5}) and len(runs) == 8
        costs[2, "blas"] = 6.0
        setup_mod.measure_forward_cost(target, prefix=12, widths=(1, 2), repeat=1)
        assert choice.blas_rows == frozenset()
        choice.blas_rows = {3}   # each regime keeps its own choice: one thread's is where it was left
        torch.set_num_threads(1)
        assert choice.blas_rows == frozenset({2})
    finally:
        choice.blas_rows = saved


@pytest.mark.parametrize("llama_forward", [True, False], ids=["llama_forward", "model"])
def test_forward_over_rows_kept_on_f_linear_opens_no_narrow_context(target, monkeypatch, one_thread, llama_forward):
    """A window whose rows are in linear_choice(model).blas_rows runs its products through F.linear (the model as it
    is: no narrow_linears, no Python call per layer; the loop's Llama forward: no narrow_linear call); a window of
    other rows still narrows."""
    from specdec_ops.decoding import forward as forward_mod

    entered, narrowed = [], []
    narrow_linears, narrow_linear = forward_mod.narrow_linears, forward_mod.narrow_linear
    monkeypatch.setattr(forward_mod, "narrow_linears", lambda model: entered.append(model) or narrow_linears(model))
    monkeypatch.setattr(forward_mod, "narrow_linear", lambda x, *a: narrowed.append(x.shape) or narrow_linear(x, *a))
    monkeypatch.setattr(forward_mod, "_skinny_kernel", lambda: True)
    if not llama_forward:
        monkeypatch.setattr(forward_mod, "runs_llama_forward", lambda model, mask: False)
    choice = forward_mod.linear_choice(target)
    saved = choice.blas_rows
    try:
        choice.blas_rows = frozenset({2})
        with torch.inference_mode():
            for width in (2, 3):
                cache = forward_mod.RaggedKVCache(target, 1, 16, torch.device("cpu"), torch.float32)
                mask, depth = forward_mod.chain_tree(width, 1, torch.device("cpu"))
                forward_mod.forward(target, cache, torch.tensor([PROMPTS[0][:width]]), cache.seq_lens, depth, mask)
                if llama_forward:
                    assert entered == [] and len(narrowed) == (0 if width == 2 else 2 * 7 + 1)
                else:
                    assert entered == ([] if width == 2 else [target])
    finally:
        choice.blas_rows = saved


def test_greedy_with_f_linear_at_few_rows_equals_generate(target, one_thread):
    """The loop's greedy output with F.linear at 1-3 rows and the kernel above (a choice measure_forward_cost
    can make) is still the target's own generate()'s, token for token."""
    from specdec_ops.decoding import forward as forward_mod

    choice = forward_mod.linear_choice(target)
    saved = choice.blas_rows
    try:
        choice.blas_rows = frozenset(forward_mod.CALIBRATED_ROWS)
        expected = [reference_greedy(target, p, 16) for p in PROMPTS]
        decoder = SpeculativeDecoder(target, NGramDrafter(n=3), num_speculative_tokens=4)
        assert decoder.generate(PROMPTS, max_new_tokens=16, eos_token_id=[]).sequences == expected
    finally:
        choice.blas_rows = saved


@pytest.mark.parametrize("llama_forward", [True, False], ids=["llama_forward", "model"])
@pytest.mark.parametrize("batch,width", [(1, 1), (1, 2), (1, 4), (1, 5), (2, 2), (2, 3), (3, 1), (1, 32),
                                         (2, 16), (1, 33), (3, 6), (3, 11)])
def test_forward_runs_narrow_windows_through_narrow_linear(target, batch, width, monkeypatch, one_thread,
                                                           llama_forward):
    """forward() on CPU runs its products through narrow_linear (the model: inside narrow_linears; the loop's Llama
    forward: directly) exactly when batch x window is 1..narrow_rows() rows (32 with the skinny_linear kernel, else
    5) that the model's LinearChoice does not keep on F.linear, and its logits equal those of the plain F.linear
    forward to rounding."""
    from specdec_ops.decoding import forward as forward_mod

    entered, narrowed = [], []
    narrow_linears, narrow_linear = forward_mod.narrow_linears, forward_mod.narrow_linear

    def recording(model):
        entered.append(model)
        return narrow_linears(model)

    monkeypatch.setattr(forward_mod, "narrow_linears", recording)
    monkeypatch.setattr(forward_mod, "narrow_linear", lambda x, *a: narrowed.append(x.shape) or narrow_linear(x, *a))
    if not llama_forward:
        monkeypatch.setattr(forward_mod, "runs_llama_forward", lambda model, mask: False)
    tokens = torch.tensor([(PROMPTS[0] * 4)[i:i + width] for i in range(batch)])
    rows = forward_mod.narrow_rows()
    kept = forward_mod.linear_choice(target).blas_rows   # (rows measure_forward_cost left on F.linear: no context)
    results = []
    with torch.inference_mode():
        for limit in (rows, 0):
            monkeypatch.setattr(forward_mod, "narrow_rows", lambda: limit)
            cache = forward_mod.RaggedKVCache(target, batch, 40, torch.device("cpu"), torch.float32)
            cache.seq_lens.fill_(3)
            mask, depth = forward_mod.chain_tree(width, batch, tokens.device)
            results.append(forward_mod.forward(target, cache, tokens, cache.seq_lens, depth, mask))
    narrows = 1 <= batch * width <= rows and batch * width not in kept
    if llama_forward:
        assert entered == [] and bool(narrowed) == narrows
    else:
        assert entered == ([target] if narrows else [])
    torch.testing.assert_close(results[0], results[1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("batch,width", [(1, 1), (2, 1), (2, 3), (1, 5)])
def test_forward_with_one_prefix_for_all_equals_the_general_path(target, batch, width, monkeypatch):
    """A window at the same slot for every request writes its K/V by slices (KVWindow.uniform_start) and a
    one-node window gets an all-zero bias (attention_bias): logits and cache equal the index_put path's and
    tree_attention_bias's."""
    from specdec_ops.decoding import forward as forward_mod

    start = 4
    mask, depth = forward_mod.chain_tree(width, batch, torch.device("cpu"))
    seen = torch.full((batch,), start, dtype=torch.long)
    assert torch.equal(forward_mod.attention_bias(mask, seen, start + width, torch.float32, start),
                       specdec_ops.tree_attention_bias(mask, seen, start + width, dtype=torch.float32))
    tokens = torch.tensor([PROMPTS[0][b:b + width] for b in range(batch)])
    prefix = torch.tensor([PROMPTS[2][:start]] * batch)
    results = []
    for general in (False, True):
        if general:
            class General(forward_mod.KVWindow):
                def __init__(self, cache, slots, kv_len, uniform_start=None):
                    super().__init__(cache, slots, kv_len, None)

            monkeypatch.setattr(forward_mod, "KVWindow", General)
            monkeypatch.setattr(forward_mod, "attention_bias", lambda m, s, n, d, u=None:
                                specdec_ops.tree_attention_bias(m, s, n, dtype=d))
        with torch.inference_mode():
            cache = forward_mod.RaggedKVCache(target, batch, 16, torch.device("cpu"), torch.float32)
            pm, pd = forward_mod.chain_tree(start, batch, torch.device("cpu"))
            forward_mod.forward(target, cache, prefix, cache.seq_lens, pd, pm)
            cache.seq_lens.fill_(start)
            logits = forward_mod.forward(target, cache, tokens, cache.seq_lens, depth, mask)
        results.append((logits, [t.clone() for t in cache.keys + cache.values]))
    (fast, fast_kv), (slow, slow_kv) = results
    assert torch.equal(fast, slow)
    assert all(torch.equal(a, b) for a, b in zip(fast_kv, slow_kv))


# ---------------------------------------------------------------------------------------------- errors


def test_errors_name_the_problem(target):
    dec = SpeculativeDecoder(target, NGramDrafter())
    with pytest.raises(ValueError, match=r"prompts\[1\] is empty"):
        dec.generate([[1, 2], []])
    with pytest.raises(ValueError, match=r"prompts\[0\]\[1\] = 100 is outside"):
        dec.generate([[1, 100]])
    with pytest.raises(ValueError, match=r"prompts\[0\]\[0\] = -1 is outside"):
        dec.generate([[-1]])
    with pytest.raises(ValueError, match="vocab size 50 does not match"):
        SpeculativeDecoder(target, ModelDrafter(tiny_llama(1, seed=2, vocab=50)))
    for bad in (0, -1):
        with pytest.raises(ValueError, match="num_speculative_tokens"):
            SpeculativeDecoder(target, NGramDrafter(), num_speculative_tokens=bad)
    for bad in (0, 256, 10_000):
        with pytest.raises(ValueError, match="tree"):
            SpeculativeDecoder(target, NGramDrafter(), tree=bad)
    with pytest.raises(ValueError, match="max_new_tokens"):
        dec.generate([[1]], max_new_tokens=0)
    for bad in (None, 1.5, True):
        with pytest.raises(specdec_ops.SpecDecArgumentError, match="seed must be an int"):
            dec.generate([[1]], max_new_tokens=2, seed=bad)
    with pytest.raises(ValueError, match="n must be"):
        NGramDrafter(n=0)
    with pytest.raises(ValueError, match="drafter must have"):
        SpeculativeDecoder(target, object())
    for bad in ([[1.5, 2]], [[True, 2]], [["3", 2]], [[1], torch.tensor([0.5])]):   # never truncated or cast
        with pytest.raises(specdec_ops.SpecDecArgumentError, match=r"prompts\[\d\]\[0\] = .* is not an integer"):
            dec.generate(bad, max_new_tokens=2)
    for bad in ([1, 2, 3], ["hello"]):                                             # not a list of lists
        with pytest.raises(specdec_ops.SpecDecArgumentError, match="prompts must be a list of token-id lists"):
            dec.generate(bad, max_new_tokens=2)
    for bad in (1.5, True, "a", [2, 2.5]):
        with pytest.raises(specdec_ops.SpecDecArgumentError, match="eos_token_id must be an int"):
            dec.generate([[1]], max_new_tokens=2, eos_token_id=bad)
    # numpy integers are ints; a numpy prompt array is a tensor of prompts
    assert dec.generate(np.array([[1, 2]]), max_new_tokens=np.int64(2), eos_token_id=np.int64(7)).sequences == \
        dec.generate([[1, 2]], max_new_tokens=2, eos_token_id=[7]).sequences
    for cls in (NGramDrafter, ModelDrafter):  # the class for an instance: named at construction
        with pytest.raises(specdec_ops.SpecDecArgumentError, match=f"drafter must be a drafter instance.*{cls.__name__}"):
            SpeculativeDecoder(target, cls)
    for bad in (None, "model", torch.nn.Linear(2, 2)):
        with pytest.raises(specdec_ops.SpecDecArgumentError, match="target_model must be a Hugging Face causal LM"):
            SpeculativeDecoder(bad, NGramDrafter())
        with pytest.raises(specdec_ops.SpecDecArgumentError, match="model must be a Hugging Face causal LM"):
            ModelDrafter(bad)


# ---------------------------------------------------------------------------------------------- docs


def test_engine_example_in_docs_runs():
    """The "Using the ops in your engine" example of README.md, executed as written."""
    text = open(os.path.join(ROOT, "README.md")).read()
    section = text[text.index("## Using the ops in your engine"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    exec(compile(code, "README.md", "exec"), {"__name__": "docs_example"})
