// C++ CPU kernels of the logits ops (DESIGN.md §5.7): parallel over requests (rows for
// process_logits), the same arithmetic (logits_math.h, ../common/sampling_math.h) and
// random numbers (../common/philox.h) as the CUDA kernels. A row is read once into a
// per-thread scratch of keys and exponentials (L2-sized, never a probabilities tensor);
// the radix passes after the first one run over a compacted candidate list.
#include <algorithm>
#include <vector>

#include "../common/sampling_cpu.h"
#include "../common/sampling_math.h"
#include "../tree_verify/tree_verify_math.h"
#include "logits_math.h"
#include "logits_params.h"

namespace specdec {
namespace {

using cpu::load;
using cpu::TypeTag;

// Scratch of one thread for one row: keys and e = exp(z). Sized by the first row that
// samples (analyze_row): greedy rows read the logits alone, so an all-greedy call
// allocates nothing (two zero-filled vocabulary-sized vectors per call were most of a
// greedy step's cost on a CPU).
struct RowScratch {
  std::vector<uint32_t> key;
  std::vector<float> e;
  std::vector<int32_t> survivors, cand, next;
  int64_t vocab = 0;
  explicit RowScratch(int64_t v) : vocab(v) {}
  void ensure() {
    if (static_cast<int64_t>(e.size()) < vocab) {
      key.resize(vocab);
      e.resize(vocab);
    }
  }
};

// The processed distribution of one row, as a function of its scratch.
struct Row {
  bool greedy = false;
  bool has_mass = false;
  bool filtered = false;
  float m = -INFINITY;    // max x
  int64_t argmax = 0;     // first index of max x
  float temperature = 1.f;
  uint32_t tau = 0;       // kept: key >= tau
  float total = 0.f;      // S
  float log_total = 0.f;  // log S

