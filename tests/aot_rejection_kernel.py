"""Compiles the chain rejection Triton kernel for sm_90 ahead of time (no GPU needed); run by
test_rejection.py::test_triton_kernel_compiles_for_sm90_without_a_gpu in a subprocess without TRITON_INTERPRET."""

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from specdec_ops.triton_kernels.rejection import rejection_sample_kernel as fn
target = GPUTarget("cuda", 90, 32)
names = fn.arg_names
types = dict(target_ptr="*bf16", draft_probs_ptr="*bf16", draft_ids_ptr="*i64", lengths_ptr="*i64", seeds_ptr="*i64",
             offsets_ptr="*i64", greedy_ptr="*i1", token_ids_ptr="*i64", num_accepted_ptr="*i32",
             max_draft="i32", num_draft_rows="i32")
for packed in (False, True):
    for has_q in (False, True):
        const = dict(PACKED=packed, HAS_DRAFT_PROBS=has_q, HAS_GREEDY=True, BLOCK_K=8, BLOCK=1024,
                     vocab=128256)
        sig = {n: "constexpr" if n in const else types[n] for n in names}
        src = ASTSource(fn, sig, constexprs={(names.index(k),): v for k, v in const.items()})
        triton.compile(src, target=target, options=dict(num_warps=8))
print("compiled")
