// Raw-pointer description of one build_tree call, shared by the CPU kernel and
// the CUDA kernel. No torch headers.
#pragma once

#include <cstdint>

#include "../common/macros.h"

namespace specdec {

struct BuildTreeParams {
  const int64_t* parents;    // [B, N]
  const int64_t* num_nodes;  // [B] or nullptr (= N)
  int64_t batch;
  int64_t nodes;             // N
  int64_t words;             // W = ceil(N / 64)
  int64_t* mask;             // out [B, N, W]
  int32_t* depth;            // out [B, N]
};

// Implemented in tree_cpu.cpp (the CUDA launcher lives in tree_kernels.cu).
void build_tree_cpu(const BuildTreeParams& params);

}  // namespace specdec
