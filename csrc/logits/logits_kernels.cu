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
// Normalizers (sums of exp) take the approximate exponential (logits_math.h sum_exp_f); the max of
// 16-bit rows held in shared memory is taken 8 entries at a time with packed max instructions.
// Rows after the first rejection are never read. The tree kernel walks the tree as
// tree_verify_kernels.cu does, entering a node's row statistics when the walk reaches it.
// Chain batches run rejection_sample_logits_split_kernel instead when the device fits more than
// one block per request: steps 1 to 4 split over several blocks per request (logits_split.h), with
// the same outputs bit for bit (the kept mass rounds in the single-block kernel's order; argmaxes
// and races merge exactly over any partition; the radix select runs over the logits' own keys
// (logits_math.h radix_key: 2 passes for bfloat16, 3 for float16, 4 for float32) and turns its pick into
// z's key: the threshold the single-block kernel's select over z finds, up to the order its own
// shared-memory atomics add the masses in). Where a block's share of a row fits in shared memory
// beside the batch's blocks (split_share_bytes_for), the resident-row variant reads each row from HBM
// once: the max pass copies the share into shared memory, the radix passes, the kept mass and the
// race read it there. A draft row whose filters are top-p (and min-p) first takes one exp-sum pass over
// every entry: a draft that top-p surely keeps and that the test against that sum accepts is accepted
// there (logits_split.h top_p_accepts_early: never a decision the select would not make), so of a
// request's accepted rows most skip the radix select; its bonus row (temperature 1) races without the select
// and keeps the winner where top-p surely keeps it (logits_split.h top_p_verdict_above), racing again above a
// winner it drops: only a rejected row runs the select. Exp-sums first sum without logit_value (a NaN or +inf
// logit makes the sum non-finite, and that virtual thread sums again checked: the same sum bit for bit); races
// without draft probabilities at temperature 1 take p = e / S from the approximate exponential and skip, before
// their own test, every entry whose e is below the bar's cut (race_cut).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "../common/philox.h"
#include "../common/sampling_cuda.cuh"
#include "../common/sampling_math.h"
#include "../common/vocab_split.h"
#include "../tree_verify/tree_verify_math.h"
#include "logits_math.h"
#include "logits_params.h"
#include "logits_split.h"

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

// Thread 0's step of a radix select: the digit of pass `pass` from the histogram in `st` (counts,
// mass; target, above, remaining, prefix carried between passes), appended to `prefix` in st.prefix.
// By mass, pass 0 sets the target from the candidates' mass: target_of(sum of the bins, in bin order).
template <bool kByMass, typename State, typename TargetOf>
__device__ __forceinline__ void radix_pick_step(State& st, uint32_t prefix, int pass, TargetOf target_of) {
  uint32_t d;
  if (kByMass) {
    if (pass == 0) {
      decltype(st.target) total = 0;
      for (int j = 0; j < kRadixBins; ++j) total += st.mass[j];
      st.target = target_of(total);
    }
    decltype(st.above) above = st.above;
    d = radix_pick_mass(st.counts, st.mass, st.target, above);
    st.above = above;
  } else {
    int64_t remaining = st.remaining;
    d = radix_pick_count(st.counts, remaining);
    st.remaining = remaining;
  }
  st.prefix = prefix | (d << (32 - kRadixBits * (pass + 1)));
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
    if (threadIdx.x == 0)
      radix_pick_step<kByMass>(sh, prefix, pass, [&](float total) { return goal * total * (1.f - kTopPSlack); });
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
    if (order_key(z) >= r.tau) part += sum_exp_f(z);
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
    for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) part += sum_exp_f(load_logit(row, i) - r.m);
    const float sum = block_sum(part, sh);
    if (!(r.m > -INFINITY)) return -INFINITY;
    return (load_logit(row, token) - r.m) - log_f(sum);
  }
  if (!(r.total > 0.f)) return -INFINITY;
  const float z = scaled_logit(load_logit(row, token), r.m, s.temperature);
  return processed_logprob(z, order_key(z), r.tau, log_f(r.total));
}

// How a race computes an entry's p from its logit as read (logit_value not applied). kMode 0 (checked):
// stats_prob of logit_value(x), the acceptance test's arithmetic. The fast mode (kMode 1, race_mode: races
// without draft probabilities, the bonus race and a one-hot draft's residual, at temperature 1, of rows with
// mass and no +inf logit, m < FLT_MAX) takes z = x - m, e = sum_exp_f(z) and p = e * (1 / S): 5 instructions
// an entry against stats_prob's 20 (expf, two divisions, logit_value). (Other temperatures keep mode 0: a
// fast loop per temperature kind would add two more race loops to every kernel and a minute to the build.)
// The kept test is the kept mass's (z >= kept_floor(tau)), a NaN logit gives
// p = 0 or NaN, either no mass to the race as logit_value's -inf gives, and -inf gives 0: the races only see
// p rounded otherwise (a few ulps: the winner moves only on a floating-point near-tie). Every CUDA chain
// kernel picks the mode and rounds alike, so the single-block and split kernels stay equal bit for bit.
// Races with draft probabilities keep mode 0: max(p - q, 0) at p == q must stay exactly 0.
template <typename Q>
__device__ __forceinline__ int race_mode(const Q* q_row, const RowStats& r, float temperature) {
  return q_row == nullptr && r.total > 0.f && r.m < FLT_MAX && temperature == 1.f ? 1 : 0;
}

struct RaceScale {
  float z_tau;      // kept_floor(tau)
  float inv_total;  // 1 / S, rounded to nearest
};

__device__ __forceinline__ RaceScale race_scale(const RowStats& r) {
  return RaceScale{kept_floor(r.tau), r.total > 0.f ? __frcp_rn(r.total) : 0.f};
}

// The fast mode's e = exp(z) of a kept entry (0 off the kept set; NaN for a NaN logit): p = e * inv_total.
template <int kMode, bool kTau>
__device__ __forceinline__ float race_exp(float x, const RowStats& r, float, RaceScale f) {
  static_assert(kMode == 1, "the checked mode takes stats_prob");
  const float z = x - r.m;
  if constexpr (kTau) {
    if (!(z >= f.z_tau)) return 0.f;
  }
  return sum_exp_f(z);
}

// The fast loops' skip test before race_entry's own (which computes u and tests u bar <= (bar - mass) c): an
// entry with e <= cut (1 - u), cut = (bar (1 - 2^-15)) S (race_cut: after each warp_raise_bar), scores below
// bar, so it cannot win. Its mass is at most p = fl(e fl(1 / S)) <= bar (1 - 2^-15) (1 - u) (1 + 2^-24)^5, and
// its score fl(mass / E) with E = fl(-logf(u)) >= -ln(u) (1 - 2^-22) >= (1 - u) (1 - 2^-22) is below
// bar (1 - 2^-15) (1 + 2^-24)^6 / (1 - 2^-22) < bar. cut (1 - u) as fma(-cut, u, cut): one rounding of the same
// exact value (u from the bits, philox.h bits_to_uniform_from_mantissa): 4 instructions an entry against
// race_entry's 11. With bar <= 1e-30 (the race still empty, or a residual race not yet positive: its fallback
// race runs) cut is -1, and no entry (NaN e neither) is skipped. A bar raised later in the group leaves cut
// lower: it skips less, still soundly.
__device__ __forceinline__ float race_cut(float bar, float total) {
  return bar > 1e-30f ? bar * 0.999969482421875f * total : -1.f;
}

// kTau false (no filter tensors: tau 0 keeps every entry) leaves the kept test out: only a NaN z fails it,
// whose p is then NaN, no mass all the same.
template <int kMode, bool kTau>
__device__ __forceinline__ float race_prob(float x, const RowStats& r, float temperature, RaceScale f) {
  if constexpr (kMode == 0) {
    return stats_prob(logit_value(x), r, temperature);
  } else {
    return race_exp<kMode, kTau>(x, r, temperature, f) * f.inv_total;
  }
}

// One entry i (probability p, random bits `bits`) of the exponential race over p (bonus: race.fallback) or,
// `residual`, over max(p - q, 0) (q_row null: one-hot at `draft`) with its fallback over p
// (vocab_split.h ResidualRace: p is raced only while no residual score is positive). kKind: kRaceAny as
// `residual` and q_row say; the fast modes' loops know theirs (kRaceBonus, kRaceOneHot: q_row null).
constexpr int kRaceBonus = 0, kRaceOneHot = 1, kRaceAny = 2;

