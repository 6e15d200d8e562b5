// Host-side tests of the helpers the CPU and CUDA sampling kernels share
// (csrc/common/philox.h, csrc/common/sampling_math.h). No torch needed.
#include <cmath>
#include <cstdint>

#include "check.h"
#include "common/philox.h"
#include "rejection/rejection_params.h"
#include "common/sampling_math.h"

using namespace specdec;

static void test_philox_known_answers() {
  // Random123 known-answer vectors for Philox4x32-10.
  const Philox4 zero = philox4x32_10(0, 0, 0, 0, 0, 0);
  CHECK(zero.x[0] == 0x6627E8D5u && zero.x[1] == 0xE169C58Du && zero.x[2] == 0xBC57AC4Cu && zero.x[3] == 0x9B00DBD8u);
  const uint32_t f = 0xFFFFFFFFu;
  const Philox4 ones = philox4x32_10(f, f, f, f, f, f);
  CHECK(ones.x[0] == 0x408F276Du && ones.x[1] == 0x41C83B0Eu && ones.x[2] == 0xA20BC7C6u && ones.x[3] == 0x6D5451FDu);
}

// The GPU's uniforms come from float bits (philox.h bits_to_uniform_from_mantissa): equal to the integer
// formula for every one of the 2^23 values of k (the low 9 bits are dropped: a pattern of them with each k),
// and 1 - u, which the logits race's skip test takes as fma(-c, u, c), exact in float.
static void test_uniform_from_mantissa_is_the_integer_formula() {
  int bad = 0, bad_complement = 0;
  for (uint32_t k = 0; k < (1u << 23); ++k) {
    const uint32_t bits = (k << 9) | ((k * 2654435761u) & 0x1ffu);
    const float u = static_cast<float>((k << 1) | 1u) * 5.9604644775390625e-08f;
    bad += bits_to_uniform_from_mantissa(bits) != u;
    bad_complement += static_cast<double>(1.f - u) != 1.0 - static_cast<double>(u);
  }
  CHECK(bad == 0);
  CHECK(bad_complement == 0);
  CHECK(bits_to_uniform_from_mantissa(0u) == bits_to_uniform(0u));
  CHECK(bits_to_uniform_from_mantissa(0xFFFFFFFFu) == bits_to_uniform(0xFFFFFFFFu));
}

// Round keys held across a loop (philox4x32_10_keyed, philox_block_keyed) give philox4x32_10's numbers.
static void test_keyed_philox_is_philox() {
  uint32_t s = 12345u;
  const auto next = [&]() { return s = s * 1664525u + 1013904223u; };
  for (int i = 0; i < 1000; ++i) {
    const uint32_t c[4] = {next(), next(), next(), next()}, k0 = next(), k1 = next();
    const Philox4 a = philox4x32_10(c[0], c[1], c[2], c[3], k0, k1);
    const Philox4 b = philox4x32_10_keyed(c[0], c[1], c[2], c[3], philox_keys(k0, k1));
    for (int j = 0; j < 4; ++j) CHECK(a.x[j] == b.x[j]);
  }
  const uint64_t seed = 0x0123456789abcdefull, offset = 0xfedcba987ull;
  for (uint32_t g = 0; g < 64; ++g) {
    const Philox4 a = philox_block(seed, offset, 3, kPurposeResidual, g);
    const Philox4 b = philox_block_keyed(philox_block_keys(seed), offset, 3, kPurposeResidual, g);
    for (int j = 0; j < 4; ++j) CHECK(a.x[j] == b.x[j]);
  }
}

