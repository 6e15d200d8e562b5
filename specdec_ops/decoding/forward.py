"""The model forward of the decode loop and the drafters: a window of tree nodes over a ragged KV cache.

One preallocated ``[B, H, S, D]`` K and V buffer per layer (``RaggedKVCache``); request b has
``seq_lens[b]`` committed entries. ``forward`` runs a model over a window of Q tokens per request whose
K/V go to slots ``start[b] .. start[b] + Q - 1`` (``start`` is usually ``seq_lens``; a drafter may place a
window elsewhere without touching ``seq_lens``), at positions ``start + depth``, attending through the
additive mask of ``tree_attention_bias``. The window is a per-call view (``KVWindow``) handed to the model
as its cache: the cache object itself holds no per-forward state. After verification ``kv_commit`` moves
the accepted entries into place and advances ``seq_lens``. The loop and its drafters also know every
length on the host (``Batch.host_lengths``) and pass the window's slot range (``start_range``), so that a
forward reads nothing back from the device.

The view duck-types the part of ``transformers.Cache`` attention layers use (``update``), which works
with transformers 5.x Llama-style models.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
import types
import weakref

import torch
import torch.nn.functional as F

import specdec_ops as ops
from .hf_attention import grouped_sdpa
from .llama import llama_forward, runs_llama_forward

TREE_ATTENTION = "specdec_tree"  # the attention implementation of decoding/hf_attention.py


class RaggedKVCache:
    """Per-layer K/V buffers ``[B, H, S, D]`` plus ``seq_lens`` (int32 [B], committed entries)."""

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

    def commit_views(self) -> list[torch.Tensor]:
        """Every layer's K and V as ``[B, S, H, D]`` views, the layout kv_commit takes."""
        return [t.transpose(1, 2) for t in (*self.keys, *self.values)]

    def grow(self, capacity: int) -> None:
        """At least ``capacity`` slots per request (the committed entries stay where they are)."""
        if capacity <= self.capacity:
            return
        pad = capacity - self.capacity
        self.keys = [torch.nn.functional.pad(t, (0, 0, 0, pad)) for t in self.keys]
        self.values = [torch.nn.functional.pad(t, (0, 0, 0, pad)) for t in self.values]
        self.capacity = capacity

    def keep(self, rows: torch.Tensor) -> None:
        """Keep only the requests in `rows` (finished requests stop costing work)."""
        self.keys = [t.index_select(0, rows) for t in self.keys]
        self.values = [t.index_select(0, rows) for t in self.values]
        self.seq_lens = self.seq_lens.index_select(0, rows)


class KVWindow:
    """One forward's view of a RaggedKVCache: writes the window's K/V at ``slots [B, Q]`` and returns the
    first ``kv_len`` slots of every layer. ``uniform_start``: the window's first slot when it is the same
    for every request (batch 1 always): the writes are then one slice copy per tensor instead of an
    index_put."""

    is_compileable = False

    def __init__(self, cache: RaggedKVCache, slots: torch.Tensor, kv_len: int, uniform_start: int | None = None):
        self.cache, self.slots, self.kv_len, self.uniform_start = cache, slots, kv_len, uniform_start
        # request index of every window slot, for the general path's index_put only
        self.rows = None if uniform_start is not None else \
            torch.arange(slots.shape[0], device=slots.device)[:, None].expand_as(slots)

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        k, v = self.cache.keys[layer_idx], self.cache.values[layer_idx]
        if self.uniform_start is not None:
            window = slice(self.uniform_start, self.uniform_start + self.slots.shape[1])
            k[:, :, window] = key_states
            v[:, :, window] = value_states
        else:
            k[self.rows, :, self.slots] = key_states.transpose(1, 2).to(k.dtype)
            v[self.rows, :, self.slots] = value_states.transpose(1, 2).to(v.dtype)
        return k[:, :, :self.kv_len], v[:, :, :self.kv_len]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.kv_len - self.slots.shape[1]

    def __len__(self):
        return len(self.cache.keys)


