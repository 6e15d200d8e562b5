// Raw-pointer description of one tree_rejection_sample call, shared by the CPU
// kernel and the CUDA kernel. No torch headers.
#pragma once

#include <cstdint>

#include "../common/macros.h"
#include "../common/prob_dtype.h"

namespace specdec {

struct TreeVerifyParams {
  const void* target_probs;         // [B, N, V]: row u is p after node u
  const void* draft_probs;          // [B, N, V] or nullptr (deterministic children, no q)
  const int64_t* tree_token_ids;    // [B, N] (entry 0 unused)
  const int64_t* parents;           // [B, N]
  const int64_t* num_nodes;         // [B] or nullptr (= N)
  const int64_t* seeds;             // [B]
  const int64_t* offsets;           // [B]
  const bool* greedy;               // [B] or nullptr
  int64_t batch;
  int64_t max_nodes;                // N
  int64_t vocab;
  ProbDType dtype;
  float* normalizers;               // CPU workspace [B, N]: Z_1 .. Z_m of the node being tried (draft_probs)
  int32_t* zeroed;                  // CPU workspace [B, N]: tokens zeroed in p' (no draft_probs)
  void* workspace;                  // CUDA only: tree_verify_cuda_workspace_bytes(params) bytes (CPU: unused)
  int64_t* token_ids;               // out [B, N]
  int32_t* accepted_path;           // out [B, N]
  int32_t* num_accepted;            // out [B]
};

// Implemented in tree_verify_cpu.cpp and tree_verify_kernels.cu.
void tree_rejection_sample_cpu(const TreeVerifyParams& params);

}  // namespace specdec
