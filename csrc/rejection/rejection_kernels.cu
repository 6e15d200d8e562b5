// CUDA kernel of chain rejection sampling (DESIGN.md §5.2). Raw pointers only,
// no torch headers: the launcher in rejection_op.cpp checks tensors, allocates the
// workspace (rejection_cuda_workspace_bytes) and passes RejectionParams.
//
// One launch, grid (B, parts): every request's vocabulary is split into `parts`
// contiguous ranges of Philox groups (csrc/common/vocab_split.h), sized from the
// SM count so that the whole batch fills the device in one wave. Each block:
//   1. (sampling) runs the acceptance tests of all n_b drafts itself (one uniform
//      each, a shared atomicMin for the first rejection): every block of a request
//      finds the same row to race over without talking to the others;
//   2. races over its range of that row (the residual at the first rejection with
//      its fallback over p in the same pass, or the bonus row), or (greedy) takes
//      the argmax of its range of each of the n_b + 1 rows; 4 entries per thread
//      and Philox block, several 16-byte loads in flight per thread;
//   3. writes its partial result into the workspace; the last block of a request
//      to finish (a per-request counter in the workspace, zeroed by the launcher
//      on the same stream) merges the partials and writes the outputs.
// Merging partial (score, index) maxima is exact (vocab_split.h), so the tokens
// are those of the single-pass race: the Philox layout and the race are unchanged.
// Engine keywords (issue #14): with bonus_token_ids a fully accepted request emits
// its given id (clamped into [0, V-1]) and no block reads its bonus row, which the
// target may then omit (RejectionParams::bonus_rows_omitted); with synthetic
// acceptance rates step 1 tests u_k < rate[k] for every request, greedy ones
// included, and a greedy request then takes the argmax of the one row it needs.
// No host sync, no global state beyond the per-launch workspace, current stream:
// graph-capturable (the memset is a graph node).
#include <cstdint>

#include "rejection_params.h"
#include "../common/sampling_cuda.cuh"
#include "../common/sampling_math.h"
#include "../common/vocab_split.h"

