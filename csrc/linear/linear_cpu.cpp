// C++ CPU kernel of skinny_linear: out[r, o] = sum_i x[r, i] * weight[o, i] (+ bias[o]) for a few rows r,
// the product a decode step's verify forward makes in every linear layer of a CPU target.
//
// Why a kernel of its own: over a few rows the BLAS sgemm of a CPU torch reaches neither the memory nor the
// arithmetic bound. Measured over SmolLM2-135M's 211 weight matrices (538 MB of float32, one thread;
// `python bench/bench_forward_cost.py --products`), ms for 1 / 2 / 3 / 8 / 12 / 16 / 32 rows:
// - an Intel Xeon with AVX-512 (2026-12-07, bench/forward_cost.json; its MKL multiplies 1-3 rows near the
//   memory bound): F.linear 43.8 / 44.9 / 47.7 / 98.6 / 123.8 / 105.8 / 116.1, this kernel 42.9 / 48.8 /
//   50.7 / 56.1 / 65.7 / 71.2 / 103.4 (the host was busier than in the morning, when F.linear took 38.3 ms
//   for one row and the kernel 36.6 / 39.7 / 42.1 / 56.0 / - / 60.0 / 88.2);
// - an AMD EPYC with AVX-512 (earlier runs, before the broadcast tiles and the prefetches; plain vector
//   loads stream the weights in 21 ms there): F.linear 46.6 / 74.6 / 93.8 / 74.4 / - / 95.1 / 138.6, this
//   kernel 26.4 / 32.9 / 40.2 / 55.5 / - / 83.9 / 142.7.
//
// Dot-product tiles (every ISA; AVX-512 for 1-3 rows, below kBroadcastRows). Every weight element is read
// from memory once. A tile holds OB weight rows and RB rows of x: per step of one vector (16 floats AVX-512,
// 8 AVX2) it loads OB + RB vectors and issues OB * RB fused multiply-adds into OB * RB vector accumulators,
// reduced across lanes once at the end of the row. The RB-row blocks of x after the first re-read the tile's
// weight rows from L1 (OB rows of 576-1536 floats: 18-48 KB). AVX-512: OB = 8, RB = 2 (16 accumulators of 32
// registers); one row alone OB = 16, RB = 1; two rows alone OB = 16, RB = 2 (more weight rows streamed at
// once: 32.7 against 35 ms with 8 x 2 on the EPYC). The AVX-512 tiles of two rows prefetch each weight row
// kDotPrefetch bytes ahead (the Xeon: 2 rows 48.1 -> 42.7 ms, 8 rows 63.8 -> 58.5 when they ran 8 rows; one
// row streams as fast without). AVX2: OB = 4, RB = 2 (8 accumulators + 6 operands of 16 registers); one row
// alone OB = 8, RB = 1. Weight rows left over (out_features % OB) run as tiles of one row; the first elements
// of a row, up to a cache-line boundary of the weight, and the last partial vector are masked loads. Tasks of
// 16 weight rows go through at::parallel_for, which runs them serially here: the extension is compiled
// without OpenMP (as every CPU kernel of the package is), so the decode loop uses this kernel on one torch
// thread only.
//
// What g++ -O3 makes of the hot loop (objdump of tile_avx512<8, 2>): 22 instructions per 16 floats of 8
// weight rows, 16 vfmadd231ps with the weight as a memory operand (each weight vector read twice, the
// second time from L1) and 2 loads of x, no spills; tile_avx512<16, 1>: 16 vfmadd231ps and 1 load. So a
// weight float costs 1/16 of a load and R/16 FMA slots: one row is bound by memory, more rows by the FMA
// and load ports and by the weight re-reads and the reductions across lanes that grow with R.
//
// Broadcast tiles (AVX-512, blocks of 4 to 32 rows): see tile_broadcast_avx512. Per element of 12 weight
// rows, unrolled by 16 (objdump of tile_broadcast_avx512<12, 2, 1>): 12 vbroadcastss, 24 vfmadd231ps and 2
// aligned loads of x, the accumulators in zmm3-zmm27; <12, 1, 1>: 12 vfmadd231ps with the broadcast as a
// memory operand ({1to16}) and 1 load; <12, 2, 4> per group of 4 elements: 12 vbroadcastf32x4 and 24
// vfmadd231ps. On the Xeon (a standalone copy of the loops, one process): 4-8 rows 42-45 ms with groups of 4
// against the dot tiles' 44.5-56.0, 12-16 rows 51-60 ms (bound by the broadcasts: a vector FMA per 16 rows
// of one weight element), 24-32 rows 82-91 ms (the FMA ports: 2 x 135M vector FMAs).
//
// Each output of the dot tiles is one dot product summed lane by lane and then across lanes; each output of
// the broadcast tiles one sum in element order (groups of 4: four such sums added at the end). Both are other
// summation orders than a BLAS's, so equal to F.linear to rounding (the decode loop's greedy output is
// checked token for token against the target's own generate()).
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
constexpr int kDotPrefetch = 512;  // bytes ahead of the tiles of two rows' weight loads (0: none)
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
    if (kDotPrefetch > 0 && RB > 1) {
      for (int a = 0; a < OB; ++a)
        _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(w[a] + i) + kDotPrefetch), _MM_HINT_T0);
    }
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