def forward(model, cache: RaggedKVCache, tokens: torch.Tensor, start: torch.Tensor, depth: torch.Tensor,
            mask: torch.Tensor, logits_at: torch.Tensor | None = None,
            tree_attention_backend: str | None = None, start_range: tuple[int, int] | None = None) -> torch.Tensor:
    """One forward of ``model`` over a window of tree nodes.

    A Llama, Mistral or Qwen2 model on the CPU runs through the loop's own forward where that computes its
    logits bit for bit (``decoding.llama``: float32, ``"sdpa"``, exactly transformers' classes, no hooks);
    any other model runs itself, with grouped KV heads attended without copies (``hf_attention.grouped_sdpa``).

    Parameters
    ----------
    tokens : int64 [B, Q]: node tokens (padding anywhere its mask row hides it from real nodes)
    start : int [B]: slot of window entry 0; entry i goes to slot ``start[b] + i``, keys below ``start[b]``
        are the committed prefix every node sees
    depth, mask : from ``build_tree`` (or ``chain_tree``): positions are ``start + depth``
    logits_at : int64 [B] or None: keep only window offset ``logits_at[b]`` per request
    tree_attention_backend : with a model switched to the ``"specdec_tree"`` attention, the backend its
        layers pass to ``tree_attention`` (None: the kernel on CUDA, SDPA over the bias elsewhere)
    start_range : ``(min(start), max(start))`` as host ints, when the caller keeps the lengths on the host
        (the decode loop and its drafters do): the window's size then needs no device read. None: read from
        ``start`` (one host synchronization on a GPU). A wrong range places keys wrongly: pass the exact one.

    Returns
    -------
    float32 logits ``[B, Q, V]``, or ``[B, V]`` with ``logits_at``.
    """
    batch, width = tokens.shape
    start = start.long()
    slots = start[:, None] + torch.arange(width, device=tokens.device)
    lowest, highest = _start_range(start, start_range)
    kv_len = highest + width
    if kv_len > cache.capacity:
        raise RuntimeError(f"KV cache overflow: need {kv_len} slots, capacity {cache.capacity}")
    dtype = next(model.parameters()).dtype
    uniform = lowest if lowest == highest and lowest >= 0 else None
    kwargs = {_cache_kwarg(type(model)): KVWindow(cache, slots, kv_len, uniform)}
    if getattr(model.config, "_attn_implementation", None) == TREE_ATTENTION:
        kwargs.update(tree_mask=mask.contiguous(), prefix_lens=start)
        if tree_attention_backend is not None:
            kwargs["tree_attention_backend"] = tree_attention_backend
    # logits_to_keep keeps the same positions for every request: keep all B of them (fixed shape, no host
    # sync) and take request b's own row b -- unless B x B rows cost more than projecting every position
    kept = (logits_at is not None and _accepts_logits_to_keep(type(model))
            and batch * batch * vocab_size(model) <= _KEEP_LIMIT)
    if kept:
        kwargs["logits_to_keep"] = logits_at
    bias = attention_bias(mask, start, kv_len, dtype, uniform)
    window, every_layer = sliding_window_layout(model)
    if window is not None and highest + width - 1 >= window:   # some key lies beyond some node's window
        windowed = sliding_window_bias(bias, start, depth, kv_len, window)
        if every_layer:
            bias = windowed
        elif _takes_mask_mapping(type(model)):
            bias = {"full_attention": bias, "sliding_attention": windowed}
        else:
            raise ops.SpecDecArgumentError(
                f"{type(model).__name__} mixes sliding-window and full-attention layers, and its forward takes no "
                "mask per layer type (a dict attention_mask): its sliding windows cannot be applied")
        # the tree kernel has no sliding window: the layers attend through the masks (SDPA) instead
        kwargs.pop("tree_mask", None)
        kwargs.pop("prefix_lens", None)
        kwargs.pop("tree_attention_backend", None)
    # (a window whose rows the model's LinearChoice keeps on F.linear runs its products through F.linear: the model
    # without narrow_linears and its Python call per layer, or llama_forward without narrow_linear)
    narrow = (tokens.device.type == "cpu" and dtype == torch.float32 and 1 <= batch * width <= narrow_rows()
              and batch * width not in linear_choice(model).blas_rows)
    positions = start[:, None] + depth.long()
    if runs_llama_forward(model, bias):     # transformers' Llama computation without its module calls (CPU)
        logits = llama_forward(model, tokens, positions, kwargs[_cache_kwarg(type(model))], bias,
                               logits_at if kept else None, narrow, linear_choice(model).blas_rows)
    else:
        # several queries under a mask: grouped KV heads attended as they are (transformers' sdpa would copy them)
        grouped = tokens.device.type == "cpu" and width > 1
        with narrow_linears(model) if narrow else contextlib.nullcontext(), \
                grouped_sdpa(model) if grouped else contextlib.nullcontext():
            logits = model(input_ids=tokens, position_ids=positions, attention_mask=bias, use_cache=True,
                           **kwargs).logits
    if logits_at is None:
        return logits.float()
    rows = torch.arange(batch, device=logits.device)
    return logits[rows, rows if kept else logits_at].float()


