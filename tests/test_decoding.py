"""The decode loop (specdec_ops.decoding, DESIGN.md §5.6) on tiny random-weight HF Llama models.

Proves: greedy output equals the target's own generate(do_sample=False) token for token (chain and
tree, n-gram and model drafters, a ragged batch of 3 prompts, EOS stops); the target's KV cache after
several steps equals a plain forward over the committed tokens; one target forward per step and no
re-forward of accepted tokens; finished requests leave the batch; sampling is distributed as the
target's (chi-square); clear errors for bad input; the engine example in README.md runs.
"""

import os
import re

import pytest
import torch

pytest.importorskip("transformers")
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM  # noqa: E402

from specdec_ops.decoding import (GenerateOutput, ModelDrafter, NGramDrafter, SpeculativeDecoder,  # noqa: E402
                                  word_starts)
from specdec_ops.decoding.cache import cache_kwarg  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB = 100
PROMPTS = [[5, 17, 23, 42, 5, 17, 23, 8, 61, 5, 17], [3], [70, 71, 72, 73, 70, 71]]  # ragged, one of length 1


def tiny_llama(layers: int, seed: int, vocab: int = VOCAB, hidden: int = 32) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      bos_token_id=None, eos_token_id=None, pad_token_id=None, attn_implementation="sdpa")
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: thread start-up costs more than it saves
    yield
    torch.set_num_threads(threads)


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
    if kind == "ngram-lengths":
        return NGramDrafter(n=3, lengths=(0, 2, 5))
    if kind == "ngram-resume":
        return NGramDrafter(n=3, lengths=(1, 2, 5), resume_window=4, resume_length=3, forward_overhead=4.0)
    if kind == "ngram-edit":
        return NGramDrafter(n=3, lengths=(1, 2, 5), resume_length=3, resume_after_edit=1,
                            word_starts=torch.arange(VOCAB) % 3 == 0)
    if kind == "model":
        return ModelDrafter(small_drafter)
    return ModelDrafter(target)  # "self": the target drafts for itself, so long paths get accepted


# ---------------------------------------------------------------------------------------------- greedy


@pytest.mark.parametrize("tree", [None, 6], ids=["chain", "tree"])
@pytest.mark.parametrize("kind", ["ngram", "ngram-lengths", "ngram-resume", "ngram-edit", "model", "self"])
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


def test_greedy_accepts_tensor_prompts_and_long_drafts(target):
    prompts = torch.tensor([PROMPTS[0][:6], PROMPTS[2]])
    expected = [reference_greedy(target, p, 12) for p in prompts.tolist()]
    out = SpeculativeDecoder(target, ModelDrafter(target), num_speculative_tokens=7).generate(
        prompts, max_new_tokens=12, eos_token_id=[])
    assert out.sequences == expected


def test_greedy_with_specdec_tree_attention_kernel_path():
    """The GPU route: the target runs "specdec_tree" attention (tree_attention over the ragged cache with the
    bitmask) instead of SDPA over the additive bias; forced onto the CPU kernel here."""
    import specdec_ops.hf_attention  # noqa: F401  (registers "specdec_tree")

    model = tiny_llama(2, seed=0)
    expected = [reference_greedy(model, p, 12) for p in PROMPTS]
    model.set_attn_implementation("specdec_tree")
    model.specdec_tree_backend = "cpu"
    for tree in (None, 6):
        out = SpeculativeDecoder(model, ModelDrafter(model), num_speculative_tokens=3, tree=tree).generate(
            PROMPTS, max_new_tokens=12, eos_token_id=[])
        assert out.sequences == expected
        assert out.stats.accepted_tokens > 0


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
            pending.append(int((batch.lengths - self._valid.long()).sum()))
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


def _batch(prompts, max_new_tokens=32):
    from specdec_ops.decoding.decoder import Batch
    from specdec_ops.decoding.sampling import request_seeds

    return Batch(prompts, max_new_tokens, set(), request_seeds(0, len(prompts)), 64, torch.device("cpu"))


