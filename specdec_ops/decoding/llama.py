"""The loop's own forward of Llama-family models on the CPU: transformers' computation, op for op, without
its module calls.

A one-token forward of SmolLM2-135M (30 layers) on one CPU thread spends about 8% of its time (6 ms of 70) in
Python around the torch ops: fifteen module calls a layer, each through ``nn.Module.__call__`` and
transformers' decorators (kwarg deprecation, output capturing, gradient checkpointing, hub kernels). Plain
``generate()`` pays it too; the decode loop need not. :func:`llama_forward` runs the same torch ops on the
same weights in the same order as transformers' ``LlamaForCausalLM`` / ``MistralForCausalLM`` /
``Qwen2ForCausalLM`` with ``"sdpa"`` attention, so its logits are transformers' bit for bit (the linear
products go through the loop's ``narrow_linear`` where the HF path's layers would: ``narrow_linears``),
but reads like a model file::

    h = embed(tokens)
    for layer in layers:
        x = rms_norm(h);  q, k, v = project(x);  q, k = rotate(q, k)
        k, v = cache.update(k, v);  h = h + o_proj(attention(q, k, v, mask))
        h = h + down(act(gate(rms_norm(h))) * up(rms_norm(h)))
    logits = lm_head(rms_norm(h))

:func:`runs_llama_forward` says when it applies, checked on every forward: exactly those classes (not a
subclass, nor a quantized or adapter-wrapped projection; the activation module is called as it is), float32
on the CPU, eval mode, transformers' ``"sdpa"`` attention, one mask for every layer, and no hook or replaced
``forward`` on any module it computes itself (the loop's own ``narrow_linears`` forwards aside). Anything
else runs the model itself.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

# (causal LM, model, decoder layer, attention, MLP, RMSNorm) class names per transformers module
_FAMILIES = {
    "llama": ("LlamaForCausalLM", "LlamaModel", "LlamaDecoderLayer", "LlamaAttention", "LlamaMLP", "LlamaRMSNorm"),
    "mistral": ("MistralForCausalLM", "MistralModel", "MistralDecoderLayer", "MistralAttention", "MistralMLP",
                "MistralRMSNorm"),
    "qwen2": ("Qwen2ForCausalLM", "Qwen2Model", "Qwen2DecoderLayer", "Qwen2Attention", "Qwen2MLP", "Qwen2RMSNorm"),
}


@functools.cache
def _family_classes() -> dict:
    """{causal LM class: (model, decoder layer, attention, MLP, RMSNorm classes)} of the families transformers has."""
    import importlib

    out = {}
    for family, names in _FAMILIES.items():
        try:
            module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
            classes = tuple(getattr(module, name) for name in names)
        except (ImportError, AttributeError):
            continue
        out[classes[0]] = classes[1:]
    return out


def _untouched(module, cls, narrow_forward=None) -> bool:
    """``module`` is exactly ``cls``, with no hook and no ``forward`` of its own (or only ``narrow_forward``, the
    loop's narrow_linears forward of an ``nn.Linear``): calling it computes what ``cls.forward`` says."""
    if type(module) is not cls or module._forward_hooks or module._forward_pre_hooks or module._backward_hooks \
            or module._backward_pre_hooks:
        return False
    own = module.__dict__.get("forward")
    return own is None or (narrow_forward is not None and getattr(own, "__func__", None) is narrow_forward)


_ATTENTION_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP_LINEARS = ("gate_proj", "up_proj", "down_proj")


def _plain_family_model(model) -> bool:
    """Whether ``model`` is built exactly of one family's classes, none of the modules whose forward
    :func:`llama_forward` computes itself hooked or given a forward of its own. Checked on every call (about 0.1 ms
    for 30 layers): an adapter library swaps layers in place, and a hook may be added at any time."""
    from .forward import _narrow_forward

    classes = _family_classes().get(type(model))
    if classes is None or not _untouched(model, type(model)):
        return False
    g = torch.nn.modules.module
    if g._global_forward_hooks or g._global_forward_pre_hooks or g._global_backward_hooks \
            or g._global_backward_pre_hooks:
        return False
    model_cls, layer_cls, attention_cls, mlp_cls, norm_cls = classes
    linear = torch.nn.Linear
    inner = model._modules.get("model")
    if not (_untouched(inner, model_cls) and type(inner._modules.get("embed_tokens")) is torch.nn.Embedding
            and _untouched(inner._modules.get("norm"), norm_cls)
            and _untouched(model._modules.get("lm_head"), linear, _narrow_forward)):
        return False
    layers = inner._modules.get("layers")
    count = model.config.num_hidden_layers
    if not isinstance(layers, torch.nn.ModuleList) or len(layers) < count:
        return False
    for layer in list(layers._modules.values())[:count]:
        if not _untouched(layer, layer_cls):
            return False
        children = layer._modules
        attention, mlp = children.get("self_attn"), children.get("mlp")
        if not (_untouched(attention, attention_cls) and _untouched(mlp, mlp_cls)
                and _untouched(children.get("input_layernorm"), norm_cls)
                and _untouched(children.get("post_attention_layernorm"), norm_cls)):
            return False
        for parent, names in ((attention, _ATTENTION_LINEARS), (mlp, _MLP_LINEARS)):
            for name in names:
                if not _untouched(parent._modules.get(name), linear, _narrow_forward):
                    return False
    return True


def runs_llama_forward(model, attention_mask) -> bool:
    """Whether :func:`llama_forward` computes ``model``'s forward here (see the module docstring)."""
    if type(model) not in _family_classes() or model.training or not isinstance(attention_mask, torch.Tensor):
        return False
    inner = getattr(model, "model", None)
    weight = getattr(getattr(inner, "embed_tokens", None), "weight", None)
    layers = getattr(inner, "layers", None)
    if not isinstance(weight, torch.Tensor) or weight.device.type != "cpu" or weight.dtype != torch.float32 \
            or not layers:
        return False
    return (getattr(model.config, "_attn_implementation", None) == "sdpa"
            and getattr(getattr(layers[0], "self_attn", None), "config", model.config)._attn_implementation == "sdpa"
            and _plain_family_model(model))


def llama_forward(model, tokens: torch.Tensor, position_ids: torch.Tensor, cache, attention_mask: torch.Tensor,
                  logits_to_keep: torch.Tensor | None = None, narrow: bool = False,
                  blas_rows=frozenset()) -> torch.Tensor:
    """transformers' forward of a Llama-family ``model`` (``runs_llama_forward``), returning its logits.

    Parameters
    ----------
    tokens : int64 [B, Q]
    position_ids : int64 [B, Q]
    cache : what the model would take as its cache: ``update(key [B, Hk, Q, D], value, layer_idx) -> (keys, values)``
        of every slot the window attends (``KVWindow``)
    attention_mask : [B or 1, 1, Q, L] additive (or bool) mask over those slots
    logits_to_keep : int64 [B] or None: as transformers' ``logits_to_keep`` tensor (positions kept for every request)
    narrow, blas_rows : the products run ``narrow_linear(x, W, b, blas_rows)`` where it applies, as the layers do
        inside ``narrow_linears`` (else ``F.linear``)

    Returns
    -------
    logits [B, Q, V] (or [B, len(logits_to_keep), V]) in the model's dtype.
    """
    from .forward import narrow_project

    def project(x, layer):
        return narrow_project(x, layer, blas_rows) if narrow else F.linear(x, layer.weight, layer.bias)

    inner = model.model
    batch, width = tokens.shape
    hidden = inner.embed_tokens(tokens)
    cos, sin = inner.rotary_emb(hidden, position_ids=position_ids)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    for layer in inner.layers[:model.config.num_hidden_layers]:
        attention, mlp = layer.self_attn, layer.mlp
        x = _rms_norm(hidden, layer.input_layernorm)
        shape = (batch, width, -1, attention.head_dim)
        query = project(x, attention.q_proj).view(shape).transpose(1, 2)
        key = project(x, attention.k_proj).view(shape).transpose(1, 2)
        value = project(x, attention.v_proj).view(shape).transpose(1, 2)
        query = query * cos + _rotate_half(query) * sin
        key = key * cos + _rotate_half(key) * sin
        key, value = cache.update(key, value, attention.layer_idx)
        out = _sdpa(query, key, value, attention_mask, attention.scaling, attention.num_key_value_groups)
        hidden = hidden + project(out.reshape(batch, width, -1), attention.o_proj)
        x = _rms_norm(hidden, layer.post_attention_layernorm)
        hidden = hidden + project(mlp.act_fn(project(x, mlp.gate_proj)) * project(x, mlp.up_proj), mlp.down_proj)
    hidden = _rms_norm(hidden, inner.norm)
    if logits_to_keep is not None:
        hidden = hidden[:, logits_to_keep, :]
    return project(hidden, model.lm_head)


def _rms_norm(x: torch.Tensor, norm) -> torch.Tensor:
    """transformers' LlamaRMSNorm (float32 input)."""
    variance = x.pow(2).mean(-1, keepdim=True)
    return norm.weight * (x * torch.rsqrt(variance + norm.variance_epsilon))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _sdpa(query, key, value, mask, scaling, groups: int) -> torch.Tensor:
    """Attention as transformers' ``"sdpa"`` runs it under a mask (the loop's grouped path for several queries over
    grouped KV heads: hf_attention.grouped_sdpa_attention): query [B, Hq, Q, D], key / value [B, Hk, L, D] ->
    [B, Q, Hq, D]."""
    batch, heads, width, dim = query.shape
    if groups > 1 and width == 1:       # one query: its heads regrouped onto the KV heads (transformers' pack_gqa)
        out = F.scaled_dot_product_attention(query.reshape(batch, heads // groups, groups, dim), key, value,
                                             attn_mask=mask, scale=scaling)
        out = out.reshape(batch, heads, 1, value.shape[-1])
    elif groups > 1:
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling, enable_gqa=True)
    else:
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling)
    return out.transpose(1, 2).contiguous()