namespace specdec {
namespace {

using namespace cuda;

constexpr int kThreads = 256;
constexpr int kBlocksPerSM = 2;   // launch bounds: <= 128 registers; 512 threads per SM, 2-4 loads in flight each
// Groups per thread per step of a race: 4 16-byte loads in flight (2 of p and 2 of q with draft probs).
template <bool kDenseQ>
constexpr int kRaceUnroll = kDenseQ ? 2 : 4;
constexpr int kArgmaxUnroll = 4;  // greedy: 4 x 16-byte loads in flight

// Workspace: a uint32 counter per request (padded to 16 bytes), then per request
// and part `slots` ArgMax partials (greedy: one per row; sampling: residual, fallback).
struct Workspace {
  unsigned* counters;
  ArgMax* partials;
  int64_t slots;
};

SPECDEC_HD int64_t partial_slots(int64_t max_draft) { return max_draft + 1 > 2 ? max_draft + 1 : 2; }
SPECDEC_HD int64_t counter_bytes(int64_t batch) { return (batch * 4 + 15) / 16 * 16; }

__host__ __device__ inline Workspace workspace_of(const RejectionParams& p) {
  char* base = static_cast<char*>(p.workspace);
  return Workspace{reinterpret_cast<unsigned*>(base), reinterpret_cast<ArgMax*>(base + counter_bytes(p.batch)),
                   partial_slots(p.max_draft)};
}

__device__ __forceinline__ void store_partial(ArgMax* slot, const ArgMax& a) {
  slot->score = a.score;
  slot->index = a.index;
}

// A partial written by another block: read through L2 (never a stale L1 line).
__device__ __forceinline__ ArgMax load_partial(const ArgMax* slot) {
  return ArgMax{__ldcg(&slot->score), static_cast<int64_t>(__ldcg(reinterpret_cast<const long long*>(&slot->index)))};
}

// One Philox group (entries 4g .. 4g+3) of a race; kChecked: entries past `vocab` are skipped.
template <bool kResidual, bool kDenseQ, bool kChecked>
__device__ __forceinline__ void race_group(ResidualRace& race, const float pv[4], const float qv[4], int64_t g,
                                           int64_t draft, int64_t vocab, uint64_t seed, uint64_t offset,
                                           uint32_t position) {
  const Philox4 bits = philox_block(seed, offset, position, kResidual ? kPurposeResidual : kPurposeBonus,
                                    static_cast<uint32_t>(g));
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int64_t i = 4 * g + j;
    if (kChecked && i >= vocab) break;
    if (kResidual) {
      const float q = kDenseQ ? qv[j] : (i == draft ? 1.f : 0.f);
      residual_race_update(race, pv[j], q, bits.x[j], i);
    } else {
      bonus_race_update(race, pv[j], bits.x[j], i);
    }
  }
}

// The race over groups [range) of p_row: residual max(p - q, 0) with its fallback over
// p (kDenseQ: q from q_row, else one-hot q at `draft`), or the bonus race over p
// (!kResidual). Compiled once per mode and alignment. Each thread takes the groups
// threadIdx.x + k * kThreads of the range: first in steps of kRaceUnroll groups that
// lie wholly inside the vocab (every load of a step issued before any use, no bounds
// checks), then the few groups left one by one, checked.
template <typename T, bool kResidual, bool kDenseQ, bool kAligned>
__device__ ResidualRace race_range(const T* __restrict__ p_row, const T* __restrict__ q_row, int64_t draft,
                                   int64_t vocab, GroupRange range, uint64_t seed, uint64_t offset,
                                   uint32_t position) {
  ResidualRace race = residual_race_init();
  const int64_t full_end = range.end < vocab / 4 ? range.end : vocab / 4;  // groups with 4 entries in the vocab
  int64_t g0 = range.begin + threadIdx.x;
  for (; g0 + (kRaceUnroll<kDenseQ> - 1) * kThreads < full_end; g0 += kRaceUnroll<kDenseQ> * kThreads) {
    float pv[kRaceUnroll<kDenseQ>][4], qv[kRaceUnroll<kDenseQ>][4] = {};
#pragma unroll
    for (int k = 0; k < kRaceUnroll<kDenseQ>; ++k) {
      load4_full<kAligned>(p_row, 4 * (g0 + k * kThreads), pv[k]);
      if (kDenseQ) load4_full<kAligned>(q_row, 4 * (g0 + k * kThreads), qv[k]);
    }
#pragma unroll
    for (int k = 0; k < kRaceUnroll<kDenseQ>; ++k) {
      race_group<kResidual, kDenseQ, false>(race, pv[k], qv[k], g0 + k * kThreads, draft, vocab, seed, offset,
                                            position);
      // every lane skips against the warp's best so far (after each group: a warp's log paths
      // fall from ~48% of the entries to ~6% at B=64, bench/roofline.py log_path_fraction); the
      // fallback of a residual race, read only when no residual has mass, keeps its own bar
      warp_raise_bar(kResidual ? race.residual_bar : race.fallback_bar);
    }
  }
  for (int64_t g = g0; g < range.end; g += kThreads) {
    float pv[4], qv[4] = {};
    load4(p_row, vocab, 4 * g, false, pv);
    if (kDenseQ) load4(q_row, vocab, 4 * g, false, qv);
    race_group<kResidual, kDenseQ, true>(race, pv, qv, g, draft, vocab, seed, offset, position);
  }
  return race;
}

template <typename T, bool kResidual, bool kDenseQ>
__device__ ResidualRace race_range(const T* __restrict__ p_row, const T* __restrict__ q_row, int64_t draft,
                                   int64_t vocab, GroupRange range, uint64_t seed, uint64_t offset,
                                   uint32_t position) {
  if (aligned4(p_row) && (!kDenseQ || aligned4(q_row)))
    return race_range<T, kResidual, kDenseQ, true>(p_row, q_row, draft, vocab, range, seed, offset, position);
  return race_range<T, kResidual, kDenseQ, false>(p_row, q_row, draft, vocab, range, seed, offset, position);
}

// argmax of prob_mass over groups [range) of a row (first index on ties), in the
// same two phases as race_range; each thread meets its indices in increasing order.
template <typename T, bool kAligned>
__device__ ArgMax argmax_range(const T* __restrict__ row, int64_t vocab, GroupRange range) {
  ArgMax best = argmax_init();
  const int64_t full_end = range.end < vocab / 4 ? range.end : vocab / 4;
  int64_t g0 = range.begin + threadIdx.x;
  for (; g0 + (kArgmaxUnroll - 1) * kThreads < full_end; g0 += kArgmaxUnroll * kThreads) {
    float v[kArgmaxUnroll][4];
#pragma unroll
    for (int k = 0; k < kArgmaxUnroll; ++k) load4_full<kAligned>(row, 4 * (g0 + k * kThreads), v[k]);
#pragma unroll
    for (int k = 0; k < kArgmaxUnroll; ++k)
#pragma unroll
      for (int j = 0; j < 4; ++j) argmax_update_ascending(best, prob_mass(v[k][j]), 4 * (g0 + k * kThreads) + j);
  }
  for (int64_t g = g0; g < range.end; g += kThreads) {
    float v[4];
    load4(row, vocab, 4 * g, false, v);
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (4 * g + j < vocab) argmax_update_ascending(best, prob_mass(v[j]), 4 * g + j);
  }
  return best;
}

template <typename T>
__device__ ArgMax argmax_range(const T* __restrict__ row, int64_t vocab, GroupRange range) {
  return aligned4(row) ? argmax_range<T, true>(row, vocab, range) : argmax_range<T, false>(row, vocab, range);
}

// Merge of slot `slot` of all parts of request b (every thread gets the result).
__device__ ArgMax merge_parts(const Workspace& ws, int64_t b, int64_t parts, int64_t slot, ArgMax* smem) {
  ArgMax best = argmax_init();
  for (int64_t part = threadIdx.x; part < parts; part += kThreads)
    best = argmax_merge(best, load_partial(ws.partials + (b * parts + part) * ws.slots + slot));
  return block_argmax(best, smem);
}

template <typename T>
__global__ void __launch_bounds__(kThreads, kBlocksPerSM) rejection_sample_kernel(const RejectionParams p,
                                                                                   int64_t parts) {
  __shared__ ArgMax smem[32];
  __shared__ int first_rejected;
  __shared__ bool last_block;
  const int64_t b = blockIdx.x, part = blockIdx.y;
  const RequestRows rows = request_rows(p, b);
  const int64_t n = rows.num_drafts, vocab = p.vocab;
  const T* target = static_cast<const T*>(p.target_probs);
  const T* draft = static_cast<const T*>(p.draft_probs);
  const int64_t* ids = p.draft_token_ids + rows.draft_base;
  const bool greedy = p.greedy != nullptr && p.greedy[b];
  const uint64_t seed = static_cast<uint64_t>(p.seeds[b]);
  const uint64_t offset = static_cast<uint64_t>(p.offsets[b]);
  const Workspace ws = workspace_of(p);
  ArgMax* mine = ws.partials + (b * parts + part) * ws.slots;
  const GroupRange range = vocab_part(vocab, parts, part);

  // Engine keywords (uniform per launch): synthetic acceptance tests every request (greedy ones too) on
  // its uniforms alone; an external bonus id replaces the bonus row, which is then never read.
  const bool synthetic = p.synthetic_rates != nullptr;
  const bool external_bonus = p.bonus_token_ids != nullptr;
  const bool walk = greedy && !synthetic;  // greedy verification: argmax of every row, compared in the merge
  int64_t accepted = n;
  if (walk) {
    for (int64_t k = 0; k < (external_bonus ? n : n + 1); ++k) {
      const ArgMax best = block_argmax(argmax_range(target + (rows.target_base + k) * vocab, vocab, range), smem);
      if (threadIdx.x == 0) store_partial(mine + k, best);
    }
  } else {
    if (threadIdx.x == 0) first_rejected = static_cast<int>(n);
    __syncthreads();
    for (int64_t k = threadIdx.x; k < n; k += kThreads) {
      const int64_t x = ids[k];
      bool ok = false;
      if (draft_in_vocab(x, vocab)) {
        const float u = philox_uniform(seed, offset, static_cast<uint32_t>(k), kPurposeAccept, 0);
        if (synthetic) {
          ok = synthetic_accept(u, p.synthetic_rates[k]);
        } else {
          const float p_x = to_float(target[(rows.target_base + k) * vocab + x]);
          const float q_x = draft != nullptr ? to_float(draft[(rows.draft_base + k) * vocab + x]) : 1.f;
          ok = accept_draft(u, p_x, q_x);
        }
      }
      if (!ok) atomicMin(&first_rejected, static_cast<int>(k));
    }
    __syncthreads();
    accepted = first_rejected;
    const bool residual = accepted < n;
    if (!residual && external_bonus) {
      // Everything accepted: the last block emits the given id; no row to read.
    } else if (greedy) {
      // Synthetic mode, greedy request: argmax of the one row the first rejection (or the bonus) needs.
      const ArgMax best = block_argmax(argmax_range(target + (rows.target_base + accepted) * vocab, vocab, range),
                                       smem);
      if (threadIdx.x == 0) store_partial(mine, best);
    } else {
      const T* q_row = residual && draft != nullptr ? draft + (rows.draft_base + accepted) * vocab : nullptr;
      const T* p_row = target + (rows.target_base + accepted) * vocab;
      const uint32_t position = static_cast<uint32_t>(accepted);
      ResidualRace race =
          !residual ? race_range<T, false, false>(p_row, nullptr, -1, vocab, range, seed, offset, position)
          : q_row != nullptr
              ? race_range<T, true, true>(p_row, q_row, -1, vocab, range, seed, offset, position)
              : race_range<T, true, false>(p_row, nullptr, ids[accepted], vocab, range, seed, offset, position);
      race.residual = block_argmax(race.residual, smem);
      race.fallback = block_argmax(race.fallback, smem);
      if (threadIdx.x == 0) {
        store_partial(mine, race.residual);
        store_partial(mine + 1, race.fallback);
      }
    }
  }

  // Last block of request b to finish: merge the partials (threadFenceReduction pattern:
  // each block's writes are fenced before its ticket, the last one fences before reading).
  if (threadIdx.x == 0) {
    __threadfence();
    last_block = atomicAdd(ws.counters + b, 1u) == static_cast<unsigned>(parts - 1);
  }
  __syncthreads();
  if (!last_block) return;
  __threadfence();

  int64_t final_token = external_bonus ? external_bonus_token(p, b) : 0;
  if (walk) {
    for (int64_t k = 0; k < (external_bonus ? n : n + 1); ++k) {
      const int64_t best = merge_parts(ws, b, parts, k, smem).index;
      if (k == n || ids[k] != best) {
        accepted = k;
        final_token = best;
        break;
      }
    }
  } else if (accepted == n && external_bonus) {
    // final_token is the given bonus id
  } else if (greedy) {
    final_token = merge_parts(ws, b, parts, 0, smem).index;
  } else {
    ResidualRace race = residual_race_init();
    race.residual = merge_parts(ws, b, parts, 0, smem);
    race.fallback = merge_parts(ws, b, parts, 1, smem);
    final_token = residual_race_winner(race);
  }

  int64_t* out = p.token_ids + b * (p.max_draft + 1);
  for (int64_t j = threadIdx.x; j <= p.max_draft; j += kThreads)
    out[j] = j < accepted ? ids[j] : (j == accepted ? final_token : -1);
  if (threadIdx.x == 0) p.num_accepted[b] = static_cast<int32_t>(accepted);
}

// Parts per request on the current device: one wave of kBlocksPerSM blocks per SM.
int64_t parts_for(const RejectionParams& params) {
  int device = 0, sms = 1;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
    sms = 1;
  return vocab_parts_for(params.batch, params.vocab, static_cast<int64_t>(sms) * kBlocksPerSM, kThreads);
}

}  // namespace

