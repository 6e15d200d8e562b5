"""Hugging Face integration: the ``"specdec_tree"`` attention implementation (registered explicitly).

:func:`register` adds :func:`specdec_tree_attention` to transformers'
``AttentionInterface`` (and an SDPA-style mask function to ``AttentionMaskInterface``)
under the name ``"specdec_tree"``. A Llama / Qwen / Mistral model loaded or switched
with ``attn_implementation="specdec_tree"`` then behaves like ``"sdpa"`` for ordinary
forwards (prefill, decode), and verifies a draft tree when the forward gets the tree
as keyword arguments::

    specdec_ops.register_hf_attention()               # or specdec_ops.decoding.hf_attention.register()
    model.set_attn_implementation("specdec_tree")   # or from_pretrained(..., attn_implementation=...)
    info = specdec_ops.build_tree(parents, num_nodes)
    out = model(tree_input_ids,                       # [B, N]: node tokens (node 0 = last committed token)
                position_ids=prefix_lens[:, None] + info.depth.clamp(min=0),
                past_key_values=cache,                # holds prefix_lens[b] tokens (same for all b in a DynamicCache)
                tree_mask=info.mask, prefix_lens=prefix_lens)

With ``tree_mask`` given, every attention layer runs :func:`specdec_ops.tree_attention`
on CUDA tensors (the Triton kernel, over the HF cache viewed as ``[B, S, H, D]``
without a copy); on CPU it falls back to SDPA with :func:`specdec_ops.tree_attention_bias`
(pass ``tree_attention_backend="cpu" | "triton" | "reference"`` to force the kernel
path). The HF cache must hold exactly the prefix then the tree: key slot
``prefix_lens[b] + t`` is node t.

The decode loop's own CPU forwards use a second function, :func:`grouped_sdpa_attention` (see
:func:`grouped_sdpa`): transformers' ``"sdpa"`` with grouped KV heads attended as they are.
"""

from __future__ import annotations

import contextlib
import threading
import weakref

import torch
import torch.nn.functional as F

NAME = "specdec_tree"
GROUPED_SDPA = "specdec_grouped_sdpa"   # grouped_sdpa_attention's name in transformers' interfaces


