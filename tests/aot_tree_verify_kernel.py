"""Compiles the tree verification Triton kernel for sm_90 ahead of time (no GPU needed); run by
test_tree_rejection.py::test_triton_kernel_compiles_for_sm90_without_a_gpu in a subprocess without
TRITON_INTERPRET."""

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from specdec_ops.triton_kernels.tree_verify import tree_verify_kernel as fn
target = GPUTarget("cuda", 90, 32)
names = fn.arg_names
types = dict(target_ptr="*bf16", draft_probs_ptr="*bf16", tokens_ptr="*i64", parents_ptr="*i64",
             num_nodes_ptr="*i64", seeds_ptr="*i64", offsets_ptr="*i64", greedy_ptr="*i1",
             normalizers_ptr="*fp32", zeroed_ptr="*i32", token_ids_ptr="*i64", accepted_path_ptr="*i32",
             num_accepted_ptr="*i32", nodes="i32")
for has_q in (False, True):
    for has_greedy in (False, True):
        const = dict(HAS_NUM_NODES=has_q, HAS_DRAFT_PROBS=has_q, HAS_GREEDY=has_greedy, BLOCK_N=64, BLOCK=1024,
                     vocab=128256)
        sig = {n: "constexpr" if n in const else types[n] for n in names}
        src = ASTSource(fn, sig, constexprs={(names.index(k),): v for k, v in const.items()})
        triton.compile(src, target=target, options=dict(num_warps=8))
print("compiled")