template <int kKind, typename Q>
__device__ __forceinline__ void race_entry(ResidualRace& race, float p, int64_t i, uint32_t bits, const Q* q_row,
                                           int64_t draft, bool residual) {
  if (kKind == kRaceBonus || (kKind == kRaceAny && !residual)) {
    bonus_race_update(race, p, bits, i);
  } else {
    const float q = kKind == kRaceAny && q_row != nullptr ? to_float(q_row[i]) : (i == draft ? 1.f : 0.f);
    residual_race_update(race, p, q, bits, i);
  }
}

// After a group of race_entry: every lane skips against the warp's best so far (the residual's, or
// the bonus race's; a residual race's fallback keeps its own bar).
// (Two calls, not one on a selected member: a reference chosen at run time would put the race in
// local memory.)
template <int kKind>
__device__ __forceinline__ void race_share_bar(ResidualRace& race, bool residual) {
  if (kKind == kRaceOneHot || (kKind == kRaceAny && residual)) cuda::warp_raise_bar(race.residual_bar);
  else cuda::warp_raise_bar(race.fallback_bar);
}

// f(mode, kind) with a race's mode (race_mode) and kind as constants: the checked mode runs one loop for
// every kind (kRaceAny); each fast mode one loop for the bonus race and one for a one-hot residual.
template <typename F>
__device__ __forceinline__ void with_race_mode(int mode, bool residual, F&& f) {
  using Any = std::integral_constant<int, kRaceAny>;
  using Bonus = std::integral_constant<int, kRaceBonus>;
  using OneHot = std::integral_constant<int, kRaceOneHot>;
  if (mode == 1) {
    if (residual) f(std::integral_constant<int, 1>{}, OneHot{});
    else f(std::integral_constant<int, 1>{}, Bonus{});
  } else {
    f(std::integral_constant<int, 0>{}, Any{});
  }
}

// A thread's part of a race over the row's groups of 4 entries g = first, first + blockDim.x, ... < end
// (entries past the vocabulary left out), in the mode race_mode picks.
template <bool kTau, typename T, typename Q>
__device__ __forceinline__ ResidualRace race_groups(const T* row, const Q* q_row, int64_t draft, bool residual,
                                                    int64_t vocab, int64_t first, int64_t end, const RowStats& r,
                                                    float temperature, uint64_t seed, uint64_t offset,
                                                    uint32_t position) {
  const uint32_t purpose = residual ? kPurposeResidual : kPurposeBonus;
  ResidualRace race = residual_race_init();
  const RaceScale f = race_scale(r);
  with_race_mode(race_mode(q_row, r, temperature), residual, [&](auto mode, auto kind) {
    for (int64_t g = first; g < end; g += blockDim.x) {
      const Philox4 bits = philox_block(seed, offset, position, purpose, static_cast<uint32_t>(g));
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t i = 4 * g + j;
        if (i >= vocab) break;
        const float p = race_prob<decltype(mode)::value, kTau>(to_float(row[i]), r, temperature, f);
        race_entry<decltype(kind)::value>(race, p, i, bits.x[j], q_row, draft, residual);
      }
      race_share_bar<decltype(kind)::value>(race, residual);
    }
  });
  return race;
}

// Exponential race over p (bonus) or max(p - q, 0) (residual; q_row null: one-hot at
// `draft`), falling back to p when the residual is empty.
template <typename T, typename Q>
__device__ int64_t row_race(const T* row, const Q* q_row, int64_t draft, bool residual, int64_t vocab,
                            const RowStats& r, float temperature, uint64_t seed, uint64_t offset, uint32_t position,
                            Shared& sh) {
  const ResidualRace race = race_groups<true>(row, q_row, draft, residual, vocab, threadIdx.x, (vocab + 3) / 4, r,
                                              temperature, seed, offset, position);
  const ArgMax p_win = cuda::block_argmax(race.fallback, sh.argmax);
  if (!residual) return p_win.index;
  const ArgMax r_win = cuda::block_argmax(race.residual, sh.argmax);
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

// ---- Split chain kernel: every batch where the device holds it (with filters: kFiltered) ----
// Grid (B, parts), kSplitThreads threads (logits_split.h). Every block of a request runs the same
// chain walk as rejection_sample_logits_kernel; each vocab-wide step is a pass in which every
// block sweeps its share of the row, writes a partial into the workspace, meets the request's
// other blocks at a barrier (request arrival counter; the launch is cooperative, so they are
// resident together) and merges all partials itself in the same order: every block sees the same
// statistics and takes the same branches. Block 0 writes the outputs.
struct SplitShared {
  ArgMax argmax[32];
  ArgMax a, b;
  float sum;
  int flag;
};

__device__ __forceinline__ float split_warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(kFullMask, v, o);
  return v;
}

// Block-wide argmax with `pad` for the lanes past the last warp; every thread gets the result.
__device__ __forceinline__ ArgMax split_block_argmax(ArgMax a, ArgMax pad, SplitShared& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  a = cuda::warp_argmax(a);
  if (lane == 0) sh.argmax[warp] = a;
  __syncthreads();
  if (warp == 0) {
    a = cuda::warp_argmax(lane < static_cast<int>(blockDim.x >> 5) ? sh.argmax[lane] : pad);
    if (lane == 0) sh.argmax[0] = a;
  }
  __syncthreads();
  const ArgMax result = sh.argmax[0];
  __syncthreads();
  return result;
}

struct SplitCtx {
  LogitsSplit l;
  int64_t part;
  char* request_ws;
  unsigned* counter;
  unsigned passes;
  char* hist_ws;       // rows with filters: the request's kSplitHistBuffers histograms (logits_split.h)
  unsigned histograms; // histograms taken so far in the walk
};

__device__ __forceinline__ float* split_next_buffer(SplitCtx& c) {
  ++c.passes;
  return reinterpret_cast<float*>(c.request_ws + (c.passes & 1) * split_buffer_bytes(c.l.parts));
}

// Writes this block's partial (a, b: already block-wide), meets the other blocks, and merges
// every part's partial in part order (pads: the empty argmaxes). Returns through sh.a / sh.b.
__device__ __forceinline__ void split_exchange(SplitCtx& c, float* buf, ArgMax a, ArgMax b, ArgMax pad, SplitShared& sh) {
  SplitPartial* slots = reinterpret_cast<SplitPartial*>(buf + 32);
  if (threadIdx.x == 0) slots[c.part] = SplitPartial{a.score, b.score, a.index, b.index};
  cuda::request_barrier(c.counter, c.l.parts, c.passes);
  if (threadIdx.x < 32) {
    ArgMax ma = pad, mb = pad;
    for (int q = threadIdx.x; q < c.l.parts; q += 32) {
      const SplitPartial* s = slots + q;
      ma = argmax_merge(ma, ArgMax{__ldcg(&s->score_a), static_cast<int64_t>(__ldcg(
                                                            reinterpret_cast<const long long*>(&s->index_a)))});
      mb = argmax_merge(mb, ArgMax{__ldcg(&s->score_b), static_cast<int64_t>(__ldcg(
                                                            reinterpret_cast<const long long*>(&s->index_b)))});
    }
    ma = cuda::warp_argmax(ma);
    mb = cuda::warp_argmax(mb);
    if (threadIdx.x == 0) {
      sh.a = ma;
      sh.b = mb;
    }
  }
  __syncthreads();
}

// Pass: max and first argmax of the row's logits (rejection_sample_logits_kernel's row_stats step 1).
// A thread visits its entries in increasing index order, so a tie never replaces its best (one
// comparison per entry); a thread whose entries are all -inf (or NaN) reports its first one, as the
// single-block kernel's argmax_update does from logit_argmax_init. kAligned: 8-byte (half types) or
// 16-byte (fp32) loads of 4 entries.
template <bool kAligned, typename T>
__device__ __forceinline__ ArgMax split_max_sweep(const T* __restrict__ row, int64_t V, GroupRange range) {
  const int64_t stride = blockDim.x, full = V / 4;  // groups [0, full) lie wholly inside the row
  const int64_t end = range.end < full ? range.end : full;
  float best_x = -INFINITY;
  int64_t best_i = -1;
  int64_t g = range.begin + threadIdx.x;
  constexpr int U = 4;  // groups in flight per thread
  for (; g + (U - 1) * stride < end; g += U * stride) {
    float v[U][4];
#pragma unroll
    for (int k = 0; k < U; ++k) cuda::load4_full<kAligned>(row, 4 * (g + k * stride), v[k]);
#pragma unroll
    for (int k = 0; k < U; ++k)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float x = logit_value(v[k][j]);
        if (x > best_x) {
          best_x = x;
          best_i = 4 * (g + k * stride) + j;
        }
      }
  }
  for (; g < range.end; g += stride)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (4 * g + j >= V) break;
      const float x = load_logit(row, 4 * g + j);
      if (x > best_x) {
        best_x = x;
        best_i = 4 * g + j;
      }
    }
  if (best_i >= 0) return ArgMax{best_x, best_i};
  if (range.begin + threadIdx.x < range.end) return ArgMax{-INFINITY, 4 * (range.begin + threadIdx.x)};
  return logit_argmax_init();
}

