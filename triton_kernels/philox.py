"""Philox4x32-10 and the specdec_ops random-number scheme (csrc/common/philox.h) in Triton.

counter = (vocab_index // 4, position, lo32(offset), (hi32(offset) << 8) | purpose),
key = (lo32(seed), hi32(seed)); word vocab_index % 4 of the block.

Vocabulary-wide races use philox_tile: one block per group of 4 consecutive entries
(a quarter of the per-entry evaluation of philox_bits, the same numbers).
"""

import triton
import triton.language as tl

PURPOSE_ACCEPT = tl.constexpr(0)
PURPOSE_RESIDUAL = tl.constexpr(1)
PURPOSE_BONUS = tl.constexpr(2)

_M0 = tl.constexpr(0xD2511F53)
_M1 = tl.constexpr(0xCD9E8D57)
_W0 = tl.constexpr(0x9E3779B9)
_W1 = tl.constexpr(0xBB67AE85)


@triton.jit
def philox4x32_10(c0, c1, c2, c3, k0, k1):
    """All arguments uint32 (tensors or scalars); returns the four output words."""
    for _ in tl.static_range(10):
        # one 32 x 32 -> 64-bit product per multiplier: both halves from one IMAD.WIDE.U32
        wide1 = c2.to(tl.uint64) * _M1
        wide0 = c0.to(tl.uint64) * _M0
        c0 = (wide1 >> 32).to(tl.uint32) ^ c1 ^ k0
        c2 = (wide0 >> 32).to(tl.uint32) ^ c3 ^ k1
        c1 = wide1.to(tl.uint32)
        c3 = wide0.to(tl.uint32)
        k0 = k0 + _W0
        k1 = k1 + _W1
    return c0, c1, c2, c3


@triton.jit
def philox_bits(seed, offset, position, purpose, index):
    """32 random bits (uint32) for (seed, offset, position, purpose, index).

    seed, offset: int64 scalars; purpose: int scalar; position: int scalar or
    tensor; index: int64 tensor (its shape is the result's).
    """
    seed = seed.to(tl.uint64, bitcast=True)
    offset = offset.to(tl.uint64, bitcast=True)
    index = index.to(tl.uint64, bitcast=True)
    k0 = (seed & 0xFFFFFFFF).to(tl.uint32)
    k1 = (seed >> 32).to(tl.uint32)
    c0 = (index >> 2).to(tl.uint32)
    zero = tl.zeros_like(c0)
    c1 = ((zero.to(tl.int64) + position).to(tl.uint64, bitcast=True) & 0xFFFFFFFF).to(tl.uint32)
    c2 = (offset & 0xFFFFFFFF).to(tl.uint32) + zero
    c3 = ((((offset >> 32) << 8) & 0xFFFFFFFF).to(tl.uint32) + zero) | (zero.to(tl.int32) + purpose).to(tl.uint32)
    r0, r1, r2, r3 = philox4x32_10(c0, c1, c2, c3, k0, k1)
    word = (index & 3).to(tl.uint32)
    return tl.where(word == 0, r0, tl.where(word == 1, r1, tl.where(word == 2, r2, r3)))


@triton.jit
def philox_quads(seed, offset, position, purpose, start, GROUPS: tl.constexpr):
    """(r0, r1, r2, r3), each [GROUPS] uint32: the bits of the groups of 4 entries from `start` (int32 scalar, a
    multiple of 4), r_i[g] those of entry start + 4 g + i: one Philox block a group, in the layout of the group
    index (no reshuffling between threads)."""
    return philox_groups(seed, offset, position, purpose, start // 4 + tl.arange(0, GROUPS))


@triton.jit
def philox_groups(seed, offset, position, purpose, groups):
    """(r0, r1, r2, r3) shaped like `groups` (int32 tensor of group indices g): the bits of entries 4 g + i. Given
    the tensor a load's pointers come from, the bits are computed in that load's layout."""
    seed = seed.to(tl.uint64, bitcast=True)
    offset = offset.to(tl.uint64, bitcast=True)
    k0 = (seed & 0xFFFFFFFF).to(tl.uint32)
    k1 = (seed >> 32).to(tl.uint32)
    c0 = groups.to(tl.uint32)
    zero = tl.zeros_like(c0)
    c1 = ((zero.to(tl.int64) + position).to(tl.uint64, bitcast=True) & 0xFFFFFFFF).to(tl.uint32)
    c2 = (offset & 0xFFFFFFFF).to(tl.uint32) + zero
    c3 = ((((offset >> 32) << 8) & 0xFFFFFFFF).to(tl.uint32) + zero) | (zero.to(tl.int32) + purpose).to(tl.uint32)
    return philox4x32_10(c0, c1, c2, c3, k0, k1)


@triton.jit
def philox_tile(seed, offset, position, purpose, start, BLOCK: tl.constexpr):
    """[BLOCK] uint32: the bits of vocabulary entries start .. start + BLOCK - 1.

    start: int32 scalar, a multiple of 4; BLOCK a multiple of 4. Equal to
    philox_bits(seed, offset, position, purpose, start + arange(BLOCK)), with one
    Philox block per group of 4 entries (its words 0..3 are entries 4g .. 4g + 3).
    """
    r0, r1, r2, r3 = philox_quads(seed, offset, position, purpose, start, BLOCK // 4)
    # join(join(r0, r2), join(r1, r3))[g, j, i] is word 2 j + i of block g: row-major flattening
    # puts it at 4 g + 2 j + i, its vocabulary entry.
    return tl.reshape(tl.join(tl.join(r0, r2), tl.join(r1, r3)), [BLOCK])


@triton.jit
def bits_to_uniform(bits):
    """float32 strictly inside (0, 1): (2k + 1) / 2^24 with k the top 23 bits."""
    return (((bits >> 9) << 1) | 1).to(tl.float32) * 5.9604644775390625e-08


@triton.jit
def uniform_mantissa(bits):
    """f = 1 + k 2^-23 (float32 in [1, 2)) with k the top 23 bits: the uniform of bits_to_uniform is
    u = (2k + 1) 2^-24 = f - 1 + 2^-24, and 1 - u = (2 - f) - 2^-24, both exactly (csrc/common/philox.h
    bits_to_uniform_from_mantissa); the races' skip test is linear in f (rejection.py race_cut)."""
    return ((bits >> 9) | 0x3F800000).to(tl.float32, bitcast=True)


@triton.jit
def exp_noise(bits):
    return -tl.log(bits_to_uniform(bits))
