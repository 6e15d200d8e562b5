// CUDA kernels of process_logits and chain and tree verification from logits (DESIGN.md §5.7).
// Raw pointers only, no torch headers: the launchers in logits_op.cpp check tensors and
// pass the *Params structs. One thread block per row (process_logits) or per request
// (chain, tree), rows read with coalesced loads and never written as probabilities:
//   1. max and first argmax (greedy rows stop here);
//   2. rows with filters: radix select on the order-preserving keys of z = (x - m) / T,
//      4 passes of 8 bits with 256-bin shared-memory histograms (counts for top-k; counts
//      and mass for top-p, whose pass 0 also gives the top-k survivors' mass); min-p is a
//      key threshold (logits_math.h);
//   3. the kept mass S (one pass), then the acceptance test of the draft (one thread);
//   4. at the first rejection, or on the bonus row, one exponential race over
//      p = e / S (or max(p - q, 0)), the arithmetic of rejection_kernels.cu.
// Rows after the first rejection are never read. The tree kernel walks the tree as
// tree_verify_kernels.cu does, entering a node's row statistics when the walk reaches it.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "../common/philox.h"
#include "../common/sampling_cuda.cuh"
#include "../common/sampling_math.h"
#include "../tree_verify/tree_verify_math.h"
#include "logits_math.h"
#include "logits_params.h"

namespace specdec {
namespace {

using cuda::kFullMask;
using cuda::kMaxThreads;
using cuda::to_float;

struct Shared {
  ArgMax argmax[32];
  float sum[32];
  unsigned int counts[kRadixBins];
  float mass[kRadixBins];
  uint32_t prefix;
  int64_t remaining;
  float target, above;
  int flag;
};

// Running argmax of logits: the empty state scores -inf at an index past every real
// one, so the first index wins among all--inf rows as well.
__device__ __forceinline__ ArgMax logit_argmax_init() { return ArgMax{-INFINITY, INT64_MAX}; }

__device__ ArgMax block_argmax_logit(ArgMax a, Shared& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    ArgMax b{__shfl_down_sync(kFullMask, a.score, o),
             static_cast<int64_t>(__shfl_down_sync(kFullMask, static_cast<long long>(a.index), o))};
    a = argmax_merge(a, b);
  }
  if (lane == 0) sh.argmax[warp] = a;
  __syncthreads();
  if (warp == 0) {
    a = lane < static_cast<int>(blockDim.x >> 5) ? sh.argmax[lane] : logit_argmax_init();
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      ArgMax b{__shfl_down_sync(kFullMask, a.score, o),
               static_cast<int64_t>(__shfl_down_sync(kFullMask, static_cast<long long>(a.index), o))};
      a = argmax_merge(a, b);
    }
    if (lane == 0) sh.argmax[0] = a;
  }
  __syncthreads();
  const ArgMax result = sh.argmax[0];
  __syncthreads();
  return result;
}

__device__ float block_sum(float v, Shared& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(kFullMask, v, o);
  if (lane == 0) sh.sum[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < static_cast<int>(blockDim.x >> 5) ? sh.sum[lane] : 0.f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(kFullMask, v, o);
    if (lane == 0) sh.sum[0] = v;
  }
  __syncthreads();
  const float result = sh.sum[0];
  __syncthreads();
  return result;
}

// The processed distribution of one row as four numbers (logits_math.h).
struct RowStats {
  float m;         // max x
  int64_t argmax;  // first index of the max
  uint32_t tau;    // kept: key >= tau
  float total;     // S; 0 for greedy rows and rows without mass
};

template <typename T>
__device__ __forceinline__ float load_logit(const T* row, int64_t i) {
  return logit_value(to_float(row[i]));
}

