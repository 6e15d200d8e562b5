"""Tree metadata and tree attention (DESIGN.md §5.4).

Public functions:

- :func:`build_tree`: bit-packed ancestor mask and depths of a draft token tree;
- :func:`paths_to_parents`, :func:`parents_to_paths`, :func:`topk_grid_to_parents`:
  converters from the ways trees are written today (Medusa/EAGLE path tuples,
  EAGLE-2/SGLang top-k x depth candidate grids) to ``parents``;
- :func:`tree_attention_bias`: the additive ``[B, 1, N, kv_len]`` mask for HF / SDPA;
- :func:`tree_attention`: attention of the tree's queries over the committed prefix
  plus the tree, honouring the bitmask inside the kernel (Triton on the GPU, a
  blocked composite on the CPU);
- :func:`merge_attention_states`: exact merge of two partial attentions.

Fake impls for torch.compile, the CPU composites and the Triton launchers live
here too.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import NamedTuple

import torch

from . import _ops, reference
from ._backend import next_pow2, resolve_backend
from ._checks import (INDEX_DTYPES, PROB_DTYPES, check_device, check_dtype, check_rank, check_shape, check_tensor,
                      fail, first_bad)

__all__ = ["TreeInfo", "build_tree", "paths_to_parents", "parents_to_paths", "topk_grid_to_parents",
           "tree_attention_bias", "tree_attention", "merge_attention_states"]

ATTN_DTYPES = PROB_DTYPES  # float32, float16, bfloat16


class TreeInfo(NamedTuple):
    """Result of :func:`build_tree`.

    mask:  int64 [B, N, W], W = ceil(N / 64): bit j % 64 of word j // 64 in row i is set iff
           node j is node i or an ancestor of i (little-endian bits); padding rows are 0.
    depth: int32 [B, N]: root 0, padding nodes -1. Positions for the target forward are
           ``prefix_lens[:, None] + depth``.
    """

    mask: torch.Tensor
    depth: torch.Tensor


@torch.compiler.assume_constant_result
def _resolve(backend: str | None, device: torch.device, op: str, native_op: str | None = None,
             triton_op: str | None = None) -> str:
    """resolve_backend, evaluated once at trace time under torch.compile (it queries the dispatcher)."""
    return resolve_backend(backend, device, op, native_op=native_op, triton_op=triton_op)


def _values_checked_here(device: torch.device) -> bool:
    return device.type == "cpu" and not torch.compiler.is_compiling()


def _mask_words(n: int) -> int:
    return (n + 63) // 64


# ---------------------------------------------------------------------------------------------- build_tree


def _check_parents_values(parents: torch.Tensor, num_nodes: torch.Tensor | None) -> None:
    """CPU: num_nodes in [0, N]; parents[b, 0] == -1 and 0 <= parents[b, i] < i for real nodes."""
    batch, n = parents.shape
    if num_nodes is not None:
        bad = first_bad((num_nodes < 0) | (num_nodes > n))
        if bad is not None:
            fail(f"num_nodes[{bad[0]}] = {int(num_nodes[bad])} is outside [0, N = {n}]")
        real = torch.arange(n) < num_nodes[:, None].long()
    else:
        real = torch.ones(batch, n, dtype=torch.bool)
    idx = torch.arange(n)
    ok = torch.where(idx == 0, parents == -1, (parents >= 0) & (parents < idx))
    bad = first_bad(real & ~ok)
    if bad is not None:
        b, i = bad
        if i == 0:
            fail(f"parents[{b}, 0] = {int(parents[b, 0])} must be -1 (node 0 is the root)")
        fail(f"parents[{b}, {i}] = {int(parents[b, i])} is malformed: the parent of node {i} must satisfy "
             f"0 <= parent < {i}")


def build_tree(parents: torch.Tensor, num_nodes: torch.Tensor | None = None, *,
               backend: str | None = None) -> TreeInfo:
    """Ancestor bitmask and depths of a batch of draft token trees.

    Node 0 is the root (the last committed token); every other node's parent has a
    smaller index, so a parents row is a topological order.

    Parameters
    ----------
    parents : int32 | int64 [B, N]
        ``parents[b, 0] = -1``; ``0 <= parents[b, i] < i`` for real nodes; entries of
        padding nodes (``i >= num_nodes[b]``) are ignored (conventionally -1).
    num_nodes : int32 | int64 [B], optional
        Real nodes per request, in [0, N]; None means N.
    backend : None | "cuda" | "cpu" | "reference"

    Returns
    -------
    TreeInfo(mask int64 [B, N, ceil(N/64)], depth int32 [B, N])
        Bit j % 64 of word j // 64 in row i is set iff node j is i or an ancestor of i.
        Padding nodes have all-zero rows and depth -1.

    On CPU malformed parents (root not -1, a parent not smaller than its node, < -1)
    and num_nodes outside [0, N] raise ValueError naming the argument and element.
    On the GPU (no host sync) a bad parent is treated as the root and num_nodes is
    clamped into [0, N]. One launch, fixed output shapes: CUDA-graph safe.

    Example
    -------
    >>> info = build_tree(torch.tensor([[-1, 0, 0, 1]]))
    >>> info.mask[0, :, 0].tolist(), info.depth[0].tolist()
    ([1, 3, 5, 11], [0, 1, 1, 2])
    """
    check_rank(parents, 2, "parents", "[B, N]")
    check_dtype(parents, INDEX_DTYPES, "parents")
    device = parents.device
    batch = parents.shape[0]
    if num_nodes is not None:
        check_shape(num_nodes, (batch,), "num_nodes", "[B]")
        check_dtype(num_nodes, INDEX_DTYPES, "num_nodes")
        check_device(num_nodes, device, "num_nodes", "parents")
    backend = _resolve(backend, device, "build_tree", "build_tree")
    if backend == "reference":
        if _values_checked_here(device):
            _check_parents_values(parents, num_nodes)
        return TreeInfo(*reference.build_tree(parents, num_nodes))
    return TreeInfo(*torch.ops.specdec.build_tree.default(parents, num_nodes))


# ---------------------------------------------------------------------------------------------- converters


def paths_to_parents(paths: Sequence[Sequence[int]]) -> torch.Tensor:
    """Parents of a tree written as Medusa/EAGLE path tuples.

    Each path is the sequence of child ranks from the root: ``(0,)`` is the root's
    first (top-1) child, ``(0, 1)`` the second child of ``(0,)``, and so on. Nodes are
    numbered root first, then the paths sorted by (length, path) — Medusa's order —
    so parents precede children: node k + 1 is ``sorted_paths[k]``.

    Parameters
    ----------
    paths : sequence of int tuples
        Every proper prefix of a path must itself be a path; no duplicates; ranks >= 0.

    Returns
    -------
    parents : int64 [len(paths) + 1], parents[0] = -1.

    Example
    -------
    >>> paths_to_parents([(0,), (1,), (0, 0)]).tolist()
    [-1, 0, 0, 1]
    """
    ordered = sorted((tuple(int(c) for c in p) for p in paths), key=lambda p: (len(p), p))
    index = {(): 0}
    parents = [-1]
    for k, path in enumerate(ordered):
        if len(path) == 0:
            fail(f"paths[{k}] (sorted) is empty: the root is implicit, list only its descendants")
        if path in index:
            fail(f"paths contains {path} twice")
        if min(path) < 0:
            fail(f"paths entry {path} has a negative child rank")
        if path[:-1] not in index:
            fail(f"paths entry {path} has no parent path {path[:-1]} in paths")
        parents.append(index[path[:-1]])
        index[path] = len(parents) - 1
    return torch.tensor(parents, dtype=torch.int64)


def parents_to_paths(parents: torch.Tensor | Sequence[int]) -> list[tuple[int, ...]]:
    """Inverse of :func:`paths_to_parents`: the path tuple of every non-root node, in node order.

    A node's rank is its position among its parent's children, in index order.
    """
    par = [int(p) for p in (parents.tolist() if isinstance(parents, torch.Tensor) else parents)]
    paths: list[tuple[int, ...]] = [()]
    children = [0] * len(par)
    for i in range(1, len(par)):
        p = par[i]
        if not 0 <= p < i:
            fail(f"parents[{i}] = {p} is malformed: the parent of node {i} must satisfy 0 <= parent < {i}")
        paths.append(paths[p] + (children[p],))
        children[p] += 1
    return paths[1:]


def topk_grid_to_parents(selected: torch.Tensor, beam_indices: torch.Tensor,
                         topk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Parents of a tree chosen from an EAGLE-2 / SGLang top-k x depth candidate grid.

    The drafter runs ``depth`` steps. Step 0 proposes ``topk`` candidates, children of
    the root. Each later step s expands ``topk`` beams, each the best candidates of
    step s - 1, into ``topk`` children: ``topk * topk`` candidates. The flat grid index
    of candidate c of step s is ``c`` for s = 0 and ``topk + (s - 1) * topk**2 + c``
    after, with ``c = r * topk + j`` for child j of beam r. From the grid the drafter
    selects N - 1 candidates (e.g. the best by cumulative score) forming a tree.

    Parameters
    ----------
    selected : int32 | int64 [B, N - 1]
        Flat grid indices of the chosen candidates (any order). The parent candidate of
        every selected one must be selected too (or be the root).
    beam_indices : int32 | int64 [B, depth - 1, topk]
        ``beam_indices[b, s, r]``: the candidate of step s (its index within step s:
        in [0, topk) for s = 0, in [0, topk**2) after) that is beam r of step s + 1.
    topk : int

    Returns
    -------
    (parents int64 [B, N], grid_index int64 [B, N])
        Node 0 is the root (grid_index -1); node i >= 1 is grid candidate
        ``grid_index[b, i]``, nodes ordered by grid index (so parents precede children).
        Feed parents to :func:`build_tree`; gather the draft tokens with grid_index.

    No host sync (sort, gather, searchsorted): usable on the GPU. On CPU a selected
    candidate whose parent is not selected raises ValueError naming ``selected``; on
    the GPU it hangs off the root.
    """
    check_rank(selected, 2, "selected", "[B, N - 1]")
    check_dtype(selected, INDEX_DTYPES, "selected")
    check_rank(beam_indices, 3, "beam_indices", "[B, depth - 1, topk]")
    check_dtype(beam_indices, INDEX_DTYPES, "beam_indices")
    check_device(beam_indices, selected.device, "beam_indices", "selected")
    if not isinstance(topk, int) or topk < 1:
        fail(f"topk must be a positive int, got {topk!r}")
    batch = selected.shape[0]
    if beam_indices.shape[0] != batch or beam_indices.shape[2] != topk:
        fail(f"beam_indices must have shape [B, depth - 1, topk] = [{batch}, depth - 1, {topk}], "
             f"got {list(beam_indices.shape)}")
    steps = beam_indices.shape[1] + 1
    grid_size = topk + (steps - 1) * topk * topk
    device = selected.device
    # Parent (flat grid index, -1 = root) of every grid candidate.
    beams = beam_indices.long()
    prev_offset = torch.tensor([0] + [topk + (s - 1) * topk * topk for s in range(1, steps - 1)],
                               dtype=torch.int64, device=device)  # flat offset of step s, s < steps - 1
    beam_flat = beams + prev_offset[None, :, None]  # [B, steps - 1, topk]
    later = beam_flat.repeat_interleave(topk, dim=2).reshape(batch, -1)  # [B, (steps - 1) * topk^2]
    grid_parents = torch.cat([torch.full((batch, topk), -1, dtype=torch.int64, device=device), later], dim=1)
    sel = selected.long()
    if _values_checked_here(device):
        bad = first_bad((sel < 0) | (sel >= grid_size))
        if bad is not None:
            fail(f"selected{list(bad)} = {int(sel[bad])} is outside the grid [0, {grid_size})")
    sel, _ = torch.sort(sel.clamp(0, grid_size - 1), dim=1)
    gp = grid_parents.gather(1, sel)  # [B, M]
    pos = torch.searchsorted(sel, gp.clamp(min=0))
    pos_c = pos.clamp(max=max(sel.shape[1] - 1, 0))
    found = (gp >= 0) & (pos < sel.shape[1]) & (sel.gather(1, pos_c) == gp) if sel.shape[1] else gp >= 0
    if _values_checked_here(device):
        bad = first_bad((gp >= 0) & ~found)
        if bad is not None:
            fail(f"selected contains grid candidate {int(sel[bad])} (request {bad[0]}) whose parent candidate "
                 f"{int(gp[bad])} is not selected")
    parent_node = torch.where(found, pos_c + 1, torch.zeros_like(pos_c))
    root = torch.full((batch, 1), -1, dtype=torch.int64, device=device)
    return torch.cat([root, parent_node], dim=1), torch.cat([root, sel], dim=1)