def _start_range(start: torch.Tensor, given: tuple[int, int] | None) -> tuple[int, int]:
    """(min, max) of ``start`` on the host: ``given``, else one device read ((0, 0) for an empty batch)."""
    if given is not None:
        return given
    return tuple(torch.stack(torch.aminmax(start)).tolist()) if start.numel() else (0, 0)


def attention_bias(mask: torch.Tensor, start: torch.Tensor, kv_len: int, dtype: torch.dtype,
                   uniform_start: int | None = None) -> torch.Tensor:
    """``tree_attention_bias(mask, start, kv_len, dtype=dtype)``; a window of one node per request after
    the same prefix for every request (``uniform_start``) sees every key, itself included: zeros."""
    if mask.shape[1] == 1 and uniform_start is not None:
        return torch.zeros(mask.shape[0], 1, 1, kv_len, device=mask.device, dtype=dtype)
    return ops.tree_attention_bias(mask, start, kv_len, dtype=dtype)


def sliding_window_layout(model) -> tuple[int | None, bool]:
    """(window, every layer slides) of a Hugging Face model: (None, False) when no layer has a sliding window.

    As transformers reads its configs: ``layer_types`` names each layer ``"full_attention"`` or
    ``"sliding_attention"`` (Gemma2/3, Qwen2/3, ...); without it, a ``sliding_window`` applies to every layer
    (Mistral, Mixtral, Phi-3, Starcoder2) unless ``use_sliding_window`` is False. A query at position p sees
    the keys at positions > p - window (transformers' ``sliding_window_overlay``).
    """
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    window = getattr(cfg, "sliding_window", None)
    types = getattr(cfg, "layer_types", None)
    if types is not None:
        unknown = set(types) - {"full_attention", "sliding_attention"}
        if unknown:
            raise ops.SpecDecArgumentError(f"{type(model).__name__}: attention layers of type {sorted(unknown)} are "
                                           "not supported by the decode loop (full and sliding-window attention are)")
        if window is None or "sliding_attention" not in types:
            return None, False
        return int(window), all(t == "sliding_attention" for t in types)
    if window is None or not getattr(cfg, "use_sliding_window", True):
        return None, False
    return int(window), True


def sliding_window_bias(bias: torch.Tensor, start: torch.Tensor, depth: torch.Tensor, kv_len: int,
                        window: int) -> torch.Tensor:
    """``bias`` [B, 1, Q, kv_len] with every key at or beyond ``window`` positions behind its query hidden.

    Positions: a committed slot s < start[b] holds position s; window slot start[b] + i holds node i at
    position start[b] + depth[b, i], and so does the query of node i. A node always sees itself.
    """
    batch, width = depth.shape
    dev = bias.device
    start = start.long()
    node_pos = start[:, None] + depth.long().clamp(min=0)                   # [B, Q]
    slots = torch.arange(kv_len, device=dev)
    offset = slots[None, :] - start[:, None]                                # [B, kv_len]
    in_window = (offset >= 0) & (offset < width)
    key_pos = torch.where(in_window, torch.gather(node_pos, 1, offset.clamp(0, width - 1)), slots[None, :])
    far = node_pos[:, :, None] - key_pos[:, None, :] >= window              # [B, Q, kv_len]
    return bias.masked_fill(far[:, None], float("-inf"))


@functools.lru_cache(maxsize=None)
def _takes_mask_mapping(model_type) -> bool:
    """Whether a model's forward takes one attention mask per layer type (transformers' ``causal_mask_mapping``:
    a dict ``{"full_attention": ..., "sliding_attention": ...}``), read from its modules' source."""
    for cls in model_type.__mro__:
        forward_fn = cls.__dict__.get("forward")
        if forward_fn is not None and "causal_mask_mapping" in _source(forward_fn):
            return True
    module = inspect.getmodule(model_type)
    return module is not None and "causal_mask_mapping" in _source(module)


def _source(obj) -> str:
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return ""


# Above this many logit elements (B x B rows of V) keeping B positions for every request through
# ``logits_to_keep`` costs more than projecting every position.
_KEEP_LIMIT = 1 << 26


