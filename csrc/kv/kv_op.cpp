// torch glue of specdec::kv_commit: argument checks (ValueError for shapes, devices
// and values, TypeError for dtypes; the Python wrapper re-raises both as
// SpecDecArgumentError), CPU value checks naming accepted_path / seq_lens and the
// bad element, and dispatch to the CPU kernel or the CUDA launcher. The moves
// happen in place in every cache.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <vector>

#include "../common/torch_checks.h"
#include "kv_params.h"

#ifdef SPECDEC_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
namespace specdec {
cudaError_t launch_kv_commit_cuda(const KVCommitParams& params, cudaStream_t stream);
}
#endif

namespace specdec {
// This file's helpers (compiled with the other glue files in csrc/torch_ops.cpp).
namespace kv_op {

// Slots per request when there is no cache to bound them (seq_lens-only commits).
constexpr int64_t kUnboundedCapacity = int64_t{1} << 62;

bool kv_dtype_ok(at::ScalarType t) {
  switch (t) {
    case at::kFloat: case at::kHalf: case at::kBFloat16: case at::kByte: case at::kChar:
    case at::kFloat8_e4m3fn: case at::kFloat8_e5m2: case at::kFloat8_e4m3fnuz: case at::kFloat8_e5m2fnuz:
      return true;
    default:
      return false;
  }
}

void check_values_cpu(const KVCommitParams& p) {
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t seq_len = p.seq_lens[b];
    const KVPathScan s =
        kv_scan_path(p.geometry, p.accepted_path, p.path_i64, b * p.path_stride, p.max_path, b, seq_len, true);
    if (!kv_status_is_error(s.status)) continue;
    const int64_t i = s.bad_index;
    const int64_t a = kv_load_index(p.accepted_path, p.path_i64, b * p.path_stride + i);
    switch (s.status) {
      case KVPathStatus::kBadSeqLen:
        TORCH_CHECK_VALUE(false, "seq_lens[", b, "] = ", seq_len, " is negative");
      case KVPathStatus::kFirstNotZero:
        TORCH_CHECK_VALUE(false, "accepted_path[", b, ", 0] = ", a, " must be 0 (the root, slot seq_lens[", b, "])");
      case KVPathStatus::kNotIncreasing:
        TORCH_CHECK_VALUE(false, "accepted_path[", b, ", ", i, "] = ", a, " is not greater than accepted_path[", b,
                          ", ", i - 1, "] = ", kv_load_index(p.accepted_path, p.path_i64, b * p.path_stride + i - 1),
                          " (a path must be strictly increasing)");
      case KVPathStatus::kOutsideCache:
        TORCH_CHECK_VALUE(false, "accepted_path[", b, ", ", i, "] = ", a, " reaches slot seq_lens[", b, "] + ", a,
                          " = ", seq_len + a, " outside the cache (S = ", p.geometry.capacity, ")");
      case KVPathStatus::kOutsideBlocks:
        TORCH_CHECK_VALUE(false, "accepted_path[", b, ", ", i, "] = ", a, " reaches slot seq_lens[", b, "] + ", a,
                          " = ", seq_len + a, " outside request ", b, "'s blocks (block_table row ", b,
                          ": max_blocks * block_size = ", p.geometry.capacity, " slots, block ids in [0, ",
                          p.geometry.num_blocks, "))");
      case KVPathStatus::kSeqLenOverflow:
        TORCH_CHECK_VALUE(false, "accepted_path[", b, ", ", i, "] = ", a, " would advance seq_lens[", b, "] = ", seq_len,
                          " to ", seq_len + i + 1, ", past the int32 range (", kKVMaxSeqLen, ")");
      case KVPathStatus::kNegativeInMiddle:
        TORCH_CHECK_VALUE(false, "accepted_path[", b, ", ", i, "] = ", a,
                          " follows the -1 padding (negative entries may only end a path)");
      default:
        TORCH_CHECK_VALUE(false, "accepted_path[", b, "] is malformed");
    }
  }
}

// The per-cache checks raise ValueError (shapes, devices) / TypeError (dtypes): the
// Python wrapper leaves them to this function on the cpu and cuda backends (one C++
// loop instead of a Python one per call) and re-raises them as SpecDecArgumentError.
void kv_commit(at::TensorList caches, const at::Tensor& seq_lens, const at::Tensor& accepted_path,
               const std::optional<at::Tensor>& block_table) {
  check_rank(seq_lens, 1, "seq_lens", "[B]");
  TORCH_CHECK_TYPE(seq_lens.scalar_type() == at::kInt, "seq_lens must be int32, got ", seq_lens.scalar_type());
  TORCH_CHECK_VALUE(seq_lens.is_contiguous(), "seq_lens must be contiguous (it is updated in place)");
  const int64_t batch = seq_lens.size(0);
  TORCH_CHECK_VALUE(batch < (int64_t{1} << 31), "seq_lens must have fewer than 2^31 requests, got ", batch);
  check_rank(accepted_path, 2, "accepted_path", "[B, M]");
  check_size(accepted_path, 0, batch, "accepted_path", "[B, M]");
  check_index_dtype(accepted_path, "accepted_path");
  check_same_device(accepted_path, seq_lens, "accepted_path", "seq_lens");
  const bool paged = block_table.has_value();

  KVGeometry g{};
  g.capacity = kUnboundedCapacity;
  at::Tensor table;
  if (paged) {
    check_rank(*block_table, 2, "block_table", "[B, max_blocks]");
    check_size(*block_table, 0, batch, "block_table", "[B, max_blocks]");
    check_index_dtype(*block_table, "block_table");
    check_same_device(*block_table, seq_lens, "block_table", "seq_lens");
    table = block_table->contiguous();
  }
  std::vector<KVCacheDesc> descs;
  descs.reserve(caches.size());
  for (size_t l = 0; l < caches.size(); ++l) {
    const at::Tensor& c = caches[l];
    TORCH_CHECK_VALUE(c.dim() == 4, "caches[", l, "] must be 4-D ",
                paged ? "[num_blocks, block_size, H, D]" : "[B, S, H, D]", ", got shape ", c.sizes());
    TORCH_CHECK_TYPE(kv_dtype_ok(c.scalar_type()), "caches[", l,
                "] must have dtype float32, float16, bfloat16 or a 1-byte type (uint8, int8, float8), got ",
                c.scalar_type());
    TORCH_CHECK_VALUE(c.device() == seq_lens.device(), "caches[", l, "] must be on the same device as seq_lens (",
                seq_lens.device(), "), got ", c.device());
    const at::Tensor& c0 = caches[0];
    if (paged) {
      TORCH_CHECK_VALUE(c.size(1) >= 1, "caches[", l, "] must have block_size >= 1, got shape ", c.sizes());
      TORCH_CHECK_VALUE(c.size(0) == c0.size(0) && c.size(1) == c0.size(1), "caches[", l,
                  "] must have the num_blocks and block_size of caches[0] (", c0.size(0), ", ", c0.size(1),
                  "), got shape ", c.sizes());
    } else {
      TORCH_CHECK_VALUE(c.size(0) == batch, "caches[", l, "] must have shape [B, S, H, D] with B = ", batch,
                  " (the size of seq_lens), got ", c.sizes());
      TORCH_CHECK_VALUE(c.size(1) == c0.size(1), "caches[", l, "] must have the S of caches[0] (", c0.size(1), "), got ",
                  c.sizes());
    }
    const int64_t es = c.element_size();
    TORCH_CHECK_VALUE(c.size(2) * c.size(3) * es < (int64_t{1} << 31), "caches[", l,
                      "] must have fewer than 2^31 bytes per slot (H * D * element size), got shape ", c.sizes());
    KVCacheDesc d{};
    d.data = static_cast<uint8_t*>(c.mutable_data_ptr());
    d.stride0 = c.stride(0) * es;
    d.stride1 = c.stride(1) * es;
    d.stride_head = c.stride(2) * es;
    d.stride_dim = c.stride(3) * es;
    d.num_heads = static_cast<int32_t>(c.size(2));
    d.head_dim = static_cast<int32_t>(c.size(3));
    d.elem_size = static_cast<int32_t>(es);
    d.unit_bytes = kv_unit_bytes(reinterpret_cast<uint64_t>(d.data), d.stride0, d.stride1, d.stride_head,
                                 d.stride_dim, d.head_dim, es);
    if (c.numel() > 0) descs.push_back(d);
  }
  if (paged && !caches.empty()) {
    g.block_size = caches[0].size(1);
    g.num_blocks = caches[0].size(0);
    g.capacity = table.size(1) * g.block_size;
    g.block_table = table.const_data_ptr();
    g.block_table_stride = table.size(1);
    g.block_table_i64 = table.scalar_type() == at::kLong;
  } else if (!caches.empty()) {
    g.capacity = caches[0].size(1);
  }  // no cache at all: only seq_lens moves, and no slot bound applies
  if (batch == 0) return;
  const at::Tensor path = accepted_path.contiguous();

  KVCommitParams p{};
  p.caches = descs.data();
  p.num_caches = static_cast<int64_t>(descs.size());
  p.geometry = g;
  p.accepted_path = path.const_data_ptr();
  p.path_i64 = path.scalar_type() == at::kLong;
  p.path_stride = path.size(1);
  p.max_path = path.size(1);
  p.seq_lens = seq_lens.mutable_data_ptr<int32_t>();
  p.batch = batch;

  if (seq_lens.is_cpu()) {
    check_values_cpu(p);
    kv_commit_cpu(p);
  } else {
#ifdef SPECDEC_WITH_CUDA
    const c10::cuda::CUDAGuard guard(seq_lens.device());
    C10_CUDA_CHECK(launch_kv_commit_cuda(p, at::cuda::getCurrentCUDAStream()));
#else
    TORCH_CHECK(false, "specdec_ops was built without CUDA kernels");  // not an argument error: RuntimeError
#endif
  }
}

}  // namespace kv_op

TORCH_LIBRARY_IMPL(specdec, CPU, m) { m.impl("kv_commit", &kv_op::kv_commit); }

#ifdef SPECDEC_WITH_CUDA
TORCH_LIBRARY_IMPL(specdec, CUDA, m) { m.impl("kv_commit", &kv_op::kv_commit); }
#endif

}  // namespace specdec