static void test_uniform_range_and_layout() {
  CHECK(bits_to_uniform(0u) > 0.f);
  CHECK(bits_to_uniform(0xFFFFFFFFu) < 1.f);
  CHECK(bits_to_uniform(0u) == 5.9604644775390625e-08f);
  // Index i uses word i % 4 of block i / 4.
  const Philox4 block = philox_block(123, 456, 7, kPurposeResidual, 2);
  for (uint32_t j = 0; j < 4; ++j)
    CHECK(philox_uniform(123, 456, 7, kPurposeResidual, 8 + j) == bits_to_uniform(block.x[j]));
  // Purposes and offsets give different streams.
  CHECK(philox_uniform(1, 0, 0, kPurposeAccept, 0) != philox_uniform(1, 0, 0, kPurposeBonus, 0));
  CHECK(philox_uniform(1, 0, 0, kPurposeAccept, 0) != philox_uniform(1, 1, 0, kPurposeAccept, 0));
  CHECK(philox_uniform(1, 0, 0, kPurposeAccept, 0) != philox_uniform(1, uint64_t(1) << 32, 0, kPurposeAccept, 0));
  double sum = 0;
  for (uint32_t i = 0; i < 100000; ++i) sum += philox_uniform(9, 9, 1, kPurposeBonus, i);
  CHECK(std::fabs(sum / 100000 - 0.5) < 0.01);
}

static void test_mass_and_acceptance() {
  CHECK(prob_mass(NAN) == 0.f);
  CHECK(prob_mass(-0.5f) == 0.f);
  CHECK(prob_mass(0.25f) == 0.25f);
  CHECK(accept_draft(0.5f, 0.3f, 0.5f));    // 0.25 < 0.3
  CHECK(!accept_draft(0.7f, 0.3f, 0.5f));   // 0.35 >= 0.3
  CHECK(!accept_draft(0.1f, 0.f, 1.f));     // p(x) = 0 never accepted
  CHECK(!accept_draft(0.1f, NAN, 1.f));
  CHECK(accept_draft(0.9f, 0.1f, 0.f));     // q(x) = 0 < p(x): always accepted
  CHECK(residual_mass(0.5f, 0.2f) == 0.5f - 0.2f);
  CHECK(residual_mass(0.2f, 0.5f) == 0.f);
  CHECK(residual_mass(NAN, 0.5f) == 0.f);
  CHECK(exp_noise(0u) > 0.f && std::isfinite(exp_noise(0u)));
  CHECK(exp_noise(0xFFFFFFFFu) > 0.f);
}

// race_update skips the log of entries that provably cannot win: the winner must be
// exactly the one of the full race (argmax mass / -log(u), first index on ties).
static void test_race_skipping_never_changes_the_winner() {
  uint32_t state = 12345;
  auto next = [&]() {
    state = state * 1664525u + 1013904223u;
    return state;
  };
  for (int trial = 0; trial < 300; ++trial) {
    const int n = 1 + static_cast<int>(next() % 5000);
    const int shape = trial % 3;  // flat, peaked, sparse rows
    float mass[5000];
    for (int i = 0; i < n; ++i) {
      const float r = static_cast<float>(next() >> 8) / 16777216.f;
      mass[i] = shape == 0 ? r : shape == 1 ? std::pow(r, 12.f) : ((next() & 7) == 0 ? r : 0.f);
    }
    ArgMax full = argmax_init(), skipping = argmax_init();
    for (int i = 0; i < n; ++i) {
      const Philox4 b = philox_block(trial, 7, 3, kPurposeResidual, static_cast<uint32_t>(i >> 2));
      const uint32_t bits = b.x[i & 3];
      argmax_update(full, mass[i] > 0.f ? mass[i] / exp_noise(bits) : 0.f, i);
      race_update(skipping, mass[i], bits, i);
    }
    CHECK(full.index == skipping.index);
    CHECK(full.score == skipping.score);
  }
  CHECK(race_may_win(0.5f, 0.1f, -1.f));         // no best yet: always compute
  CHECK(!race_may_win(0.001f, 0.5f, 10.f));      // t = 1e-4: u must exceed ~0.9999 to matter
  CHECK(race_may_win(0.001f, 0.99999f, 10.f));
  CHECK(race_may_win(20.f, 0.01f, 10.f));        // t > 1: never skipped
}

