// Arithmetic of rejection sampling shared by the CPU and CUDA kernels (and
// re-expressed in triton_kernels/rejection.py and tree_verify.py).
// Plain C++17: no torch headers, compiles under g++ and nvcc.
#pragma once

#include <cmath>
#include <cstdint>

#include "macros.h"
#include "philox.h"

namespace specdec {

// Probability mass of one entry: NaN and negative values count as zero.
SPECDEC_HD float prob_mass(float p) { return p > 0.f ? p : 0.f; }

// Acceptance test of a sampled draft token x: accept iff u * q(x) < p(x).
// One-hot drafts pass q_x = 1.
SPECDEC_HD bool accept_draft(float u, float p_x, float q_x) {
  return u * prob_mass(q_x) < prob_mass(p_x);
}

// One entry of the unnormalized residual max(p - q, 0).
SPECDEC_HD float residual_mass(float p, float q) {
  const float d = prob_mass(p) - prob_mass(q);
  return d > 0.f ? d : 0.f;
}

// Exponential race: token i wins with probability mass_i / sum(mass) when the
// winner is argmax mass_i / E_i with E_i = -log(u_i) i.i.d. Exp(1). Callers draw
// the noise only for entries with mass; zero mass scores 0.
SPECDEC_HD float uniform_noise(float u) {
#if defined(__CUDA_ARCH__)
  return -logf(u);
#else
  return -std::log(u);
#endif
}

SPECDEC_HD float exp_noise(uint32_t bits) { return uniform_noise(bits_to_uniform(bits)); }

// Running argmax with the first index winning ties. The empty state scores -1,
// below any real score, so a row without mass yields its first index.
struct ArgMax {
  float score;
  int64_t index;
};

SPECDEC_HD ArgMax argmax_init() { return ArgMax{-1.f, INT64_MAX}; }

SPECDEC_HD bool argmax_better(float score, int64_t index, const ArgMax& best) {
  return score > best.score || (score == best.score && index < best.index);
}

SPECDEC_HD void argmax_update(ArgMax& best, float score, int64_t index) {
  if (argmax_better(score, index, best)) best = ArgMax{score, index};
}

SPECDEC_HD ArgMax argmax_merge(const ArgMax& a, const ArgMax& b) {
  return argmax_better(b.score, b.index, a) ? b : a;
}

// Whether an entry (mass > 0, uniform u) can still beat a running best score
// `best` of the race. With t = mass / best, -log(u) >= t whenever u <= 1 - t (as
// -log(1 - t) >= t); more precisely u <= (1 - t)(1 - e) gives -log(u) >= t + e,
// so the entry's exact score is mass / -log(u) <= best * t / (t + e) <= best / (1 + e)
// (t <= 1, else the test below never skips): with e = 1e-5 below best even after
// the few ulps of rounding of the log and the division that compute the score.
// The test is evaluated without a division, multiplied through by best > 0:
// skip iff fl(u * best) <= fl(fl(best - mass) * c) with c = 1 - 2e-5. Each of the
// three roundings is a factor within 1 +- 2^-24, so a skip implies
// u <= (1 - t) c (1 + 2^-24)^3 / (1 - 2^-24) < (1 - t)(1 - 1e-5): the exact
// condition above. The bound on each rounding needs normal numbers: below
// best = 1e-30 nothing is skipped, so u * best >= 2^-24 * 1e-30 is normal and a
// subnormal right side is smaller than it (no skip). mass >= best makes the right
// side <= 0 < u * best (never skipped); best = inf skips every finite mass (its
// score is finite) and never an infinite one (inf - inf is NaN: the comparison
// fails). Skipping such entries (no log) never changes the winner, and comparing
// against any score some entry of the race reached (a thread's own running best, or
// the best of its warp: race_update's bar, <= the block's) stays safe.
SPECDEC_HD bool race_may_win(float mass, float u, float best) {
  if (!(best > 1e-30f)) return true;
  return !(u * best <= (best - mass) * (1.f - 2e-5f));
}

// One entry of a race: updates `best` with index's score (0 for no mass; entries
// that provably cannot win are skipped without computing their log). A score of 0
// changes nothing once best is positive (0 is neither above nor equal to it), so
// such an update is skipped too: the common path of an entry is the skip test and
// one branch; scores are computed only on the rare path.
//
// The skip test compares against `bar`: the racer's own best score or any higher
// score that an entry of the same race already reached (the CUDA kernels raise it to
// the best of the warp's racers every few entries: cuda::warp_raise_bar). An entry
// skipped against bar scores below it, so below the race's winner: the argmax merged
// over all racers is unchanged, and a higher bar skips more entries. Without mass an
// entry is skipped once bar > 0 (some entry already scores above 0). bar follows every
// score computed here, so bar >= best.score holds throughout.
SPECDEC_HD void race_update(ArgMax& best, float& bar, float mass, uint32_t bits, int64_t index) {
  const bool has_mass = mass > 0.f;
  const float u = bits_to_uniform(bits);
  if (has_mass ? race_may_win(mass, u, bar) : !(bar > 0.f)) {
    const float score = has_mass ? mass / uniform_noise(u) : 0.f;
    argmax_update(best, score, index);
    if (score > bar) bar = score;
  }
}

// race_update against the racer's own best alone.
SPECDEC_HD void race_update(ArgMax& best, float mass, uint32_t bits, int64_t index) {
  float bar = best.score;
  race_update(best, bar, mass, bits, index);
}

// The draft token used in acceptance: an id outside [0, V) is always rejected
// (GPU safe behaviour; the CPU op raises before reaching here).
SPECDEC_HD bool draft_in_vocab(int64_t x, int64_t vocab) { return x >= 0 && x < vocab; }

// Acceptance test of draft position k in synthetic acceptance mode (a benchmarking mode, lossy by
// design; the chain ops' engine keyword, DESIGN.md §5.7): accept iff the position's acceptance uniform
// u lies below rate[k]; a NaN rate never accepts. The caller rejects an id outside the vocabulary
// before asking.
SPECDEC_HD bool synthetic_accept(float u, float rate) { return u < rate; }

}  // namespace specdec
