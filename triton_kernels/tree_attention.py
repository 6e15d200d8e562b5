"""Triton kernels of tree attention (DESIGN.md §5.4); launchers in specdec_ops/attention.py.

tree_attention_kernel: flash-attention style. One program owns BLOCK_M query rows of
one (request, KV head): row r is node r // G with query head kvh * G + r % G (GQA: the
G query heads sharing a KV head share every K/V tile). Online softmax in base 2.
  - prefix tiles (keys < prefix_lens[b]) need no mask loads, only the length bound;
  - tree tiles (keys prefix_lens[b] + t, t < N) load one 64-bit mask word per row
    (BLOCK_N divides 64, so a tile lies inside one word) and test the bits in-kernel.
Grid (B * Hk, row tiles, splits): B * Hk on axis 0 (2^31 - 1; axes 1 and 2 allow 65535).
Split-KV (grid axis 2): split s covers prefix keys [s * chunk, (s + 1) * chunk) with chunk
= prefix_lens[b] / num_splits rounded up to whole tiles (sized in-kernel from the request's
own prefix, not the cache capacity); the last split also takes the tree tiles. With num_splits > 1 the partial results go to
float32 buffers and combine_splits_kernel merges them by their LSE.

Contiguous caches are addressed as [B, S, Hk, D] with any strides, paged caches as
[num_blocks, block_size, Hk, D] through the block table. Keys outside the cache or in a
block outside [0, num_blocks) are hidden. Every row sees the prefix, padding rows too (their mask
rows are 0: the prefix alone); a row that sees no key gives 0 and LSE -inf, never NaN. LSE out is
the natural log.
"""

import triton
import triton.language as tl

LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def _kv_tile(base_ptr, b, kvh, pos, valid, d, d_ok, table_ptr, table_stride, block_size, num_blocks,
             stride_0, stride_1, stride_h, stride_d, PAGED: tl.constexpr):
    """[BLOCK_N, BLOCK_D] keys or values at positions `pos` of request b; invalid slots load 0."""
    if PAGED:
        blk = tl.load(table_ptr + b * table_stride + pos // block_size, mask=valid, other=-1)
        valid = valid & (blk >= 0) & (blk < num_blocks)
        row = blk.to(tl.int64) * stride_0 + (pos % block_size).to(tl.int64) * stride_1
    else:
        row = b.to(tl.int64) * stride_0 + pos.to(tl.int64) * stride_1
    ptrs = base_ptr + row[:, None] + kvh.to(tl.int64) * stride_h + d[None, :].to(tl.int64) * stride_d
    return tl.load(ptrs, mask=valid[:, None] & d_ok[None, :], other=0.0), valid


@triton.jit
def _dot(a, b, IEEE: tl.constexpr):
    """a @ b in float32; IEEE (float32 inputs): exact float32 products on the FMA units, as PyTorch's float32
    attention computes them (a plain tl.dot of float32 rounds its inputs to TF32 on tensor cores)."""
    if IEEE:
        return tl.dot(a, b, input_precision="ieee", out_dtype=tl.float32)
    else:
        return tl.dot(a, b, out_dtype=tl.float32)


@triton.jit
def _online_update(m_i, l_i, acc, s, v, p_dtype, IEEE: tl.constexpr):
    """One online-softmax step on base-2 scores s [M, N] (-inf = hidden)."""
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + _dot(p.to(p_dtype), v, IEEE)
    return m_new, l_i, acc


@triton.jit
def _scores(q, k, IEEE: tl.constexpr):
    return _dot(q, tl.trans(k), IEEE)


@triton.jit
def _prefix_tile(m_i, l_i, acc, q, start, hi, offs_n, b, kvh, d, d_ok, k_ptr, v_ptr, table_ptr, table_stride,
                 block_size, num_blocks, stride_k0, stride_k1, stride_kh, stride_kd,
                 stride_v0, stride_v1, stride_vh, stride_vd, qk_scale, p_dtype, PAGED: tl.constexpr,
                 IEEE: tl.constexpr):
    """Prefix keys start .. start + BLOCK_N - 1 (those < hi): always visible, no mask loads."""
    pos = start + offs_n
    valid = pos < hi
    k, valid = _kv_tile(k_ptr, b, kvh, pos, valid, d, d_ok, table_ptr, table_stride, block_size,
                        num_blocks, stride_k0, stride_k1, stride_kh, stride_kd, PAGED)
    v, _ = _kv_tile(v_ptr, b, kvh, pos, valid, d, d_ok, table_ptr, table_stride, block_size,
                    num_blocks, stride_v0, stride_v1, stride_vh, stride_vd, PAGED)
    s = tl.where(valid[None, :], _scores(q, k, IEEE) * qk_scale, float("-inf"))
    return _online_update(m_i, l_i, acc, s, v, p_dtype, IEEE)


@triton.jit
def _tree_tile(m_i, l_i, acc, q, t0, prefix, capacity, num_nodes, mask_rows, row_ok, offs_n, b, kvh, d,
               d_ok, k_ptr, v_ptr, table_ptr, table_stride, block_size, num_blocks,
               stride_k0, stride_k1, stride_kh, stride_kd, stride_v0, stride_v1, stride_vh, stride_vd,
               qk_scale, p_dtype, PAGED: tl.constexpr, IEEE: tl.constexpr):
    """Tree keys prefix + t, t = t0 .. t0 + BLOCK_N - 1: visible iff bit t of the row."""
    t = t0 + offs_n
    pos = prefix + t
    valid = (t < num_nodes) & (pos < capacity)
    word = tl.load(mask_rows + t0 // 64, mask=row_ok, other=0)  # one word per row: BLOCK_N divides 64
    bits = (word[:, None] >> (t % 64).to(tl.int64)[None, :]) & 1
    k, valid = _kv_tile(k_ptr, b, kvh, pos, valid, d, d_ok, table_ptr, table_stride, block_size,
                        num_blocks, stride_k0, stride_k1, stride_kh, stride_kd, PAGED)
    visible = (bits != 0) & valid[None, :]
    # Slots no row of this tile sees may hold garbage (even NaN): zero them so 0 * NaN never happens.
    seen = tl.max(visible.to(tl.int32), axis=0) > 0
    v, _ = _kv_tile(v_ptr, b, kvh, pos, valid & seen, d, d_ok, table_ptr, table_stride, block_size,
                    num_blocks, stride_v0, stride_v1, stride_vh, stride_vd, PAGED)
    k = tl.where(seen[:, None], k, 0.0)
    s = tl.where(visible, _scores(q, k, IEEE) * qk_scale, float("-inf"))
    return _online_update(m_i, l_i, acc, s, v, p_dtype, IEEE)


@triton.jit(do_not_specialize=["num_nodes", "capacity", "num_blocks", "num_splits"])
def tree_attention_kernel(
    q_ptr, k_ptr, v_ptr, prefix_lens_ptr, mask_ptr, table_ptr, out_ptr, lse_ptr,
    qk_scale,  # sm_scale * log2(e)
    num_nodes, num_words, group, num_kv_heads, capacity, num_splits,
    num_blocks, block_size, table_stride, head_dim,
    stride_qb, stride_qn, stride_qh, stride_qd,
    stride_k0, stride_k1, stride_kh, stride_kd,
    stride_v0, stride_v1, stride_vh, stride_vd,
    stride_os, stride_ob, stride_on, stride_oh, stride_od,
    stride_ls, stride_lb, stride_ln, stride_lh,
    PAGED: tl.constexpr, SKIP_PREFIX: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, IEEE: tl.constexpr,
    WHILE_LOOPS: tl.constexpr = False,
):
    # Grid: (B * Hk, row tiles, splits). B * Hk sits on axis 0 (up to 2^31 - 1 programs; axes 1
    # and 2 allow 65535).
    pid_bh = tl.program_id(0)
    pid_m = tl.program_id(1)
    split = tl.program_id(2)
    b = pid_bh // num_kv_heads
    kvh = pid_bh % num_kv_heads

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    node = rows // group
    head = kvh * group + rows % group
    row_ok = node < num_nodes
    d = tl.arange(0, BLOCK_D)
    d_ok = d < head_dim

    q_ptrs = (q_ptr + b.to(tl.int64) * stride_qb + node[:, None].to(tl.int64) * stride_qn
              + head[:, None].to(tl.int64) * stride_qh + d[None, :].to(tl.int64) * stride_qd)
    q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)

    prefix = tl.load(prefix_lens_ptr + b)
    prefix = tl.minimum(tl.maximum(prefix, 0), capacity).to(tl.int32)
    mask_rows = mask_ptr + (b.to(tl.int64) * num_nodes + node.to(tl.int64)) * num_words

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    p_dtype = v_ptr.dtype.element_ty
    offs_n = tl.arange(0, BLOCK_N)

    # ---- prefix tiles: keys [lo, hi) of this split, no mask loads. The splits share this request's
    # prefix (read on the device: no host sync), in whole tiles.
    if not SKIP_PREFIX:
        chunk = tl.cdiv(tl.cdiv(prefix, num_splits), BLOCK_N) * BLOCK_N
        lo = split * chunk
        hi = tl.minimum(lo + chunk, prefix)
        if WHILE_LOOPS:  # triton 3.6's interpreter cannot take a runtime range() bound
            start = lo
            while start < hi:
                m_i, l_i, acc = _prefix_tile(m_i, l_i, acc, q, start, hi, offs_n, b, kvh, d, d_ok, k_ptr, v_ptr,
                                             table_ptr, table_stride, block_size, num_blocks, stride_k0, stride_k1,
                                             stride_kh, stride_kd, stride_v0, stride_v1, stride_vh, stride_vd,
                                             qk_scale, p_dtype, PAGED, IEEE)
                start += BLOCK_N
        else:
            for start in range(lo, hi, BLOCK_N):
                m_i, l_i, acc = _prefix_tile(m_i, l_i, acc, q, start, hi, offs_n, b, kvh, d, d_ok, k_ptr, v_ptr,
                                             table_ptr, table_stride, block_size, num_blocks, stride_k0, stride_k1,
                                             stride_kh, stride_kd, stride_v0, stride_v1, stride_vh, stride_vd,
                                             qk_scale, p_dtype, PAGED, IEEE)

    # ---- tree tiles (last split only): keys prefix + t, visible iff bit t of the row
    tree_end = tl.where(split == num_splits - 1, num_nodes, 0)
    if WHILE_LOOPS:
        t0 = tl.zeros([], tl.int32)
        while t0 < tree_end:
            m_i, l_i, acc = _tree_tile(m_i, l_i, acc, q, t0, prefix, capacity, num_nodes, mask_rows, row_ok,
                                       offs_n, b, kvh, d, d_ok, k_ptr, v_ptr, table_ptr, table_stride, block_size,
                                       num_blocks, stride_k0, stride_k1, stride_kh, stride_kd, stride_v0, stride_v1,
                                       stride_vh, stride_vd, qk_scale, p_dtype, PAGED, IEEE)
            t0 += BLOCK_N
    else:
        for t0 in range(0, tree_end, BLOCK_N):
            m_i, l_i, acc = _tree_tile(m_i, l_i, acc, q, t0, prefix, capacity, num_nodes, mask_rows, row_ok,
                                       offs_n, b, kvh, d, d_ok, k_ptr, v_ptr, table_ptr, table_stride, block_size,
                                       num_blocks, stride_k0, stride_k1, stride_kh, stride_kd, stride_v0, stride_v1,
                                       stride_vh, stride_vd, qk_scale, p_dtype, PAGED, IEEE)

    has = row_ok & (l_i > 0)
    l_safe = tl.where(has, l_i, 1.0)
    out = tl.where(has[:, None], acc / l_safe[:, None], 0.0)
    lse = tl.where(has, (m_i + tl.log2(l_safe)) * LN2, float("-inf"))

    o_ptrs = (out_ptr + split.to(tl.int64) * stride_os + b.to(tl.int64) * stride_ob
              + node[:, None].to(tl.int64) * stride_on + head[:, None].to(tl.int64) * stride_oh
              + d[None, :].to(tl.int64) * stride_od)
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
    l_ptrs = (lse_ptr + split.to(tl.int64) * stride_ls + b.to(tl.int64) * stride_lb
              + node.to(tl.int64) * stride_ln + head.to(tl.int64) * stride_lh)
    tl.store(l_ptrs, lse, mask=row_ok)


@triton.jit
def combine_splits_kernel(part_out_ptr, part_lse_ptr, out_ptr, lse_ptr, num_rows, head_dim, num_splits,
                          BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    """Merge the split-KV partials of one row: part_out [S, rows, D] float32, part_lse [S, rows]."""
    row = tl.program_id(0).to(tl.int64)
    s = tl.arange(0, BLOCK_S)
    s_ok = s < num_splits
    d = tl.arange(0, BLOCK_D)
    d_ok = d < head_dim
    lse = tl.load(part_lse_ptr + s.to(tl.int64) * num_rows + row, mask=s_ok, other=float("-inf"))
    m = tl.max(lse, axis=0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp(lse - m_safe)  # -inf sides: 0
    total = tl.sum(w, axis=0)
    ptrs = part_out_ptr + (s.to(tl.int64)[:, None] * num_rows + row) * head_dim + d[None, :]
    parts = tl.load(ptrs, mask=(s_ok & (w > 0))[:, None] & d_ok[None, :], other=0.0)
    total_safe = tl.where(total > 0, total, 1.0)
    out = tl.sum(parts * w[:, None], axis=0) / total_safe
    tl.store(out_ptr + row * head_dim + d, out.to(out_ptr.dtype.element_ty), mask=d_ok)
    tl.store(lse_ptr + row, tl.where(total > 0, m_safe + tl.log(total_safe), float("-inf")))


@triton.jit
def merge_states_kernel(out_a_ptr, lse_a_ptr, out_b_ptr, lse_b_ptr, out_ptr, lse_ptr, head_dim,
                        BLOCK_D: tl.constexpr):
    """Exact merge of two partial attentions of one row (contiguous [rows, D], lse [rows])."""
    row = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < head_dim
    la = tl.load(lse_a_ptr + row)
    lb = tl.load(lse_b_ptr + row)
    # a NaN lse makes the merged lse NaN and an lse of +inf makes it +inf, their output 0 (log(e^a + e^b), as
    # the reference computes it); neither side is then weighted
    nan = (la != la) | (lb != lb)
    inf = (la == float("inf")) | (lb == float("inf"))
    m = tl.maximum(la, lb)
    m_safe = tl.where((m == float("-inf")) | nan | inf, 0.0, m)
    wa = tl.where(nan | inf, 0.0, tl.exp(la - m_safe))
    wb = tl.where(nan | inf, 0.0, tl.exp(lb - m_safe))
    total = wa + wb
    total_safe = tl.where(total > 0, total, 1.0)
    a = tl.load(out_a_ptr + row * head_dim + d, mask=d_ok, other=0.0).to(tl.float32)
    b = tl.load(out_b_ptr + row * head_dim + d, mask=d_ok, other=0.0).to(tl.float32)
    a = tl.where(wa > 0, a * wa, 0.0)  # an empty side's output (maybe garbage) is never used
    b = tl.where(wb > 0, b * wb, 0.0)
    out = (a + b) / total_safe
    tl.store(out_ptr + row * head_dim + d, out.to(out_ptr.dtype.element_ty), mask=d_ok)
    lse = tl.where(total > 0, m_safe + tl.log(total_safe), float("-inf"))
    lse = tl.where(inf, float("inf"), lse)
    tl.store(lse_ptr + row, tl.where(nan, float("nan"), lse))
