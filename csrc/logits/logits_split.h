// How the CUDA chain kernel from logits (logits_kernels.cu) splits a request's vocab-wide
// passes across several thread blocks, as host/device functions so
// that tests/cpp/test_logits.cpp can replay the split against the single-block kernel.
// Plain C++17: no torch headers, compiles under g++ and nvcc.
//
// The single-block kernel runs `vthreads` = threads_for_vocab(V) threads per request; its sums
// (the kept mass S of a row, the log-sum-exp of a greedy row's logprob) are rounded in one
// fixed order: thread t adds the entries t, t + vthreads, t + 2 vthreads, ... in turn from 0,
// then a warp-shuffle tree inside each warp (block_sum) and the same tree over the (<= 32) warp
// sums, lanes past the last warp reading 0. The split keeps exactly that order by running the
// single-block kernel's threads as "virtual threads": block `part` of `parts` holds the
// contiguous virtual threads [part * per_thread * threads, (part + 1) * per_thread * threads),
// each real thread running per_thread of them one after the other (round h: virtual thread
// split_first_vthread(part, h) + threadIdx.x). Every virtual warp lies inside one real warp,
// whose shuffle tree is then the single-block kernel's; the virtual-warp sums meet in a
// per-call workspace and the final tree runs over them. So S rounds bit for bit as before.
// The max/argmax and the race need no such care: an argmax (first index on ties) and a race
// merge exactly over any partition of the row (csrc/common/vocab_split.h); those passes
// give each block a contiguous range of Philox groups (vocab_part). Rows with filters (top-k,
// top-p, min-p) find their threshold by the single-block kernel's radix select, each pass's
// histogram added up by all the request's blocks (split_hist_offset); the kept mass then sums
// in the virtual-thread order above, over the kept entries only.
#pragma once

#include <cstdint>

#include "../common/macros.h"
#include "../common/sampling_math.h"
#include "logits_math.h"

