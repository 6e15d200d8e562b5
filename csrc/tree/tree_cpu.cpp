// C++ CPU kernel of build_tree: parallel over requests, the same ancestor walk
// and bit packing (tree_math.h) as the CUDA kernel.
#include <ATen/Parallel.h>

#include "tree_math.h"
#include "tree_params.h"

namespace specdec {

void build_tree_cpu(const BuildTreeParams& p) {
  at::parallel_for(0, p.batch, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t* parents = p.parents + b * p.nodes;
      const int64_t real = tree_num_real(p.num_nodes, b, p.nodes);
      for (int64_t i = 0; i < p.nodes; ++i) {
        int64_t* row = p.mask + (b * p.nodes + i) * p.words;
        const bool is_real = i < real;
        for (int64_t w = 0; w < p.words; ++w) {
          row[w] = is_real ? static_cast<int64_t>(tree_ancestor_word(parents, i, w)) : 0;
        }
        p.depth[b * p.nodes + i] = is_real ? tree_depth(parents, i) : -1;
      }
    }
  });
}

}  // namespace specdec