static void test_argmax_first_index_on_ties() {
  ArgMax best = argmax_init();
  argmax_update(best, 0.f, 5);
  CHECK(best.index == 5);
  argmax_update(best, 0.f, 3);
  CHECK(best.index == 3);
  argmax_update(best, 0.f, 4);
  CHECK(best.index == 3);
  argmax_update(best, 1.f, 9);
  CHECK(best.index == 9);
  CHECK(argmax_merge(ArgMax{1.f, 7}, ArgMax{1.f, 2}).index == 2);
  CHECK(argmax_merge(ArgMax{2.f, 7}, ArgMax{1.f, 2}).index == 7);
  CHECK(argmax_merge(argmax_init(), ArgMax{0.f, 0}).index == 0);
}

static void test_request_rows_clamp_bad_lengths() {
  const int64_t cu[4] = {0, 2, 99, 1};  // malformed on purpose
  RejectionParams p{};
  p.lengths = cu;
  p.batch = 3;
  p.max_draft = 4;
  p.num_draft_rows = 3;
  p.packed = true;
  for (int64_t b = 0; b < 3; ++b) {
    const RequestRows r = request_rows(p, b);
    CHECK(r.num_drafts >= 0 && r.num_drafts <= p.max_draft);
    CHECK(r.draft_base >= 0 && r.draft_base + r.num_drafts <= p.num_draft_rows);
    CHECK(r.target_base + r.num_drafts <= p.num_draft_rows + p.batch - 1);  // bonus row in range
  }
  const int64_t n[2] = {-3, 9};
  p.lengths = n;
  p.packed = false;
  p.batch = 2;
  CHECK(request_rows(p, 0).num_drafts == 0);
  CHECK(request_rows(p, 1).num_drafts == 4);
}

// Engine keywords (issue #14): the rows of a target without bonus rows, the synthetic test, the
// clamped external bonus id.
static void test_engine_keyword_helpers() {
  const int64_t cu[4] = {0, 2, 2, 5};  // n = 2, 0, 3
  RejectionParams p{};
  p.lengths = cu;
  p.batch = 3;
  p.max_draft = 3;
  p.num_draft_rows = 5;
  p.packed = true;
  CHECK(request_rows(p, 2).target_base == 2 + 2);  // [T + B, V]: cu[b] + b
  p.bonus_rows_omitted = true;
  CHECK(request_rows(p, 1).target_base == 2 && request_rows(p, 2).target_base == 2);  // [T, V]: cu[b]
  CHECK(request_rows(p, 2).draft_base == 2 && request_rows(p, 2).num_drafts == 3);
  const int64_t n[2] = {3, 1};
  p.lengths = n;
  p.packed = false;
  p.batch = 2;
  CHECK(request_rows(p, 1).target_base == 3);  // [B, K, V]
  p.bonus_rows_omitted = false;
  CHECK(request_rows(p, 1).target_base == 4);  // [B, K+1, V]

  CHECK(synthetic_accept(0.25f, 0.5f));
  CHECK(!synthetic_accept(0.5f, 0.5f));  // strict: u < rate
  CHECK(!synthetic_accept(bits_to_uniform(0u), 0.f));  // rate 0 never accepts, rate 1 always
  CHECK(synthetic_accept(bits_to_uniform(0xFFFFFFFFu), 1.f));
  CHECK(!synthetic_accept(bits_to_uniform(0u), NAN));

  const int64_t bonus[3] = {-4, 7, 1000};
  p.bonus_token_ids = bonus;
  p.vocab = 10;
  CHECK(external_bonus_token(p, 0) == 0 && external_bonus_token(p, 1) == 7 && external_bonus_token(p, 2) == 9);
}

int main() {
  test_philox_known_answers();
  test_uniform_range_and_layout();
  test_uniform_from_mantissa_is_the_integer_formula();
  test_keyed_philox_is_philox();
  test_mass_and_acceptance();
  test_argmax_first_index_on_ties();
  test_race_skipping_never_changes_the_winner();
  test_request_rows_clamp_bad_lengths();
  test_engine_keyword_helpers();
  TEST_MAIN_END();
}