template <typename T>
__device__ __forceinline__ ArgMax split_max(const T* row, int64_t V, SplitCtx& c, SplitShared& sh) {
  float* buf = split_next_buffer(c);
  const GroupRange range = vocab_part(V, c.l.parts, c.part);
  ArgMax best = cuda::aligned4(row) ? split_max_sweep<true>(row, V, range) : split_max_sweep<false>(row, V, range);
  best = split_block_argmax(best, logit_argmax_init(), sh);
  split_exchange(c, buf, best, logit_argmax_init(), logit_argmax_init(), sh);
  return sh.a;
}

// ---- Resident rows (logits_split.h split_share_*): each block copies its share of a row from HBM
// into shared memory once, in the max pass, and runs the kept mass and the race over it there. The
// launcher picks this variant (kResident) where the share fits beside the blocks the batch needs
// resident (dynamic shared memory: split_share_bytes); else every pass reads the row from HBM.

// 16 bytes global -> shared (a shared-window address) without a register round trip (sm_80+); many
// in flight per thread, one wait for all.
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src) {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
#endif
}
__device__ __forceinline__ void cp_async_wait_all() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}

// The row entry at share position e (a power-of-two slice: shift = log2(slice)).
__device__ __forceinline__ int64_t share_entry(int e, int shift, int64_t vthreads, int64_t base) {
  return static_cast<int64_t>(e >> shift) * vthreads + base + (e & ((1 << shift) - 1));
}

// The end of a race pass: this block's winners merged over the request's blocks; the residual's,
// unless the residual had no mass (then p's).
__device__ __forceinline__ int64_t split_race_winner(ArgMax best_p, ArgMax best_r, bool residual, SplitCtx& c,
                                                     float* buf, SplitShared& sh) {
  best_p = split_block_argmax(best_p, argmax_init(), sh);
  best_r = split_block_argmax(best_r, argmax_init(), sh);
  split_exchange(c, buf, best_p, best_r, argmax_init(), sh);
  const ArgMax p_win = sh.a, r_win = sh.b;
  __syncthreads();
  if (!residual) return p_win.index;
  return r_win.score > 0.f ? r_win.index : p_win.index;
}

// The largest of the 8 16-bit entries of a 16-byte piece, as float: packed max instructions (HMNMX2 on
// sm_80+), which return the other operand where one is NaN, so NaN entries never win (as logit_value
// makes them -inf) and a piece of NaN only gives NaN (logit_value: -inf); +inf stays +inf. The pointer
// argument only selects the type.
__device__ __forceinline__ float piece_max(uint4 v, const __nv_bfloat16*) {
  const __nv_bfloat162* p = reinterpret_cast<const __nv_bfloat162*>(&v);
  const __nv_bfloat162 m = __hmax2(__hmax2(p[0], p[1]), __hmax2(p[2], p[3]));
  return fmaxf(__low2float(m), __high2float(m));
}
__device__ __forceinline__ float piece_max(uint4 v, const __half*) {
  const __half2* p = reinterpret_cast<const __half2*>(&v);
  const __half2 m = __hmax2(__hmax2(p[0], p[1]), __hmax2(p[2], p[3]));
  return fmaxf(__low2float(m), __high2float(m));
}

// The largest entry of a 16-byte piece folded into a running pair of maxima: 4 packed max instructions
// for 8 entries (NaN never wins, as in piece_max).
__device__ __forceinline__ void fold_piece_max(__nv_bfloat162& acc, uint4 v, const __nv_bfloat16*) {
  const __nv_bfloat162* p = reinterpret_cast<const __nv_bfloat162*>(&v);
  acc = __hmax2(acc, __hmax2(__hmax2(p[0], p[1]), __hmax2(p[2], p[3])));
}
__device__ __forceinline__ void fold_piece_max(__half2& acc, uint4 v, const __half*) {
  const __half2* p = reinterpret_cast<const __half2*>(&v);
  acc = __hmax2(acc, __hmax2(__hmax2(p[0], p[1]), __hmax2(p[2], p[3])));
}
template <typename T> struct Pair;
template <> struct Pair<__nv_bfloat16> {
  using type = __nv_bfloat162;
  __device__ static type neg_inf() { return type{__ushort_as_bfloat16(0xff80u), __ushort_as_bfloat16(0xff80u)}; }
};
template <> struct Pair<__half> {
  using type = __half2;
  __device__ static type neg_inf() { return type{__ushort_as_half(0xfc00u), __ushort_as_half(0xfc00u)}; }
};

// Pass: copy the share into `share` and take its max and first argmax. A thread visits its
// positions, and so its entries, in increasing order, so a tie never replaces its best; a thread
// whose entries are all -inf (or NaN) reports its first one, as split_max_sweep.
// kIndex false (sampled rows, which use the max alone; greedy rows need the argmax): the max of 16-bit
// shares folds into one pair of packed maxima (fold_piece_max, no comparison or index per piece) and the
// index returned is logit_argmax_init's.
template <bool kIndex, typename T>
__device__ __forceinline__ ArgMax split_max_share(const T* __restrict__ row, int64_t V, T* share, SplitCtx& c,
                                                  SplitShared& sh) {
  float* buf = split_next_buffer(c);
  const int slice = static_cast<int>(split_share_slice(c.l));
  const int shift = __ffs(slice) - 1;
  const int entries = static_cast<int>(split_share_entries(c.l, V));
  const int64_t vthreads = c.l.vthreads, base = c.part * slice;
  const int stride = blockDim.x;
  float best_x = -INFINITY;
  int best_e = -1;
  int first_e = -1;  // the thread's first position holding an entry of the row
  bool copied = false;
#if __CUDA_ARCH__ >= 800
  // 16-byte pieces of E entries (whole pieces of one slice: E divides slice), U per thread in flight.
  // Piece q lies in chunk q / P (P = slice / E pieces a chunk); a stride that is a multiple of P
  // (threads >= slice / 4 whenever parts > 1) moves a thread's piece on by stride / P chunks: its
  // entries by `step`, its position by stride * E. Positions past the share hold entries past the
  // row (chunk >= split_share_chunks), so the row's end bounds both; the one piece the end cuts
  // (V % E != 0) is copied entry by entry.
  constexpr int E = 16 / sizeof(T);
  if ((reinterpret_cast<uintptr_t>(row) & 15) == 0 && stride % (slice / E) == 0) {
    constexpr int U = 16;
    const int64_t step = static_cast<int64_t>(stride / (slice / E)) * vthreads;
    const int64_t last = V - E;  // a piece starting at or before it lies wholly in the row
    for (int q0 = threadIdx.x;; q0 += U * stride) {
      const int64_t i0 = share_entry(q0 * E, shift, vthreads, base);
      if (i0 >= V) break;
      const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(share + q0 * E));
      const T* const src = row + i0;
#pragma unroll
      for (int k = 0; k < U; ++k)
        if (i0 + k * step <= last) cp_async16(dst + k * stride * 16, src + k * step);
    }
    const int cut = static_cast<int>(V % E);  // entries of the piece the row's end cuts, if this block's
    if (cut != 0) {
      const int64_t i = V - cut;
      if ((i % vthreads) / slice == c.part && static_cast<int>(threadIdx.x) < cut)
        share[(i / vthreads) * slice + i % slice + threadIdx.x] = row[i + threadIdx.x];
    }
    cp_async_wait_all();
    __syncthreads();  // the pieces, read back below by the threads that copied them, and the cut one
    int64_t i0 = share_entry(threadIdx.x * E, shift, vthreads, base);
    if (i0 < V) first_e = threadIdx.x * E;
    // Entries increase with the position; whole pieces first (no per-entry bound), then the cut one.
    int e0 = threadIdx.x * E;
    if constexpr (E == 8 && !kIndex) {
      // Whole pieces: (last - i0) / step + 1 of them from i0 (none when i0 > last).
      const int pieces = i0 <= last ? static_cast<int>((last - i0) / step) + 1 : 0;
      typename Pair<T>::type acc = Pair<T>::neg_inf();
      const T* p0 = share + e0;
#pragma unroll 4
      for (int q = 0; q < pieces; ++q) fold_piece_max(acc, *reinterpret_cast<const uint4*>(p0 + q * stride * E), share);
      e0 += pieces * stride * E;
      i0 += pieces * step;
      best_x = logit_value(fmaxf(to_float(acc.x), to_float(acc.y)));
    } else if constexpr (E == 8) {
      // 16-bit entries: a piece's max in three packed max instructions (piece_max), one comparison per
      // piece; the first entry equal to the thread's max is found afterwards in the one piece that holds it.
      // A later piece only replaces an equal max if it is larger, so that piece is the first holding it.
      int best_piece = -1;
      for (; i0 <= last; e0 += stride * E, i0 += step) {
        const float x = logit_value(piece_max(*reinterpret_cast<const uint4*>(share + e0), share));
        if (x > best_x) {
          best_x = x;
          best_piece = e0;
        }
      }
      if (best_piece >= 0) {
        const uint4 v = *reinterpret_cast<const uint4*>(share + best_piece);
        const T* h = reinterpret_cast<const T*>(&v);
        best_e = best_piece + E - 1;  // not reached: some entry of the piece has the piece's max
#pragma unroll
        for (int j = E - 1; j >= 0; --j)
          if (logit_value(to_float(h[j])) == best_x) best_e = best_piece + j;
      }
    } else {
      for (; i0 <= last; e0 += stride * E, i0 += step) {
        const uint4 v = *reinterpret_cast<const uint4*>(share + e0);
        const T* h = reinterpret_cast<const T*>(&v);
#pragma unroll
        for (int j = 0; j < E; ++j) {
          const float x = logit_value(to_float(h[j]));
          if (x > best_x) {
            best_x = x;
            best_e = e0 + j;
          }
        }
      }
    }
    for (int j = 0; i0 + j < V; ++j) {  // at most the cut piece: V - i0 < E entries
      const float x = logit_value(to_float(share[e0 + j]));
      if (x > best_x) {
        best_x = x;
        best_e = e0 + j;
      }
    }
    copied = true;
  }