# CPU forwards over at most narrow_rows() rows (batch x window) run their linear layers through narrow_linear
# (narrow_linears): with the package's kernel (specdec_ops.linear.skinny_linear, on CPUs with AVX2 or AVX-512, with
# one torch thread: _skinny_here) up to SKINNY_ROWS rows, except at the row counts where the model's LinearChoice
# keeps F.linear (measure_forward_cost times both over 1-4 rows), else up to NARROW_ROWS rows as ``W @ x^T`` with
# the rows as columns, one row padded to two. Measured on SmolLM2-135M's 211 weight matrices (30 layers and the
# output projection, float32, one thread, weights streamed from memory; ms, F.linear / W @ x^T / skinny_linear;
# bench/bench_forward_cost.py --products):
# - an AMD EPYC with AVX-512 (before the kernel's broadcast tiles): 1 row 46.6 / 32.8 (padded) / 26.4, 2: 74.6 /
#   31.8 / 32.9, 3: 93.8 / 52.7 / 40.2, 8: 74.4 / 81.1 / 55.5, 16: 95.1 / 106.9 / 83.9, 32: 138.6 / 155.1 / 142.7;
# - an Intel Xeon with AVX-512 (2026-12-07, bench/forward_cost.json): 1 row 43.8 / 109.7 / 42.9, 2: 44.9 / 105.8 /
#   48.8, 3: 47.7 / 104.3 / 50.7, 8: 98.6 / 97.9 / 56.1, 16: 105.8 / 97.6 / 71.2, 32: 116.1 / 125.6 / 103.4.
# Where the BLAS multiplies few rows slowly (the EPYC's) the kernel wins from one row on; where it streams 1-3 rows
# at the memory bound (the Xeon's MKL) it is as fast there, and the kernel wins from 4 rows on. The kernel runs up
# to 32 rows on both: a verify forward's cost then has no step where the product changes hands inside the cost
# model's table (measured at 16 and 32 tokens, interpolated between).
SKINNY_ROWS = 32
NARROW_ROWS = 5
_NARROW_PAD = {1: 2}  # rows -> columns multiplied (the padding columns are zeros; their outputs are dropped)


@functools.cache
def _skinny_kernel() -> bool:
    """Whether skinny_linear runs vectorized here (AVX2 or AVX-512): its scalar path is no faster than
    the BLAS."""
    from specdec_ops.linear import skinny_linear_isa
    return skinny_linear_isa() in ("avx2", "avx512")


def _skinny_here() -> bool:
    """Whether narrow_linear runs skinny_linear now: it is vectorized on this CPU and torch runs one intra-op
    thread. The kernel runs on one thread (the package's CPU kernels are compiled without OpenMP, so
    at::parallel_for runs their range serially); with two threads the BLAS's own parallel ``W @ x^T`` is
    faster (SmolLM2-135M's products over 1 / 2 / 3 / 4 rows, 2 threads, ms: 23-33 / 20 / 28-31 / 29-31
    against the kernel's 28.5 / 34.2 / 40.7 / 45.5)."""
    return _skinny_kernel() and torch.get_num_threads() == 1


def narrow_rows() -> int:
    """The most rows (batch x window) a CPU forward runs through narrow_linear: SKINNY_ROWS where the
    skinny_linear kernel runs (vectorized, one torch thread), else NARROW_ROWS."""
    return SKINNY_ROWS if _skinny_here() else NARROW_ROWS


class LinearChoice:
    """Per model: the row counts whose products run through ``F.linear`` although the loop's narrow product
    could run them (``blas_rows``, empty by default), one set per narrow regime (``narrow_rows()``: the
    skinny_linear kernel on one torch thread, ``W @ x^T`` on more): ``blas_rows`` reads and writes the set of
    the regime in force. ``measure_forward_cost`` (decoding/setup.py) times both paths at the few rows where a
    CPU's BLAS may be as fast (CALIBRATED_ROWS; with W @ x^T up to NARROW_ROWS) and records the faster here:
    the narrow product's margin there depends on the CPU (and its BLAS) far more than on the model."""

    __slots__ = ("_by_regime",)

    def __init__(self) -> None:
        self._by_regime: dict[int, frozenset[int]] = {}

    @property
    def blas_rows(self) -> frozenset[int]:
        return self._by_regime.get(narrow_rows(), frozenset())

    @blas_rows.setter
    def blas_rows(self, rows) -> None:
        self._by_regime[narrow_rows()] = frozenset(rows)