def test_ngram_lengths_scale_the_draft_with_the_match():
    """lengths=(l1, l2, l3): a one-token match drafts l1 tokens, a two-token match l2, longer ones l3, all
    capped by k; the trie gives each match its own length."""
    one = [9, 1, 2, 3, 4, 5, 6, 7, 8, 30, 9]                 # suffix (9) matches one token: continuation 1 2 3 ..
    two = [8, 9, 1, 2, 3, 4, 5, 6, 7, 30, 8, 9]              # suffix (8, 9) matches two tokens
    three = [7, 8, 9, 1, 2, 3, 4, 5, 6, 30, 7, 8, 9]         # suffix (7, 8, 9) matches three tokens
    batch = _batch([one, two, three])
    sampling = None
    drafter = NGramDrafter(n=3, lengths=(0, 2, 5))
    draft = drafter.propose(batch, 4, None, sampling)
    assert draft.chain and draft.num_nodes.tolist() == [1, 3, 5]     # 0, 2, min(5, k = 4) drafts
    assert draft.tokens[1, 1:3].tolist() == [1, 2] and draft.tokens[2, 1:5].tolist() == [1, 2, 3, 4]
    draft = NGramDrafter(n=3).propose(batch, 4, None, sampling)      # default: k for any match
    assert draft.num_nodes.tolist() == [5, 5, 5]
    draft = NGramDrafter(n=3, lengths=(1, 3)).propose(batch, 8, None, sampling)  # last entry: longer matches
    assert draft.num_nodes.tolist() == [2, 4, 4]
    # trie: the longest match gets its length, the shorter ones theirs
    seq = [7, 8, 9, 1, 2, 3, 4, 5, 40, 9, 50, 51, 52, 7, 8, 9]    # (7,8,9) -> 1 2 3 4 ..; (9) -> 50 51 ..
    tree = NGramDrafter(n=3, lengths=(1, 2, 3)).propose(_batch([seq]), 8, 16, sampling)
    assert not tree.chain and tree.num_nodes.tolist() == [1 + 3 + 1]
    assert tree.tokens[0, 1:5].tolist() == [1, 2, 3, 50] and tree.parents[0, :5].tolist() == [-1, 0, 1, 2, 0]
    for bad in ((), (-1,), (1.5, 2), "ab"):
        with pytest.raises(ValueError, match="lengths"):
            NGramDrafter(lengths=bad)


