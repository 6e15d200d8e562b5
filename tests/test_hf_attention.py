"""The "specdec_tree" AttentionInterface function: a tiny random HF Llama verifying a draft
tree through it gives the logits of the same forward with a dense 4-D mask."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

import specdec_ops  # noqa: E402
from specdec_ops.decoding import hf_attention  # noqa: E402

# transformers >= 5.24 renames past_key_values to cache; 5.17 (the GPU machine) only knows past_key_values.
pytestmark = pytest.mark.filterwarnings("ignore:`past_key_values` is deprecated:FutureWarning")

PARENTS = [-1, 0, 0, 1, 1, 2, 3, 0]  # 8 nodes, depth up to 3


FAMILIES = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
}


def _tiny_llama(num_kv_heads=2, family="llama"):
    config_cls, model_cls = FAMILIES[family]
    config = config_cls(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=num_kv_heads, head_dim=16,
                        max_position_embeddings=128)
    torch.manual_seed(0)
    model = model_cls(config).eval()
    return model


def _dense_tree_mask(parents, prefix, kv_len, dtype):
    """[1, 1, N, kv_len] additive mask built directly from ancestor sets (independent of the ops)."""
    n = len(parents)
    bias = torch.full((1, 1, n, kv_len), torch.finfo(dtype).min, dtype=dtype)
    bias[..., :prefix] = 0
    for i in range(n):
        a = i
        while a != -1:
            bias[0, 0, i, prefix + a] = 0
            a = parents[a]
    return bias


def _prefix_cache(model, prompt):
    cache = transformers.DynamicCache(config=model.config)
    with torch.no_grad():
        model(prompt, past_key_values=cache, use_cache=True)
    return cache


@pytest.mark.parametrize("family, num_kv_heads, tree_backend", [
    ("llama", 2, None), ("llama", 4, None), ("llama", 2, "cpu"), ("llama", 4, "cpu"), ("llama", 2, "reference"),
    ("llama", 2, "triton"), ("llama", 4, "triton"), ("qwen2", 2, None), ("qwen2", 2, "cpu"), ("mistral", 2, "cpu"),
])
def test_specdec_tree_forward_equals_dense_mask_forward(family, num_kv_heads, tree_backend):
    model = _tiny_llama(num_kv_heads, family)
    batch, prefix = 2, 11
    prompt = torch.randint(0, 97, (batch, prefix))
    tree_ids = torch.randint(0, 97, (batch, len(PARENTS)))
    parents = torch.tensor([PARENTS] * batch)
    info = specdec_ops.build_tree(parents)
    prefix_lens = torch.full((batch,), prefix)
    positions = prefix_lens[:, None] + info.depth

    model.set_attn_implementation("sdpa")
    cache = _prefix_cache(model, prompt)
    dense = _dense_tree_mask(PARENTS, prefix, prefix + len(PARENTS), torch.float32).expand(batch, -1, -1, -1)
    with torch.no_grad():
        expected = model(tree_ids, position_ids=positions, attention_mask=dense, past_key_values=cache).logits

    hf_attention.register()
    model.set_attn_implementation(hf_attention.NAME)
    cache = _prefix_cache(model, prompt)  # ordinary prefill through "specdec_tree" (SDPA path)
    kwargs = {} if tree_backend is None else {"tree_attention_backend": tree_backend}
    with torch.no_grad():
        got = model(tree_ids, position_ids=positions, past_key_values=cache, tree_mask=info.mask,
                    prefix_lens=prefix_lens, **kwargs).logits
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


def test_specdec_tree_without_tree_kwargs_is_plain_causal_lm():
    model = _tiny_llama()
    prompt = torch.randint(0, 97, (2, 9))
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        expected = model(prompt).logits
    hf_attention.register()
    model.set_attn_implementation(hf_attention.NAME)
    with torch.no_grad():
        got = model(prompt).logits
    torch.testing.assert_close(got, expected)


def test_specdec_tree_needs_prefix_lens():
    model = _tiny_llama()
    hf_attention.register()
    model.set_attn_implementation(hf_attention.NAME)
    cache = _prefix_cache(model, torch.randint(0, 97, (1, 5)))
    info = specdec_ops.build_tree(torch.tensor([PARENTS]))
    with pytest.raises(ValueError, match="prefix_lens"):
        with torch.no_grad():
            model(torch.randint(0, 97, (1, len(PARENTS))), past_key_values=cache, tree_mask=info.mask)


def test_registered_under_its_name():
    specdec_ops.register_hf_attention()
    assert transformers.AttentionInterface._global_mapping[hf_attention.NAME] is hf_attention.specdec_tree_attention


@pytest.mark.cuda
def test_specdec_tree_forward_on_cuda_runs_the_kernel_and_matches_dense_mask():
    model = _tiny_llama(2).cuda()
    batch, prefix = 2, 40
    prompt = torch.randint(0, 97, (batch, prefix), device="cuda")
    tree_ids = torch.randint(0, 97, (batch, len(PARENTS)), device="cuda")
    info = specdec_ops.build_tree(torch.tensor([PARENTS] * batch, device="cuda"))
    prefix_lens = torch.full((batch,), prefix, device="cuda")
    positions = prefix_lens[:, None] + info.depth
    model.set_attn_implementation("sdpa")
    cache = _prefix_cache(model, prompt)
    dense = _dense_tree_mask(PARENTS, prefix, prefix + len(PARENTS), torch.float32).cuda().expand(batch, -1, -1, -1)
    with torch.no_grad():
        expected = model(tree_ids, position_ids=positions, attention_mask=dense, past_key_values=cache).logits
    hf_attention.register()
    model.set_attn_implementation(hf_attention.NAME)
    cache = _prefix_cache(model, prompt)
    with torch.no_grad():
        got = model(tree_ids, position_ids=positions, past_key_values=cache, tree_mask=info.mask,
                    prefix_lens=prefix_lens).logits
    torch.testing.assert_close(got, expected, atol=1e-3, rtol=1e-3)


# ---------------------------------------------------------------- grouped_sdpa: the decode loop's CPU attention


def test_grouped_sdpa_attention_equals_transformers_sdpa_and_copies_no_kv_head(monkeypatch):
    """Several queries under a mask over grouped KV heads: the heads attended as they are (no repeat_kv), query
    head h on KV head h // groups, equal to transformers' sdpa; one query or no mask: sdpa's own path."""
    from transformers.integrations import sdpa_attention

    torch.manual_seed(0)
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = 3, True
    batch, heads, kv_heads, dim, keys = 2, 6, 2, 16, 13
    key, value = torch.randn(batch, kv_heads, keys, dim), torch.randn(batch, kv_heads, keys, dim)
    for queries in (1, 4):
        query = torch.randn(batch, queries, heads, dim).transpose(1, 2)       # non-contiguous, as a model's
        bias = torch.where(torch.rand(batch, 1, queries, keys) < 0.3, float("-inf"), torch.randn(batch, 1, queries, keys))
        bias[..., -1] = 0.0                                                  # every query sees a key
        for mask in (bias, bias == 0.0, None):
            repeats = []
            real = sdpa_attention.repeat_kv
            monkeypatch.setattr(sdpa_attention, "repeat_kv", lambda x, n: repeats.append(n) or real(x, n))
            expected, _ = sdpa_attention.sdpa_attention_forward(module, query, key, value, mask, scaling=0.3)
            copied, repeats[:] = list(repeats), []
            outside, _ = hf_attention.grouped_sdpa_attention(module, query, key, value, mask, scaling=0.3)
            assert torch.equal(outside, expected) and repeats == copied      # outside a context: sdpa exactly
            repeats.clear()
            with hf_attention.grouped_sdpa(_tiny_llama()):
                got, _ = hf_attention.grouped_sdpa_attention(module, query, key, value, mask, scaling=0.3)
            monkeypatch.setattr(sdpa_attention, "repeat_kv", real)
            assert got.shape == (batch, queries, heads, dim)
            torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)
            # transformers copies the KV heads (K and V) for a mask and several queries; the grouped path never does
            assert copied == ([3, 3] if queries > 1 and mask is not None else []), copied
            assert repeats == []


