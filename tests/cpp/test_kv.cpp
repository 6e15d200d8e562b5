// Host-side tests of csrc/kv/kv_math.h: the path rule, slot addressing, copy
// units, and the in-order (batched loads, then stores) move schedule of the CUDA
// kernel against the out-of-place gather on random overlapping paths.
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "check.h"
#include "kv/kv_math.h"

using namespace specdec;

static KVGeometry contiguous(int64_t S) { return KVGeometry{S, 0, 0, nullptr, 0, false}; }

static KVPathScan scan(const KVGeometry& g, const std::vector<int64_t>& path, int64_t seq_len, int64_t b = 0,
                       bool tail = true) {
  return kv_scan_path(g, path.data(), true, 0, static_cast<int64_t>(path.size()), b, seq_len, tail);
}

static void test_path_rule() {
  const KVGeometry g = contiguous(16);
  KVPathScan s = scan(g, {0, 2, 3, -1, -1}, 4);
  CHECK(s.length == 3 && s.first_move == 1 && s.status == KVPathStatus::kEnd);
  s = scan(g, {0, 1, 2, 3}, 4);  // chain: nothing moves
  CHECK(s.length == 4 && s.first_move == 4 && s.status == KVPathStatus::kOk);
  s = scan(g, {0, 1, 5}, 4);  // identity prefix, then moves
  CHECK(s.length == 3 && s.first_move == 2);
  s = scan(g, {1, 2}, 4);
  CHECK(s.length == 0 && s.status == KVPathStatus::kFirstNotZero && s.bad_index == 0);
  s = scan(g, {-1, -1}, 4);
  CHECK(s.length == 0 && s.status == KVPathStatus::kFirstNotZero);
  s = scan(g, {0, 3, 3}, 4);
  CHECK(s.length == 2 && s.status == KVPathStatus::kNotIncreasing && s.bad_index == 2);
  s = scan(g, {0, 3, 2}, 4);
  CHECK(s.length == 2 && s.status == KVPathStatus::kNotIncreasing);
  s = scan(g, {0, 11, 12}, 4);  // slot 4 + 12 = 16 == S
  CHECK(s.length == 2 && s.status == KVPathStatus::kOutsideCache && s.bad_index == 2);
  s = scan(g, {0, INT64_MAX}, 4);  // no overflow
  CHECK(s.length == 1 && s.status == KVPathStatus::kOutsideCache);
  s = scan(g, {0, 2, -1, 5}, 4);
  CHECK(s.length == 2 && s.status == KVPathStatus::kNegativeInMiddle && s.bad_index == 3);
  s = scan(g, {0, 2, -1, 5}, 4, 0, /*tail=*/false);  // the GPU: just the end
  CHECK(s.length == 2 && s.status == KVPathStatus::kEnd);
  s = scan(g, {0, 1}, -1);
  CHECK(s.length == 0 && s.status == KVPathStatus::kBadSeqLen);
  s = scan(g, {0}, 16);  // the root slot itself must exist
  CHECK(s.length == 0 && s.status == KVPathStatus::kOutsideCache);
  s = scan(g, {}, 3);
  CHECK(s.length == 0 && s.status == KVPathStatus::kOk);
}

static void test_paged() {
  // 2 requests, max_blocks 3, block_size 4; request 1's third block is unallocated (-1).
  const int32_t table[6] = {5, 1, 7, 2, 0, -1};
  const KVGeometry g{12, 4, 8, table, 3, false};
  KVSlotAddr a{};
  CHECK(kv_locate(g, 0, 9, &a) == KVPathStatus::kOk && a.index0 == 7 && a.index1 == 1);
  CHECK(kv_locate(g, 1, 5, &a) == KVPathStatus::kOk && a.index0 == 0 && a.index1 == 1);
  CHECK(kv_locate(g, 1, 8, &a) == KVPathStatus::kOutsideBlocks);
  CHECK(kv_locate(g, 0, 12, &a) == KVPathStatus::kOutsideBlocks);
  std::vector<int64_t> path = {0, 1, 4, -1};
  KVPathScan s = kv_scan_path(g, path.data(), true, 0, 4, 1, 3, true);  // slot 3 + 4 = 7: block 0, fine
  CHECK(s.length == 3 && s.status == KVPathStatus::kEnd);
  path = {0, 2, 5, -1};  // slot 3 + 5 = 8 lands in the unallocated block
  s = kv_scan_path(g, path.data(), true, 0, 4, 1, 3, true);
  CHECK(s.length == 2 && s.status == KVPathStatus::kOutsideBlocks && s.bad_index == 2);
  const int32_t bad_table[3] = {0, 9, 1};  // block id 9 >= num_blocks
  const KVGeometry g2{12, 4, 8, bad_table, 3, false};
  path = {0, 5};
  s = kv_scan_path(g2, path.data(), true, 0, 2, 0, 0, true);
  CHECK(s.length == 1 && s.status == KVPathStatus::kOutsideBlocks);
}