def test_ngram_resume_follows_the_copied_text_after_an_edit():
    """After the output replaced a token of the text it copies, the match resuming right behind the cursor
    wins over the earliest match and drafts at least resume_length tokens; commit moves the cursor behind
    the last accepted token's source."""
    source = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19]               # positions 5 .. 14
    seq = [14, 60, 61, 62, 63] + source + [10, 11, 12, 40, 14]       # copied 10 11 12, replaced 13 by 40, then 14
    batch = _batch([seq])
    plain = NGramDrafter(n=3, lengths=(1, 8))
    assert plain.propose(batch, 5, None, None).tokens[0, 1:].tolist() == [60]     # earliest one-token match
    drafter = NGramDrafter(n=3, lengths=(1, 8), resume_window=4, resume_length=3)
    drafter.reset(batch, 64, VOCAB)
    drafter._cursor = [8]                                            # the copy stopped matching at 13 (position 8)
    draft = drafter.propose(batch, 5, None, None)
    assert draft.tokens[0, 1:].tolist() == [15, 16, 17]              # resumes at position 10, 3 tokens
    drafter.commit(torch.tensor([[0, 1, 2, -1]]), torch.tensor([2], dtype=torch.int32))
    assert drafter._cursor == [12]                                   # 15 16 accepted: next source token is 17
    drafter.commit(torch.tensor([[0, -1, -1, -1]]), torch.tensor([0], dtype=torch.int32))
    assert drafter._cursor == [10]                                   # none accepted: the continuation's start
    far = NGramDrafter(n=3, lengths=(1, 8), resume_window=1, resume_length=3)
    far.reset(batch, 64, VOCAB)
    far._cursor = [8]                                                # position 10 is out of the window: no resume
    assert far.propose(batch, 5, None, None).tokens[0, 1:].tolist() == [60]
    tree = drafter.propose(batch, 5, 8, None)                        # the trie puts the resumed match first
    assert tree.tokens[0, 1:5].tolist() == [15, 16, 17, 60] and tree.parents[0, 1:5].tolist() == [0, 1, 2, 0]
    for bad in (dict(resume_window=-1), dict(resume_length=-2), dict(resume_window=1.5)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            NGramDrafter(**bad)


def _emit(batch, tokens):
    """Append `tokens` to request 0 of a test Batch (what the loop's emit does)."""
    start = int(batch.lengths[0])
    batch.tokens[0, start:start + len(tokens)] = torch.tensor(tokens)
    batch.lengths[0] += len(tokens)


def test_ngram_resume_after_edit_continues_behind_the_edited_word():
    """A draft rejected after >= resume_after_edit accepted tokens: the next draft continues the copied text
    behind the rejected token (with word_starts: behind the rest of its word), ahead of other matches;
    fewer accepted tokens, a fully accepted draft or a trie leaf set nothing up."""
    text = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19]                 # positions 1 .. 10
    seq = [50] + text + [60, 50, 10]                                 # the output starts copying after (50, 10)

    def after_edit(drafter, accepted, tree=None, edit=(40,)):
        batch = _batch([seq])
        drafter.reset(batch, 64, VOCAB)
        draft = drafter.propose(batch, 6, tree, None)
        assert draft.tokens[0, 1:7].tolist() == [11, 12, 13, 14, 15, 16]
        path = torch.full((1, draft.tokens.shape[1]), -1)
        path[0, :accepted + 1] = torch.arange(accepted + 1)            # chain nodes (and the trie's first branch)
        drafter.commit(path, torch.tensor([accepted], dtype=torch.int32))
        _emit(batch, [11, 12, 13, 14, 15, 16][:accepted] + list(edit))   # the target wrote `edit` instead
        return drafter.propose(batch, 6, tree, None)

    plain = after_edit(NGramDrafter(n=3, lengths=(0, 8)), 2)
    assert plain.num_nodes.tolist() == [1]                           # (12, 40), (40): no match, no draft
    edit = after_edit(NGramDrafter(n=3, lengths=(0, 8), resume_after_edit=2, resume_length=4), 2)
    assert edit.tokens[0, 1:].tolist() == [14, 15, 16, 17]          # 13 -> 40: resume behind it, 4 tokens
    starts = torch.ones(VOCAB, dtype=torch.bool)
    starts[14] = False                                               # "13 14" is one word: 14 continues it
    word = NGramDrafter(n=3, lengths=(0, 8), resume_after_edit=2, resume_length=4, word_starts=starts)
    assert after_edit(word, 2).tokens[0, 1:].tolist() == [15, 16, 17, 18]
    starts[[15, 16, 17, 18, 19, 60, 50]] = False                     # no word start within 8 tokens: the next token
    word = NGramDrafter(n=3, lengths=(0, 8), resume_after_edit=2, resume_length=4, word_starts=starts)
    assert after_edit(word, 2).tokens[0, 1:].tolist() == [14, 15, 16, 17]
    few = after_edit(NGramDrafter(n=3, lengths=(0, 8), resume_after_edit=3), 2)
    assert few.num_nodes.tolist() == [1]                             # 2 accepted < 3: not taken for an edit
    tree = after_edit(NGramDrafter(n=3, lengths=(0, 8), resume_after_edit=2, resume_length=4), 2, tree=8)
    assert tree.tokens[0, 1:5].tolist() == [14, 15, 16, 17]          # the trie puts it first too
    # everything accepted (the bonus token ends nothing that was drafted): no edit
    done = NGramDrafter(n=3, lengths=(0, 8), resume_after_edit=2, resume_length=4)
    assert after_edit(done, 6, edit=(41,)).num_nodes.tolist() == [1]
    for bad in (dict(resume_after_edit=-1), dict(resume_after_edit=1.5), dict(word_starts=[True, False]),
                dict(word_starts=torch.ones(2, 3, dtype=torch.bool)), dict(word_starts=torch.ones(4))):
        with pytest.raises(ValueError, match=next(iter(bad))):
            NGramDrafter(**bad)


def test_word_starts_marks_tokens_that_begin_words():
    class Tokenizer:
        pieces = ["<s>", "\u0120the", "s", "\u2581word", "ing", ".", "\u010a", "", "9"]

        def __len__(self):
            return len(self.pieces)

        def convert_ids_to_tokens(self, ids):
            return [self.pieces[i] for i in ids]

    table = word_starts(Tokenizer(), vocab_size=11)
    assert table.dtype == torch.bool
    assert table.tolist() == [True, True, False, True, False, True, True, True, False, True, True]
    assert word_starts(Tokenizer()).shape == (9,)


