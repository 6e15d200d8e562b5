// C++ CPU kernel of chain rejection sampling: parallel over requests, the same
// arithmetic (sampling_math.h) and random numbers (philox.h) as the CUDA kernel.
#include "../common/sampling_cpu.h"
#include "rejection_params.h"
#include "../common/sampling_math.h"

namespace specdec {
namespace {

using cpu::load;

// argmax over one row of p (first index on ties): greedy verification.
template <typename T>
int64_t row_argmax(const void* probs, int64_t row, int64_t vocab) {
  ArgMax best = argmax_init();
  for (int64_t i = 0; i < vocab; ++i) argmax_update(best, prob_mass(load<T>(probs, row, vocab, i)), i);
  return best.index;
}

// Exponential race over a row: with `residual` the mass is max(p - q, 0) (one-hot
// q when q_row < 0), falling back to p when the residual is empty (a second pass
// over the same random numbers, rare: rounding); without, it is p.
template <typename T>
int64_t row_race(const RejectionParams& p, int64_t p_row, int64_t q_row, int64_t draft, bool residual,
                 uint64_t seed, uint64_t offset, uint32_t position) {
  const uint32_t purpose = residual ? kPurposeResidual : kPurposeBonus;
  auto race = [&](bool use_residual) {
    ArgMax best = argmax_init();
    Philox4 bits{};
    for (int64_t i = 0; i < p.vocab; ++i) {
      if ((i & 3) == 0) bits = philox_block(seed, offset, position, purpose, static_cast<uint32_t>(i >> 2));
      const float pi = load<T>(p.target_probs, p_row, p.vocab, i);
      float mass = prob_mass(pi);
      if (use_residual) {
        const float qi = q_row >= 0 ? load<T>(p.draft_probs, q_row, p.vocab, i) : (i == draft ? 1.f : 0.f);
        mass = residual_mass(pi, qi);
      }
      race_update(best, mass, bits.x[i & 3], i);
    }
    return best;
  };
  if (residual) {
    const ArgMax best = race(true);
    if (best.score > 0.f) return best.index;
  }
  return race(false).index;
}

template <typename T>
void sample_request(const RejectionParams& p, int64_t b) {
  const RequestRows rows = request_rows(p, b);
  const int64_t n = rows.num_drafts;
  const bool greedy = p.greedy != nullptr && p.greedy[b];
  const uint64_t seed = static_cast<uint64_t>(p.seeds[b]);
  const uint64_t offset = static_cast<uint64_t>(p.offsets[b]);
  int64_t* out = p.token_ids + b * (p.max_draft + 1);

  int64_t k = 0;
  int64_t final_token = -1;
  for (; k < n; ++k) {
    const int64_t x = p.draft_token_ids[rows.draft_base + k];
    const int64_t p_row = rows.target_base + k;
    bool accepted;
    if (p.synthetic_rates != nullptr) {
      // Synthetic acceptance: the probabilities play no part in the test (greedy requests too).
      accepted = draft_in_vocab(x, p.vocab) &&
                 synthetic_accept(philox_uniform(seed, offset, static_cast<uint32_t>(k), kPurposeAccept, 0),
                                  p.synthetic_rates[k]);
      if (!accepted && greedy) final_token = row_argmax<T>(p.target_probs, p_row, p.vocab);
    } else if (greedy) {
      const int64_t best = row_argmax<T>(p.target_probs, p_row, p.vocab);
      accepted = x == best;
      if (!accepted) final_token = best;
    } else if (!draft_in_vocab(x, p.vocab)) {
      accepted = false;
    } else {
      const float u = philox_uniform(seed, offset, static_cast<uint32_t>(k), kPurposeAccept, 0);
      const float q_x = p.draft_probs ? load<T>(p.draft_probs, rows.draft_base + k, p.vocab, x) : 1.f;
      accepted = accept_draft(u, load<T>(p.target_probs, p_row, p.vocab, x), q_x);
    }
    if (!accepted) {
      if (!greedy) {
        const int64_t q_row = p.draft_probs ? rows.draft_base + k : -1;
        final_token = row_race<T>(p, p_row, q_row, x, /*residual=*/true, seed, offset, static_cast<uint32_t>(k));
      }
      break;
    }
    out[k] = x;
  }
  if (k == n && p.bonus_token_ids != nullptr) {
    final_token = external_bonus_token(p, b);  // the bonus row is never read (it may be absent)
  } else if (k == n) {
    const int64_t p_row = rows.target_base + n;
    final_token = greedy ? row_argmax<T>(p.target_probs, p_row, p.vocab)
                         : row_race<T>(p, p_row, -1, -1, /*residual=*/false, seed, offset, static_cast<uint32_t>(n));
  }
  out[k] = final_token;
  for (int64_t j = k + 1; j <= p.max_draft; ++j) out[j] = -1;
  p.num_accepted[b] = static_cast<int32_t>(k);
}

}  // namespace

void rejection_sample_cpu(const RejectionParams& params) {
  cpu::for_each_request(params.dtype, params.batch, [&](auto tag, int64_t b) {
    sample_request<typename decltype(tag)::type>(params, b);
  });
}

}  // namespace specdec
