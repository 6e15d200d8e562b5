"""Tree attention (DESIGN.md §5.4): the tree's queries over the committed prefix plus the tree.

Public functions:

- :func:`tree_attention_bias`: the additive ``[B, 1, N, kv_len]`` mask for HF / SDPA;
- :func:`tree_attention`: attention honouring the ancestor bitmask inside the kernel
  (Triton on the GPU, a blocked composite on the CPU).

The fake impl for torch.compile, the CPU composite and the Triton launcher live here too.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from . import _ops, reference
from ._backend import (impl_checks_values, next_pow2, num_sms, resolve_backend, tracing, triton_interpreting,
                       values_checked_here)
from ._checks import BackendUnavailableError, INDEX_DTYPES, PROB_DTYPES, check_device, check_dtype, check_rank, check_shape, fail, first_bad
from .attention_merge import _cascade_flash_attn, _merge_fp32
from .tree import _check_mask, _mask_words, _unpack_bits

__all__ = ["tree_attention_bias", "tree_attention"]

ATTN_DTYPES = PROB_DTYPES  # float32, float16, bfloat16


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

    On CPU a negative ``prefix_lens`` entry raises ValueError (SpecDecArgumentError)
    naming it. On the GPU (no host sync) a negative entry is taken as 0: no committed
    prefix, the tree at keys 0 .. N - 1 (never an all -inf row, which would put NaN in
    SDPA's output). No host sync on the GPU; traceable by torch.compile.
    """
    batch, n = _check_mask(mask)
    check_shape(prefix_lens, (batch,), "prefix_lens", "[B]")
    check_dtype(prefix_lens, INDEX_DTYPES, "prefix_lens")
    check_device(prefix_lens, mask.device, "prefix_lens", "mask")
    if isinstance(kv_len, torch.Tensor) or not isinstance(kv_len, int) or kv_len < 0:
        fail(f"kv_len must be a non-negative int, got {kv_len!r}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        fail(f"dtype must be a floating torch.dtype, got {dtype!r}")
    if values_checked_here(mask.device):
        bad = first_bad(prefix_lens < 0)
        if bad is not None:
            fail(f"prefix_lens[{bad[0]}] = {int(prefix_lens[bad])} is negative (committed tokens)")
    key = torch.arange(kv_len, device=mask.device)
    rel = key[None, :] - prefix_lens.long().clamp(min=0)[:, None]  # [B, L]: key position relative to the root
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
        From :func:`build_tree`. Row i sees the prefix and the tree keys of its bits, as
        :func:`tree_attention_bias` says: a padding node (all-zero row) sees the prefix alone.
    block_table : int32 | int64 [B, max_blocks], optional
        Paged cache: slot s of request b is ``(block_table[b, s // block_size], s % block_size)``.
    sm_scale : float, optional
        Softmax scale; default 1 / sqrt(D).
    return_lse : bool
        Also return the natural-log log-sum-exp of the scores (flash-attn convention).
    backend : None | "cuda" | "triton" | "cpu" | "reference"
        "cuda" runs the Triton kernel registered for the CUDA key of the op. "triton" under
        the interpreter (CPU tensors) refuses bfloat16 with BackendUnavailableError (the
        interpreter has no bfloat16 arithmetic).
    prefix_backend : None | "flash_attn"
        "flash_attn" (GPU, contiguous cache, flash-attn installed): the prefix runs in
        flash-attn (``return_softmax_lse``), the tree in the Triton kernel, merged with
        :func:`merge_attention_states` (cascade). Untested without flash-attn and a GPU.

    Returns
    -------
    out : [B, N, Hq, D] in q's dtype, or ``(out, lse float32 [B, N, Hq])`` with return_lse.
        Equal to SDPA with :func:`tree_attention_bias` on every row, padding rows included;
        a row that sees no key (prefix_lens[b] = 0 and no bit) is 0 with lse -inf, never NaN.
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
    backend = resolve_backend(backend, device, "tree_attention", native_op="tree_attention", triton_op="tree_attention_triton")
    # On CPU the ops check the values themselves (the composite and the Triton impl); the flash-attn cascade
    # (GPU only) calls neither, so the wrapper keeps its check there.
    if values_checked_here(device, backend if prefix_backend is None else None):
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


# ---------------------------------------------------------------------------------------------- CPU composite


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
    if not tracing():
        _check_attention_values(prefix_lens, block_table, layout, k_cache.shape[0])
    group = hq // hk
    out = torch.zeros(batch, n, hq, d, dtype=torch.float32)
    lse_out = torch.full((batch, n, hq), float("-inf"), dtype=torch.float32)
    if n == 0:
        return out.to(q.dtype), lse_out
    bits = _unpack_bits(mask)  # [B, N, N]

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
        out[b] = acc          # a row that sees no key (no prefix, no bit) has lse -inf and 0: _attend_fp32
        lse_out[b] = lse
    return out.to(q.dtype), lse_out


def _slots(cache, b, start, length, block_table):
    """Request b's cache slots start .. start + length - 1 as [length, Hk, D]."""
    if block_table is None:
        return cache[b, start: start + length]
    block_size = cache.shape[1]
    pos = torch.arange(start, start + length)
    return cache[block_table[b].long()[pos // block_size], pos % block_size]


# ---------------------------------------------------------------------------------------------- fake


def _fake_tree_attention(q, k_cache, v_cache, prefix_lens, mask, block_table, sm_scale):
    torch._check(q.dim() == 4, lambda: "q must be 4-D [B, N, Hq, D]")
    return torch.empty_like(q, memory_format=torch.contiguous_format), q.new_empty(q.shape[:3], dtype=torch.float32)


# ---------------------------------------------------------------------------------------------- triton

# Tests set this to exercise the split-KV path under the interpreter (None: heuristic).
_FORCE_NUM_SPLITS: int | None = None


def _launch_grid(batch: int, kv_heads: int, row_tiles: int, splits: int) -> tuple[int, int, int]:
    """Grid of tree_attention_kernel: (B * Hk, row tiles, splits).

    B * Hk goes on axis 0 (up to 2^31 - 1 programs): axes 1 and 2 allow 65535, which B = 2048
    with 32 KV heads would exceed.
    """
    return (batch * kv_heads, row_tiles, splits)


def _interpreter_needs_while_loops() -> bool:
    """Triton before 3.8 interprets a runtime range() bound with int() of a 1-element array, which
    numpy >= 2.4 refuses: the kernel then loops with `while` (the compiled kernel keeps `for`)."""
    import triton

    major, minor = (int(x) for x in triton.__version__.split(".")[:2])
    return triton_interpreting() and (major, minor) < (3, 8)


def _tile_config(dtype: torch.dtype, rows: int, head_dim: int) -> tuple[int, int, int, int, int | None]:
    """(BLOCK_M, BLOCK_N, BLOCK_D, num_warps, maxnreg) of tree_attention_kernel for `rows` = N * group
    query rows.

    Chosen so that ptxas reports no spills for sm_90 on every supported Triton (tests/aot_tree_attention_kernel.py
    compiles these configurations): 16-bit tiles of 32 or 64 rows take 8 warps, 32-key tiles for large D,
    except 64 rows with D = 128 (the reference shape: N = 16, GQA 4), which take 4 warps of 16 whole rows
    each (no cross-warp row reductions; 215-255 registers, two blocks per SM): bench/roofline.py, compiling
    what the JIT compiles, predicts 100% of the HBM roofline there against 73% for the 8-warp tile;
    float32 (both dots IEEE on the FMA units, no tensor cores) keeps 16-key tiles of at most 32 rows, 16
    from D = 128 on, with 8 warps from D = 128 on (4 warps spill ~450 bytes there; float32 with D = 256
    spills with any warp count: a slow path, no fast one is promised for it). Tiles of 16 rows with D <= 64 get a register cap of 255 (ptxas .maxnreg): without
    one, ptxas keeps those kernels near 80-170 registers and spills two or three values live across the
    whole kernel (4-8 bytes, on Triton 3.6 or 3.9 depending on the kernel's exact code); with the cap
    stated it keeps them in registers (about 150-210, still two or more blocks of 4 warps per SM).
    """
    block_d = max(16, next_pow2(head_dim))
    block_m = min(64, max(16, next_pow2(rows)))
    maxnreg = 255 if block_m == 16 and block_d <= 64 else None
    if dtype == torch.float32:
        return min(block_m, 32 if block_d <= 64 else 16), 16, block_d, 8 if block_d >= 128 else 4, maxnreg
    if block_m == 16:
        return block_m, 64 if block_d <= 128 else 32, block_d, 4, maxnreg
    if block_m == 64 and block_d == 128:
        return 64, 32, 128, 4, None
    return block_m, 64 if block_d <= 64 or block_m == 32 and block_d <= 128 else 32, block_d, 8, None


def _num_splits(programs: int, capacity: int, device: torch.device) -> int:
    if _FORCE_NUM_SPLITS is not None:
        return _FORCE_NUM_SPLITS
    if device.type != "cuda" or capacity <= 2048:
        return 1
    sms = num_sms(device)
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
    block_m, block_n, block_d, num_warps, maxnreg = _tile_config(q.dtype, n * group, d)
    m_tiles = -(-(n * group) // block_m)
    # Splits from the capacity (no host sync); the kernel shares each request's own prefix among them.
    splits = 1 if skip_prefix else _num_splits(m_tiles * batch * hk, capacity, q.device)
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
    tree_attention_kernel[_launch_grid(batch, hk, m_tiles, splits)](
        q, k_cache, v_cache, prefix, mask_c, table, out_buf, lse_buf,
        sm_scale * 1.4426950408889634, n, mask_c.shape[2], group, hk, capacity, splits,
        k_cache.shape[0], k_cache.shape[1] if paged else 1, table.stride(0) if paged else 0, d,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *so, *sl,
        PAGED=paged, SKIP_PREFIX=skip_prefix,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
        IEEE=q.dtype == torch.float32, WHILE_LOOPS=_interpreter_needs_while_loops(),
        num_warps=num_warps, num_stages=2, maxnreg=maxnreg,
    )
    if splits > 1:
        rows = batch * n * hq
        combine_splits_kernel[(rows,)](
            out_buf, lse_buf, out, lse, rows, d, splits,
            BLOCK_S=next_pow2(splits), BLOCK_D=block_d,
        )
    return out, lse


def _tree_attention_triton(q, k_cache, v_cache, prefix_lens, mask, block_table, sm_scale):
    """specdec::tree_attention_triton (and specdec::tree_attention on CUDA): the CPU composite's checks (shapes,
    dtypes and devices always; on CPU tensors the prefix and the tree fit the cache and the used blocks exist),
    then the launch."""
    layout = _check_attention_args(q, k_cache, v_cache, prefix_lens, mask, block_table)
    if impl_checks_values(q.device):
        _check_attention_values(prefix_lens, block_table, layout, k_cache.shape[0])
    if q.dtype == torch.bfloat16 and (triton_interpreting() or q.device.type == "cpu"):
        # The interpreter has no bfloat16 arithmetic (tl.dot on bf16 returns garbage there).
        raise BackendUnavailableError(
            "tree_attention(backend='triton') cannot run q of dtype torch.bfloat16 under the Triton interpreter "
            "(it has no bfloat16 arithmetic); use backend='cpu', or float16/float32, or a GPU")
    return _launch_tree_attention(q, k_cache, v_cache, prefix_lens, mask, block_table, sm_scale)


if _ops.native_loaded():
    for _name in ("tree_attention", "tree_attention_triton"):
        torch.library.register_fake(f"specdec::{_name}")(_fake_tree_attention)
    # Composite PyTorch on CPU, the Triton kernel on CUDA (one op name, every device).
    torch.library.impl("specdec::tree_attention", "CPU")(_tree_attention_cpu)
    torch.library.impl("specdec::tree_attention", "CUDA")(_tree_attention_triton)
    torch.library.impl("specdec::tree_attention_triton", ("CPU", "CUDA"))(_tree_attention_triton)
