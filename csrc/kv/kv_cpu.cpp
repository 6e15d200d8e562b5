// C++ CPU kernel of kv_commit: parallel over (cache, request) pairs, each moving
// its path's slots in increasing order (alias-safe, see kv_math.h), with the
// same path rule and slot arithmetic as the CUDA kernel.
#include <ATen/Parallel.h>

#include <cstring>
#include <vector>

#include "kv_params.h"

namespace specdec {

void kv_commit_cpu(const KVCommitParams& p) {
  const int64_t batch = p.batch, max_path = p.max_path;
  std::vector<KVPathScan> scans(batch);
  std::vector<KVSlotAddr> src(batch * max_path), dst(batch * max_path);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t seq_len = p.seq_lens[b];
    KVPathScan& s = scans[b];
    s = kv_scan_path(p.geometry, p.accepted_path, p.path_i64, b * p.path_stride, max_path, b, seq_len, false);
    int64_t prev = -1;
    for (int64_t i = 0; i < s.length; ++i) {
      const int64_t a = kv_load_index(p.accepted_path, p.path_i64, b * p.path_stride + i);
      kv_path_entry(p.geometry, b, seq_len, i, a, prev, &src[b * max_path + i], &dst[b * max_path + i]);
      prev = a;
    }
  }
  const int64_t pairs = p.num_caches * batch;
  at::parallel_for(0, pairs, 1, [&](int64_t begin, int64_t end) {
    for (int64_t pair = begin; pair < end; ++pair) {
      const KVCacheDesc& c = p.caches[pair / batch];
      const int64_t b = pair % batch;
      const KVPathScan& s = scans[b];
      const int64_t units = kv_units_per_slot(c);
      for (int64_t i = s.first_move; i < s.length; ++i) {  // increasing i: alias-safe (kv_math.h)
        uint8_t* to = c.data + kv_slot_offset(c, dst[b * max_path + i]);
        const uint8_t* from = c.data + kv_slot_offset(c, src[b * max_path + i]);
        if (kv_dense_rows(c)) {
          const int64_t row_bytes = static_cast<int64_t>(c.head_dim) * c.elem_size;
          for (int64_t h = 0; h < c.num_heads; ++h) {
            std::memmove(to + h * c.stride_head, from + h * c.stride_head, row_bytes);
          }
        } else {
          for (int64_t u = 0; u < units; ++u) {
            const int64_t off = kv_unit_offset(c, u);
            std::memmove(to + off, from + off, c.elem_size);
          }
        }
      }
    }
  });
  for (int64_t b = 0; b < batch; ++b) p.seq_lens[b] += static_cast<int32_t>(scans[b].length);
}

}  // namespace specdec