CALIBRATED_ROWS = (1, 2, 3, 4)  # the rows whose product path measure_forward_cost chooses by timing both
_LINEAR_CHOICES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def linear_choice(model: torch.nn.Module) -> LinearChoice:
    """The model's LinearChoice (created empty on first use)."""
    choice = _LINEAR_CHOICES.get(model)
    if choice is None:
        choice = _LINEAR_CHOICES[model] = LinearChoice()
    return choice


def narrow_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  blas_rows=frozenset()) -> torch.Tensor | None:
    """``F.linear(x, weight, bias)`` for float32 CPU operands of few rows, contiguous, or None for any other input
    (the caller runs F.linear): up to SKINNY_ROWS rows with the skinny_linear kernel where it runs (vectorized, one
    torch thread), else up to NARROW_ROWS rows as ``(W @ x^T)^T`` (+ bias; one row is multiplied as two, the second
    all zeros). Equal to F.linear to rounding: another summation order, as a product over a different number of rows
    already has. A row count in ``blas_rows`` gives None (the caller's F.linear is faster there)."""
    if not (x.dim() and x.device.type == "cpu" and x.dtype == torch.float32 and weight.dtype == torch.float32
            and weight.dim() == 2 and x.shape[-1] == weight.shape[1] and weight.device.type == "cpu"
            and (bias is None or (bias.dtype == torch.float32 and bias.device.type == "cpu"
                                  and bias.shape == weight.shape[:1]))):
        return None
    rows = x.numel() // max(x.shape[-1], 1)
    if rows in blas_rows:
        return None
    if 1 <= rows <= SKINNY_ROWS and _skinny_here():
        return torch.ops.specdec.skinny_linear.default(x, weight, bias, -1)
    if not 1 <= rows <= NARROW_ROWS:
        return None
    flat = x.reshape(rows, x.shape[-1])
    cols = _NARROW_PAD.get(rows, rows)
    if cols > rows:
        flat = torch.cat([flat, flat.new_zeros(cols - rows, flat.shape[1])])
    out = torch.mm(weight, flat.T)
    out = (out[:, :rows] if cols > rows else out).T.contiguous()
    if bias is not None:
        out += bias
    return out.reshape(*x.shape[:-1], weight.shape[0])


class _NarrowState(threading.local):
    depth = 0  # narrow_linears contexts open on this thread
    blas_rows = frozenset()  # the innermost open context's model's LinearChoice.blas_rows


_NARROW = _NarrowState()
_NARROW_LOCK = threading.Lock()
# id(model) -> (narrow_linears contexts open on it on any thread, the layers given _narrow_forward)
_NARROW_OPEN: dict[int, tuple[int, list[torch.nn.Linear]]] = {}
# model -> its nn.Linear layers that have no forward of their own (found once per model)
_NARROW_LAYERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _narrow_forward(layer: torch.nn.Linear, input: torch.Tensor) -> torch.Tensor:
    """An nn.Linear layer's forward while ``narrow_linears`` is open on its model: ``narrow_linear`` on a
    thread inside the context where that applies, else exactly ``F.linear``."""
    if _NARROW.depth:
        return narrow_project(input, layer, _NARROW.blas_rows)
    return F.linear(input, layer.weight, layer.bias)


def narrow_project(x: torch.Tensor, layer: torch.nn.Linear, blas_rows=frozenset()) -> torch.Tensor:
    """A linear layer's product in the loop's narrow forwards: ``narrow_linear`` where it applies, else ``F.linear``
    (``narrow_linears``' layer forward and ``decoding.llama.llama_forward`` both compute it so)."""
    out = narrow_linear(x, layer.weight, layer.bias, blas_rows)
    return F.linear(x, layer.weight, layer.bias) if out is None else out


def _linear_layers(model: torch.nn.Module) -> list[torch.nn.Linear]:
    layers = _NARROW_LAYERS.get(model)
    if layers is None:
        layers = [m for m in model.modules() if type(m) is torch.nn.Linear and "forward" not in m.__dict__]
        _NARROW_LAYERS[model] = layers
    return layers


