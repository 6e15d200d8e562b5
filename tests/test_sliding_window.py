"""The decode loop on targets with sliding-window attention (DESIGN.md §5.6: greedy output equals the
target's own greedy decoding token for token, for any Hugging Face causal LM).

Once a request's context is longer than the window, every forward of the loop (the prefill, the verify
windows of chains and trees, a model drafter's own forwards) hides the keys a window hides: tiny random
Mistral (every layer slides), Qwen2 (the upper layers slide) and Gemma2 (layers alternate: one mask per
layer type) against transformers' own generate(). The masks are also checked against a plain forward of
the same model over the same tokens, and the window is shown to matter (the same weights without it
decode differently).
"""

import pytest
import torch

transformers = pytest.importorskip("transformers")

import specdec_ops  # noqa: E402
from specdec_ops.decoding import ModelDrafter, NGramDrafter, SpeculativeDecoder  # noqa: E402
from specdec_ops.decoding.forward import (RaggedKVCache, chain_tree, forward, sliding_window_bias,  # noqa: E402
                                          sliding_window_layout)

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models: one torch thread (conftest.py)

VOCAB = 120
WINDOW = 6
# ragged, longer than the window, with repeats for the n-gram drafter to find
PROMPTS = [[17, 93, 41, 5, 66, 110, 8, 33, 17, 93, 41, 5, 66], [7, 8, 9, 7, 8], [3, 4, 5, 6, 7, 8, 9, 3, 4, 5]]
COMMON = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, bos_token_id=None, eos_token_id=None,
              pad_token_id=None)


def build(kind: str, window: int | None = WINDOW, seed: int = 0):
    torch.manual_seed(seed)
    if kind == "mistral":
        cfg = transformers.MistralConfig(sliding_window=window, **COMMON)
        cls = transformers.MistralForCausalLM
    elif kind == "qwen2":       # layer 0 full, layer 1 sliding
        cfg = transformers.Qwen2Config(use_sliding_window=window is not None, sliding_window=window,
                                       max_window_layers=1, **COMMON)
        cls = transformers.Qwen2ForCausalLM
    else:                       # gemma2: sliding and full layers alternate
        cfg = transformers.Gemma2Config(sliding_window=window, head_dim=8, query_pre_attn_scalar=8, **COMMON)
        cls = transformers.Gemma2ForCausalLM
    cfg._attn_implementation = "sdpa" if kind != "gemma2" else "eager"
    model = cls(cfg).eval()
    if kind == "gemma2":        # sharper logits than the tiny model's near-uniform ones: the window shows
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(4.0) if p.dim() > 1 else None
    return model


def reference_greedy(model, prompt, max_new_tokens):
    ids = torch.tensor([prompt])
    out = model.generate(ids, max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, do_sample=False,
                         pad_token_id=0, attention_mask=torch.ones_like(ids))
    return out[0, len(prompt):].tolist()




@pytest.mark.parametrize("kind", ["mistral", "qwen2", "gemma2"])
def test_layouts_as_transformers_reads_them(kind):
    window, every_layer = sliding_window_layout(build(kind))
    assert window == WINDOW and every_layer == (kind == "mistral")
    if kind != "gemma2":      # (transformers' Gemma2 needs a window: its layer types name sliding layers)
        assert sliding_window_layout(build(kind, window=None)) == (None, False)
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(**COMMON))
    assert sliding_window_layout(llama) == (None, False)


@pytest.mark.parametrize("kind", ["mistral", "qwen2", "gemma2"])
def test_greedy_equals_generate_past_the_window(kind):
    model = build(kind)
    plain = build(kind, window=1000)
    plain.load_state_dict(model.state_dict())
    steps = 14
    expected = [reference_greedy(model, p, steps) for p in PROMPTS]
    # the window matters here: the same weights attending to everything decode otherwise
    assert expected != [reference_greedy(plain, p, steps) for p in PROMPTS]
    for drafter, tree in [(NGramDrafter(n=3), None), (NGramDrafter(n=3), 6), (ModelDrafter(model), None),
                          (ModelDrafter(model), 5)]:
        out = SpeculativeDecoder(model, drafter, num_speculative_tokens=4, tree=tree).generate(
            PROMPTS, max_new_tokens=steps, eos_token_id=[])
        assert out.sequences == expected, (type(drafter).__name__, tree)
        assert out.stats.accepted_tokens > 0


