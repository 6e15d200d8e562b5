// C++ CPU kernel of tree verification (DESIGN.md §5.3): parallel over requests,
// the same arithmetic (tree_verify_math.h) and random numbers as the CUDA kernel.
#include "../common/sampling_cpu.h"
#include "tree_verify_math.h"
#include "tree_verify_params.h"

namespace specdec {
namespace {

using cpu::load;

// The walk of one request; see tree_verify_math.h.
template <typename T>
void verify_request(const TreeVerifyParams& p, int64_t b) {
  const int64_t N = p.max_nodes, V = p.vocab;
  const int64_t n = tree_num_nodes(p.num_nodes, b, N);
  const bool greedy = p.greedy != nullptr && p.greedy[b];
  const uint64_t seed = static_cast<uint64_t>(p.seeds[b]);
  const uint64_t offset = static_cast<uint64_t>(p.offsets[b]);
  const int64_t* tokens = p.tree_token_ids + b * N;
  const int64_t* parents = p.parents + b * N;
  float* z = p.normalizers + b * N;
  int32_t* zeroed = p.zeroed + b * N;
  int64_t* out_tokens = p.token_ids + b * N;
  int32_t* out_path = p.accepted_path + b * N;
  const auto row = [&](int64_t u) { return b * N + u; };

  int64_t u = 0, k = 0;
  out_path[0] = 0;
  const auto move_to = [&](int64_t c, int64_t x) {
    out_tokens[k] = x;
    out_path[++k] = static_cast<int32_t>(c);
    u = c;
  };

  int64_t final_token;
  if (greedy) {
    const auto argmax_row = [&](int64_t node) {
      ArgMax best = argmax_init();
      for (int64_t i = 0; i < V; ++i) argmax_update(best, prob_mass(load<T>(p.target_probs, row(node), V, i)), i);
      return best.index;
    };
    int64_t best = argmax_row(0);
    for (int64_t c = 1; c < n; ++c) {
      if (tree_parent(parents[c], c) != u || tokens[c] != best) continue;
      move_to(c, best);
      best = argmax_row(c);
    }
    final_token = best;
  } else {
    bool rejected = false;  // a child of u was tried and rejected
    int64_t m = 0;          // committed residual updates (draft_probs) / zeroed tokens (one-hot) at u
    float sum = 0.f;        // one-hot: sum of p'
    int64_t nonzero = 0;    // one-hot: entries of p_u with mass
    for (int64_t c = 1; c < n; ++c) {
      if (tree_parent(parents[c], c) != u) continue;
      const int64_t x = tokens[c];
      const bool in_vocab = draft_in_vocab(x, V);
      const float uc = tree_accept_uniform(seed, offset, c);
      bool accept;
      if (p.draft_probs != nullptr) {
        const float z_m = tree_normalizer(z, m);
        accept = in_vocab && tree_accept_draft(uc,
                                               tree_residual(load<T>(p.target_probs, row(u), V, x),
                                                             load<T>(p.draft_probs, row(u), V, x), z, m),
                                               z_m, load<T>(p.draft_probs, row(u), V, x));
        if (!accept) {
          double total = 0.0;
          for (int64_t i = 0; i < V; ++i) {
            const float q = load<T>(p.draft_probs, row(u), V, i);
            total += tree_next_residual(tree_residual(load<T>(p.target_probs, row(u), V, i), q, z, m), z_m, q);
          }
          if (static_cast<float>(total) > 0.f) z[m++] = static_cast<float>(total);
        }
      } else {
        if (!rejected) {  // first child of u: sum and support of p_u
          double total = 0.0;
          nonzero = 0;
          for (int64_t i = 0; i < V; ++i) {
            const float mass = prob_mass(load<T>(p.target_probs, row(u), V, i));
            total += mass;
            nonzero += mass > 0.f;
          }
          sum = static_cast<float>(total);
        }
        const float p_x = in_vocab && !tree_excluded(x, zeroed, m)
                              ? prob_mass(load<T>(p.target_probs, row(u), V, x)) : 0.f;
        accept = in_vocab && tree_accept_onehot(uc, sum, p_x);
        if (!accept && p_x > 0.f && nonzero - m > 1) {
          zeroed[m++] = static_cast<int32_t>(x);
          sum -= p_x;
        }
      }
      if (accept) {
        move_to(c, x);
        rejected = false;
        m = 0;
      } else {
        rejected = true;
      }
    }
    // Exponential race over p' at u (r_m with draft_probs: the race is scale invariant).
    const uint32_t purpose = tree_final_purpose(rejected);
    ArgMax best = argmax_init();
    Philox4 bits{};
    for (int64_t i = 0; i < V; ++i) {
      if ((i & 3) == 0)
        bits = philox_block(seed, offset, static_cast<uint32_t>(u), purpose, static_cast<uint32_t>(i >> 2));
      const float pi = load<T>(p.target_probs, row(u), V, i);
      float mass;
      if (p.draft_probs != nullptr) {
        mass = tree_residual(pi, load<T>(p.draft_probs, row(u), V, i), z, m);
      } else {
        mass = tree_excluded(i, zeroed, m) ? 0.f : prob_mass(pi);
      }
      race_update(best, mass, bits.x[i & 3], i);
    }
    final_token = best.index;
  }
  out_tokens[k] = final_token;
  for (int64_t j = k + 1; j < N; ++j) {
    out_tokens[j] = -1;
    out_path[j] = -1;
  }
  p.num_accepted[b] = static_cast<int32_t>(k);
}

}  // namespace

void tree_rejection_sample_cpu(const TreeVerifyParams& params) {
  cpu::for_each_request(params.dtype, params.batch, [&](auto tag, int64_t b) {
    verify_request<typename decltype(tag)::type>(params, b);
  });
}

}  // namespace specdec
