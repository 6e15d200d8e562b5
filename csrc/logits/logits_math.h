// Arithmetic of verification from logits (DESIGN.md §5.7) shared by the CPU and CUDA
// kernels (and re-expressed in triton_kernels/logits.py and reference.py).
// Plain C++17: no torch headers, compiles under g++ and nvcc.
//
// The processed distribution of a row of logits l with temperature T > 0:
//   x_i = logit_value(l_i)          NaN -> -inf, +inf -> FLT_MAX (ties of +inf share the mass)
//   m   = max x;  z_i = (x_i - m) / T   so max z = 0 exactly, and every z_i <= 0
//   e_i = exp(z_i)                  in [0, 1], the largest is 1: no overflow, the sum S >= 1
// p_i = e_i / S is monotone in z_i, so each filter keeps {z_i >= threshold} and the three
// compose into one threshold tau on the order-preserving keys of z (order_key):
//   top-k:  tau_k = key of the k-th largest z (ties kept): a radix select on the keys;
//   top-p:  tau_p = the largest key v among the top-k survivors with
//           sum_{key_j >= v} e_j >= top_p * sum_{survivors} e_j: a radix select on mass;
//   min-p:  p_i >= min_p * max p  <=>  e_i >= min_p  <=>  z_i >= log(min_p) (max e = 1),
//           whatever top-k/top-p kept (the maximum always survives both).
// Kept set {key_i >= tau}, tau = max(tau_k, tau_p, tau_min); S = sum of e over it;
// p_i = e_i / S, log p_i = z_i - log S. Greedy rows (T = 0) use argmax x (first index).
//
// Radix select: keys are 32 bits, visited 8 at a time from the top (4 passes). Each
// pass builds a 256-bin histogram (counts for top-k, counts and mass for top-p) of the
// candidates sharing the digits chosen so far, then picks the next digit scanning bins
// from the top (radix_pick_count / radix_pick_mass). No sort, a fixed number of passes.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "../common/macros.h"

namespace specdec {

constexpr int kRadixBits = 8;
constexpr int kRadixBins = 1 << kRadixBits;
constexpr int kRadixPasses = 32 / kRadixBits;

// A logit as every backend reads it: NaN counts as -inf, +inf as the largest float.
SPECDEC_HD float logit_value(float l) {
  if (l != l) return -INFINITY;
  return l > FLT_MAX ? FLT_MAX : l;
}

// Top-p reaches its target when the kept mass is >= top_p * (1 - kTopPSlack) times the candidates'
// mass. Every backend sums float32 exponentials in its own order and precision (a few ulps apart), so a
// top_p that the exact kept mass meets exactly (p = 0.5, 0.3, ... with top_p = 0.8 keeps two entries)
// must not miss it by rounding on one backend and reach it on another; a relative 2^-20 is well above
// that rounding and far below the mass of any entry that matters.
constexpr float kTopPSlack = 9.5367431640625e-07f;  // 2^-20

// Sanitized sampling parameters of one row (also the GPU's safe behaviour for bad
// values; the CPU ops raise on them first).
struct RowSampling {
  float temperature;  // 0: greedy (also for T <= 0 or NaN); +inf -> FLT_MAX
  int64_t top_k;      // 0: off (also for k < 0 or k >= V)
  float top_p;        // 1: off (also for NaN or p > 1); p <= 0 keeps the most likely value only
  float min_p;        // 0: off (also for NaN or < 0); >= 1 -> 1 keeps the most likely value only
};

SPECDEC_HD RowSampling row_sampling(const float* temperature, const int64_t* top_k, const float* top_p,
                                    const float* min_p, int64_t r, int64_t vocab) {
  RowSampling s;
  const float t = temperature != nullptr ? temperature[r] : 1.f;
  s.temperature = t > 0.f ? (t > FLT_MAX ? FLT_MAX : t) : 0.f;
  const int64_t k = top_k != nullptr ? top_k[r] : 0;
  s.top_k = k > 0 && k < vocab ? k : 0;
  const float p = top_p != nullptr ? top_p[r] : 1.f;
  s.top_p = p < 1.f ? (p > 0.f ? p : 0.f) : 1.f;
  const float mp = min_p != nullptr ? min_p[r] : 0.f;
  s.min_p = mp > 0.f ? (mp < 1.f ? mp : 1.f) : 0.f;
  return s;
}

SPECDEC_HD bool row_is_greedy(const RowSampling& s) { return s.temperature == 0.f; }

SPECDEC_HD bool row_has_filter(const RowSampling& s) { return s.top_k > 0 || s.top_p < 1.f || s.min_p > 0.f; }

// Scaled logit z = (x - m) / T (x <= m, m finite): <= 0, exactly 0 at the maximum.
SPECDEC_HD float scaled_logit(float x, float m, float temperature) { return (x - m) / temperature; }

SPECDEC_HD float exp_f(float z) {
#if defined(__CUDA_ARCH__)
  return expf(z);
#else
  return std::exp(z);
#endif
}

// e^z as a term of a row's normalizer (the kept mass S, a greedy row's sum of exp(x - m)). On the GPU
// the approximate exponential with flush to zero: ex2.approx.ftz of z * log2(e), 2 instructions (__expf
// without -ftz adds three for subnormal results; expf takes 8). Its error is __expf's (CUDA's documented
// bound 2 + 1.173 |z| ulp, under 11 ulp where z >= -8 and the sum's mass lies), except that a term below
// 2^-126 (z < -87.3) is 0: a sum that reaches 1 (every row's: its max term is e^0) cannot tell. As Triton's
// tl.exp: far under the float32 rounding of a sum of 10^5 terms. Elsewhere exp_f. A single entry's
// probability (acceptance tests, logprobs' numerators) and the radix select's masses keep exp_f. Every
// CUDA kernel sums with it, in the single-block kernel's order (bit for bit).
SPECDEC_HD float sum_exp_f(float z) {
#if defined(__CUDA_ARCH__)
  float e;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(z * 1.44269502162933349609375f));
  return e;
#else
  return std::exp(z);
#endif
}

