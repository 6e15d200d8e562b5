// CUDA kernels of kv_commit (DESIGN.md §5.5). Raw pointers only, no torch headers:
// kv_op.cpp checks tensors and passes KVCommitParams.
//
// Two kernels on the caller's stream, and no global mutable state:
//   * kv_move_kernel moves every cache in one launch. It only READS seq_lens.
//   * kv_advance_kernel then advances seq_lens[b] by the path length. Stream order
//     puts it after every block of the move launch, so no block can see an advanced
//     seq_lens[b], on any stream, under graph capture or replay on another stream,
//     and nothing carries over between launches.
// The per-cache descriptors (pointer, byte strides, heads, head dim, copy width)
// travel BY VALUE in the move kernel's parameters (KVMoveLaunch, ~7 KiB for 128
// caches; CUDA >= 12.1 allows 32 KiB on sm_70+), so a CUDA graph captures them with
// no host-to-device copy. More than 128 caches are split into several move launches
// on the same stream, all before the one advance launch.
//
// Move grid (request, cache, column split). A block:
//   1. warp 0 reads seq_lens[b] and 32 path entries at once (one memory round trip:
//      no dependency between them), takes each entry's predecessor from the lane
//      below (__shfl_up), and applies the block-free rule (kv_path_entry_rule). If no
//      entry before the first failing one moves (a fully accepted chain), the block
//      exits here: no block-table read, no per-element work (kv_path_moves_nothing).
//   2. otherwise (paged) the lanes look their slots up in the block table (second
//      round trip) and write the byte offsets of the moving slots to shared memory;
//   3. every thread owns fixed columns (16-byte units where alignment allows) and
//      copies them for the moves in increasing order, kLoadBatch loads in flight
//      before their stores: alias-safe by the argument in kv_math.h (no thread reads
//      what another wrote: the columns are disjoint).
// Advance grid: one warp per request runs the same chunk scan and lane 0 writes
// seq_lens[b] += length.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kv_params.h"