def test_ngram_forward_overhead_cuts_batch_drafts_to_a_shared_width():
    """With forward_overhead, one request's long draft (chain or trie branch) does not widen a whole batch's
    window; requests that keep getting their drafts accepted keep them; a single request is never cut."""
    drafter = NGramDrafter(forward_overhead=16.0)
    drafter._accepted, drafter._rejected = [0] * 8, [0] * 8
    assert drafter._shared_width([32] + [0] * 7) == 0          # 8 requests pay 33 slots for one long draft
    drafter._accepted, drafter._rejected = [0, 0], [0, 0]
    assert 0 < drafter._shared_width([8, 8]) < 8               # prior acceptance 0.8: a middle width
    drafter._accepted, drafter._rejected = [400, 400], [0, 0]
    assert drafter._shared_width([8, 8]) == 8                  # always accepted so far: the full drafts
    copy = [7, 8, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9]                # a three-token match: a long draft
    batch = _batch([copy] + [[40 + i, 50 + i] for i in range(5)])   # five requests without a match
    drafter = NGramDrafter(n=3, forward_overhead=16.0)
    drafter.reset(batch, 64, VOCAB)
    assert drafter.propose(batch, 8, None, None).num_nodes.tolist() == [1] * 6
    assert NGramDrafter(n=3).propose(batch, 8, None, None).num_nodes.tolist() == [9] + [1] * 5
    single = _batch([copy])
    assert NGramDrafter(n=3, forward_overhead=16.0).propose(single, 8, None, None).num_nodes.tolist() == [9]
    drafter.commit(torch.zeros(6, 1, dtype=torch.int64), torch.zeros(6, dtype=torch.int32))
    assert drafter._accepted == [0] * 6 and drafter._rejected == [0] * 6   # empty drafts: nothing learned
    assert drafter.propose(batch, 8, 16, None).num_nodes.tolist() == [1] * 6          # tries: every branch cut
    assert NGramDrafter(n=3).propose(batch, 8, 16, None).num_nodes.tolist() == [9] + [1] * 5
    pair = _batch([copy, copy])
    drafter = NGramDrafter(n=3, forward_overhead=16.0)
    drafter.reset(pair, 64, VOCAB)
    nodes = drafter.propose(pair, 8, None, None).num_nodes.tolist()
    assert nodes[0] == nodes[1] and 1 < nodes[0] < 9                     # prior 0.8: cut somewhere inside
    cut = nodes[0] - 1
    path = torch.tensor([list(range(cut + 1)), [0, 1] + [-1] * (cut - 1)])
    drafter.commit(path, torch.tensor([cut, 1], dtype=torch.int32))
    assert drafter._accepted == [cut, 1] and drafter._rejected == [0, 1]
    for bad in (-1.0, "16", True):
        with pytest.raises(ValueError, match="forward_overhead"):
            NGramDrafter(forward_overhead=bad)