#endif
  if (!copied) {
    // Unaligned rows (or sm < 80): one entry at a time through registers.
    if (share_entry(threadIdx.x, shift, vthreads, base) < V) first_e = threadIdx.x;
    for (int e = threadIdx.x; e < entries; e += stride) {
      const int64_t i = share_entry(e, shift, vthreads, base);
      if (i >= V) break;  // entries increase with the position
      const T v = row[i];
      share[e] = v;
      const float x = logit_value(to_float(v));
      if (x > best_x) {
        best_x = x;
        best_e = e;
      }
    }
  }
  ArgMax best = logit_argmax_init();
  if constexpr (!kIndex) best.score = best_x;
  else if (best_e >= 0) best = ArgMax{best_x, share_entry(best_e, shift, vthreads, base)};
  else if (first_e >= 0) best = ArgMax{-INFINITY, share_entry(first_e, shift, vthreads, base)};
  best = split_block_argmax(best, logit_argmax_init(), sh);  // its barriers publish the share
  split_exchange(c, buf, best, logit_argmax_init(), logit_argmax_init(), sh);
  return sh.a;
}

// Pass: split_sum_sweep over the share: virtual thread part * slice + o reads positions o,
// slice + o, ... (its entries o + part * slice, + vthreads, ...) in the same order and grouping.
// kTau: only entries with key >= tau count (rows with filters), tested as z >= z_tau (z_tau: split_sum;
// z is no NaN, m being finite: the same entries, one float compare); a skipped entry adds 0, which leaves
// the sum as the single-block kernel's skip does (every term is >= 0).
template <bool kUnitT, bool kTau>
__device__ __forceinline__ float kept_exp(float x, float m, float temperature, float z_tau) {
  const float z = kUnitT ? x - m : scaled_logit(x, m, temperature);
  if constexpr (kTau) return z >= z_tau ? sum_exp_f(z) : 0.f;
  return sum_exp_f(z);
}

// One virtual thread's sum of kept_exp over src[0], src[stride], ..., src[(n - 1) stride] in turn, 16 loads in
// flight (kStride: the stride as a constant, loads at immediate offsets; 0: `stride` at run time). The first
// try leaves logit_value out (its NaN test and +inf clamp: 3 instructions of the 6 an entry takes). The
// terms it changes are those of NaN logits (z NaN: the sum turns NaN; kept or not, never a finite term) and
// +inf ones (z = +inf, m being FLT_MAX: the sum turns +inf); every other logit is its own logit_value
// (-inf included). So a finite sum is the checked sum bit for bit, and a thread whose sum is not finite
// (its share holds a NaN or +inf logit) sums again with logit_value: the checked sum is always finite (its
// terms lie in [0, 1]).
template <int kStride, bool kUnitT, bool kTau, typename T>
__device__ __forceinline__ float vthread_sum(const T* __restrict__ src, int64_t stride_rt, int n, float m,
                                             float temperature, float z_tau) {
  constexpr int U = 16;
  const int64_t stride = kStride ? kStride : stride_rt;
  float s = 0.f;
  int j = 0;
  for (; j + (U - 1) < n; j += U) {
    float x[U];
#pragma unroll
    for (int k = 0; k < U; ++k) x[k] = to_float(src[(j + k) * stride]);
#pragma unroll
    for (int k = 0; k < U; ++k) s += kept_exp<kUnitT, kTau>(x[k], m, temperature, z_tau);
  }
  for (; j < n; ++j) s += kept_exp<kUnitT, kTau>(to_float(src[j * stride]), m, temperature, z_tau);
  if (s <= FLT_MAX) return s;
  // The checked sum, in the same order (rare: no unrolling).
  s = 0.f;
#pragma unroll 1
  for (j = 0; j < n; ++j) s += kept_exp<kUnitT, kTau>(logit_value(to_float(src[j * stride])), m, temperature, z_tau);
  return s;
}

// kSlice: the share's slice as a constant (split_sum picks it where slice == kSplitThreads), else 0.
template <int kVThreads, int kSlice, bool kUnitT, bool kTau, typename T>
__device__ __forceinline__ void split_sum_share_sweep(const T* __restrict__ share, int64_t V, float m,
                                                      float temperature, float z_tau, const SplitCtx& c,
                                                      float* vsum) {
  const int64_t vthreads = kVThreads ? kVThreads : c.l.vthreads;
  const int slice = kSlice ? kSlice : static_cast<int>(split_share_slice(c.l));
  for (int h = 0; h < c.l.per_thread; ++h) {
    const int o = h * c.l.threads + threadIdx.x;
    const int64_t first = c.part * slice + o;  // the virtual thread's first entry
    const int n = first < V ? static_cast<int>((V - first + vthreads - 1) / vthreads) : 0;
    float s = vthread_sum<kSlice, kUnitT, kTau>(share + o, slice, n, m, temperature, z_tau);
    s = split_warp_sum(s);
    if ((threadIdx.x & 31) == 0) vsum[first >> 5] = s;
  }
}

