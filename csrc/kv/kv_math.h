// Slot arithmetic and the path validity rule of kv_commit (DESIGN.md §5.5),
// shared by the CPU kernel (kv_cpu.cpp), the CUDA kernel (kv_kernels.cu) and the
// CPU value checks (kv_op.cpp). Plain C++17, no torch headers.
//
// Request b with committed length seq_len and path a = (0, a1, ..., a_{m-1}, -1, ...):
// for i in 1..m-1, logical slot seq_len + i receives the old contents of logical
// slot seq_len + a_i; then seq_len += m. Logical slot p of request b lives at
//   contiguous [B, S, H, D]:           (index0, index1) = (b, p),                       p < S
//   paged [num_blocks, block_size, H, D]: (index0, index1) = (block_table[b, p / bs], p % bs),
//                                       p < max_blocks * bs and 0 <= block id < num_blocks.
//
// Why in-order copying is alias-safe (so no staging buffer is needed): the valid
// prefix of a path is strictly increasing from a_0 = 0, hence a_i >= i.
//   * Move i writes slot i. A later move j > i reads slot a_j >= j > i, never slot i:
//     nothing a move writes is read afterwards.
//   * Move i reads slot a_i. An earlier move k < i wrote slot k < i <= a_i: nothing a
//     move reads was overwritten before.
// So executing the moves in increasing i (per column, any batching of loads before
// stores within increasing order) equals the out-of-place gather. Moreover once
// a_f != f, a_j >= a_f + (j - f) > j for all j > f: the identity entries form a
// prefix 0..f-1 and copy nothing.
#pragma once

#include <cstdint>

#include "../common/macros.h"