  // p_i (0 off the kept set or without mass).
  float prob(const RowScratch& w, int64_t i) const {
    if (!has_mass) return 0.f;
    if (greedy) return i == argmax ? 1.f : 0.f;
    return filtered ? processed_prob(w.e[i], w.key[i], tau, total) : w.e[i] / total;
  }
};

// Radix passes 1..3 over the candidate list (pass 0 chose `prefix`'s top digit and
// filled w.cand): the key of the `remaining`-th largest candidate.
uint32_t finish_count_select(RowScratch& w, uint32_t prefix, int64_t remaining) {
  for (int pass = 1; pass < kRadixPasses; ++pass) {
    int64_t counts[kRadixBins] = {};
    for (int32_t i : w.cand) counts[radix_digit(w.key[i], pass)]++;
    const uint32_t d = radix_pick_count(counts, remaining);
    prefix |= d << (32 - kRadixBits * (pass + 1));
    w.next.clear();
    for (int32_t i : w.cand)
      if (radix_digit(w.key[i], pass) == d) w.next.push_back(i);
    std::swap(w.cand, w.next);
  }
  return prefix;
}

// Top-k threshold: the key of the k-th largest z over all V entries.
uint32_t select_top_k(RowScratch& w, int64_t vocab, int64_t k) {
  int64_t counts[kRadixBins] = {};
  for (int64_t i = 0; i < vocab; ++i) counts[radix_digit(w.key[i], 0)]++;
  int64_t remaining = k;
  const uint32_t d = radix_pick_count(counts, remaining);
  w.cand.clear();
  for (int64_t i = 0; i < vocab; ++i)
    if (radix_digit(w.key[i], 0) == d) w.cand.push_back(static_cast<int32_t>(i));
  return finish_count_select(w, d << (32 - kRadixBits), remaining);
}

// Top-p threshold over the entries listed in `src` (all V when src is null): the
// largest key v with sum_{key >= v} e >= top_p * sum e.
uint32_t select_top_p(RowScratch& w, const std::vector<int32_t>* src, int64_t vocab, float top_p) {
  int64_t counts[kRadixBins] = {};
  double mass[kRadixBins] = {};
  double total = 0.0;
  const int64_t n = src ? static_cast<int64_t>(src->size()) : vocab;
  for (int64_t j = 0; j < n; ++j) {
    const int64_t i = src ? (*src)[j] : j;
    const uint32_t d = radix_digit(w.key[i], 0);
    counts[d]++;
    mass[d] += w.e[i];
    total += w.e[i];
  }
  const double target = static_cast<double>(top_p) * total * (1.0 - kTopPSlack);
  double above = 0.0;
  uint32_t prefix = radix_pick_mass(counts, mass, target, above) << (32 - kRadixBits);
  w.cand.clear();
  for (int64_t j = 0; j < n; ++j) {
    const int64_t i = src ? (*src)[j] : j;
    if (radix_digit(w.key[i], 0) == (prefix >> (32 - kRadixBits))) w.cand.push_back(static_cast<int32_t>(i));
  }
  for (int pass = 1; pass < kRadixPasses; ++pass) {
    int64_t c[kRadixBins] = {};
    double ms[kRadixBins] = {};
    for (int32_t i : w.cand) {
      const uint32_t d = radix_digit(w.key[i], pass);
      c[d]++;
      ms[d] += w.e[i];
    }
    const uint32_t d = radix_pick_mass(c, ms, target, above);
    prefix |= d << (32 - kRadixBits * (pass + 1));
    w.next.clear();
    for (int32_t i : w.cand)
      if (radix_digit(w.key[i], pass) == d) w.next.push_back(i);
    std::swap(w.cand, w.next);
  }
  return prefix;
}

// Reads row `row` of `logits` and computes its processed distribution (logits_math.h).
template <typename T>
Row analyze_row(const void* logits, int64_t row, int64_t vocab, const RowSampling& s, RowScratch& w) {
  Row r;
  r.greedy = row_is_greedy(s);
  if (r.greedy) {
    for (int64_t i = 0; i < vocab; ++i) {
      const float x = logit_value(load<T>(logits, row, vocab, i));
      if (x > r.m) {
        r.m = x;
        r.argmax = i;
      }
    }
    r.has_mass = r.m > -INFINITY;
    return r;
  }
  w.ensure();
  for (int64_t i = 0; i < vocab; ++i) {
    const float x = logit_value(load<T>(logits, row, vocab, i));
    w.e[i] = x;
    if (x > r.m) {
      r.m = x;
      r.argmax = i;
    }
  }
  r.has_mass = r.m > -INFINITY;
  if (!r.has_mass) return r;
  r.temperature = s.temperature;
  r.filtered = row_has_filter(s);
  double total = 0.0;
  if (!r.filtered) {
    for (int64_t i = 0; i < vocab; ++i) {
      const float e = exp_f(scaled_logit(w.e[i], r.m, r.temperature));
      w.e[i] = e;
      total += e;
    }
  } else {
    // Keys first; e = exp(z) only where it can be read: the top-k survivors when top-k
    // is on (an entry's e is read only when its key is kept), else every entry.
    for (int64_t i = 0; i < vocab; ++i) {
      const float z = scaled_logit(w.e[i], r.m, r.temperature);
      w.key[i] = order_key(z);
      w.e[i] = z;
    }
    uint32_t tau = 0;
    const std::vector<int32_t>* src = nullptr;
    if (s.top_k > 0) {
      tau = select_top_k(w, vocab, s.top_k);
      w.survivors.clear();
      for (int64_t i = 0; i < vocab; ++i)
        if (w.key[i] >= tau) w.survivors.push_back(static_cast<int32_t>(i));
      for (int32_t i : w.survivors) w.e[i] = exp_f(w.e[i]);
      src = &w.survivors;
    } else {
      for (int64_t i = 0; i < vocab; ++i) w.e[i] = exp_f(w.e[i]);
    }
    if (s.top_p < 1.f) tau = std::max(tau, select_top_p(w, src, vocab, s.top_p));
    tau = std::max(tau, min_p_key(s.min_p));
    r.tau = tau;
    if (src != nullptr) {
      for (int32_t i : *src)
        if (w.key[i] >= tau) total += w.e[i];
    } else {
      for (int64_t i = 0; i < vocab; ++i)
        if (w.key[i] >= tau) total += w.e[i];
    }
  }
  r.total = static_cast<float>(total);
  r.log_total = log_f(r.total);
  return r;
}

// log p(token) under the row's processed distribution (greedy: log_softmax of x, read
// again from the logits).
template <typename T>
float row_logprob(const Row& r, const RowScratch& w, const void* logits, int64_t row, int64_t vocab,
                  int64_t token) {
  if (!r.has_mass || token < 0 || token >= vocab) return -INFINITY;
  const float x = logit_value(load<T>(logits, row, vocab, token));
  if (r.greedy) {
    double sum = 0.0;
    for (int64_t i = 0; i < vocab; ++i) sum += exp_f(logit_value(load<T>(logits, row, vocab, i)) - r.m);
    return (x - r.m) - log_f(static_cast<float>(sum));
  }
  const float z = scaled_logit(x, r.m, r.temperature);
  return r.filtered ? processed_logprob(z, order_key(z), r.tau, r.log_total) : z - r.log_total;
}

// Exponential race over the row's p (residual: max(p - q, 0), one-hot q at `draft`
// when q_row < 0; an empty residual falls back to p with the same numbers), exactly
// as rejection_cpu.cpp races over a probability row.
template <typename Q>
int64_t race_row(const Row& r, const RowScratch& w, int64_t vocab, const void* draft_probs, int64_t q_row,
                 int64_t draft, bool residual, uint64_t seed, uint64_t offset, uint32_t position) {
  const uint32_t purpose = residual ? kPurposeResidual : kPurposeBonus;
  // Groups of 4 entries share a Philox block; a group without mass needs no random
  // numbers (race_update would only record score 0, which argmax_update does alone).
  auto race = [&](bool use_residual) {
    ArgMax best = argmax_init();
    for (int64_t i0 = 0; i0 < vocab; i0 += 4) {
      float mass[4];
      bool any = false;
      for (int j = 0; j < 4; ++j) {
        const int64_t i = i0 + j;
        mass[j] = 0.f;
        if (i >= vocab) continue;
        mass[j] = r.prob(w, i);
        if (use_residual) {
          const float qi = q_row >= 0 ? load<Q>(draft_probs, q_row, vocab, i) : (i == draft ? 1.f : 0.f);
          mass[j] = residual_mass(mass[j], qi);
        }
        any |= mass[j] > 0.f;
      }
      if (!any) {
        for (int j = 0; j < 4 && i0 + j < vocab; ++j) argmax_update(best, 0.f, i0 + j);
        continue;
      }
      const Philox4 bits = philox_block(seed, offset, position, purpose, static_cast<uint32_t>(i0 >> 2));
      for (int j = 0; j < 4 && i0 + j < vocab; ++j) race_update(best, mass[j], bits.x[j], i0 + j);
    }
    return best;
  };
  if (residual) {
    const ArgMax best = race(true);
    if (best.score > 0.f) return best.index;
  }
  return race(false).index;
}

template <typename T, typename Q>
void chain_request(const LogitsRejectionParams& p, int64_t b) {
  const LogitsRequestRows rows = logits_request_rows(p, b);
  const int64_t n = rows.num_drafts, V = p.vocab;
  const RowSampling s = row_sampling(p.sampling.temperature, p.sampling.top_k, p.sampling.top_p,
                                     p.sampling.min_p, b, V);
  const uint64_t seed = static_cast<uint64_t>(p.seeds[b]);
  const uint64_t offset = static_cast<uint64_t>(p.offsets[b]);
  int64_t* out = p.token_ids + b * (p.max_draft + 1);
  float* lp = p.logprobs != nullptr ? p.logprobs + b * (p.max_draft + 1) : nullptr;
  RowScratch w(V);

  int64_t k = 0, final_token = -1;
  Row r;
  for (; k < n; ++k) {
    const int64_t x = p.draft_token_ids[rows.draft_base + k];
    const int64_t row = rows.target_base + k;
    r = analyze_row<T>(p.target_logits, row, V, s, w);
    bool accepted;
    if (p.synthetic_rates != nullptr) {
      // Synthetic mode: the acceptance uniform against the position's rate (greedy rows too).
      accepted = draft_in_vocab(x, V) &&
                 synthetic_accept(philox_uniform(seed, offset, static_cast<uint32_t>(k), kPurposeAccept, 0),
                                  p.synthetic_rates[k]);
      if (!accepted && r.greedy) final_token = r.argmax;
    } else if (r.greedy) {
      accepted = x == r.argmax;
      if (!accepted) final_token = r.argmax;
    } else if (!draft_in_vocab(x, V)) {
      accepted = false;
    } else {
      const float u = philox_uniform(seed, offset, static_cast<uint32_t>(k), kPurposeAccept, 0);
      const float q_x = p.draft_probs ? load<Q>(p.draft_probs, rows.draft_base + k, V, x) : 1.f;
      accepted = accept_draft(u, r.prob(w, x), q_x);
    }
    if (!accepted) {
      if (!r.greedy) {
        const int64_t q_row = p.draft_probs ? rows.draft_base + k : -1;
        final_token = race_row<Q>(r, w, V, p.draft_probs, q_row, x, /*residual=*/true, seed, offset,
                                  static_cast<uint32_t>(k));
      }
      if (lp) lp[k] = row_logprob<T>(r, w, p.target_logits, row, V, final_token);
      break;
    }
    out[k] = x;
    if (lp) lp[k] = row_logprob<T>(r, w, p.target_logits, row, V, x);
  }
  if (k == n && p.bonus_token_ids != nullptr) {
    // External bonus token: the bonus row is not read (it may be absent), its logprob is NaN.
    final_token = external_bonus_token(p.bonus_token_ids, b, V);
    if (lp) lp[k] = NAN;
  } else if (k == n) {
    const int64_t row = rows.target_base + n;
    r = analyze_row<T>(p.target_logits, row, V, s, w);
    final_token = r.greedy ? r.argmax
                           : race_row<Q>(r, w, V, nullptr, -1, -1, /*residual=*/false, seed, offset,
                                         static_cast<uint32_t>(n));
    if (lp) lp[k] = row_logprob<T>(r, w, p.target_logits, row, V, final_token);
  }
  out[k] = final_token;
  for (int64_t j = k + 1; j <= p.max_draft; ++j) {
    out[j] = -1;
    if (lp) lp[j] = NAN;
  }
  p.num_accepted[b] = static_cast<int32_t>(k);
}

// Tree walk of tree_verify_cpu.cpp (tree_verify_math.h) on the processed rows: the
// current node's distribution is written to a per-request scratch row once per node.
template <typename T, typename Q>
void tree_request(const LogitsTreeParams& p, int64_t b) {
  const int64_t N = p.max_nodes, V = p.vocab;
  const int64_t n = tree_num_nodes(p.num_nodes, b, N);
  const RowSampling s = row_sampling(p.sampling.temperature, p.sampling.top_k, p.sampling.top_p,
                                     p.sampling.min_p, b, V);
  const uint64_t seed = static_cast<uint64_t>(p.seeds[b]);
  const uint64_t offset = static_cast<uint64_t>(p.offsets[b]);
  const int64_t* tokens = p.tree_token_ids + b * N;
  const int64_t* parents = p.parents + b * N;
  int64_t* out_tokens = p.token_ids + b * N;
  int32_t* out_path = p.accepted_path + b * N;
  float* lp = p.logprobs != nullptr ? p.logprobs + b * N : nullptr;
  RowScratch w(V);
  std::vector<float> prow(V), z(N);
  std::vector<int32_t> zeroed(N);
  const auto row_of = [&](int64_t u) { return b * N + u; };

  int64_t u = 0, k = 0;
  Row r;
  const auto enter = [&](int64_t node) {
    r = analyze_row<T>(p.target_logits, row_of(node), V, s, w);
    if (!r.greedy)
      for (int64_t i = 0; i < V; ++i) prow[i] = r.prob(w, i);
  };
  const auto logprob = [&](int64_t token) {
    return row_logprob<T>(r, w, p.target_logits, row_of(u), V, token);
  };
  out_path[0] = 0;
  const auto move_to = [&](int64_t c, int64_t x) {
    if (lp) lp[k] = logprob(x);
    out_tokens[k] = x;
    out_path[++k] = static_cast<int32_t>(c);
    u = c;
    enter(c);
  };
  enter(0);

  int64_t final_token;
  if (r.greedy) {
    for (int64_t c = 1; c < n; ++c) {
      if (tree_parent(parents[c], c) != u || tokens[c] != r.argmax) continue;
      move_to(c, r.argmax);
    }
    final_token = r.argmax;
  } else {
    bool rejected = false;
    int64_t m = 0;
    float sum = 0.f;
    int64_t nonzero = 0;
    for (int64_t c = 1; c < n; ++c) {
      if (tree_parent(parents[c], c) != u) continue;
      const int64_t x = tokens[c];
      const bool in_vocab = draft_in_vocab(x, V);
      const float uc = tree_accept_uniform(seed, offset, c);
      bool accept;
      if (p.draft_probs != nullptr) {
        const float z_m = tree_normalizer(z.data(), m);
        accept = in_vocab && tree_accept_draft(uc,
                                               tree_residual(prow[x], load<Q>(p.draft_probs, row_of(u), V, x),
                                                             z.data(), m),
                                               z_m, load<Q>(p.draft_probs, row_of(u), V, x));
        if (!accept) {
          double total = 0.0;
          for (int64_t i = 0; i < V; ++i) {
            const float q = load<Q>(p.draft_probs, row_of(u), V, i);
            total += tree_next_residual(tree_residual(prow[i], q, z.data(), m), z_m, q);
          }
          if (static_cast<float>(total) > 0.f) z[m++] = static_cast<float>(total);
        }
      } else {
        if (!rejected) {
          double total = 0.0;
          nonzero = 0;
          for (int64_t i = 0; i < V; ++i) {
            total += prow[i];
            nonzero += prow[i] > 0.f;
          }
          sum = static_cast<float>(total);
        }
        const float p_x = in_vocab && !tree_excluded(x, zeroed.data(), m) ? prow[x] : 0.f;
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
    const uint32_t purpose = tree_final_purpose(rejected);
    ArgMax best = argmax_init();
    Philox4 bits{};
    for (int64_t i = 0; i < V; ++i) {
      if ((i & 3) == 0)
        bits = philox_block(seed, offset, static_cast<uint32_t>(u), purpose, static_cast<uint32_t>(i >> 2));
      const float mass = p.draft_probs != nullptr
                             ? tree_residual(prow[i], load<Q>(p.draft_probs, row_of(u), V, i), z.data(), m)
                             : (tree_excluded(i, zeroed.data(), m) ? 0.f : prow[i]);
      race_update(best, mass, bits.x[i & 3], i);
    }
    final_token = best.index;
  }
  if (lp) lp[k] = logprob(final_token);
  out_tokens[k] = final_token;
  for (int64_t j = k + 1; j < N; ++j) {
    out_tokens[j] = -1;
    out_path[j] = -1;
    if (lp) lp[j] = NAN;
  }
  p.num_accepted[b] = static_cast<int32_t>(k);
}

// Runs per_item(TypeTag<T>{}, TypeTag<Q>{}, i) for i in [0, n) in parallel, with T the
// logits' element type and Q the draft probabilities' (float32 or T).
template <typename F>
void for_each_item(ProbDType dtype, bool draft_float32, int64_t n, F&& per_item) {
  auto run = [&](auto t, auto q) {
    at::parallel_for(0, n, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) per_item(t, q, i);
    });
  };
  switch (dtype) {
    case ProbDType::kFloat32: return run(TypeTag<float>{}, TypeTag<float>{});
    case ProbDType::kFloat16:
      return draft_float32 ? run(TypeTag<c10::Half>{}, TypeTag<float>{}) : run(TypeTag<c10::Half>{}, TypeTag<c10::Half>{});
    case ProbDType::kBFloat16:
      return draft_float32 ? run(TypeTag<c10::BFloat16>{}, TypeTag<float>{})
                           : run(TypeTag<c10::BFloat16>{}, TypeTag<c10::BFloat16>{});
  }
}

}  // namespace

void process_logits_cpu(const ProcessLogitsParams& p) {
  // Rows in chunks so that each thread reuses one scratch.
  auto run = [&](auto tag) {
    using T = typename decltype(tag)::type;
    at::parallel_for(0, p.rows, 1, [&](int64_t begin, int64_t end) {
      RowScratch w(p.vocab);
      for (int64_t j = begin; j < end; ++j) {
        const RowSampling s = row_sampling(p.sampling.temperature, p.sampling.top_k, p.sampling.top_p,
                                           p.sampling.min_p, j / p.inner, p.vocab);
        const Row r = analyze_row<T>(p.logits, j, p.vocab, s, w);
        float* out = p.probs + j * p.vocab;
        for (int64_t i = 0; i < p.vocab; ++i) out[i] = r.prob(w, i);
      }
    });
  };
  switch (p.dtype) {
    case ProbDType::kFloat32: return run(TypeTag<float>{});
    case ProbDType::kFloat16: return run(TypeTag<c10::Half>{});
    case ProbDType::kBFloat16: return run(TypeTag<c10::BFloat16>{});
  }
}

void rejection_sample_logits_cpu(const LogitsRejectionParams& params) {
  for_each_item(params.dtype, params.draft_float32, params.batch, [&](auto t, auto q, int64_t b) {
    chain_request<typename decltype(t)::type, typename decltype(q)::type>(params, b);
  });
}

void tree_rejection_sample_logits_cpu(const LogitsTreeParams& params) {
  for_each_item(params.dtype, params.draft_float32, params.batch, [&](auto t, auto q, int64_t b) {
    tree_request<typename decltype(t)::type, typename decltype(q)::type>(params, b);
  });
}

}  // namespace specdec
