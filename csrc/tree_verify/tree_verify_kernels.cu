// CUDA kernel of tree verification (DESIGN.md §5.3). Raw pointers only, no
// torch headers: the launcher in tree_verify_op.cpp checks tensors, allocates the
// workspace (tree_verify_cuda_workspace_bytes) and passes TreeVerifyParams.
//
// One launch, grid (B, parts): every request's vocab-wide steps are split across
// `parts` blocks (sized from the SM count so that the batch fills the device in one
// wave). All blocks of a request run the same scalar walk (tree_verify_math.h) over
// the tree staged in shared memory, so they take the same branches without talking
// beyond the vocab-wide steps; block 0 writes the outputs. Each vocab-wide step is a
// pass over one row: every block sweeps its share of the row, writes a partial into
// the workspace, meets the request's other blocks at a barrier (a per-request arrival
// counter, zeroed on the stream by the launcher; the launch is cooperative when
// parts > 1, so the blocks of a request are resident together) and merges all
// partials itself, in the same order: every block gets the same result.
//
// One pass per visited node, at most:
//   * greedy: the argmax of p_u;
//   * no draft_probs, u with children: the sum and support of p_u (the acceptance
//     tests) and, in the same pass, the final race at u as if every child were
//     rejected (tree_onehot_final recovers the walk's exclusions exactly);
//   * draft_probs: none while children are accepted (the test reads p_u(x), q_u(x));
//     after each rejection the sum of the next residual, and after the last child's
//     rejection the final race in the same pass (TreeResidualRace);
//   * a leaf: the race over p_u (the pass of a node with children, none excluded).
// The sums feed the acceptance tests, so their float rounding is the one of the
// single-block kernel: the row is covered by `vthreads` = threads_for_vocab(V)
// virtual threads, virtual thread v adding the entries of groups v, v + vthreads, ...
// in order, then a warp-shuffle tree inside each virtual warp and the same tree over
// the (<= 32) virtual-warp sums. A block holds a contiguous range of virtual warps
// (each real thread runs per_thread of them, one after the other), writes their sums
// to the workspace, and the merge runs the final tree. Races and argmaxes merge
// exactly in any partition (csrc/common/vocab_split.h). So the outputs are bit for bit
// those of the single-block kernel: the Philox layout, the race and the rounding of
// every sum are unchanged. No host sync; every index is clamped or checked: a bad
// parent is the root, a child token outside [0, V) is rejected, num_nodes is clamped
// into [1, N].
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "../common/sampling_cuda.cuh"
#include "../common/vocab_split.h"
#include "tree_verify_math.h"
#include "tree_verify_params.h"