@pytest.mark.parametrize("keep_limit", [None, 0], ids=["logits_to_keep", "all-rows"])
def test_forward_logits_at_equals_full_logits_rows(target, keep_limit, monkeypatch):
    """forward(logits_at=...) (the prefill's and the drafter catch-up's one row per request) equals the rows
    of the full logits, whether the model projects only those positions or every one."""
    from specdec_ops.decoding import cache as cache_mod
    from specdec_ops.decoding.decoder import forward_window, chain_tree

    if keep_limit is not None:
        monkeypatch.setattr(cache_mod, "_KEEP_LIMIT", keep_limit)
    prompts = [PROMPTS[0], PROMPTS[2]]
    width = max(len(p) for p in prompts)
    tokens = torch.tensor([p + [0] * (width - len(p)) for p in prompts])
    at = torch.tensor([len(p) - 1 for p in prompts])
    with torch.inference_mode():
        results = []
        for logits_at in (None, at):
            cache = cache_mod.RaggedKVCache(target, 2, 32, torch.device("cpu"), torch.float32)
            mask, depth = chain_tree(width, 2, tokens.device)
            results.append(forward_window(target, cache, tokens, depth, mask, logits_at=logits_at))
    full, rows = results
    assert rows.shape == (2, VOCAB) and rows.dtype == torch.float32
    torch.testing.assert_close(rows, full[torch.arange(2), at], atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------- sampling


@pytest.mark.parametrize("tree", [None, 4], ids=["chain", "tree"])
@pytest.mark.parametrize("params", [dict(temperature=1.0), dict(temperature=0.7, top_k=5, top_p=0.9)],
                         ids=["t1", "t0.7-topk5-topp0.9"])
def test_sampling_first_tokens_match_target_distribution(params, tree):
    """The joint of the first three tokens (the prefill draws the first, one verify step with a model draft
    emits the next two) equals p(x1) p(x2 | x1) p(x3 | x1, x2) of the target after temperature / top-k /
    top-p. Chi-square, alpha = 1e-4, 20000 samples (one batch of 20000 copies, per-request seeds)."""
    from scipy.stats import chisquare

    from specdec_ops.decoding.sampling import SamplingParams

    vocab, samples, alpha = 8, 20000, 1e-4
    tgt = tiny_llama(1, seed=3, vocab=vocab, hidden=16)
    drf = tiny_llama(1, seed=4, vocab=vocab, hidden=16)
    with torch.no_grad():  # sharpen the random models so the distributions are far from uniform
        tgt.lm_head.weight.mul_(8)
        drf.lm_head.weight.mul_(8)
    prompt = [1, 2, 3]
    sp = SamplingParams(params["temperature"], params.get("top_k", 0), params.get("top_p", 1.0))
    with torch.inference_mode():
        p1 = sp.probs(tgt(torch.tensor([prompt])).logits[0, -1])
        p2 = sp.probs(tgt(torch.tensor([prompt + [a] for a in range(vocab)])).logits[:, -1])
        p3 = sp.probs(tgt(torch.tensor([prompt + [a, b] for a in range(vocab) for b in range(vocab)])).logits[:, -1])
    joint = (p1[:, None, None] * p2[:, :, None] * p3.view(vocab, vocab, vocab)).flatten()

    out = SpeculativeDecoder(tgt, ModelDrafter(drf, branch=2), num_speculative_tokens=2, tree=tree).generate(
        [prompt] * samples, max_new_tokens=3, seed=1234, eos_token_id=[], **params)
    assert all(len(s) == 3 for s in out.sequences)
    assert out.stats.target_forwards == 2 and out.stats.accepted_tokens > samples // 10  # rejections need a 2nd
    cells = torch.tensor([(s[0] * vocab + s[1]) * vocab + s[2] for s in out.sequences])
    observed = torch.bincount(cells, minlength=vocab ** 3).double()
    expected = joint.double() * samples
    assert observed[expected == 0].sum() == 0                          # filtered tokens never appear
    big = expected >= 5
    obs = torch.cat([observed[big], observed[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = exp > 0
    stat = chisquare(obs[keep].numpy(), exp[keep].numpy() * obs[keep].sum().item() / exp[keep].sum().item())
    assert stat.pvalue > alpha, (stat, params)


def test_sampling_is_reproducible_per_seed(target, small_drafter):
    dec = SpeculativeDecoder(target, ModelDrafter(small_drafter), num_speculative_tokens=3)
    a = dec.generate(PROMPTS, max_new_tokens=10, temperature=1.0, seed=7, eos_token_id=[]).sequences
    b = dec.generate(PROMPTS, max_new_tokens=10, temperature=1.0, seed=7, eos_token_id=[]).sequences
    c = dec.generate(PROMPTS, max_new_tokens=10, temperature=1.0, seed=8, eos_token_id=[]).sequences
    assert a == b and a != c


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
    with pytest.raises(ValueError, match="temperature"):
        dec.generate([[1]], temperature=-1.0)
    with pytest.raises(ValueError, match="top_p"):
        dec.generate([[1]], top_p=0.0)
    with pytest.raises(ValueError, match="n must be"):
        NGramDrafter(n=0)


# ---------------------------------------------------------------------------------------------- docs


def test_engine_example_in_docs_runs():
    """The "Using the ops in your engine" example of README.md, executed as written."""
    text = open(os.path.join(ROOT, "README.md")).read()
    section = text[text.index("## Using the ops in your engine"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    exec(compile(code, "README.md", "exec"), {"__name__": "docs_example"})
