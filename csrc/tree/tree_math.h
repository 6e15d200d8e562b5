// Tree metadata arithmetic shared by the CPU kernel (tree_cpu.cpp) and the CUDA
// kernel (tree_kernels.cu): parent sanitizing, the ancestor walk and the bit
// packing of the ancestor mask (DESIGN.md §5.4). Plain C++17, no torch headers.
//
// Mask layout: row i of request b holds W = ceil(N / 64) 64-bit words; bit j % 64
// of word j / 64 is set iff node j is node i or an ancestor of i (little-endian).
#pragma once

#include <cstdint>

#include "../common/macros.h"

namespace specdec {

constexpr int64_t kTreeWordBits = 64;

// Number of 64-bit words per mask row for a tree of n nodes.
SPECDEC_HD int64_t tree_mask_words(int64_t n) { return (n + kTreeWordBits - 1) / kTreeWordBits; }

// Whether `parent` is a well-formed parent of node i: -1 for the root, 0 <= parent < i otherwise.
SPECDEC_HD bool tree_parent_ok(int64_t i, int64_t parent) {
  return i == 0 ? parent == -1 : (parent >= 0 && parent < i);
}

// The parent the walk follows: -1 for the root; a malformed parent of a non-root
// node is treated as the root (the GPU's safe behaviour; the CPU rejects it before).
// The result is always < i, so every walk ends after at most i steps.
SPECDEC_HD int64_t tree_safe_parent(int64_t i, int64_t parent) {
  if (i <= 0) return -1;
  return (parent >= 0 && parent < i) ? parent : 0;
}

// Bit of node j inside its mask word.
SPECDEC_HD uint64_t tree_bit(int64_t j) { return uint64_t{1} << (j % kTreeWordBits); }

// Whether node j's bit is set in a mask row (W words).
SPECDEC_HD bool tree_mask_test(const int64_t* row, int64_t j) {
  return (static_cast<uint64_t>(row[j / kTreeWordBits]) & tree_bit(j)) != 0;
}

// Word w of node i's ancestor row: walks i, parent(i), ... down to the root and
// collects the nodes that fall into [64 w, 64 w + 64). Ancestors strictly
// decrease, so the walk stops as soon as it drops below the word.
// `parents` is one request's row (N entries).
SPECDEC_HD uint64_t tree_ancestor_word(const int64_t* parents, int64_t i, int64_t w) {
  const int64_t lo = w * kTreeWordBits, hi = lo + kTreeWordBits;
  uint64_t word = 0;
  for (int64_t a = i; a >= lo; a = tree_safe_parent(a, parents[a])) {
    if (a < hi) word |= tree_bit(a);
  }
  return word;
}

// Depth of node i (root 0): the length of its walk to the root.
SPECDEC_HD int32_t tree_depth(const int64_t* parents, int64_t i) {
  int32_t depth = 0;
  for (int64_t a = i; a > 0; a = tree_safe_parent(a, parents[a])) ++depth;
  return depth;
}

// Number of real nodes of a request: num_nodes clamped into [0, n] (n when absent).
SPECDEC_HD int64_t tree_num_real(const int64_t* num_nodes, int64_t b, int64_t n) {
  if (num_nodes == nullptr) return n;
  const int64_t v = num_nodes[b];
  return v < 0 ? 0 : (v > n ? n : v);
}

}  // namespace specdec
