"""A KV cache for Hugging Face models with per-request lengths.

One preallocated ``[B, H, S, D]`` K and V buffer per layer. Request b has
``seq_lens[b]`` committed entries; a forward over a window of Q tokens writes
their K/V at slots ``seq_lens[b] .. seq_lens[b] + Q - 1`` (whatever a request's
real window length, the rest is padding) and attends to the buffer through an
explicit 4-D additive mask, so a ragged batch advances by different amounts per
step. After verification ``kv_commit`` moves the accepted entries into place
and advances ``seq_lens``; rejected entries are left behind and overwritten by
the next window.

The object duck-types the part of ``transformers.Cache`` attention layers use
(``update``), which works with transformers 5.x Llama-style models.
"""

from __future__ import annotations

import inspect

import torch


class RaggedKVCache:
    """Per-layer K/V buffers ``[B, H, S, D]`` plus ``seq_lens`` (int32 [B], committed entries)."""

    is_compileable = False

    def __init__(self, model, batch: int, capacity: int, device, dtype):
        cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        shape = (batch, heads, capacity, head_dim)
        # zeros, not empty: masked keys still enter the softmax-weighted sum as 0 * value
        self.keys = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.num_hidden_layers)]
        self.values = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.num_hidden_layers)]
        self.seq_lens = torch.zeros(batch, dtype=torch.int32, device=device)
        self.capacity = capacity
        self._rows = self._slots = None
        self._kv_len = 0

    # -- the window of the next forward ------------------------------------------------------------------

    def set_window(self, width: int) -> int:
        """Prepare a forward over `width` tokens per request; returns kv_len (keys the forward sees)."""
        batch = self.seq_lens.shape[0]
        base = self.seq_lens.long()
        self._slots = base[:, None] + torch.arange(width, device=base.device)
        self._rows = torch.arange(batch, device=base.device)[:, None].expand(batch, width)
        self._kv_len = int(base.max()) + width if batch else width
        if self._kv_len > self.capacity:
            raise RuntimeError(f"KV cache overflow: need {self._kv_len} slots, capacity {self.capacity}")
        return self._kv_len

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        k, v = self.keys[layer_idx], self.values[layer_idx]
        k[self._rows, :, self._slots] = key_states.transpose(1, 2).to(k.dtype)
        v[self._rows, :, self._slots] = value_states.transpose(1, 2).to(v.dtype)
        return k[:, :, :self._kv_len], v[:, :, :self._kv_len]

    # -- HF Cache API bits some models query ---------------------------------------------------------------

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return int(self.seq_lens.max()) if self.seq_lens.numel() else 0

    def __len__(self):
        return len(self.keys)

    # -- bookkeeping ----------------------------------------------------------------------------------------

    def commit_views(self) -> list[torch.Tensor]:
        """Every layer's K and V as ``[B, S, H, D]`` views, the layout kv_commit takes."""
        return [t.transpose(1, 2) for t in (*self.keys, *self.values)]

    def keep(self, rows: torch.Tensor) -> None:
        """Keep only the requests in `rows` (finished requests stop costing work)."""
        self.keys = [t.index_select(0, rows) for t in self.keys]
        self.values = [t.index_select(0, rows) for t in self.values]
        self.seq_lens = self.seq_lens.index_select(0, rows)


def cache_kwarg(model) -> str:
    """The keyword a model's forward takes its cache under (``cache`` in transformers >= 5.2x, else past_key_values)."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def accepts_logits_to_keep(model) -> bool:
    """Whether the model's forward can project only some positions onto the vocabulary (``logits_to_keep``)."""
    return "logits_to_keep" in inspect.signature(model.forward).parameters


# Above this many logit elements (B x B rows of V) keeping B positions for every request through
# ``logits_to_keep`` costs more than projecting every position.
_KEEP_LIMIT = 1 << 26


def forward(model, cache: RaggedKVCache, input_ids, position_ids, bias, logits_at=None,
            **attention_kwargs) -> torch.Tensor:
    """One forward of `model` over ``input_ids [B, Q]`` at ``position_ids [B, Q]`` with an additive
    ``bias [B, 1, Q, kv_len]``, writing the window's K/V into `cache`.

    Returns float32 logits ``[B, Q, V]``, or with ``logits_at`` (int64 [B]: one window offset per request)
    only those rows, ``[B, V]``: the model then projects just the needed positions onto the vocabulary
    when it takes ``logits_to_keep`` (a prefill over a long prompt needs one row, not Q)."""
    kwargs = {cache_kwarg(model): cache, **attention_kwargs}
    batch = input_ids.shape[0]
    # logits_to_keep keeps the same positions for every request: keep all B of them (fixed shape, no host
    # sync) and take request b's own row b -- unless B x B rows cost more than projecting every position
    kept = (logits_at is not None and accepts_logits_to_keep(model)
            and batch * batch * vocab_size(model) <= _KEEP_LIMIT)
    if kept:
        kwargs["logits_to_keep"] = logits_at
    out = model(input_ids=input_ids, position_ids=position_ids, attention_mask=bias, use_cache=True, **kwargs)
    logits = out.logits
    if logits_at is None:
        return logits.float()
    rows = torch.arange(batch, device=logits.device)
    return logits[rows, rows if kept else logits_at].float()


def vocab_size(model) -> int:
    """Rows of the model's output projection (its config's vocab_size when it has none)."""
    emb = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if emb is not None and getattr(emb, "weight", None) is not None:
        return int(emb.weight.shape[0])
    return int(model.config.vocab_size)