namespace specdec {
namespace {

using namespace cuda;

constexpr int kThreads = 128;     // threads per block (fewer only for vocabs below 512)
constexpr int kBlocksPerSM = 4;   // launch bounds: <= 128 registers
constexpr int kMaxVirtualWarps = kMaxThreads / 32;
constexpr int64_t kMaxSmemNodes = 2048;  // per-node arrays in shared memory up to here, else in the workspace
constexpr int kNodeArrays = 4;           // parent, token, children of the current node, scratch (z or zeroed)

// How one launch covers the rows (host and device agree on it through this struct).
struct TreeLayout {
  int vthreads;    // virtual threads of a row: the layout the sums are rounded in
  int parts;       // blocks per request
  int per_thread;  // virtual threads per real thread
  int smem_nodes;  // 1: the per-node arrays sit in shared memory
};

// Partial result of one block for one pass.
struct Partial {
  ArgMax race;      // race, or argmax (greedy)
  ArgMax fallback;  // draft_probs, last child: the race over r_m
  long long count;  // entries with mass (no draft_probs)
};

// One pass's buffer: the virtual-warp sums, then the parts' partials.
struct PassBuffer {
  float vsum[kMaxVirtualWarps];
  Partial partial[1];  // [parts]
};

SPECDEC_HD int64_t counter_bytes(int64_t batch) { return (batch * 4 + 15) / 16 * 16; }
SPECDEC_HD int64_t buffer_bytes(int64_t parts) {
  return (static_cast<int64_t>(sizeof(float)) * kMaxVirtualWarps + parts * static_cast<int64_t>(sizeof(Partial)) +
          15) / 16 * 16;
}
// Per request: two pass buffers (consecutive passes alternate, see request_barrier).
SPECDEC_HD int64_t request_bytes(int64_t parts) { return 2 * buffer_bytes(parts); }
SPECDEC_HD int64_t node_array_bytes(int64_t nodes) { return kNodeArrays * 4 * nodes; }

size_t workspace_bytes(int64_t batch, int64_t nodes, const TreeLayout& layout) {
  int64_t bytes = counter_bytes(batch) + batch * request_bytes(layout.parts);
  if (!layout.smem_nodes) bytes += batch * layout.parts * node_array_bytes(nodes);
  return static_cast<size_t>(bytes);
}

// The merged result of a pass, as every block of the request sees it.
struct PassOut {
  ArgMax race;
  ArgMax fallback;
  float sum;
  long long count;
};

struct Shared {
  ArgMax argmax[32];
  long long count[32];
  PassOut out;
  int children;
};

// What a pass computes per entry.
enum PassKind : int {
  kArgmax = 0,      // greedy: argmax of mass(p)
  kSumRace = 1,     // no draft_probs: sum and support of mass(p), race excluding the children's tokens
                    // (a leaf, both modes: the race over mass(p), nothing excluded, the sums unused)
  kResidual = 2,    // draft_probs: sum of r_{m+1}
  kResidualRace = 3 // draft_probs: sum of r_{m+1}, TreeResidualRace
};

template <int kKind>
constexpr bool kHasQ = kKind == kResidual || kKind == kResidualRace;
template <int kKind>
constexpr int kUnroll = kHasQ<kKind> ? 2 : 4;  // groups per step: 4 16-byte loads in flight per thread

// Per-pass constants of the walk.
struct PassArgs {
  uint64_t seed, offset;
  uint32_t position, purpose;
  const float* z;              // draft_probs: Z_1 .. Z_m
  int64_t m;                   // committed updates at the node
  float z_m;                   // Z_m
  const int32_t* children;     // kSumRace: the node's children ...
  const int32_t* tokens;       // ... and every node's token (-1 outside the vocab)
  int num_children;
};

// Per-thread state of a pass.
struct Acc {
  ArgMax race;
  ArgMax fallback;
  float race_bar;      // race_update's bars: raised to the warp's best after every group (warp_raise_bar)
  float fallback_bar;
  float sum;  // of the current virtual thread
  int count;  // entries with mass (one thread's share of a row: < 2^31)
};

template <int kKind, bool kM0>
__device__ __forceinline__ void entry(Acc& a, const PassArgs& args, float p, float q, uint32_t bits, int64_t i) {
  if constexpr (kKind == kArgmax) {
    argmax_update(a.race, prob_mass(p), i);
  } else if constexpr (kKind == kSumRace) {
    const float mass = prob_mass(p);
    a.sum += mass;
    a.count += mass > 0.f;
    race_update_excluding(a.race, a.race_bar, mass, bits, i, [&](int64_t index) {
      for (int j = 0; j < args.num_children; ++j)
        if (args.tokens[args.children[j]] == index) return true;
      return false;
    });
  } else {
    // r_m and r_{m+1} of tree_residual / tree_next_residual; with m = 0 (Z_0 = 1) the
    // division by 1 is exact and is left out.
    const float r_m = kM0 ? prob_mass(p) : tree_residual(p, q, args.z, args.m);
    const float r_next = kM0 ? residual_step(r_m, 1.f, q) : tree_next_residual(r_m, args.z_m, q);
    a.sum += r_next;
    if constexpr (kKind == kResidualRace) {
      TreeResidualRace race{a.race, a.fallback, a.race_bar, a.fallback_bar};
      tree_residual_race_update(race, r_next, r_m, bits, i);
      a.race = race.next;
      a.fallback = race.current;
      a.race_bar = race.next_bar;
      a.fallback_bar = race.current_bar;
    }
  }
}

// Entries 4g .. 4g+3; kChecked: entries past the vocab are skipped (they add 0 to a sum).
template <int kKind, bool kM0, bool kChecked>
__device__ __forceinline__ void group(Acc& a, const PassArgs& args, const float pv[4], const float qv[4], int64_t g,
                                      int64_t vocab) {
  Philox4 bits{};
  if constexpr (kKind != kArgmax && kKind != kResidual)
    bits = philox_block(args.seed, args.offset, args.position, args.purpose, static_cast<uint32_t>(g));
  if constexpr (kKind == kSumRace && !kChecked) {
    // The sums entry by entry, then the race's skip test once for the group and one
    // branch (race_group_may_update): the exact updates only when an entry may win.
    float mass[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      mass[j] = prob_mass(pv[j]);
      a.sum += mass[j];
      a.count += mass[j] > 0.f;
    }
    if (race_group_may_update(a.race_bar, mass, bits.x)) {
#pragma unroll
      for (int j = 0; j < 4; ++j)
        race_update_excluding(a.race, a.race_bar, mass[j], bits.x[j], 4 * g + j, [&](int64_t index) {
          for (int c = 0; c < args.num_children; ++c)
            if (args.tokens[args.children[c]] == index) return true;
          return false;
        });
    }
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (kChecked && 4 * g + j >= vocab) break;
      entry<kKind, kM0>(a, args, pv[j], qv[j], bits.x[j], 4 * g + j);
    }
  }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(kFullMask, v, o);
  return v;
}

__device__ __forceinline__ long long warp_count(long long v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(kFullMask, v, o);
  return v;
}

// The sweep of one block over its virtual threads of a row (each virtual thread's
// groups in increasing order; kUnroll groups loaded before any is used). The
// virtual-warp sums go to buf->vsum. kVThreads: layout.vthreads known at compile time
// (the 1024 of every vocab above 2048), so that the loads of a step share one address
// register with immediate offsets; 0: read at run time.
template <int kKind, bool kM0, bool kAligned, int kVThreads, typename T>
__device__ Acc sweep(const T* __restrict__ p_row, const T* __restrict__ q_row, int64_t vocab,
                     const TreeLayout& layout, int64_t part, const PassArgs& args, PassBuffer* buf) {
  constexpr int U = kUnroll<kKind>;
  Acc a{argmax_init(), argmax_init(), argmax_init().score, argmax_init().score, 0.f, 0};
  const int64_t vthreads = kVThreads ? kVThreads : layout.vthreads, groups = vocab_groups(vocab), full = vocab / 4;
  for (int h = 0; h < layout.per_thread; ++h) {
    const int64_t first = (part * layout.per_thread + h) * blockDim.x;  // first virtual thread of this round
    int64_t g = first + threadIdx.x;
    a.sum = 0.f;
    for (; g + (U - 1) * vthreads < full; g += U * vthreads) {
      float pv[U][4], qv[U][4] = {};
#pragma unroll
      for (int k = 0; k < U; ++k) {
        load4_full<kAligned>(p_row, 4 * (g + k * vthreads), pv[k]);
        if constexpr (kHasQ<kKind>) load4_full<kAligned>(q_row, 4 * (g + k * vthreads), qv[k]);
      }
#pragma unroll
      for (int k = 0; k < U; ++k) {
        group<kKind, kM0, false>(a, args, pv[k], qv[k], g + k * vthreads, vocab);
        // every lane skips against the warp's best so far (the race, or r_{m+1}'s; the
        // fallback over r_m, read only when r_{m+1} is empty, keeps its own bar)
        if constexpr (kKind == kSumRace || kKind == kResidualRace) warp_raise_bar(a.race_bar);
      }
    }
    for (; g < groups; g += vthreads) {
      float pv[4], qv[4] = {};
      load4(p_row, vocab, 4 * g, false, pv);
      if constexpr (kHasQ<kKind>) load4(q_row, vocab, 4 * g, false, qv);
      group<kKind, kM0, true>(a, args, pv, qv, g, vocab);
    }
    if constexpr (kKind == kSumRace || kKind == kResidual || kKind == kResidualRace) {
      const float s = warp_sum(a.sum);
      if ((threadIdx.x & 31) == 0) buf->vsum[(first + threadIdx.x) >> 5] = s;
    }
  }
  return a;
}

// One pass over row(s) of request b: sweep, block partial, barrier, merge (every block
// merges all parts in the same order; the sums through the single-block kernel's tree).
template <int kKind, bool kM0, typename T>
__device__ PassOut run_pass(const T* p_row, const T* q_row, int64_t vocab, const TreeLayout& layout, int64_t part,
                            const PassArgs& args, char* request_ws, unsigned* counter, unsigned& passes, Shared& s) {
  ++passes;
  PassBuffer* buf = reinterpret_cast<PassBuffer*>(request_ws + (passes & 1) * buffer_bytes(layout.parts));
  const bool aligned = aligned4(p_row) && (!kHasQ<kKind> || aligned4(q_row));
  const Acc a = !aligned ? sweep<kKind, kM0, false, 0>(p_row, q_row, vocab, layout, part, args, buf)
                : layout.vthreads == kMaxThreads
                    ? sweep<kKind, kM0, true, kMaxThreads>(p_row, q_row, vocab, layout, part, args, buf)
                    : sweep<kKind, kM0, true, 0>(p_row, q_row, vocab, layout, part, args, buf);
  Partial mine;
  mine.race = block_argmax(a.race, s.argmax);
  mine.fallback = kKind == kResidualRace ? block_argmax(a.fallback, s.argmax) : argmax_init();
  mine.count = 0;
  if constexpr (kKind == kSumRace) {
    const long long c = warp_count(static_cast<long long>(a.count));
    if ((threadIdx.x & 31) == 0) s.count[threadIdx.x >> 5] = c;
    __syncthreads();
    if (threadIdx.x == 0)
      for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) mine.count += s.count[w];
  }
  if (threadIdx.x == 0) {
    Partial* slot = buf->partial + part;
    slot->race = mine.race;
    slot->fallback = mine.fallback;
    slot->count = mine.count;
  }
  request_barrier(counter, layout.parts, passes);
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    ArgMax race = argmax_init(), fallback = argmax_init();
    long long count = 0;
    for (int q = lane; q < layout.parts; q += 32) {
      const Partial* slot = buf->partial + q;
      race = argmax_merge(race, ArgMax{__ldcg(&slot->race.score),
                                       static_cast<int64_t>(__ldcg(reinterpret_cast<const long long*>(
                                           &slot->race.index)))});
      fallback = argmax_merge(fallback, ArgMax{__ldcg(&slot->fallback.score),
                                               static_cast<int64_t>(__ldcg(reinterpret_cast<const long long*>(
                                                   &slot->fallback.index)))});
      count += __ldcg(&slot->count);
    }
    race = warp_argmax(race);
    fallback = warp_argmax(fallback);
    count = warp_count(count);
    // The single-block kernel's last step: a shuffle tree over the virtual-warp sums.
    const float sum = warp_sum(lane < (layout.vthreads >> 5) ? __ldcg(buf->vsum + lane) : 0.f);
    if (lane == 0) s.out = PassOut{race, fallback, sum, count};
  }
  __syncthreads();
  const PassOut out = s.out;
  __syncthreads();
  return out;
}