// Radix select over the keys >= floor_key of a row: by count, the key of the goal-th
// largest; by mass, the largest key v whose candidates at or above it reach `goal` times
// their total mass (top_p). Thread 0 picks each digit (radix_pick_count / _mass).
template <typename T, bool kByMass>
__device__ uint32_t radix_select(const T* row, int64_t vocab, float m, float temperature, uint32_t floor_key,
                                 float goal, Shared& sh) {
  if (threadIdx.x == 0) {
    sh.prefix = 0;
    sh.remaining = static_cast<int64_t>(goal);
    sh.above = 0.f;
  }
  for (int pass = 0; pass < kRadixPasses; ++pass) {
    for (int d = threadIdx.x; d < kRadixBins; d += blockDim.x) {
      sh.counts[d] = 0;
      sh.mass[d] = 0.f;
    }
    __syncthreads();
    const uint32_t prefix = sh.prefix;
    for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
      const float z = scaled_logit(load_logit(row, i), m, temperature);
      const uint32_t key = order_key(z);
      if (key < floor_key || !radix_match(key, prefix, pass)) continue;
      const uint32_t d = radix_digit(key, pass);
      atomicAdd(&sh.counts[d], 1u);
      if (kByMass) atomicAdd(&sh.mass[d], exp_f(z));
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      uint32_t d;
      if (kByMass) {
        if (pass == 0) {
          float total = 0.f;
          for (int j = 0; j < kRadixBins; ++j) total += sh.mass[j];
          sh.target = goal * total * (1.f - kTopPSlack);
        }
        float above = sh.above;
        d = radix_pick_mass(sh.counts, sh.mass, sh.target, above);
        sh.above = above;
      } else {
        int64_t remaining = sh.remaining;
        d = radix_pick_count(sh.counts, remaining);
        sh.remaining = remaining;
      }
      sh.prefix = prefix | (d << (32 - kRadixBits * (pass + 1)));
    }
    __syncthreads();
  }
  const uint32_t result = sh.prefix;
  __syncthreads();  // every thread has read it before a next select resets it
  return result;
}

template <typename T>
__device__ RowStats row_stats(const T* row, int64_t vocab, const RowSampling& s, Shared& sh) {
  ArgMax best = logit_argmax_init();
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) argmax_update(best, load_logit(row, i), i);
  best = block_argmax_logit(best, sh);
  RowStats r{best.score, best.index, 0u, 0.f};
  if (row_is_greedy(s) || !(r.m > -INFINITY)) return r;
  uint32_t tau = 0;
  if (s.top_k > 0) tau = radix_select<T, false>(row, vocab, r.m, s.temperature, 0u, static_cast<float>(s.top_k), sh);
  if (s.top_p < 1.f) {
    const uint32_t tau_p = radix_select<T, true>(row, vocab, r.m, s.temperature, tau, s.top_p, sh);
    tau = tau_p > tau ? tau_p : tau;
  }
  const uint32_t tau_min = min_p_key(s.min_p);
  r.tau = tau_min > tau ? tau_min : tau;
  float part = 0.f;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    const float z = scaled_logit(load_logit(row, i), r.m, s.temperature);
    if (order_key(z) >= r.tau) part += exp_f(z);
  }
  r.total = block_sum(part, sh);
  return r;
}

__device__ __forceinline__ float stats_prob(float x, const RowStats& r, float temperature) {
  if (!(r.total > 0.f)) return 0.f;
  const float z = scaled_logit(x, r.m, temperature);
  return processed_prob(exp_f(z), order_key(z), r.tau, r.total);
}

// log p(token); greedy rows: log_softmax of the raw logits (one more pass, every thread).
template <typename T>
__device__ float token_logprob(const T* row, int64_t vocab, int64_t token, const RowStats& r, const RowSampling& s,
                               Shared& sh) {
  if (row_is_greedy(s)) {
    float part = 0.f;
    for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) part += exp_f(load_logit(row, i) - r.m);
    const float sum = block_sum(part, sh);
    if (!(r.m > -INFINITY)) return -INFINITY;
    return (load_logit(row, token) - r.m) - log_f(sum);
  }
  if (!(r.total > 0.f)) return -INFINITY;
  const float z = scaled_logit(load_logit(row, token), r.m, s.temperature);
  return processed_logprob(z, order_key(z), r.tau, log_f(r.total));
}

// Exponential race over p (bonus) or max(p - q, 0) (residual; q_row null: one-hot at
// `draft`), falling back to p when the residual is empty.
template <typename T, typename Q>
__device__ int64_t row_race(const T* row, const Q* q_row, int64_t draft, bool residual, int64_t vocab,
                            const RowStats& r, float temperature, uint64_t seed, uint64_t offset, uint32_t position,
                            Shared& sh) {
  const uint32_t purpose = residual ? kPurposeResidual : kPurposeBonus;
  ArgMax best_p = argmax_init(), best_r = argmax_init();
  for (int64_t g = threadIdx.x; 4 * g < vocab; g += blockDim.x) {
    const Philox4 bits = philox_block(seed, offset, position, purpose, static_cast<uint32_t>(g));
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t i = 4 * g + j;
      if (i >= vocab) break;
      const float p = stats_prob(load_logit(row, i), r, temperature);
      race_update(best_p, p, bits.x[j], i);
      if (residual) {
        const float q = q_row != nullptr ? to_float(q_row[i]) : (i == draft ? 1.f : 0.f);
        race_update(best_r, residual_mass(p, q), bits.x[j], i);
      }
    }
  }
  const ArgMax p_win = cuda::block_argmax(best_p, sh.argmax);
  if (!residual) return p_win.index;
  const ArgMax r_win = cuda::block_argmax(best_r, sh.argmax);
  return r_win.score > 0.f ? r_win.index : p_win.index;
}

