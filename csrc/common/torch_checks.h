// Argument checks shared by the torch-facing launchers. Messages name the
// argument and what was expected (DESIGN.md §4). Error classes, the same in every
// op: a wrong shape, rank, device or value raises ValueError (TORCH_CHECK_VALUE), a
// wrong dtype TypeError (TORCH_CHECK_TYPE); the Python wrappers re-raise both as
// SpecDecArgumentError (specdec_ops/_checks.py, call_native) with the same message.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string>
#include <utility>

#include "prob_dtype.h"

namespace specdec {

inline void check_rank(const at::Tensor& t, int64_t rank, const char* name, const char* shape) {
  TORCH_CHECK_VALUE(t.dim() == rank, name, " must be ", rank, "-D ", shape, ", got shape ", t.sizes());
}

inline void check_size(const at::Tensor& t, int64_t dim, int64_t expected, const char* name, const char* shape) {
  TORCH_CHECK_VALUE(t.size(dim) == expected, name, " must have shape ", shape, " (size ", expected, " at dim ", dim,
              "), got ", t.sizes());
}

inline void check_index_dtype(const at::Tensor& t, const char* name) {
  TORCH_CHECK_TYPE(t.scalar_type() == at::kInt || t.scalar_type() == at::kLong, name,
              " must be int32 or int64, got ", t.scalar_type());
}

inline void check_prob_dtype(const at::Tensor& t, const char* name) {
  TORCH_CHECK_TYPE(t.scalar_type() == at::kFloat || t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16,
              name, " must be float32, float16 or bfloat16, got ", t.scalar_type());
}

inline void check_same_device(const at::Tensor& t, const at::Tensor& ref, const char* name, const char* ref_name) {
  TORCH_CHECK_VALUE(t.device() == ref.device(), name, " must be on the same device as ", ref_name, " (", ref.device(),
              "), got ", t.device());
}

// seeds and offsets: int64 [B] on the device of `ref` (DESIGN.md §5.1).
inline void check_rng_args(const at::Tensor& seeds, const at::Tensor& offsets, int64_t batch, const at::Tensor& ref,
                           const char* ref_name) {
  for (auto [t, name] : {std::pair<const at::Tensor&, const char*>{seeds, "seeds"}, {offsets, "offsets"}}) {
    check_rank(t, 1, name, "[B]");
    check_size(t, 0, batch, name, "[B]");
    TORCH_CHECK_TYPE(t.scalar_type() == at::kLong, name, " must be int64, got ", t.scalar_type());
    check_same_device(t, ref, name, ref_name);
  }
}

// greedy, when given: bool [B] on the device of `ref`.
inline void check_greedy(const std::optional<at::Tensor>& greedy, int64_t batch, const at::Tensor& ref,
                         const char* ref_name) {
  if (!greedy) return;
  check_rank(*greedy, 1, "greedy", "[B]");
  check_size(*greedy, 0, batch, "greedy", "[B]");
  TORCH_CHECK_TYPE(greedy->scalar_type() == at::kBool, "greedy must be bool, got ", greedy->scalar_type());
  check_same_device(*greedy, ref, "greedy", ref_name);
}

// CPU only, the chain ops' lengths (int64 values): padded, num_draft_tokens [B] in [0, K]; packed,
// cu_num_draft_tokens [B+1] from 0, non-decreasing, at most K per request, ending at T = num_draft_rows.
// Validated in full before any draft id is read through them.
inline void check_chain_lengths_cpu(const int64_t* lengths, bool packed, int64_t batch, int64_t max_draft,
                                    int64_t num_draft_rows, const char* lengths_name) {
  if (packed) {
    TORCH_CHECK_VALUE(lengths[0] == 0, lengths_name, "[0] must be 0, got ", lengths[0]);
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t lo = lengths[b], hi = lengths[b + 1];
      TORCH_CHECK_VALUE(hi >= lo, lengths_name, " must be non-decreasing, got ", lengths_name, "[", b + 1, "] = ",
                        hi, " < ", lengths_name, "[", b, "] = ", lo);
      TORCH_CHECK_VALUE(hi - lo <= max_draft, "request ", b, " has ", hi - lo,
                        " draft tokens, more than max_num_draft_tokens = ", max_draft);
    }
    TORCH_CHECK_VALUE(lengths[batch] == num_draft_rows, lengths_name, "[B] = ", lengths[batch],
                      " must equal the number of draft tokens T = ", num_draft_rows);
  } else {
    for (int64_t b = 0; b < batch; ++b) {
      TORCH_CHECK_VALUE(lengths[b] >= 0 && lengths[b] <= max_draft, lengths_name, "[", b, "] = ", lengths[b],
                        " is outside [0, K = ", max_draft, "]");
    }
  }
}

// CPU only, a tree op's index values (int64, [B, N] rows; num_nodes [B] or nullptr = N): num_nodes in [1, N],
// parents[b, 0] = -1 and 0 <= parents[b, i] < i for the real nodes, their tokens in [0, V).
inline void check_tree_values_cpu(const int64_t* parents, const int64_t* tree_token_ids, const int64_t* num_nodes,
                                  int64_t batch, int64_t max_nodes, int64_t vocab) {
  const int64_t N = max_nodes;
  for (int64_t b = 0; b < batch; ++b) {
    int64_t n = N;
    if (num_nodes != nullptr) {
      n = num_nodes[b];
      TORCH_CHECK_VALUE(n >= 1 && n <= N, "num_nodes[", b, "] = ", n, " is outside [1, N = ", N, "]");
    }
    const int64_t* par = parents + b * N;
    const int64_t* tok = tree_token_ids + b * N;
    TORCH_CHECK_VALUE(par[0] == -1, "parents[", b, ", 0] = ", par[0], " must be -1 (node 0 is the root)");
    for (int64_t i = 1; i < n; ++i) {
      TORCH_CHECK_VALUE(par[i] >= 0 && par[i] < i, "parents[", b, ", ", i, "] = ", par[i],
                        " is malformed: a node's parent must be an earlier node, in [0, ", i, ")");
      TORCH_CHECK_VALUE(tok[i] >= 0 && tok[i] < vocab, "tree_token_ids[", b, ", ", i, "] = ", tok[i],
                        " is outside the vocabulary [0, ", vocab, ")");
    }
  }
}

// The kernels' view of a probability tensor's dtype (checked by check_prob_dtype).
inline ProbDType prob_dtype(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kHalf: return ProbDType::kFloat16;
    case at::kBFloat16: return ProbDType::kBFloat16;
    default: return ProbDType::kFloat32;
  }
}

}  // namespace specdec
