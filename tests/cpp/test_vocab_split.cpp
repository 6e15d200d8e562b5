// Host replay of the CUDA sampling kernels' vocab split (csrc/common/vocab_split.h):
// every row is cut into parts (thread blocks), each part into strided threads with
// several groups per step, exactly as rejection_kernels.cu walks them; the merged
// partial races and argmaxes must equal the single-pass results of the CPU kernel
// (full race without skipping, then the fallback race over p when the residual is
// empty) for many seeds and shapes. No torch needed.
#include <cmath>
#include <cstdint>
#include <vector>

#include "check.h"
#include "common/philox.h"
#include "common/sampling_math.h"
#include "common/vocab_split.h"

using namespace specdec;

namespace {

uint32_t g_state = 2024;
uint32_t next_u32() {
  g_state = g_state * 1664525u + 1013904223u;
  return g_state;
}
float next_unit() { return static_cast<float>(next_u32() >> 8) / 16777216.f; }

// The single-pass race of the CPU kernel, without skipping: residual (q given) with
// the fallback to p when the residual is empty, or the bonus race over p.
int64_t single_pass_race(const std::vector<float>& p, const std::vector<float>* q, uint64_t seed, uint32_t purpose) {
  auto race = [&](bool use_residual) {
    ArgMax best = argmax_init();
    for (size_t i = 0; i < p.size(); ++i) {
      const uint32_t bits = philox_block(seed, 11, 3, purpose, static_cast<uint32_t>(i >> 2)).x[i & 3];
      const float mass = use_residual ? residual_mass(p[i], (*q)[i]) : prob_mass(p[i]);
      argmax_update(best, mass > 0.f ? mass / exp_noise(bits) : 0.f, static_cast<int64_t>(i));
    }
    return best;
  };
  if (q != nullptr) {
    const ArgMax r = race(true);
    if (r.score > 0.f) return r.index;
  }
  return race(false).index;
}

// The split race: parts x threads x (unroll groups per step), merged in a scrambled order.
// The threads of a part run in lock step, as a warp does; after each group the active
// threads of every warp of `warp` threads raise their bars to the highest among them
// (cuda::warp_raise_bar: the residual's bar, or the bonus race's), unless warp is 1.
int64_t split_race(const std::vector<float>& p, const std::vector<float>* q, uint64_t seed, uint32_t purpose,
                   int64_t parts, int64_t threads, int64_t unroll, int64_t warp = 1) {
  const int64_t vocab = static_cast<int64_t>(p.size());
  std::vector<ResidualRace> part_results;
  for (int64_t part = 0; part < parts; ++part) {
    const GroupRange range = vocab_part(vocab, parts, part);
    std::vector<ResidualRace> mine(threads, residual_race_init());
    for (int64_t g0 = range.begin; g0 < range.end; g0 += unroll * threads) {
      for (int64_t k = 0; k < unroll; ++k) {
        std::vector<bool> active(threads, false);
        for (int64_t t = threads - 1; t >= 0; --t) {
          const int64_t g = g0 + t + k * threads;
          if (g >= range.end) continue;
          active[t] = true;
          const Philox4 bits = philox_block(seed, 11, 3, purpose, static_cast<uint32_t>(g));
          for (int j = 0; j < 4; ++j) {
            const int64_t i = 4 * g + j;
            if (i >= vocab) break;
            if (q != nullptr) residual_race_update(mine[t], p[i], (*q)[i], bits.x[j], i);
            else bonus_race_update(mine[t], p[i], bits.x[j], i);
          }
        }
        for (int64_t w0 = 0; warp > 1 && w0 < threads; w0 += warp) {
          auto bar = [&](int64_t t) -> float& { return q != nullptr ? mine[t].residual_bar : mine[t].fallback_bar; };
          float top = -1.f;
          for (int64_t t = w0; t < w0 + warp && t < threads; ++t)
            if (active[t] && bar(t) > top) top = bar(t);
          for (int64_t t = w0; t < w0 + warp && t < threads; ++t)
            if (active[t]) bar(t) = top;
        }
      }
    }
    ResidualRace block = residual_race_init();
    for (int64_t t = threads - 1; t >= 0; --t) block = residual_race_merge(block, mine[t]);  // order must not matter
    part_results.push_back(block);
  }
  ResidualRace all = residual_race_init();
  for (size_t s = part_results.size(); s-- > 0;) all = residual_race_merge(part_results[s], all);
  return residual_race_winner(all);
}

int64_t split_argmax(const std::vector<float>& p, int64_t parts, int64_t threads) {
  const int64_t vocab = static_cast<int64_t>(p.size());
  ArgMax all = argmax_init();
  for (int64_t part = parts - 1; part >= 0; --part) {
    const GroupRange range = vocab_part(vocab, parts, part);
    for (int64_t t = 0; t < threads; ++t) {
      ArgMax mine = argmax_init();
      for (int64_t g = range.begin + t; g < range.end; g += threads)
        for (int64_t i = 4 * g; i < 4 * g + 4 && i < vocab; ++i) argmax_update_ascending(mine, prob_mass(p[i]), i);
      all = argmax_merge(mine, all);
    }
  }
  return all.index;
}

void test_vocab_parts_cover_the_row_once() {
  for (int64_t vocab = 1; vocab < 200; vocab += 7) {
    for (int64_t parts = 1; parts < 40; parts += 3) {
      int64_t next = 0;
      for (int64_t part = 0; part < parts; ++part) {
        const GroupRange r = vocab_part(vocab, parts, part);
        CHECK(r.begin <= r.end);
        if (r.begin < r.end) {
          CHECK(r.begin == next);
          next = r.end;
        }
      }
      CHECK(next == vocab_groups(vocab));
    }
  }
  CHECK(vocab_parts_for(64, 128256, 396, 256) == 6);   // fills 132 SMs x 3 blocks without a second wave
  CHECK(vocab_parts_for(1, 128256, 396, 256) == 125);  // capped: every block keeps a group per thread
  CHECK(vocab_parts_for(4096, 128256, 396, 256) == 1);
  CHECK(vocab_parts_for(8, 10, 396, 256) == 1);
}

void test_split_race_equals_single_pass() {
  int fallbacks = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int64_t vocab = 1 + static_cast<int64_t>(next_u32() % 2000);
    const int shape = trial % 5;  // flat, peaked, sparse, q == p (empty residual), NaN / negative entries
    std::vector<float> p(vocab), q(vocab);
    for (int64_t i = 0; i < vocab; ++i) {
      const float r = next_unit();
      p[i] = shape == 1 ? std::pow(r, 12.f) : shape == 2 ? ((next_u32() & 7) == 0 ? r : 0.f) : r;
      q[i] = shape == 3 ? p[i] : next_unit() * (shape == 2 ? 0.2f : 1.f);
      if (shape == 4 && (next_u32() & 15) == 0) p[i] = (next_u32() & 1) ? NAN : -r;
    }
    std::vector<float> one_hot(vocab, 0.f);
    one_hot[next_u32() % vocab] = 1.f;
    const uint64_t seed = next_u32() | (static_cast<uint64_t>(next_u32()) << 32);
    const int64_t parts = 1 + static_cast<int64_t>(next_u32() % 9);
    const int64_t threads = 1 + static_cast<int64_t>(next_u32() % 64);
    const int64_t unroll = 1 + static_cast<int64_t>(next_u32() % 3);
    const int64_t warp = 1 + static_cast<int64_t>(next_u32() % 32);
    for (const std::vector<float>* qq : {&q, &one_hot}) {
      const int64_t want = single_pass_race(p, qq, seed, kPurposeResidual);
      CHECK(split_race(p, qq, seed, kPurposeResidual, parts, threads, unroll) == want);
      CHECK(split_race(p, qq, seed, kPurposeResidual, parts, threads, unroll, warp) == want);
    }
    const int64_t want = single_pass_race(p, nullptr, seed, kPurposeBonus);
    CHECK(split_race(p, nullptr, seed, kPurposeBonus, parts, threads, unroll) == want);
    CHECK(split_race(p, nullptr, seed, kPurposeBonus, parts, threads, unroll, warp) == want);
    ArgMax full = argmax_init();
    for (int64_t i = 0; i < vocab; ++i) argmax_update(full, prob_mass(p[i]), i);
    CHECK(split_argmax(p, parts, threads) == full.index);
    if (shape == 3) ++fallbacks;
  }
  CHECK(fallbacks > 0);  // the empty-residual fallback was exercised
  // Ties: many entries share the maximum; the first index must win however the row is split.
  for (int trial = 0; trial < 50; ++trial) {
    const int64_t vocab = 50 + static_cast<int64_t>(next_u32() % 3000);
    std::vector<float> p(vocab);
    for (int64_t i = 0; i < vocab; ++i) p[i] = (next_u32() % 5 == 0) ? 0.5f : 0.25f * next_unit();
    int64_t first = 0;
    while (p[first] != 0.5f && first + 1 < vocab) ++first;
    if (p[first] != 0.5f) continue;
    CHECK(split_argmax(p, 1 + next_u32() % 9, 1 + next_u32() % 64) == first);
  }
}

