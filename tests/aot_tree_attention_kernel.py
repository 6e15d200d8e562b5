"""Compiles the tree attention Triton kernels for sm_90 ahead of time (no GPU needed); run by
test_tree_attention.py::test_triton_kernels_compile_for_sm90_without_a_gpu in a subprocess without
TRITON_INTERPRET."""

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from specdec_ops.triton_kernels import tree_attention as mod

target = GPUTarget("cuda", 90, 32)


def build(fn, types, const, **options):
    names = fn.arg_names
    sig = {n: "constexpr" if n in const else types.get(n, "i64" if n.startswith("stride") else "i32") for n in names}
    src = ASTSource(fn, sig, constexprs={(names.index(k),): v for k, v in const.items()})
    triton.compile(src, target=target, options=options)

build(mod.tree_attention_kernel,
      dict(q_ptr="*bf16", k_ptr="*bf16", v_ptr="*bf16", prefix_lens_ptr="*i64", mask_ptr="*i64",
           table_ptr="*i64", out_ptr="*fp32", lse_ptr="*fp32", qk_scale="fp32"),
      dict(PAGED=True, SKIP_PREFIX=False, BLOCK_M=16, BLOCK_N=64, BLOCK_D=64, IEEE=False),
      num_warps=4, num_stages=2)
build(mod.combine_splits_kernel, dict(part_out_ptr="*fp32", part_lse_ptr="*fp32", out_ptr="*bf16",
      lse_ptr="*fp32"), dict(BLOCK_S=2, BLOCK_D=64), num_warps=4)
build(mod.merge_states_kernel, dict(out_a_ptr="*fp16", lse_a_ptr="*fp32", out_b_ptr="*fp16", lse_b_ptr="*fp32",
      out_ptr="*fp16", lse_ptr="*fp32"), dict(BLOCK_D=64), num_warps=4)
print("compiled")
