// CUDA kernel of chain rejection sampling (DESIGN.md §5.2). Raw pointers only,
// no torch headers: the launcher in rejection_op.cpp checks tensors and passes
// RejectionParams. One thread block per request:
//   1. acceptance tests of all n_b drafts in parallel (one uniform each), the
//      first rejection found with a shared atomicMin (greedy: one block argmax
//      per row until the first mismatch);
//   2. one exponential race over a single row (the residual at the first
//      rejection, or the bonus row), vocab-parallel, 4 entries per thread and
//      Philox block, vectorized loads, block argmax reduction.
#include <cstdint>

#include "rejection_params.h"
#include "../common/sampling_cuda.cuh"
#include "../common/sampling_math.h"

namespace specdec {
namespace {

using namespace cuda;

// Exponential race over p_row (bonus) or over max(p - q, 0) (residual; q_row null
// means one-hot q at `draft`), falling back to p when the residual is empty.
template <typename T>
__device__ int64_t row_race(const T* __restrict__ p_row, const T* __restrict__ q_row, int64_t draft, bool residual,
                            int64_t vocab, uint64_t seed, uint64_t offset, uint32_t position, ArgMax* smem) {
  const uint32_t purpose = residual ? kPurposeResidual : kPurposeBonus;
  const bool p_aligned = aligned4(p_row);
  const bool q_aligned = q_row != nullptr && aligned4(q_row);
  ArgMax best_p = argmax_init(), best_r = argmax_init();
  for (int64_t g = threadIdx.x; 4 * g < vocab; g += blockDim.x) {
    float pv[4], qv[4] = {0.f, 0.f, 0.f, 0.f};
    load4(p_row, vocab, 4 * g, p_aligned, pv);
    if (residual && q_row != nullptr) load4(q_row, vocab, 4 * g, q_aligned, qv);
    const Philox4 bits = philox_block(seed, offset, position, purpose, static_cast<uint32_t>(g));
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t i = 4 * g + j;
      if (i >= vocab) break;
      race_update(best_p, prob_mass(pv[j]), bits.x[j], i);
      if (residual) {
        const float q = q_row != nullptr ? qv[j] : (i == draft ? 1.f : 0.f);
        race_update(best_r, residual_mass(pv[j], q), bits.x[j], i);
      }
    }
  }
  const ArgMax p_win = block_argmax(best_p, smem);
  if (!residual) return p_win.index;
  const ArgMax r_win = block_argmax(best_r, smem);
  return r_win.score > 0.f ? r_win.index : p_win.index;
}

template <typename T>
__global__ void __launch_bounds__(kMaxThreads) rejection_sample_kernel(const RejectionParams p) {
  __shared__ ArgMax smem[32];
  __shared__ int first_rejected;
  const int64_t b = blockIdx.x;
  const RequestRows rows = request_rows(p, b);
  const int64_t n = rows.num_drafts, vocab = p.vocab;
  const T* target = static_cast<const T*>(p.target_probs);
  const T* draft = static_cast<const T*>(p.draft_probs);
  const int64_t* ids = p.draft_token_ids + rows.draft_base;
  const bool greedy = p.greedy != nullptr && p.greedy[b];
  const uint64_t seed = static_cast<uint64_t>(p.seeds[b]);
  const uint64_t offset = static_cast<uint64_t>(p.offsets[b]);

  int64_t accepted = n, final_token = 0;
  if (greedy) {
    for (int64_t k = 0; k <= n; ++k) {
      const int64_t best = row_argmax(target + (rows.target_base + k) * vocab, vocab, smem);
      if (k == n || ids[k] != best) {
        accepted = k;
        final_token = best;
        break;
      }
    }
  } else {
    if (threadIdx.x == 0) first_rejected = static_cast<int>(n);
    __syncthreads();
    for (int64_t k = threadIdx.x; k < n; k += blockDim.x) {
      const int64_t x = ids[k];
      bool ok = false;
      if (draft_in_vocab(x, vocab)) {
        const float u = philox_uniform(seed, offset, static_cast<uint32_t>(k), kPurposeAccept, 0);
        const float p_x = to_float(target[(rows.target_base + k) * vocab + x]);
        const float q_x = draft != nullptr ? to_float(draft[(rows.draft_base + k) * vocab + x]) : 1.f;
        ok = accept_draft(u, p_x, q_x);
      }
      if (!ok) atomicMin(&first_rejected, static_cast<int>(k));
    }
    __syncthreads();
    accepted = first_rejected;
    const bool residual = accepted < n;
    const T* q_row = residual && draft != nullptr ? draft + (rows.draft_base + accepted) * vocab : nullptr;
    final_token = row_race(target + (rows.target_base + accepted) * vocab, q_row, residual ? ids[accepted] : -1,
                           residual, vocab, seed, offset, static_cast<uint32_t>(accepted), smem);
  }

  int64_t* out = p.token_ids + b * (p.max_draft + 1);
  for (int64_t j = threadIdx.x; j <= p.max_draft; j += blockDim.x)
    out[j] = j < accepted ? ids[j] : (j == accepted ? final_token : -1);
  if (threadIdx.x == 0) p.num_accepted[b] = static_cast<int32_t>(accepted);
}

}  // namespace

cudaError_t launch_rejection_sample_cuda(const RejectionParams& params, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(params.batch));
  const dim3 block(threads_for_vocab(params.vocab));
  switch (params.dtype) {
    case ProbDType::kFloat32: rejection_sample_kernel<float><<<grid, block, 0, stream>>>(params); break;
    case ProbDType::kFloat16: rejection_sample_kernel<__half><<<grid, block, 0, stream>>>(params); break;
    case ProbDType::kBFloat16: rejection_sample_kernel<__nv_bfloat16><<<grid, block, 0, stream>>>(params); break;
  }
  return cudaGetLastError();
}

}  // namespace specdec
