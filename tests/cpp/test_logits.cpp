// Host-side tests of the helpers the CPU and CUDA logits kernels share
// (csrc/logits/logits_math.h, logits_params.h). No torch needed.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "check.h"
#include "logits/logits_math.h"
#include "logits/logits_params.h"
#include "logits/logits_split.h"
#include "common/vocab_split.h"

using namespace specdec;

static void test_logit_value_sanitizes() {
  CHECK(logit_value(NAN) == -INFINITY);
  CHECK(logit_value(INFINITY) == FLT_MAX);
  CHECK(logit_value(-INFINITY) == -INFINITY);
  CHECK(logit_value(1.5f) == 1.5f);
}

static void test_order_key_preserves_order() {
  const float values[] = {-INFINITY, -FLT_MAX, -3.5f, -1.f, -1e-30f, -0.f, 0.f, 1e-30f, 2.f, FLT_MAX, INFINITY};
  for (size_t i = 0; i + 1 < sizeof(values) / sizeof(values[0]); ++i) {
    if (values[i] == values[i + 1]) {
      CHECK(order_key(values[i]) == order_key(values[i + 1]));  // -0.0 and +0.0
    } else {
      CHECK(order_key(values[i]) < order_key(values[i + 1]));
    }
  }
  std::mt19937 gen(1);
  std::normal_distribution<float> dist(0.f, 10.f);
  for (int t = 0; t < 10000; ++t) {
    const float a = dist(gen), b = dist(gen);
    CHECK((a < b) == (order_key(a) < order_key(b)));
  }
}

static void test_row_sampling_clamps_bad_values() {
  const float t[] = {-1.f, NAN, INFINITY, 0.5f};
  const int64_t k[] = {-3, 100, 5, 0};
  const float p[] = {NAN, 2.f, -0.5f, 0.9f};
  const float m[] = {-1.f, 1.5f, NAN, 0.1f};
  const RowSampling s0 = row_sampling(t, k, p, m, 0, 100);
  CHECK(row_is_greedy(s0) && s0.top_k == 0 && s0.top_p == 1.f && s0.min_p == 0.f);
  const RowSampling s1 = row_sampling(t, k, p, m, 1, 100);
  CHECK(row_is_greedy(s1) && s1.top_k == 0 && s1.top_p == 1.f && s1.min_p == 1.f);  // k >= V is off
  const RowSampling s2 = row_sampling(t, k, p, m, 2, 100);
  CHECK(s2.temperature == FLT_MAX && s2.top_k == 5 && s2.top_p == 0.f && s2.min_p == 0.f);
  const RowSampling s3 = row_sampling(t, k, p, m, 3, 100);
  CHECK(s3.temperature == 0.5f && s3.top_k == 0 && s3.top_p == 0.9f && s3.min_p == 0.1f);
  CHECK(row_has_filter(s3) && !row_has_filter(row_sampling(nullptr, nullptr, nullptr, nullptr, 0, 100)));
}

// The full radix select over a vector of values, as the kernels run it (4 passes).
static uint32_t select_kth(const std::vector<float>& z, int64_t k) {
  uint32_t prefix = 0;
  int64_t remaining = k;
  for (int pass = 0; pass < kRadixPasses; ++pass) {
    int64_t counts[kRadixBins] = {};
    for (float v : z)
      if (radix_match(order_key(v), prefix, pass)) counts[radix_digit(order_key(v), pass)]++;
    prefix |= radix_pick_count(counts, remaining) << (32 - kRadixBits * (pass + 1));
  }
  return prefix;
}

// Top-p's radix select in double precision (the CPU kernel's, logits_cpu.cpp select_top_p, with
// slack = kTopPSlack) over the keys >= floor_key.
static uint32_t select_mass(const std::vector<float>& z, double top_p, double slack = 0.0, uint32_t floor_key = 0u) {
  double total = 0;
  for (float v : z)
    if (order_key(v) >= floor_key) total += std::exp(v);
  const double target = top_p * total * (1.0 - slack);
  uint32_t prefix = 0;
  double above = 0;
  for (int pass = 0; pass < kRadixPasses; ++pass) {
    int64_t counts[kRadixBins] = {};
    double mass[kRadixBins] = {};
    for (float v : z) {
      const uint32_t key = order_key(v);
      if (key < floor_key || !radix_match(key, prefix, pass)) continue;
      counts[radix_digit(key, pass)]++;
      mass[radix_digit(key, pass)] += std::exp(v);
    }
    prefix |= radix_pick_mass(counts, mass, target, above) << (32 - kRadixBits * (pass + 1));
  }
  return prefix;
}

static void test_radix_select_finds_kth_largest_with_ties() {
  std::mt19937 gen(2);
  std::uniform_int_distribution<int> small(-20, 0);
  for (int t = 0; t < 200; ++t) {
    std::vector<float> z(300);
    for (float& v : z) v = small(gen) * 0.25f;  // many ties
    std::vector<float> sorted = z;
    std::sort(sorted.begin(), sorted.end(), [](float a, float b) { return a > b; });
    const int64_t k = 1 + t % 299;
    CHECK(select_kth(z, k) == order_key(sorted[k - 1]));
  }
}

static void test_radix_mass_select_is_smallest_reaching_set() {
  std::mt19937 gen(3);
  std::normal_distribution<float> dist(0.f, 2.f);
  for (int t = 0; t < 200; ++t) {
    std::vector<float> z(257);
    for (float& v : z) v = -std::fabs(dist(gen));
    const double top_p = 0.05 + 0.9 * (t / 200.0);
    const uint32_t tau = select_mass(z, top_p);
    double total = 0, kept = 0, kept_above = 0;
    for (float v : z) total += std::exp(v);
    for (float v : z) {
      if (order_key(v) >= tau) kept += std::exp(v);
      if (order_key(v) > tau) kept_above += std::exp(v);
    }
    CHECK(kept >= top_p * total * (1 - 1e-12));       // the kept set reaches top_p
    CHECK(kept_above < top_p * total * (1 + 1e-12));  // dropping the boundary value would not
  }
}

static void test_radix_pick_skips_empty_bins() {
  int64_t counts[kRadixBins] = {};
  double mass[kRadixBins] = {};
  counts[10] = 2;
  counts[3] = 5;
  mass[3] = 0.5;  // bin 10 holds entries whose exp underflowed
  double above = 0;
  CHECK(radix_pick_mass(counts, mass, 0.0, above) == 10u);  // top_p <= 0: the largest value only
  above = 0;
  CHECK(radix_pick_mass(counts, mass, 0.4, above) == 3u);
  above = 0;
  CHECK(radix_pick_mass(counts, mass, 2.0, above) == 3u);  // out of reach (rounding): the lowest bin
  int64_t remaining = 3;
  CHECK(radix_pick_count(counts, remaining) == 3u && remaining == 1);
}

static void test_request_rows_clamp_bad_lengths() {
  int64_t lengths[] = {0, 5, 2, 99};
  LogitsRejectionParams p{};
  p.lengths = lengths;
  p.batch = 3;
  p.max_draft = 4;
  p.num_draft_rows = 6;
  p.packed = true;
  p.bonus_rows = true;
  CHECK(logits_request_rows(p, 0).num_drafts == 4);  // 5 drafts clamped to K
  CHECK(logits_request_rows(p, 1).num_drafts == 0);  // decreasing prefix sums: empty
  CHECK(logits_request_rows(p, 2).num_drafts == 4 && logits_request_rows(p, 2).target_base == 4);
}

