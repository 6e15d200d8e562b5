// CUDA kernel of kv_commit (DESIGN.md §5.5). Raw pointers only, no torch headers:
// kv_op.cpp checks tensors and passes KVCommitParams.
//
// One launch moves every cache: the per-cache descriptors (pointer, byte strides,
// heads, head dim, copy width) travel BY VALUE in the kernel parameters
// (KVLaunch, ~7 KiB for 128 caches; CUDA >= 12.1 allows 32 KiB on sm_70+), so a
// CUDA graph captures them with no host-to-device copy. More than 128 caches (or
// more than 4096 requests) are split into several launches on the same stream;
// only the last one advances seq_lens.
//
// Grid (cache, request, column split). A block:
//   1. thread 0 reads seq_lens[b]; warp 0 checks 32 path entries at a time with
//      the shared rule (kv_path_entry: a bad entry ends the path, nothing outside
//      the cache or the request's blocks is addressed) and writes the byte offsets
//      of the moving slots to shared memory;
//   2. every thread owns fixed columns (16-byte units where alignment allows) and
//      copies them for the moves in increasing order, 8 loads in flight before the
//      8 stores: alias-safe by the argument in kv_math.h (no thread reads what
//      another wrote: the columns are disjoint);
//   3. seq_lens[b] is advanced once, by the last block of request b to finish
//      (ticket counter): every block read seq_lens[b] before taking its ticket.
//      The tickets are a zero-initialized __device__ array, reset by the last
//      block, one row of counters per (device, stream) so concurrent launches on
//      different streams never share one (a graph replayed on another stream than
//      it was captured on keeps the capture stream's row).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

#include "kv_params.h"

