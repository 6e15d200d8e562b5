// torch glue of specdec::build_tree: argument checks, CPU value checks, and
// dispatch to the CPU or CUDA kernel. tree_attention and merge_attention_states
// have composite CPU implementations and Triton kernels (specdec_ops/tree.py).
#include <ATen/ATen.h>
#include <torch/library.h>

#include "../common/torch_checks.h"
#include "tree_math.h"
#include "tree_params.h"

#ifdef SPECDEC_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
namespace specdec {
cudaError_t launch_build_tree_cuda(const BuildTreeParams& params, cudaStream_t stream);
}
#endif

namespace specdec {
// This file's helpers (compiled with the other glue files in csrc/torch_ops.cpp).
namespace tree_op {

// CPU only: num_nodes in [0, N]; for real nodes parents[b, 0] == -1 and 0 <= parents[b, i] < i.
void check_values_cpu(const BuildTreeParams& p) {
  for (int64_t b = 0; b < p.batch; ++b) {
    if (p.num_nodes != nullptr) {
      const int64_t n = p.num_nodes[b];
      TORCH_CHECK_VALUE(n >= 0 && n <= p.nodes, "num_nodes[", b, "] = ", n, " is outside [0, N = ", p.nodes, "]");
    }
    const int64_t real = tree_num_real(p.num_nodes, b, p.nodes);
    for (int64_t i = 0; i < real; ++i) {
      const int64_t parent = p.parents[b * p.nodes + i];
      if (tree_parent_ok(i, parent)) continue;
      if (i == 0) {
        TORCH_CHECK_VALUE(false, "parents[", b, ", 0] = ", parent, " must be -1 (node 0 is the root)");
      }
      TORCH_CHECK_VALUE(false, "parents[", b, ", ", i, "] = ", parent, " is malformed: the parent of node ", i,
                        " must satisfy 0 <= parent < ", i);
    }
  }
}

std::tuple<at::Tensor, at::Tensor> build_tree(const at::Tensor& parents, const std::optional<at::Tensor>& num_nodes) {
  check_rank(parents, 2, "parents", "[B, N]");
  check_index_dtype(parents, "parents");
  const int64_t batch = parents.size(0), nodes = parents.size(1), words = tree_mask_words(nodes);
  at::Tensor num_nodes_c;
  if (num_nodes) {
    check_rank(*num_nodes, 1, "num_nodes", "[B]");
    check_size(*num_nodes, 0, batch, "num_nodes", "[B]");
    check_index_dtype(*num_nodes, "num_nodes");
    check_same_device(*num_nodes, parents, "num_nodes", "parents");
    num_nodes_c = num_nodes->contiguous().to(at::kLong);
  }
  const auto parents_c = parents.contiguous().to(at::kLong);
  auto mask = at::empty({batch, nodes, words}, parents.options().dtype(at::kLong));
  auto depth = at::empty({batch, nodes}, parents.options().dtype(at::kInt));
  if (batch == 0 || nodes == 0) return {mask, depth};

  BuildTreeParams p;
  p.parents = parents_c.const_data_ptr<int64_t>();
  p.num_nodes = num_nodes_c.defined() ? num_nodes_c.const_data_ptr<int64_t>() : nullptr;
  p.batch = batch;
  p.nodes = nodes;
  p.words = words;
  p.mask = mask.mutable_data_ptr<int64_t>();
  p.depth = depth.mutable_data_ptr<int32_t>();

  if (parents.is_cpu()) {
    check_values_cpu(p);
    build_tree_cpu(p);
  } else {
#ifdef SPECDEC_WITH_CUDA
    const c10::cuda::CUDAGuard guard(parents.device());
    C10_CUDA_CHECK(launch_build_tree_cuda(p, at::cuda::getCurrentCUDAStream()));
#else
    TORCH_CHECK(false, "specdec_ops was built without CUDA kernels");
#endif
  }
  return {mask, depth};
}

}  // namespace tree_op

TORCH_LIBRARY_IMPL(specdec, CPU, m) { m.impl("build_tree", &tree_op::build_tree); }

#ifdef SPECDEC_WITH_CUDA
TORCH_LIBRARY_IMPL(specdec, CUDA, m) { m.impl("build_tree", &tree_op::build_tree); }
#endif

}  // namespace specdec