namespace specdec {

// Why a path entry ends the path. kOk and kEnd (padding reached) are not errors;
// the others raise ValueError on CPU and silently end the path on the GPU.
enum class KVPathStatus : int {
  kOk = 0,
  kEnd = 1,               // a negative entry after the root: the -1 padding
  kBadSeqLen = 2,         // seq_lens[b] < 0
  kFirstNotZero = 3,      // accepted_path[b, 0] != 0
  kNotIncreasing = 4,     // accepted_path[b, i] <= accepted_path[b, i - 1]
  kOutsideCache = 5,      // slot seq_len + a_i >= S (contiguous)
  kOutsideBlocks = 6,     // slot beyond max_blocks * block_size, or its block id outside [0, num_blocks)
  kNegativeInMiddle = 7,  // a non-negative entry after the padding started (CPU check only)
  kSeqLenOverflow = 8,    // seq_lens[b] + i + 1 > INT32_MAX: the new length would not fit seq_lens (int32)
};

// The largest committed length seq_lens (int32) can hold.
constexpr int64_t kKVMaxSeqLen = 2147483647;

// The cache geometry every cache of one call shares.
struct KVGeometry {
  int64_t capacity;           // slots per request: S, or max_blocks * block_size (paged)
  int64_t block_size;         // paged only
  int64_t num_blocks;         // paged only
  const void* block_table;    // paged: [B, max_blocks] (row stride block_table_stride); nullptr: contiguous
  int64_t block_table_stride;
  bool block_table_i64;
};

// Where a logical slot lives: (b, position) or (block id, offset in block).
struct KVSlotAddr {
  int64_t index0;
  int64_t index1;
};

SPECDEC_HD int64_t kv_load_index(const void* base, bool is_i64, int64_t i) {
  return is_i64 ? static_cast<const int64_t*>(base)[i] : static_cast<int64_t>(static_cast<const int32_t*>(base)[i]);
}

// Locates logical slot `pos` of request b. Never reads the block table outside row b.
SPECDEC_HD KVPathStatus kv_locate(const KVGeometry& g, int64_t b, int64_t pos, KVSlotAddr* out) {
  const bool paged = g.block_table != nullptr;
  if (pos < 0 || pos >= g.capacity) return paged ? KVPathStatus::kOutsideBlocks : KVPathStatus::kOutsideCache;
  if (!paged) {
    out->index0 = b;
    out->index1 = pos;
    return KVPathStatus::kOk;
  }
  const int64_t block = kv_load_index(g.block_table, g.block_table_i64, b * g.block_table_stride + pos / g.block_size);
  if (block < 0 || block >= g.num_blocks) return KVPathStatus::kOutsideBlocks;
  out->index0 = block;
  out->index1 = pos % g.block_size;
  return KVPathStatus::kOk;
}

// The checks of entry i (value a; prev = entry i - 1, which is valid) that need no
// memory beyond the path: seq_len, the root, the padding, the order, the capacity
// and the int32 range of the new length. Overflow-free for any int64 a: a is
// compared with the capacity before seq_len is added.
SPECDEC_HD KVPathStatus kv_path_entry_rule(const KVGeometry& g, int64_t seq_len, int64_t i, int64_t a,
                                           int64_t prev) {
  if (seq_len < 0) return KVPathStatus::kBadSeqLen;
  if (i == 0) {
    if (a != 0) return KVPathStatus::kFirstNotZero;
  } else {
    if (a < 0) return KVPathStatus::kEnd;
    if (a <= prev) return KVPathStatus::kNotIncreasing;
  }
  if (a >= g.capacity || i >= g.capacity || a >= g.capacity - seq_len || i >= g.capacity - seq_len) {
    return g.block_table != nullptr ? KVPathStatus::kOutsideBlocks : KVPathStatus::kOutsideCache;
  }
  if (i >= kKVMaxSeqLen - seq_len) return KVPathStatus::kSeqLenOverflow;
  return KVPathStatus::kOk;
}

// The status of entry i of request b's path (kv_path_entry_rule, then the block
// table), and on kOk the source (seq_len + a) and destination (seq_len + i) slot addresses.
SPECDEC_HD KVPathStatus kv_path_entry(const KVGeometry& g, int64_t b, int64_t seq_len, int64_t i, int64_t a,
                                      int64_t prev, KVSlotAddr* src, KVSlotAddr* dst) {
  const KVPathStatus s = kv_path_entry_rule(g, seq_len, i, a, prev);
  if (s != KVPathStatus::kOk) return s;
  const KVPathStatus t = kv_locate(g, b, seq_len + a, src);
  if (t != KVPathStatus::kOk) return t;
  return kv_locate(g, b, seq_len + i, dst);
}

// Whether request b's commit moves nothing, decided from the path alone (no block
// table read): no entry before the first one failing kv_path_entry_rule has a_i != i.
// Sound by the argument at the top: kv_scan_path's first_move == length whenever it
// returns true.
SPECDEC_HD bool kv_path_moves_nothing(const KVGeometry& g, const void* path, bool path_i64, int64_t row_offset,
                                      int64_t max_path, int64_t seq_len) {
  int64_t prev = -1;
  for (int64_t i = 0; i < max_path; ++i) {
    const int64_t a = kv_load_index(path, path_i64, row_offset + i);
    if (kv_path_entry_rule(g, seq_len, i, a, prev) != KVPathStatus::kOk) return true;
    if (a != i) return false;
    prev = a;
  }
  return true;
}

// The valid prefix of a path: entries [0, length) are committed, entries
// [first_move, length) move (a_i != i). status / bad_index: why it ended.
struct KVPathScan {
  int64_t length;
  int64_t first_move;
  KVPathStatus status;
  int64_t bad_index;
};

// Scans request b's path row (entries path[row_offset + i], i < max_path).
// check_tail: also report a non-negative entry after the padding (CPU checks).
SPECDEC_HD KVPathScan kv_scan_path(const KVGeometry& g, const void* path, bool path_i64, int64_t row_offset,
                                   int64_t max_path, int64_t b, int64_t seq_len, bool check_tail) {
  KVPathScan r{max_path, -1, KVPathStatus::kOk, -1};
  int64_t prev = -1;
  for (int64_t i = 0; i < max_path; ++i) {
    const int64_t a = kv_load_index(path, path_i64, row_offset + i);
    KVSlotAddr src, dst;
    const KVPathStatus s = kv_path_entry(g, b, seq_len, i, a, prev, &src, &dst);
    if (s != KVPathStatus::kOk) {
      r.length = i;
      r.status = s;
      r.bad_index = i;
      if (s == KVPathStatus::kEnd) {
        r.bad_index = -1;
        for (int64_t j = i + 1; check_tail && j < max_path; ++j) {
          if (kv_load_index(path, path_i64, row_offset + j) >= 0) {
            r.status = KVPathStatus::kNegativeInMiddle;
            r.bad_index = j;
            break;
          }
        }
      }
      break;
    }
    if (r.first_move < 0 && a != i) r.first_move = i;
    prev = a;
  }
  if (r.first_move < 0 || r.first_move > r.length) r.first_move = r.length;
  return r;
}

SPECDEC_HD bool kv_status_is_error(KVPathStatus s) {
  return s != KVPathStatus::kOk && s != KVPathStatus::kEnd;
}

// ---------------------------------------------------------------------------------- caches

// One cache (a layer's K or V) as raw bytes: slot (index0, index1), head h and
// element d live at data + index0*stride0 + index1*stride1 + h*stride_head + d*stride_dim.
// Copies go in units of unit_bytes: with dense head rows (stride_dim == elem_size) a
// unit is unit_bytes of the row (16 where alignment allows); otherwise one element.
struct KVCacheDesc {
  uint8_t* data;
  int64_t stride0;      // bytes: batch (contiguous) or block (paged)
  int64_t stride1;      // bytes: slot
  int64_t stride_head;  // bytes
  int64_t stride_dim;   // bytes
  int32_t num_heads;
  int32_t head_dim;
  int32_t elem_size;    // 1, 2 or 4
  int32_t unit_bytes;   // 16, 8, 4, 2 or 1 (dense rows) / elem_size (strided rows)
};

SPECDEC_HD bool kv_dense_rows(const KVCacheDesc& c) { return c.stride_dim == c.elem_size; }

// The widest copy unit (16, 8, 4, 2, 1 bytes) that every row start and the row length
// are multiples of, given the base address and the byte strides. Strided rows copy
// element by element.
SPECDEC_HD int32_t kv_unit_bytes(uint64_t address, int64_t stride0, int64_t stride1, int64_t stride_head,
                                 int64_t stride_dim, int64_t head_dim, int64_t elem_size) {
  if (stride_dim != elem_size) return static_cast<int32_t>(elem_size);
  const uint64_t row_bytes = static_cast<uint64_t>(head_dim * elem_size);
  uint64_t bits = address | static_cast<uint64_t>(stride0) | static_cast<uint64_t>(stride1) |
                  static_cast<uint64_t>(stride_head) | row_bytes;
  int32_t unit = 16;
  while (unit > 1 && (bits & static_cast<uint64_t>(unit - 1)) != 0) unit >>= 1;
  return unit;
}

SPECDEC_HD int64_t kv_units_per_head(const KVCacheDesc& c) {
  return kv_dense_rows(c) ? static_cast<int64_t>(c.head_dim) * c.elem_size / c.unit_bytes : c.head_dim;
}

SPECDEC_HD int64_t kv_units_per_slot(const KVCacheDesc& c) { return c.num_heads * kv_units_per_head(c); }

// Byte offset of copy unit u (0 <= u < kv_units_per_slot) inside a slot. The op
// checks num_heads * head_dim * elem_size < 2^31, so the division is a 32-bit one.
SPECDEC_HD int64_t kv_unit_offset(const KVCacheDesc& c, int64_t u) {
  const uint32_t per_head = static_cast<uint32_t>(kv_units_per_head(c));
  const uint32_t h = static_cast<uint32_t>(u) / per_head, r = static_cast<uint32_t>(u) - h * per_head;
  return static_cast<int64_t>(h) * c.stride_head +
         static_cast<int64_t>(r) * (kv_dense_rows(c) ? c.unit_bytes : c.stride_dim);
}

SPECDEC_HD int64_t kv_slot_offset(const KVCacheDesc& c, KVSlotAddr a) {
  return a.index0 * c.stride0 + a.index1 * c.stride1;
}

}  // namespace specdec