namespace specdec {
namespace {

constexpr int kMaxCachesPerLaunch = 128;
constexpr int kThreads = 128;
constexpr int kMinBlocksPerSM = 10;  // one-chunk kernel: <= 48 registers, 10 blocks (1280 threads) per SM
constexpr int kPathChunk = 32;       // path entries checked per warp pass
constexpr int kLoadBatch = 4;        // loads in flight per thread before the stores
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kAdvanceWarps = 4;     // requests per block of the advance kernel

struct KVMoveLaunch {
  KVCacheDesc caches[kMaxCachesPerLaunch];
  KVGeometry geometry;
  const void* accepted_path;
  int64_t path_stride;
  int64_t max_path;
  const int32_t* seq_lens;
  bool path_i64;
};

template <int kBytes> struct UnitType;
template <> struct UnitType<16> { using T = uint4; };
template <> struct UnitType<8> { using T = uint2; };
template <> struct UnitType<4> { using T = uint32_t; };
template <> struct UnitType<2> { using T = uint16_t; };
template <> struct UnitType<1> { using T = uint8_t; };

// One warp's pass over path entries [base, base + 32) of request b (every lane calls it).
struct KVChunk {
  int num_valid;     // leading valid entries of the chunk
  unsigned movers;   // lanes < num_valid with a != i
  bool ended;        // the path ends inside this chunk (num_valid < 32)
  int64_t last;      // entry base + 31 (the next chunk's predecessor of its lane 0)
  KVSlotAddr src, dst;
};

// skip_if_still: when no entry moves before the first rule failure, stop before the
// block table (movers = 0, ended = true; num_valid is then not the length).
__device__ __forceinline__ KVChunk kv_scan_chunk(const KVGeometry& g, const void* path, bool path_i64,
                                                 int64_t row_offset, int64_t max_path, int64_t b, int64_t seq_len,
                                                 int64_t base, int64_t prev_last, bool skip_if_still) {
  const int lane = threadIdx.x & 31;
  const int64_t i = base + lane;
  const int64_t a = i < max_path ? kv_load_index(path, path_i64, row_offset + i) : -1;
  int64_t prev = __shfl_up_sync(kFullMask, a, 1);
  if (lane == 0) prev = prev_last;
  KVPathStatus s = i < max_path ? kv_path_entry_rule(g, seq_len, i, a, prev) : KVPathStatus::kEnd;
  const unsigned rule_bad = __ballot_sync(kFullMask, s != KVPathStatus::kOk);
  const int rule_valid = rule_bad ? __ffs(rule_bad) - 1 : 32;
  KVChunk r;
  r.last = __shfl_sync(kFullMask, a, 31);
  r.src = KVSlotAddr{0, 0};
  r.dst = KVSlotAddr{0, 0};
  const unsigned candidates = __ballot_sync(kFullMask, lane < rule_valid && a != i);
  if (skip_if_still && candidates == 0 && rule_valid < 32) {
    r.num_valid = rule_valid;
    r.movers = 0;
    r.ended = true;
    return r;
  }
  bool ok = lane < rule_valid;
  if (ok) {
    ok = kv_locate(g, b, seq_len + a, &r.src) == KVPathStatus::kOk &&
         (a == i ? (r.dst = r.src, true) : kv_locate(g, b, seq_len + i, &r.dst) == KVPathStatus::kOk);
  }
  const unsigned bad = __ballot_sync(kFullMask, !ok);
  r.num_valid = bad ? __ffs(bad) - 1 : 32;
  r.movers = candidates & (r.num_valid == 32 ? kFullMask : ((1u << r.num_valid) - 1u));
  r.ended = r.num_valid < 32;
  return r;
}

// Moves n slots (byte offsets src[k] -> dst[k], in increasing path order) of the
// columns unit_begin, unit_begin + unit_stride, ... of one cache. 32-bit column
// indices: the op checks num_heads * head_dim * elem_size < 2^31.
template <int kBytes>
__device__ __forceinline__ void copy_moves(const KVCacheDesc& c, const int64_t* src, const int64_t* dst, int n,
                                           int unit_begin, int unit_stride) {
  using T = typename UnitType<kBytes>::T;
  const int units = static_cast<int>(kv_units_per_slot(c));
#pragma unroll 1
  for (int u = unit_begin; u < units; u += unit_stride) {
    uint8_t* column = c.data + kv_unit_offset(c, u);
#pragma unroll 1
    for (int k = 0; k < n; k += kLoadBatch) {
      T v[kLoadBatch];
#pragma unroll
      for (int j = 0; j < kLoadBatch; ++j) {
        if (k + j < n) v[j] = *reinterpret_cast<const T*>(column + src[k + j]);
      }
#pragma unroll
      for (int j = 0; j < kLoadBatch; ++j) {
        if (k + j < n) *reinterpret_cast<T*>(column + dst[k + j]) = v[j];
      }
    }
  }
}

// kOneChunk: max_path <= 32 (every tree or chain of practical size), one pass and
// no loop, so nothing of the scan stays live across the copies.
template <bool kOneChunk>
__global__ void __launch_bounds__(kThreads, kOneChunk ? kMinBlocksPerSM : 1) kv_move_kernel(const __grid_constant__ KVMoveLaunch L) {
  __shared__ int64_t s_src[kPathChunk], s_dst[kPathChunk];
  __shared__ int s_count, s_done;

  const int64_t b = blockIdx.x;
  const KVCacheDesc& c = L.caches[blockIdx.y];
  const int unit_begin = static_cast<int>(blockIdx.z) * kThreads + static_cast<int>(threadIdx.x);
  const int unit_stride = static_cast<int>(gridDim.z) * kThreads;
  const int64_t row = b * L.path_stride;

  int64_t seq_len = 0, prev_last = -1;
  if (threadIdx.x < 32) seq_len = L.seq_lens[b];  // same address in every lane: one transaction
  for (int64_t base = 0;; base += kPathChunk) {
    if (threadIdx.x < 32) {
      const KVChunk r = kv_scan_chunk(L.geometry, L.accepted_path, L.path_i64, row, L.max_path, b, seq_len, base,
                                      prev_last, /*skip_if_still=*/true);
      prev_last = r.last;
      const int lane = threadIdx.x;
      if ((r.movers >> lane) & 1u) {
        const int slot = __popc(r.movers & ((1u << lane) - 1u));
        s_src[slot] = kv_slot_offset(c, r.src);
        s_dst[slot] = kv_slot_offset(c, r.dst);
      }
      if (lane == 0) {
        s_count = __popc(r.movers);
        s_done = r.ended;
      }
    }
    __syncthreads();
    const int n = s_count;
    const bool done = s_done != 0;
    if (n > 0) {
      switch (c.unit_bytes) {
        case 16: copy_moves<16>(c, s_src, s_dst, n, unit_begin, unit_stride); break;
        case 8: copy_moves<8>(c, s_src, s_dst, n, unit_begin, unit_stride); break;
        case 4: copy_moves<4>(c, s_src, s_dst, n, unit_begin, unit_stride); break;
        case 2: copy_moves<2>(c, s_src, s_dst, n, unit_begin, unit_stride); break;
        default: copy_moves<1>(c, s_src, s_dst, n, unit_begin, unit_stride); break;
      }
    }
    if (kOneChunk || done) break;
    __syncthreads();  // warp 0 rewrites s_src / s_dst / s_count next pass
  }
}

__global__ void __launch_bounds__(kAdvanceWarps * 32) kv_advance_kernel(KVGeometry g, const void* accepted_path,
                                                                        bool path_i64, int64_t path_stride,
                                                                        int64_t max_path, int32_t* seq_lens,
                                                                        int64_t batch) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * kAdvanceWarps + (threadIdx.x >> 5);
  if (b >= batch) return;  // whole warps leave together
  const int64_t seq_len = seq_lens[b];
  int64_t length = 0, prev_last = -1;
  for (int64_t base = 0;; base += kPathChunk) {
    const KVChunk r = kv_scan_chunk(g, accepted_path, path_i64, b * path_stride, max_path, b, seq_len, base,
                                    prev_last, /*skip_if_still=*/false);
    length += r.num_valid;
    prev_last = r.last;
    if (r.ended) break;
  }
  if ((threadIdx.x & 31) == 0) seq_lens[b] = static_cast<int32_t>(seq_len + length);  // <= INT32_MAX by the rule
}

int multiprocessor_count() {
  int device = 0, count = 0;
  cudaGetDevice(&device);
  if (cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    cudaGetLastError();
    return 108;
  }
  return count;
}

}  // namespace

