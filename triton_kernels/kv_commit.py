"""KV commit in Triton (DESIGN.md §5.5): the same path rule and slot arithmetic
as csrc/kv/kv_math.h, and the same two-kernel design as csrc/kv/kv_kernels.cu.

* ``kv_move_kernel`` moves every cache of one element size in ONE launch, grid
  (request, cache). The caches reach it as a device table of their addresses
  (``cache_addresses``, int64 [C], cast to pointers of the element size's integer
  type: moves are bit-exact for every dtype) and of their geometry
  (``cache_geometry``, int64 [C, 6]: stride0, stride1, stride_head, stride_dim,
  head_dim, H * D, in elements). A call whose caches all share one element size
  (the usual case) is one launch. It only reads ``seq_lens``.
  Two constexprs, picked by the launcher from host-known metadata, select the
  per-element addressing: ``CONTIGUOUS_ROWS`` (every cache's slot row of H * D
  elements is contiguous: a row element's offset is its index, no head_dim division)
  and ``VEC`` (elements per 16 bytes where every cache's address, slot strides and
  row length are multiples of 16 bytes, else 1: the moves become 16-byte vectors).
  Other layouts take the general path (offsets through stride_head and stride_dim).
* ``kv_advance_kernel`` then advances ``seq_lens[b]`` by the path length, one
  program per request. Launched after the moves on the same stream, so no move
  program can see an advanced ``seq_lens[b]``; nothing is kept between launches.

Loops have constexpr bounds (BLOCK_M path entries, ROW_TILES tiles of BLOCK
row elements): Triton 3.6's interpreter cannot iterate up to a runtime argument
with NumPy 2.

A program checks all path entries at once (``_valid_prefix``: the first bad entry
ends the path), then moves the slots in increasing path order (unpaged caches take
an entry's slot from the path entry itself, a scalar load; paged ones pick it out of
the checked vectors, which hold the block table lookups), row by row over one
fixed tile layout, so each column stays with one thread: alias-safe by the argument
in kv_math.h (slot i is written only after every read of it, and never read again).
Identity entries (a_i == i, a fully accepted chain) copy nothing.

Every mask is a vector built from vector comparisons: Triton 3.9's interpreter
refuses a mask that combines a vector with a scalar condition ("mask has
unsupported dtype"), so scalars (seq_lens[b]) are loaded as vectors.
"""

import triton
import triton.language as tl

