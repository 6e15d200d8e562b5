"""KV commit in Triton (DESIGN.md §5.5): the same path rule and slot arithmetic
as csrc/kv/kv_math.h.

One program per request and one launch per cache (a Triton kernel cannot take
a list of pointers without a device-side table, i.e. a host-to-device copy);
only the last launch advances seq_lens, so every launch reads the committed
length before the window. The program checks all path entries at once (the
first bad entry ends the path), then moves the slots in increasing path order,
row by row over one fixed tile layout, so each column stays with one thread:
alias-safe by the argument in kv_math.h (slot i is written only after every
read of it, and never read again). The caches are passed as integer views of
the same element size: moves are bit-exact for every dtype.
"""

import triton
import triton.language as tl


@triton.jit(do_not_specialize=["max_path"])
def kv_commit_kernel(cache_ptr, seq_lens_ptr, path_ptr, block_table_ptr,
                     max_path, path_stride, capacity, block_size, num_blocks, block_table_stride,
                     stride0, stride1, stride_head, stride_dim, head_dim, row_elems,
                     PAGED: tl.constexpr, UPDATE_SEQ_LENS: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    seq_len = tl.load(seq_lens_ptr + b).to(tl.int64)

    # ---- the valid prefix of the path (kv_path_entry over every entry at once)
    i = tl.arange(0, BLOCK_M).to(tl.int64)
    inside = i < max_path
    a = tl.load(path_ptr + b * path_stride + i, mask=inside, other=-1).to(tl.int64)
    prev = tl.load(path_ptr + b * path_stride + i - 1, mask=inside & (i > 0), other=-1).to(tl.int64)
    ok = inside & (seq_len >= 0) & (a >= 0) & tl.where(i == 0, a == 0, a > prev)
    ok = ok & (a < capacity) & (i < capacity) & (a < capacity - seq_len) & (i < capacity - seq_len)
    src_pos = seq_len + a
    dst_pos = seq_len + i
    if PAGED:
        src_block = tl.load(block_table_ptr + b * block_table_stride + src_pos // block_size, mask=ok,
                            other=-1).to(tl.int64)
        dst_block = tl.load(block_table_ptr + b * block_table_stride + dst_pos // block_size, mask=ok,
                            other=-1).to(tl.int64)
        ok = ok & (src_block >= 0) & (src_block < num_blocks) & (dst_block >= 0) & (dst_block < num_blocks)
        src_off = src_block * stride0 + (src_pos % block_size) * stride1
        dst_off = dst_block * stride0 + (dst_pos % block_size) * stride1
    else:
        src_off = b * stride0 + src_pos * stride1
        dst_off = b * stride0 + dst_pos * stride1
    length = tl.min(tl.where(ok, BLOCK_M, i), 0)

    # ---- the moves, in increasing order; identity entries (a_i == i) copy nothing
    cols = tl.arange(0, BLOCK).to(tl.int64)
    for k in range(1, max_path):
        pick = i == k
        a_k = tl.sum(tl.where(pick, a, 0), 0)
        if (k < length) & (a_k != k):
            src = tl.sum(tl.where(pick, src_off, 0), 0)
            dst = tl.sum(tl.where(pick, dst_off, 0), 0)
            for start in range(0, row_elems, BLOCK):
                j = start + cols
                col_mask = j < row_elems
                col = (j // head_dim) * stride_head + (j % head_dim) * stride_dim
                v = tl.load(cache_ptr + src + col, mask=col_mask)
                tl.store(cache_ptr + dst + col, v, mask=col_mask)

    if UPDATE_SEQ_LENS:
        tl.store(seq_lens_ptr + b, (seq_len + length).to(tl.int32))