// ------------------------------------------------------------------------------------------ AVX-512, more rows
// From kBroadcastRows rows of x on, the dot tiles above re-read each weight block from L1/L2 once per pair
// of rows and pay a reduction across lanes per output. The broadcast tiles run the vector across rows
// instead: each group of G consecutive weight elements of a row (G = 1: one element; G = 4: four, a
// 128-bit load) is broadcast into a vector and multiplied into NV vectors of x laid out transposed, a vector
// holding 16 / G rows times the same G elements (xt[i / G][v][r * G + i % G] = x[v * 16 / G + r][i]; rows
// past the block and elements past in_features zero), OB weight rows at a time: OB x NV accumulators, the
// G lanes of a row's output added at the end. Every weight element is read once (a 1 / G broadcast load)
// and feeds NV x G / 16 vector FMAs per row of x. G = 4 up to kScalarRows rows (NV = 1-3 vectors of 4 rows,
// OB = 12, 12, 8), G = 1 beyond (NV = 1-2 vectors of 16 rows, OB = 12): 24 of 32 registers at most. The OB
// weight rows are OB streams advancing G x 4 bytes a step: each gets a prefetch kBroadcastPrefetch bytes
// ahead once every 16 elements (without it the loop waits on them: 78 against 60 ms over SmolLM2-135M's
// matrices at 16 rows on the Xeon, measured with a standalone copy of the loop; 256 bytes ahead for
// G = 1, 512 for G = 4, the best of 128-1024).
constexpr int64_t kBroadcastRows = 4;    // rows of a block from which the broadcast tiles run
constexpr int64_t kScalarRows = 12;      // rows of a block up to which they broadcast groups of G = 4
constexpr int64_t kBroadcastBlock = 32;  // rows of x per block (G = 1, NV = 2)

template <int OB, int NV, int G>
SPECDEC_AVX512 inline void tile_broadcast_avx512(const SkinnyLinearParams& p, const float* xt, int64_t o0) {
  static_assert(G == 1 || G == 4, "groups of 1 or 4 weight elements");
  constexpr int64_t kPrefetch = G == 1 ? 256 : 512;
  const int64_t in = p.in_features;
  const float* w[OB];
  for (int a = 0; a < OB; ++a) w[a] = p.weight + (o0 + a) * p.w_stride;
  __m512 acc[OB][NV];
  for (int a = 0; a < OB; ++a)
    for (int v = 0; v < NV; ++v) acc[a][v] = _mm512_setzero_ps();
  // One group of the OB rows at element i: NV loads of x, OB broadcasts, OB x NV FMAs. `tail`: the
  // group runs past in_features (G = 4 only), its weight loads are masked.
  auto step = [&](int64_t i, __mmask16 tail) SPECDEC_AVX512 {
    __m512 xv[NV];
    for (int v = 0; v < NV; ++v) xv[v] = _mm512_load_ps(xt + ((i / G) * NV + v) * 16);
    for (int a = 0; a < OB; ++a) {
      __m512 wb;
      if constexpr (G == 1) {
        wb = _mm512_set1_ps(w[a][i]);
      } else {
        if (tail) {  // the first 128 bits of a masked load, in every 128-bit lane
          const __m512 part = _mm512_maskz_loadu_ps(tail, w[a] + i);
          wb = _mm512_mask_shuffle_f32x4(part, 0xFFFF, part, part, 0);
        } else {  // (the masked forms with every lane selected: see hsum_avx512)
          wb = _mm512_mask_broadcast_f32x4(_mm512_setzero_ps(), 0xFFFF, _mm_loadu_ps(w[a] + i));
        }
      }
      for (int v = 0; v < NV; ++v) acc[a][v] = _mm512_fmadd_ps(wb, xv[v], acc[a][v]);
    }
  };
  int64_t i = 0;
  for (; i + 16 <= in; i += 16) {
    // (an address past the weight's end may be prefetched: a prefetch never faults)
    for (int a = 0; a < OB; ++a)
      _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(w[a] + i) + kPrefetch), _MM_HINT_T0);
    // unrolled: the OB row pointers advance once per 16 elements, not once per group