# ---------------------------------------------------------------------------------------------- bias


def _check_mask(mask: torch.Tensor, batch: int | None = None) -> tuple[int, int]:
    check_rank(mask, 3, "mask", "[B, N, ceil(N/64)]")
    check_dtype(mask, (torch.int64,), "mask")
    b, n, w = mask.shape
    if w != _mask_words(n) or (batch is not None and b != batch):
        fail(f"mask must have shape [B, N, ceil(N/64)] = [{b if batch is None else batch}, {n}, {_mask_words(n)}] "
             f"(from build_tree), got {list(mask.shape)}")
    return b, n


def _unpack_bits(mask: torch.Tensor) -> torch.Tensor:
    """bool [B, N, N]: [b, i, t] is bit t of row i."""
    n = mask.shape[1]
    t = torch.arange(n, device=mask.device)
    return ((mask[:, :, t // 64] >> (t % 64)) & 1).bool()


def tree_attention_bias(mask: torch.Tensor, prefix_lens: torch.Tensor, kv_len: int,
                        dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The additive attention mask an HF model or SDPA takes for a tree forward.

    Parameters
    ----------
    mask : int64 [B, N, ceil(N/64)]
        From :func:`build_tree`.
    prefix_lens : int32 | int64 [B]
        Committed tokens per request; the tree's keys sit at prefix_lens[b] .. + N - 1.
    kv_len : int
        Key length of the forward (cache length after appending the tree).
    dtype : torch.dtype
        Floating dtype of the result.

    Returns
    -------
    bias : dtype [B, 1, N, kv_len], 0 (visible) or -inf (hidden)
        Key j < prefix_lens[b] is always visible; key prefix_lens[b] + t is visible to node
        i iff bit t of row i is set; later keys are hidden. Padding rows see the prefix
        only (never an all -inf row when prefix_lens[b] > 0). Use with
        ``positions = prefix_lens[:, None] + depth``.

    No host sync; traceable by torch.compile.
    """
    batch, n = _check_mask(mask)
    check_shape(prefix_lens, (batch,), "prefix_lens", "[B]")
    check_dtype(prefix_lens, INDEX_DTYPES, "prefix_lens")
    check_device(prefix_lens, mask.device, "prefix_lens", "mask")
    if isinstance(kv_len, torch.Tensor) or not isinstance(kv_len, int) or kv_len < 0:
        fail(f"kv_len must be a non-negative int, got {kv_len!r}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        fail(f"dtype must be a floating torch.dtype, got {dtype!r}")
    key = torch.arange(kv_len, device=mask.device)
    rel = key[None, :] - prefix_lens.long()[:, None]  # [B, L]: key position relative to the root
    visible = (rel < 0)[:, None, :].expand(batch, n, kv_len)
    if n > 0:
        in_tree = (rel >= 0) & (rel < n)
        bits = _unpack_bits(mask)  # [B, N, N]
        tree_vis = bits.gather(2, rel.clamp(0, n - 1)[:, None, :].expand(batch, n, kv_len))
        visible = visible | (in_tree[:, None, :] & tree_vis)
    bias = torch.zeros((batch, 1, n, kv_len), dtype=dtype, device=mask.device)
    return bias.masked_fill(~visible[:, None], float("-inf"))


# ---------------------------------------------------------------------------------------------- tree_attention


class _Layout(NamedTuple):
    batch: int
    nodes: int
    q_heads: int
    kv_heads: int
    head_dim: int
    capacity: int  # addressable key slots per request
    paged: bool


def _check_attention_args(q, k_cache, v_cache, prefix_lens, mask, block_table) -> _Layout:
    check_rank(q, 4, "q", "[B, N, Hq, D]")
    check_dtype(q, ATTN_DTYPES, "q")
    batch, n, hq, d = q.shape
    device = q.device
    paged = block_table is not None
    cache_shape = "[num_blocks, block_size, Hk, D]" if paged else "[B, S, Hk, D]"
    for t, name in ((k_cache, "k_cache"), (v_cache, "v_cache")):
        check_rank(t, 4, name, cache_shape)
        if t.dtype != q.dtype:
            fail(f"{name} must have the dtype of q ({q.dtype}), got {t.dtype}")
        check_device(t, device, name, "q")
    if v_cache.shape != k_cache.shape:
        fail(f"v_cache must have the shape of k_cache {list(k_cache.shape)}, got {list(v_cache.shape)}")
    hk = k_cache.shape[2]
    if k_cache.shape[3] != d:
        fail(f"k_cache must have head dim D = {d} (last dim of q), got shape {list(k_cache.shape)}")
    if hk < 1 or hq % hk != 0:
        fail(f"the number of query heads Hq = {hq} must be a multiple of the cache's heads Hk = {hk} "
             f"(k_cache shape {list(k_cache.shape)})")
    if paged:
        check_rank(block_table, 2, "block_table", "[B, max_blocks]")
        check_dtype(block_table, INDEX_DTYPES, "block_table")
        check_device(block_table, device, "block_table", "q")
        if block_table.shape[0] != batch:
            fail(f"block_table must have shape [B, max_blocks] with B = {batch}, got {list(block_table.shape)}")
        capacity = block_table.shape[1] * k_cache.shape[1]
    else:
        if k_cache.shape[0] != batch:
            fail(f"k_cache must have shape [B, S, Hk, D] with B = {batch} (first dim of q), got "
                 f"{list(k_cache.shape)}; pass block_table for a paged cache")
        capacity = k_cache.shape[1]
    check_shape(prefix_lens, (batch,), "prefix_lens", "[B]")
    check_dtype(prefix_lens, INDEX_DTYPES, "prefix_lens")
    check_device(prefix_lens, device, "prefix_lens", "q")
    _check_mask(mask, batch)
    if mask.shape[1] != n:
        fail(f"mask must have shape [B, N, ceil(N/64)] = [{batch}, {n}, {_mask_words(n)}] (N = q.shape[1]), "
             f"got {list(mask.shape)}")
    check_device(mask, device, "mask", "q")
    return _Layout(batch, n, hq, hk, d, capacity, paged)


def _check_attention_values(prefix_lens, block_table, layout: _Layout, num_blocks: int) -> None:
    """CPU: the prefix and the tree fit the cache; used blocks exist."""
    bad = first_bad((prefix_lens < 0) | (prefix_lens + layout.nodes > layout.capacity))
    if bad is not None:
        fail(f"prefix_lens[{bad[0]}] = {int(prefix_lens[bad])}: the prefix plus the N = {layout.nodes} tree "
             f"slots must fit the {layout.capacity} cache slots of a request (and prefix_lens must be >= 0)")
    if block_table is not None and layout.capacity > 0:
        block_size = layout.capacity // block_table.shape[1]
        used = (torch.arange(block_table.shape[1]) * block_size) < (prefix_lens[:, None].long() + layout.nodes)
        bad = first_bad(used & ((block_table < 0) | (block_table >= num_blocks)))
        if bad is not None:
            fail(f"block_table{list(bad)} = {int(block_table[bad])} is outside [0, num_blocks = {num_blocks})")


def tree_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    prefix_lens: torch.Tensor,
    mask: torch.Tensor,
    *,
    block_table: torch.Tensor | None = None,
    sm_scale: float | None = None,
    return_lse: bool = False,
    backend: str | None = None,
    prefix_backend: str | None = None,
):
    """Attention of a draft tree's queries over the committed prefix plus the tree.

    Query i of request b attends to keys 0 .. prefix_lens[b] - 1 (the prefix, always
    visible) and to key prefix_lens[b] + t iff bit t of ``mask[b, i]`` is set (node t is
    i or an ancestor). The Triton kernel is flash-attention style: online softmax,
    prefix tiles without mask loads, tree tiles testing the bit rows in-kernel, GQA by
    packing each KV head's query group into one tile, split-KV over long prefixes.

    Parameters
    ----------
    q : float32 | float16 | bfloat16 [B, N, Hq, D]
        Queries of the N tree nodes (node 0 is the root). Hq a multiple of Hk.
    k_cache, v_cache : q's dtype
        Contiguous ``[B, S, Hk, D]`` with any strides (an HF ``[B, Hk, S, D]`` cache
        passes ``.transpose(1, 2)``), or paged ``[num_blocks, block_size, Hk, D]`` with
        ``block_table``. The tree's K/V are already at slots prefix_lens[b] .. + N - 1.
    prefix_lens : int32 | int64 [B]
        Committed tokens per request.
    mask : int64 [B, N, ceil(N/64)]
        From :func:`build_tree`. A row without its own bit (a padding node) gives zeros.
    block_table : int32 | int64 [B, max_blocks], optional
        Paged cache: slot s of request b is ``(block_table[b, s // block_size], s % block_size)``.
    sm_scale : float, optional
        Softmax scale; default 1 / sqrt(D).
    return_lse : bool
        Also return the natural-log log-sum-exp of the scores (flash-attn convention).
    backend : None | "cuda" | "triton" | "cpu" | "reference"
        "cuda" runs the Triton kernel registered for the CUDA key of the op.
    prefix_backend : None | "flash_attn"
        "flash_attn" (GPU, contiguous cache, flash-attn installed): the prefix runs in
        flash-attn (``return_softmax_lse``), the tree in the Triton kernel, merged with
        :func:`merge_attention_states` (cascade). Untested without flash-attn and a GPU.

    Returns
    -------
    out : [B, N, Hq, D] in q's dtype, or ``(out, lse float32 [B, N, Hq])`` with return_lse.
        Padding rows (node i without bit i in row i) are 0 with lse -inf, never NaN.
        Cache slots no node sees (past prefix_lens[b] + N, or of padding nodes) never
        reach the output, even when they hold NaN.

    On CPU, prefix_lens[b] + N beyond the cache and used block_table entries outside
    [0, num_blocks) raise ValueError. On the GPU (no host sync) keys outside the cache
    or in a bad block are hidden. Fixed shapes, no sync: CUDA-graph safe.

    Example
    -------
    >>> info = build_tree(torch.tensor([[-1, 0, 0, 1]]))
    >>> q = torch.randn(1, 4, 8, 64)
    >>> k = torch.randn(1, 32, 2, 64); v = torch.randn(1, 32, 2, 64)
    >>> tree_attention(q, k, v, torch.tensor([10]), info.mask).shape
    torch.Size([1, 4, 8, 64])
    """
    layout = _check_attention_args(q, k_cache, v_cache, prefix_lens, mask, block_table)
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(layout.head_dim)
    sm_scale = float(sm_scale)
    device = q.device
    if prefix_backend not in (None, "flash_attn"):
        fail(f"prefix_backend must be None or 'flash_attn', got {prefix_backend!r}")
    backend = _resolve(backend, device, "tree_attention", "tree_attention", "tree_attention_triton")
    if _values_checked_here(device):
        _check_attention_values(prefix_lens, block_table, layout, k_cache.shape[0])
    if prefix_backend == "flash_attn":
        out, lse = _cascade_flash_attn(q, k_cache, v_cache, prefix_lens, mask, block_table, sm_scale)
    elif backend == "reference":
        out, lse = reference.tree_attention(q, k_cache, v_cache, prefix_lens, mask, block_table=block_table,
                                            sm_scale=sm_scale)
    else:
        op = torch.ops.specdec.tree_attention if backend in ("cpu", "cuda") else torch.ops.specdec.tree_attention_triton
        out, lse = op.default(q, k_cache, v_cache, prefix_lens, mask, block_table, sm_scale)
    return (out, lse) if return_lse else out


def _cascade_flash_attn(q, k_cache, v_cache, prefix_lens, mask, block_table, sm_scale):
    """Prefix in flash-attn (varlen, LSE out), tree keys in the Triton kernel, merged (GPU only)."""
    if q.device.type != "cuda" or block_table is not None:
        fail("prefix_backend='flash_attn' needs CUDA tensors and a contiguous cache")
    try:
        from flash_attn import flash_attn_varlen_func
    except ImportError as exc:
        fail(f"prefix_backend='flash_attn' needs the flash_attn package ({exc})")
    batch, n, hq, d = q.shape
    s = k_cache.shape[1]
    # Prefix: queries [B * N], keys of request b are its first prefix_lens[b] slots.
    lens = prefix_lens.to(torch.int32)
    cu_q = torch.arange(0, (batch + 1) * n, n, dtype=torch.int32, device=q.device)
    cu_k = torch.zeros(batch + 1, dtype=torch.int32, device=q.device)
    cu_k[1:] = torch.cumsum(lens, 0)
    slot = torch.arange(s, device=q.device)
    keep = slot[None, :] < lens[:, None]
    k_packed = k_cache[keep]  # data-dependent shape: this path syncs (documented)
    v_packed = v_cache[keep]
    out_p, lse_p, _ = flash_attn_varlen_func(q.reshape(batch * n, hq, d), k_packed, v_packed, cu_q, cu_k, n,
                                             s, softmax_scale=sm_scale, causal=False, return_attn_probs=True)
    lse_p = lse_p.reshape(hq, batch, n).permute(1, 2, 0) if lse_p.dim() == 2 else lse_p.reshape(batch, hq, n)\
        .transpose(1, 2)
    lse_p = torch.where(lens[:, None, None] > 0, lse_p.float(), float("-inf"))
    out_p = torch.where(lens[:, None, None, None] > 0, out_p.reshape(batch, n, hq, d), 0)
    # Tree part only: the Triton kernel with an empty prefix over keys shifted to the tree's slots.
    out_t, lse_t = _launch_tree_attention(q, k_cache, v_cache, prefix_lens, mask, None, sm_scale, skip_prefix=True)
    out, lse = torch.ops.specdec.merge_attention_states_triton.default(out_p.contiguous(), lse_p.contiguous(), out_t,
                                                                       lse_t)
    own = _unpack_bits(mask).diagonal(dim1=1, dim2=2)  # padding rows: 0 and -inf, as in the one-pass kernel
    return torch.where(own[..., None, None], out, 0), torch.where(own[..., None], lse, float("-inf"))


# ---------------------------------------------------------------------------------------------- merge


def _check_merge_args(out_a, lse_a, out_b, lse_b) -> None:
    check_tensor(out_a, "out_a")
    if out_a.dim() < 1:
        fail("out_a must have at least 1 dim [..., D]")
    check_dtype(out_a, ATTN_DTYPES, "out_a")
    for t, name in ((out_b, "out_b"),):
        check_shape(t, tuple(out_a.shape), name, "[..., D] (the shape of out_a)")
        if t.dtype != out_a.dtype:
            fail(f"{name} must have the dtype of out_a ({out_a.dtype}), got {t.dtype}")
        check_device(t, out_a.device, name, "out_a")
    for t, name in ((lse_a, "lse_a"), (lse_b, "lse_b")):
        check_shape(t, tuple(out_a.shape[:-1]), name, "[...] (out_a's shape without D)")
        check_dtype(t, (torch.float32,), name)
        check_device(t, out_a.device, name, "out_a")


def merge_attention_states(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor, *,
                           backend: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact softmax merge of two partial attentions over disjoint key sets.

    Parameters
    ----------
    out_a, out_b : float32 | float16 | bfloat16 [..., D] (e.g. [B, N, H, D])
        Normalized partial outputs.
    lse_a, lse_b : float32 [...]
        Their natural-log log-sum-exp of the scores (flash-attn convention); -inf for a
        side that saw no key, which then contributes nothing.
    backend : None | "cuda" | "triton" | "cpu" | "reference"

    Returns
    -------
    (out [..., D] in out_a's dtype, lse float32 [...])
        ``lse = log(e^lse_a + e^lse_b)``, ``out = (e^lse_a out_a + e^lse_b out_b) / e^lse``;
        both sides -inf gives out 0 and lse -inf (never NaN).
    """
    _check_merge_args(out_a, lse_a, out_b, lse_b)
    backend = _resolve(backend, out_a.device, "merge_attention_states", "merge_attention_states",
                       "merge_attention_states_triton")
    if backend == "reference":
        return reference.merge_attention_states(out_a, lse_a, out_b, lse_b)
    op = (torch.ops.specdec.merge_attention_states if backend in ("cpu", "cuda")
          else torch.ops.specdec.merge_attention_states_triton)
    out, lse = op.default(out_a, lse_a, out_b, lse_b)
    return out, lse


# ---------------------------------------------------------------------------------------------- CPU composites


def _merge_fp32(out_a, lse_a, out_b, lse_b):
    """Merge in float32 (out [..., D], lse [...]); -inf sides contribute nothing."""
    lse = torch.logaddexp(lse_a, lse_b)
    finite = lse > float("-inf")
    safe = torch.where(finite, lse, torch.zeros_like(lse))
    wa = torch.where(finite, torch.exp(lse_a - safe), torch.zeros_like(lse)).unsqueeze(-1)
    wb = torch.where(finite, torch.exp(lse_b - safe), torch.zeros_like(lse)).unsqueeze(-1)
    zero = torch.zeros((), dtype=torch.float32)
    return torch.where(wa > 0, wa * out_a, zero) + torch.where(wb > 0, wb * out_b, zero), lse


def _attend_fp32(q, k, v, scale, visible=None):
    """q [Hk, R, D], k/v [Hk, L, D] float32, visible bool [R, L] or None -> (out [Hk, R, D], lse [Hk, R])."""
    scores = torch.matmul(q, k.transpose(1, 2)) * scale
    if visible is not None:
        scores = scores.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    finite = lse > float("-inf")
    probs = torch.exp(scores - torch.where(finite, lse, torch.zeros_like(lse)).unsqueeze(-1))
    return torch.matmul(probs, v), lse


_CPU_KEY_CHUNK = 2048


def _tree_attention_cpu(q, k_cache, v_cache, prefix_lens, mask, block_table, sm_scale):
    """CPU composite: per request, the prefix in key chunks without a mask, the tree keys with the
    bitmask (appended to the last chunk), chunks merged exactly by their LSE."""
    layout = _check_attention_args(q, k_cache, v_cache, prefix_lens, mask, block_table)
    batch, n, hq, hk, d = layout.batch, layout.nodes, layout.q_heads, layout.kv_heads, layout.head_dim
    if not torch.compiler.is_compiling():
        _check_attention_values(prefix_lens, block_table, layout, k_cache.shape[0])
    group = hq // hk
    out = torch.zeros(batch, n, hq, d, dtype=torch.float32)
    lse_out = torch.full((batch, n, hq), float("-inf"), dtype=torch.float32)
    if n == 0:
        return out.to(q.dtype), lse_out
    bits = _unpack_bits(mask)  # [B, N, N]
    own = bits.diagonal(dim1=1, dim2=2)  # [B, N] real nodes

    def heads_first(x):  # [L, Hk, D] -> [Hk, L, D]
        return x.permute(1, 0, 2)

    for b in range(batch):
        prefix = int(prefix_lens[b])
        # rows r = node * group + g for KV head h: query head h * group + g
        qb = q[b].float().reshape(n, hk, group, d).permute(1, 0, 2, 3).reshape(hk, n * group, d)
        vis = bits[b].repeat_interleave(group, dim=0)  # [N * group, N]
        seen = bits[b].any(0)  # tree keys some node sees: the others may hold garbage
        tree_k = torch.where(seen[:, None, None], _slots(k_cache, b, prefix, n, block_table).float(), 0.0)
        tree_v = torch.where(seen[:, None, None], _slots(v_cache, b, prefix, n, block_table).float(), 0.0)
        # Prefix chunks need no mask; the tree keys join the last chunk with the bitmask.
        starts = list(range(0, prefix, _CPU_KEY_CHUNK)) or [0]
        acc = lse = None
        for start in starts:
            length = min(_CPU_KEY_CHUNK, prefix - start)
            keys = _slots(k_cache, b, start, length, block_table).float()
            vals = _slots(v_cache, b, start, length, block_table).float()
            visible = None
            if start == starts[-1]:
                keys, vals = torch.cat([keys, tree_k]), torch.cat([vals, tree_v])
                visible = torch.cat([torch.ones(n * group, length, dtype=torch.bool), vis], dim=1)
            o, l = _attend_fp32(qb, heads_first(keys), heads_first(vals), sm_scale, visible)
            acc, lse = (o, l) if acc is None else _merge_fp32(acc, lse, o, l)
        acc = acc.reshape(hk, n, group, d).permute(1, 0, 2, 3).reshape(n, hq, d)
        lse = lse.reshape(hk, n, group).permute(1, 0, 2).reshape(n, hq)
        out[b] = torch.where(own[b][:, None, None], acc, 0.0)
        lse_out[b] = torch.where(own[b][:, None], lse, float("-inf"))
    return out.to(q.dtype), lse_out


def _slots(cache, b, start, length, block_table):
    """Request b's cache slots start .. start + length - 1 as [length, Hk, D]."""
    if block_table is None:
        return cache[b, start: start + length]
    block_size = cache.shape[1]
    pos = torch.arange(start, start + length)
    return cache[block_table[b].long()[pos // block_size], pos % block_size]


def _merge_cpu(out_a, lse_a, out_b, lse_b):
    _check_merge_args(out_a, lse_a, out_b, lse_b)
    out, lse = _merge_fp32(out_a.float(), lse_a, out_b.float(), lse_b)
    return out.to(out_a.dtype), lse


# ---------------------------------------------------------------------------------------------- fakes


def _fake_build_tree(parents, num_nodes):
    torch._check(parents.dim() == 2, lambda: "parents must be 2-D [B, N]")
    batch, n = parents.shape
    return (parents.new_empty((batch, n, (n + 63) // 64), dtype=torch.int64),
            parents.new_empty((batch, n), dtype=torch.int32))


def _fake_tree_attention(q, k_cache, v_cache, prefix_lens, mask, block_table, sm_scale):
    torch._check(q.dim() == 4, lambda: "q must be 4-D [B, N, Hq, D]")
    return torch.empty_like(q, memory_format=torch.contiguous_format), q.new_empty(q.shape[:3], dtype=torch.float32)


def _fake_merge(out_a, lse_a, out_b, lse_b):
    torch._check(out_b.shape == out_a.shape, lambda: "out_b must have the shape of out_a")
    return (torch.empty_like(out_a, memory_format=torch.contiguous_format),
            out_a.new_empty(out_a.shape[:-1], dtype=torch.float32))


# ---------------------------------------------------------------------------------------------- triton

# Tests set this to exercise the split-KV path under the interpreter (None: heuristic).
_FORCE_NUM_SPLITS: int | None = None


@functools.cache
def _num_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _num_splits(programs: int, capacity: int, device: torch.device) -> int:
    if _FORCE_NUM_SPLITS is not None:
        return _FORCE_NUM_SPLITS
    if device.type != "cuda" or capacity <= 2048:
        return 1
    sms = _num_sms(device.index if device.index is not None else torch.cuda.current_device())
    if programs >= sms:
        return 1
    return max(1, min(-(-2 * sms // programs), capacity // 1024, 32))


def _launch_tree_attention(q, k_cache, v_cache, prefix_lens, mask, block_table, sm_scale, skip_prefix=False):
    from .triton_kernels.tree_attention import tree_attention_kernel, combine_splits_kernel

    batch, n, hq, d = q.shape
    hk = k_cache.shape[2]
    group = hq // hk
    out = torch.empty(batch, n, hq, d, dtype=q.dtype, device=q.device)
    lse = torch.empty(batch, n, hq, dtype=torch.float32, device=q.device)
    if batch == 0 or n == 0 or hq == 0:
        return out, lse
    paged = block_table is not None
    capacity = block_table.shape[1] * k_cache.shape[1] if paged else k_cache.shape[1]
    block_d = max(16, next_pow2(d))
    block_n = 64 if block_d <= 128 else 32
    block_m = min(64, max(16, next_pow2(n * group)))
    if q.dtype == torch.float32 and block_d >= 256:  # keep fp32 tiles well inside shared memory
        block_m, block_n = min(block_m, 32), 16
    elif q.dtype == torch.float32 and block_d >= 128:
        block_n = 32
    m_tiles = -(-(n * group) // block_m)
    splits = 1 if skip_prefix else _num_splits(m_tiles * batch * hk, capacity, q.device)
    chunk = -(-max(capacity, 1) // splits)
    chunk = -(-chunk // block_n) * block_n
    prefix = prefix_lens.contiguous().to(torch.int64)
    table = block_table.contiguous().to(torch.int64) if paged else prefix
    mask_c = mask.contiguous()
    if splits == 1:
        out_buf, lse_buf = out, lse
        so = (0,) + tuple(out.stride())
        sl = (0,) + tuple(lse.stride())
    else:
        out_buf = torch.empty(splits, batch, n, hq, d, dtype=torch.float32, device=q.device)
        lse_buf = torch.empty(splits, batch, n, hq, dtype=torch.float32, device=q.device)
        so, sl = out_buf.stride(), lse_buf.stride()
    tree_attention_kernel[(m_tiles, batch * hk, splits)](
        q, k_cache, v_cache, prefix, mask_c, table, out_buf, lse_buf,
        sm_scale * 1.4426950408889634, n, mask_c.shape[2], group, hk, capacity, chunk, splits,
        k_cache.shape[0], k_cache.shape[1] if paged else 1, table.stride(0) if paged else 0, d,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *so, *sl,
        PAGED=paged, SKIP_PREFIX=skip_prefix,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
        IEEE=q.dtype == torch.float32,
        num_warps=4 if block_d <= 128 else 8, num_stages=2,
    )
    if splits > 1:
        rows = batch * n * hq
        combine_splits_kernel[(rows,)](
            out_buf, lse_buf, out, lse, rows, d, splits,
            BLOCK_S=next_pow2(splits), BLOCK_D=block_d,
        )
    return out, lse


def _tree_attention_triton(q, k_cache, v_cache, prefix_lens, mask, block_table, sm_scale):
    _check_attention_args(q, k_cache, v_cache, prefix_lens, mask, block_table)
    return _launch_tree_attention(q, k_cache, v_cache, prefix_lens, mask, block_table, sm_scale)


def _merge_triton(out_a, lse_a, out_b, lse_b):
    from .triton_kernels.tree_attention import merge_states_kernel

    _check_merge_args(out_a, lse_a, out_b, lse_b)
    d = out_a.shape[-1]
    rows = lse_a.numel()
    out = torch.empty(out_a.shape, dtype=out_a.dtype, device=out_a.device)
    lse = torch.empty(out_a.shape[:-1], dtype=torch.float32, device=out_a.device)
    if rows == 0 or d == 0:
        if rows:
            lse.copy_(torch.logaddexp(lse_a, lse_b))
        return out, lse
    merge_states_kernel[(rows,)](
        out_a.contiguous(), lse_a.contiguous(), out_b.contiguous(), lse_b.contiguous(), out, lse, d,
        BLOCK_D=max(16, next_pow2(d)),
    )
    return out, lse


if _ops.native_loaded():
    torch.library.register_fake("specdec::build_tree")(_fake_build_tree)
    for _name in ("tree_attention", "tree_attention_triton"):
        torch.library.register_fake(f"specdec::{_name}")(_fake_tree_attention)
    for _name in ("merge_attention_states", "merge_attention_states_triton"):
        torch.library.register_fake(f"specdec::{_name}")(_fake_merge)
    # tree_attention / merge: composite PyTorch on CPU, the Triton kernel on CUDA (one op name, every device).
    torch.library.impl("specdec::tree_attention", "CPU")(_tree_attention_cpu)
    torch.library.impl("specdec::tree_attention", "CUDA")(_tree_attention_triton)
    torch.library.impl("specdec::merge_attention_states", "CPU")(_merge_cpu)
    torch.library.impl("specdec::merge_attention_states", "CUDA")(_merge_triton)
    torch.library.impl("specdec::tree_attention_triton", ("CPU", "CUDA"))(_tree_attention_triton)
    torch.library.impl("specdec::merge_attention_states_triton", ("CPU", "CUDA"))(_merge_triton)