// A row whose residual is empty except for one entry near the end: parts that see
// no residual mass keep complete fallbacks, the part that sees it wins.
void test_fallback_is_unused_when_any_part_has_residual_mass() {
  std::vector<float> p(1000, 0.001f), q(1000, 0.001f);
  q[998] = 0.f;
  for (int64_t parts = 1; parts <= 8; ++parts) {
    CHECK(split_race(p, &q, 5, kPurposeResidual, parts, 32, 2) == 998);
    CHECK(split_race(p, &q, 5, kPurposeResidual, parts, 32, 2, 8) == 998);  // warps of 8 share residual bars
  }
  q[998] = 0.001f;  // now empty everywhere: the fallback over p
  const int64_t want = single_pass_race(p, &q, 5, kPurposeResidual);
  for (int64_t parts = 1; parts <= 8; ++parts) {
    CHECK(split_race(p, &q, 5, kPurposeResidual, parts, 32, 2) == want);
    CHECK(split_race(p, &q, 5, kPurposeResidual, parts, 32, 2, 8) == want);
  }
}

// The division-free skip test at the edges of float32: subnormal and huge masses,
// infinite masses (score inf, first index wins the tie), mixed magnitudes.
void test_race_skip_at_float_edges_never_changes_the_winner() {
  const float scales[] = {1e-44f, 1e-38f, 1e-31f, 1e-29f, 1.f, 1e30f, 3e38f};
  for (int trial = 0; trial < 300; ++trial) {
    const int n = 1 + static_cast<int>(next_u32() % 600);
    std::vector<float> mass(n);
    for (int i = 0; i < n; ++i) {
      mass[i] = next_unit() * scales[next_u32() % 7];
      if (trial % 10 == 0 && (next_u32() & 63) == 0) mass[i] = INFINITY;
    }
    ArgMax full = argmax_init(), skipping = argmax_init();
    for (int i = 0; i < n; ++i) {
      const uint32_t bits = philox_block(trial, 1, 2, kPurposeBonus, static_cast<uint32_t>(i >> 2)).x[i & 3];
      argmax_update(full, mass[i] > 0.f ? mass[i] / exp_noise(bits) : 0.f, i);
      race_update(skipping, mass[i], bits, i);
    }
    CHECK(full.index == skipping.index);
    CHECK(full.score == skipping.score);
  }
  CHECK(!race_may_win(1.f, 0.5f, INFINITY));      // finite mass cannot beat an infinite score
  CHECK(race_may_win(INFINITY, 0.5f, INFINITY));  // an infinite one can tie (first index wins)
  CHECK(race_may_win(1e-40f, 1e-7f, 1e-39f));     // tiny scores are never skipped
}

}  // namespace

int main() {
  test_race_skip_at_float_edges_never_changes_the_winner();
  test_vocab_parts_cover_the_row_once();
  test_split_race_equals_single_pass();
  test_fallback_is_unused_when_any_part_has_residual_mass();
  TEST_MAIN_END();
}
