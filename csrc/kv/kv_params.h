// Raw-pointer description of one kv_commit call, shared by the CPU kernel and the
// CUDA launcher. No torch headers.
#pragma once

#include <cstdint>

#include "kv_math.h"

namespace specdec {

struct KVCommitParams {
  const KVCacheDesc* caches;  // [num_caches], host memory (the CUDA launcher copies them into kernel parameters)
  int64_t num_caches;
  KVGeometry geometry;        // shared by every cache
  const void* accepted_path;  // [B, max_path], row stride path_stride
  bool path_i64;
  int64_t path_stride;
  int64_t max_path;           // M
  int32_t* seq_lens;          // [B], read before and advanced after the moves
  int64_t batch;
};

// Implemented in kv_cpu.cpp: the moves of every cache, then seq_lens += length.
// Malformed paths end at their first bad entry (the op checks values before).
void kv_commit_cpu(const KVCommitParams& params);

}  // namespace specdec
