// C++ CPU kernel of skinny_linear: out[r, o] = sum_i x[r, i] * weight[o, i] (+ bias[o]) for a few rows r,
// the product a decode step's verify forward makes in every linear layer of a CPU target.
//
// Why a kernel of its own: over 1-16 rows the BLAS sgemm of a CPU torch reaches neither the memory nor the
// arithmetic bound. Measured over SmolLM2-135M's 211 weight matrices (538 MB of float32, one thread, an
// AMD EPYC with AVX-512, where plain vector loads stream them in 21 ms; `python bench/bench_forward_cost.py
// --products`), ms for 1 / 2 / 3 / 8 / 16 / 32 rows: F.linear 46.6 / 74.6 / 93.8 / 74.4 / 95.1 / 138.6,
// this kernel 26.4 / 32.9 / 40.2 / 55.5 / 83.9 / 142.7.
//
// Layout of the work: every weight element is read from memory once. A tile holds OB weight rows and RB
// rows of x: per step of one vector (16 floats AVX-512, 8 AVX2) it loads OB + RB vectors and issues
// OB * RB fused multiply-adds into OB * RB vector accumulators, reduced across lanes once at the end of
// the row. The RB-row blocks of x after the first re-read the tile's weight rows from L1 (OB rows of
// 576-1536 floats: 18-48 KB). AVX-512: OB = 8, RB = 2 (16 accumulators of 32 registers); one row alone
// OB = 16, RB = 1; two rows alone OB = 16, RB = 2 (more weight rows streamed at once: 32.7 against 35 ms
// with 8 x 2). AVX2: OB = 4, RB = 2 (8 accumulators + 6 operands of 16 registers); one row alone OB = 8, RB = 1.
// Weight rows left over (out_features % OB) run as tiles of one row; the first elements of a row, up to a
// cache-line boundary of the weight, and the last partial vector are masked loads. Tasks of 16 weight rows
// go through at::parallel_for, which runs them serially here: the extension is compiled without OpenMP
// (as every CPU kernel of the package is), so the decode loop uses this kernel on one torch thread only.
//
// What g++ -O3 makes of the hot loop (objdump of tile_avx512<8, 2>): 22 instructions per 16 floats of 8
// weight rows, 16 vfmadd231ps with the weight as a memory operand (each weight vector read twice, the
// second time from L1) and 2 loads of x, no spills; tile_avx512<16, 1>: 16 vfmadd231ps and 1 load. So a
// weight float costs 1/16 of a load and R/16 FMA slots: one row is bound by memory (26.4 ms against the
// 21 ms stream), 16 rows by the FMA and load ports (R x 135M / 16 = 135M vector FMAs in 84 ms).
//
// Each output is one dot product summed lane by lane and then across lanes: another summation order
// than a BLAS's, so equal to F.linear to rounding (the decode loop's greedy output is checked token for
// token against the target's own generate()).
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <memory>

#include "linear_params.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SPECDEC_SKINNY_X86 1
#include <immintrin.h>
#endif

