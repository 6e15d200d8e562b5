// CUDA kernel of build_tree (DESIGN.md §5.4). Raw pointers only, no torch
// headers: the launcher in tree_op.cpp checks tensors and passes BuildTreeParams.
// One thread block per request; each thread owns (node, word) pairs and walks the
// node's ancestors (tree_math.h). Parents precede their children, so a walk never
// takes more steps than the node's index: bounded work, no hang on any input. A
// malformed parent is treated as the root; num_nodes is clamped into [0, N].
#include <cuda_runtime.h>

#include <cstdint>

#include "tree_math.h"
#include "tree_params.h"

namespace specdec {
namespace {

constexpr int kThreads = 256;

__global__ void build_tree_kernel(BuildTreeParams p) {
  const int64_t b = blockIdx.x;
  const int64_t* parents = p.parents + b * p.nodes;
  const int64_t real = tree_num_real(p.num_nodes, b, p.nodes);
  const int64_t pairs = p.nodes * p.words;
  for (int64_t k = threadIdx.x; k < pairs; k += blockDim.x) {
    const int64_t i = k / p.words, w = k % p.words;
    const bool is_real = i < real;
    p.mask[(b * p.nodes) * p.words + k] = is_real ? static_cast<int64_t>(tree_ancestor_word(parents, i, w)) : 0;
    if (w == 0) p.depth[b * p.nodes + i] = is_real ? tree_depth(parents, i) : -1;
  }
}

}  // namespace

cudaError_t launch_build_tree_cuda(const BuildTreeParams& params, cudaStream_t stream) {
  if (params.batch == 0 || params.nodes == 0) return cudaSuccess;
  build_tree_kernel<<<static_cast<unsigned>(params.batch), kThreads, 0, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace specdec