// Pass: split_race over the share's groups of 4 (whole groups: 4 divides slice). kFastBonus: a bonus race
// whose race_mode is 1 (the caller checked: temperature 1, a row with mass and no +inf logit), no other loop.
template <bool kTau, bool kFastBonus = false, typename T, typename Q>
__device__ __forceinline__ int64_t split_race_share(const T* share, const Q* q_row, int64_t draft, bool residual,
                                                    int64_t V, const RowStats& r, float temperature, uint64_t seed,
                                                    uint64_t offset, uint32_t position, SplitCtx& c,
                                                    SplitShared& sh) {
  float* buf = split_next_buffer(c);
  const int slice = static_cast<int>(split_share_slice(c.l));
  const int shift = __ffs(slice) - 1;
  const int groups = static_cast<int>(split_share_entries(c.l, V) / 4);
  const int64_t vthreads = c.l.vthreads, base = c.part * slice;
  const uint32_t purpose = residual ? kPurposeResidual : kPurposeBonus;
  ResidualRace race = residual_race_init();
  const RaceScale f = race_scale(r);
  const auto run = [&](auto mode, auto kind) {
    // The groups wholly inside the row (a prefix of the thread's: entries increase with the position), then
    // the one the row's end cuts (V % 4 != 0), entry by entry, outside the loop.
    constexpr int kMode = decltype(mode)::value, kKind = decltype(kind)::value;
    float cut = -1.f;  // race_cut of the race's bar (fast modes)
    const PhiloxKeys keys = philox_block_keys(seed);  // held across the loop (philox.h)
    const auto group = [&](int q, int64_t i0, int n) {
      float x[4];
      cuda::load4_full<true>(share, 4 * q, x);
      const Philox4 bits = philox_block_keyed(keys, offset, position, purpose, static_cast<uint32_t>(i0 >> 2));
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (j >= n) break;
        if constexpr (kMode != 0) {
          const float e = race_exp<kMode, kTau>(x[j], r, temperature, f);
          if (e <= fmaf(-cut, bits_to_uniform_from_mantissa(bits.x[j]), cut)) continue;  // cut (1 - u)
          race_entry<kKind>(race, e * f.inv_total, i0 + j, bits.x[j], q_row, draft, residual);
        } else {
          race_entry<kKind>(race, race_prob<0, kTau>(x[j], r, temperature, f), i0 + j, bits.x[j], q_row, draft,
                            residual);
        }
      }
    };
    int q = threadIdx.x;
    // 4 blockDim.x positions are whole slices (both powers of two, slice = vthreads / parts <= 512 = 4 x 128 with
    // parts >= 2), so a thread's next group lies a fixed number of entries further on: i0 advances by a constant
    // instead of share_entry's shifts and multiply.
    const int64_t advance = static_cast<int64_t>(4 * static_cast<int>(blockDim.x) / slice) * vthreads;
    for (int64_t i0 = share_entry(4 * q, shift, vthreads, base); q < groups; q += blockDim.x) {
      if (i0 + 4 > V) break;
      group(q, i0, 4);
      i0 += advance;
      race_share_bar<kKind>(race, residual);
      if constexpr (kMode != 0) cut = race_cut(kKind == kRaceOneHot ? race.residual_bar : race.fallback_bar, r.total);
    }
    if (q < groups) {
      const int64_t i0 = share_entry(4 * q, shift, vthreads, base);
      if (i0 < V) group(q, i0, static_cast<int>(V - i0));
    }
  };
  if constexpr (kFastBonus) {
    run(std::integral_constant<int, 1>{}, std::integral_constant<int, kRaceBonus>{});
  } else {
    with_race_mode(race_mode(q_row, r, temperature), residual, run);
  }
  return split_race_winner(race.fallback, race.residual, residual, c, buf, sh);
}

// Pass: sum of exp((x - m) / T) over the row, rounded as the single-block kernel's block_sum
// (virtual threads, logits_split.h). T = 1 gives the greedy logprob's sum of exp(x - m) bit for
// bit ((x - m) / 1 is exact).
// kUnitT: temperature 1, where (x - m) / 1 is x - m exactly: the division is left out.
template <int kVThreads, bool kUnitT, bool kTau, typename T>
__device__ __forceinline__ void split_sum_sweep(const T* __restrict__ row, int64_t V, float m, float temperature,
                                                float z_tau, const SplitCtx& c, float* vsum) {
  const int64_t vthreads = kVThreads ? kVThreads : c.l.vthreads;
  for (int h = 0; h < c.l.per_thread; ++h) {
    const int64_t first = split_first_vthread(c.l, c.part, h);
    const int64_t i = first + threadIdx.x;
    const int n = i < V ? static_cast<int>((V - i + vthreads - 1) / vthreads) : 0;
    float s = vthread_sum<kVThreads, kUnitT, kTau>(row + i, vthreads, n, m, temperature, z_tau);
    s = split_warp_sum(s);
    if ((threadIdx.x & 31) == 0) vsum[(first + threadIdx.x) >> 5] = s;
  }
}

// kShare: `src` is the block's share in shared memory (split_sum_share_sweep), else the row.
// kTau: the kept mass of a row with filters (entries with key >= tau), else every entry's. The sum over every
// entry of a row with filters takes kTau false: the same terms in the same order as kTau with tau 0 (whose
// kept test only turns a NaN z's term, which the sum then sums again checked, into 0), without the test.
template <bool kShare, bool kTau = false, typename T>
__device__ __forceinline__ float split_sum(const T* src, int64_t V, float m, float temperature, SplitCtx& c,
                                           SplitShared& sh, uint32_t tau = 0u) {
  float* buf = split_next_buffer(c);
  const float z_tau = kept_floor(tau);  // order_key(z) >= tau: z >= z_tau
  const auto sweep = [&](auto unit_t) {
    constexpr bool kU = decltype(unit_t)::value, kT = kTau;
    if constexpr (kShare) {
      // The large vocabularies' layout (vthreads 1024, one virtual thread per real thread) with the slice
      // as a constant: the loads at immediate offsets.
      if (c.l.vthreads == kMaxThreads && split_share_slice(c.l) == kSplitThreads)
        split_sum_share_sweep<kMaxThreads, kSplitThreads, kU, kT>(src, V, m, temperature, z_tau, c, buf);
      else
        split_sum_share_sweep<0, 0, kU, kT>(src, V, m, temperature, z_tau, c, buf);
    } else {
      if (c.l.vthreads == kMaxThreads) split_sum_sweep<kMaxThreads, kU, kT>(src, V, m, temperature, z_tau, c, buf);
      else split_sum_sweep<0, kU, kT>(src, V, m, temperature, z_tau, c, buf);
    }
  };
  if (temperature == 1.f) sweep(std::true_type{});
  else sweep(std::false_type{});
  split_exchange(c, buf, argmax_init(), argmax_init(), argmax_init(), sh);
  if (threadIdx.x < 32) {
    // The single-block kernel's last step: the shuffle tree over the warp sums.
    const float v = threadIdx.x < static_cast<unsigned>(c.l.vthreads >> 5) ? __ldcg(buf + threadIdx.x) : 0.f;
    const float total = split_warp_sum(v);
    if (threadIdx.x == 0) sh.sum = total;
  }
  __syncthreads();
  const float total = sh.sum;
  __syncthreads();
  return total;
}

// Pass: row_race over this block's groups; the residual and p races merge separately.
template <bool kTau, typename T, typename Q>
__device__ __forceinline__ int64_t split_race(const T* row, const Q* q_row, int64_t draft, bool residual, int64_t V,
                              const RowStats& r, float temperature, uint64_t seed, uint64_t offset, uint32_t position,
                              SplitCtx& c, SplitShared& sh) {
  float* buf = split_next_buffer(c);
  const GroupRange range = vocab_part(V, c.l.parts, c.part);
  const ResidualRace race = race_groups<kTau>(row, q_row, draft, residual, V, range.begin + threadIdx.x, range.end,
                                              r, temperature, seed, offset, position);
  return split_race_winner(race.fallback, race.residual, residual, c, buf, sh);
}

// ---- Rows with filters: radix_select (above) with each pass's histogram split over the request's
// blocks. A block histograms its part of the row (its share in shared memory, else its vocab_part
// groups) in shared memory, adds the non-empty bins into the request's histogram of the pass (global
// atomics: logits_split.h split_hist_offset), meets the other blocks, reads the whole histogram back
// and picks the digit as the single-block kernel's thread 0 does: every block picks the same.
// Masses are fixed point (logits_split.h split_fixed_mass): integer additions in any order give one
// result, so the histograms, and with them the threshold, are the same on every run, and a 32-bit
// native atomic adds the counts.
struct SplitRadix {
  unsigned counts[kRadixBins];
  unsigned long long mass[kRadixBins];
  uint32_t prefix;
  int64_t remaining;
  unsigned long long above;
  unsigned long long target;
};

// f(x) for every entry x (logit_value applied; kRaw: as read, widened to float) of this block's part of the
// row: its share (kShare: 16-byte pieces of E entries, whole pieces of one slice and so consecutive entries
// of the row), else its vocab_part groups of the row, one entry per thread in turn.
template <bool kShare, bool kRaw = false, typename T, typename F>
__device__ __forceinline__ void split_for_each(const T* __restrict__ src, int64_t V, const SplitCtx& c, F&& f) {
  const auto value = [](T h) { return kRaw ? to_float(h) : logit_value(to_float(h)); };
  if constexpr (kShare) {
    constexpr int E = 16 / sizeof(T);
    const int slice = static_cast<int>(split_share_slice(c.l));
    const int shift = __ffs(slice) - 1;
    const int pieces = static_cast<int>(split_share_entries(c.l, V) / E);
    const int64_t vthreads = c.l.vthreads, base = c.part * slice;
    for (int q = threadIdx.x; q < pieces; q += blockDim.x) {
      const int64_t i0 = share_entry(q * E, shift, vthreads, base);
      if (i0 >= V) break;  // entries increase with the position
      if (i0 + E <= V) {
        const uint4 v = *reinterpret_cast<const uint4*>(src + q * E);
        const T* h = reinterpret_cast<const T*>(&v);
#pragma unroll
        for (int j = 0; j < E; ++j) f(value(h[j]));
      } else {
        for (int j = 0; i0 + j < V; ++j) f(value(src[q * E + j]));  // the piece the row's end cuts
      }
    }
  } else {
    const GroupRange range = vocab_part(V, c.l.parts, c.part);
    const int64_t end = 4 * range.end < V ? 4 * range.end : V;
    for (int64_t i = 4 * range.begin + threadIdx.x; i < end; i += blockDim.x) f(value(src[i]));
  }
}

