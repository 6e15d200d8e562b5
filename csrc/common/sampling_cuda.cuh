// Device-side building blocks shared by the sampling kernels (chain:
// rejection/rejection_kernels.cu, tree: tree_verify/tree_verify_kernels.cu). CUDA only,
// no torch headers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "sampling_math.h"

namespace specdec {
namespace cuda {

constexpr int kMaxThreads = 1024;
constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

// Whether a row can be read 4 entries at a time (16 bytes for fp32, 8 for half types).
template <typename T>
__device__ __forceinline__ bool aligned4(const T* row) {
  return row != nullptr && (reinterpret_cast<uintptr_t>(row) % (4 * sizeof(T))) == 0;
}

// Four consecutive entries i0 .. i0+3 of a row; entries at or past `vocab` read as 0.
template <typename T>
__device__ __forceinline__ void load4(const T* __restrict__ row, int64_t vocab, int64_t i0, bool aligned,
                                      float out[4]) {
  if (aligned && i0 + 3 < vocab) {
    if constexpr (sizeof(T) == 4) {
      const float4 v = *reinterpret_cast<const float4*>(row + i0);
      out[0] = v.x; out[1] = v.y; out[2] = v.z; out[3] = v.w;
    } else {
      const uint2 v = *reinterpret_cast<const uint2*>(row + i0);
      const T* h = reinterpret_cast<const T*>(&v);
#pragma unroll
      for (int j = 0; j < 4; ++j) out[j] = to_float(h[j]);
    }
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) out[j] = i0 + j < vocab ? to_float(row[i0 + j]) : 0.f;
  }
}

// Four consecutive entries i0 .. i0+3 that all lie inside the row (no bounds checks):
// one 16-byte (fp32) or 8-byte (half types) load when kAligned.
template <bool kAligned, typename T>
__device__ __forceinline__ void load4_full(const T* __restrict__ row, int64_t i0, float out[4]) {
  if constexpr (kAligned && sizeof(T) == 4) {
    const float4 v = *reinterpret_cast<const float4*>(row + i0);
    out[0] = v.x; out[1] = v.y; out[2] = v.z; out[3] = v.w;
  } else if constexpr (kAligned) {
    const uint2 v = *reinterpret_cast<const uint2*>(row + i0);
    const T* h = reinterpret_cast<const T*>(&v);
#pragma unroll
    for (int j = 0; j < 4; ++j) out[j] = to_float(h[j]);
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) out[j] = to_float(row[i0 + j]);
  }
}

// Raises a racer's bar (race_update in sampling_math.h) to the highest bar of the warp's
// active lanes, so that every lane skips the entries that cannot beat the best score the
// warp has reached so far, not only its own: with one best per thread a warp would run an
// entry's log path whenever any of its 32 lanes may win there. A bar is -1, 0 or a positive
// (possibly infinite) score; their bit patterns as int32 order as the floats do, so one
// integer max reduction (REDUX, sm_80 and later) finds it. Any lanes may be active (the
// last trip of a loop may hold part of a warp). Before sm_80 each lane keeps its own bar.
__device__ __forceinline__ void warp_raise_bar(float& bar) {
#if __CUDA_ARCH__ >= 800
  bar = __int_as_float(__reduce_max_sync(__activemask(), __float_as_int(bar)));
#endif
}

__device__ __forceinline__ ArgMax warp_argmax(ArgMax a) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    ArgMax b{__shfl_down_sync(kFullMask, a.score, o),
             static_cast<int64_t>(__shfl_down_sync(kFullMask, static_cast<long long>(a.index), o))};
    a = argmax_merge(a, b);
  }
  return a;
}

// Block-wide argmax (first index on ties) through `smem` (32 entries); every thread gets the result.
__device__ __forceinline__ ArgMax block_argmax(ArgMax a, ArgMax* smem) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  a = warp_argmax(a);
  if (lane == 0) smem[warp] = a;
  __syncthreads();
  if (warp == 0) {
    a = lane < static_cast<int>(blockDim.x >> 5) ? smem[lane] : argmax_init();
    a = warp_argmax(a);
    if (lane == 0) smem[0] = a;
  }
  __syncthreads();
  const ArgMax result = smem[0];
  __syncthreads();
  return result;
}

// Threads per block for rows of `vocab` entries read 4 at a time: a power of two in [32, 1024].
inline int threads_for_vocab(int64_t vocab) {
  int threads = 32;
  while (threads < kMaxThreads && 4 * static_cast<int64_t>(threads) < vocab) threads *= 2;
  return threads;
}

// Per-request barrier of a kernel that splits each request over `parts` blocks of a cooperative
// launch (all of them resident): wait until every block of the request has arrived at pass `pass`
// (1, 2, ...). `counter` counts block arrivals over the whole walk (zeroed on the stream by the
// launcher: a per-call workspace, no global state), so pass k is complete at parts * k; the last
// block to arrive goes on without polling. Each thread fences its own writes first; a block may
// reuse a buffer two passes later, after every block has passed the barrier in between.
__device__ __forceinline__ void request_barrier(unsigned* counter, int parts, unsigned pass) {
  __threadfence();
  __syncthreads();
  if (parts > 1 && threadIdx.x == 0) {
    const unsigned target = static_cast<unsigned>(parts) * pass;
    if (atomicAdd(counter, 1u) + 1u < target)
      while (*static_cast<volatile unsigned*>(counter) < target) {
#if __CUDA_ARCH__ >= 700
        __nanosleep(64);
#endif
      }
    __threadfence();
  }
  __syncthreads();
}

}  // namespace cuda
}  // namespace specdec