template <typename T>
__global__ void __launch_bounds__(kThreads, kBlocksPerSM) tree_verify_kernel(const TreeVerifyParams p,
                                                                             const TreeLayout layout) {
  __shared__ Shared s;
  extern __shared__ int32_t smem_nodes[];  // [4, N] when layout.smem_nodes
  const int64_t b = blockIdx.x, part = blockIdx.y, N = p.max_nodes, V = p.vocab;
  const bool leader = part == 0;
  const int64_t n = tree_num_nodes(p.num_nodes, b, N);
  const bool greedy = p.greedy != nullptr && p.greedy[b];
  const uint64_t seed = static_cast<uint64_t>(p.seeds[b]);
  const uint64_t offset = static_cast<uint64_t>(p.offsets[b]);
  const T* target = static_cast<const T*>(p.target_probs) + b * N * V;
  const T* draft = p.draft_probs != nullptr ? static_cast<const T*>(p.draft_probs) + b * N * V : nullptr;
  int64_t* out_tokens = p.token_ids + b * N;
  int32_t* out_path = p.accepted_path + b * N;

  char* ws = static_cast<char*>(p.workspace);
  unsigned* counter = reinterpret_cast<unsigned*>(ws) + b;
  char* request_ws = ws + counter_bytes(p.batch) + b * request_bytes(layout.parts);
  int32_t* arrays = layout.smem_nodes ? smem_nodes
                                      : reinterpret_cast<int32_t*>(ws + counter_bytes(p.batch) +
                                                                   p.batch * request_bytes(layout.parts) +
                                                                   (b * layout.parts + part) * node_array_bytes(N));
  int32_t* parent = arrays;          // parent of every node (the root: -1)
  int32_t* token = arrays + N;       // token of every node, -1 outside the vocab
  int32_t* children = arrays + 2 * N;  // children of the current node, in index order
  int32_t* scratch = arrays + 3 * N;   // Z_1 .. Z_m (draft_probs, as float) or the zeroed tokens
  float* z = reinterpret_cast<float*>(scratch);

  for (int64_t c = threadIdx.x; c < n; c += blockDim.x) {
    parent[c] = c == 0 ? -1 : static_cast<int32_t>(tree_parent(p.parents[b * N + c], c));
    const int64_t x = p.tree_token_ids[b * N + c];
    token[c] = draft_in_vocab(x, V) ? static_cast<int32_t>(x) : -1;
  }
  __syncthreads();

  // Children of u in index order into `children`; every thread gets their number. The leading barrier: a
  // warp may still read the previous node's children[j] (its accept test) when thread 0 gets here.
  const auto list_children = [&](int64_t u) -> int {
    __syncthreads();
    if (threadIdx.x == 0) {
      int d = 0;
      for (int64_t c = u + 1; c < n; ++c)
        if (parent[c] == u) children[d++] = static_cast<int32_t>(c);
      s.children = d;
    }
    __syncthreads();
    const int d = s.children;
    __syncthreads();
    return d;
  };
  const auto set_scratch = [&](int64_t j, int32_t bits) {
    if (threadIdx.x == 0) scratch[j] = bits;
    __syncthreads();
  };

  unsigned passes = 0;
  PassArgs args{seed, offset, 0, 0, z, 0, 1.f, children, token, 0};
  int64_t u = 0, k = 0, final_token = 0;
  const auto move_to = [&](int64_t c, int64_t x) {
    if (leader && threadIdx.x == 0) {
      out_tokens[k] = x;
      out_path[k + 1] = static_cast<int32_t>(c);
    }
    ++k;
    u = c;
  };
  if (leader && threadIdx.x == 0) out_path[0] = 0;

  if (greedy) {
    while (true) {
      const int64_t best =
          run_pass<kArgmax, true>(target + u * V, target, V, layout, part, args, request_ws, counter, passes, s)
              .race.index;
      int64_t next = -1;
      for (int64_t c = u + 1; c < n && next < 0; ++c)
        if (parent[c] == u && token[c] == best) next = c;
      if (next < 0) {
        final_token = best;
        break;
      }
      move_to(next, best);
    }
  } else {
    while (true) {
      const int d = list_children(u);
      const T* p_row = target + u * V;
      args.position = static_cast<uint32_t>(u);
      // No draft_probs, or a leaf: the sum and support of p_u with the race in one pass (one call
      // site, so the loop is compiled once); a leaf's race excludes nothing and no child was rejected.
      int64_t accepted = -1;
      if (draft == nullptr || d == 0) {
        args.num_children = draft == nullptr ? d : 0;
        args.purpose = tree_final_purpose(d > 0);
        const PassOut stats =
            run_pass<kSumRace, true>(p_row, p_row, V, layout, part, args, request_ws, counter, passes, s);
        if (d == 0) {
          final_token = stats.race.index;
          break;
        }
        float sum = stats.sum;
        const int64_t nonzero = stats.count;
        int64_t m = 0, kept = -1;  // zeroed tokens; the one token with mass left unzeroed
        for (int j = 0; j < d && accepted < 0; ++j) {
          const int64_t c = children[j], x = token[c];
          const bool excluded = [&] {
            for (int64_t i = 0; i < m; ++i)
              if (scratch[i] == x) return true;
            return false;
          }();
          const float p_x = x >= 0 && !excluded ? prob_mass(to_float(p_row[x])) : 0.f;
          if (x >= 0 && tree_accept_onehot(tree_accept_uniform(seed, offset, c), sum, p_x)) {
            accepted = c;
            move_to(c, x);
          } else if (p_x > 0.f) {
            if (nonzero - m > 1) {
              set_scratch(m++, static_cast<int32_t>(x));
              sum -= p_x;
            } else {
              kept = x;
            }
          }
        }
        if (accepted < 0) {
          final_token = tree_onehot_final(stats.race.index, kept, kept >= 0 ? prob_mass(to_float(p_row[kept])) : 0.f,
                                          seed, offset, static_cast<uint32_t>(u));
          break;
        }
      } else {
        const T* q_row = draft + u * V;
        args.purpose = tree_final_purpose(true);  // the race runs only after every child was rejected
        int64_t m = 0;
        for (int j = 0; j < d && accepted < 0; ++j) {
          const int64_t c = children[j], x = token[c];
          const float z_m = tree_normalizer(z, m);
          bool accept = false;
          if (x >= 0) {
            const float q_x = to_float(q_row[x]);
            accept = tree_accept_draft(tree_accept_uniform(seed, offset, c),
                                       tree_residual(to_float(p_row[x]), q_x, z, m), z_m, q_x);
          }
          if (accept) {
            accepted = c;
            move_to(c, x);
            break;
          }
          args.m = m;
          args.z_m = z_m;
          const bool last = j == d - 1;
          PassOut r;
          if (last)
            r = m == 0 ? run_pass<kResidualRace, true>(p_row, q_row, V, layout, part, args, request_ws, counter,
                                                       passes, s)
                       : run_pass<kResidualRace, false>(p_row, q_row, V, layout, part, args, request_ws, counter,
                                                        passes, s);
          else
            r = m == 0 ? run_pass<kResidual, true>(p_row, q_row, V, layout, part, args, request_ws, counter, passes, s)
                       : run_pass<kResidual, false>(p_row, q_row, V, layout, part, args, request_ws, counter, passes,
                                                    s);
          if (r.sum > 0.f) set_scratch(m++, __float_as_int(r.sum));
          if (last) final_token = r.sum > 0.f ? r.race.index : r.fallback.index;
        }
        if (accepted < 0) break;
      }
    }
  }

  if (!leader) return;
  if (threadIdx.x == 0) {
    out_tokens[k] = final_token;
    p.num_accepted[b] = static_cast<int32_t>(k);
  }
  for (int64_t j = k + 1 + threadIdx.x; j < N; j += blockDim.x) {
    out_tokens[j] = -1;
    out_path[j] = -1;
  }
}