SPECDEC_HD float log_f(float z) {
#if defined(__CUDA_ARCH__)
  return logf(z);
#else
  return std::log(z);
#endif
}

// The bits of a float, and the float of some bits.
SPECDEC_HD uint32_t float_bits(float v) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(v);
#else
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return bits;
#endif
}

SPECDEC_HD float bits_float(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
#endif
}

// Order-preserving key of a float (no NaN): a < b  <=>  order_key(a) < order_key(b),
// and -0.0 has the key of +0.0. Non-negative floats set the top bit, negative ones
// are bit-inverted (larger magnitude -> smaller key).
SPECDEC_HD uint32_t order_key(float z) {
  uint32_t bits = float_bits(z);
  if (bits == 0x80000000u) bits = 0u;
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// Radix key of a logit x = logit_value(l) for a select over the logits instead of z (the split CUDA
// kernel): the order of l with NaN as -inf and +inf kept above every finite value (x = FLT_MAX stands for
// +inf: a float32 row's genuine FLT_MAX shares its key and its z), -0.0 just below +0.0. z = (x - m) / T is
// a non-decreasing function of x and equal keys mean equal z, so the k-th largest key is an entry with the
// k-th largest z, and the largest key whose candidates from the top reach a mass is an entry whose z is the
// largest z doing so (the entries whose z ties with it are the ones z's select adds); radix_threshold turns
// the pick into z's key. Half-precision logits widened to float32 leave their keys' low bits constant
// (bfloat16 16 bits, float16 13: zeros, flipped to ones for negative values), so a select over the upper
// bits alone (RadixPasses in the kernels: 2 passes of 8 bits for bfloat16, 3 for float16) is exact.
SPECDEC_HD uint32_t radix_key(float x) {
  const uint32_t bits = x >= FLT_MAX ? 0x7f800000u : float_bits(x);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// radix_key(logit_value(l)) from the bits of l as read (widened to float32, NaN and +inf as they come): the
// sign flip, NaN to -inf's key and, for float32 rows (kFloat32), FLT_MAX to +inf's (16-bit types have no
// FLT_MAX). Integer instructions on the bits the widening makes, where radix_key needs logit_value first.
template <bool kFloat32>
SPECDEC_HD uint32_t radix_key_raw(float l) {
  uint32_t b = float_bits(l);
  if (kFloat32 && b == 0x7f7fffffu) b = 0x7f800000u;
  const uint32_t key = b ^ (static_cast<uint32_t>(static_cast<int32_t>(b) >> 31) | 0x80000000u);
  return (b & 0x7fffffffu) > 0x7f800000u ? 0x007fffffu : key;
}

// The float whose order_key is `key` (-0.0 comes back as +0.0, whose key it shares): for a non-NaN z,
// z < order_key_value(k) exactly when order_key(z) < k.
SPECDEC_HD float order_key_value(uint32_t key) {
  return bits_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

// The float a kept z reaches under the threshold key tau: for a z that is no NaN, order_key(z) >= tau exactly
// when z >= kept_floor(tau) (tau 0 keeps every entry: -inf).
SPECDEC_HD float kept_floor(uint32_t tau) { return tau == 0u ? -INFINITY : order_key_value(tau); }

// z's key of the entry a select over radix_key after `passes` passes picked (prefix: its key's upper
// 8 x passes bits, the rest 0): the constant low bits restored (ones below a negative value's upper
// bits), the logit decoded, sanitized and scaled as the entries are.
SPECDEC_HD uint32_t radix_threshold(uint32_t prefix, int passes, float m, float temperature) {
  const int low_bits = 32 - kRadixBits * passes;
  uint32_t key = prefix;
  if (!(key & 0x80000000u) && low_bits > 0) key |= (1u << low_bits) - 1u;
  return order_key(scaled_logit(logit_value(order_key_value(key)), m, temperature));
}

// Key of the min-p threshold log(min_p) (min_p in (0, 1]); 0 (keeps all) when off.
SPECDEC_HD uint32_t min_p_key(float min_p) { return min_p > 0.f ? order_key(log_f(min_p)) : 0u; }

// Digit of a key at radix pass `pass` (0 = the top 8 bits).
SPECDEC_HD uint32_t radix_digit(uint32_t key, int pass) {
  return (key >> (32 - kRadixBits * (pass + 1))) & (kRadixBins - 1);
}

// Whether a key shares the digits chosen before pass `pass` (prefix holds them).
SPECDEC_HD bool radix_match(uint32_t key, uint32_t prefix, int pass) {
  if (pass == 0) return true;
  const int shift = 32 - kRadixBits * pass;
  return (key >> shift) == (prefix >> shift);
}

// Top-k step: the digit of the bin holding the `remaining`-th largest candidate,
// scanning from the top; `remaining` becomes its rank inside that bin. If the
// candidates are fewer (only on malformed input), the lowest non-empty bin.
template <typename Count>
SPECDEC_HD uint32_t radix_pick_count(const Count* counts, int64_t& remaining) {
  int lowest = -1;
  for (int d = kRadixBins - 1; d >= 0; --d) {
    const int64_t c = static_cast<int64_t>(counts[d]);
    if (c == 0) continue;
    if (c >= remaining) return static_cast<uint32_t>(d);
    remaining -= c;
    lowest = d;
  }
  remaining = 1;
  return static_cast<uint32_t>(lowest < 0 ? 0 : lowest);
}

// Top-p step: the highest non-empty bin d with above + mass[d] >= target, where
// `above` is the mass of every candidate with a larger key; `above` grows by the
// bins skipped. If rounding leaves the target out of reach, the lowest non-empty
// bin (everything is kept down to it). Non-empty bins count, not mass: entries
// whose e underflows to 0 still tie with their key.
template <typename Count, typename Mass>
SPECDEC_HD uint32_t radix_pick_mass(const Count* counts, const Mass* mass, Mass target, Mass& above) {
  int lowest = -1;
  for (int d = kRadixBins - 1; d >= 0; --d) {
    if (counts[d] == 0) continue;
    if (above + mass[d] >= target) return static_cast<uint32_t>(d);
    above += mass[d];
    lowest = d;
  }
  return static_cast<uint32_t>(lowest < 0 ? 0 : lowest);
}

// One entry of the processed distribution: e / S on the kept set, else 0.
SPECDEC_HD float processed_prob(float e, uint32_t key, uint32_t tau, float total) {
  return key >= tau ? e / total : 0.f;
}

// log p of a kept entry: z - log S; -inf off the kept set.
SPECDEC_HD float processed_logprob(float z, uint32_t key, uint32_t tau, float log_total) {
  return key >= tau ? z - log_total : -INFINITY;
}

}  // namespace specdec