// Without bonus rows (external bonus tokens): packed [T, V] rows cu[b] .., padded [B, K, V] rows b * K ..
static void test_request_rows_without_bonus_rows() {
  int64_t cu[] = {0, 2, 2, 5};
  LogitsRejectionParams p{};
  p.lengths = cu;
  p.batch = 3;
  p.max_draft = 3;
  p.num_draft_rows = 5;
  p.packed = true;
  p.bonus_rows = false;
  CHECK(logits_request_rows(p, 0).target_base == 0 && logits_request_rows(p, 2).target_base == 2);
  CHECK(logits_request_rows(p, 2).draft_base == 2 && logits_request_rows(p, 2).num_drafts == 3);
  p.bonus_rows = true;
  CHECK(logits_request_rows(p, 2).target_base == 4);  // cu[2] + b
  int64_t n[] = {3, 1, 0};
  p.lengths = n;
  p.packed = false;
  p.num_draft_rows = 9;
  CHECK(logits_request_rows(p, 2).target_base == 8);  // b * (K + 1)
  p.bonus_rows = false;
  CHECK(logits_request_rows(p, 2).target_base == 6 && logits_request_rows(p, 1).target_base == 3);  // b * K
}

static void test_engine_keyword_helpers() {
  CHECK(synthetic_accept(0.25f, 0.5f) && !synthetic_accept(0.5f, 0.5f));
  CHECK(!synthetic_accept(0.001f, 0.f) && synthetic_accept(0.999f, 1.f));
  CHECK(!synthetic_accept(0.001f, NAN));  // a NaN rate never accepts
  const int64_t bonus[] = {-1, 7, 12, 3};
  CHECK(external_bonus_token(bonus, 0, 10) == 0 && external_bonus_token(bonus, 1, 10) == 7);
  CHECK(external_bonus_token(bonus, 2, 10) == 9 && external_bonus_token(bonus, 3, 10) == 3);
}


// ---- Host replay of the split chain kernel (logits_kernels.cu, rejection_sample_logits_split_kernel)
// against the single-block kernel (rejection_sample_logits_kernel) on many random rows: the kept mass
// S (and the greedy logprob's sum, the same code with T = 1) must round bit for bit as before, and the
// split max/argmax must pick the same entry.

static int vthreads_for(int64_t vocab) {  // cuda::threads_for_vocab (sampling_cuda.cuh)
  int threads = 32;
  while (threads < 1024 && 4 * static_cast<int64_t>(threads) < vocab) threads *= 2;
  return threads;
}

// __shfl_down_sync tree over 32 lanes (a lane whose source is past lane 31 keeps its own value): lane 0.
static float shfl_down_tree(std::vector<float> v) {
  for (int o = 16; o > 0; o >>= 1) {
    std::vector<float> next(32);
    for (int l = 0; l < 32; ++l) next[l] = v[l] + (l + o < 32 ? v[l + o] : v[l]);
    v = next;
  }
  return v[0];
}

static float entry_mass(const std::vector<float>& row, int64_t i, float m, float t) {
  return exp_f(scaled_logit(logit_value(row[i]), m, t));
}

// rejection_sample_logits_kernel: row_stats' loop, then block_sum with blockDim = vthreads.
static float single_block_sum(const std::vector<float>& row, float m, float t, std::vector<float>& warp_sums) {
  const int64_t V = static_cast<int64_t>(row.size());
  const int threads = vthreads_for(V), warps = threads / 32;
  warp_sums.assign(32, 0.f);
  for (int w = 0; w < warps; ++w) {
    std::vector<float> lanes(32);
    for (int lane = 0; lane < 32; ++lane) {
      float part = 0.f;
      for (int64_t i = 32 * w + lane; i < V; i += threads) part += entry_mass(row, i, m, t);
      lanes[lane] = part;
    }
    warp_sums[w] = shfl_down_tree(lanes);
  }
  return shfl_down_tree(warp_sums);  // lanes past the last warp read 0
}

// rejection_sample_logits_split_kernel: split_sum_sweep (its unrolled loop, U = 16) in every block,
// the virtual-warp sums in the workspace, the final tree in split_sum.
static float split_block_sum(const std::vector<float>& row, float m, float t, const LogitsSplit& l,
                             std::vector<float>& vsum) {
  constexpr int U = 16;
  const int64_t V = static_cast<int64_t>(row.size()), vthreads = l.vthreads;
  vsum.assign(32, 0.f);
  std::vector<int> written(32, 0);
  for (int64_t part = 0; part < l.parts; ++part)
    for (int h = 0; h < l.per_thread; ++h) {
      const int64_t first = split_first_vthread(l, part, h);
      for (int w = 0; w < l.threads / 32; ++w) {
        std::vector<float> lanes(32);
        for (int lane = 0; lane < 32; ++lane) {
          int64_t i = first + 32 * w + lane;
          float s = 0.f;
          for (; i + (U - 1) * vthreads < V; i += U * vthreads) {
            float x[U];
            for (int k = 0; k < U; ++k) x[k] = logit_value(row[i + k * vthreads]);
            for (int k = 0; k < U; ++k) s += exp_f(scaled_logit(x[k], m, t));
          }
          for (; i < V; i += vthreads) s += entry_mass(row, i, m, t);
          lanes[lane] = s;
        }
        const int64_t slot = (first + 32 * w) >> 5;
        CHECK(slot >= 0 && slot < vthreads / 32);
        if (slot < 0 || slot >= 32) continue;
        vsum[slot] = shfl_down_tree(lanes);
        ++written[slot];
      }
    }
  std::vector<float> lanes(32);
  for (int lane = 0; lane < 32; ++lane) {
    if (lane < vthreads / 32) CHECK(written[lane] == 1);  // every virtual warp exactly once
    lanes[lane] = lane < vthreads / 32 ? vsum[lane] : 0.f;
  }
  return shfl_down_tree(lanes);
}

// split_max: each block a contiguous range of groups (vocab_part), its threads striding over them,
// merged in part order; ties keep the first index. Returns the merged (max, argmax).
static std::pair<float, int64_t> split_argmax(const std::vector<float>& row, const LogitsSplit& l) {
  const int64_t V = static_cast<int64_t>(row.size());
  ArgMax merged{-INFINITY, INT64_MAX};
  for (int64_t part = l.parts - 1; part >= 0; --part) {  // any order merges alike
    const GroupRange range = vocab_part(V, l.parts, part);
    for (int t = 0; t < l.threads; ++t) {
      ArgMax best{-INFINITY, INT64_MAX};
      for (int64_t g = range.begin + t; g < range.end; g += l.threads)
        for (int j = 0; j < 4; ++j)
          if (4 * g + j < V) argmax_update(best, logit_value(row[4 * g + j]), 4 * g + j);
      merged = argmax_merge(merged, best);
    }
  }
  return {merged.score, merged.index};
}