namespace specdec {
namespace {

constexpr int kMaxCachesPerLaunch = 128;
constexpr int kMaxRequestsPerLaunch = 4096;
constexpr int kTicketRows = 32;
constexpr int kThreads = 128;
constexpr int kPathChunk = 32;  // path entries checked per warp pass
constexpr int kLoadBatch = 8;   // loads in flight per thread before the stores
constexpr unsigned kFullMask = 0xffffffffu;

__device__ unsigned int g_kv_tickets[kTicketRows][kMaxRequestsPerLaunch];

struct KVLaunch {
  KVCacheDesc caches[kMaxCachesPerLaunch];
  KVGeometry geometry;
  const void* accepted_path;
  int64_t path_stride;
  int64_t max_path;
  int32_t* seq_lens;
  int64_t first_request;
  int32_t ticket_row;
  bool path_i64;
  bool update_seq_lens;
};

template <int kBytes> struct UnitType;
template <> struct UnitType<16> { using T = uint4; };
template <> struct UnitType<8> { using T = uint2; };
template <> struct UnitType<4> { using T = uint32_t; };
template <> struct UnitType<2> { using T = uint16_t; };
template <> struct UnitType<1> { using T = uint8_t; };

// Moves n slots (byte offsets src[k] -> dst[k], in increasing path order) of the
// columns unit_begin, unit_begin + unit_stride, ... of one cache.
template <int kBytes>
__device__ __forceinline__ void copy_moves(const KVCacheDesc& c, const int64_t* src, const int64_t* dst, int n,
                                           int64_t unit_begin, int64_t unit_stride) {
  using T = typename UnitType<kBytes>::T;
  const int64_t units = kv_units_per_slot(c);
  uint8_t* data = c.data;
  for (int64_t u = unit_begin; u < units; u += unit_stride) {
    const int64_t off = kv_unit_offset(c, u);
    for (int k = 0; k < n; k += kLoadBatch) {
      T v[kLoadBatch];
#pragma unroll
      for (int j = 0; j < kLoadBatch; ++j) {
        if (k + j < n) v[j] = *reinterpret_cast<const T*>(data + src[k + j] + off);
      }
#pragma unroll
      for (int j = 0; j < kLoadBatch; ++j) {
        if (k + j < n) *reinterpret_cast<T*>(data + dst[k + j] + off) = v[j];
      }
    }
  }
}

__global__ void __launch_bounds__(kThreads) kv_commit_kernel(const __grid_constant__ KVLaunch L) {
  __shared__ int64_t s_src[kPathChunk], s_dst[kPathChunk];
  __shared__ int64_t s_seq_len, s_length;
  __shared__ int s_count, s_done;

  const KVCacheDesc& c = L.caches[blockIdx.x];
  const int64_t b = L.first_request + blockIdx.y;
  const int lane = threadIdx.x & 31;
  const int64_t unit_begin = static_cast<int64_t>(blockIdx.z) * blockDim.x + threadIdx.x;
  const int64_t unit_stride = static_cast<int64_t>(gridDim.z) * blockDim.x;

  if (threadIdx.x == 0) s_seq_len = L.seq_lens[b];
  __syncthreads();
  const int64_t seq_len = s_seq_len;

  for (int64_t base = 0;; base += kPathChunk) {
    if (threadIdx.x < 32) {
      const int64_t i = base + lane;
      bool valid = false, moves = false;
      KVSlotAddr src{0, 0}, dst{0, 0};
      if (i < L.max_path) {
        const int64_t row = b * L.path_stride;
        const int64_t a = kv_load_index(L.accepted_path, L.path_i64, row + i);
        const int64_t prev = i > 0 ? kv_load_index(L.accepted_path, L.path_i64, row + i - 1) : -1;
        valid = kv_path_entry(L.geometry, b, seq_len, i, a, prev, &src, &dst) == KVPathStatus::kOk;
        moves = a != i;
      }
      const unsigned bad = __ballot_sync(kFullMask, !valid);
      const int num_valid = bad ? __ffs(bad) - 1 : 32;
      const bool move = lane < num_valid && moves;
      const unsigned movers = __ballot_sync(kFullMask, move);
      if (move) {
        const int slot = __popc(movers & ((1u << lane) - 1u));
        s_src[slot] = kv_slot_offset(c, src);
        s_dst[slot] = kv_slot_offset(c, dst);
      }
      if (lane == 0) {
        s_count = __popc(movers);
        s_done = num_valid < 32;
        s_length = base + num_valid;
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
    __syncthreads();  // warp 0 rewrites s_src / s_dst next pass
    if (done) break;
  }

  if (threadIdx.x == 0 && L.update_seq_lens) {
    __threadfence();  // this block's read of seq_lens[b] happens before its ticket
    unsigned int* ticket = &g_kv_tickets[L.ticket_row][blockIdx.y];
    const unsigned int blocks = gridDim.x * gridDim.z;
    if (atomicAdd(ticket, 1u) == blocks - 1u) {  // every block of request b has read seq_lens[b]
      atomicExch(ticket, 0u);
      __threadfence();
      L.seq_lens[b] = static_cast<int32_t>(seq_len + s_length);
    }
  }
}

// The ticket row of (device, stream): streams get rows in first-use order (wrapping).
int ticket_row(cudaStream_t stream) {
  static std::mutex mutex;
  static std::map<std::pair<int, cudaStream_t>, int> rows;
  static std::map<int, int> next_row;
  int device = 0;
  cudaGetDevice(&device);
  std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_pair(device, stream);
  auto it = rows.find(key);
  if (it != rows.end()) return it->second;
  const int row = next_row[device]++ % kTicketRows;
  rows.emplace(key, row);
  return row;
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
  static const KVCacheDesc kNoCache{nullptr, 0, 0, 0, 0, 0, 0, 1, 1};
  const KVCacheDesc* caches = p.num_caches > 0 ? p.caches : &kNoCache;
  const int64_t num_caches = std::max<int64_t>(p.num_caches, 1);
  const int row = ticket_row(stream);
  const int sms = multiprocessor_count();

  KVLaunch L;
  L.geometry = p.geometry;
  L.accepted_path = p.accepted_path;
  L.path_stride = p.path_stride;
  L.max_path = p.max_path;
  L.seq_lens = p.seq_lens;
  L.ticket_row = row;
  L.path_i64 = p.path_i64;
  for (int64_t c0 = 0; c0 < num_caches; c0 += kMaxCachesPerLaunch) {
    const int nc = static_cast<int>(std::min<int64_t>(kMaxCachesPerLaunch, num_caches - c0));
    int64_t max_units = 1;
    for (int k = 0; k < nc; ++k) {
      L.caches[k] = caches[c0 + k];
      max_units = std::max(max_units, kv_units_per_slot(caches[c0 + k]));
    }
    L.update_seq_lens = c0 + nc == num_caches;
    for (int64_t b0 = 0; b0 < p.batch; b0 += kMaxRequestsPerLaunch) {
      const int nb = static_cast<int>(std::min<int64_t>(kMaxRequestsPerLaunch, p.batch - b0));
      // Split the columns over more blocks when (cache, request) pairs alone leave SMs idle.
      const int64_t want = (2 * static_cast<int64_t>(sms) + nc * nb - 1) / (nc * nb);
      const int64_t most = (max_units + kThreads - 1) / kThreads;
      const int splits = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>({want, most, 65535})));
      L.first_request = b0;
      const dim3 grid(nc, nb, splits);
      kv_commit_kernel<<<grid, kThreads, 0, stream>>>(L);
      const cudaError_t err = cudaGetLastError();
      if (err != cudaSuccess) return err;
    }
  }
  return cudaSuccess;
}

}  // namespace specdec