template <typename T>
__global__ void __launch_bounds__(kMaxThreads) process_logits_kernel(const ProcessLogitsParams p) {
  __shared__ Shared sh;
  const int64_t j = blockIdx.x;
  const T* row = static_cast<const T*>(p.logits) + j * p.vocab;
  const RowSampling s = row_sampling(p.sampling.temperature, p.sampling.top_k, p.sampling.top_p, p.sampling.min_p,
                                     j / p.inner, p.vocab);
  const RowStats r = row_stats(row, p.vocab, s, sh);
  float* out = p.probs + j * p.vocab;
  const bool has_mass = r.m > -INFINITY;
  for (int64_t i = threadIdx.x; i < p.vocab; i += blockDim.x)
    out[i] = row_is_greedy(s) ? (has_mass && i == r.argmax ? 1.f : 0.f) : stats_prob(load_logit(row, i), r, s.temperature);
}

template <typename T, typename Q>
__global__ void __launch_bounds__(kMaxThreads) rejection_sample_logits_kernel(const LogitsRejectionParams p) {
  __shared__ Shared sh;
  const int64_t b = blockIdx.x, V = p.vocab;
  const LogitsRequestRows rows = logits_request_rows(p, b);
  const int64_t n = rows.num_drafts;
  const RowSampling s = row_sampling(p.sampling.temperature, p.sampling.top_k, p.sampling.top_p, p.sampling.min_p,
                                     b, V);
  const T* logits = static_cast<const T*>(p.target_logits);
  const Q* draft = static_cast<const Q*>(p.draft_probs);
  const int64_t* ids = p.draft_token_ids + rows.draft_base;
  const uint64_t seed = static_cast<uint64_t>(p.seeds[b]);
  const uint64_t offset = static_cast<uint64_t>(p.offsets[b]);
  int64_t* out = p.token_ids + b * (p.max_draft + 1);
  float* lp = p.logprobs != nullptr ? p.logprobs + b * (p.max_draft + 1) : nullptr;

  int64_t k = 0, final_token = 0;
  for (;; ++k) {
    const bool is_draft = k < n;
    if (!is_draft && p.bonus_token_ids != nullptr) break;  // the bonus row is not read (it may be absent)
    const T* row = logits + (rows.target_base + k) * V;
    const RowStats r = row_stats(row, V, s, sh);
    const int64_t x = is_draft ? ids[k] : -1;
    if (threadIdx.x == 0) {
      bool ok = false;
      if (is_draft && p.synthetic_rates != nullptr) {
        // Synthetic mode: the acceptance uniform against the position's rate (greedy rows too).
        ok = draft_in_vocab(x, V) &&
             synthetic_accept(philox_uniform(seed, offset, static_cast<uint32_t>(k), kPurposeAccept, 0),
                              p.synthetic_rates[k]);
      } else if (is_draft && row_is_greedy(s)) {
        ok = x == r.argmax;
      } else if (is_draft && draft_in_vocab(x, V)) {
        const float u = philox_uniform(seed, offset, static_cast<uint32_t>(k), kPurposeAccept, 0);
        const float q_x = draft != nullptr ? to_float(draft[(rows.draft_base + k) * V + x]) : 1.f;
        ok = accept_draft(u, stats_prob(load_logit(row, x), r, s.temperature), q_x);
      }
      sh.flag = ok;
    }
    __syncthreads();
    const bool accepted = sh.flag != 0;
    __syncthreads();
    int64_t token = x;
    if (!accepted) {
      if (row_is_greedy(s)) {
        token = r.argmax;
      } else {
        const Q* q_row = is_draft && draft != nullptr ? draft + (rows.draft_base + k) * V : nullptr;
        token = row_race(row, q_row, x, is_draft, V, r, s.temperature, seed, offset, static_cast<uint32_t>(k), sh);
      }
    }
    if (lp != nullptr) {
      const float value = token_logprob(row, V, token, r, s, sh);
      if (threadIdx.x == 0) lp[k] = value;
    }
    if (!accepted) {
      final_token = token;
      break;
    }
  }
  const bool external_bonus = k == n && p.bonus_token_ids != nullptr;  // its logprob is NaN
  if (external_bonus) final_token = external_bonus_token(p.bonus_token_ids, b, V);
  for (int64_t j = threadIdx.x; j <= p.max_draft; j += blockDim.x) {
    out[j] = j < k ? ids[j] : (j == k ? final_token : -1);
    if (lp != nullptr && (j > k || (j == k && external_bonus))) lp[j] = NAN;
  }
  if (threadIdx.x == 0) p.num_accepted[b] = static_cast<int32_t>(k);
}