template <typename T>
void* kernel_of() {
  return reinterpret_cast<void*>(&tree_verify_kernel<T>);
}

void* kernel_for(ProbDType dtype) {
  switch (dtype) {
    case ProbDType::kFloat16: return kernel_of<__half>();
    case ProbDType::kBFloat16: return kernel_of<__nv_bfloat16>();
    default: return kernel_of<float>();
  }
}

size_t smem_bytes(const TreeVerifyParams& params, const TreeLayout& layout) {
  return layout.smem_nodes ? static_cast<size_t>(node_array_bytes(params.max_nodes)) : 0;
}

// The layout of a launch on the current device: parts a power of two (so that they
// split the virtual warps evenly) and at most what keeps every request's blocks
// resident together with the whole batch (one wave; a cooperative launch checks it).
TreeLayout layout_for(const TreeVerifyParams& params) {
  TreeLayout layout{threads_for_vocab(params.vocab), 1, 1, params.max_nodes <= kMaxSmemNodes ? 1 : 0};
  const int threads = std::min(kThreads, layout.vthreads);
  int device = 0, sms = 0, cooperative = 0, per_sm = 0;
  if (cudaGetDevice(&device) == cudaSuccess &&
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess &&
      cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, device) == cudaSuccess && cooperative &&
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel_for(params.dtype), threads,
                                                    smem_bytes(params, layout)) == cudaSuccess) {
    const int64_t resident = static_cast<int64_t>(sms) * per_sm;
    const int64_t max_parts = layout.vthreads / threads;
    while (2 * layout.parts <= max_parts && params.batch * 2 * layout.parts <= resident) layout.parts *= 2;
  } else {
    (void)cudaGetLastError();  // a failed query leaves one block per request
  }
  layout.per_thread = layout.vthreads / (threads * layout.parts);
  return layout;
}

}  // namespace

