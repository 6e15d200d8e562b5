// Host-side checks of csrc/tree_verify/tree_verify_math.h (no torch).
#include <cmath>
#include <cstdint>
#include <vector>

#include "check.h"
#include "tree_verify/tree_verify_math.h"

using namespace specdec;

int main() {
  // num_nodes: nullptr means N, values clamp into [1, N].
  const int64_t nn[4] = {0, 3, 9, -2};
  CHECK(tree_num_nodes(nullptr, 0, 7) == 7);
  CHECK(tree_num_nodes(nn, 0, 7) == 1);
  CHECK(tree_num_nodes(nn, 1, 7) == 3);
  CHECK(tree_num_nodes(nn, 2, 7) == 7);
  CHECK(tree_num_nodes(nn, 3, 7) == 1);

  // Parents: valid entries kept, malformed ones (negative, self, later node) are the root.
  CHECK(tree_parent(2, 5) == 2);
  CHECK(tree_parent(0, 1) == 0);
  CHECK(tree_parent(-1, 3) == 0);
  CHECK(tree_parent(3, 3) == 0);
  CHECK(tree_parent(7, 3) == 0);

  // The acceptance uniform of child c is the chain's uniform of draft slot c - 1.
  for (int64_t c = 1; c < 6; ++c)
    CHECK(tree_accept_uniform(123, 456, c) == philox_uniform(123, 456, static_cast<uint32_t>(c - 1), kPurposeAccept, 0));
  CHECK(tree_final_purpose(true) == kPurposeResidual);
  CHECK(tree_final_purpose(false) == kPurposeBonus);

  // Without updates the current distribution is p itself (Z_0 = 1), bit for bit,
  // and the acceptance test is rejection sampling's accept_draft.
  const float ps[5] = {0.3f, 0.f, -1.f, NAN, 0.123456789f};
  const float qs[5] = {0.1f, 0.2f, 0.5f, 0.25f, 0.7f};
  for (int i = 0; i < 5; ++i) {
    CHECK(tree_residual(ps[i], qs[i], nullptr, 0) == prob_mass(ps[i]));
    for (float u : {0.01f, 0.4f, 0.99f})
      CHECK(tree_accept_draft(u, tree_residual(ps[i], qs[i], nullptr, 0), tree_normalizer(nullptr, 0), qs[i]) ==
            accept_draft(u, ps[i], qs[i]));
    // The first update is the chain's residual element.
    CHECK(tree_next_residual(prob_mass(ps[i]), 1.f, qs[i]) == residual_mass(ps[i], qs[i]));
  }

  // Two updates recomputed per entry equal materializing p' step by step.
  const int V = 4;
  const float p[V] = {0.5f, 0.25f, 0.125f, 0.125f};
  const float q[V] = {0.25f, 0.5f, 0.f, 0.25f};
  std::vector<float> r(p, p + V), z;
  float z_m = 1.f;
  for (int step = 0; step < 2; ++step) {
    float total = 0.f;
    for (int i = 0; i < V; ++i) {
      r[i] = residual_step(r[i], z_m, q[i]);
      total += r[i];
    }
    CHECK(total > 0.f);
    z.push_back(total);
    z_m = total;
  }
  for (int i = 0; i < V; ++i) CHECK(tree_residual(p[i], q[i], z.data(), 2) == r[i]);
  CHECK(tree_normalizer(z.data(), 2) == z[1]);
  // After the updates p' = r / Z is a distribution: max(p - q, 0) = {.25, 0, .125, 0}, Z_1 = .375;
  // max(p'_1 - q, 0) = {.4166, 0, .3333, 0}, and its normalized form sums to 1.
  float sum = 0.f;
  for (int i = 0; i < V; ++i) sum += tree_residual(p[i], q[i], z.data(), 2) / z[1];
  CHECK(std::fabs(sum - 1.f) < 1e-6f);
  CHECK(tree_residual(p[1], q[1], z.data(), 2) == 0.f);

  // One-hot acceptance: u * S < p'(x); zeroed tokens.
  CHECK(tree_accept_onehot(0.5f, 1.f, 0.6f));
  CHECK(!tree_accept_onehot(0.5f, 1.f, 0.4f));
  CHECK(!tree_accept_onehot(0.01f, 1.f, 0.f));
  const int32_t zeroed[3] = {4, 9, 2};
  CHECK(tree_excluded(9, zeroed, 3));
  CHECK(!tree_excluded(9, zeroed, 1));
  CHECK(!tree_excluded(5, zeroed, 3));
  TEST_MAIN_END();
}