@triton.jit
def _valid_prefix(seq_lens_ptr, path_ptr, block_table_ptr, b, max_path, path_stride, capacity, block_size,
                  num_blocks, block_table_stride, PAGED: tl.constexpr, BLOCK_M: tl.constexpr):
    """(i, a, length, src0, src1, dst0, dst1) of request b: entry index, path entry, the
    number of leading valid entries, and the (index0, index1) slot addresses of every
    entry's source and destination (meaningful for i < length)."""
    i = tl.arange(0, BLOCK_M).to(tl.int64)
    seq_len = tl.load(seq_lens_ptr + b + i * 0).to(tl.int64)  # the same value in every lane, as a vector
    inside = i < max_path
    a = tl.load(path_ptr + b * path_stride + i, mask=inside, other=-1).to(tl.int64)
    prev = tl.load(path_ptr + b * path_stride + i - 1, mask=inside & (i > 0), other=-1).to(tl.int64)
    ok = inside & (seq_len >= 0) & (a >= 0) & tl.where(i == 0, a == 0, a > prev)
    ok = ok & (a < capacity) & (i < capacity) & (a < capacity - seq_len) & (i < capacity - seq_len)
    ok = ok & (seq_len + i < 2147483647)  # the new length fits seq_lens (int32): kv_math.h kKVMaxSeqLen
    src_pos = seq_len + a
    dst_pos = seq_len + i
    if PAGED:
        row = block_table_ptr + b * block_table_stride
        src0 = tl.load(row + src_pos // block_size, mask=ok, other=-1).to(tl.int64)
        dst0 = tl.load(row + dst_pos // block_size, mask=ok, other=-1).to(tl.int64)
        ok = ok & (src0 >= 0) & (src0 < num_blocks) & (dst0 >= 0) & (dst0 < num_blocks)
        src1 = src_pos % block_size
        dst1 = dst_pos % block_size
    else:
        src0 = b + i * 0
        dst0 = src0
        src1 = src_pos
        dst1 = dst_pos
    length = tl.min(tl.where(ok, BLOCK_M, i), 0)
    return i, a, length, src0, src1, dst0, dst1


@triton.jit(do_not_specialize=["max_path"])
def kv_move_kernel(cache_addresses_ptr, cache_geometry_ptr, seq_lens_ptr, path_ptr, block_table_ptr,
                   max_path, path_stride, capacity, block_size, num_blocks, block_table_stride,
                   ELEM_BYTES: tl.constexpr, PAGED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK: tl.constexpr,
                   ROW_TILES: tl.constexpr, CONTIGUOUS_ROWS: tl.constexpr, VEC: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1).to(tl.int64)
    i, a, length, src0, src1, dst0, dst1 = _valid_prefix(
        seq_lens_ptr, path_ptr, block_table_ptr, b, max_path, path_stride, capacity, block_size, num_blocks,
        block_table_stride, PAGED, BLOCK_M)
    moves = tl.sum(((i < length) & (a != i)).to(tl.int32), 0)
    if moves > 0:  # a fully accepted chain moves nothing: no per-element work
        address = tl.load(cache_addresses_ptr + c)
        if ELEM_BYTES == 1:
            cache_ptr = address.to(tl.pointer_type(tl.int8))
        elif ELEM_BYTES == 2:
            cache_ptr = address.to(tl.pointer_type(tl.int16))
        else:
            cache_ptr = address.to(tl.pointer_type(tl.int32))
        geometry = cache_geometry_ptr + c * 6
        stride0 = tl.load(geometry + 0)
        stride1 = tl.load(geometry + 1)
        stride_head = tl.load(geometry + 2)
        stride_dim = tl.load(geometry + 3)
        head_dim = tl.load(geometry + 4).to(tl.int32)
        row_elems = tl.load(geometry + 5).to(tl.int32)
        if VEC > 1:
            # The launcher proved that every cache of the group starts on 16 bytes and that its slot strides
            # and row length are multiples of VEC elements (16 bytes): say so, for 16-byte loads and stores.
            # (x // VEC) * VEC is x itself then; it states the divisibility where a hint would not reach.
            cache_ptr = tl.multiple_of(cache_ptr, 16)
            row_elems = tl.multiple_of(row_elems, VEC)
            stride0 = (stride0 // VEC) * VEC
            stride1 = (stride1 // VEC) * VEC
        if PAGED:
            src_off = src0 * stride0 + src1 * stride1
            dst_off = dst0 * stride0 + dst1 * stride1
        else:
            # Contiguous caches: slot seq_len + x of request b is base + x * stride1, so an entry's offsets
            # come from the path entry itself (a scalar load, no cross-lane selection per entry).
            base = b * stride0 + tl.load(seq_lens_ptr + b).to(tl.int64) * stride1
            path_row = path_ptr + b * path_stride
        cols = tl.arange(0, BLOCK)  # int32: H * D < 2^31 (checked by the wrapper)
        for k in range(1, BLOCK_M):  # constexpr bounds: k < length <= max_path <= BLOCK_M
            if k < length:
                if PAGED:
                    pick = i == k
                    a_k = tl.sum(tl.where(pick, a, 0), 0)
                    src = tl.sum(tl.where(pick, src_off, 0), 0)
                    dst = tl.sum(tl.where(pick, dst_off, 0), 0)
                    if VEC > 1:
                        src = (src // VEC) * VEC
                        dst = (dst // VEC) * VEC
                else:
                    a_k = tl.load(path_row + k).to(tl.int64)  # a valid entry (k < length): inside the path
                    src = base + a_k * stride1
                    dst = base + k * stride1
                if a_k != k:
                    for tile in range(ROW_TILES):  # the group's widest row in tiles of BLOCK; masked per cache
                        j = tile * BLOCK + cols
                        col_mask = j < row_elems
                        if CONTIGUOUS_ROWS:  # stride_dim == 1, stride_head == head_dim for every cache
                            col = j
                        else:
                            col = ((j // head_dim).to(tl.int64) * stride_head
                                   + (j % head_dim).to(tl.int64) * stride_dim)
                        v = tl.load(cache_ptr + src + col, mask=col_mask)
                        tl.store(cache_ptr + dst + col, v, mask=col_mask)


@triton.jit(do_not_specialize=["max_path"])
def kv_advance_kernel(seq_lens_ptr, path_ptr, block_table_ptr, max_path, path_stride, capacity, block_size,
                      num_blocks, block_table_stride, PAGED: tl.constexpr, BLOCK_M: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    i, a, length, src0, src1, dst0, dst1 = _valid_prefix(
        seq_lens_ptr, path_ptr, block_table_ptr, b, max_path, path_stride, capacity, block_size, num_blocks,
        block_table_stride, PAGED, BLOCK_M)
    seq_len = tl.load(seq_lens_ptr + b)
    tl.store(seq_lens_ptr + b, (seq_len + length).to(tl.int32))  # <= 2^31 - 1 by the rule