// The 64-bit masses of a block's histogram while it is being added up: rs.mass's 2 KB as 256 low words, then
// 256 high words (split_add_u64); split_join_u64(lo[d], hi[d]) is bin d's mass.
__device__ __forceinline__ unsigned* split_mass_lo(SplitRadix& rs) { return reinterpret_cast<unsigned*>(rs.mass); }
__device__ __forceinline__ unsigned* split_mass_hi(SplitRadix& rs) { return split_mass_lo(rs) + kRadixBins; }

// One pass's histogram of this block's candidates (z >= z_floor, sharing the digits chosen so far).
// A thread adds up runs of consecutive candidates in one bin in registers and adds a run with one
// atomic per histogram: rows concentrate in a few bins (most of all in pass 0). Masses go in as two
// native 32-bit adds (split_add_u64), not a 64-bit add, which in shared memory is a compare-and-swap loop
// (ATOMS.CAST.SPIN.64 in the SASS) that lanes hitting one bin go through one at a time: the filtered
// kernel measured 715 us per call on an H200 with it (B=64 K=4 V=128256, top-p 0.9).
template <bool kByMass, bool kShare, bool kUnitT, typename T>
__device__ __forceinline__ void split_radix_sweep(const T* src, int64_t V, float m, float temperature,
                                                  float z_floor, uint32_t prefix, int pass, const SplitCtx& c,
                                                  SplitRadix& rs) {
  uint32_t run_d = 0;
  unsigned run_n = 0;
  unsigned long long run_m = 0;
  unsigned* const lo = split_mass_lo(rs);
  unsigned* const hi = split_mass_hi(rs);
  const auto flush = [&]() {
    if (run_n == 0) return;
    atomicAdd(&rs.counts[run_d], run_n);
    if (kByMass) split_add_u64(lo + run_d, hi + run_d, run_m, [](unsigned* w, unsigned x) { return atomicAdd(w, x); });
  };
  split_for_each<kShare, true>(src, V, c, [&](float l) {
    // the select runs on the logits' keys (radix_threshold: z's), made from the bits as read
    const uint32_t key = radix_key_raw<std::is_same<T, float>::value>(l);
    if (!radix_match(key, prefix, pass)) return;
    float z = 0.f;
    if (kByMass) {  // a select by count (top-k, the first) has no floor: it reads no z
      const float x = logit_value(l);
      z = kUnitT ? x - m : scaled_logit(x, m, temperature);
      if (z < z_floor) return;  // order_key(z) < floor_key (z is no NaN: m is finite)
    }
    const uint32_t d = radix_digit(key, pass);
    if (d != run_d) {
      flush();
      run_d = d;
      run_n = 0;
      run_m = 0;
    }
    ++run_n;
    if (kByMass) run_m += split_fixed_mass(exp_f(z));
  });
  flush();
}

// Radix passes of 8 bits over the keys of logits of type T (logits_math.h radix_key): the bits that vary in
// its values widened to float32 (bfloat16 16, float16 19, float32 32).
template <typename T> struct RadixPasses { static constexpr int value = kRadixPasses; };
template <> struct RadixPasses<__nv_bfloat16> { static constexpr int value = 2; };
template <> struct RadixPasses<__half> { static constexpr int value = 3; };

// radix_select's threshold over the request's row, split: a select over the logits' keys (radix_key:
// RadixPasses<T> passes, 2 for bfloat16 where z's keys take 4), turned into z's key (radix_threshold):
// the same threshold as the single-block kernel's select over z (the CPU kernel's), floor_key being z's.
template <bool kByMass, bool kShare, typename T>
__device__ uint32_t split_radix_select(const T* src, int64_t V, float m, float temperature, uint32_t floor_key,
                                       float goal, SplitCtx& c, SplitRadix& rs) {
  constexpr int kPasses = RadixPasses<T>::value;
  const float z_floor = kept_floor(floor_key);
  if (threadIdx.x == 0) {
    rs.prefix = 0;
    rs.remaining = static_cast<int64_t>(goal);
    rs.above = 0ull;
  }
  for (int pass = 0; pass < kPasses; ++pass) {
    const unsigned n = c.histograms++;
    unsigned* const counts = reinterpret_cast<unsigned*>(c.hist_ws + (n % kSplitHistBuffers) * split_hist_bytes());
    unsigned long long* const mass = reinterpret_cast<unsigned long long*>(counts + kRadixBins);
    if (c.part == 0) {  // the buffer of histogram n + 1: nobody reads it any more, nobody adds into it yet
      unsigned* const next =
          reinterpret_cast<unsigned*>(c.hist_ws + ((n + 1) % kSplitHistBuffers) * split_hist_bytes());
      for (int d = threadIdx.x; d < split_hist_bytes() / 4; d += blockDim.x) next[d] = 0u;
    }
    for (int d = threadIdx.x; d < kRadixBins; d += blockDim.x) {
      rs.counts[d] = 0u;
      rs.mass[d] = 0ull;
    }
    __syncthreads();
    const uint32_t prefix = rs.prefix;
    if (temperature == 1.f)
      split_radix_sweep<kByMass, kShare, true>(src, V, m, temperature, z_floor, prefix, pass, c, rs);
    else
      split_radix_sweep<kByMass, kShare, false>(src, V, m, temperature, z_floor, prefix, pass, c, rs);
    __syncthreads();
    for (int d = threadIdx.x; d < kRadixBins; d += blockDim.x) {
      const unsigned k = rs.counts[d];
      if (k == 0u) continue;  // most bins past the first pass
      atomicAdd(counts + d, k);
      if (kByMass) atomicAdd(mass + d, split_join_u64(split_mass_lo(rs)[d], split_mass_hi(rs)[d]));
    }
    // (request_barrier's first __syncthreads: every word is read before rs.mass is written back as 64-bit)
    ++c.passes;  // the request's barrier count (split_next_buffer's passes)
    cuda::request_barrier(c.counter, c.l.parts, c.passes);
    for (int d = threadIdx.x; d < kRadixBins; d += blockDim.x) {
      rs.counts[d] = __ldcg(counts + d);
      rs.mass[d] = kByMass ? __ldcg(mass + d) : 0ull;
    }
    __syncthreads();
    if (threadIdx.x == 0)
      radix_pick_step<kByMass>(rs, prefix, pass,
                               [&](unsigned long long total) { return split_mass_target(goal, total); });
    __syncthreads();
  }
  const uint32_t result = radix_threshold(rs.prefix, kPasses, m, temperature);
  __syncthreads();  // every thread has read it before a next select resets it
  return result;
}

