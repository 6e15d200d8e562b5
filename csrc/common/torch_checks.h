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

// The kernels' view of a probability tensor's dtype (checked by check_prob_dtype).
inline ProbDType prob_dtype(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kHalf: return ProbDType::kFloat16;
    case at::kBFloat16: return ProbDType::kBFloat16;
    default: return ProbDType::kFloat32;
  }
}

}  // namespace specdec
