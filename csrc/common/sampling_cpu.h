// Host-side building blocks shared by the sampling CPU kernels (chain:
// rejection/rejection_cpu.cpp, tree: tree_verify/tree_verify_cpu.cpp).
#pragma once

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>

#include "prob_dtype.h"

namespace specdec {
namespace cpu {

// Entry i of row `row` of a [rows, vocab] probability tensor, as float32.
template <typename T>
float load(const void* base, int64_t row, int64_t vocab, int64_t i) {
  return static_cast<float>(static_cast<const T*>(base)[row * vocab + i]);
}

template <typename T>
struct TypeTag {
  using type = T;
};

// Runs per_request(TypeTag<T>{}, b) for every request b, in parallel, with T the
// element type of `dtype` (float, c10::Half, c10::BFloat16).
template <typename F>
void for_each_request(ProbDType dtype, int64_t batch, F&& per_request) {
  auto run = [&](auto tag) {
    at::parallel_for(0, batch, 1, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) per_request(tag, b);
    });
  };
  switch (dtype) {
    case ProbDType::kFloat32: return run(TypeTag<float>{});
    case ProbDType::kFloat16: return run(TypeTag<c10::Half>{});
    case ProbDType::kBFloat16: return run(TypeTag<c10::BFloat16>{});
  }
}

}  // namespace cpu
}  // namespace specdec
