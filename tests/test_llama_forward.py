"""The decode loop's own Llama-family forward (decoding/llama.py): transformers' logits bit for bit, and the model
itself wherever that could not hold."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from specdec_ops.decoding import forward as forward_mod  # noqa: E402
from specdec_ops.decoding import llama  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

FAMILIES = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
    "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),     # q/k/v projections with a bias
}


def tiny(family="llama", kv_heads=2, seed=0, **extra):
    config_cls, model_cls = FAMILIES[family]
    config = config_cls(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                        num_attention_heads=4, num_key_value_heads=kv_heads, head_dim=16, max_position_embeddings=256,
                        attn_implementation="sdpa", **extra)
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    with torch.no_grad():      # norm weights start at one and qwen2's q/k/v biases at zero: make them count
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.uniform_(0.5, 1.5)
            elif name.endswith("bias"):
                parameter.normal_()
    return model


def run(model, tokens, starts, logits_at=None, llama_forward=True, monkeypatch=None):
    """forward() after a prefix of starts[b] random tokens per request; returns (logits, the cache's K/V)."""
    if not llama_forward:
        monkeypatch.setattr(forward_mod, "runs_llama_forward", lambda model, mask: False)
    batch, width = tokens.shape
    cache = forward_mod.RaggedKVCache(model, batch, 64, torch.device("cpu"), torch.float32)
    generator = torch.Generator().manual_seed(1)
    prefix = torch.randint(0, 97, (batch, max(starts)), generator=generator)
    mask, depth = forward_mod.chain_tree(prefix.shape[1], batch, torch.device("cpu"))
    with torch.inference_mode():
        forward_mod.forward(model, cache, prefix, cache.seq_lens, depth, mask, start_range=(0, 0))
        cache.seq_lens.copy_(torch.tensor(starts))
        mask, depth = forward_mod.chain_tree(width, batch, torch.device("cpu"))
        logits = forward_mod.forward(model, cache, tokens, cache.seq_lens, depth, mask, logits_at=logits_at,
                                     start_range=(min(starts), max(starts)))
    if not llama_forward:
        monkeypatch.undo()
    return logits, [t.clone() for t in cache.keys + cache.values]


@pytest.mark.parametrize("narrow", [False, True], ids=["f_linear", "narrow_linear"])
@pytest.mark.parametrize("family,kv_heads", [("llama", 2), ("llama", 4), ("llama", 1), ("mistral", 2), ("qwen2", 2)])
@pytest.mark.parametrize("starts,width,keep", [([5], 1, False), ([5], 3, False), ([7, 4], 1, False),
                                               ([7, 4], 4, False), ([6, 6, 2], 2, True), ([3], 9, True)])
def test_llama_forward_gives_the_models_logits_and_cache_bit_for_bit(family, kv_heads, starts, width, keep, narrow,
                                                                      monkeypatch):
    """Grouped (2 KV heads for 4), full (4) and multi-query (1) attention, one and several queries, ragged starts,
    logits kept per request, products through F.linear or narrow_linear: the same bits as the model's own forward."""
    model = tiny(family, kv_heads)
    if not narrow:
        monkeypatch.setattr(forward_mod, "narrow_rows", lambda: 0)
    tokens = torch.randint(0, 97, (len(starts), width), generator=torch.Generator().manual_seed(2))
    logits_at = torch.tensor([b % width for b in range(len(starts))]) if keep else None
    assert llama.runs_llama_forward(model, torch.zeros(1, 1, 1, 1))
    calls = []
    monkeypatch.setattr(llama, "_rms_norm", lambda x, norm, real=llama._rms_norm: calls.append(1) or real(x, norm))
    got, got_cache = run(model, tokens, starts, logits_at)
    assert calls                                       # the loop's forward ran
    calls.clear()
    expected, expected_cache = run(model, tokens, starts, logits_at, llama_forward=False, monkeypatch=monkeypatch)
    assert not calls                                   # the model's own forward ran
    assert got.shape == expected.shape
    assert torch.equal(got, expected)
    for a, b in zip(got_cache, expected_cache):
        assert torch.equal(a, b)


def _hook_model(model):
    model.model.layers[1].mlp.register_forward_hook(lambda module, args, out: out * 2)


def _hook_linear(model):
    model.model.layers[0].self_attn.k_proj.register_forward_pre_hook(lambda module, args: (args[0] * 0.5,))


def _own_forward(model):
    norm = model.model.layers[2].post_attention_layernorm
    norm.forward = lambda x, norm=norm: type(norm).forward(norm, x) + 1.0


def _wrapped_linear(model):
    class Scaled(torch.nn.Linear):
        def forward(self, x):
            return super().forward(x) * 3.0
    old = model.model.layers[1].mlp.up_proj
    new = Scaled(old.in_features, old.out_features, bias=False)
    new.weight = old.weight
    model.model.layers[1].mlp.up_proj = new


def _train(model):
    model.train()


def _eager(model):
    model.set_attn_implementation("eager")


@pytest.mark.parametrize("change", [_hook_model, _hook_linear, _own_forward, _wrapped_linear, _train, _eager],
                         ids=["hooked_mlp", "pre_hooked_linear", "own_forward", "subclassed_linear", "train", "eager"])
def test_a_changed_model_runs_itself(change, monkeypatch):
    """A hook, a module's own forward, a layer swapped for a subclass (as adapter libraries do, after the model was
    already used), training mode or another attention: the model's own forward runs, and what it computes (the
    change included) is what forward() returns."""
    model = tiny()
    tokens = torch.randint(0, 97, (1, 3), generator=torch.Generator().manual_seed(3))
    before, _ = run(model, tokens, [5])                     # first used as it came
    change(model)
    assert not llama.runs_llama_forward(model, torch.zeros(1, 1, 1, 1))
    got, _ = run(model, tokens, [5])
    expected, _ = run(model, tokens, [5], llama_forward=False, monkeypatch=monkeypatch)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    if change not in (_eager, _train):             # (no dropout: eval and train compute alike)
        assert not torch.equal(got, before)                 # the change mattered, and forward() honoured it


def test_only_exact_float32_cpu_family_models_with_one_mask_run_it():
    model = tiny()
    mask = torch.zeros(1, 1, 1, 1)
    assert llama.runs_llama_forward(model, mask)
    assert not llama.runs_llama_forward(model, {"full_attention": mask, "sliding_attention": mask})
    assert not llama.runs_llama_forward(tiny().to(torch.bfloat16), mask)

    class Custom(transformers.LlamaForCausalLM):
        pass
    assert not llama.runs_llama_forward(Custom(model.config).eval(), mask)
    handle = torch.nn.modules.module.register_module_forward_hook(lambda module, args, out: None)
    try:
        assert not llama.runs_llama_forward(model, mask)
    finally:
        handle.remove()
    assert llama.runs_llama_forward(model, mask)
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=97)).eval()
    assert not llama.runs_llama_forward(gpt2, mask)