namespace specdec {
namespace {

// ------------------------------------------------------------------------------------------ scalar
// Any CPU: the same tiles without vectors (four partial sums per dot product).
void rows_scalar(const SkinnyLinearParams& p, int64_t o_begin, int64_t o_end) {
  const int64_t in = p.in_features;
  for (int64_t o = o_begin; o < o_end; ++o) {
    const float* w = p.weight + o * p.w_stride;
    for (int64_t r = 0; r < p.rows; ++r) {
      const float* x = p.x + r * p.x_stride;
      float s[4] = {0.f, 0.f, 0.f, 0.f};
      int64_t i = 0;
      for (; i + 4 <= in; i += 4) {
        for (int j = 0; j < 4; ++j) s[j] += w[i + j] * x[i + j];
      }
      for (; i < in; ++i) s[0] += w[i] * x[i];
      p.out[r * p.out_features + o] = (s[0] + s[1]) + (s[2] + s[3]) + (p.bias ? p.bias[o] : 0.f);
    }
  }
}

#ifdef SPECDEC_SKINNY_X86
#define SPECDEC_AVX512 __attribute__((target("avx512f,fma")))
#define SPECDEC_AVX2 __attribute__((target("avx2,fma")))

// Sum of the lanes of one vector (AVX2: 8, AVX-512: 16; halves added first).
SPECDEC_AVX2 inline float hsum_avx2(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// (The masked forms, with every lane selected, spell out the lanes the unmasked ones leave undefined:
// GCC 12 warns about those.)
SPECDEC_AVX512 inline float hsum_avx512(__m512 v) {
  const __m512 folded = _mm512_add_ps(v, _mm512_mask_shuffle_f32x4(v, 0xFFFF, v, v, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m128 zero = _mm_setzero_ps();
  __m128 s = _mm_add_ps(_mm512_mask_extractf32x4_ps(zero, 0xF, folded, 0),
                        _mm512_mask_extractf32x4_ps(zero, 0xF, folded, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// ------------------------------------------------------------------------------------------ AVX-512
template <int OB, int RB>
SPECDEC_AVX512 inline void tile_avx512(const SkinnyLinearParams& p, int64_t o0, int64_t r0) {
  const int64_t in = p.in_features;
  const float* w[OB];
  const float* x[RB];
  for (int a = 0; a < OB; ++a) w[a] = p.weight + (o0 + a) * p.w_stride;
  for (int b = 0; b < RB; ++b) x[b] = p.x + (r0 + b) * p.x_stride;
  __m512 acc[OB][RB];
  for (int a = 0; a < OB; ++a)
    for (int b = 0; b < RB; ++b) acc[a][b] = _mm512_setzero_ps();
  // The first few elements, up to the first weight address on a 64-byte line (a row's weight is often
  // not aligned: a checkpoint's tensors sit at any offset of its file), so that the loop's weight loads
  // never span two cache lines (the rows of a tile are usually aligned alike).
  int64_t i = std::min<int64_t>(in, ((64 - reinterpret_cast<uintptr_t>(w[0]) % 64) % 64) / sizeof(float));
  if (i > 0) {
    const __mmask16 m = static_cast<__mmask16>((1u << i) - 1u);
    __m512 wv[OB], xv[RB];
    for (int a = 0; a < OB; ++a) wv[a] = _mm512_maskz_loadu_ps(m, w[a]);
    for (int b = 0; b < RB; ++b) xv[b] = _mm512_maskz_loadu_ps(m, x[b]);
    for (int a = 0; a < OB; ++a)
      for (int b = 0; b < RB; ++b) acc[a][b] = _mm512_fmadd_ps(wv[a], xv[b], acc[a][b]);
  }
  for (; i + 16 <= in; i += 16) {
    __m512 wv[OB], xv[RB];
    for (int a = 0; a < OB; ++a) wv[a] = _mm512_loadu_ps(w[a] + i);
    for (int b = 0; b < RB; ++b) xv[b] = _mm512_loadu_ps(x[b] + i);
    for (int a = 0; a < OB; ++a)
      for (int b = 0; b < RB; ++b) acc[a][b] = _mm512_fmadd_ps(wv[a], xv[b], acc[a][b]);
  }
  if (i < in) {
    const __mmask16 m = static_cast<__mmask16>((1u << (in - i)) - 1u);
    __m512 wv[OB], xv[RB];
    for (int a = 0; a < OB; ++a) wv[a] = _mm512_maskz_loadu_ps(m, w[a] + i);
    for (int b = 0; b < RB; ++b) xv[b] = _mm512_maskz_loadu_ps(m, x[b] + i);
    for (int a = 0; a < OB; ++a)
      for (int b = 0; b < RB; ++b) acc[a][b] = _mm512_fmadd_ps(wv[a], xv[b], acc[a][b]);
  }
  for (int a = 0; a < OB; ++a) {
    const float bias = p.bias ? p.bias[o0 + a] : 0.f;
    for (int b = 0; b < RB; ++b) p.out[(r0 + b) * p.out_features + o0 + a] = hsum_avx512(acc[a][b]) + bias;
  }
}

template <int OB>
SPECDEC_AVX512 inline void column_avx512(const SkinnyLinearParams& p, int64_t o0) {
  int64_t r = 0;
  for (; r + 2 <= p.rows; r += 2) tile_avx512<OB, 2>(p, o0, r);
  if (r < p.rows) tile_avx512<OB, 1>(p, o0, r);
}

SPECDEC_AVX512 void rows_avx512(const SkinnyLinearParams& p, int64_t o_begin, int64_t o_end) {
  int64_t o = o_begin;
  if (p.rows == 1) {
    for (; o + 16 <= o_end; o += 16) tile_avx512<16, 1>(p, o, 0);
  } else if (p.rows == 2) {
    for (; o + 16 <= o_end; o += 16) tile_avx512<16, 2>(p, o, 0);
  }
  for (; o + 8 <= o_end; o += 8) column_avx512<8>(p, o);
  for (; o < o_end; ++o) column_avx512<1>(p, o);
}

// ------------------------------------------------------------------------------------------ AVX2
template <int OB, int RB>
SPECDEC_AVX2 inline void tile_avx2(const SkinnyLinearParams& p, int64_t o0, int64_t r0) {
  const int64_t in = p.in_features;
  const float* w[OB];
  const float* x[RB];
  for (int a = 0; a < OB; ++a) w[a] = p.weight + (o0 + a) * p.w_stride;
  for (int b = 0; b < RB; ++b) x[b] = p.x + (r0 + b) * p.x_stride;
  __m256 acc[OB][RB];
  for (int a = 0; a < OB; ++a)
    for (int b = 0; b < RB; ++b) acc[a][b] = _mm256_setzero_ps();
  alignas(32) static constexpr int32_t kLanes[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
  // As in tile_avx512: the first elements up to a 32-byte boundary of the weight.
  int64_t i = std::min<int64_t>(in, ((32 - reinterpret_cast<uintptr_t>(w[0]) % 32) % 32) / sizeof(float));
  if (i > 0) {
    const __m256i m = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kLanes + 8 - i));
    __m256 wv[OB], xv[RB];
    for (int a = 0; a < OB; ++a) wv[a] = _mm256_maskload_ps(w[a], m);
    for (int b = 0; b < RB; ++b) xv[b] = _mm256_maskload_ps(x[b], m);
    for (int a = 0; a < OB; ++a)
      for (int b = 0; b < RB; ++b) acc[a][b] = _mm256_fmadd_ps(wv[a], xv[b], acc[a][b]);
  }
  for (; i + 8 <= in; i += 8) {
    __m256 wv[OB], xv[RB];
    for (int a = 0; a < OB; ++a) wv[a] = _mm256_loadu_ps(w[a] + i);
    for (int b = 0; b < RB; ++b) xv[b] = _mm256_loadu_ps(x[b] + i);
    for (int a = 0; a < OB; ++a)
      for (int b = 0; b < RB; ++b) acc[a][b] = _mm256_fmadd_ps(wv[a], xv[b], acc[a][b]);
  }
  if (i < in) {
    const __m256i m = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kLanes + 8 - (in - i)));
    __m256 wv[OB], xv[RB];
    for (int a = 0; a < OB; ++a) wv[a] = _mm256_maskload_ps(w[a] + i, m);
    for (int b = 0; b < RB; ++b) xv[b] = _mm256_maskload_ps(x[b] + i, m);
    for (int a = 0; a < OB; ++a)
      for (int b = 0; b < RB; ++b) acc[a][b] = _mm256_fmadd_ps(wv[a], xv[b], acc[a][b]);
  }
  for (int a = 0; a < OB; ++a) {
    const float bias = p.bias ? p.bias[o0 + a] : 0.f;
    for (int b = 0; b < RB; ++b) p.out[(r0 + b) * p.out_features + o0 + a] = hsum_avx2(acc[a][b]) + bias;
  }
}

template <int OB>
SPECDEC_AVX2 inline void column_avx2(const SkinnyLinearParams& p, int64_t o0) {
  int64_t r = 0;
  for (; r + 2 <= p.rows; r += 2) tile_avx2<OB, 2>(p, o0, r);
  if (r < p.rows) tile_avx2<OB, 1>(p, o0, r);
}

SPECDEC_AVX2 void rows_avx2(const SkinnyLinearParams& p, int64_t o_begin, int64_t o_end) {
  int64_t o = o_begin;
  if (p.rows == 1) {
    for (; o + 8 <= o_end; o += 8) tile_avx2<8, 1>(p, o, 0);
  }
  for (; o + 4 <= o_end; o += 4) column_avx2<4>(p, o);
  for (; o < o_end; ++o) column_avx2<1>(p, o);
}
#endif  // SPECDEC_SKINNY_X86

}  // namespace

SkinnyIsa skinny_linear_isa() {
#ifdef SPECDEC_SKINNY_X86
  static const SkinnyIsa isa = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma")) return SkinnyIsa::kAvx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return SkinnyIsa::kAvx2;
    return SkinnyIsa::kScalar;
  }();
  return isa;
#else
  return SkinnyIsa::kScalar;
#endif
}

void skinny_linear_cpu(const SkinnyLinearParams& params, SkinnyIsa isa) {
  if (params.rows == 0 || params.out_features == 0) return;
  // The tiles peel elements until the weight row is on a cache-line boundary; x's rows are re-read for
  // every tile, so they are laid out here at the same offset within a line as the weight (a copy of a
  // few rows), making both loads of the inner loop aligned.
  SkinnyLinearParams p = params;
  std::unique_ptr<float[]> scratch;   // not zeroed: the kernels never read past in_features of a row
  const uintptr_t w_offset = reinterpret_cast<uintptr_t>(p.weight) % 64;
  const bool rows_alike = (p.w_stride * sizeof(float)) % 64 == 0;
  if (isa != SkinnyIsa::kScalar && rows_alike && w_offset % sizeof(float) == 0 &&
      (reinterpret_cast<uintptr_t>(p.x) % 64 != w_offset || (p.x_stride * sizeof(float)) % 64 != 0)) {
    const int64_t stride = (p.in_features + 15) / 16 * 16;
    scratch.reset(new float[static_cast<size_t>(p.rows * stride + 16)]);
    const uintptr_t base = reinterpret_cast<uintptr_t>(scratch.get());
    float* dst = scratch.get() + ((64 + w_offset - base % 64) % 64) / sizeof(float);
    for (int64_t r = 0; r < p.rows; ++r) {
      std::copy(p.x + r * p.x_stride, p.x + r * p.x_stride + p.in_features, dst + r * stride);
    }
    p.x = dst;
    p.x_stride = stride;
  }
  // Tasks of 16 weight rows (a multiple of every tile's OB), at least ~64K weight elements each.
  constexpr int64_t kBlock = 16;
  const int64_t blocks = (p.out_features + kBlock - 1) / kBlock;
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, kBlock * p.in_features));
  at::parallel_for(0, blocks, grain, [&](int64_t begin, int64_t end) {
    const int64_t o_begin = begin * kBlock, o_end = std::min(end * kBlock, p.out_features);
#ifdef SPECDEC_SKINNY_X86
    if (isa == SkinnyIsa::kAvx512) return rows_avx512(p, o_begin, o_end);
    if (isa == SkinnyIsa::kAvx2) return rows_avx2(p, o_begin, o_end);
#endif
    rows_scalar(p, o_begin, o_end);
  });
}

}  // namespace specdec