size_t tree_verify_cuda_workspace_bytes(const TreeVerifyParams& params) {
  return workspace_bytes(params.batch, params.max_nodes, layout_for(params));
}

cudaError_t launch_tree_rejection_sample_cuda(const TreeVerifyParams& params, cudaStream_t stream) {
  if (params.batch == 0) return cudaSuccess;
  const TreeLayout layout = layout_for(params);
  if (layout.parts > 1) {
    const cudaError_t zeroed = cudaMemsetAsync(params.workspace, 0, counter_bytes(params.batch), stream);
    if (zeroed != cudaSuccess) return zeroed;
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(params.batch), static_cast<unsigned>(layout.parts));
  config.blockDim = dim3(static_cast<unsigned>(layout.vthreads / (layout.parts * layout.per_thread)));
  config.dynamicSmemBytes = smem_bytes(params, layout);
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeCooperative;
  attribute[0].val.cooperative = 1;
  config.attrs = attribute;
  config.numAttrs = layout.parts > 1 ? 1 : 0;
  switch (params.dtype) {
    case ProbDType::kFloat32: return cudaLaunchKernelEx(&config, tree_verify_kernel<float>, params, layout);
    case ProbDType::kFloat16: return cudaLaunchKernelEx(&config, tree_verify_kernel<__half>, params, layout);
    case ProbDType::kBFloat16: return cudaLaunchKernelEx(&config, tree_verify_kernel<__nv_bfloat16>, params, layout);
  }
  return cudaErrorInvalidValue;
}

}  // namespace specdec
