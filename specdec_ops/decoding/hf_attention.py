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
"""

from __future__ import annotations

import torch

NAME = "specdec_tree"


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


def register() -> None:
    """Register ``"specdec_tree"`` with transformers' attention and mask interfaces (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, specdec_tree_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
