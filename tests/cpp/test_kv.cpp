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

// The int32 range of seq_lens bounds a path when no cache does (no caches: capacity 2^62).
static void test_seq_len_overflow() {
  const KVGeometry g = contiguous(int64_t{1} << 62);
  const int64_t top = kKVMaxSeqLen;
  CHECK(kv_path_entry_rule(g, top - 3, 2, 2, 1) == KVPathStatus::kOk);         // new length top
  CHECK(kv_path_entry_rule(g, top - 3, 3, 3, 2) == KVPathStatus::kSeqLenOverflow);
  CHECK(kv_path_entry_rule(g, top, 0, 0, -1) == KVPathStatus::kSeqLenOverflow);  // not even the root fits
  KVPathScan s = scan(g, {0, 1, 2, 3, 4}, top - 3);
  CHECK(s.length == 3 && s.status == KVPathStatus::kSeqLenOverflow && s.bad_index == 3);
  s = scan(g, {0, 5, 9}, top - 10);  // a large offset is fine while the new length fits
  CHECK(s.length == 3 && s.status == KVPathStatus::kOk);
}

// A random path: a strictly increasing prefix (identity for a while, then jumps), sometimes
// broken by a bad entry, then -1 padding.
static std::vector<int64_t> random_path(std::mt19937& rng, int64_t width) {
  std::vector<int64_t> path;
  int64_t a = 0;
  const int64_t identity = rng() % (width + 1);
  for (int64_t i = 0; i < width; ++i) {
    if (i > 0) a += i < identity ? 1 : 1 + static_cast<int64_t>(rng() % 3);
    path.push_back(a);
  }
  const int64_t cut = rng() % (width + 1);
  for (int64_t i = cut; i < width; ++i) path[i] = -1;
  if (width > 1 && rng() % 4 == 0) path[rng() % width] = static_cast<int64_t>(rng() % 8) - 2;  // maybe bad
  return path;
}

// kv_path_moves_nothing (the CUDA kernel's early exit, decided without the block table) is
// sound: whenever it says nothing moves, the full scan moves nothing; and an identity path
// (a fully accepted chain) always exits early.
static void test_moves_nothing_is_sound() {
  std::mt19937 rng(99);
  int early = 0;
  for (int trial = 0; trial < 5000; ++trial) {
    const int64_t width = 1 + rng() % 12, seq_len = static_cast<int64_t>(rng() % 10) - 1;
    std::vector<int32_t> table = {3, 0, static_cast<int32_t>(rng() % 2 ? 2 : -1), 1, -1};
    const KVGeometry g = rng() % 2 ? contiguous(16) : KVGeometry{20, 4, 4, table.data(), 5, false};
    const std::vector<int64_t> path = random_path(rng, width);
    const KVPathScan s = kv_scan_path(g, path.data(), true, 0, width, 0, seq_len, false);
    if (kv_path_moves_nothing(g, path.data(), true, 0, width, seq_len)) {
      ++early;
      CHECK(s.first_move == s.length);
    }
    std::vector<int64_t> chain(width, -1);
    const int64_t m = 1 + rng() % width;
    for (int64_t i = 0; i < m; ++i) chain[i] = i;
    CHECK(kv_path_moves_nothing(g, chain.data(), true, 0, width, seq_len));
  }
  CHECK(early > 500);
}

// The CUDA kernels' chunked scan (kv_scan_chunk in kv_kernels.cu, emulated lane by lane):
// passes of `lanes` entries, each entry's predecessor from the lane below (the last entry of
// the previous pass for lane 0), the block-free rule for all lanes first, then the block table
// for the lanes before the first rule failure; the path ends at the first lane failing either.
// Must give kv_scan_path's length and moves.
static void test_chunked_scan_equals_scan() {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 5000; ++trial) {
    const int64_t lanes = trial % 2 ? 32 : 4;
    const int64_t width = 1 + rng() % 80, seq_len = rng() % 6;
    std::vector<int32_t> table(25);
    for (auto& t : table) t = rng() % 9 == 0 ? -1 : static_cast<int32_t>(rng() % 30);
    const KVGeometry g = rng() % 2 ? contiguous(100) : KVGeometry{100, 4, 30, table.data(), 25, false};
    const std::vector<int64_t> path = random_path(rng, width);
    const KVPathScan s = kv_scan_path(g, path.data(), true, 0, width, 0, seq_len, false);
    int64_t length = 0, prev_last = -1;
    std::vector<int64_t> moved;
    for (int64_t base = 0;; base += lanes) {
      std::vector<int64_t> a(lanes);
      int64_t rule_valid = lanes;
      for (int64_t lane = 0; lane < lanes; ++lane) {
        const int64_t i = base + lane;
        a[lane] = i < width ? path[i] : -1;
        const int64_t prev = lane == 0 ? prev_last : a[lane - 1];
        const KVPathStatus st = i < width ? kv_path_entry_rule(g, seq_len, i, a[lane], prev) : KVPathStatus::kEnd;
        if (st != KVPathStatus::kOk && rule_valid == lanes) rule_valid = lane;
      }
      int64_t valid = rule_valid;
      for (int64_t lane = 0; lane < rule_valid; ++lane) {
        KVSlotAddr src{}, dst{};
        if (kv_locate(g, 0, seq_len + a[lane], &src) != KVPathStatus::kOk ||
            kv_locate(g, 0, seq_len + base + lane, &dst) != KVPathStatus::kOk) {
          valid = lane;
          break;
        }
      }
      for (int64_t lane = 0; lane < valid; ++lane) {
        if (a[lane] != base + lane) moved.push_back(base + lane);
      }
      length += valid;
      prev_last = a[lanes - 1];
      if (valid < lanes) break;
    }
    CHECK(length == s.length);
    std::vector<int64_t> expect;
    for (int64_t i = s.first_move; i < s.length; ++i) expect.push_back(i);
    CHECK(moved == expect);
  }
}

int main() {
  test_path_rule();
  test_seq_len_overflow();
  test_moves_nothing_is_sound();
  test_chunked_scan_equals_scan();
  test_paged();
  test_units();
  test_schedule_equals_gather();
  TEST_MAIN_END();
}
