// Counter-based random numbers shared by every backend (DESIGN.md §5.1).
//
// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3").
// Every number an op draws for a request is a pure function of
//   key     = (lo32(seed), hi32(seed))
//   counter = (vocab_index / 4, position, lo32(offset), (hi32(offset) << 8) | purpose)
// and the word vocab_index % 4 of the block. The Triton kernels re-express exactly
// this function (specdec_ops/triton_kernels/_philox.py), and reference.py does it in
// plain PyTorch, so the same inputs give the same numbers on every backend.
#pragma once

#include <cstdint>
#include <cstring>

#include "macros.h"

namespace specdec {

// What a random number is for; part of the counter so the streams never overlap.
enum Purpose : uint32_t {
  kPurposeAccept = 0,    // one uniform per draft position / tree node (vocab index 0)
  kPurposeResidual = 1,  // exponential race over the residual after a rejection
  kPurposeBonus = 2,     // exponential race over the bonus row (everything accepted)
};

struct Philox4 {
  uint32_t x[4];
};

SPECDEC_HD uint32_t mulhi32(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __umulhi(a, b);
#else
  return static_cast<uint32_t>((static_cast<uint64_t>(a) * b) >> 32);
#endif
}

// One Philox4x32 round under round keys k0, k1.
SPECDEC_HD void philox_round(uint32_t& c0, uint32_t& c1, uint32_t& c2, uint32_t& c3, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  const uint32_t hi0 = mulhi32(kM0, c0), lo0 = kM0 * c0;
  const uint32_t hi1 = mulhi32(kM1, c2), lo1 = kM1 * c2;
  c0 = hi1 ^ c1 ^ k0;
  c1 = lo1;
  c2 = hi0 ^ c3 ^ k1;
  c3 = lo0;
}

SPECDEC_HD Philox4 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3,
                                 uint32_t k0, uint32_t k1) {
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int round = 0; round < 10; ++round) {
    philox_round(c0, c1, c2, c3, k0, k1);
    k0 += kW0;
    k1 += kW1;
  }
  return Philox4{{c0, c1, c2, c3}};
}

// The round keys of one key (k0 + r W0, k1 + r W1 for rounds r = 0..9), for loops that draw many blocks under
// one key: philox4x32_10_keyed then spends no instruction on the key schedule (18 adds a block otherwise,
// which compilers keep inside such loops rather than hold 20 registers). On the GPU each key passes through an
// opaque move, so that the compiler holds them instead of recomputing them in the loop.
struct PhiloxKeys {
  uint32_t k0[10], k1[10];
};

SPECDEC_HD uint32_t philox_opaque(uint32_t v) {
#if defined(__CUDA_ARCH__)
  asm("mov.b32 %0, %1;" : "=r"(v) : "r"(v));
#endif
  return v;
}

SPECDEC_HD PhiloxKeys philox_keys(uint32_t k0, uint32_t k1) {
  PhiloxKeys k;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int round = 0; round < 10; ++round) {
    k.k0[round] = philox_opaque(k0 + static_cast<uint32_t>(round) * 0x9E3779B9u);
    k.k1[round] = philox_opaque(k1 + static_cast<uint32_t>(round) * 0xBB67AE85u);
  }
  return k;
}

// philox4x32_10 with its round keys given (the same numbers: tests/cpp checks).
SPECDEC_HD Philox4 philox4x32_10_keyed(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, const PhiloxKeys& k) {
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int round = 0; round < 10; ++round) philox_round(c0, c1, c2, c3, k.k0[round], k.k1[round]);
  return Philox4{{c0, c1, c2, c3}};
}

// The Philox block holding the numbers of vocab indices 4*group .. 4*group+3.
SPECDEC_HD Philox4 philox_block(uint64_t seed, uint64_t offset, uint32_t position,
                                uint32_t purpose, uint32_t group) {
  return philox4x32_10(group, position, static_cast<uint32_t>(offset),
                       (static_cast<uint32_t>(offset >> 32) << 8) | purpose,
                       static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

// philox_block's round keys (those of `seed`) and its block under them.
SPECDEC_HD PhiloxKeys philox_block_keys(uint64_t seed) {
  return philox_keys(static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}
SPECDEC_HD Philox4 philox_block_keyed(const PhiloxKeys& keys, uint64_t offset, uint32_t position, uint32_t purpose,
                                      uint32_t group) {
  return philox4x32_10_keyed(group, position, static_cast<uint32_t>(offset),
                             (static_cast<uint32_t>(offset >> 32) << 8) | purpose, keys);
}

// 32 random bits -> float32 uniform strictly inside (0, 1): (2k + 1) / 2^24 with
// k the top 23 bits. Exact in float32, so every backend gets the same value.
// The same value from float bits, without the integer-to-float conversion (2 instructions against 4 on the
// GPU): 1 + k 2^-23 has k as its mantissa, and subtracting 1 - 2^-24 leaves (2k + 1) 2^-24, representable (24
// significant bits), so the subtraction is exact. tests/cpp checks every k.
SPECDEC_HD float bits_to_uniform_from_mantissa(uint32_t bits) {
  uint32_t one_k = 0x3f800000u + (bits >> 9);
  float f;
  memcpy(&f, &one_k, sizeof f);
  return f - 0.999999940395355224609375f;  // 1 - 2^-24
}


SPECDEC_HD float bits_to_uniform(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return bits_to_uniform_from_mantissa(bits);
#else
  return static_cast<float>(((bits >> 9) << 1) | 1u) * 5.9604644775390625e-08f;
#endif
}

// The uniform drawn for (seed, offset, position, purpose, vocab index).
SPECDEC_HD float philox_uniform(uint64_t seed, uint64_t offset, uint32_t position,
                                uint32_t purpose, uint32_t index) {
  const Philox4 r = philox_block(seed, offset, position, purpose, index >> 2);
  return bits_to_uniform(r.x[index & 3u]);
}

}  // namespace specdec