// The resident-row split kernel (split_max_share, split_sum_share_sweep, split_race_share): every block
// copies its share (split_share_entry) into shared memory, then its virtual threads sum their positions
// o, slice + o, ... (unrolled by U = 16) and the race takes the share's groups of 4. Checks that the shares
// tile the row (every entry in exactly one block, every group of 4 whole in one block) and returns the
// kept mass; `reversed` sums each virtual thread's positions backwards (a mutant the replay must catch:
// a virtual-warp sum or the kept mass then rounds differently. Permuting whole lanes would not: the
// shuffle tree pairs lanes by residues, so XOR or rotation of lanes leaves every sum as it was).
static float resident_block_sum(const std::vector<float>& row, float m, float t, const LogitsSplit& l,
                                std::vector<float>& vsum, std::pair<float, int64_t>& argmax, bool reversed = false) {
  constexpr int U = 16;
  const int64_t V = static_cast<int64_t>(row.size()), vthreads = l.vthreads, slice = split_share_slice(l);
  const int64_t entries = split_share_entries(l, V), chunks = split_share_chunks(l, V);
  CHECK(slice >= 32 && (slice & (slice - 1)) == 0 && entries == chunks * slice);
  CHECK(split_share_bytes(l, V, 2) % 16 == 0 && split_share_bytes(l, V, 4) % 16 == 0);
  // split_max_share's 16-byte pieces: a stride of `threads` positions keeps a piece's offset in its slice.
  if (l.parts > 1) CHECK(l.threads % (slice / 4) == 0 && l.threads % (slice / 8) == 0);
  std::vector<int> seen(static_cast<size_t>(V), 0);
  vsum.assign(32, 0.f);
  ArgMax merged{-INFINITY, INT64_MAX};
  for (int64_t part = 0; part < l.parts; ++part) {
    std::vector<float> share(static_cast<size_t>(entries), NAN);  // positions past the row stay unread
    for (int64_t e = 0; e < entries; ++e) {
      const int64_t i = split_share_entry(l, part, e);
      CHECK(i >= 0);
      if (e > 0) CHECK(i > split_share_entry(l, part, e - 1));  // entries increase with the position
      if (e % 4 == 0) CHECK(i % 4 == 0);                           // groups of 4 stay whole
      if (i >= V) continue;
      ++seen[static_cast<size_t>(i)];
      share[static_cast<size_t>(e)] = row[static_cast<size_t>(i)];
    }
    for (int th = 0; th < l.threads; ++th) {  // split_max_share: any thread's positions, merged
      ArgMax best{-INFINITY, INT64_MAX};
      for (int64_t e = th; e < entries; e += l.threads) {
        const int64_t i = split_share_entry(l, part, e);
        if (i < V) argmax_update(best, logit_value(share[static_cast<size_t>(e)]), i);
      }
      merged = argmax_merge(merged, best);
    }
    for (int h = 0; h < l.per_thread; ++h)
      for (int w = 0; w < l.threads / 32; ++w) {
        std::vector<float> lanes(32);
        for (int lane = 0; lane < 32; ++lane) {
          const int64_t o = static_cast<int64_t>(h) * l.threads + 32 * w + lane;
          const int64_t first = part * slice + o;
          const int64_t n = first < V ? (V - first + vthreads - 1) / vthreads : 0;
          std::vector<float> x(static_cast<size_t>(n));
          for (int64_t j = 0; j < n; ++j) x[static_cast<size_t>(j)] = logit_value(share[static_cast<size_t>(j * slice + o)]);
          if (reversed) std::reverse(x.begin(), x.end());
          float s = 0.f;
          int64_t j = 0;
          for (; j + (U - 1) < n; j += U)
            for (int k = 0; k < U; ++k) s += exp_f(scaled_logit(x[static_cast<size_t>(j + k)], m, t));
          for (; j < n; ++j) s += exp_f(scaled_logit(x[static_cast<size_t>(j)], m, t));
          lanes[lane] = s;
        }
        vsum[static_cast<size_t>((part * slice + static_cast<int64_t>(h) * l.threads + 32 * w) >> 5)] =
            shfl_down_tree(lanes);
      }
  }
  for (int64_t i = 0; i < V; ++i) CHECK(seen[static_cast<size_t>(i)] == 1);  // the shares tile the row
  argmax = {merged.score, merged.index};
  std::vector<float> lanes(32);
  for (int lane = 0; lane < 32; ++lane) lanes[lane] = lane < vthreads / 32 ? vsum[lane] : 0.f;
  return shfl_down_tree(lanes);
}

static void test_split_chain_kernel_replays_single_block() {
  std::mt19937 gen(12);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_real_distribution<float> unit(0.f, 1.f);
  const int64_t resident_choices[] = {0, 1, 132 * 4, 528, 100000};
  const int64_t big_vocabs[] = {128256, 151936, 32000, 49152};
  int rows = 0, order_sensitive = 0, mutant_differs = 0;
  for (int trial = 0; trial < 400; ++trial) {
    // 24 rows of real vocab sizes (chains of ~125 entries: the kernel's unrolled loop), then small ones.
    const int64_t V = trial < 24 ? big_vocabs[trial % 4] : 1 + static_cast<int64_t>(unit(gen) * 6000.f);
    const float scale = trial % 3 == 0 ? 10.f : (trial % 3 == 1 ? 1.f : 0.1f);
    std::vector<float> row(static_cast<size_t>(V));
    for (auto& x : row) x = scale * normal(gen);
    if (trial % 5 == 0) row[static_cast<size_t>(unit(gen) * (V - 1))] = NAN;        // sanitized to -inf
    if (trial % 7 == 0) row[static_cast<size_t>(unit(gen) * (V - 1))] = INFINITY;   // to FLT_MAX
    if (trial % 4 == 0) row[static_cast<size_t>(unit(gen) * (V - 1))] = row[0] = 30.f;  // a tie at the max
    ArgMax ref{-INFINITY, INT64_MAX};
    for (int64_t i = 0; i < V; ++i) argmax_update(ref, logit_value(row[i]), i);
    const float t = trial % 2 == 0 ? 1.f : 0.7f;
    std::vector<float> warp_sums, vsum;
    const float single = single_block_sum(row, ref.score, t, warp_sums);
    float sequential = 0.f;
    for (int64_t i = 0; i < V; ++i) sequential += entry_mass(row, i, ref.score, t);
    order_sensitive += std::memcmp(&sequential, &single, sizeof(float)) != 0;
    for (const int64_t resident : resident_choices) {
      const int64_t batch = 1 + static_cast<int64_t>(unit(gen) * 100.f);
      const LogitsSplit l = logits_split_for(vthreads_for(V), batch, resident);
      CHECK(l.threads * l.parts * l.per_thread == l.vthreads);
      CHECK(resident == 0 || l.parts == 1 || batch * l.parts <= resident);
      const float split = split_block_sum(row, ref.score, t, l, vsum);
      CHECK(std::memcmp(&split, &single, sizeof(float)) == 0);  // bit for bit
      CHECK(std::memcmp(vsum.data(), warp_sums.data(), 32 * sizeof(float)) == 0);  // and every warp's sum
      const auto mx = split_argmax(row, l);
      CHECK(mx.first == ref.score && mx.second == ref.index);
      std::pair<float, int64_t> rmx;
      const float kept = resident_block_sum(row, ref.score, t, l, vsum, rmx);
      CHECK(std::memcmp(&kept, &single, sizeof(float)) == 0);  // the resident rows too
      CHECK(std::memcmp(vsum.data(), warp_sums.data(), 32 * sizeof(float)) == 0);
      CHECK(rmx.first == ref.score && rmx.second == ref.index);
      const float mutant = resident_block_sum(row, ref.score, t, l, vsum, rmx, true);
      mutant_differs += std::memcmp(&mutant, &single, sizeof(float)) != 0 ||
                        std::memcmp(vsum.data(), warp_sums.data(), 32 * sizeof(float)) != 0;
      ++rows;
    }
  }
  CHECK(rows == 2000);
  CHECK(order_sensitive > 100);  // a plain sequential sum rounds differently: the replay can tell orders apart
  CHECK(mutant_differs > 1000);  // so does a share read in another order (1175 of the 2000 rows)
  // The reference layout: B = 64 on 132 SMs x 4 blocks: 8 parts of 128 threads, one virtual thread each.
  const LogitsSplit h200 = logits_split_for(vthreads_for(128256), 64, 132 * 4);
  CHECK(h200.vthreads == 1024 && h200.threads == 128 && h200.parts == 8 && h200.per_thread == 1);
  CHECK(logits_split_for(1024, 200, 132 * 4).parts == 2);
  CHECK(logits_split_for(64, 8, 528).threads == 64 && logits_split_for(64, 8, 528).parts == 1);
}

