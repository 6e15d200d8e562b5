// torch glue of specdec::rejection_sample and specdec::rejection_sample_packed:
// argument checks, CPU value checks, and dispatch to the CPU or CUDA kernel.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "../common/torch_checks.h"
#include "rejection_params.h"

#ifdef SPECDEC_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
namespace specdec {
cudaError_t launch_rejection_sample_cuda(const RejectionParams& params, cudaStream_t stream);
size_t rejection_cuda_workspace_bytes(const RejectionParams& params);
}
#endif

namespace specdec {
// This file's helpers (compiled with the other glue files in csrc/torch_ops.cpp).
namespace rejection_op {

void check_common(const at::Tensor& target_probs, const std::optional<at::Tensor>& draft_probs,
                  const at::Tensor& draft_token_ids, const at::Tensor& seeds, const at::Tensor& offsets,
                  const std::optional<at::Tensor>& greedy, int64_t batch) {
  check_prob_dtype(target_probs, "target_probs");
  TORCH_CHECK_VALUE(target_probs.size(-1) > 0, "target_probs must have a non-empty vocab dimension");
  check_index_dtype(draft_token_ids, "draft_token_ids");
  check_same_device(draft_token_ids, target_probs, "draft_token_ids", "target_probs");
  check_rng_args(seeds, offsets, batch, target_probs, "target_probs");
  if (draft_probs) {
    TORCH_CHECK_TYPE(draft_probs->scalar_type() == target_probs.scalar_type(), "draft_probs must have the dtype of ",
                "target_probs (", target_probs.scalar_type(), "), got ", draft_probs->scalar_type());
    check_same_device(*draft_probs, target_probs, "draft_probs", "target_probs");
  }
  check_greedy(greedy, batch, target_probs, "target_probs");
}

// The engine keywords' tensors (shapes, dtypes, devices): bonus_token_ids int32/int64 [B] or [B, 1],
// synthetic_acceptance_rates float32 [R] with R >= K.
void check_keywords(const std::optional<at::Tensor>& bonus_token_ids,
                    const std::optional<at::Tensor>& synthetic_acceptance_rates, int64_t batch, int64_t max_draft,
                    const at::Tensor& target_probs) {
  if (bonus_token_ids) {
    const at::Tensor& t = *bonus_token_ids;
    TORCH_CHECK_VALUE((t.dim() == 1 || (t.dim() == 2 && t.size(1) == 1)) && t.size(0) == batch,
                      "bonus_token_ids must have shape [B] or [B, 1] with B = ", batch, ", got ", t.sizes());
    check_index_dtype(t, "bonus_token_ids");
    check_same_device(t, target_probs, "bonus_token_ids", "target_probs");
  }
  if (synthetic_acceptance_rates) {
    const at::Tensor& t = *synthetic_acceptance_rates;
    check_rank(t, 1, "synthetic_acceptance_rates", "[R], R >= K");
    TORCH_CHECK_TYPE(t.scalar_type() == at::kFloat, "synthetic_acceptance_rates must be float32, got ",
                     t.scalar_type());
    TORCH_CHECK_VALUE(t.size(0) >= max_draft, "synthetic_acceptance_rates must have one rate per draft position ",
                      "(R >= K = ", max_draft, "), got shape ", t.sizes());
    check_same_device(t, target_probs, "synthetic_acceptance_rates", "target_probs");
  }
}

// CPU only: index values the kernel would otherwise read out of range. The
// lengths are validated in full before any draft id is read through them.
void check_values_cpu(const RejectionParams& p, const char* lengths_name, bool reject_invalid_drafts,
                      int64_t num_rates) {
  check_chain_lengths_cpu(p.lengths, p.packed, p.batch, p.max_draft, p.num_draft_rows, lengths_name);
  for (int64_t b = 0; p.bonus_token_ids != nullptr && b < p.batch; ++b) {
    TORCH_CHECK_VALUE(p.bonus_token_ids[b] >= 0 && p.bonus_token_ids[b] < p.vocab, "bonus_token_ids[", b, "] = ",
                      p.bonus_token_ids[b], " is outside the vocabulary [0, ", p.vocab, ")");
  }
  for (int64_t i = 0; i < num_rates; ++i) {
    const float rate = p.synthetic_rates[i];
    TORCH_CHECK_VALUE(rate >= 0.f && rate <= 1.f, "synthetic_acceptance_rates[", i, "] = ", rate,
                      " is outside [0, 1]");
  }
  // reject_invalid_drafts: an id outside the vocabulary is rejected at its position (the kernel's
  // draft_in_vocab), so it is no error.
  for (int64_t b = 0; !reject_invalid_drafts && b < p.batch; ++b) {
    const RequestRows rows = request_rows(p, b);
    for (int64_t k = 0; k < rows.num_drafts; ++k) {
      const int64_t x = p.draft_token_ids[rows.draft_base + k];
      TORCH_CHECK_VALUE(x >= 0 && x < p.vocab, "draft_token_ids has id ", x, " (request ", b, ", draft ", k,
                        ") outside the vocabulary [0, ", p.vocab, ")");
    }
  }
}

std::tuple<at::Tensor, at::Tensor> run(const at::Tensor& target_probs, const at::Tensor& draft_token_ids,
                                       const at::Tensor& lengths, const std::optional<at::Tensor>& draft_probs,
                                       const at::Tensor& seeds, const at::Tensor& offsets,
                                       const std::optional<at::Tensor>& greedy,
                                       const std::optional<at::Tensor>& bonus_token_ids, bool reject_invalid_drafts,
                                       const std::optional<at::Tensor>& synthetic_acceptance_rates, int64_t batch,
                                       int64_t max_draft, bool packed, bool bonus_rows_omitted,
                                       const char* lengths_name) {
  const auto target = target_probs.contiguous();
  const auto ids = draft_token_ids.contiguous().to(at::kLong);
  const auto lens = lengths.contiguous().to(at::kLong);
  const auto seeds_c = seeds.contiguous();
  const auto offsets_c = offsets.contiguous();
  at::Tensor draft;
  if (draft_probs) draft = draft_probs->contiguous();
  at::Tensor greedy_c;
  if (greedy) greedy_c = greedy->contiguous();
  at::Tensor bonus;
  if (bonus_token_ids) bonus = bonus_token_ids->reshape({batch}).contiguous().to(at::kLong);
  at::Tensor rates;
  if (synthetic_acceptance_rates) rates = synthetic_acceptance_rates->contiguous();

  auto token_ids = at::empty({batch, max_draft + 1}, target.options().dtype(at::kLong));
  auto num_accepted = at::empty({batch}, target.options().dtype(at::kInt));
  if (batch == 0) return {token_ids, num_accepted};

  RejectionParams p;
  p.target_probs = target.const_data_ptr();
  p.draft_probs = draft.defined() ? draft.const_data_ptr() : nullptr;
  p.draft_token_ids = ids.const_data_ptr<int64_t>();
  p.lengths = lens.const_data_ptr<int64_t>();
  p.seeds = seeds_c.const_data_ptr<int64_t>();
  p.offsets = offsets_c.const_data_ptr<int64_t>();
  p.greedy = greedy_c.defined() ? greedy_c.const_data_ptr<bool>() : nullptr;
  p.batch = batch;
  p.max_draft = max_draft;
  p.vocab = target.size(-1);
  p.num_draft_rows = ids.numel();
  p.packed = packed;
  p.bonus_token_ids = bonus.defined() ? bonus.const_data_ptr<int64_t>() : nullptr;
  p.synthetic_rates = rates.defined() ? rates.const_data_ptr<float>() : nullptr;
  p.bonus_rows_omitted = bonus_rows_omitted;
  p.dtype = prob_dtype(target);
  p.token_ids = token_ids.mutable_data_ptr<int64_t>();
  p.num_accepted = num_accepted.mutable_data_ptr<int32_t>();

  if (target.is_cpu()) {
    // Synthetic acceptance rejects an id outside the vocabulary too, without an error (issue #14).
    check_values_cpu(p, lengths_name, reject_invalid_drafts || rates.defined(), rates.defined() ? rates.numel() : 0);
    rejection_sample_cpu(p);
  } else {
#ifdef SPECDEC_WITH_CUDA
    const c10::cuda::CUDAGuard guard(target.device());
    // Per-launch partial results of the split-vocab race (stream-ordered by the caching allocator).
    const auto workspace = at::empty({static_cast<int64_t>(rejection_cuda_workspace_bytes(p))},
                                     target.options().dtype(at::kByte));
    p.workspace = workspace.mutable_data_ptr();
    C10_CUDA_CHECK(launch_rejection_sample_cuda(p, at::cuda::getCurrentCUDAStream()));
#else
    TORCH_CHECK(false, "specdec_ops was built without CUDA kernels");
#endif
  }
  return {token_ids, num_accepted};
}

std::tuple<at::Tensor, at::Tensor> rejection_sample(const at::Tensor& target_probs, const at::Tensor& draft_token_ids,
                                                    const at::Tensor& num_draft_tokens,
                                                    const std::optional<at::Tensor>& draft_probs,
                                                    const at::Tensor& seeds, const at::Tensor& offsets,
                                                    const std::optional<at::Tensor>& greedy,
                                                    const std::optional<at::Tensor>& bonus_token_ids,
                                                    bool reject_invalid_drafts,
                                                    const std::optional<at::Tensor>& synthetic_acceptance_rates) {
  check_rank(target_probs, 3, "target_probs", "[B, K+1, V]");
  const int64_t batch = target_probs.size(0), vocab = target_probs.size(2);
  int64_t max_draft = target_probs.size(1) - 1;
  bool bonus_rows_omitted = false;
  check_rank(draft_token_ids, 2, "draft_token_ids", "[B, K]");
  if (bonus_token_ids) {
    // K from the drafts: the bonus rows are never read, so the target may omit them ([B, K, V]).
    max_draft = draft_token_ids.size(1);
    TORCH_CHECK_VALUE(target_probs.size(1) == max_draft + 1 || target_probs.size(1) == max_draft,
                      "target_probs must have K+1 = ", max_draft + 1, " or K = ", max_draft,
                      " rows per request when bonus_token_ids is given (K = draft_token_ids.shape[1]), got shape ",
                      target_probs.sizes());
    bonus_rows_omitted = target_probs.size(1) == max_draft;
  }
  TORCH_CHECK_VALUE(max_draft >= 0, "target_probs must have K+1 >= 1 rows per request, got shape ", target_probs.sizes());
  TORCH_CHECK_VALUE(draft_token_ids.size(0) == batch && draft_token_ids.size(1) == max_draft,
              "draft_token_ids must have shape [B, K] = [", batch, ", ", max_draft, "], got ", draft_token_ids.sizes());
  check_rank(num_draft_tokens, 1, "num_draft_tokens", "[B]");
  check_size(num_draft_tokens, 0, batch, "num_draft_tokens", "[B]");
  check_index_dtype(num_draft_tokens, "num_draft_tokens");
  check_same_device(num_draft_tokens, target_probs, "num_draft_tokens", "target_probs");
  if (draft_probs) {
    check_rank(*draft_probs, 3, "draft_probs", "[B, K, V]");
    TORCH_CHECK_VALUE(draft_probs->size(0) == batch && draft_probs->size(1) == max_draft && draft_probs->size(2) == vocab,
                "draft_probs must have shape [B, K, V] = [", batch, ", ", max_draft, ", ", vocab, "], got ",
                draft_probs->sizes());
  }
  check_common(target_probs, draft_probs, draft_token_ids, seeds, offsets, greedy, batch);
  check_keywords(bonus_token_ids, synthetic_acceptance_rates, batch, max_draft, target_probs);
  return run(target_probs, draft_token_ids, num_draft_tokens, draft_probs, seeds, offsets, greedy, bonus_token_ids,
             reject_invalid_drafts, synthetic_acceptance_rates, batch, max_draft, /*packed=*/false, bonus_rows_omitted,
             "num_draft_tokens");
}

std::tuple<at::Tensor, at::Tensor> rejection_sample_packed(
    const at::Tensor& target_probs, const at::Tensor& cu_num_draft_tokens, const at::Tensor& draft_token_ids,
    const std::optional<at::Tensor>& draft_probs, const at::Tensor& seeds, const at::Tensor& offsets,
    const std::optional<at::Tensor>& greedy, int64_t max_num_draft_tokens,
    const std::optional<at::Tensor>& bonus_token_ids, bool reject_invalid_drafts,
    const std::optional<at::Tensor>& synthetic_acceptance_rates) {
  check_rank(target_probs, 2, "target_probs", "[T + B, V]");
  check_rank(cu_num_draft_tokens, 1, "cu_num_draft_tokens", "[B + 1]");
  TORCH_CHECK_VALUE(cu_num_draft_tokens.size(0) >= 1, "cu_num_draft_tokens must have shape [B + 1], got ",
              cu_num_draft_tokens.sizes());
  check_index_dtype(cu_num_draft_tokens, "cu_num_draft_tokens");
  check_same_device(cu_num_draft_tokens, target_probs, "cu_num_draft_tokens", "target_probs");
  const int64_t batch = cu_num_draft_tokens.size(0) - 1;
  check_rank(draft_token_ids, 1, "draft_token_ids", "[T]");
  const int64_t total = draft_token_ids.size(0);
  // With bonus_token_ids the bonus rows are never read: the target may omit them ([T, V], vLLM's layout).
  const bool bonus_rows_omitted = bonus_token_ids && target_probs.size(0) != total + batch;
  if (bonus_rows_omitted) {
    TORCH_CHECK_VALUE(target_probs.size(0) == total, "target_probs must have T + B = ", total + batch,
                      " rows, or T = ", total, " rows when bonus_token_ids is given (T = ", total,
                      " draft tokens, B = ", batch, " requests), got shape ", target_probs.sizes());
  } else {
    TORCH_CHECK_VALUE(target_probs.size(0) == total + batch, "target_probs must have T + B = ", total + batch,
                      " rows (T = ", total, " draft tokens, B = ", batch, " requests), got shape ",
                      target_probs.sizes());
  }
  if (draft_probs) {
    check_rank(*draft_probs, 2, "draft_probs", "[T, V]");
    TORCH_CHECK_VALUE(draft_probs->size(0) == total && draft_probs->size(1) == target_probs.size(1),
                "draft_probs must have shape [T, V] = [", total, ", ", target_probs.size(1), "], got ",
                draft_probs->sizes());
  }
  TORCH_CHECK_VALUE(max_num_draft_tokens >= 0, "max_num_draft_tokens must be >= 0, got ", max_num_draft_tokens);
  check_common(target_probs, draft_probs, draft_token_ids, seeds, offsets, greedy, batch);
  check_keywords(bonus_token_ids, synthetic_acceptance_rates, batch, max_num_draft_tokens, target_probs);
  return run(target_probs, draft_token_ids, cu_num_draft_tokens, draft_probs, seeds, offsets, greedy,
             bonus_token_ids, reject_invalid_drafts, synthetic_acceptance_rates, batch, max_num_draft_tokens,
             /*packed=*/true, bonus_rows_omitted, "cu_num_draft_tokens");
}

}  // namespace rejection_op

TORCH_LIBRARY_IMPL(specdec, CPU, m) {
  m.impl("rejection_sample", &rejection_op::rejection_sample);
  m.impl("rejection_sample_packed", &rejection_op::rejection_sample_packed);
}

#ifdef SPECDEC_WITH_CUDA
TORCH_LIBRARY_IMPL(specdec, CUDA, m) {
  m.impl("rejection_sample", &rejection_op::rejection_sample);
  m.impl("rejection_sample_packed", &rejection_op::rejection_sample_packed);
}
#endif

}  // namespace specdec