#pragma GCC unroll 16
    for (int64_t j = 0; j < 16; j += G) step(i + j, 0);
  }
  for (; i + G <= in; i += G) step(i, 0);
  if (i < in) step(i, static_cast<__mmask16>((1u << (in - i)) - 1u));
  alignas(64) float lanes[16];
  constexpr int kRowsPerVector = 16 / G;
  for (int a = 0; a < OB; ++a) {
    const float bias = p.bias ? p.bias[o0 + a] : 0.f;
    for (int v = 0; v < NV; ++v) {
      _mm512_store_ps(lanes, acc[a][v]);
      const int64_t n = std::min<int64_t>(kRowsPerVector, p.rows - kRowsPerVector * v);
      for (int64_t r = 0; r < n; ++r) {
        float sum = lanes[r * G];
        if constexpr (G == 4) sum = (lanes[r * 4] + lanes[r * 4 + 1]) + (lanes[r * 4 + 2] + lanes[r * 4 + 3]);
        p.out[(kRowsPerVector * v + r) * p.out_features + o0 + a] = sum + bias;
      }
    }
  }
}

template <int OB, int NV, int G>
SPECDEC_AVX512 void rows_broadcast_avx512(const SkinnyLinearParams& p, const float* xt, int64_t o_begin,
                                          int64_t o_end) {
  int64_t o = o_begin;
  for (; o + OB <= o_end; o += OB) tile_broadcast_avx512<OB, NV, G>(p, xt, o);
  for (; o + 4 <= o_end; o += 4) tile_broadcast_avx512<4, NV, G>(p, xt, o);
  for (; o < o_end; ++o) tile_broadcast_avx512<1, NV, G>(p, xt, o);
}

// One block of kBroadcastRows to kBroadcastBlock rows: x transposed into an aligned scratch, then tasks of
// 48 weight rows (a multiple of every tile's OB).
void block_broadcast_avx512(const SkinnyLinearParams& p) {
  const int64_t group = p.rows <= kScalarRows ? 4 : 1;
  const int64_t rows_per_vector = 16 / group;
  const int64_t nv = (p.rows + rows_per_vector - 1) / rows_per_vector;
  const int64_t groups = (p.in_features + group - 1) / group;
  std::unique_ptr<float[]> scratch(new float[static_cast<size_t>(groups * nv * 16 + 16)]);
  float* xt = scratch.get() + ((64 - reinterpret_cast<uintptr_t>(scratch.get()) % 64) % 64) / sizeof(float);
  std::fill(xt, xt + groups * nv * 16, 0.f);
  for (int64_t r = 0; r < p.rows; ++r) {
    const float* x = p.x + r * p.x_stride;
    float* lane = xt + (r / rows_per_vector) * 16 + (r % rows_per_vector) * group;
    for (int64_t i = 0; i < p.in_features; ++i) lane[(i / group) * nv * 16 + i % group] = x[i];
  }
  constexpr int64_t kBlock = 48;
  const int64_t blocks = (p.out_features + kBlock - 1) / kBlock;
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, kBlock * p.in_features));
  at::parallel_for(0, blocks, grain, [&](int64_t begin, int64_t end) {
    const int64_t o_begin = begin * kBlock, o_end = std::min(end * kBlock, p.out_features);
    if (group == 1) {
      if (nv == 2) return rows_broadcast_avx512<12, 2, 1>(p, xt, o_begin, o_end);
      return rows_broadcast_avx512<12, 1, 1>(p, xt, o_begin, o_end);
    }
    if (nv == 3) return rows_broadcast_avx512<8, 3, 4>(p, xt, o_begin, o_end);
    if (nv == 2) return rows_broadcast_avx512<12, 2, 4>(p, xt, o_begin, o_end);
    rows_broadcast_avx512<12, 1, 4>(p, xt, o_begin, o_end);
  });
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

static void skinny_linear_dot(const SkinnyLinearParams& params, SkinnyIsa isa);

void skinny_linear_cpu(const SkinnyLinearParams& params, SkinnyIsa isa) {
  if (params.rows == 0 || params.out_features == 0) return;
#ifdef SPECDEC_SKINNY_X86
  if (isa == SkinnyIsa::kAvx512 && params.rows >= kBroadcastRows) {
    // blocks of kBroadcastBlock rows; a last block of fewer than kBroadcastRows rows takes the dot tiles
    for (int64_t r0 = 0; r0 < params.rows; r0 += kBroadcastBlock) {
      SkinnyLinearParams block = params;
      block.x = params.x + r0 * params.x_stride;
      block.out = params.out + r0 * params.out_features;
      block.rows = std::min(kBroadcastBlock, params.rows - r0);
      if (block.rows >= kBroadcastRows) {
        block_broadcast_avx512(block);
      } else {
        skinny_linear_dot(block, isa);
      }
    }
    return;
  }
#endif
  skinny_linear_dot(params, isa);
}

// The dot-product tiles (every ISA; AVX-512 below kBroadcastRows rows).
static void skinny_linear_dot(const SkinnyLinearParams& params, SkinnyIsa isa) {
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
