// CUDA kernel of tree verification (DESIGN.md §5.3). Raw pointers only, no
// torch headers: the launcher in tree_verify_op.cpp checks tensors and passes
// TreeVerifyParams. One thread block per request:
//   * the tree (parent and token of every node) is staged in shared memory;
//   * every thread runs the same scalar walk (tree_verify_math.h) over the
//     nodes in index order, so all threads take the same branches without
//     broadcasts; only the outputs and the per-node scratch (normalizers or
//     zeroed tokens, in a global workspace) are written by thread 0, followed
//     by a barrier;
//   * the vocab-wide steps are block reductions over one row, 4 entries per
//     thread and Philox block with vectorized loads: argmax (greedy), sum and
//     support of p_u (first child, no draft_probs), the sum of the next
//     residual (a rejection, draft_probs), and the final exponential race.
// No host sync; every index is clamped or checked: a bad parent is the root, a
// child token outside [0, V) is rejected, num_nodes is clamped into [1, N].
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "../common/sampling_cuda.cuh"
#include "tree_verify_math.h"
#include "tree_verify_params.h"

namespace specdec {
namespace {

using namespace cuda;

constexpr int64_t kMaxStagedNodes = 4096;  // 8 bytes each in dynamic shared memory

// Thread layout. The sums of a row (sum of p_u, sum of the next residual) feed the
// acceptance tests, so their float rounding is kept exactly as it was with one
// thread per "virtual thread" (vthreads = threads_for_vocab(V) <= 1024, virtual
// thread v taking groups v, v + vthreads, ... in order, then the warp-shuffle and
// 32-warp tree of block_sum): each real thread t now runs the virtual threads t and
// t + blockDim.x (blockDim.x = vthreads / 2, at least 32) with one accumulator
// each, and the reduction combines the virtual warps in the same tree. Half the
// threads, so up to 128 registers (no spills), and both groups of a step are
// loaded before either is used: two or four 16-byte loads in flight per thread.
constexpr int kTreeThreads = 512;

struct Scratch {
  ArgMax argmax[32];
  float sum[32];
  long long count[32];
  int found;
};

// Block-wide argmax through the scratch's argmax slots; every thread gets the result.
__device__ __forceinline__ ArgMax block_argmax(ArgMax a, Scratch& s) { return cuda::block_argmax(a, s.argmax); }

__device__ __forceinline__ void warp_sum(float& v, long long& c) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    v += __shfl_down_sync(kFullMask, v, o);
    c += __shfl_down_sync(kFullMask, c, o);
  }
}

// Block-wide sum of the virtual threads' floats and counts (v[h], c[h]: virtual
// thread threadIdx.x + h * blockDim.x); every thread gets both totals.
__device__ void block_sum(float v[2], long long c[2], int vthreads, Scratch& s, float& sum, long long& count) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, real_warps = blockDim.x >> 5;
  warp_sum(v[0], c[0]);
  warp_sum(v[1], c[1]);
  if (lane == 0) {
    s.sum[warp] = v[0];
    s.count[warp] = c[0];
    if (warp + real_warps < 32) {
      s.sum[warp + real_warps] = v[1];
      s.count[warp + real_warps] = c[1];
    }
  }
  __syncthreads();
  if (warp == 0) {
    const bool live = lane < (vthreads >> 5);
    float x = live ? s.sum[lane] : 0.f;
    long long y = live ? s.count[lane] : 0;
    warp_sum(x, y);
    if (lane == 0) {
      s.sum[0] = x;
      s.count[0] = y;
    }
  }
  __syncthreads();
  sum = s.sum[0];
  count = s.count[0];
  __syncthreads();
}