// Tree walk of logits_cpu.cpp tree_request (tree_verify_math.h) with one block per request:
// every thread runs the same scalar walk (all branch conditions are block-uniform: they
// depend on block reductions and on the workspace, written by thread 0 before a barrier);
// vocab-wide steps are block reductions over the current node's row, whose probabilities
// are computed from its logits and row statistics (entered once per node).
template <typename T, typename Q>
__global__ void __launch_bounds__(kMaxThreads) tree_rejection_sample_logits_kernel(const LogitsTreeParams p) {
  __shared__ Shared sh;
  const int64_t b = blockIdx.x, N = p.max_nodes, V = p.vocab;
  const int64_t n = tree_num_nodes(p.num_nodes, b, N);
  const RowSampling s = row_sampling(p.sampling.temperature, p.sampling.top_k, p.sampling.top_p, p.sampling.min_p,
                                     b, V);
  const T* logits = static_cast<const T*>(p.target_logits) + b * N * V;
  const Q* draft = static_cast<const Q*>(p.draft_probs);
  const int64_t* tokens = p.tree_token_ids + b * N;
  const int64_t* parents = p.parents + b * N;
  const uint64_t seed = static_cast<uint64_t>(p.seeds[b]);
  const uint64_t offset = static_cast<uint64_t>(p.offsets[b]);
  float* z = p.normalizers + b * N;
  int32_t* zeroed = p.zeroed + b * N;
  int64_t* out_tokens = p.token_ids + b * N;
  int32_t* out_path = p.accepted_path + b * N;
  float* lp = p.logprobs != nullptr ? p.logprobs + b * N : nullptr;

  int64_t u = 0, k = 0;
  const T* row = logits;
  const Q* q_row = draft != nullptr ? draft + b * N * V : nullptr;
  RowStats r = row_stats(row, V, s, sh);
  if (threadIdx.x == 0) out_path[0] = 0;
  const auto move_to = [&](int64_t c, int64_t x) {
    const float value = lp != nullptr ? token_logprob(row, V, x, r, s, sh) : 0.f;
    if (threadIdx.x == 0) {
      if (lp != nullptr) lp[k] = value;
      out_tokens[k] = x;
      out_path[k + 1] = static_cast<int32_t>(c);
    }
    ++k;
    u = c;
    row = logits + u * V;
    if (draft != nullptr) q_row = draft + (b * N + u) * V;
    r = row_stats(row, V, s, sh);
  };

  int64_t final_token = 0;
  if (row_is_greedy(s)) {
    for (int64_t c = 1; c < n; ++c)
      if (tree_parent(parents[c], c) == u && tokens[c] == r.argmax) move_to(c, r.argmax);
    final_token = r.argmax;
  } else {
    bool rejected = false;
    int64_t m = 0;
    float sum = 0.f;
    long long nonzero = 0;
    for (int64_t c = 1; c < n; ++c) {
      if (tree_parent(parents[c], c) != u) continue;
      const int64_t x = tokens[c];
      const bool in_vocab = draft_in_vocab(x, V);
      const float uc = tree_accept_uniform(seed, offset, c);
      const float p_x = in_vocab ? stats_prob(load_logit(row, x), r, s.temperature) : 0.f;
      bool accept;
      if (draft != nullptr) {
        const float z_m = tree_normalizer(z, m);
        const float q_x = in_vocab ? to_float(q_row[x]) : 0.f;
        accept = in_vocab && tree_accept_draft(uc, tree_residual(p_x, q_x, z, m), z_m, q_x);
        if (!accept) {
          float part = 0.f;
          for (int64_t i = threadIdx.x; i < V; i += blockDim.x) {
            const float q = to_float(q_row[i]);
            part += tree_next_residual(tree_residual(stats_prob(load_logit(row, i), r, s.temperature), q, z, m), z_m,
                                       q);
          }
          const float total = block_sum(part, sh);
          if (total > 0.f) {
            if (threadIdx.x == 0) z[m] = total;
            __syncthreads();
            ++m;
          }
        }
      } else {
        if (!rejected) {
          float part = 0.f;
          long long count = 0;
          for (int64_t i = threadIdx.x; i < V; i += blockDim.x) {
            const float pi = stats_prob(load_logit(row, i), r, s.temperature);
            part += pi;
            count += pi > 0.f;
          }
          sum = block_sum(part, sh);
          nonzero = static_cast<long long>(block_sum(static_cast<float>(count), sh));
        }
        const float p_kept = in_vocab && !tree_excluded(x, zeroed, m) ? p_x : 0.f;
        accept = in_vocab && tree_accept_onehot(uc, sum, p_kept);
        if (!accept && p_kept > 0.f && nonzero - m > 1) {
          if (threadIdx.x == 0) zeroed[m] = static_cast<int32_t>(x);
          __syncthreads();
          ++m;
          sum -= p_kept;
        }
      }
      if (accept) {
        move_to(c, x);
        rejected = false;
        m = 0;
      } else {
        rejected = true;
      }
    }
    const uint32_t purpose = tree_final_purpose(rejected);
    ArgMax best = argmax_init();
    for (int64_t g = threadIdx.x; 4 * g < V; g += blockDim.x) {
      const Philox4 bits = philox_block(seed, offset, static_cast<uint32_t>(u), purpose, static_cast<uint32_t>(g));
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t i = 4 * g + j;
        if (i >= V) break;
        const float pi = stats_prob(load_logit(row, i), r, s.temperature);
        const float mass = draft != nullptr ? tree_residual(pi, to_float(q_row[i]), z, m)
                                            : (tree_excluded(i, zeroed, m) ? 0.f : pi);
        race_update(best, mass, bits.x[j], i);
      }
    }
    final_token = cuda::block_argmax(best, sh.argmax).index;
  }
  const float value = lp != nullptr ? token_logprob(row, V, final_token, r, s, sh) : 0.f;
  if (threadIdx.x == 0) {
    if (lp != nullptr) lp[k] = value;
    out_tokens[k] = final_token;
    p.num_accepted[b] = static_cast<int32_t>(k);
  }
  for (int64_t j = k + 1 + threadIdx.x; j < N; j += blockDim.x) {
    out_tokens[j] = -1;
    out_path[j] = -1;
    if (lp != nullptr) lp[j] = NAN;
  }
}