// One pass's digit from the request's whole histogram, as the kernels' radix_pick_step picks it: by count
// (remaining: the goal's rank), or by mass (target set from pass 0's total, above: the mass above the bin).
static uint32_t replay_pick(const unsigned* counts, const unsigned long long* mass, bool by_mass, float goal, int pass,
                            unsigned long long& target, unsigned long long& above, int64_t& remaining) {
  if (!by_mass) return radix_pick_count(counts, remaining);
  if (pass == 0) {
    unsigned long long total = 0;
    for (int j = 0; j < kRadixBins; ++j) total += mass[j];
    target = split_mass_target(goal, total);
  }
  return radix_pick_mass(counts, mass, target, above);
}

// The split radix select of rows with filters (logits_kernels.cu split_radix_select), replayed: every
// block histograms the candidates of its share (split_share_entry), counts and fixed-point masses
// (split_fixed_mass) are added up over the blocks, and the digits are picked from the sums; against the
// CPU kernel's selection in double precision (logits_cpu.cpp select_top_k / select_top_p).
static uint32_t split_select(const std::vector<float>& z, const LogitsSplit& l, bool by_mass, float goal,
                             uint32_t floor_key) {
  const int64_t V = static_cast<int64_t>(z.size());
  uint32_t prefix = 0;
  int64_t remaining = static_cast<int64_t>(goal);
  unsigned long long above = 0, target = 0;
  for (int pass = 0; pass < kRadixPasses; ++pass) {
    unsigned counts[kRadixBins] = {};
    unsigned long long mass[kRadixBins] = {};
    for (int64_t part = l.parts - 1; part >= 0; --part) {  // blocks add in any order
      unsigned c[kRadixBins] = {};
      unsigned long long m[kRadixBins] = {};
      for (int64_t e = 0; e < split_share_entries(l, V); ++e) {
        const int64_t i = split_share_entry(l, part, e);
        if (i >= V) continue;
        const uint32_t key = order_key(z[static_cast<size_t>(i)]);
        if (key < floor_key || !radix_match(key, prefix, pass)) continue;
        c[radix_digit(key, pass)]++;
        m[radix_digit(key, pass)] += split_fixed_mass(std::exp(z[static_cast<size_t>(i)]));
      }
      for (int d = 0; d < kRadixBins; ++d) {
        counts[d] += c[d];
        mass[d] += m[d];
      }
    }
    const uint32_t d = replay_pick(counts, mass, by_mass, goal, pass, target, above, remaining);
    prefix |= d << (32 - kRadixBits * (pass + 1));
  }
  return prefix;
}

// The CPU kernel's top-p threshold: double masses, the same slack.
static uint32_t cpu_select_mass(const std::vector<float>& z, float top_p, uint32_t floor_key) {
  return select_mass(z, static_cast<double>(top_p), static_cast<double>(kTopPSlack), floor_key);
}

static void test_split_radix_select_matches_the_cpu_selection() {
  std::mt19937 gen(21);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_real_distribution<float> unit(0.f, 1.f);
  const int64_t vocabs[] = {128256, 32000, 5000, 1025, 700};
  int checked = 0, fixed_point_inexact = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const int64_t V = vocabs[trial % 5];
    std::vector<float> z(static_cast<size_t>(V));
    const float scale = trial % 3 == 0 ? 8.f : (trial % 3 == 1 ? 2.f : 0.25f);
    for (auto& v : z) v = trial % 4 == 3 ? -0.25f * std::floor(unit(gen) * 40.f)  // many ties
                                         : scale * normal(gen);
    const float m = *std::max_element(z.begin(), z.end());
    for (auto& v : z) v -= m;  // z <= 0, max 0: as the kernels scale it
    for (float v : z) fixed_point_inexact += std::exp(v) < 1.52587890625e-05f;  // 2^-16: truncated
    const LogitsSplit l = logits_split_for(vthreads_for(V), 64, 132 * 4);
    for (const float top_p : {0.05f, 0.5f, 0.9f, 0.99f}) {
      CHECK(split_select(z, l, true, top_p, 0u) == cpu_select_mass(z, top_p, 0u));
      ++checked;
    }
    for (const int64_t k : {int64_t{1}, int64_t{50}, V / 3}) {
      const uint32_t tau_k = split_select(z, l, false, static_cast<float>(k), 0u);
      std::vector<float> sorted = z;
      std::sort(sorted.begin(), sorted.end(), [](float a, float b) { return a > b; });
      CHECK(tau_k == order_key(sorted[static_cast<size_t>(k - 1)]));
      CHECK(split_select(z, l, true, 0.9f, tau_k) == cpu_select_mass(z, 0.9f, tau_k));  // top-p above top-k
      ++checked;
    }
  }
  CHECK(checked == 40 * 7);
  CHECK(fixed_point_inexact > 100000);  // rows with entries below 2^-16 (their masses truncated) were tested
  // Masses that meet top_p exactly (0.5 + 0.3 of 1 with top_p 0.8) keep exactly those: no rounding drops one.
  const std::vector<float> exact = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  std::vector<float> zs(exact);
  const float mx = *std::max_element(zs.begin(), zs.end());
  for (auto& v : zs) v -= mx;
  std::vector<float> padded(1025, -INFINITY);
  std::copy(zs.begin(), zs.end(), padded.begin() + 600);
  const LogitsSplit l = logits_split_for(vthreads_for(1025), 8, 528);
  CHECK(l.parts > 1);
  CHECK(split_select(padded, l, true, 0.8f, 0u) == cpu_select_mass(padded, 0.8f, 0u));
  CHECK(split_select(padded, l, true, 0.8f, 0u) == order_key(zs[1]));
}