// Calls f(h, g, pv, qv) for every group g of virtual thread threadIdx.x + h * blockDim.x
// (h = 0, 1), each virtual thread's groups in increasing order; both groups of a step
// are loaded before either is used. Entries past the vocab read 0; qv is 0 without q.
// Compiled once per alignment so that the aligned loop holds only 16-byte loads.
template <bool kHasQ, bool kAligned, typename T, typename F>
__device__ __forceinline__ void for_each_group_aligned(const T* __restrict__ p_row, const T* __restrict__ q_row,
                                                       int64_t vocab, int vthreads, F& f) {
  const int64_t groups = (vocab + 3) / 4, half = blockDim.x;
  for (int64_t base = threadIdx.x; base < groups; base += vthreads) {
    float pv[2][4], qv[2][4] = {};
    bool live[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t g = base + h * half;
      live[h] = threadIdx.x + h * half < vthreads && g < groups;
      load4(p_row, vocab, live[h] ? 4 * g : vocab, kAligned, pv[h]);
      if (kHasQ) load4(q_row, vocab, live[h] ? 4 * g : vocab, kAligned, qv[h]);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h)
      if (live[h]) f(h, base + h * half, pv[h], qv[h]);
  }
}

template <bool kHasQ, typename T, typename F>
__device__ __forceinline__ void for_each_group(const T* __restrict__ p_row, const T* __restrict__ q_row,
                                               int64_t vocab, int vthreads, F&& f) {
  if (aligned4(p_row) && (!kHasQ || aligned4(q_row)))
    for_each_group_aligned<kHasQ, true>(p_row, q_row, vocab, vthreads, f);
  else
    for_each_group_aligned<kHasQ, false>(p_row, q_row, vocab, vthreads, f);
}

template <typename T>
__device__ int64_t row_argmax(const T* __restrict__ row, int64_t vocab, int vthreads, Scratch& s) {
  ArgMax best = argmax_init();
  for_each_group<false>(row, row, vocab, vthreads, [&](int, int64_t g, const float* v, const float*) {
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (4 * g + j < vocab) argmax_update(best, prob_mass(v[j]), 4 * g + j);
  });
  return block_argmax(best, s).index;
}

// Sum and number of entries with mass of p_u (the first child of u, no draft_probs).
template <typename T>
__device__ void row_sum_count(const T* __restrict__ row, int64_t vocab, int vthreads, Scratch& s, float& sum,
                              int64_t& count) {
  float v_sum[2] = {0.f, 0.f};
  long long v_count[2] = {0, 0};
  for_each_group<false>(row, row, vocab, vthreads, [&](int h, int64_t, const float* v, const float*) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float mass = prob_mass(v[j]);  // entries past vocab read 0
      v_sum[h] += mass;
      v_count[h] += mass > 0.f;
    }
  });
  long long total_count = 0;
  block_sum(v_sum, v_count, vthreads, s, sum, total_count);
  count = total_count;
}

// Sum of the next residual update r_{m+1} = max(r_m / Z_m - q, 0) (a rejection, draft_probs).
template <typename T>
__device__ float next_residual_sum(const T* __restrict__ p_row, const T* __restrict__ q_row, int64_t vocab,
                                   const float* z, int64_t m, float z_m, int vthreads, Scratch& s) {
  float v_sum[2] = {0.f, 0.f};
  long long unused[2] = {0, 0};
  for_each_group<true>(p_row, q_row, vocab, vthreads, [&](int h, int64_t, const float* pv, const float* qv) {
#pragma unroll
    for (int j = 0; j < 4; ++j) v_sum[h] += tree_next_residual(tree_residual(pv[j], qv[j], z, m), z_m, qv[j]);
  });
  float sum = 0.f;
  long long count = 0;
  block_sum(v_sum, unused, vthreads, s, sum, count);
  return sum;
}