def test_window_bias_hides_exactly_the_keys_out_of_reach():
    # request 0: prefix of 9 committed keys, a tree window of 4 nodes (0 -> 1 -> 2, 0 -> 3) at slot 9;
    # request 1: prefix of 3, the same tree at slot 3 (its slots 7.. are later keys, hidden anyway)
    parents = torch.tensor([[-1, 0, 1, 0]] * 2)
    info = specdec_ops.build_tree(parents)
    start = torch.tensor([9, 3])
    kv_len = 13
    bias = specdec_ops.tree_attention_bias(info.mask, start, kv_len)
    out = sliding_window_bias(bias, start, info.depth, kv_len, window=3)
    for b in range(2):
        for i in range(4):
            q = int(start[b] + info.depth[b, i])
            for s in range(kv_len):
                visible = bool(bias[b, 0, i, s] == 0)
                if visible:
                    key = s if s < start[b] else int(start[b] + info.depth[b, s - start[b]])
                    visible = q - key < 3
                assert bool(out[b, 0, i, s] == 0) == visible, (b, i, s)


def test_a_forward_over_a_long_window_equals_the_models_own_masks():
    # the loop's forward over 12 tokens at once (a prefill past the window) against the model's own
    # forward, which builds its sliding-window masks itself
    for kind in ("mistral", "qwen2", "gemma2"):
        model = build(kind)
        ids = torch.tensor([PROMPTS[0][:12]])
        cache = RaggedKVCache(model, 1, 16, torch.device("cpu"), torch.float32)
        mask, depth = chain_tree(12, 1, "cpu")
        ours = forward(model, cache, ids, cache.seq_lens, depth, mask, start_range=(0, 0))
        with torch.no_grad():
            theirs = model(ids).logits.float()
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)


def test_specdec_tree_attention_targets_fall_back_to_the_masks_past_the_window():
    # the tree kernel has no sliding window: once a key is out of reach the layers attend through the masks
    specdec_ops.register_hf_attention()
    model = build("mistral")
    expected = [reference_greedy(model, p, 10) for p in PROMPTS]
    model.set_attn_implementation("specdec_tree")
    calls = []
    kernel = specdec_ops.tree_attention

    def counted(*args, **kwargs):
        calls.append(args[3].tolist())      # prefix_lens of each kernel call
        return kernel(*args, **kwargs)

    specdec_ops.tree_attention = counted
    try:
        out = SpeculativeDecoder(model, NGramDrafter(n=3), num_speculative_tokens=3, tree=4,
                                 tree_attention_backend="cpu").generate([[1, 2, 3], [4, 5]], max_new_tokens=10,
                                                                        eos_token_id=[])
        assert out.sequences == [reference_greedy(model, p, 10) for p in ([1, 2, 3], [4, 5])]
        # the kernel ran while every key was in reach (prefix + tree depth below the window), never after
        assert calls and all(max(c) < WINDOW for c in calls)
        out = SpeculativeDecoder(model, NGramDrafter(n=3), num_speculative_tokens=3, tree=4,
                                 tree_attention_backend="cpu").generate(PROMPTS, max_new_tokens=10, eos_token_id=[])
        assert out.sequences == expected
    finally:
        specdec_ops.tree_attention = kernel
        model.set_attn_implementation("sdpa")


@pytest.mark.filterwarnings("ignore:`past_key_values` is deprecated:FutureWarning")
@pytest.mark.parametrize("kind", ["mistral", "qwen2"])
def test_specdec_tree_attention_applies_the_window_when_called_directly(kind):
    # README's direct use: a cache holding the prefix (full layers), the tree after it. Each node's logits must
    # be the model's own for the prefix and the node's path, with the model's window (prefix 10 > window 6).
    from specdec_ops.decoding import hf_attention
    model = build(kind)
    prefix, parents = PROMPTS[0][:10], [-1, 0, 0, 1, 3, 2]
    tokens = [prefix[-1], 44, 45, 46, 47, 48]
    info = specdec_ops.build_tree(torch.tensor([parents]))
    hf_attention.register()
    model.set_attn_implementation(hf_attention.NAME)
    try:
        cache = transformers.DynamicCache()      # full layers: key slot s holds position s
        with torch.no_grad():
            model(torch.tensor([prefix[:-1]]), past_key_values=cache, use_cache=True)
            got = model(torch.tensor([tokens]), position_ids=9 + info.depth, past_key_values=cache,
                        tree_mask=info.mask, prefix_lens=torch.tensor([9]), tree_attention_backend="cpu").logits
    finally:
        model.set_attn_implementation("sdpa")
    for i in range(len(parents)):
        path, a = [], i
        while a > 0:
            path.append(tokens[a])
            a = parents[a]
        with torch.no_grad():
            want = model(torch.tensor([prefix + path[::-1]])).logits[0, -1]
        torch.testing.assert_close(got[0, i], want, rtol=1e-4, atol=1e-4)
    assert hf_attention.tree_depths(info.mask).tolist() == info.depth.tolist()