// The split kernel's select over the logits' keys (radix_key_raw, `passes` passes: 4 for float32 rows),
// replayed as split_select does, the pick turned into z's key (radix_threshold). r: the logits as read
// (NaN, +inf), z their scaled values (logit_value applied); the floor (top-k's threshold under top-p) is
// z's, tested as the kernel does (z < kept_floor(floor_key)).
static uint32_t split_select_raw(const std::vector<float>& r, const std::vector<float>& z, const LogitsSplit& l,
                                 bool by_mass, float goal, uint32_t floor_key, int passes, float m, float t) {
  const int64_t V = static_cast<int64_t>(r.size());
  const float z_floor = kept_floor(floor_key);
  uint32_t prefix = 0;
  int64_t remaining = static_cast<int64_t>(goal);
  unsigned long long above = 0, target = 0;
  for (int pass = 0; pass < passes; ++pass) {
    unsigned counts[kRadixBins] = {};
    unsigned long long mass[kRadixBins] = {};
    for (int64_t part = 0; part < l.parts; ++part) {
      for (int64_t e = 0; e < split_share_entries(l, V); ++e) {
        const int64_t i = split_share_entry(l, part, e);
        if (i >= V) continue;
        const float ri = r[static_cast<size_t>(i)];
        const uint32_t key = passes == 4 ? radix_key_raw<true>(ri) : radix_key_raw<false>(ri);
        if (!radix_match(key, prefix, pass)) continue;
        if (by_mass && z[static_cast<size_t>(i)] < z_floor) continue;
        counts[radix_digit(key, pass)]++;
        mass[radix_digit(key, pass)] += split_fixed_mass(std::exp(z[static_cast<size_t>(i)]));
      }
    }
    const uint32_t d = replay_pick(counts, mass, by_mass, goal, pass, target, above, remaining);
    prefix |= d << (32 - kRadixBits * (pass + 1));
  }
  return radix_threshold(prefix, passes, m, t);
}

