// Host-side tests of csrc/tree/tree_math.h: the ancestor walk and bit packing the
// CPU and CUDA build_tree kernels share, including the GPU's safe handling of bad parents.
#include <cstdint>
#include <vector>

#include "check.h"
#include "tree/tree_math.h"

using namespace specdec;

static std::vector<uint64_t> row_of(const std::vector<int64_t>& parents, int64_t i) {
  const int64_t n = static_cast<int64_t>(parents.size());
  std::vector<uint64_t> row(tree_mask_words(n));
  for (int64_t w = 0; w < tree_mask_words(n); ++w) row[w] = tree_ancestor_word(parents.data(), i, w);
  return row;
}

int main() {
  CHECK(tree_mask_words(1) == 1);
  CHECK(tree_mask_words(64) == 1);
  CHECK(tree_mask_words(65) == 2);
  CHECK(tree_mask_words(1024) == 16);

  CHECK(tree_parent_ok(0, -1));
  CHECK(!tree_parent_ok(0, 0));
  CHECK(tree_parent_ok(3, 0) && tree_parent_ok(3, 2));
  CHECK(!tree_parent_ok(3, 3) && !tree_parent_ok(3, 4) && !tree_parent_ok(3, -1) && !tree_parent_ok(3, -2));

  // safe parents: the root has none; a bad parent becomes the root; always < i
  CHECK(tree_safe_parent(0, 5) == -1);
  CHECK(tree_safe_parent(4, 2) == 2);
  CHECK(tree_safe_parent(4, 4) == 0 && tree_safe_parent(4, 9) == 0 && tree_safe_parent(4, -3) == 0);

  // small tree: 0 <- 1 <- 3, 0 <- 2
  const std::vector<int64_t> small = {-1, 0, 0, 1};
  CHECK(row_of(small, 0)[0] == 0b0001u);
  CHECK(row_of(small, 1)[0] == 0b0011u);
  CHECK(row_of(small, 2)[0] == 0b0101u);
  CHECK(row_of(small, 3)[0] == 0b1011u);
  CHECK(tree_depth(small.data(), 0) == 0 && tree_depth(small.data(), 3) == 2);

  // chain of 130 nodes: row i has bits 0..i, across three words; bit 63 is the int64 sign bit
  std::vector<int64_t> chain(130);
  for (int64_t i = 0; i < 130; ++i) chain[i] = i - 1;
  const auto last = row_of(chain, 129);
  CHECK(last[0] == ~uint64_t{0} && last[1] == ~uint64_t{0} && last[2] == 0b11u);
  const auto mid = row_of(chain, 64);
  CHECK(mid[0] == ~uint64_t{0} && mid[1] == 1u && mid[2] == 0u);
  CHECK(tree_depth(chain.data(), 129) == 129);
  int64_t row63[1];
  row63[0] = static_cast<int64_t>(row_of(chain, 63)[0]);
  CHECK(row63[0] == -1);
  CHECK(tree_mask_test(row63, 63) && tree_mask_test(row63, 0));

  // malformed parents on the GPU path: self, forward and < -1 hang off the root
  const std::vector<int64_t> bad = {7, 1, 5, -4, 2};
  CHECK(row_of(bad, 1)[0] == 0b00011u);
  CHECK(row_of(bad, 2)[0] == 0b00101u);
  CHECK(row_of(bad, 3)[0] == 0b01001u);
  CHECK(row_of(bad, 4)[0] == 0b10101u);
  CHECK(tree_depth(bad.data(), 4) == 2);

  // num_nodes clamping
  const int64_t nn[3] = {-2, 3, 99};
  CHECK(tree_num_real(nn, 0, 10) == 0 && tree_num_real(nn, 1, 10) == 3 && tree_num_real(nn, 2, 10) == 10);
  CHECK(tree_num_real(nullptr, 0, 10) == 10);

  TEST_MAIN_END();
}