// kResident: the block's share of each row lives in dynamic shared memory (split_share_bytes).
// kFiltered: the batch has filter tensors (top_k, top_p or min_p): rows find their threshold tau by
// the split radix select (split_radix_select), and the kept mass sums the entries with key >= tau.
template <typename T, typename Q, bool kResident, bool kFiltered>
__global__ void __launch_bounds__(kSplitThreads, kSplitBlocksPerSM) rejection_sample_logits_split_kernel(const LogitsRejectionParams p,
                                                                                     const LogitsSplit layout) {
  __shared__ SplitShared sh;
  __shared__ std::conditional_t<kFiltered, SplitRadix, char> rs;  // the radix select's (filters only)
  extern __shared__ __align__(16) unsigned char split_share_raw[];
  T* const share = reinterpret_cast<T*>(split_share_raw);
  const int64_t b = blockIdx.x, V = p.vocab;
  const bool leader = blockIdx.y == 0;
  const LogitsRequestRows rows = logits_request_rows(p, b);
  const int64_t n = rows.num_drafts;
  const RowSampling s = kFiltered ? row_sampling(p.sampling.temperature, p.sampling.top_k, p.sampling.top_p,
                                                 p.sampling.min_p, b, V)
                                  : row_sampling(p.sampling.temperature, nullptr, nullptr, nullptr, b, V);
  const T* logits = static_cast<const T*>(p.target_logits);
  const Q* draft = static_cast<const Q*>(p.draft_probs);
  const int64_t* ids = p.draft_token_ids + rows.draft_base;
  const uint64_t seed = static_cast<uint64_t>(p.seeds[b]);
  const uint64_t offset = static_cast<uint64_t>(p.offsets[b]);
  int64_t* out = p.token_ids + b * (p.max_draft + 1);
  float* lp = p.logprobs != nullptr ? p.logprobs + b * (p.max_draft + 1) : nullptr;
  char* ws = static_cast<char*>(p.workspace);
  SplitCtx c{layout, static_cast<int64_t>(blockIdx.y),
             ws + split_counter_bytes(p.batch) + b * 2 * split_buffer_bytes(layout.parts),
             reinterpret_cast<unsigned*>(ws) + b, 0u,
             kFiltered ? ws + split_hist_offset(p.batch, layout.parts, b, 0) : nullptr, 0u};
  if constexpr (kFiltered) {
    // Histogram 0's buffer, zeroed before the first barrier (the max pass's): logits_split.h. All of it, the
    // 64-bit masses too (256 x 4 + 256 x 8 bytes): the workspace is not zeroed by the launcher, and a mass
    // left over from an earlier call in a bin the first top-p pass never fills moved its threshold.
    if (leader)
      for (int d = threadIdx.x; d < split_hist_bytes() / 4; d += blockDim.x) reinterpret_cast<unsigned*>(c.hist_ws)[d] = 0u;
  }

  int64_t k = 0, final_token = 0;
  for (;; ++k) {
    const bool is_draft = k < n;
    if (!is_draft && p.bonus_token_ids != nullptr) break;  // the bonus row is not read (it may be absent)
    const T* row = logits + (rows.target_base + k) * V;
    ArgMax mx;
    if constexpr (kResident)
      mx = row_is_greedy(s) ? split_max_share<true>(row, V, share, c, sh) : split_max_share<false>(row, V, share, c, sh);
    else mx = split_max(row, V, c, sh);
    const T* const src = kResident ? share : row;  // what the kept mass and the race read
    RowStats r{mx.score, mx.index, 0u, 0.f};  // no filters: tau 0 keeps every entry
    if (!row_is_greedy(s) && r.m > -INFINITY) {
      if constexpr (kFiltered) {
        // Top-p's early acceptance (logits_split.h top_p_accepts_early): a draft that top-p surely keeps and
        // that passes the acceptance test against the sum over every entry is accepted without the select
        // and the kept mass: one exp-sum pass instead of the radix passes. Not with logprobs (they need S).
        if (is_draft && lp == nullptr && p.synthetic_rates == nullptr && s.top_k == 0 && s.top_p < 1.f &&
            draft_in_vocab(ids[k], V)) {
          const float all = split_sum<kResident, false>(src, V, r.m, s.temperature, c, sh);
          if (threadIdx.x == 0) {
            const int64_t x = ids[k];
            const float u = philox_uniform(seed, offset, static_cast<uint32_t>(k), kPurposeAccept, 0);
            const float q_x = draft != nullptr ? to_float(draft[(rows.draft_base + k) * V + x]) : 1.f;
            sh.flag = top_p_accepts_early(u, q_x, load_logit(row, x), r.m, all, s, V);
          }
          __syncthreads();
          const bool early = sh.flag != 0;
          __syncthreads();
          if (early) continue;  // accepted: the next row
        }
        // Top-p's early bonus token: the bonus row's race over every entry (p = e / the sum over every entry,
        // no select) picks w. Kept by top-p (logits_split.h top_p_verdict_above, from the mass of the entries
        // above w) and min-p, w wins the race over the kept entries too (the same random numbers, every kept
        // entry's score scaled alike): it is the token, without the select or the kept mass. Dropped, w and
        // everything below it lie outside the kept entries, so the race runs again over the entries above w
        // (the kept ones among them) and the verdict with it; each round keeps with probability >= top_p.
        // After kBonusRounds rounds, or where the verdict is unsure (the sums within 5e-5 of top-p's target),
        // the full path runs. Not with logprobs (they need S).
        // Resident rows at temperature 1 only (the other variant serves batches too large for them; the race
        // runs its fast bonus mode alone, race_mode 1: a row with +inf logits takes the full path).
        if (kResident && !is_draft && lp == nullptr && s.top_k == 0 && s.top_p < 1.f && r.m < FLT_MAX &&
            s.temperature == 1.f) {
          constexpr int kBonusRounds = 4;
          const float all = split_sum<kResident, false>(src, V, r.m, s.temperature, c, sh);
          const int64_t depth = (V + c.l.vthreads - 1) / c.l.vthreads + 10;  // top_p_verdict_above's
          const uint32_t min_key = min_p_key(s.min_p);
          const Q* const none = nullptr;
          uint32_t floor_key = 0;  // the race runs over the entries with z >= kept_floor(floor_key)
          bool done = false;
          for (int round = 0; round < kBonusRounds && all > 0.f; ++round) {
            // Every block reads the same values and decides alike.
            const RowStats rest{r.m, r.argmax, floor_key, all};
            const int64_t w = split_race_share<true, true>(share, none, -1, false, V, rest, s.temperature, seed,
                                                           offset, static_cast<uint32_t>(k), c, sh);
            const uint32_t key_w = order_key(load_logit(row, w) - r.m);
            if (key_w == 0xffffffffu) break;
            const float above = split_sum<kResident, true>(src, V, r.m, s.temperature, c, sh, key_w + 1u);
            const int verdict = top_p_verdict_above(above, all, s.top_p, V, depth);
            if (verdict == kTopPKeeps && key_w >= min_key) {
              final_token = w;
              done = true;
              break;
            }
            if (verdict == kTopPUnsure) break;
            floor_key = key_w + 1u;  // w is not kept (by top-p, or by min-p): the kept entries lie above it
          }
          if (done) break;  // k == n: the bonus row's token, every draft accepted
        }
        // row_stats' threshold: top-k by count, top-p by mass above it, min-p (logits_math.h).
        uint32_t tau = 0;
        if (s.top_k > 0)
          tau = split_radix_select<false, kResident>(src, V, r.m, s.temperature, 0u, static_cast<float>(s.top_k), c,
                                                     rs);
        if (s.top_p < 1.f) {
          const uint32_t tau_p = split_radix_select<true, kResident>(src, V, r.m, s.temperature, tau, s.top_p, c, rs);
          tau = tau_p > tau ? tau_p : tau;
        }
        const uint32_t tau_min = min_p_key(s.min_p);
        r.tau = tau_min > tau ? tau_min : tau;
      }
      r.total = split_sum<kResident, kFiltered>(src, V, r.m, s.temperature, c, sh, r.tau);
    }
    const int64_t x = is_draft ? ids[k] : -1;
    if (threadIdx.x == 0) {
      bool ok = false;
      if (is_draft && p.synthetic_rates != nullptr) {
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
        if constexpr (kResident)
          token = split_race_share<kFiltered>(share, q_row, x, is_draft, V, r, s.temperature, seed, offset,
                                   static_cast<uint32_t>(k), c, sh);
        else
          token = split_race<kFiltered>(row, q_row, x, is_draft, V, r, s.temperature, seed, offset, static_cast<uint32_t>(k), c,
                             sh);
      }
    }
    if (lp != nullptr) {
      float value;
      if (row_is_greedy(s)) {
        // token_logprob's greedy branch: log_softmax of the raw logits.
        value = r.m > -INFINITY ? (load_logit(row, token) - r.m) - log_f(split_sum<kResident>(src, V, r.m, 1.f, c, sh))
                                : -INFINITY;
      } else if (!(r.total > 0.f)) {
        value = -INFINITY;
      } else {
        const float z = scaled_logit(load_logit(row, token), r.m, s.temperature);
        value = processed_logprob(z, order_key(z), r.tau, log_f(r.total));
      }
      if (leader && threadIdx.x == 0) lp[k] = value;
    }
    if (!accepted) {
      final_token = token;
      break;
    }
  }
  if (!leader) return;
  const bool external_bonus = k == n && p.bonus_token_ids != nullptr;  // its logprob is NaN
  if (external_bonus) final_token = external_bonus_token(p.bonus_token_ids, b, V);
  for (int64_t j = threadIdx.x; j <= p.max_draft; j += blockDim.x) {
    out[j] = j < k ? ids[j] : (j == k ? final_token : -1);
    if (lp != nullptr && (j > k || (j == k && external_bonus))) lp[j] = NAN;
  }
  if (threadIdx.x == 0) p.num_accepted[b] = static_cast<int32_t>(k);
}