static void test_units() {
  // bf16, D = 128, dense rows, 16-byte aligned strides.
  CHECK(kv_unit_bytes(0x1000, 2 * 16 * 8 * 128, 2 * 8 * 128, 2 * 128, 2, 128, 2) == 16);
  CHECK(kv_unit_bytes(0x1008, 4096, 256, 256, 2, 128, 2) == 8);  // base only 8-aligned
  CHECK(kv_unit_bytes(0x1000, 4096, 256, 256, 2, 3, 2) == 2);    // row of 6 bytes
  CHECK(kv_unit_bytes(0x1000, 4096, 256, 256, 1, 5, 1) == 1);    // fp8, 5 bytes
  CHECK(kv_unit_bytes(0x1000, 4096, 8, 512, 64, 4, 2) == 2);     // strided dim: one element per unit
  KVCacheDesc c{nullptr, 0, 0, 1024, 2, 4, 128, 2, 16};
  CHECK(kv_units_per_head(c) == 16 && kv_units_per_slot(c) == 64);
  CHECK(kv_unit_offset(c, 17) == 1024 + 16);
  KVCacheDesc strided{nullptr, 0, 0, 64, 6, 2, 3, 2, 2};
  CHECK(kv_units_per_slot(strided) == 6 && kv_unit_offset(strided, 4) == 64 + 6);
}

// The CUDA kernel's schedule on one column: moves in increasing order, up to 8
// loads before their 8 stores, must equal the out-of-place gather.
static void test_schedule_equals_gather() {
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 2000; ++trial) {
    const int64_t window = 1 + rng() % 40, seq_len = rng() % 5, S = seq_len + window + rng() % 3;
    std::vector<int64_t> path = {0};
    for (int64_t x = 1; x < window; ++x) {
      if (rng() % 3 == 0) path.push_back(x);
    }
    path.push_back(-1);
    std::vector<int32_t> col(S), gathered;
    for (int64_t i = 0; i < S; ++i) col[i] = static_cast<int32_t>(1000 * trial + i);
    const KVGeometry g = contiguous(S);
    const KVPathScan s = scan(g, path, seq_len);
    CHECK(s.status == KVPathStatus::kEnd);
    std::vector<int32_t> expect = col;
    for (int64_t i = 0; i < s.length; ++i) expect[seq_len + i] = col[seq_len + path[i]];
    std::vector<int64_t> src, dst;
    for (int64_t i = s.first_move; i < s.length; ++i) {
      KVSlotAddr a{}, d{};
      CHECK(kv_path_entry(g, 0, seq_len, i, path[i], path[i - 1], &a, &d) == KVPathStatus::kOk);
      src.push_back(a.index1);
      dst.push_back(d.index1);
    }
    const int batch = 1 + rng() % 8;
    for (size_t k = 0; k < src.size(); k += batch) {
      int32_t v[8];
      for (size_t j = 0; j < static_cast<size_t>(batch) && k + j < src.size(); ++j) v[j] = col[src[k + j]];
      for (size_t j = 0; j < static_cast<size_t>(batch) && k + j < src.size(); ++j) col[dst[k + j]] = v[j];
    }
    CHECK(col == expect);
  }
}

int main() {
  test_path_rule();
  test_paged();
  test_units();
  test_schedule_equals_gather();
  TEST_MAIN_END();
}