size_t rejection_cuda_workspace_bytes(const RejectionParams& params) {
  return static_cast<size_t>(counter_bytes(params.batch) +
                             params.batch * parts_for(params) * partial_slots(params.max_draft) *
                                 static_cast<int64_t>(sizeof(ArgMax)));
}

cudaError_t launch_rejection_sample_cuda(const RejectionParams& params, cudaStream_t stream) {
  if (params.batch == 0) return cudaSuccess;
  const int64_t parts = parts_for(params);
  const cudaError_t zeroed = cudaMemsetAsync(params.workspace, 0, counter_bytes(params.batch), stream);
  if (zeroed != cudaSuccess) return zeroed;
  const dim3 grid(static_cast<unsigned>(params.batch), static_cast<unsigned>(parts));
  const dim3 block(kThreads);
  switch (params.dtype) {
    case ProbDType::kFloat32: rejection_sample_kernel<float><<<grid, block, 0, stream>>>(params, parts); break;
    case ProbDType::kFloat16: rejection_sample_kernel<__half><<<grid, block, 0, stream>>>(params, parts); break;
    case ProbDType::kBFloat16:
      rejection_sample_kernel<__nv_bfloat16><<<grid, block, 0, stream>>>(params, parts);
      break;
  }
  return cudaGetLastError();
}

}  // namespace specdec