static float keep_bits(float v, int low_bits) {  // v with its low mantissa bits cleared (a bfloat16 / float16 value)
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  bits &= ~((1u << low_bits) - 1u);
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

static float half_bits_to_float(uint32_t h) {  // a float16 value, widened
  const uint32_t e = (h >> 10) & 0x1fu, f = h & 0x3ffu;
  float v;
  if (e == 0)
    v = std::ldexp(static_cast<float>(f), -24);
  else if (e == 31)
    v = f != 0 ? NAN : INFINITY;
  else
    v = std::ldexp(static_cast<float>(f | 0x400u), static_cast<int>(e) - 25);
  return (h & 0x8000u) ? -v : v;
}

// radix_key_raw, from the bits as read, equals radix_key of the logit_value for every bfloat16 and float16
// value (NaNs, infinities, zeros, subnormals) and for float32's specials and random bit patterns (FLT_MAX:
// +inf's key); order_key_value inverts order_key so that the CUDA kernels' float compares, z < kept_floor(k)
// for the floor and z >= kept_floor(tau) for the kept set, are the key compares order_key(z) < k and
// order_key(z) >= tau for every z that is no NaN (tau 0: every z).
static void test_radix_key_from_the_bits_as_read() {
  int wrong = 0;
  for (uint32_t h = 0; h < 65536; ++h) {
    const float b = bits_float(h << 16), f = half_bits_to_float(h);
    wrong += radix_key_raw<false>(b) != radix_key(logit_value(b));
    wrong += radix_key_raw<false>(f) != radix_key(logit_value(f));
  }
  CHECK(wrong == 0);
  CHECK(radix_key_raw<false>(half_bits_to_float(0x7c01u)) == radix_key(-INFINITY));  // a float16 NaN: -inf
  std::vector<float> values = {FLT_MAX, -FLT_MAX, INFINITY, -INFINITY, NAN, -NAN, 0.f, -0.f, FLT_MIN, -FLT_MIN,
                               bits_float(1u), bits_float(0x80000001u), 1.f, -1.f};
  std::mt19937 gen(17);
  for (int i = 0; i < 100000; ++i) values.push_back(bits_float(static_cast<uint32_t>(gen())));
  for (const float v : values) wrong += radix_key_raw<true>(v) != radix_key(logit_value(v));
  CHECK(wrong == 0);
  CHECK(radix_key_raw<true>(FLT_MAX) == radix_key_raw<true>(INFINITY));
  std::vector<float> finite;
  for (const float v : values)
    if (v == v) finite.push_back(v);
  for (size_t i = 0; i < finite.size(); ++i) {
    const float z = finite[i], w = finite[(i * 7919u + 13u) % finite.size()];
    wrong += (z < order_key_value(order_key(w))) != (order_key(z) < order_key(w));
    wrong += (z >= kept_floor(order_key(w))) != (order_key(z) >= order_key(w));
    wrong += !(z >= kept_floor(0u));  // tau 0 keeps every entry
    wrong += (z < order_key_value(order_key(z))) || (z < order_key_value(order_key(z) + 1u)) != (z != INFINITY);
  }
  CHECK(wrong == 0);
  CHECK(order_key_value(order_key(-0.f)) == 0.f && !std::signbit(order_key_value(order_key(-0.f))));
}

// The split kernel's select over the keys of bfloat16 (2 passes), float16 (3) and float32 (4) logits finds
// the CPU kernel's thresholds on z: top-k, top-p, top-p above top-k, at temperatures 1, 0.7 and 1e-3 (where
// neighbours of the type differ in probability), with ties, -inf, +inf, NaN, -0.0 and +0.0 in the rows; and
// keeps the ties rounding makes in z (distinct logits, one z).
static void test_split_raw_key_select_matches_the_cpu_selection() {
  std::mt19937 gen(5);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_real_distribution<float> unit(0.f, 1.f);
  const struct { int low_bits, passes; } types[] = {{16, 2}, {13, 3}, {0, 4}};
  int checked = 0;
  for (int trial = 0; trial < 36; ++trial) {
    const auto type = types[trial % 3];
    const int64_t V = trial % 2 ? 5000 : 1025;
    const float t = trial % 4 == 0 ? 1.f : (trial % 4 == 1 ? 0.7f : (trial % 4 == 2 ? 1e-3f : 2.5f));
    std::vector<float> x(static_cast<size_t>(V));
    for (auto& v : x) {
      v = trial % 5 == 4 ? -0.25f * std::floor(unit(gen) * 12.f) : 3.f * normal(gen);  // many ties
      v = keep_bits(v, type.low_bits);
    }
    x[3] = -INFINITY;
    x[7] = NAN;
    x[11] = -0.f;
    x[12] = 0.f;
    if (trial % 4 == 1) x[20] = x[21] = INFINITY;  // +inf takes all the mass (every type)
    if (trial % 4 == 3 && type.low_bits == 0) x[22] = FLT_MAX;  // a float32 row's FLT_MAX: +inf's key
    const std::vector<float> raw = x;
    for (auto& v : x) v = logit_value(v);
    const float m = *std::max_element(x.begin(), x.end());
    std::vector<float> z(x.size());
    for (size_t i = 0; i < x.size(); ++i) z[i] = scaled_logit(x[i], m, t);
    const LogitsSplit l = logits_split_for(vthreads_for(V), 64, 132 * 4);
    for (const int64_t k : {int64_t{1}, int64_t{2}, int64_t{40}, V / 3, V}) {
      std::vector<float> sorted = z;
      std::sort(sorted.begin(), sorted.end(), [](float a, float b) { return a > b; });
      const uint32_t tau_k = split_select_raw(raw, z, l, false, static_cast<float>(k), 0u, type.passes, m, t);
      CHECK(tau_k == order_key(sorted[static_cast<size_t>(k - 1)]));
      CHECK(split_select_raw(raw, z, l, true, 0.9f, tau_k, type.passes, m, t) == cpu_select_mass(z, 0.9f, tau_k));
      ++checked;
    }
    for (const float top_p : {0.05f, 0.5f, 0.99f}) {
      CHECK(split_select_raw(raw, z, l, true, top_p, 0u, type.passes, m, t) == cpu_select_mass(z, top_p, 0u));
      ++checked;
    }
  }
  CHECK(checked == 36 * 8);
  // Distinct bfloat16 logits with one z: next to a max of 1e10, x - m rounds away 1, 2, 3 and 4; T = 1e12
  // leaves them probability 0.99 each. Top-k 2 keeps all four with the max (z's threshold, not the logits').
  std::vector<float> x = {keep_bits(1e10f, 16), 1.f, 2.f, 3.f, 4.f};
  std::vector<float> z(x.size());
  for (size_t i = 0; i < x.size(); ++i) z[i] = scaled_logit(x[i], x[0], 1e12f);
  CHECK(z[1] == z[4] && z[1] > -0.1f);
  const LogitsSplit l = logits_split_for(vthreads_for(5), 1, 528);
  const uint32_t tau = split_select_raw(x, z, l, false, 2.f, 0u, 2, x[0], 1e12f);
  CHECK(tau == order_key(z[4]) && tau == order_key(z[1]));
  CHECK(split_select_raw(x, z, l, true, 0.3f, 0u, 2, x[0], 1e12f) == cpu_select_mass(z, 0.3f, 0u));
  // radix_threshold decodes every key cut to its upper bits: negative values (low bits restored as ones)
  for (const float v : {-3.25f, -1.f, -0.f, 0.f, 0.5f, 7.75f, FLT_MAX, -INFINITY, -FLT_MAX}) {
    for (const auto type : types) {
      const float w = keep_bits(v, type.low_bits);
      const int low = 32 - kRadixBits * type.passes;
      CHECK(radix_threshold((radix_key(w) >> low) << low, type.passes, 8.f, 0.7f) ==
            order_key(scaled_logit(w, 8.f, 0.7f)));
    }
  }
}

// Top-p's early acceptance (logits_split.h top_p_accepts_early): whatever it accepts, the full path (the split
// select over the logits' keys, min-p, the kept mass S summed in the order the sum over every entry took, its
// dropped entries as zeros, and accept_draft on e_x / S) accepts too; and it is no empty promise: it accepts
// most of what the full path does where the draft holds a large share. Rows of bfloat16 and float32 values,
// drafts among the top entries (the second largest too), top_p down to 0.05, min-p excluding the draft, sums
// forward and backward; then the boundary of top_p_keeps_surely swept one float of z at a time.
static void test_top_p_early_acceptance_is_the_selects() {
  std::mt19937 gen(17);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_real_distribution<float> unit(0.f, 1.f);
  int early = 0, exact = 0, early_where_large = 0, exact_where_large = 0;
  for (int trial = 0; trial < 48; ++trial) {
    const bool bf16 = trial % 2 == 0;
    const int64_t V = trial % 3 == 0 ? 5000 : 1025;
    const float t = trial % 4 == 1 ? 0.7f : 1.f;
    std::vector<float> raw(static_cast<size_t>(V));
    for (auto& v : raw) v = keep_bits(2.f * normal(gen), bf16 ? 16 : 0);
    // a few large logits: the draft is one of them (trial % 3: the largest, the second, the third)
    const float spikes[3] = {keep_bits(9.f + unit(gen) * 4.f, bf16 ? 16 : 0), keep_bits(9.f + unit(gen) * 3.f, bf16 ? 16 : 0),
                             keep_bits(7.f + unit(gen) * 3.f, bf16 ? 16 : 0)};
    for (int j = 0; j < 3; ++j) raw[static_cast<size_t>(100 + j)] = spikes[j];
    raw[5] = NAN;
    raw[6] = -INFINITY;
    std::vector<float> x(raw.size()), z(raw.size());
    for (size_t i = 0; i < raw.size(); ++i) x[i] = logit_value(raw[i]);
    const float m = *std::max_element(x.begin(), x.end());
    for (size_t i = 0; i < raw.size(); ++i) z[i] = scaled_logit(x[i], m, t);
    std::vector<int64_t> order(raw.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return z[a] > z[b]; });
    const int64_t draft = order[static_cast<size_t>(trial % 3)];
    const LogitsSplit l = logits_split_for(vthreads_for(V), 64, 132 * 4);
    for (const float top_p : {0.05f, 0.5f, 0.9f, 0.99f}) {
      const uint32_t tau_p = split_select_raw(raw, z, l, true, top_p, 0u, bf16 ? 2 : 4, m, t);
      for (const float min_p : {0.f, 0.5f}) {
        const RowSampling s = row_sampling(&t, nullptr, &top_p, &min_p, 0, V);
        const uint32_t tau = std::max(tau_p, min_p_key(s.min_p));
        for (int dir = 0; dir < 2; ++dir) {
          float all = 0.f, kept = 0.f;
          for (int64_t j = 0; j < V; ++j) {
            const size_t i = static_cast<size_t>(dir == 0 ? j : V - 1 - j);
            all += sum_exp_f(z[i]);
            kept += order_key(z[i]) >= tau ? sum_exp_f(z[i]) : 0.f;
          }
          const float e_x = exp_f(z[static_cast<size_t>(draft)]);
          const bool large = e_x > 0.15f * all;
          for (int k = 0; k < 40; ++k) {
            const float u = (static_cast<float>(k) + unit(gen)) / 40.f;
            const float q = k % 4 == 3 ? unit(gen) : 1.f;
            const bool full = accept_draft(u, processed_prob(e_x, order_key(z[static_cast<size_t>(draft)]), tau, kept), q);
            const bool fast = top_p_accepts_early(u, q, x[static_cast<size_t>(draft)], m, all, s, V);
            CHECK(!fast || full);
            early += fast;
            exact += full;
            if (large && min_p == 0.f && top_p >= 0.5f) {
              early_where_large += fast;
              exact_where_large += full;
            }
          }
        }
      }
    }
  }
  CHECK(exact > 1000 && early > exact / 3);
  CHECK(exact_where_large > 500 && early_where_large * 10 > exact_where_large * 8);  // > 80% of them early
  // top-k rows, greedy rows, top-p off: never early
  const float one = 1.f, zero = 0.f, half = 0.5f;
  const int64_t k2 = 2;
  CHECK(!top_p_accepts_early(0.f, 1.f, 0.f, 0.f, 1.f, row_sampling(&one, &k2, &half, nullptr, 0, 5), 5));
  CHECK(!top_p_accepts_early(0.f, 1.f, 0.f, 0.f, 1.f, row_sampling(&zero, nullptr, &half, nullptr, 0, 5), 5));
  CHECK(!top_p_accepts_early(0.f, 1.f, 0.f, 0.f, 1.f, row_sampling(&one, nullptr, &one, nullptr, 0, 5), 5));
  CHECK(top_p_accepts_early(0.f, 1.f, 0.f, 0.f, 1.f, row_sampling(&one, nullptr, &half, nullptr, 0, 5), 5));

  // Where top-p keeps the whole row the two sums are one: early and full decide alike for every u, also
  // the floats next to p(x) = 1/3 (two entries, 1 and 1/2; u * q < p, not <=).
  {
    std::vector<float> r(1025, -INFINITY);
    r[0] = 0.f;
    r[1] = std::log(0.5f);
    const float top_p = 0.99f;
    const RowSampling s = row_sampling(&one, nullptr, &top_p, nullptr, 0, 1025);
    const LogitsSplit l = logits_split_for(vthreads_for(1025), 8, 528);
    const uint32_t tau = split_select_raw(r, r, l, true, top_p, 0u, 4, 0.f, 1.f);
    const float e = exp_f(r[1]), all = 1.f + e;
    CHECK(order_key(r[1]) >= tau && top_p_keeps_surely(e, all, top_p, 1025));
    float u = e / all;
    for (int i = 0; i < 200; ++i) u = std::nextafter(u, 0.f);
    int accepted = 0;
    for (int i = 0; i < 400; ++i, u = std::nextafter(u, 1.f)) {
      const bool full = accept_draft(u, processed_prob(e, order_key(r[1]), tau, all), 1.f);
      CHECK(top_p_accepts_early(u, 1.f, r[1], 0.f, all, s, 1025) == full);
      accepted += full;
    }
    CHECK(accepted == 200);
  }
  // The boundary: the largest entry (z = 0) and the draft a = e^z below it, the rest of the row -inf. The
  // select keeps the draft exactly when 1 < top_p (1 - slack) (1 + a); sweep z one float at a time across it.
  for (const float top_p : {0.9f, 0.7f}) {
    const int64_t V = 1025;
    const float a_star = 1.f / top_p - 1.f;
    std::vector<float> r(static_cast<size_t>(V), -INFINITY);
    r[0] = 0.f;
    const LogitsSplit l = logits_split_for(vthreads_for(V), 8, 528);
    int kept_exactly = 0, kept_surely = 0;
    float z_x = std::log(a_star);
    for (int i = 0; i < 400; ++i) z_x = std::nextafter(z_x, -INFINITY);
    for (; exp_f(z_x) < a_star * 1.002f; z_x = std::nextafter(z_x, INFINITY)) {
      r[1] = z_x;
      const uint32_t tau = split_select_raw(r, r, l, true, top_p, 0u, 4, 0.f, 1.f);
      const bool keeps = order_key(z_x) >= tau;
      const float e = exp_f(z_x);
      const bool sure = top_p_keeps_surely(e, 1.f + e, top_p, V);
      CHECK(!sure || keeps);
      kept_exactly += keeps;
      kept_surely += sure;
      if (e > a_star * 1.001f) CHECK(sure);  // a margin under 0.1% (gamma is 6e-5 at V = 1025)
    }
    CHECK(kept_exactly > kept_surely && kept_surely > 0);
  }
}