template <typename T, typename F>
void with_draft_type(bool draft_float32, F&& f) {
  if (draft_float32) f(T{}, float{});
  else f(T{}, T{});
}

}  // namespace

cudaError_t launch_process_logits_cuda(const ProcessLogitsParams& params, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(params.rows));
  const dim3 block(cuda::threads_for_vocab(params.vocab));
  switch (params.dtype) {
    case ProbDType::kFloat32: process_logits_kernel<float><<<grid, block, 0, stream>>>(params); break;
    case ProbDType::kFloat16: process_logits_kernel<__half><<<grid, block, 0, stream>>>(params); break;
    case ProbDType::kBFloat16: process_logits_kernel<__nv_bfloat16><<<grid, block, 0, stream>>>(params); break;
  }
  return cudaGetLastError();
}

cudaError_t launch_rejection_sample_logits_cuda(const LogitsRejectionParams& params, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(params.batch));
  const dim3 block(cuda::threads_for_vocab(params.vocab));
  auto launch = [&](auto t, auto q) {
    rejection_sample_logits_kernel<decltype(t), decltype(q)><<<grid, block, 0, stream>>>(params);
  };
  switch (params.dtype) {
    case ProbDType::kFloat32: launch(float{}, float{}); break;
    case ProbDType::kFloat16: with_draft_type<__half>(params.draft_float32, launch); break;
    case ProbDType::kBFloat16: with_draft_type<__nv_bfloat16>(params.draft_float32, launch); break;
  }
  return cudaGetLastError();
}

cudaError_t launch_tree_rejection_sample_logits_cuda(const LogitsTreeParams& params, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(params.batch));
  const dim3 block(cuda::threads_for_vocab(params.vocab));
  auto launch = [&](auto t, auto q) {
    tree_rejection_sample_logits_kernel<decltype(t), decltype(q)><<<grid, block, 0, stream>>>(params);
  };
  switch (params.dtype) {
    case ProbDType::kFloat32: launch(float{}, float{}); break;
    case ProbDType::kFloat16: with_draft_type<__half>(params.draft_float32, launch); break;
    case ProbDType::kBFloat16: with_draft_type<__nv_bfloat16>(params.draft_float32, launch); break;
  }
  return cudaGetLastError();
}

}  // namespace specdec
