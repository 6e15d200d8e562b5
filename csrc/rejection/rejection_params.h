// Raw-pointer description of one rejection_sample / rejection_sample_packed call,
// shared by the CPU kernel and the CUDA kernel. No torch headers.
#pragma once

#include <cstdint>

#include "../common/macros.h"
#include "../common/prob_dtype.h"

namespace specdec {

struct RejectionParams {
  const void* target_probs;        // rows of `vocab` entries
  const void* draft_probs;         // rows of `vocab` entries, or nullptr (one-hot drafts)
  const int64_t* draft_token_ids;  // [num_draft_rows]
  const int64_t* lengths;          // padded: num_draft_tokens [B]; packed: cu_num_draft_tokens [B+1]
  const int64_t* seeds;            // [B]
  const int64_t* offsets;          // [B]
  const bool* greedy;              // [B] or nullptr
  int64_t batch;
  int64_t max_draft;               // K: output width is K + 1
  int64_t vocab;
  int64_t num_draft_rows;          // padded: B * K; packed: T
  bool packed;
  ProbDType dtype;
  // Engine keywords (issue #14); nullptr / false: off, and the kernels behave exactly as without them.
  const int64_t* bonus_token_ids;  // [B] or nullptr: emitted after a fully accepted chain (no bonus row read)
  const float* synthetic_rates;    // [R >= K] or nullptr: accept draft k iff its uniform < rate[k]
  bool bonus_rows_omitted;         // target has no bonus rows ([B, K, V] / [T, V]; only with bonus_token_ids)
  int64_t* token_ids;              // out [B, K + 1]
  int32_t* num_accepted;           // out [B]
  void* workspace;                 // CUDA only: rejection_cuda_workspace_bytes(params) bytes (CPU: unused)
};

// Where request b's rows live, with every index clamped into range so that a
// malformed length or prefix sum on the GPU can never address outside the inputs.
struct RequestRows {
  int64_t target_base;  // row of p_0 (p_{n_b}, the bonus row, follows p_{n_b - 1} unless omitted)
  int64_t draft_base;   // row of q_0 and index of draft token 0
  int64_t num_drafts;   // n_b, clamped to [0, K]
};

SPECDEC_HD int64_t clamp_i64(int64_t v, int64_t lo, int64_t hi) {
  return v < lo ? lo : (v > hi ? hi : v);
}

SPECDEC_HD RequestRows request_rows(const RejectionParams& p, int64_t b) {
  RequestRows r;
  if (p.packed) {
    const int64_t lo = clamp_i64(p.lengths[b], 0, p.num_draft_rows);
    const int64_t hi = clamp_i64(p.lengths[b + 1], lo, p.num_draft_rows);
    r.num_drafts = clamp_i64(hi - lo, 0, p.max_draft);
    r.target_base = p.bonus_rows_omitted ? lo : lo + b;
    r.draft_base = lo;
  } else {
    r.num_drafts = clamp_i64(p.lengths[b], 0, p.max_draft);
    r.target_base = b * (p.bonus_rows_omitted ? p.max_draft : p.max_draft + 1);
    r.draft_base = b * p.max_draft;
  }
  return r;
}

// The externally given bonus token of request b, clamped into [0, V - 1] (the CPU op has checked it:
// clamping changes nothing there; on the GPU a bad id is made safe without a host sync).
SPECDEC_HD int64_t external_bonus_token(const RejectionParams& p, int64_t b) {
  return clamp_i64(p.bonus_token_ids[b], 0, p.vocab - 1);
}

// Implemented in rejection_cpu.cpp and rejection_kernels.cu.
void rejection_sample_cpu(const RejectionParams& params);

}  // namespace specdec