cudaError_t launch_kv_commit_cuda(const KVCommitParams& p, cudaStream_t stream) {
  if (p.batch == 0) return cudaSuccess;
  const int sms = multiprocessor_count();
  KVMoveLaunch L;
  L.geometry = p.geometry;
  L.accepted_path = p.accepted_path;
  L.path_stride = p.path_stride;
  L.max_path = p.max_path;
  L.seq_lens = p.seq_lens;
  L.path_i64 = p.path_i64;
  // The op checks B < 2^31: requests fit grid axis x (and the advance grid) in one launch.
  for (int64_t c0 = 0; c0 < p.num_caches; c0 += kMaxCachesPerLaunch) {
    const int nc = static_cast<int>(std::min<int64_t>(kMaxCachesPerLaunch, p.num_caches - c0));
    int64_t max_units = 1;
    for (int k = 0; k < nc; ++k) {
      L.caches[k] = p.caches[c0 + k];
      max_units = std::max(max_units, kv_units_per_slot(p.caches[c0 + k]));
    }
    // Split the columns over more blocks when (request, cache) pairs alone leave SMs idle.
    const int64_t want = (2 * static_cast<int64_t>(sms) + nc * p.batch - 1) / (nc * p.batch);
    const int64_t most = (max_units + kThreads - 1) / kThreads;
    const int splits = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>({want, most, 65535})));
    const dim3 grid(static_cast<unsigned>(p.batch), nc, splits);
    if (p.max_path <= kPathChunk) {
      kv_move_kernel<true><<<grid, kThreads, 0, stream>>>(L);
    } else {
      kv_move_kernel<false><<<grid, kThreads, 0, stream>>>(L);
    }
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  const int64_t blocks = (p.batch + kAdvanceWarps - 1) / kAdvanceWarps;
  kv_advance_kernel<<<static_cast<unsigned>(blocks), kAdvanceWarps * 32, 0, stream>>>(
      p.geometry, p.accepted_path, p.path_i64, p.path_stride, p.max_path, p.seq_lens, p.batch);
  return cudaGetLastError();
}

}  // namespace specdec
