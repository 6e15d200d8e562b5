// Raw-pointer description of the logits ops (process_logits, rejection_sample_logits[_packed],
// tree_rejection_sample_logits), shared by the CPU kernels and the CUDA kernels. No torch headers.
#pragma once

#include <cstdint>

#include "../common/macros.h"
#include "../common/prob_dtype.h"

namespace specdec {

// Per-request sampling parameters (DESIGN.md §5.7); a null pointer means the default
// (temperature 1, top_k 0, top_p 1, min_p 0). Sanitized per row by row_sampling().
struct SamplingParams {
  const float* temperature;  // [B] or nullptr
  const int64_t* top_k;      // [B] or nullptr
  const float* top_p;        // [B] or nullptr
  const float* min_p;        // [B] or nullptr
};

// process_logits: rows [R * inner, V]; row j uses the parameters of request j / inner.
struct ProcessLogitsParams {
  const void* logits;
  ProbDType dtype;
  int64_t rows;   // R * inner
  int64_t inner;  // rows per parameter index
  int64_t vocab;
  SamplingParams sampling;
  float* probs;   // out [rows, V]
};

// Chain verification from logits, padded ([B, K+1, V]) or packed ([T + B, V]); with external bonus
// tokens the bonus rows may be absent ([B, K, V] / [T, V], bonus_rows false: they are never read).
struct LogitsRejectionParams {
  const void* target_logits;       // rows of `vocab` logits
  const void* draft_probs;         // rows of `vocab` probabilities, or nullptr (one-hot drafts)
  const int64_t* draft_token_ids;  // [num_draft_rows]
  const int64_t* lengths;          // padded: num_draft_tokens [B]; packed: cu_num_draft_tokens [B+1]
  const int64_t* seeds;            // [B]
  const int64_t* offsets;          // [B]
  SamplingParams sampling;
  int64_t batch;
  int64_t max_draft;               // K: output width is K + 1
  int64_t vocab;
  int64_t num_draft_rows;          // padded: B * K; packed: T
  bool packed;
  bool bonus_rows;                 // target_logits hold request b's bonus row after its draft rows
  const int64_t* bonus_token_ids;  // [B] or nullptr: emitted after a fully accepted chain (clamped into [0, V))
  const float* synthetic_rates;    // [R >= K] or nullptr: accept draft k iff u_k < rate[k] (synthetic mode)
  ProbDType dtype;                 // of target_logits
  bool draft_float32;              // draft_probs are float32 (else target_logits' dtype)
  int64_t* token_ids;              // out [B, K + 1]
  int32_t* num_accepted;           // out [B]
  float* logprobs;                 // out [B, K + 1] or nullptr
  void* workspace;                 // CUDA only: rejection_sample_logits_cuda_workspace_bytes(params) bytes
};

// Tree verification from logits ([B, N, V]).
struct LogitsTreeParams {
  const void* target_logits;       // [B, N, V]: row u gives the distribution of u's children
  const void* draft_probs;         // [B, N, V] or nullptr
  const int64_t* tree_token_ids;   // [B, N]
  const int64_t* parents;          // [B, N]
  const int64_t* num_nodes;        // [B] or nullptr (= N)
  const int64_t* seeds;            // [B]
  const int64_t* offsets;          // [B]
  SamplingParams sampling;
  int64_t batch;
  int64_t max_nodes;               // N
  int64_t vocab;
  ProbDType dtype;
  bool draft_float32;
  float* normalizers;              // CUDA workspace [B, N]: Z_1 .. Z_m at the current node (draft_probs)
  int32_t* zeroed;                 // CUDA workspace [B, N]: tokens zeroed at the current node (one-hot)
  int64_t* token_ids;              // out [B, N]
  int32_t* accepted_path;          // out [B, N]
  int32_t* num_accepted;           // out [B]
  float* logprobs;                 // out [B, N] or nullptr
};

// Where request b's rows live (chain), every index clamped into range so that a
// malformed length or prefix sum on the GPU never addresses outside the inputs.
struct LogitsRequestRows {
  int64_t target_base;  // row of l_0
  int64_t draft_base;   // row of q_0 and index of draft token 0
  int64_t num_drafts;   // n_b, clamped to [0, K]
};

SPECDEC_HD int64_t logits_clamp(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : (v > hi ? hi : v); }

SPECDEC_HD LogitsRequestRows logits_request_rows(const LogitsRejectionParams& p, int64_t b) {
  LogitsRequestRows r;
  if (p.packed) {
    const int64_t lo = logits_clamp(p.lengths[b], 0, p.num_draft_rows);
    const int64_t hi = logits_clamp(p.lengths[b + 1], lo, p.num_draft_rows);
    r.num_drafts = logits_clamp(hi - lo, 0, p.max_draft);
    r.target_base = p.bonus_rows ? lo + b : lo;
    r.draft_base = lo;
  } else {
    r.num_drafts = logits_clamp(p.lengths[b], 0, p.max_draft);
    r.target_base = b * (p.bonus_rows ? p.max_draft + 1 : p.max_draft);
    r.draft_base = b * p.max_draft;
  }
  return r;
}

// Engine keywords of the chain ops (DESIGN.md §5.7, issue #14); synthetic_accept is in
// common/sampling_math.h.
// The external bonus token of request b, clamped into [0, V) (the GPU's safe behaviour; CPU callers
// raise on an id outside the vocabulary first).
SPECDEC_HD int64_t external_bonus_token(const int64_t* bonus_token_ids, int64_t b, int64_t vocab) {
  return logits_clamp(bonus_token_ids[b], 0, vocab - 1);
}

// Implemented in logits_cpu.cpp.
void process_logits_cpu(const ProcessLogitsParams& params);
void rejection_sample_logits_cpu(const LogitsRejectionParams& params);
void tree_rejection_sample_logits_cpu(const LogitsTreeParams& params);

}  // namespace specdec
