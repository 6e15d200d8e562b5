// Host-side checks of csrc/tree_verify/tree_verify_math.h (no torch), and a host replay
// of the CUDA kernel's split walk against the single-block walk it replaced.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "check.h"
#include "tree_verify/tree_verify_math.h"

using namespace specdec;

namespace {

// ---- Host replay of the CUDA kernel's split walk (tree_verify_kernels.cu) against
// the single-block walk it replaced, both over float rows with the CUDA sums' rounding.

uint32_t g_state = 11;
uint32_t next_u32() {  // an LCG step, output through a mixer (the LCG's low bits have short periods)
  g_state = g_state * 1664525u + 1013904223u;
  uint32_t x = g_state ^ (g_state >> 16);
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  return x ^ (x >> 16);
}
float next_unit() { return static_cast<float>(next_u32() >> 8) / 16777216.f; }

int threads_for_vocab(int64_t vocab) {  // sampling_cuda.cuh
  int threads = 32;
  while (threads < 1024 && 4 * static_cast<int64_t>(threads) < vocab) threads *= 2;
  return threads;
}

// The CUDA kernels' float sum of f(i) over a row: virtual thread v adds the entries of
// groups v, v + vthreads, ... in order; a shuffle-down tree inside each virtual warp,
// then the same tree over the virtual-warp sums.
template <typename F>
float cuda_row_sum(int64_t vocab, F f) {
  const int vthreads = threads_for_vocab(vocab);
  const int64_t groups = (vocab + 3) / 4;
  const auto tree = [](std::vector<float> v) {
    v.resize(32, 0.f);
    for (int o = 16; o > 0; o >>= 1) {
      std::vector<float> w(v);
      for (int l = 0; l < 32; ++l) w[l] = v[l] + (l + o < 32 ? v[l + o] : v[l]);
      v = w;
    }
    return v[0];
  };
  std::vector<float> warp_sums;
  for (int w = 0; w < vthreads / 32; ++w) {
    std::vector<float> lanes;
    for (int l = 0; l < 32; ++l) {
      float s = 0.f;
      for (int64_t g = 32 * w + l; g < groups; g += vthreads)
        for (int j = 0; j < 4 && 4 * g + j < vocab; ++j) s += f(4 * g + j);
      lanes.push_back(s);
    }
    warp_sums.push_back(tree(lanes));
  }
  return tree(warp_sums);
}

struct Request {
  int64_t vocab = 0, n = 0;
  std::vector<float> p, q;  // [n, vocab]; q empty without draft_probs
  std::vector<int64_t> parent, token;
  uint64_t seed = 0, offset = 0;
  bool greedy = false;
  float pv(int64_t u, int64_t i) const { return p[u * vocab + i]; }
  float qv(int64_t u, int64_t i) const { return q[u * vocab + i]; }
};

struct Result {
  std::vector<int64_t> tokens;
  std::vector<int64_t> path;
  bool operator==(const Result& o) const { return tokens == o.tokens && path == o.path; }
};

int64_t tok(const Request& r, int64_t c) { return draft_in_vocab(r.token[c], r.vocab) ? r.token[c] : -1; }

// The single-block kernel: one sequential walk, a vocab-wide pass per sum, the race last.
Result single_block(const Request& r) {
  const int64_t V = r.vocab;
  Result out{{}, {0}};
  int64_t u = 0;
  const auto argmax_row = [&](int64_t node) {
    ArgMax best = argmax_init();
    for (int64_t i = 0; i < V; ++i) argmax_update(best, prob_mass(r.pv(node, i)), i);
    return best.index;
  };
  if (r.greedy) {
    int64_t best = argmax_row(0);
    for (int64_t c = 1; c < r.n; ++c) {
      if (r.parent[c] != u || tok(r, c) != best) continue;
      out.tokens.push_back(best);
      out.path.push_back(c);
      u = c;
      best = argmax_row(c);
    }
    out.tokens.push_back(best);
    return out;
  }
  const bool has_q = !r.q.empty();
  bool rejected = false;
  int64_t m = 0, nonzero = 0;
  float sum = 0.f;
  std::vector<float> z(r.n);
  std::vector<int32_t> zeroed(r.n);
  for (int64_t c = 1; c < r.n; ++c) {
    if (r.parent[c] != u) continue;
    const int64_t x = tok(r, c);
    const float uc = tree_accept_uniform(r.seed, r.offset, c);
    bool accept;
    if (has_q) {
      const float z_m = tree_normalizer(z.data(), m);
      accept = x >= 0 && tree_accept_draft(uc, tree_residual(r.pv(u, x), r.qv(u, x), z.data(), m), z_m, r.qv(u, x));
      if (!accept) {
        const float total = cuda_row_sum(V, [&](int64_t i) {
          return tree_next_residual(tree_residual(r.pv(u, i), r.qv(u, i), z.data(), m), z_m, r.qv(u, i));
        });
        if (total > 0.f) z[m++] = total;
      }
    } else {
      if (!rejected) {
        sum = cuda_row_sum(V, [&](int64_t i) { return prob_mass(r.pv(u, i)); });
        nonzero = 0;
        for (int64_t i = 0; i < V; ++i) nonzero += prob_mass(r.pv(u, i)) > 0.f;
      }
      const float p_x = x >= 0 && !tree_excluded(x, zeroed.data(), m) ? prob_mass(r.pv(u, x)) : 0.f;
      accept = x >= 0 && tree_accept_onehot(uc, sum, p_x);
      if (!accept && p_x > 0.f && nonzero - m > 1) {
        zeroed[m++] = static_cast<int32_t>(x);
        sum -= p_x;
      }
    }
    if (accept) {
      out.tokens.push_back(x);
      out.path.push_back(c);
      u = c;
      rejected = false;
      m = 0;
    } else {
      rejected = true;
    }
  }
  ArgMax best = argmax_init();
  for (int64_t i = 0; i < V; ++i) {
    const Philox4 bits = philox_block(r.seed, r.offset, static_cast<uint32_t>(u), tree_final_purpose(rejected),
                                      static_cast<uint32_t>(i >> 2));
    const float mass = has_q ? tree_residual(r.pv(u, i), r.qv(u, i), z.data(), m)
                             : (tree_excluded(i, zeroed.data(), m) ? 0.f : prob_mass(r.pv(u, i)));
    race_update(best, mass, bits.x[i & 3], i);
  }
  out.tokens.push_back(best.index);
  return out;
}

// The split kernel: `parts` blocks of `threads` threads, each thread running
// `per_thread` virtual threads one after the other; one pass per visited node (see
// tree_verify_kernels.cu). Races are per thread over the kernel's order, then merged.
// shared_bar: every racer skips against one bar for the whole sweep, raised by every
// score any racer computes (race_update's bar at its most aggressive: the kernel shares
// a warp's); the results must not change.
Result split(const Request& r, int parts, int threads, int per_thread, bool shared_bar = false) {
  const int64_t V = r.vocab, vthreads = threads_for_vocab(V), groups = (V + 3) / 4;
  CHECK(parts * threads * per_thread == vthreads);
  // Runs entry(acc, i, bits) over every entry in the kernel's thread order, merging per-thread accumulators.
  float bar = -1.f;  // shared_bar: the sweep's bar (reset by every sweep)
  // A racer's bar before an update (its own, or the shared one if higher), and the shared one after it.
  const auto raise = [&](float& own) {
    if (shared_bar && bar > own) own = bar;
  };
  const auto publish = [&](float own) {
    if (shared_bar && own > bar) bar = own;
  };
  const auto sweep = [&](uint32_t position, uint32_t purpose, auto init, auto entry, auto merge) {
    auto total = init();
    bar = -1.f;
    for (int part = 0; part < parts; ++part)
      for (int t = 0; t < threads; ++t) {
        auto acc = init();
        for (int h = 0; h < per_thread; ++h)
          for (int64_t g = (static_cast<int64_t>(part) * per_thread + h) * threads + t; g < groups; g += vthreads) {
            const Philox4 bits = philox_block(r.seed, r.offset, position, purpose, static_cast<uint32_t>(g));
            for (int j = 0; j < 4 && 4 * g + j < V; ++j) entry(acc, 4 * g + j, bits.x[j]);
          }
        total = merge(total, acc);
      }
    return total;
  };
  const auto merge_argmax = [](ArgMax a, ArgMax b) { return argmax_merge(a, b); };
  Result out{{}, {0}};
  int64_t u = 0;
  const auto move_to = [&](int64_t c, int64_t x) {
    out.tokens.push_back(x);
    out.path.push_back(c);
    u = c;
  };
  while (true) {
    std::vector<int64_t> children;
    for (int64_t c = u + 1; c < r.n; ++c)
      if (r.parent[c] == u) children.push_back(c);
    if (r.greedy) {
      const int64_t best = sweep(0, 0, argmax_init, [&](ArgMax& a, int64_t i, uint32_t) {
        argmax_update(a, prob_mass(r.pv(u, i)), i);
      }, merge_argmax).index;
      int64_t next = -1;
      for (int64_t c : children)
        if (next < 0 && tok(r, c) == best) next = c;
      if (next < 0) {
        out.tokens.push_back(best);
        return out;
      }
      move_to(next, best);
      continue;
    }
    const uint32_t position = static_cast<uint32_t>(u);
    if (children.empty()) {
      out.tokens.push_back(sweep(position, tree_final_purpose(false), argmax_init,
                                 [&](ArgMax& a, int64_t i, uint32_t bits) {
                                   float own = a.score;
                                   raise(own);
                                   race_update(a, own, prob_mass(r.pv(u, i)), bits, i);
                                   publish(own);
                                 }, merge_argmax).index);
      return out;
    }
    const uint32_t purpose = tree_final_purpose(true);
    int64_t accepted = -1;
    if (r.q.empty()) {
      const auto excluded = [&](int64_t i) {
        for (int64_t c : children)
          if (tok(r, c) == i) return true;
        return false;
      };
      const ArgMax race = sweep(position, purpose, argmax_init, [&](ArgMax& a, int64_t i, uint32_t bits) {
        float own = a.score;
        raise(own);
        race_update_excluding(a, own, prob_mass(r.pv(u, i)), bits, i, excluded);
        publish(own);
      }, merge_argmax);
      float sum = cuda_row_sum(V, [&](int64_t i) { return prob_mass(r.pv(u, i)); });
      int64_t nonzero = 0, m = 0, kept = -1;
      for (int64_t i = 0; i < V; ++i) nonzero += prob_mass(r.pv(u, i)) > 0.f;
      std::vector<int32_t> zeroed(r.n);
      for (int64_t c : children) {
        const int64_t x = tok(r, c);
        const float p_x = x >= 0 && !tree_excluded(x, zeroed.data(), m) ? prob_mass(r.pv(u, x)) : 0.f;
        if (x >= 0 && tree_accept_onehot(tree_accept_uniform(r.seed, r.offset, c), sum, p_x)) {
          accepted = c;
          move_to(c, x);
          break;
        }
        if (p_x > 0.f) {
          if (nonzero - m > 1) {
            zeroed[m++] = static_cast<int32_t>(x);
            sum -= p_x;
          } else {
            kept = x;
          }
        }
      }
      if (accepted < 0) {
        out.tokens.push_back(tree_onehot_final(race.index, kept, kept >= 0 ? prob_mass(r.pv(u, kept)) : 0.f,
                                               r.seed, r.offset, position));
        return out;
      }
    } else {
      std::vector<float> z(r.n);
      int64_t m = 0;
      for (size_t j = 0; j < children.size(); ++j) {
        const int64_t c = children[j], x = tok(r, c);
        const float z_m = tree_normalizer(z.data(), m);
        if (x >= 0 && tree_accept_draft(tree_accept_uniform(r.seed, r.offset, c),
                                        tree_residual(r.pv(u, x), r.qv(u, x), z.data(), m), z_m, r.qv(u, x))) {
          accepted = c;
          move_to(c, x);
          break;
        }
        const auto r_m = [&](int64_t i) {
          return m == 0 ? prob_mass(r.pv(u, i)) : tree_residual(r.pv(u, i), r.qv(u, i), z.data(), m);
        };
        const auto r_next = [&](int64_t i) {
          return m == 0 ? residual_step(r_m(i), 1.f, r.qv(u, i)) : tree_next_residual(r_m(i), z_m, r.qv(u, i));
        };
        const float total = cuda_row_sum(V, r_next);
        if (j + 1 == children.size()) {
          const TreeResidualRace race = sweep(position, purpose, tree_residual_race_init,
              [&](TreeResidualRace& a, int64_t i, uint32_t bits) {
                raise(a.next_bar);  // the fallback over r_m keeps its own bar, as in the kernel
                tree_residual_race_update(a, r_next(i), r_m(i), bits, i);
                publish(a.next_bar);
              },
              [](TreeResidualRace a, TreeResidualRace b) {
                TreeResidualRace merged = tree_residual_race_init();
                merged.next = argmax_merge(a.next, b.next);
                merged.current = argmax_merge(a.current, b.current);
                return merged;
              });
          out.tokens.push_back(total > 0.f ? race.next.index : race.current.index);
          return out;
        }
        if (total > 0.f) z[m++] = total;
      }
    }
  }
}

// A random request: rows of several kinds (dense, sparse, one-hot, equal p and q so that
// residuals vanish, tiny masses, an infinite mass: the one-hot sum becomes NaN after it is
// zeroed, so the walk rejects every later child and keeps the last token with mass, whose
// score underflows to 0 when that mass is subnormal), random trees with duplicate and
// out-of-vocab tokens.
Request random_request(int64_t vocab, int64_t n, bool has_q, bool greedy) {
  Request r;
  r.vocab = vocab;
  r.n = n;
  r.seed = next_u32();
  r.offset = next_u32() % 7;
  r.greedy = greedy;
  r.parent.assign(n, -1);
  r.token.assign(n, 0);
  const int kind = static_cast<int>(next_u32() % 6);
  const auto row = [&](std::vector<float>& dst, int64_t u) {
    float* d = dst.data() + u * vocab;
    for (int64_t i = 0; i < vocab; ++i) {
      float v = next_unit();
      if (kind == 1 && next_u32() % 8 != 0) v = 0.f;              // sparse
      if (kind == 2) v = i == static_cast<int64_t>(next_u32() % 3) ? 1.f : 0.f;  // support in 0..2
      if (kind == 4) v *= 1e-39f;                                  // subnormal masses
      if (kind == 5) v = i == 0 ? INFINITY : i == 1 ? (next_u32() % 2 ? 1e-45f : 1.f) : 0.f;
      d[i] = v;
    }
  };
  r.p.assign(n * vocab, 0.f);
  for (int64_t u = 0; u < n; ++u) row(r.p, u);
  if (has_q) {
    r.q.assign(n * vocab, 0.f);
    for (int64_t u = 0; u < n; ++u) {
      if (kind == 3) std::copy(r.p.begin() + u * vocab, r.p.begin() + (u + 1) * vocab, r.q.begin() + u * vocab);
      else row(r.q, u);
    }
  }
  for (int64_t c = 1; c < n; ++c) {
    r.parent[c] = static_cast<int64_t>(next_u32() % (next_u32() % 2 ? 1 : c));  // bushy root or anywhere
    const uint32_t pick = next_u32() % 10;
    r.token[c] = pick == 0 ? vocab : pick < 4 ? static_cast<int64_t>(next_u32() % 3)  // outside, or the support
                                              : static_cast<int64_t>(next_u32() % vocab);
  }
  return r;
}

void check_split_replay() {
  int compared = 0, differing_layouts = 0;
  for (const int64_t vocab : {5, 37, 130, 600, 2100, 5000}) {
    const int vthreads = threads_for_vocab(vocab), threads = vthreads < 128 ? vthreads : 128;
    for (int trial = 0; trial < 60; ++trial) {
      const bool has_q = trial % 2 == 1, greedy = trial % 7 == 0;
      const Request r = random_request(vocab, 2 + static_cast<int64_t>(next_u32() % 9), has_q, greedy);
      const Result want = single_block(r);
      for (int parts = 1; parts * threads <= vthreads; parts *= 2) {
        const Result got = split(r, parts, threads, vthreads / (threads * parts));
        CHECK(got == want);
        CHECK(split(r, parts, threads, vthreads / (threads * parts), true) == want);
        ++compared;
        differing_layouts += parts > 1;
      }
    }
  }
  CHECK(compared > 500 && differing_layouts > 200);

  // The walk keeps the last token with mass (the sum is NaN once the infinite mass is
  // zeroed): the final token is that token, or 0 when its subnormal score rounds to 0.
  int kept_wins = 0, zero_wins = 0;
  for (int trial = 0; trial < 200; ++trial) {
    Request r;
    r.vocab = 8;
    r.n = 3;
    r.seed = next_u32();
    r.parent = {-1, 0, 0};
    r.token = {0, 0, 1};
    r.p.assign(3 * 8, 0.5f);
    for (int i = 0; i < 8; ++i) r.p[i] = i == 0 ? INFINITY : i == 1 ? 1e-45f : 0.f;
    const Result want = single_block(r);
    CHECK(want.path.size() == 1);
    kept_wins += want.tokens[0] == 1;
    zero_wins += want.tokens[0] == 0;
    CHECK(split(r, 1, 32, 1) == want);
    CHECK(split(r, 1, 32, 1, true) == want);
  }
  CHECK(kept_wins > 10 && zero_wins > 10 && kept_wins + zero_wins == 200);
}

// The race with excluded tokens checked on its rare path equals the race over the
// masses with those tokens zeroed, in any order of updates.
void check_race_excluding() {
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t V = 1 + next_u32() % 200;
    std::vector<float> mass(V);
    for (auto& m : mass) m = next_u32() % 3 == 0 ? 0.f : next_unit() * (trial % 5 == 0 ? 1e-39f : 1.f);
    std::vector<int64_t> ex;
    for (int j = 0; j < 4; ++j) ex.push_back(static_cast<int64_t>(next_u32() % V));
    const auto excluded = [&](int64_t i) {
      for (int64_t e : ex)
        if (e == i) return true;
      return false;
    };
    ArgMax a = argmax_init(), b = argmax_init();
    float bar = a.score;
    for (int64_t i = 0; i < V; ++i) {
      const uint32_t bits = philox_block(trial, 3, 1, kPurposeResidual, static_cast<uint32_t>(i >> 2)).x[i & 3];
      race_update_excluding(a, bar, mass[i], bits, i, excluded);
      race_update(b, excluded(i) ? 0.f : mass[i], bits, i);
    }
    CHECK(a.index == b.index && a.score == b.score);
  }
}