def test_grouped_sdpa_switches_only_grouped_sdpa_layers_while_open_and_nests():
    grouped, full, eager = _tiny_llama(2), _tiny_llama(4), _tiny_llama(2)
    grouped.set_attn_implementation("sdpa")
    full.set_attn_implementation("sdpa")
    eager.set_attn_implementation("eager")
    with hf_attention.grouped_sdpa(grouped), hf_attention.grouped_sdpa(full), hf_attention.grouped_sdpa(eager):
        assert grouped.config._attn_implementation == hf_attention.GROUPED_SDPA
        assert transformers.AttentionInterface._global_mapping[hf_attention.GROUPED_SDPA] \
            is hf_attention.grouped_sdpa_attention
        assert full.config._attn_implementation == "sdpa"       # no grouped KV heads: nothing to gain
        assert eager.config._attn_implementation == "eager"     # another implementation: left alone
        with hf_attention.grouped_sdpa(grouped):
            assert grouped.config._attn_implementation == hf_attention.GROUPED_SDPA
        assert grouped.config._attn_implementation == hf_attention.GROUPED_SDPA   # the outer context still open
    assert grouped.config._attn_implementation == "sdpa"
    with pytest.raises(RuntimeError, match="inside"):
        with hf_attention.grouped_sdpa(grouped):
            raise RuntimeError("inside")
    assert grouped.config._attn_implementation == "sdpa"


def test_grouped_sdpa_model_forward_equals_sdpa_forward_with_a_tree_mask():
    """A whole model's tree-verify forward through the grouped path gives sdpa's logits; a forward from
    another thread while the context is open runs sdpa exactly."""
    import threading

    model = _tiny_llama(2)
    model.set_attn_implementation("sdpa")
    batch, prefix = 2, 11
    prompt = torch.randint(0, 97, (batch, prefix))
    tree_ids = torch.randint(0, 97, (batch, len(PARENTS)))
    info = specdec_ops.build_tree(torch.tensor([PARENTS] * batch))
    positions = prefix + info.depth
    dense = _dense_tree_mask(PARENTS, prefix, prefix + len(PARENTS), torch.float32).expand(batch, -1, -1, -1)

    def run():
        with torch.no_grad():
            return model(tree_ids, position_ids=positions, attention_mask=dense,
                         past_key_values=_prefix_cache(model, prompt)).logits

    expected = run()
    with hf_attention.grouped_sdpa(model):
        got = run()
        other = []
        thread = threading.Thread(target=lambda: other.append(run()))
        thread.start()
        thread.join()
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert torch.equal(other[0], expected)
