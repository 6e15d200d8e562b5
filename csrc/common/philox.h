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

SPECDEC_HD Philox4 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3,
                                 uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int round = 0; round < 10; ++round) {
    const uint32_t hi0 = mulhi32(kM0, c0), lo0 = kM0 * c0;
    const uint32_t hi1 = mulhi32(kM1, c2), lo1 = kM1 * c2;
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += kW0;
    k1 += kW1;
  }
  return Philox4{{c0, c1, c2, c3}};
}

// The Philox block holding the numbers of vocab indices 4*group .. 4*group+3.
SPECDEC_HD Philox4 philox_block(uint64_t seed, uint64_t offset, uint32_t position,
                                uint32_t purpose, uint32_t group) {
  return philox4x32_10(group, position, static_cast<uint32_t>(offset),
                       (static_cast<uint32_t>(offset >> 32) << 8) | purpose,
                       static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
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

// 1 - bits_to_uniform(bits), exactly: (2^24 - 2k - 1) 2^-24 is the uniform of k' = 2^23 - 1 - k, the top 23
// bits of ~bits (tests/cpp checks every k).
SPECDEC_HD float one_minus_uniform_from_mantissa(uint32_t bits) { return bits_to_uniform_from_mantissa(~bits); }

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