def specdec_tree_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                           attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                           **kwargs) -> tuple[torch.Tensor, None]:
    """An ``AttentionInterface`` function (the signature of transformers' ``sdpa_attention_forward``).

    query [B, Hq, N, D], key / value [B, Hk, L, D] (the cache after appending the tree);
    returns ``(out [B, N, Hq, D], None)``. Tree keyword arguments: ``tree_mask`` (int64
    [B, N, ceil(N/64)] from build_tree), ``prefix_lens`` (int [B]), optionally
    ``tree_attention_backend``. Without ``tree_mask`` it is SDPA. A sliding-window layer
    (transformers passes ``sliding_window``) whose keys outnumber the window runs SDPA over the tree's
    bias with the window applied, as the kernel has no window.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    tree_mask = kwargs.pop("tree_mask", None)
    prefix_lens = kwargs.pop("prefix_lens", None)
    backend = kwargs.pop("tree_attention_backend", None)
    if tree_mask is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    from specdec_ops import tree_attention, tree_attention_bias

    if prefix_lens is None:
        raise ValueError("specdec_tree attention: tree_mask needs prefix_lens (int [B]) too")
    window = kwargs.get("sliding_window")
    if window is not None and key.shape[2] > window:
        # a sliding-window layer whose keys may lie beyond a node's window: the kernel has no window, so SDPA
        # over the tree's bias with the window applied (node t at position prefix_lens + its depth)
        from .forward import sliding_window_bias
        bias = tree_attention_bias(tree_mask, prefix_lens, key.shape[2], dtype=query.dtype)
        bias = sliding_window_bias(bias, prefix_lens, tree_depths(tree_mask), key.shape[2], int(window))
        kwargs.pop("is_causal", None)
        return sdpa_attention_forward(module, query, key, value, bias, dropout=dropout, scaling=scaling,
                                      is_causal=False, **kwargs)
    if query.device.type == "cuda" or backend is not None:
        out = tree_attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), prefix_lens,
                             tree_mask, sm_scale=scaling, backend=backend)
        return out, None
    bias = tree_attention_bias(tree_mask, prefix_lens, key.shape[2], dtype=query.dtype)
    kwargs.pop("is_causal", None)
    return sdpa_attention_forward(module, query, key, value, bias, dropout=dropout, scaling=scaling,
                                  is_causal=False, **kwargs)


def tree_depths(tree_mask: torch.Tensor) -> torch.Tensor:
    """int64 [B, N] depths of a build_tree mask [B, N, W]: a row's set bits (the node and its ancestors) less
    one; -1 for padding rows (no bit set)."""
    bits = (tree_mask.unsqueeze(-1) >> torch.arange(64, device=tree_mask.device)) & 1
    return bits.sum((-1, -2)) - 1


class _GroupedState(threading.local):
    depth = 0  # grouped_sdpa contexts open on this thread


_GROUPED = _GroupedState()
_GROUPED_LOCK = threading.Lock()
# id(model) -> (grouped_sdpa contexts open on it on any thread, the configs switched to GROUPED_SDPA)
_GROUPED_OPEN: dict[int, tuple[int, list]] = {}
_GROUPED_CONFIGS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # model -> _grouped_configs(model)


def grouped_sdpa_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                           attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                           **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' ``"sdpa"`` attention, except on a thread inside :func:`grouped_sdpa` for a CPU window of
    several queries under a mask over grouped KV heads (``module.num_key_value_groups > 1``): one
    ``scaled_dot_product_attention(..., enable_gqa=True)`` over the KV heads as they are.

    query [B, Hq, N, D], key / value [B, Hk, L, D], attention_mask [B or 1, 1, N, L] (additive or bool);
    returns ``(out [B, N, Hq, D], None)``, query head h attending KV head ``h // (Hq // Hk)`` as in transformers.
    transformers' sdpa copies every K and V head ``Hq // Hk`` times (``repeat_kv``) whenever it is given a mask
    and more than one query: the whole cache, every layer, every verify forward. SmolLM2-135M (9 query heads on 3
    KV heads, one thread, per layer): 94 us against 27 over 200 keys and 2 queries, 388 against 74 over 600 keys.
    Everything else (one query, no mask, other devices, softcap, position bias) is transformers' sdpa unchanged.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    if (_GROUPED.depth and groups > 1 and query.device.type == "cpu" and query.shape[2] > 1
            and isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 4
            and key.shape[1] * groups == query.shape[1] and kwargs.get("softcap") is None
            and kwargs.get("position_bias") is None and not kwargs.get("output_attentions", False)):
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                             scale=scaling, is_causal=False, enable_gqa=True)
        return out.transpose(1, 2).contiguous(), None
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  **kwargs)


def _grouped_configs(model: torch.nn.Module) -> list:
    """The configs of ``model``'s attention layers with grouped KV heads that hold no sub-configs (switching
    one then switches nothing else), found once per model."""
    configs = _GROUPED_CONFIGS.get(model)
    if configs is None:
        found = {}
        for module in model.modules():
            config = getattr(module, "config", None)
            if (getattr(module, "num_key_value_groups", 1) > 1 and config is not None
                    and hasattr(config, "_attn_implementation") and not getattr(config, "sub_configs", None)):
                found[id(config)] = config
        configs = _GROUPED_CONFIGS[model] = list(found.values())
    return configs


@contextlib.contextmanager
def grouped_sdpa(model: torch.nn.Module):
    """Inside it, on this thread, ``model``'s attention layers that run transformers' ``"sdpa"`` over grouped
    KV heads attend as :func:`grouped_sdpa_attention` does: a CPU window of several queries under a mask
    without copying the K/V heads. The decode loop opens it around its CPU forwards of more than one token.

    While any thread has it open on the model, those layers' configs name ``GROUPED_SDPA`` (registered with
    transformers' attention and mask interfaces on first use, the mask function being sdpa's) and are switched
    back to ``"sdpa"`` when the last context on the model closes (a count per model, under a lock); another
    thread's forwards meanwhile run transformers' sdpa exactly (the function defers to it outside a context).
    """
    from .forward import patched_while_open

    with patched_while_open(model, _GROUPED_LOCK, _GROUPED_OPEN, _switch_grouped, _switch_back):
        _GROUPED.depth += 1
        try:
            yield
        finally:
            _GROUPED.depth -= 1


def _switch_grouped(model: torch.nn.Module) -> list:
    switched = [c for c in _grouped_configs(model) if c._attn_implementation == "sdpa"]
    if switched:
        _register_grouped()
    for config in switched:
        config._attn_implementation = GROUPED_SDPA
    return switched


def _switch_back(switched: list) -> None:
    for config in switched:
        if getattr(config, "_attn_implementation", None) == GROUPED_SDPA:
            config._attn_implementation = "sdpa"


def _register_grouped() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(GROUPED_SDPA, grouped_sdpa_attention)
    AttentionMaskInterface.register(GROUPED_SDPA, sdpa_mask)


def register() -> None:
    """Register ``"specdec_tree"`` with transformers' attention and mask interfaces (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, specdec_tree_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