@contextlib.contextmanager
def narrow_linears(model: torch.nn.Module):
    """Inside it, on this thread, ``model``'s ``nn.Linear`` layers (exactly that class, and without a forward
    of their own such as a hook library installs: others keep theirs) compute ``narrow_linear`` for float32
    CPU inputs of 1 to ``narrow_rows()`` rows, except at the row counts of the model's
    ``linear_choice(model).blas_rows`` (read when the context opens), where they keep ``F.linear``.

    While any thread has the context open on the model, each such layer carries ``_narrow_forward`` as its
    instance ``forward`` (removed when the last context on the model closes: a count per model, under a
    lock); another thread's calls into the model meanwhile run ``F.linear`` exactly. The layers are found
    once per model (a layer added to it later keeps ``F.linear``). Unlike a ``TorchFunctionMode`` (about
    5 ms per forward of SmolLM2-135M: every torch call of the forward crossed into Python), it costs one
    Python call per linear layer.
    """
    with patched_while_open(model, _NARROW_LOCK, _NARROW_OPEN, _install_narrow, _uninstall_narrow):
        _NARROW.depth += 1
        outer_rows, _NARROW.blas_rows = _NARROW.blas_rows, linear_choice(model).blas_rows
        try:
            yield
        finally:
            _NARROW.depth -= 1
            _NARROW.blas_rows = outer_rows


def _install_narrow(model: torch.nn.Module) -> list[torch.nn.Linear]:
    installed = [layer for layer in _linear_layers(model) if "forward" not in layer.__dict__]
    for layer in installed:
        layer.__dict__["forward"] = types.MethodType(_narrow_forward, layer)
    return installed


def _uninstall_narrow(installed: list[torch.nn.Linear]) -> None:
    for layer in installed:
        own = layer.__dict__.get("forward")
        if getattr(own, "__func__", None) is _narrow_forward:
            del layer.__dict__["forward"]


@contextlib.contextmanager
def patched_while_open(model, lock: threading.Lock, table: dict, install, uninstall):
    """A change to ``model`` held while any thread has a context open on it: the first to open (on any thread)
    runs ``install(model)`` and keeps what it returns, the last to close runs ``uninstall(that)``; ``table``
    holds ``id(model) -> (contexts open, that)`` under ``lock`` (``narrow_linears``,
    ``hf_attention.grouped_sdpa``)."""
    key = id(model)
    with lock:
        count, state = table.get(key, (0, None))
        if count == 0:
            state = install(model)
        table[key] = (count + 1, state)
    try:
        yield
    finally:
        with lock:
            count, state = table.pop(key)
            if count > 1:
                table[key] = (count - 1, state)
            else:
                uninstall(state)


@functools.lru_cache(maxsize=None)
def _cache_kwarg(model_type) -> str:
    """The keyword a model's forward takes its cache under (``cache`` in transformers >= 5.2x, else past_key_values)."""
    return "cache" if "cache" in inspect.signature(model_type.forward).parameters else "past_key_values"


@functools.lru_cache(maxsize=None)
def _accepts_logits_to_keep(model_type) -> bool:
    return "logits_to_keep" in inspect.signature(model_type.forward).parameters


def cache_kwarg(model) -> str:
    """The keyword ``model``'s forward takes its cache under."""
    return _cache_kwarg(type(model))


@functools.lru_cache(maxsize=64)
def _chain(width: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    info = ops.build_tree((torch.arange(width, device=device) - 1)[None])
    return info.mask, info.depth


def chain_tree(width: int, batch: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(mask, depth) of ``build_tree`` for a chain of ``width`` nodes, expanded over ``batch`` requests."""
    mask, depth = _chain(width, torch.device(device))
    return mask.expand(batch, *mask.shape[1:]), depth.expand(batch, -1)


def tree_of(parents: torch.Tensor, num_nodes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(mask, depth) for a draft tree: padding nodes (>= num_nodes) hang off the root, so every query row
    sees at least itself."""
    pad = torch.arange(parents.shape[1], device=parents.device) >= num_nodes[:, None]
    pad[:, 0] = False
    info = ops.build_tree(parents.masked_fill(pad, 0))
    return info.mask, info.depth


def check_model(model, name: str) -> None:
    """A Hugging Face causal LM (a torch module with a config), else SpecDecArgumentError naming `name`."""
    if not isinstance(model, torch.nn.Module) or getattr(model, "config", None) is None:
        raise ops.SpecDecArgumentError(f"{name} must be a Hugging Face causal LM (a torch.nn.Module with a "
                                       f"config), got {type(model).__name__}")


def vocab_size(model) -> int:
    """Rows of the model's output projection (its config's vocab_size when it has none)."""
    emb = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if emb is not None and getattr(emb, "weight", None) is not None:
        return int(emb.weight.shape[0])
    return int(model.config.vocab_size)


def model_device(model) -> torch.device:
    return next(model.parameters()).device


def model_dtype(model) -> torch.dtype:
    return next(model.parameters()).dtype
