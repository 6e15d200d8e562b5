// torch glue of specdec::tree_rejection_sample: argument checks, CPU value
// checks, workspaces, and dispatch to the CPU or CUDA kernel.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "../common/torch_checks.h"
#include "tree_verify_params.h"

#ifdef SPECDEC_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
namespace specdec {
cudaError_t launch_tree_rejection_sample_cuda(const TreeVerifyParams& params, cudaStream_t stream);
size_t tree_verify_cuda_workspace_bytes(const TreeVerifyParams& params);
}
#endif

namespace specdec {
// This file's helpers (compiled with the other glue files in csrc/torch_ops.cpp).
namespace tree_verify_op {

void check_args(const at::Tensor& target_probs, const at::Tensor& tree_token_ids, const at::Tensor& parents,
                const std::optional<at::Tensor>& num_nodes, const std::optional<at::Tensor>& draft_probs,
                const at::Tensor& seeds, const at::Tensor& offsets, const std::optional<at::Tensor>& greedy) {
  check_rank(target_probs, 3, "target_probs", "[B, N, V]");
  check_prob_dtype(target_probs, "target_probs");
  const int64_t batch = target_probs.size(0), nodes = target_probs.size(1), vocab = target_probs.size(2);
  TORCH_CHECK_VALUE(nodes >= 1, "target_probs must have N >= 1 nodes (node 0 is the root), got shape ",
              target_probs.sizes());
  TORCH_CHECK_VALUE(vocab > 0, "target_probs must have a non-empty vocab dimension V");
  for (auto [t, name] : {std::pair<const at::Tensor&, const char*>{tree_token_ids, "tree_token_ids"},
                         {parents, "parents"}}) {
    check_rank(t, 2, name, "[B, N]");
    TORCH_CHECK_VALUE(t.size(0) == batch && t.size(1) == nodes, name, " must have shape [B, N] = [", batch, ", ", nodes,
                "], got ", t.sizes());
    check_index_dtype(t, name);
    check_same_device(t, target_probs, name, "target_probs");
  }
  if (num_nodes) {
    check_rank(*num_nodes, 1, "num_nodes", "[B]");
    check_size(*num_nodes, 0, batch, "num_nodes", "[B]");
    check_index_dtype(*num_nodes, "num_nodes");
    check_same_device(*num_nodes, target_probs, "num_nodes", "target_probs");
  }
  if (draft_probs) {
    check_rank(*draft_probs, 3, "draft_probs", "[B, N, V]");
    TORCH_CHECK_VALUE(draft_probs->sizes() == target_probs.sizes(), "draft_probs must have shape [B, N, V] = ",
                target_probs.sizes(), ", got ", draft_probs->sizes());
    TORCH_CHECK_TYPE(draft_probs->scalar_type() == target_probs.scalar_type(), "draft_probs must have the dtype of ",
                "target_probs (", target_probs.scalar_type(), "), got ", draft_probs->scalar_type());
    check_same_device(*draft_probs, target_probs, "draft_probs", "target_probs");
  }
  check_rng_args(seeds, offsets, batch, target_probs, "target_probs");
  check_greedy(greedy, batch, target_probs, "target_probs");
}

// CPU only: index values the kernel would otherwise read out of range or misread.
void check_values_cpu(const TreeVerifyParams& p) {
  check_tree_values_cpu(p.parents, p.tree_token_ids, p.num_nodes, p.batch, p.max_nodes, p.vocab);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> tree_rejection_sample(
    const at::Tensor& target_probs, const at::Tensor& tree_token_ids, const at::Tensor& parents,
    const std::optional<at::Tensor>& num_nodes, const std::optional<at::Tensor>& draft_probs,
    const at::Tensor& seeds, const at::Tensor& offsets, const std::optional<at::Tensor>& greedy) {
  check_args(target_probs, tree_token_ids, parents, num_nodes, draft_probs, seeds, offsets, greedy);
  const int64_t batch = target_probs.size(0), nodes = target_probs.size(1);
  const auto target = target_probs.contiguous();
  const auto tokens = tree_token_ids.contiguous().to(at::kLong);
  const auto parents_c = parents.contiguous().to(at::kLong);
  at::Tensor num_nodes_c, draft, greedy_c;
  if (num_nodes) num_nodes_c = num_nodes->contiguous().to(at::kLong);
  if (draft_probs) draft = draft_probs->contiguous();
  if (greedy) greedy_c = greedy->contiguous();
  const auto seeds_c = seeds.contiguous();
  const auto offsets_c = offsets.contiguous();

  const auto index_opts = target.options().dtype(at::kInt);
  auto token_ids = at::empty({batch, nodes}, target.options().dtype(at::kLong));
  auto accepted_path = at::empty({batch, nodes}, index_opts);
  auto num_accepted = at::empty({batch}, index_opts);
  if (batch == 0) return {token_ids, accepted_path, num_accepted};
  // CPU: per-request scratch of the node being tried: normalizers (draft_probs) or zeroed tokens
  // (the CUDA kernel keeps them in its own workspace).
  const bool cpu = target.is_cpu();
  auto normalizers = at::empty({cpu && draft.defined() ? batch * nodes : 0}, target.options().dtype(at::kFloat));
  auto zeroed = at::empty({cpu && !draft.defined() ? batch * nodes : 0}, index_opts);

  TreeVerifyParams p;
  p.target_probs = target.const_data_ptr();
  p.draft_probs = draft.defined() ? draft.const_data_ptr() : nullptr;
  p.tree_token_ids = tokens.const_data_ptr<int64_t>();
  p.parents = parents_c.const_data_ptr<int64_t>();
  p.num_nodes = num_nodes_c.defined() ? num_nodes_c.const_data_ptr<int64_t>() : nullptr;
  p.seeds = seeds_c.const_data_ptr<int64_t>();
  p.offsets = offsets_c.const_data_ptr<int64_t>();
  p.greedy = greedy_c.defined() ? greedy_c.const_data_ptr<bool>() : nullptr;
  p.batch = batch;
  p.max_nodes = nodes;
  p.vocab = target.size(2);
  p.dtype = prob_dtype(target);
  p.normalizers = normalizers.mutable_data_ptr<float>();
  p.zeroed = zeroed.mutable_data_ptr<int32_t>();
  p.workspace = nullptr;
  p.token_ids = token_ids.mutable_data_ptr<int64_t>();
  p.accepted_path = accepted_path.mutable_data_ptr<int32_t>();
  p.num_accepted = num_accepted.mutable_data_ptr<int32_t>();

  if (cpu) {
    check_values_cpu(p);
    tree_rejection_sample_cpu(p);
  } else {
#ifdef SPECDEC_WITH_CUDA
    const c10::cuda::CUDAGuard guard(target.device());
    // Per-launch partials, barrier counters and per-block node arrays of the split walk
    // (stream-ordered by the caching allocator).
    const auto workspace = at::empty({static_cast<int64_t>(tree_verify_cuda_workspace_bytes(p))},
                                     target.options().dtype(at::kByte));
    p.workspace = workspace.mutable_data_ptr();
    C10_CUDA_CHECK(launch_tree_rejection_sample_cuda(p, at::cuda::getCurrentCUDAStream()));
#else
    TORCH_CHECK(false, "specdec_ops was built without CUDA kernels");
#endif
  }
  return {token_ids, accepted_path, num_accepted};
}

}  // namespace tree_verify_op

TORCH_LIBRARY_IMPL(specdec, CPU, m) { m.impl("tree_rejection_sample", &tree_verify_op::tree_rejection_sample); }

#ifdef SPECDEC_WITH_CUDA
TORCH_LIBRARY_IMPL(specdec, CUDA, m) { m.impl("tree_rejection_sample", &tree_verify_op::tree_rejection_sample); }
#endif

}  // namespace specdec