// Exponential race over p' at u: r_m (draft_probs) or p_u without the zeroed tokens.
template <typename T>
__device__ int64_t final_race(const T* __restrict__ p_row, const T* __restrict__ q_row, int64_t vocab,
                              const float* z, const int32_t* zeroed, int64_t m, uint64_t seed, uint64_t offset,
                              uint32_t position, uint32_t purpose, int vthreads, Scratch& s) {
  ArgMax best = argmax_init();
  if (q_row != nullptr) {
    for_each_group<true>(p_row, q_row, vocab, vthreads, [&](int, int64_t g, const float* pv, const float* qv) {
      const Philox4 bits = philox_block(seed, offset, position, purpose, static_cast<uint32_t>(g));
#pragma unroll
      for (int j = 0; j < 4; ++j)
        if (4 * g + j < vocab) race_update(best, tree_residual(pv[j], qv[j], z, m), bits.x[j], 4 * g + j);
    });
  } else {
    for_each_group<false>(p_row, p_row, vocab, vthreads, [&](int, int64_t g, const float* pv, const float*) {
      unsigned excluded = 0;  // bit j: entry 4g + j is zeroed
      for (int64_t k = 0; k < m; ++k)
        if ((zeroed[k] >> 2) == g) excluded |= 1u << (zeroed[k] & 3);
      const Philox4 bits = philox_block(seed, offset, position, purpose, static_cast<uint32_t>(g));
#pragma unroll
      for (int j = 0; j < 4; ++j)
        if (4 * g + j < vocab)
          race_update(best, (excluded >> j) & 1u ? 0.f : prob_mass(pv[j]), bits.x[j], 4 * g + j);
    });
  }
  return block_argmax(best, s).index;
}

