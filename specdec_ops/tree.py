"""Tree metadata (DESIGN.md §5.4): ancestor bitmasks, depths and tree converters.

Public functions:

- :func:`build_tree`: bit-packed ancestor mask and depths of a draft token tree;
- :func:`paths_to_parents`, :func:`parents_to_paths`, :func:`topk_grid_to_parents`:
  converters from the ways trees are written today (Medusa/EAGLE path tuples,
  EAGLE-2/SGLang top-k x depth candidate grids) to ``parents``.

Tree attention over these masks is :mod:`specdec_ops.attention`; merging
partial attentions is :mod:`specdec_ops.attention_merge`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from . import _ops, reference
from ._backend import resolve_backend, values_checked_here
from ._checks import (INDEX_DTYPES, call_native, check_device, check_dtype, check_rank, check_shape,
                      fail, first_bad)

__all__ = ["TreeInfo", "build_tree", "paths_to_parents", "parents_to_paths", "topk_grid_to_parents"]


class TreeInfo(NamedTuple):
    """Result of :func:`build_tree`.

    mask:  int64 [B, N, W], W = ceil(N / 64): bit j % 64 of word j // 64 in row i is set iff
           node j is node i or an ancestor of i (little-endian bits); padding rows are 0.
    depth: int32 [B, N]: root 0, padding nodes -1. Positions for the target forward are
           ``prefix_lens[:, None] + depth``.
    """

    mask: torch.Tensor
    depth: torch.Tensor


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
    backend = resolve_backend(backend, device, "build_tree", native_op="build_tree")
    if backend == "reference":
        if values_checked_here(device):
            _check_parents_values(parents, num_nodes)
        return TreeInfo(*reference.build_tree(parents, num_nodes))
    return TreeInfo(*call_native(torch.ops.specdec.build_tree.default, parents, num_nodes))


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
    # Flat offset of step s < steps - 1, built on the device (no host-to-device copy).
    step = torch.arange(steps - 1, dtype=torch.int64, device=device)
    prev_offset = torch.where(step == 0, 0, topk + (step - 1) * topk * topk)
    beam_flat = beams + prev_offset[None, :, None]  # [B, steps - 1, topk]
    later = beam_flat.repeat_interleave(topk, dim=2).reshape(batch, -1)  # [B, (steps - 1) * topk^2]
    grid_parents = torch.cat([torch.full((batch, topk), -1, dtype=torch.int64, device=device), later], dim=1)
    sel = selected.long()
    if values_checked_here(device):
        bad = first_bad((sel < 0) | (sel >= grid_size))
        if bad is not None:
            fail(f"selected{list(bad)} = {int(sel[bad])} is outside the grid [0, {grid_size})")
    sel, _ = torch.sort(sel.clamp(0, grid_size - 1), dim=1)
    gp = grid_parents.gather(1, sel)  # [B, M]
    pos = torch.searchsorted(sel, gp.clamp(min=0))
    pos_c = pos.clamp(max=max(sel.shape[1] - 1, 0))
    found = (gp >= 0) & (pos < sel.shape[1]) & (sel.gather(1, pos_c) == gp) if sel.shape[1] else gp >= 0
    if values_checked_here(device):
        bad = first_bad((gp >= 0) & ~found)
        if bad is not None:
            fail(f"selected contains grid candidate {int(sel[bad])} (request {bad[0]}) whose parent candidate "
                 f"{int(gp[bad])} is not selected")
    parent_node = torch.where(found, pos_c + 1, torch.zeros_like(pos_c))
    root = torch.full((batch, 1), -1, dtype=torch.int64, device=device)
    return torch.cat([root, parent_node], dim=1), torch.cat([root, sel], dim=1)


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


# ---------------------------------------------------------------------------------------------- fakes


def _fake_build_tree(parents, num_nodes):
    torch._check(parents.dim() == 2, lambda: "parents must be 2-D [B, N]")
    batch, n = parents.shape
    return (parents.new_empty((batch, n, (n + 63) // 64), dtype=torch.int64),
            parents.new_empty((batch, n), dtype=torch.int32))


if _ops.native_loaded():
    torch.library.register_fake("specdec::build_tree")(_fake_build_tree)