namespace specdec {

constexpr int kSplitThreads = 128;     // real threads per block of the split kernel (fewer for tiny vocabs)
constexpr int kSplitBlocksPerSM = 4;  // launch bounds: <= 128 registers

struct LogitsSplit {
  int vthreads;    // threads_for_vocab(V): the single-block kernel's threads, the order its sums round in
  int threads;     // real threads per block
  int parts;       // blocks per request
  int per_thread;  // virtual threads per real thread
};

// The layout of a batch of `batch` requests on a device holding `resident` blocks of the split
// kernel at once: parts a power of two (so that they split the virtual warps evenly), at most
// vthreads / threads, and at most what keeps the whole batch resident (one wave: the blocks of
// a request wait for each other). parts == 1: the caller runs the single-block kernel instead.
SPECDEC_HD LogitsSplit logits_split_for(int vthreads, int64_t batch, int64_t resident) {
  LogitsSplit l;
  l.vthreads = vthreads;
  l.threads = vthreads < kSplitThreads ? vthreads : kSplitThreads;
  l.parts = 1;
  while (2 * l.parts <= vthreads / l.threads && batch * 2 * l.parts <= resident) l.parts *= 2;
  l.per_thread = vthreads / (l.threads * l.parts);
  return l;
}

// The first virtual thread that block `part` runs in round h (its real thread t runs first + t).
SPECDEC_HD int64_t split_first_vthread(const LogitsSplit& l, int64_t part, int h) {
  return (part * l.per_thread + h) * static_cast<int64_t>(l.threads);
}

// Resident rows (issue #12). A block's share of a row is the set of entries its virtual threads sum:
// entry j * vthreads + part * slice + o for every chunk j < split_share_chunks and o < slice
// (slice = per_thread * threads, a power of two >= 32). The kernel copies the share once from HBM
// into shared memory during the max pass, at share position e = j * slice + o, and runs the kept
// mass and the race over it there: the virtual thread part * slice + o (real thread o % threads,
// round o / threads) reads positions o, slice + o, 2 slice + o, ... in turn, the order of the
// entries it sums in the single-block kernel, so the kept mass rounds as before. The max and the
// race take the same share as their part of the row (any partition merges exactly).
SPECDEC_HD int64_t split_share_slice(const LogitsSplit& l) { return static_cast<int64_t>(l.per_thread) * l.threads; }
SPECDEC_HD int64_t split_share_chunks(const LogitsSplit& l, int64_t vocab) {
  return (vocab + l.vthreads - 1) / l.vthreads;
}
// Positions of a share (the last chunk's past the row are never read).
SPECDEC_HD int64_t split_share_entries(const LogitsSplit& l, int64_t vocab) {
  return split_share_chunks(l, vocab) * split_share_slice(l);
}
// The row entry at share position e of block `part`.
SPECDEC_HD int64_t split_share_entry(const LogitsSplit& l, int64_t part, int64_t e) {
  const int64_t slice = split_share_slice(l);
  return (e / slice) * l.vthreads + part * slice + e % slice;
}
// Bytes of a share of `elem`-byte entries: a multiple of 16 (slice * elem is).
SPECDEC_HD int64_t split_share_bytes(const LogitsSplit& l, int64_t vocab, int64_t elem) {
  return split_share_entries(l, vocab) * elem;
}

// Per-call workspace of the split kernel: one arrival counter per request (zeroed on the
// stream before the launch), then per request two pass buffers used in turn.
struct SplitPartial {
  float score_a;
  float score_b;
  int64_t index_a;
  int64_t index_b;
};

SPECDEC_HD int64_t split_counter_bytes(int64_t batch) { return (batch * 4 + 15) / 16 * 16; }
// A pass buffer: 32 virtual-warp sums, then one SplitPartial per part.
SPECDEC_HD int64_t split_buffer_bytes(int64_t parts) {
  return (4 * 32 + parts * static_cast<int64_t>(sizeof(SplitPartial)) + 15) / 16 * 16;
}
// Rows with filters (the radix select, logits_math.h): per request three histograms used in turn,
// each 256 counts (uint32) then 256 masses (uint64, fixed point: 2^-40 units), every block of the
// request adding its own into them (global atomics; integer sums: the same in any order). Histogram n of the walk (n = 0, 1, ...) uses buffer n % 3; the
// request's block 0 zeroes buffer 0 before the first barrier and buffer (n + 1) % 3 during pass n,
// which no block reads any more (its last readers read it before pass n - 1's barrier) and none
// adds into before pass n's barrier.
// Fixed-point masses of the split radix select: e = exp(z) in [0, 1] in units of 2^-40, exact for
// every e >= 2^-16 (its float ulp is >= 2^-40), below that truncated by < 2^-40 each, so a row's
// fixed-point mass is within V * 2^-40 (< 2^-22 at V = 128256) of the exact sum of its floats, which
// is >= 1: well inside top-p's relative slack (kTopPSlack, 2^-20). <= 2^40 an entry, < 2^58 a row.
SPECDEC_HD unsigned long long split_fixed_mass(float e) {
  return static_cast<unsigned long long>(e * 1099511627776.f);  // 2^40
}
// Top-p's target on the fixed-point candidates' mass `total` (logits_math.h: top_p * total * (1 - slack)).
SPECDEC_HD unsigned long long split_mass_target(float top_p, unsigned long long total) {
  return static_cast<unsigned long long>(static_cast<double>(top_p) * static_cast<double>(total) *
                                         (1.0 - static_cast<double>(kTopPSlack)));
}
// A 64-bit sum kept as two 32-bit words (lo, hi) and added to with 32-bit adds alone: add32(word, x) adds x
// to a word and returns its old value (atomicAdd on the device, where a 32-bit add in shared memory is one
// native instruction and a 64-bit one a compare-and-swap loop that lanes hitting one bin go through one at a
// time). The add that carries lo past 2^32 sees it in the old value and puts the carry into hi with its own
// high word: the sum is exact, and the same, in any order (mod 2^64; the masses stay below 2^58).
template <typename Add32>
SPECDEC_HD void split_add_u64(unsigned* lo, unsigned* hi, unsigned long long v, Add32&& add32) {
  const unsigned l = static_cast<unsigned>(v), h = static_cast<unsigned>(v >> 32);
  const unsigned old = add32(lo, l);
  const unsigned up = h + (old + l < old ? 1u : 0u);
  if (up != 0u) add32(hi, up);
}
SPECDEC_HD unsigned long long split_join_u64(unsigned lo, unsigned hi) {
  return (static_cast<unsigned long long>(hi) << 32) | lo;
}
// Whether top-p keeps entry x of a row whatever its select's rounding, from e_x = exp_f(z_x) and `total`, the
// float32 sum of every entry's sum_exp_f(z) in any order: a draft token the split CUDA kernel may then accept
// without the select (top-p's early acceptance, logits_kernels.cu). For rows whose only filters are top-p and
// min-p (the select's candidates are every entry). The select (radix_pick_mass over the fixed-point masses
// of logits_split.h) keeps x exactly when the mass M of the entries with a larger key is below its target
// top_p (1 - kTopPSlack) times the candidates' mass. With E the exact sum of exp_f(z) over the row:
//   M <= 2^40 (E - e_x)  (masses truncated; x itself and its ties left out),
//   target >= g (2^40 E - V) - 1,  g = top_p (1 - kTopPSlack) (1 - 2^-51)  (truncations, split_mass_target's
//   double rounding),
// so M < target when (1 - g) E + (g V + 1) 2^-40 < e_x. E is bounded from `total`: a float32 sum of V
// non-negative terms in any order is within gamma = V u / (1 - V u) (u = 2^-24) of their exact sum, so their
// exact sum is at most total / (1 - gamma); a term sum_exp_f(z) (ex2.approx.ftz on the GPU: __expf's
// 2 + 1.173 |z| ulp, nothing flushed there) is within 1e-5 of exp_f(z) relative where z >= -20, and
// exp_f(z) < 2.1e-9 below that. Vocabularies of 2^22
// and more are never kept this way (gamma would pass 1/4). Conservative: it finds the kept x whose share of
// `total` passes (1 - top_p) (1 + gamma + 1e-5) (1 - top_p + 0.08% at top_p 0.9, V = 128256); the select
// decides the rest.
SPECDEC_HD bool top_p_keeps_surely(float e_x, float total, float top_p, int64_t vocab) {
  if (!(vocab > 0 && vocab < (int64_t{1} << 22)) || !(total > 0.f) || !(e_x > 0.f)) return false;
  // In float32 (no double registers in the kernel), every quantity bounded from above: 1 - g as
  // (1 - top_p) + top_p 2^-20 + 2^-40 (1 - top_p is exact for top_p in [0.5, 1]), each of the 8 operations
  // below rounding by at most 2^-24 relative, which the last factor (1 + 2^-20) covers.
  const float V = static_cast<float>(vocab);
  const float vu = V * 5.9604644775390625e-08f;  // V 2^-24 < 1/4
  const float e_up = total / (1.f - vu) * (1.f + 1e-5f) + V * 2.1e-9f;
  const float one_minus_g = (1.f - top_p) + top_p * kTopPSlack + 9.094947017729282e-13f;
  const float need = one_minus_g * e_up + (V + 1.f) * 9.094947017729282e-13f;  // (g V + 1) 2^-40 <= (V + 1) 2^-40
  return e_x > need * (1.f + 9.5367431640625e-07f);
}


// Top-p's verdict on entry w of a row whatever its select's rounding (kTopPKeeps, kTopPDrops; kTopPUnsure
// leaves it to the select), from `above`, the float32 sum of sum_exp_f(z) over the entries whose z exceeds
// w's, and `all`, the same over every entry, both summed in the split kernel's virtual-thread order (below):
// the split CUDA kernel's early bonus token (logits_kernels.cu). For rows whose only filters are top-p and
// min-p. The select picks the largest logit key v whose candidates from the top reach the target (top_p
// (1 - kTopPSlack) times the fixed-point mass of every entry) and keeps z >= z(v). Were z_w below z(v), every
// entry with key >= v would have z > z_w and their mass M(>w) would reach the target; were z_w at least
// z(v) with M(>w) reaching the target, the entries with z > z_w (the keys from the smallest of theirs up)
// would reach it from a key above v's. So w is kept exactly when M(>w) < target. With E the exact sums of
// exp_f(z) (the fixed-point masses truncate exp_f(z) to 2^-40 units, each by less than one unit):
//   2^40 E_above - V <= M(>w) <= 2^40 E_above,   g (2^40 E_all - V) - 1 <= target <= g 2^40 E_all,
//   g = top_p (1 - kTopPSlack) (within 2^-51 relative: split_mass_target's double rounding),
// so keeps when E_above + (V + 1) 2^-40 < g E_all, drops when E_above - V 2^-40 >= g E_all. The float sums
// bound the E: a float32 sum of non-negative terms in which each term meets at most `depth` additions is
// within gamma = depth u / (1 - depth u) (u = 2^-24) of the exact sum (the split sums: a virtual thread adds
// ceil(V / vthreads) entries in turn, then two shuffle trees of 5 levels: depth = ceil(V / vthreads) + 10,
// gamma = 8e-6 at V = 128256), and a term sum_exp_f(z) lies within 2e-5 of exp_f(z) relative where
// z >= -87.3 (__expf's 2 + 1.173 |z| ulp; below that it is flushed to 0 and exp_f(z) < 1.2e-38). Every bound is
// rounded toward safety by a factor (1 +- 2^-20) covering the float operations here. Unsure only where
// M(>w) lies within about 5e-5 of the target, relative. Vocabularies of 2^22 and more are always unsure.
constexpr int kTopPUnsure = 0, kTopPKeeps = 1, kTopPDrops = 2;

SPECDEC_HD int top_p_verdict_above(float above, float all, float top_p, int64_t vocab, int64_t depth) {
  if (!(vocab > 0 && vocab < (int64_t{1} << 22)) || !(depth > 0 && depth < (int64_t{1} << 20)) || !(all > 0.f) ||
      !(above >= 0.f) || !(top_p < 1.f))
    return kTopPUnsure;
  const float V = static_cast<float>(vocab);
  const float du = static_cast<float>(depth) * 5.9604644775390625e-08f;  // depth 2^-24 < 1/16
  const float gamma = du / (1.f - du) * (1.f + 9.5367431640625e-07f);
  const float up = 1.f + 9.5367431640625e-07f, down = 1.f - 9.5367431640625e-07f;
  const float tiny = V * 1.2e-38f;
  const float above_up = (above / (1.f - gamma) * (1.f + 2e-5f) + tiny) * up;
  const float above_low = above / ((1.f + gamma) * (1.f + 2e-5f)) * down;
  const float all_up = (all / (1.f - gamma) * (1.f + 2e-5f) + tiny) * up;
  const float all_low = all / ((1.f + gamma) * (1.f + 2e-5f)) * down;
  const float g = top_p * (1.f - kTopPSlack);
  const float spare = (V + 1.f) * 9.094947017729282e-13f;  // (V + 1) 2^-40
  if ((above_up + spare) * up < g * down * all_low) return kTopPKeeps;
  if ((above_low - spare) * down >= g * up * all_up) return kTopPDrops;
  return kTopPUnsure;
}

// Top-p's early acceptance in the split kernel (thread 0 of every block of the request, from the same values:
// every block decides alike): the draft x (in the vocabulary) of a sampled row whose only filters are top-p
// and min-p is accepted without the select when top-p keeps it whatever the select's rounding
// (top_p_keeps_surely), min-p keeps it, and accept_draft(u, e_x / all, q(x)), where `all` is the kept
// mass's sum taken over every entry (split_sum with tau 0: the same terms in the same order, those off the
// kept set then zeros). Float addition rounds monotonically in each operand, so all >= S, the kept mass the
// full path sums, and e_x / all <= e_x / S = p(x) (division rounds monotonically too): whatever this
// accepts the full path accepts, with the same u. False means only "ask the select".
SPECDEC_HD bool top_p_accepts_early(float u, float q_x, float x, float m, float all, const RowSampling& s,
                                    int64_t vocab) {
  if (s.top_k != 0 || !(s.top_p < 1.f) || row_is_greedy(s)) return false;
  const float z = scaled_logit(x, m, s.temperature);
  const float e = exp_f(z);
  if (order_key(z) < min_p_key(s.min_p)) return false;
  if (!top_p_keeps_surely(e, all, s.top_p, vocab)) return false;
  return accept_draft(u, processed_prob(e, 0u, 0u, all), q_x);
}

constexpr int kSplitHistBins = 256;  // logits_math.h kRadixBins
constexpr int kSplitHistBuffers = 3;
SPECDEC_HD int64_t split_hist_bytes() { return kSplitHistBins * (4 + 8); }
SPECDEC_HD int64_t split_workspace_bytes(int64_t batch, int64_t parts, bool filtered = false) {
  return split_counter_bytes(batch) + batch * 2 * split_buffer_bytes(parts) +
         (filtered ? batch * kSplitHistBuffers * split_hist_bytes() : 0);
}
// Offset of request b's histogram buffer `n` (0..2) in the workspace.
SPECDEC_HD int64_t split_hist_offset(int64_t batch, int64_t parts, int64_t b, int n) {
  return split_counter_bytes(batch) + batch * 2 * split_buffer_bytes(parts) +
         (b * kSplitHistBuffers + n) * split_hist_bytes();
}

}  // namespace specdec
