// Arithmetic of tree verification (DESIGN.md §5.3) shared by the CPU and CUDA
// kernels (and re-expressed in triton_kernels/tree_verify.py and reference.py).
// The acceptance test, residual element, race score and ArgMax come from
// ../common/sampling_math.h; this header adds what trees need on top.
// Plain C++17: no torch headers, compiles under g++ and nvcc.
//
// The walk. At node u with current distribution p' (starts as p_u) the children
// of u are tried in index order (every child has a larger index than its
// parent, so one forward scan c = 1 .. n-1 over the nodes visits them all):
//   * with draft_probs: accept c iff u_c * q_u(x_c) < p'(x_c); on rejection
//     p' <- max(p' - q_u, 0) / sum(...). p' is never materialized: after m
//     committed updates with normalizers Z_1 .. Z_m (Z_0 = 1),
//         r_0 = mass(p_u),  r_j = max(r_{j-1} / Z_{j-1} - mass(q_u), 0),  p' = r_m / Z_m,
//     evaluated per vocab entry from p_u, q_u and the m scalars (tree_residual).
//     An update whose sum is 0 (rounding) is not committed: p' stays as it was.
//   * without draft_probs: p' = mass(p_u) with the rejected children's tokens
//     zeroed, kept unnormalized with its running sum S (start: sum of p_u;
//     each zeroed token subtracts its mass); accept c iff u_c * S < p'(x_c).
//     Zeroing the last entry with mass is not committed either.
//   * no child accepted (or a leaf): emit a token by an exponential race over
//     p' (r_m with draft_probs: the race is scale invariant).
// Random numbers (csrc/common/philox.h): the uniform for child c is at
// position c - 1, purpose kPurposeAccept, index 0 (a chain-shaped tree uses
// the numbers of rejection_sample); the final race at node u uses position u,
// purpose kPurposeResidual if a child of u was rejected, else kPurposeBonus.
#pragma once

#include <cstdint>

#include "../common/macros.h"
#include "../common/philox.h"
#include "../common/sampling_math.h"

namespace specdec {

// Number of real nodes of a request, clamped into [1, N] (GPU safe behaviour;
// the CPU op raises on values outside).
SPECDEC_HD int64_t tree_num_nodes(const int64_t* num_nodes, int64_t b, int64_t max_nodes) {
  if (num_nodes == nullptr) return max_nodes;
  const int64_t n = num_nodes[b];
  return n < 1 ? 1 : (n > max_nodes ? max_nodes : n);
}

// Parent of node c >= 1; a malformed entry (outside [0, c)) is the root (GPU safe
// behaviour; the CPU op raises on it).
SPECDEC_HD int64_t tree_parent(int64_t parent, int64_t c) { return parent >= 0 && parent < c ? parent : 0; }

// Acceptance uniform for trying child c (c >= 1): the child's draft slot c - 1.
SPECDEC_HD float tree_accept_uniform(uint64_t seed, uint64_t offset, int64_t c) {
  return philox_uniform(seed, offset, static_cast<uint32_t>(c - 1), kPurposeAccept, 0);
}

// Purpose of the final race at a node: residual after a rejected child, bonus otherwise.
SPECDEC_HD uint32_t tree_final_purpose(bool rejected_child) {
  return rejected_child ? kPurposeResidual : kPurposeBonus;
}

// One residual update of an entry: max(r / z - mass(q), 0). With z = 1 and r =
// mass(p) this is residual_mass(p, q) bit for bit.
SPECDEC_HD float residual_step(float r, float z, float q) {
  const float d = r / z - prob_mass(q);
  return d > 0.f ? d : 0.f;
}

// r_m of one entry after m committed updates with normalizers z[0 .. m-1]
// (= Z_1 .. Z_m; Z_0 = 1): the unnormalized current distribution p' * Z_m.
SPECDEC_HD float tree_residual(float p, float q, const float* z, int64_t m) {
  float r = prob_mass(p);
  float prev = 1.f;
  for (int64_t j = 0; j < m; ++j) {
    r = residual_step(r, prev, q);
    prev = z[j];
  }
  return r;
}

// The normalizer Z_m of the current distribution (1 before any update).
SPECDEC_HD float tree_normalizer(const float* z, int64_t m) { return m > 0 ? z[m - 1] : 1.f; }

// Mass of the next update r_{m+1} of one entry, given r_m and Z_m.
SPECDEC_HD float tree_next_residual(float r_m, float z_m, float q) { return residual_step(r_m, z_m, q); }

// Acceptance with draft_probs: u * q(x) < p'(x) = r_m(x) / Z_m.
SPECDEC_HD bool tree_accept_draft(float u, float r_x, float z_m, float q_x) {
  return u * prob_mass(q_x) < r_x / z_m;
}

// Acceptance without draft_probs: u * S < p'(x) (p' unnormalized, S its sum).
SPECDEC_HD bool tree_accept_onehot(float u, float sum, float p_x) { return u * sum < p_x; }

// Whether token x is among the n zeroed tokens.
SPECDEC_HD bool tree_excluded(int64_t x, const int32_t* zeroed, int64_t n) {
  for (int64_t j = 0; j < n; ++j)
    if (zeroed[j] == x) return true;
  return false;
}

}  // namespace specdec