template <typename T>
__global__ void __launch_bounds__(kTreeThreads, 1) tree_verify_kernel(const TreeVerifyParams p, int vthreads) {
  __shared__ Scratch s;
  extern __shared__ int32_t staged[];  // [2, N] parent, token (-1 outside the vocab) when N <= kMaxStagedNodes
  const int64_t b = blockIdx.x, N = p.max_nodes, V = p.vocab;
  const int64_t n = tree_num_nodes(p.num_nodes, b, N);
  const bool greedy = p.greedy != nullptr && p.greedy[b];
  const uint64_t seed = static_cast<uint64_t>(p.seeds[b]);
  const uint64_t offset = static_cast<uint64_t>(p.offsets[b]);
  const int64_t* tokens = p.tree_token_ids + b * N;
  const int64_t* parents = p.parents + b * N;
  const T* target = static_cast<const T*>(p.target_probs) + b * N * V;
  const T* draft = p.draft_probs != nullptr ? static_cast<const T*>(p.draft_probs) + b * N * V : nullptr;
  float* z = p.normalizers != nullptr ? p.normalizers + b * N : nullptr;
  int32_t* zeroed = p.zeroed != nullptr ? p.zeroed + b * N : nullptr;
  int64_t* out_tokens = p.token_ids + b * N;
  int32_t* out_path = p.accepted_path + b * N;

  const bool stage = N <= kMaxStagedNodes;
  if (stage) {
    for (int64_t c = threadIdx.x; c < n; c += blockDim.x) {
      staged[c] = c == 0 ? -1 : static_cast<int32_t>(tree_parent(parents[c], c));
      staged[N + c] = draft_in_vocab(tokens[c], V) ? static_cast<int32_t>(tokens[c]) : -1;
    }
    __syncthreads();
  }
  const auto parent_of = [&](int64_t c) -> int64_t { return stage ? staged[c] : tree_parent(parents[c], c); };
  const auto token_of = [&](int64_t c) -> int64_t {
    return stage ? staged[N + c] : (draft_in_vocab(tokens[c], V) ? tokens[c] : -1);
  };

  int64_t u = 0, k = 0, final_token;
  if (threadIdx.x == 0) out_path[0] = 0;
  if (greedy) {
    int64_t best = row_argmax(target, V, vthreads, s);
    while (true) {
      if (threadIdx.x == 0) s.found = static_cast<int>(n);
      __syncthreads();
      for (int64_t c = u + 1 + threadIdx.x; c < n; c += blockDim.x)
        if (parent_of(c) == u && token_of(c) == best) atomicMin(&s.found, static_cast<int>(c));
      __syncthreads();
      const int64_t c = s.found;
      __syncthreads();
      if (c >= n) break;
      if (threadIdx.x == 0) {
        out_tokens[k] = best;
        out_path[k + 1] = static_cast<int32_t>(c);
      }
      ++k;
      u = c;
      best = row_argmax(target + u * V, V, vthreads, s);
    }
    final_token = best;
  } else {
    bool rejected = false;  // a child of u was tried and rejected
    int64_t m = 0;          // committed residual updates (draft_probs) / zeroed tokens at u
    float sum = 0.f;        // no draft_probs: sum of p'
    int64_t nonzero = 0;    // no draft_probs: entries of p_u with mass
    for (int64_t c = 1; c < n; ++c) {
      if (parent_of(c) != u) continue;
      const int64_t x = token_of(c);
      const bool in_vocab = x >= 0;
      const float uc = tree_accept_uniform(seed, offset, c);
      const T* p_row = target + u * V;
      bool accept;
      if (draft != nullptr) {
        const T* q_row = draft + u * V;
        const float z_m = tree_normalizer(z, m);
        accept = false;
        if (in_vocab) {
          const float q_x = to_float(q_row[x]);
          accept = tree_accept_draft(uc, tree_residual(to_float(p_row[x]), q_x, z, m), z_m, q_x);
        }
        if (!accept) {
          const float total = next_residual_sum(p_row, q_row, V, z, m, z_m, vthreads, s);
          if (total > 0.f) {
            if (threadIdx.x == 0) z[m] = total;
            ++m;
            __syncthreads();
          }
        }
      } else {
        if (!rejected) row_sum_count(p_row, V, vthreads, s, sum, nonzero);
        const float p_x = in_vocab && !tree_excluded(x, zeroed, m) ? prob_mass(to_float(p_row[x])) : 0.f;
        accept = in_vocab && tree_accept_onehot(uc, sum, p_x);
        if (!accept && p_x > 0.f && nonzero - m > 1) {
          if (threadIdx.x == 0) zeroed[m] = static_cast<int32_t>(x);
          ++m;
          sum -= p_x;
          __syncthreads();
        }
      }
      if (accept) {
        if (threadIdx.x == 0) {
          out_tokens[k] = x;
          out_path[k + 1] = static_cast<int32_t>(c);
        }
        ++k;
        u = c;
        rejected = false;
        m = 0;
      } else {
        rejected = true;
      }
    }
    final_token = final_race(target + u * V, draft != nullptr ? draft + u * V : nullptr, V, z, zeroed, m, seed,
                             offset, static_cast<uint32_t>(u), tree_final_purpose(rejected), vthreads, s);
  }

  if (threadIdx.x == 0) {
    out_tokens[k] = final_token;
    p.num_accepted[b] = static_cast<int32_t>(k);
  }
  for (int64_t j = k + 1 + threadIdx.x; j < N; j += blockDim.x) {
    out_tokens[j] = -1;
    out_path[j] = -1;
  }
}

}  // namespace

cudaError_t launch_tree_rejection_sample_cuda(const TreeVerifyParams& params, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(params.batch));
  const int vthreads = threads_for_vocab(params.vocab);  // the layout the sums are rounded in (see above)
  const dim3 block(std::max(32, vthreads / 2));
  const size_t smem = params.max_nodes <= kMaxStagedNodes ? 2 * sizeof(int32_t) * params.max_nodes : 0;
  switch (params.dtype) {
    case ProbDType::kFloat32: tree_verify_kernel<float><<<grid, block, smem, stream>>>(params, vthreads); break;
    case ProbDType::kFloat16: tree_verify_kernel<__half><<<grid, block, smem, stream>>>(params, vthreads); break;
    case ProbDType::kBFloat16:
      tree_verify_kernel<__nv_bfloat16><<<grid, block, smem, stream>>>(params, vthreads);
      break;
  }
  return cudaGetLastError();
}

}  // namespace specdec