// `v` as a value the compiler cannot prove loop-invariant (an empty asm statement, no instruction).
// Passing the Philox seed through it inside a loop keeps the key schedule of the 10 rounds (two
// adds per round) in the loop body instead of hoisting it into 18 registers held across the loop.
__device__ __forceinline__ uint64_t opaque_u64(uint64_t v) {
  asm volatile("" : "+l"(v));
  return v;
}

// Tree walk of logits_cpu.cpp tree_request (tree_verify_math.h) with one block per request:
// every thread runs the same scalar walk (all branch conditions are block-uniform: they
// depend on block reductions and on the workspace, written by thread 0 before a barrier);
// vocab-wide steps are block reductions over the current node's row, whose probabilities
// are computed from its logits and row statistics (entered once per node). The request's
// sampling parameters and the current node's statistics are block-uniform and live in shared
// memory rather than registers, and the final race recomputes its Philox key schedule per group
// (opaque_u64): at 1024 threads a thread has 64 registers, which the walk's state held across the
// race loop would otherwise exceed (spills on sm_90).
template <typename T, typename Q>
__global__ void __launch_bounds__(kMaxThreads) tree_rejection_sample_logits_kernel(const LogitsTreeParams p) {
  __shared__ Shared sh;
  __shared__ RowSampling s;
  __shared__ RowStats r;
  const int64_t b = blockIdx.x, N = p.max_nodes, V = p.vocab;
  const int64_t n = tree_num_nodes(p.num_nodes, b, N);
  if (threadIdx.x == 0)
    s = row_sampling(p.sampling.temperature, p.sampling.top_k, p.sampling.top_p, p.sampling.min_p, b, V);
  __syncthreads();
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
  // Every thread gets the same statistics (block reductions); one writes them for all.
  const auto enter_row = [&]() {
    const RowStats stats = row_stats(row, V, s, sh);
    if (threadIdx.x == 0) r = stats;
    __syncthreads();
  };
  enter_row();
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
    __syncthreads();  // every thread has read the previous row's statistics
    enter_row();
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
    // One loop per kind of draft (the residual after draft_probs, or p without the zeroed
    // tokens), so that neither carries the other's state through the Philox rounds.
    const auto race = [&](auto mass_of) {
      ArgMax best = argmax_init();
      float bar = best.score;  // race_update's, raised to the warp's best after every group
      // 32-bit group index (Philox counts groups in 32 bits).
      for (uint32_t g = threadIdx.x; 4 * static_cast<int64_t>(g) < V; g += blockDim.x) {
        const Philox4 bits =
            philox_block(opaque_u64(seed), offset, static_cast<uint32_t>(u), purpose, g);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int64_t i = 4 * static_cast<int64_t>(g) + j;
          if (i >= V) break;
          race_update(best, bar, mass_of(stats_prob(load_logit(row, i), r, s.temperature), i), bits.x[j], i);
        }
        cuda::warp_raise_bar(bar);
      }
      return cuda::block_argmax(best, sh.argmax).index;
    };
    if (draft != nullptr)
      final_token = race([&](float pi, int64_t i) { return tree_residual(pi, to_float(q_row[i]), z, m); });
    else
      final_token = race([&](float pi, int64_t i) { return tree_excluded(i, zeroed, m) ? 0.f : pi; });
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

namespace {

// Batches with filter tensors take the split kernel's kFiltered variant (the radix select split
// over the request's blocks, and its histograms in the workspace).
bool split_filtered(const LogitsRejectionParams& params) {
  return params.sampling.top_k != nullptr || params.sampling.top_p != nullptr || params.sampling.min_p != nullptr;
}

// f(kernel, sizeof(T)) for the split kernel of the batch's types (kResident: the resident-row variant).
template <bool kResident, typename F>
cudaError_t with_split_kernel(const LogitsRejectionParams& params, F&& f) {
  auto pick = [&](auto t, auto q) {
    if (split_filtered(params))
      return f(rejection_sample_logits_split_kernel<decltype(t), decltype(q), kResident, true>, sizeof(t));
    return f(rejection_sample_logits_split_kernel<decltype(t), decltype(q), kResident, false>, sizeof(t));
  };
  switch (params.dtype) {
    case ProbDType::kFloat32: return pick(float{}, float{});
    case ProbDType::kFloat16:
      return params.draft_float32 ? pick(__half{}, float{}) : pick(__half{}, __half{});
    case ProbDType::kBFloat16:
      return params.draft_float32 ? pick(__nv_bfloat16{}, float{}) : pick(__nv_bfloat16{}, __nv_bfloat16{});
  }
  return cudaErrorInvalidValue;
}

// The split layout on the current device (parts 1: the single-block kernel runs). The blocks of a
// request wait for each other, so the whole batch must be resident: a cooperative launch checks it.
LogitsSplit split_layout_for(const LogitsRejectionParams& params) {
  const int vthreads = cuda::threads_for_vocab(params.vocab);
  int64_t resident = 0;
  int device = 0, sms = 0, cooperative = 0, per_sm = 0;
  if (params.batch > 0 &&
      cudaGetDevice(&device) == cudaSuccess &&
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess &&
      cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, device) == cudaSuccess && cooperative &&
      with_split_kernel<false>(params, [&](auto kernel, size_t) {
        return cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel,
                                                             vthreads < kSplitThreads ? vthreads : kSplitThreads, 0);
      }) == cudaSuccess) {
    resident = static_cast<int64_t>(sms) * per_sm;
  } else {
    (void)cudaGetLastError();  // a failed query leaves one block per request
  }
  return logits_split_for(vthreads, params.batch, resident);
}

// Dynamic shared memory of the resident-row split kernel for `layout` (opting the kernel in above
// 48 KB), or 0 where a share does not fit beside the batch's blocks (all resident at once): then the
// split kernel that reads the row from HBM in every pass runs. Host calls only (no stream work).
size_t split_share_bytes_for(const LogitsRejectionParams& params, const LogitsSplit& layout) {
  if (layout.parts <= 1) return 0;
  size_t bytes = 0;
  int device = 0, sms = 0, optin = 0, per_sm = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  const cudaError_t err = with_split_kernel<true>(params, [&](auto kernel, size_t elem) {
    const int64_t want = split_share_bytes(layout, params.vocab, static_cast<int64_t>(elem));
    cudaFuncAttributes attr;
    cudaError_t e = cudaFuncGetAttributes(&attr, kernel);
    if (e != cudaSuccess) return e;
    if (want + static_cast<int64_t>(attr.sharedSizeBytes) > optin) return cudaSuccess;  // does not fit a block
    if (want > 48 * 1024) {
      e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(want));
      if (e != cudaSuccess) return e;
    }
    e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, layout.threads, static_cast<size_t>(want));
    if (e != cudaSuccess) return e;
    if (static_cast<int64_t>(sms) * per_sm >= params.batch * layout.parts) bytes = static_cast<size_t>(want);
    return cudaSuccess;
  });
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return bytes;
}

}  // namespace

size_t rejection_sample_logits_cuda_workspace_bytes(const LogitsRejectionParams& params) {
  const LogitsSplit layout = split_layout_for(params);
  return layout.parts > 1
             ? static_cast<size_t>(split_workspace_bytes(params.batch, layout.parts, split_filtered(params)))
             : 0;
}

cudaError_t launch_rejection_sample_logits_cuda(const LogitsRejectionParams& params, cudaStream_t stream) {
  if (params.batch == 0) return cudaSuccess;
  const LogitsSplit layout = split_layout_for(params);
  if (layout.parts > 1) {
    if (params.workspace == nullptr) return cudaErrorInvalidValue;
    const cudaError_t zeroed = cudaMemsetAsync(params.workspace, 0, split_counter_bytes(params.batch), stream);
    if (zeroed != cudaSuccess) return zeroed;
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(static_cast<unsigned>(params.batch), static_cast<unsigned>(layout.parts));
    config.blockDim = dim3(static_cast<unsigned>(layout.threads));
    config.stream = stream;
    cudaLaunchAttribute attribute[1];
    attribute[0].id = cudaLaunchAttributeCooperative;
    attribute[0].val.cooperative = 1;
    config.attrs = attribute;
    config.numAttrs = 1;
    const size_t share_bytes = split_share_bytes_for(params, layout);
    auto launch = [&](auto kernel, size_t) { return cudaLaunchKernelEx(&config, kernel, params, layout); };
    if (share_bytes > 0) {
      config.dynamicSmemBytes = share_bytes;
      return with_split_kernel<true>(params, launch);
    }
    return with_split_kernel<false>(params, launch);
  }
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