namespace specdec {

// ---- Split passes (the CUDA kernel runs each vocab-wide step of the walk once per
// visited node, split across blocks; these rules keep its results those of the walk above).

// The race of a node with children, run in the same pass as the sum of p_u (no
// draft_probs) before the walk knows which children it rejects: the tokens of all of
// u's children are excluded (mass 0). Checked only on the race's rare path: an
// excluded entry with mass behaves exactly as an entry without mass (skipped once the
// race has a positive score, else a score-0 candidate), so this equals
// race_update(best, excluded(index) ? 0 : mass, bits, index) for every entry.
// `bar` is race_update's: the racer's own best score or a higher score the race
// already reached (the CUDA kernel raises it to the warp's best).
template <typename Excluded>
SPECDEC_HD void race_update_excluding(ArgMax& best, float& bar, float mass, uint32_t bits, int64_t index,
                                      const Excluded& excluded) {
  const bool has_mass = mass > 0.f;
  if (has_mass ? race_may_win(mass, bits_to_uniform(bits), bar) : !(bar > 0.f))
    race_update(best, bar, has_mass && excluded(index) ? 0.f : mass, bits, index);
}

// The final token of a node whose children were all rejected (no draft_probs), from
// the race that excluded every child token (race_update_excluding) and `kept`: the
// child token with mass that the walk did not zero because it was the last entry of
// p' with mass (nonzero - m <= 1), or -1. With kept >= 0, p' holds mass at kept only:
// the race's winner is kept if its score is positive, else the first index (0), as
// every entry scores 0 (a subnormal mass over the noise can round to 0).
SPECDEC_HD int64_t tree_onehot_final(int64_t excluded_race_winner, int64_t kept, float kept_mass, uint64_t seed,
                                     uint64_t offset, uint32_t position) {
  if (kept < 0) return excluded_race_winner;
  const Philox4 bits = philox_block(seed, offset, position, tree_final_purpose(true), static_cast<uint32_t>(kept >> 2));
  const int word = static_cast<int>(kept & 3);
  const uint32_t kept_bits = word == 0 ? bits.x[0] : word == 1 ? bits.x[1] : word == 2 ? bits.x[2] : bits.x[3];
  const float score = kept_mass / uniform_noise(bits_to_uniform(kept_bits));
  return score > 0.f ? kept : 0;
}

// The final race after the last child of a node is rejected (draft_probs), run in the
// same pass as the sum of the next residual r_{m+1}: `next` races over r_{m+1} (used
// when its sum is positive: the update is committed) and `current` over r_m (used
// otherwise). `current` is updated only while `next` has no positive score: when the
// sum is 0 every r_{m+1} entry is 0, `next` never scores above 0 and `current` saw
// every entry; when the sum is positive `current` is never read.
struct TreeResidualRace {
  ArgMax next;
  ArgMax current;
  float next_bar;     // race_update's bars
  float current_bar;
};

SPECDEC_HD TreeResidualRace tree_residual_race_init() {
  return TreeResidualRace{argmax_init(), argmax_init(), argmax_init().score, argmax_init().score};
}

// `current` is updated while no racer's `next` bar is positive: a positive bar is a
// positive score of some entry of r_{m+1}, so the sum is positive and `current` unread.
SPECDEC_HD void tree_residual_race_update(TreeResidualRace& race, float r_next, float r_m, uint32_t bits,
                                          int64_t index) {
  race_update(race.next, race.next_bar, r_next, bits, index);
  if (!(race.next_bar > 0.f)) race_update(race.current, race.current_bar, r_m, bits, index);
}

}  // namespace specdec

namespace specdec {

// Whether any of four consecutive entries of a race (masses, Philox words) can change
// the race's best, tested against `best`: the race's bar before the first of them
// (race_update; its best's score, or higher). False means that
// race_update (or race_update_excluding) on each of them, in order, changes nothing,
// so a kernel can test a Philox group once and branch once. The first entry that
// changes the best sees `best` unchanged, so testing every entry against it finds it.
// Each entry's test is race_may_win's (or, without mass, "the race has no positive
// score"), with fl(u * best) computed as fl(k * fl(best * 2^-24)) for u = k * 2^-24:
// the scaling by a power of two is exact for best > 1e-30 (no subnormal), so both
// round the same real number; without that the group takes the exact path.
SPECDEC_HD bool race_group_may_update(float best, const float mass[4], const uint32_t bits[4]) {
  if (!(best > 1e-30f)) return true;
  const float best_scaled = best * 5.9604644775390625e-08f;  // best * 2^-24
  bool any = false;
  for (int j = 0; j < 4; ++j) {
    const float k = static_cast<float>(((bits[j] >> 9) << 1) | 1u);
    any |= mass[j] > 0.f && !(k * best_scaled <= (best - mass[j]) * (1.f - 2e-5f));
  }
  return any;
}

}  // namespace specdec
