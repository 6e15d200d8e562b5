// torch glue of specdec::process_logits, specdec::rejection_sample_logits[_packed] and
// specdec::tree_rejection_sample_logits: argument checks, CPU value checks of the
// sampling parameters, the lengths and the trees (as the probability ops check them,
// also under torch.compile, where the wrappers read no values), and dispatch to the
// CPU kernels (DESIGN.md §5.7). Draft ids outside the vocabulary are the wrappers' to
// refuse (reject_invalid_drafts makes them no error); the kernels reject them, and clamp
// every index into range, so a direct call never reads out of bounds.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cmath>

#include "../common/torch_checks.h"
#include "logits_params.h"

#ifdef SPECDEC_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
namespace specdec {
cudaError_t launch_process_logits_cuda(const ProcessLogitsParams& params, cudaStream_t stream);
cudaError_t launch_rejection_sample_logits_cuda(const LogitsRejectionParams& params, cudaStream_t stream);
size_t rejection_sample_logits_cuda_workspace_bytes(const LogitsRejectionParams& params);
cudaError_t launch_tree_rejection_sample_logits_cuda(const LogitsTreeParams& params, cudaStream_t stream);
}
#endif

namespace specdec {
// This file's helpers (compiled with the other glue files in csrc/torch_ops.cpp).
namespace logits_op {

struct SamplingTensors {
  at::Tensor temperature, top_k, top_p, min_p;  // undefined: default
};

void check_param(const std::optional<at::Tensor>& t, at::ScalarType dtype, const char* name, int64_t batch,
                 const at::Tensor& ref, at::Tensor& out) {
  if (!t) return;
  check_rank(*t, 1, name, "[B]");
  check_size(*t, 0, batch, name, "[B]");
  TORCH_CHECK_TYPE(t->scalar_type() == dtype, name, " must be ", dtype, ", got ", t->scalar_type());
  check_same_device(*t, ref, name, "target_logits");
  out = t->contiguous();
}

// CPU only: the documented ranges (the GPU kernels clamp instead, logits_math.h row_sampling).
void check_param_values_cpu(const SamplingTensors& s, int64_t batch) {
  for (int64_t b = 0; b < batch; ++b) {
    if (s.temperature.defined()) {
      const float t = s.temperature.const_data_ptr<float>()[b];
      TORCH_CHECK_VALUE(t >= 0.f, "temperature[", b, "] = ", t, " must be >= 0 (0 = greedy) and not NaN");
    }
    if (s.top_k.defined()) {
      const int64_t k = s.top_k.const_data_ptr<int64_t>()[b];
      TORCH_CHECK_VALUE(k >= 0, "top_k[", b, "] = ", k, " must be >= 0 (0 = off)");
    }
    if (s.top_p.defined()) {
      const float p = s.top_p.const_data_ptr<float>()[b];
      TORCH_CHECK_VALUE(p > 0.f && p <= 1.f, "top_p[", b, "] = ", p, " must be in (0, 1] (1 = off)");
    }
    if (s.min_p.defined()) {
      const float p = s.min_p.const_data_ptr<float>()[b];
      TORCH_CHECK_VALUE(p >= 0.f && p < 1.f, "min_p[", b, "] = ", p, " must be in [0, 1) (0 = off)");
    }
  }
}

SamplingTensors check_sampling(const std::optional<at::Tensor>& temperature, const std::optional<at::Tensor>& top_k,
                               const std::optional<at::Tensor>& top_p, const std::optional<at::Tensor>& min_p,
                               int64_t batch, const at::Tensor& ref) {
  SamplingTensors s;
  check_param(temperature, at::kFloat, "temperature", batch, ref, s.temperature);
  check_param(top_k, at::kLong, "top_k", batch, ref, s.top_k);
  check_param(top_p, at::kFloat, "top_p", batch, ref, s.top_p);
  check_param(min_p, at::kFloat, "min_p", batch, ref, s.min_p);
  if (ref.is_cpu()) check_param_values_cpu(s, batch);
  return s;
}

SamplingParams sampling_view(const SamplingTensors& s) {
  SamplingParams v;
  v.temperature = s.temperature.defined() ? s.temperature.const_data_ptr<float>() : nullptr;
  v.top_k = s.top_k.defined() ? s.top_k.const_data_ptr<int64_t>() : nullptr;
  v.top_p = s.top_p.defined() ? s.top_p.const_data_ptr<float>() : nullptr;
  v.min_p = s.min_p.defined() ? s.min_p.const_data_ptr<float>() : nullptr;
  return v;
}

void check_logits(const at::Tensor& logits, const char* name) {
  check_prob_dtype(logits, name);
  TORCH_CHECK_VALUE(logits.size(-1) > 0, name, " must have a non-empty vocab dimension");
}

void check_rng(const at::Tensor& seeds, const at::Tensor& offsets, int64_t batch, const at::Tensor& ref) {
  for (auto [t, name] : {std::pair<const at::Tensor&, const char*>{seeds, "seeds"}, {offsets, "offsets"}}) {
    check_rank(t, 1, name, "[B]");
    check_size(t, 0, batch, name, "[B]");
    TORCH_CHECK_TYPE(t.scalar_type() == at::kLong, name, " must be int64, got ", t.scalar_type());
    check_same_device(t, ref, name, "target_logits");
  }
}

// draft_probs: the logits' dtype or float32 (the kernels read both without a copy).
at::Tensor check_draft(const std::optional<at::Tensor>& draft_probs, const at::Tensor& logits, bool& draft_float32) {
  draft_float32 = false;
  if (!draft_probs) return at::Tensor();
  TORCH_CHECK_TYPE(draft_probs->scalar_type() == logits.scalar_type() || draft_probs->scalar_type() == at::kFloat,
              "draft_probs must be float32 or the dtype of target_logits (", logits.scalar_type(), "), got ",
              draft_probs->scalar_type());
  check_same_device(*draft_probs, logits, "draft_probs", "target_logits");
  draft_float32 = draft_probs->scalar_type() == at::kFloat;
  return draft_probs->contiguous();
}

// The engine keywords of the chain ops (issue #14): bonus_token_ids int [B] or [B, 1]; synthetic
// acceptance rates float32 [R], R >= K. CPU tensors: bonus ids in [0, V) and rates in [0, 1] (the GPU
// kernels clamp the ids and use the rates as given: NaN never accepts).
void check_engine_keywords(const std::optional<at::Tensor>& bonus_token_ids,
                           const std::optional<at::Tensor>& synthetic_rates, int64_t batch, int64_t max_draft,
                           int64_t vocab, const at::Tensor& ref) {
  if (bonus_token_ids) {
    const at::Tensor& t = *bonus_token_ids;
    TORCH_CHECK_VALUE((t.dim() == 1 && t.size(0) == batch) || (t.dim() == 2 && t.size(0) == batch && t.size(1) == 1),
                      "bonus_token_ids must have shape [B] or [B, 1] with B = ", batch, ", got ", t.sizes());
    check_index_dtype(t, "bonus_token_ids");
    check_same_device(t, ref, "bonus_token_ids", "target_logits");
    if (t.is_cpu()) {
      const auto ids = t.contiguous().to(at::kLong);
      for (int64_t b = 0; b < batch; ++b) {
        const int64_t x = ids.const_data_ptr<int64_t>()[b];
        TORCH_CHECK_VALUE(x >= 0 && x < vocab, "bonus_token_ids[", b, "] = ", x, " is outside the vocabulary [0, ",
                          vocab, ")");
      }
    }
  }
  if (synthetic_rates) {
    const at::Tensor& t = *synthetic_rates;
    check_rank(t, 1, "synthetic_acceptance_rates", "[R], R >= K");
    TORCH_CHECK_VALUE(t.size(0) >= max_draft, "synthetic_acceptance_rates must have one rate per draft position (R >= K = ",
                      max_draft, "), got shape ", t.sizes());
    TORCH_CHECK_TYPE(t.scalar_type() == at::kFloat, "synthetic_acceptance_rates must be float32, got ", t.scalar_type());
    check_same_device(t, ref, "synthetic_acceptance_rates", "target_logits");
    if (t.is_cpu()) {
      const auto rates = t.contiguous();
      for (int64_t k = 0; k < t.size(0); ++k) {
        const float r = rates.const_data_ptr<float>()[k];
        TORCH_CHECK_VALUE(r >= 0.f && r <= 1.f, "synthetic_acceptance_rates[", k, "] = ", r, " is outside [0, 1]");
      }
    }
  }
}

at::Tensor process_logits(const at::Tensor& logits, const std::optional<at::Tensor>& temperature,
                          const std::optional<at::Tensor>& top_k, const std::optional<at::Tensor>& top_p,
                          const std::optional<at::Tensor>& min_p) {
  TORCH_CHECK_VALUE(logits.dim() >= 2, "logits must be at least 2-D [R, ..., V], got shape ", logits.sizes());
  check_logits(logits, "logits");
  const int64_t batch = logits.size(0);
  const SamplingTensors s = check_sampling(temperature, top_k, top_p, min_p, batch, logits);
  const auto x = logits.contiguous();
  auto probs = at::empty(logits.sizes(), x.options().dtype(at::kFloat));
  if (x.numel() == 0) return probs;
  ProcessLogitsParams p;
  p.logits = x.const_data_ptr();
  p.dtype = prob_dtype(x);
  p.vocab = x.size(-1);
  p.rows = x.numel() / p.vocab;
  p.inner = p.rows / batch;
  p.sampling = sampling_view(s);
  p.probs = probs.mutable_data_ptr<float>();
  if (x.is_cpu()) {
    process_logits_cpu(p);
  } else {
#ifdef SPECDEC_WITH_CUDA
    const c10::cuda::CUDAGuard guard(x.device());
    C10_CUDA_CHECK(launch_process_logits_cuda(p, at::cuda::getCurrentCUDAStream()));
#else
    TORCH_CHECK(false, "specdec_ops was built without CUDA kernels");
#endif
  }
  return probs;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> run_chain(
    const at::Tensor& target_logits, const at::Tensor& draft_token_ids, const at::Tensor& lengths,
    const std::optional<at::Tensor>& draft_probs, const SamplingTensors& s, const at::Tensor& seeds,
    const at::Tensor& offsets, bool return_logprobs, int64_t batch, int64_t max_draft, bool packed, bool bonus_rows,
    const std::optional<at::Tensor>& bonus_token_ids, const std::optional<at::Tensor>& synthetic_rates) {
  const auto target = target_logits.contiguous();
  const auto ids = draft_token_ids.contiguous().to(at::kLong);
  const auto lens = lengths.contiguous().to(at::kLong);
  const auto seeds_c = seeds.contiguous();
  const auto offsets_c = offsets.contiguous();
  bool draft_float32;
  const at::Tensor draft = check_draft(draft_probs, target, draft_float32);
  const at::Tensor bonus = bonus_token_ids ? bonus_token_ids->contiguous().to(at::kLong) : at::Tensor();
  const at::Tensor rates = synthetic_rates ? synthetic_rates->contiguous() : at::Tensor();

  auto token_ids = at::empty({batch, max_draft + 1}, target.options().dtype(at::kLong));
  auto num_accepted = at::empty({batch}, target.options().dtype(at::kInt));
  auto logprobs = return_logprobs ? at::empty({batch, max_draft + 1}, target.options().dtype(at::kFloat))
                                  : at::empty({0}, target.options().dtype(at::kFloat));
  if (batch == 0) return {token_ids, num_accepted, logprobs};

  LogitsRejectionParams p;
  p.target_logits = target.const_data_ptr();
  p.draft_probs = draft.defined() ? draft.const_data_ptr() : nullptr;
  p.draft_token_ids = ids.const_data_ptr<int64_t>();
  p.lengths = lens.const_data_ptr<int64_t>();
  p.seeds = seeds_c.const_data_ptr<int64_t>();
  p.offsets = offsets_c.const_data_ptr<int64_t>();
  p.sampling = sampling_view(s);
  p.batch = batch;
  p.max_draft = max_draft;
  p.vocab = target.size(-1);
  p.num_draft_rows = ids.numel();
  p.packed = packed;
  p.bonus_rows = bonus_rows;
  p.bonus_token_ids = bonus.defined() ? bonus.const_data_ptr<int64_t>() : nullptr;
  p.synthetic_rates = rates.defined() ? rates.const_data_ptr<float>() : nullptr;
  p.dtype = prob_dtype(target);
  p.draft_float32 = draft_float32;
  p.token_ids = token_ids.mutable_data_ptr<int64_t>();
  p.num_accepted = num_accepted.mutable_data_ptr<int32_t>();
  p.logprobs = return_logprobs ? logprobs.mutable_data_ptr<float>() : nullptr;
  p.workspace = nullptr;
  if (target.is_cpu()) {
    check_chain_lengths_cpu(p.lengths, packed, batch, max_draft, p.num_draft_rows,
                            packed ? "cu_num_draft_tokens" : "num_draft_tokens");
    rejection_sample_logits_cpu(p);
  } else {
#ifdef SPECDEC_WITH_CUDA
    const c10::cuda::CUDAGuard guard(target.device());
    // Per-call partials and arrival counters of the split kernel (with filters also its radix histograms).
    const size_t bytes = rejection_sample_logits_cuda_workspace_bytes(p);
    at::Tensor workspace;
    if (bytes > 0) {
      workspace = at::empty({static_cast<int64_t>(bytes)}, target.options().dtype(at::kByte));
      p.workspace = workspace.mutable_data_ptr();
    }
    C10_CUDA_CHECK(launch_rejection_sample_logits_cuda(p, at::cuda::getCurrentCUDAStream()));
#else
    TORCH_CHECK(false, "specdec_ops was built without CUDA kernels");
#endif
  }
  return {token_ids, num_accepted, logprobs};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> rejection_sample_logits(
    const at::Tensor& target_logits, const at::Tensor& draft_token_ids, const at::Tensor& num_draft_tokens,
    const std::optional<at::Tensor>& draft_probs, const std::optional<at::Tensor>& temperature,
    const std::optional<at::Tensor>& top_k, const std::optional<at::Tensor>& top_p,
    const std::optional<at::Tensor>& min_p, const at::Tensor& seeds, const at::Tensor& offsets,
    bool return_logprobs, const std::optional<at::Tensor>& bonus_token_ids,
    const std::optional<at::Tensor>& synthetic_acceptance_rates) {
  check_rank(target_logits, 3, "target_logits", "[B, K+1, V]");
  check_logits(target_logits, "target_logits");
  const int64_t batch = target_logits.size(0), vocab = target_logits.size(2);
  int64_t max_draft = target_logits.size(1) - 1;
  // With external bonus tokens the bonus rows may be absent: [B, K, V], K = draft_token_ids.size(1).
  bool bonus_rows = true;
  if (bonus_token_ids && draft_token_ids.dim() == 2 && target_logits.size(1) == draft_token_ids.size(1)) {
    max_draft = draft_token_ids.size(1);
    bonus_rows = false;
  }
  TORCH_CHECK_VALUE(max_draft >= 0, "target_logits must have K+1 >= 1 rows per request, got shape ",
              target_logits.sizes());
  check_rank(draft_token_ids, 2, "draft_token_ids", "[B, K]");
  TORCH_CHECK_VALUE(draft_token_ids.size(0) == batch && draft_token_ids.size(1) == max_draft,
              "draft_token_ids must have shape [B, K] = [", batch, ", ", max_draft, "], got ", draft_token_ids.sizes());
  check_index_dtype(draft_token_ids, "draft_token_ids");
  check_rank(num_draft_tokens, 1, "num_draft_tokens", "[B]");
  check_size(num_draft_tokens, 0, batch, "num_draft_tokens", "[B]");
  check_index_dtype(num_draft_tokens, "num_draft_tokens");
  if (draft_probs) {
    check_rank(*draft_probs, 3, "draft_probs", "[B, K, V]");
    TORCH_CHECK_VALUE(draft_probs->size(0) == batch && draft_probs->size(1) == max_draft && draft_probs->size(2) == vocab,
                "draft_probs must have shape [B, K, V] = [", batch, ", ", max_draft, ", ", vocab, "], got ",
                draft_probs->sizes());
  }
  check_rng(seeds, offsets, batch, target_logits);
  const SamplingTensors s = check_sampling(temperature, top_k, top_p, min_p, batch, target_logits);
  check_engine_keywords(bonus_token_ids, synthetic_acceptance_rates, batch, max_draft, vocab, target_logits);
  return run_chain(target_logits, draft_token_ids, num_draft_tokens, draft_probs, s, seeds, offsets,
                   return_logprobs, batch, max_draft, /*packed=*/false, bonus_rows, bonus_token_ids,
                   synthetic_acceptance_rates);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> rejection_sample_logits_packed(
    const at::Tensor& target_logits, const at::Tensor& cu_num_draft_tokens, const at::Tensor& draft_token_ids,
    const std::optional<at::Tensor>& draft_probs, const std::optional<at::Tensor>& temperature,
    const std::optional<at::Tensor>& top_k, const std::optional<at::Tensor>& top_p,
    const std::optional<at::Tensor>& min_p, const at::Tensor& seeds, const at::Tensor& offsets,
    bool return_logprobs, int64_t max_num_draft_tokens, const std::optional<at::Tensor>& bonus_token_ids,
    const std::optional<at::Tensor>& synthetic_acceptance_rates) {
  check_rank(target_logits, 2, "target_logits", "[T + B, V]");
  check_logits(target_logits, "target_logits");
  check_rank(cu_num_draft_tokens, 1, "cu_num_draft_tokens", "[B + 1]");
  TORCH_CHECK_VALUE(cu_num_draft_tokens.size(0) >= 1, "cu_num_draft_tokens must have shape [B + 1], got ",
              cu_num_draft_tokens.sizes());
  check_index_dtype(cu_num_draft_tokens, "cu_num_draft_tokens");
  const int64_t batch = cu_num_draft_tokens.size(0) - 1;
  check_rank(draft_token_ids, 1, "draft_token_ids", "[T]");
  check_index_dtype(draft_token_ids, "draft_token_ids");
  const int64_t total = draft_token_ids.size(0);
  // With external bonus tokens the bonus rows may be absent: [T, V] (vLLM's layout).
  const bool bonus_rows = target_logits.size(0) == total + batch;
  TORCH_CHECK_VALUE(bonus_rows || (bonus_token_ids && target_logits.size(0) == total), "target_logits must have T + B = ",
                    total + batch, " rows", bonus_token_ids ? " (or T when bonus_token_ids is given)" : "", " (T = ",
                    total, " draft tokens, B = ", batch, " requests), got shape ", target_logits.sizes());
  if (draft_probs) {
    check_rank(*draft_probs, 2, "draft_probs", "[T, V]");
    TORCH_CHECK_VALUE(draft_probs->size(0) == total && draft_probs->size(1) == target_logits.size(1),
                "draft_probs must have shape [T, V] = [", total, ", ", target_logits.size(1), "], got ",
                draft_probs->sizes());
  }
  TORCH_CHECK_VALUE(max_num_draft_tokens >= 0, "max_num_draft_tokens must be >= 0, got ", max_num_draft_tokens);
  check_rng(seeds, offsets, batch, target_logits);
  const SamplingTensors s = check_sampling(temperature, top_k, top_p, min_p, batch, target_logits);
  check_engine_keywords(bonus_token_ids, synthetic_acceptance_rates, batch, max_num_draft_tokens,
                        target_logits.size(1), target_logits);
  return run_chain(target_logits, draft_token_ids, cu_num_draft_tokens, draft_probs, s, seeds, offsets,
                   return_logprobs, batch, max_num_draft_tokens, /*packed=*/true, bonus_rows, bonus_token_ids,
                   synthetic_acceptance_rates);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> tree_rejection_sample_logits(
    const at::Tensor& target_logits, const at::Tensor& tree_token_ids, const at::Tensor& parents,
    const std::optional<at::Tensor>& num_nodes, const std::optional<at::Tensor>& draft_probs,
    const std::optional<at::Tensor>& temperature, const std::optional<at::Tensor>& top_k,
    const std::optional<at::Tensor>& top_p, const std::optional<at::Tensor>& min_p, const at::Tensor& seeds,
    const at::Tensor& offsets, bool return_logprobs) {
  check_rank(target_logits, 3, "target_logits", "[B, N, V]");
  check_logits(target_logits, "target_logits");
  const int64_t batch = target_logits.size(0), nodes = target_logits.size(1);
  TORCH_CHECK_VALUE(nodes >= 1, "target_logits must have N >= 1 nodes (the root), got shape ", target_logits.sizes());
  for (auto [t, name] : {std::pair<const at::Tensor&, const char*>{tree_token_ids, "tree_token_ids"},
                         {parents, "parents"}}) {
    check_rank(t, 2, name, "[B, N]");
    TORCH_CHECK_VALUE(t.size(0) == batch && t.size(1) == nodes, name, " must have shape [B, N] = [", batch, ", ", nodes,
                "], got ", t.sizes());
    check_index_dtype(t, name);
  }
  if (num_nodes) {
    check_rank(*num_nodes, 1, "num_nodes", "[B]");
    check_size(*num_nodes, 0, batch, "num_nodes", "[B]");
    check_index_dtype(*num_nodes, "num_nodes");
  }
  if (draft_probs) {
    TORCH_CHECK_VALUE(draft_probs->sizes() == target_logits.sizes(), "draft_probs must have shape [B, N, V] = ",
                target_logits.sizes(), ", got ", draft_probs->sizes());
  }
  check_rng(seeds, offsets, batch, target_logits);
  const SamplingTensors s = check_sampling(temperature, top_k, top_p, min_p, batch, target_logits);
  const auto target = target_logits.contiguous();
  const auto tokens = tree_token_ids.contiguous().to(at::kLong);
  const auto par = parents.contiguous().to(at::kLong);
  at::Tensor n;
  if (num_nodes) n = num_nodes->contiguous().to(at::kLong);
  const auto seeds_c = seeds.contiguous();
  const auto offsets_c = offsets.contiguous();
  bool draft_float32;
  const at::Tensor draft = check_draft(draft_probs, target, draft_float32);

  auto opts = target.options();
  auto token_ids = at::empty({batch, nodes}, opts.dtype(at::kLong));
  auto accepted_path = at::empty({batch, nodes}, opts.dtype(at::kInt));
  auto num_accepted = at::empty({batch}, opts.dtype(at::kInt));
  auto logprobs = return_logprobs ? at::empty({batch, nodes}, opts.dtype(at::kFloat)) : at::empty({0}, opts.dtype(at::kFloat));
  if (batch == 0) return {token_ids, accepted_path, num_accepted, logprobs};

  LogitsTreeParams p;
  p.target_logits = target.const_data_ptr();
  p.draft_probs = draft.defined() ? draft.const_data_ptr() : nullptr;
  p.tree_token_ids = tokens.const_data_ptr<int64_t>();
  p.parents = par.const_data_ptr<int64_t>();
  p.num_nodes = n.defined() ? n.const_data_ptr<int64_t>() : nullptr;
  p.seeds = seeds_c.const_data_ptr<int64_t>();
  p.offsets = offsets_c.const_data_ptr<int64_t>();
  p.sampling = sampling_view(s);
  p.batch = batch;
  p.max_nodes = nodes;
  p.vocab = target.size(-1);
  p.dtype = prob_dtype(target);
  p.draft_float32 = draft_float32;
  p.token_ids = token_ids.mutable_data_ptr<int64_t>();
  p.accepted_path = accepted_path.mutable_data_ptr<int32_t>();
  p.num_accepted = num_accepted.mutable_data_ptr<int32_t>();
  p.logprobs = return_logprobs ? logprobs.mutable_data_ptr<float>() : nullptr;
  p.normalizers = nullptr;
  p.zeroed = nullptr;
  if (target.is_cpu()) {
    check_tree_values_cpu(p.parents, p.tree_token_ids, p.num_nodes, batch, nodes, p.vocab);
    tree_rejection_sample_logits_cpu(p);  // per-request scratch of its own
  } else {
#ifdef SPECDEC_WITH_CUDA
    const c10::cuda::CUDAGuard guard(target.device());
    auto normalizers = at::empty({batch, nodes}, opts.dtype(at::kFloat));
    auto zeroed = at::empty({batch, nodes}, opts.dtype(at::kInt));
    p.normalizers = normalizers.mutable_data_ptr<float>();
    p.zeroed = zeroed.mutable_data_ptr<int32_t>();
    C10_CUDA_CHECK(launch_tree_rejection_sample_logits_cuda(p, at::cuda::getCurrentCUDAStream()));
#else
    TORCH_CHECK(false, "specdec_ops was built without CUDA kernels");
#endif
  }
  return {token_ids, accepted_path, num_accepted, logprobs};
}

}  // namespace logits_op

TORCH_LIBRARY_IMPL(specdec, CPU, m) {
  m.impl("process_logits", &logits_op::process_logits);
  m.impl("rejection_sample_logits", &logits_op::rejection_sample_logits);
  m.impl("rejection_sample_logits_packed", &logits_op::rejection_sample_logits_packed);
  m.impl("tree_rejection_sample_logits", &logits_op::tree_rejection_sample_logits);
}

#ifdef SPECDEC_WITH_CUDA
TORCH_LIBRARY_IMPL(specdec, CUDA, m) {
  m.impl("process_logits", &logits_op::process_logits);
  m.impl("rejection_sample_logits", &logits_op::rejection_sample_logits);
  m.impl("rejection_sample_logits_packed", &logits_op::rejection_sample_logits_packed);
  m.impl("tree_rejection_sample_logits", &logits_op::tree_rejection_sample_logits);
}
#endif

}  // namespace specdec