// A Philox group the kernel skips with one test (race_group_may_update false) is one
// whose four exact updates, in order, leave the race unchanged; most groups of a long
// race are skipped (here the masses are chosen to hit the edges, so fewer are).
void check_group_skip() {
  int skipped = 0, total = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    const float scales[6] = {1.f, 1e-3f, 1e-30f, 2e-30f, 1e-39f, INFINITY};
    ArgMax best{trial % 9 == 0 ? scales[next_u32() % 6] : next_unit() * 0.05f, 7};
    if (trial % 13 == 0) best = argmax_init();
    float mass[4];
    uint32_t bits[4];
    for (int j = 0; j < 4; ++j) {
      const uint32_t kind = next_u32() % 8;
      mass[j] = kind == 0 ? 0.f : kind == 1 ? 1e-40f : kind == 2 ? INFINITY : kind == 3 ? best.score
                : next_unit() * (kind == 4 ? 1.f : 1e-4f);
      bits[j] = next_u32();
    }
    ArgMax after = best;
    for (int j = 0; j < 4; ++j) race_update(after, mass[j], bits[j], 100 + j);
    const bool may = race_group_may_update(best.score, mass, bits);
    if (!may) {
      CHECK(after.score == best.score && after.index == best.index);
      ++skipped;
    }
    ++total;
  }
  CHECK(skipped > total / 40);  // (4 of the 8 kinds of masses can be skipped: about 6% of the groups)

  // Entry by entry the group test is race_may_win's decision, also for uniforms at the
  // skip threshold (u * best == (best - mass) * c up to a few ulps).
  int at_threshold = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    const float best = std::ldexp(0.5f + next_unit(), -static_cast<int>(next_u32() % 90));  // 2^-90 .. 1.5
    const float mass = best * next_unit();
    const double u_star = static_cast<double>((best - mass) * (1.f - 2e-5f)) / best;
    const int64_t j_star = static_cast<int64_t>(u_star * 8388608.0);  // u = (2j + 1) / 2^24
    for (int64_t j = j_star - 3; j <= j_star + 3; ++j) {
      if (j < 0 || j >= 8388608) continue;
      const uint32_t bits[4] = {static_cast<uint32_t>(j) << 9, 0, 0, 0};
      const float masses[4] = {mass, 0.f, 0.f, 0.f};
      const bool may = race_may_win(mass, bits_to_uniform(bits[0]), best);
      CHECK(race_group_may_update(best, masses, bits) == may);
      at_threshold += may;
    }
  }
  CHECK(at_threshold > 20000);
}

}  // namespace

int main() {
  check_group_skip();
  check_race_excluding();
  check_split_replay();

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