// A sum of per-entry terms in the split kernel's order (that of the single-block kernel: virtual thread t adds
// entries t, t + vthreads, ... in turn, then the shuffle trees).
static float vthread_order_sum(const std::vector<float>& terms, int vthreads) {
  const int64_t V = static_cast<int64_t>(terms.size());
  std::vector<float> warp_sums(32, 0.f);
  for (int w = 0; w < vthreads / 32; ++w) {
    std::vector<float> lanes(32);
    for (int lane = 0; lane < 32; ++lane) {
      float part = 0.f;
      for (int64_t i = 32 * w + lane; i < V; i += vthreads) part += terms[static_cast<size_t>(i)];
      lanes[lane] = part;
    }
    warp_sums[w] = shfl_down_tree(lanes);
  }
  return shfl_down_tree(warp_sums);
}

// The early bonus token's verdict (logits_split.h top_p_verdict_above) against the replayed split select: keeps
// only entries the select keeps, drops only entries it drops, for entries on both sides of top-p's cut (the
// last kept ones, the first dropped ones, ties among bfloat16 logits) and anywhere in the row, with the sums'
// terms off exp_f by as much as __expf may be, and is rarely unsure away from the cut. Then one entry swept across the cut in steps of 16 floats: sure wherever the mass
// above it is more than 2e-4 away from top-p's target, relative.
static void test_top_p_verdict_above_is_the_selects() {
  std::mt19937 gen(23);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_int_distribution<int64_t> pick(0, 1 << 30);
  int keeps = 0, drops = 0, checked = 0, random_unsure = 0, random_checked = 0;
  for (int trial = 0; trial < 24; ++trial) {
    const bool bf16 = trial % 2 == 0;
    const int64_t V = trial % 3 == 0 ? 20000 : (trial % 3 == 1 ? 1025 : 5000);
    std::vector<float> raw(static_cast<size_t>(V));
    const float scale = trial % 4 < 2 ? 1.f : 3.f;  // flat rows and peaked ones
    for (auto& v : raw) v = keep_bits(scale * normal(gen), bf16 ? 16 : 0);
    raw[5] = NAN;
    raw[6] = -INFINITY;
    std::vector<float> z(raw.size()), terms(raw.size());
    float m = -INFINITY;
    for (const float r : raw) m = std::max(m, logit_value(r));
    for (size_t i = 0; i < raw.size(); ++i) z[i] = logit_value(raw[i]) - m;  // temperature 1
    // The GPU's terms: ex2.approx, within (2 + 1.173 |z|) ulp of exp (the verdict's bound), here all pushed
    // up, all down, or each either way (the same term in both sums, as the kernel computes it).
    const int bias = trial % 3 - 1;
    std::uniform_real_distribution<double> sign(-1.0, 1.0);
    for (size_t i = 0; i < raw.size(); ++i) {
      const double ulps = (2.0 + 1.173 * std::fabs(static_cast<double>(z[i]))) * 1.1920928955078125e-07;
      const double d = bias != 0 ? bias * ulps : sign(gen) * ulps;
      terms[i] = z[i] >= -87.f ? static_cast<float>(static_cast<double>(exp_f(z[i])) * (1.0 + d)) : 0.f;
    }
    const int vthreads = vthreads_for(V);
    const int64_t depth = (V + vthreads - 1) / vthreads + 10;
    const float all = vthread_order_sum(terms, vthreads);
    std::vector<int64_t> order(raw.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return z[a] > z[b]; });
    const LogitsSplit l = logits_split_for(vthreads, 64, 132 * 4);
    for (const float top_p : {0.05f, 0.5f, 0.9f, 0.99f}) {
      const uint32_t tau = split_select_raw(raw, z, l, true, top_p, 0u, bf16 ? 2 : 4, m, 1.f);
      int64_t cut = 0;  // entries the select keeps: a prefix of `order`
      while (cut < V && order_key(z[static_cast<size_t>(order[static_cast<size_t>(cut)])]) >= tau) ++cut;
      std::vector<int64_t> ws;
      for (int64_t d = -4; d <= 4; ++d)
        if (cut + d >= 0 && cut + d < V) ws.push_back(order[static_cast<size_t>(cut + d)]);
      const size_t next_to_cut = ws.size();
      for (int j = 0; j < 24; ++j) ws.push_back(pick(gen) % V);
      for (size_t n = 0; n < ws.size(); ++n) {
        const int64_t w = ws[n];
        const float z_w = z[static_cast<size_t>(w)];
        if (std::isnan(raw[static_cast<size_t>(w)])) continue;  // never a race's winner
        std::vector<float> above_terms(terms.size());
        for (size_t i = 0; i < terms.size(); ++i) above_terms[i] = z[i] > z_w ? terms[i] : 0.f;
        const float above = vthread_order_sum(above_terms, vthreads);
        const bool kept = order_key(z_w) >= tau;
        const int v = top_p_verdict_above(above, all, top_p, V, depth);
        CHECK(v != kTopPKeeps || kept);
        CHECK(v != kTopPDrops || !kept);
        keeps += v == kTopPKeeps;
        drops += v == kTopPDrops;
        ++checked;
        if (n >= next_to_cut) {
          random_unsure += v == kTopPUnsure;
          ++random_checked;
        }
      }
    }
  }
  CHECK(keeps > checked / 5 && drops > checked / 5);
  CHECK(random_unsure * 100 < random_checked);
  // The cut: the largest entry (z = 0), w = e^z below it and 1000 entries at z = -7 (mass 0.91), the rest -inf.
  // The select keeps w exactly when 1 < top_p (1 - slack) (1 + a + 0.91), a = e^z_w: sweep z_w across it, with
  // the sums' terms all as far above exp_f as __expf may be, then all as far below.
  for (const float top_p : {0.9f, 0.7f})
  for (const int bias : {-1, 1}) {
    const int64_t V = 1025;
    std::vector<float> r(static_cast<size_t>(V), -INFINITY);
    r[0] = 0.f;
    double small = 0.0;
    for (int i = 2; i < 102; ++i) {
      r[static_cast<size_t>(i)] = -7.f;
      small += exp_f(-7.f);
    }
    const float a_star = static_cast<float>(1.0 / top_p - 1.0 - small);
    const auto term = [&](float z) {
      const double ulps = (2.0 + 1.173 * std::fabs(static_cast<double>(z))) * 1.1920928955078125e-07;
      return z >= -87.f ? static_cast<float>(static_cast<double>(exp_f(z)) * (1.0 + bias * ulps)) : 0.f;
    };
    const int vthreads = vthreads_for(V);
    const LogitsSplit l = logits_split_for(vthreads, 8, 528);
    const int64_t depth = (V + vthreads - 1) / vthreads + 10;
    std::vector<float> all_terms(r.size()), above_terms(r.size(), 0.f);
    // -> the verdict at z_w = z_x, checked against the select; `kept` and `ratio` (M(>w) / target) out
    const auto check_at = [&](float z_x, bool& kept, double& ratio) {
      r[1] = z_x;
      const uint32_t tau = split_select_raw(r, r, l, true, top_p, 0u, 4, 0.f, 1.f);
      kept = order_key(z_x) >= tau;
      for (size_t i = 0; i < r.size(); ++i) all_terms[i] = term(r[i]);
      above_terms[0] = all_terms[0];
      const int v = top_p_verdict_above(vthread_order_sum(above_terms, vthreads), vthread_order_sum(all_terms, vthreads),
                                        top_p, V, depth);
      CHECK(v != kTopPKeeps || kept);
      CHECK(v != kTopPDrops || !kept);
      ratio = 1.0 / (static_cast<double>(top_p) * (1.0 - kTopPSlack) * (1.0 + exp_f(z_x) + small));
      return v;
    };
    // Across +-0.4% in steps of 16 floats: sure wherever M(>w) is 2e-4 off the target; then a float at a time
    // around the cut.
    int kept_exactly = 0, sure_keeps = 0, sure_drops = 0, steps = 0;
    float first_kept = NAN;
    for (float z_x = std::log(a_star * 0.996f); exp_f(z_x) < a_star * 1.004f; ++steps) {
      bool kept;
      double ratio;
      const int v = check_at(z_x, kept, ratio);
      if (ratio < 1.0 - 2e-4) CHECK(v == kTopPKeeps);
      if (ratio > 1.0 + 2e-4) CHECK(v == kTopPDrops);
      if (kept && std::isnan(first_kept)) first_kept = z_x;
      kept_exactly += kept;
      sure_keeps += v == kTopPKeeps;
      sure_drops += v == kTopPDrops;
      for (int i = 0; i < 16; ++i) z_x = std::nextafter(z_x, INFINITY);
    }
    CHECK(kept_exactly > sure_keeps && sure_keeps > 0 && steps - kept_exactly > sure_drops && sure_drops > 0);
    CHECK(!std::isnan(first_kept));
    float z_x = first_kept;
    for (int i = 0; i < 600; ++i) z_x = std::nextafter(z_x, -INFINITY);
    for (int i = 0; i < 1200; ++i, z_x = std::nextafter(z_x, INFINITY)) {
      bool kept;
      double ratio;
      check_at(z_x, kept, ratio);
    }
  }
  // Never sure past its preconditions.
  CHECK(top_p_verdict_above(0.f, 1.f, 1.f, 5, 11) == kTopPUnsure);
  CHECK(top_p_verdict_above(0.f, 0.f, 0.5f, 5, 11) == kTopPUnsure);
  CHECK(top_p_verdict_above(NAN, 1.f, 0.5f, 5, 11) == kTopPUnsure);
  CHECK(top_p_verdict_above(0.f, 1.f, 0.5f, int64_t{1} << 22, 11) == kTopPUnsure);
  CHECK(top_p_verdict_above(0.f, 1.f, 0.5f, 5, 11) == kTopPKeeps);
  CHECK(top_p_verdict_above(1.f, 1.5f, 0.5f, 5, 11) == kTopPDrops);
}

