// Splitting one row's vocab-wide race or argmax across several thread blocks
// (the CUDA sampling kernels), with the per-entry and combine rules shared by
// host and device so that host tests can replay the split and compare it with
// the single-pass race (tests/cpp/test_vocab_split.cpp). Plain C++17: no torch
// headers, compiles under g++ and nvcc.
//
// Why a split never changes a result: the race winner is the argmax of
// (score, -index) over the row, with every entry's score a pure function of its
// mass and its own Philox word (csrc/common/philox.h). argmax_merge picks the
// larger of two (score, index) pairs in that total order (scores are never NaN:
// masses are >= 0 or inf and the noise is positive and finite), so merging
// partial argmaxes over any partition of the row, in any order, yields the
// argmax of the whole row. Skipping entries (race_may_win) never changes a
// part's argmax either, whatever running best a part compares against.
#pragma once

#include <cstdint>

#include "macros.h"
#include "sampling_math.h"

namespace specdec {

// Vocab entries are handled in Philox groups of 4 (group g holds entries 4g .. 4g+3).
SPECDEC_HD int64_t vocab_groups(int64_t vocab) { return (vocab + 3) / 4; }

// Groups [begin, end) of part `part` out of `parts` contiguous, near-equal parts.
struct GroupRange {
  int64_t begin;
  int64_t end;
};

SPECDEC_HD GroupRange vocab_part(int64_t vocab, int64_t parts, int64_t part) {
  const int64_t groups = vocab_groups(vocab);
  const int64_t per_part = (groups + parts - 1) / parts;
  const int64_t begin = part * per_part < groups ? part * per_part : groups;
  const int64_t end = begin + per_part < groups ? begin + per_part : groups;
  return GroupRange{begin, end};
}

// How many parts to split each of `batch` rows into: enough blocks to fill
// `resident_blocks` (the blocks the device holds at once) without a second wave,
// at least one, and no more than leaves every block `threads` groups.
SPECDEC_HD int64_t vocab_parts_for(int64_t batch, int64_t vocab, int64_t resident_blocks, int64_t threads) {
  const int64_t by_device = batch > 0 ? resident_blocks / batch : 1;
  const int64_t by_vocab = vocab_groups(vocab) / threads;
  int64_t parts = by_device < by_vocab ? by_device : by_vocab;
  return parts < 1 ? 1 : parts;
}

// argmax_update for indices that arrive in increasing order (one thread's walk over
// its own groups): a tie never replaces the earlier index, so one comparison does.
SPECDEC_HD void argmax_update_ascending(ArgMax& best, float score, int64_t index) {
  if (score > best.score) best = ArgMax{score, index};
}

// The race after a rejected draft: over the residual max(p - q, 0), falling back
// to a race over p (same random numbers) when the residual has no mass anywhere in
// the row (rounding). Both run in one pass with one race update per entry in the
// common case: once a racer's residual bar is positive (its own residual, or another
// racer's it was raised to, has a positive score), the row's residual has one too, so
// the fallback will never be read; the racer stops updating it (its fallback is then
// a partial result over a prefix, never used). When every racer's residual is empty,
// every bar stays <= 0, every fallback saw all of its entries, and so does their
// merge: the fallback is exact exactly when it is used. Each race has its bar
// (race_update): its best's score until a kernel raises it.
struct ResidualRace {
  ArgMax residual;
  ArgMax fallback;  // also the bonus race (residual left empty)
  float residual_bar;
  float fallback_bar;
};

SPECDEC_HD ResidualRace residual_race_init() {
  return ResidualRace{argmax_init(), argmax_init(), argmax_init().score, argmax_init().score};
}

SPECDEC_HD void residual_race_update(ResidualRace& race, float p, float q, uint32_t bits, int64_t index) {
  race_update(race.residual, race.residual_bar, residual_mass(p, q), bits, index);
  if (!(race.residual_bar > 0.f)) race_update(race.fallback, race.fallback_bar, prob_mass(p), bits, index);
}

// The bonus race (everything accepted) is a plain race over p in the fallback slot.
SPECDEC_HD void bonus_race_update(ResidualRace& race, float p, uint32_t bits, int64_t index) {
  race_update(race.fallback, race.fallback_bar, prob_mass(p), bits, index);
}

SPECDEC_HD ResidualRace residual_race_merge(const ResidualRace& a, const ResidualRace& b) {
  const ArgMax residual = argmax_merge(a.residual, b.residual), fallback = argmax_merge(a.fallback, b.fallback);
  return ResidualRace{residual, fallback, residual.score, fallback.score};
}

// The emitted token: the residual's winner if it has mass, else the fallback's.
SPECDEC_HD int64_t residual_race_winner(const ResidualRace& race) {
  return race.residual.score > 0.f ? race.residual.index : race.fallback.index;
}

}  // namespace specdec