// The split kernel's 64-bit bin masses added as two 32-bit words (split_add_u64, atomicAdd on the device):
// exact in any order, carries included, against plain 64-bit sums.
static void test_split_two_word_mass_sums_exactly() {
  std::mt19937_64 gen(11);
  const auto add32 = [](unsigned* w, unsigned x) {
    const unsigned old = *w;
    *w = old + x;
    return old;
  };
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<unsigned long long> values(1 + gen() % 400);
    for (auto& v : values) {  // masses near the 32-bit boundary, tiny ones and single-entry maxima (2^40)
      const int kind = static_cast<int>(gen() % 4);
      v = kind == 0 ? gen() % (1ull << 41) : kind == 1 ? 0xFFFFFFFFull - gen() % 16 : kind == 2 ? gen() % 8 : 1ull << 40;
    }
    unsigned long long want = 0;
    for (const auto v : values) want += v;
    for (int order = 0; order < 2; ++order) {
      unsigned lo = 0, hi = 0;
      for (const auto v : values) split_add_u64(&lo, &hi, v, add32);
      CHECK(split_join_u64(lo, hi) == want);
      std::shuffle(values.begin(), values.end(), gen);
    }
  }
  unsigned lo = 0xFFFFFFFFu, hi = 0;  // one carry exactly at the boundary
  split_add_u64(&lo, &hi, 1ull, add32);
  CHECK(lo == 0u && hi == 1u);
  split_add_u64(&lo, &hi, 0xFFFFFFFFull, add32);  // no carry: lo ends at 2^32 - 1
  CHECK(lo == 0xFFFFFFFFu && hi == 1u);
}

int main() {
  test_split_two_word_mass_sums_exactly();
  test_logit_value_sanitizes();
  test_order_key_preserves_order();
  test_row_sampling_clamps_bad_values();
  test_radix_select_finds_kth_largest_with_ties();
  test_radix_mass_select_is_smallest_reaching_set();
  test_radix_pick_skips_empty_bins();
  test_request_rows_clamp_bad_lengths();
  test_request_rows_without_bonus_rows();
  test_engine_keyword_helpers();
  test_split_chain_kernel_replays_single_block();
  test_split_radix_select_matches_the_cpu_selection();
  test_radix_key_from_the_bits_as_read();
  test_split_raw_key_select_matches_the_cpu_selection();
  test_top_p_early_acceptance_is_the_selects();
  test_top_p_verdict_above_is_the_selects();
  TEST_MAIN_END();
}
