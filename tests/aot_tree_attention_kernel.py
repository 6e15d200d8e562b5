"""Compiles the tree attention Triton kernels for sm_90 ahead of time (no GPU needed); run by
test_tree_attention.py::test_triton_kernels_compile_for_sm90_without_a_gpu in a subprocess without
TRITON_INTERPRET. The tile configurations are the launcher's (specdec_ops.attention._tile_config), strides of
the head dimension 1 and the others divisible by 16, as the JIT specializes them for contiguous caches;
fails on any spill, and on a TF32 dot in the float32 kernels."""

import torch
from aot_common import check, compile_kernel

from specdec_ops.attention import _tile_config
from specdec_ops.triton_kernels import tree_attention as mod

# (dtype, rows = N * group, D): the reference shape (N = 16, GQA 4, D = 128) and its neighbours.
CASES = [("bf16", 64, 128), ("fp16", 16, 128), ("bf16", 8, 64), ("bf16", 32, 256), ("fp32", 64, 128), ("fp32", 8, 64)]
TORCH = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
for dtype, rows, d in CASES:
    block_m, block_n, block_d, num_warps, maxnreg = _tile_config(TORCH[dtype], rows, d)
    types = dict(q_ptr=f"*{dtype}", k_ptr=f"*{dtype}", v_ptr=f"*{dtype}", prefix_lens_ptr="*i64", mask_ptr="*i64",
                 table_ptr="*i64", out_ptr=f"*{dtype}", lse_ptr="*fp32", qk_scale="fp32")
    for paged in (False, True):
        for while_loops in (False, True):  # True: the loop form triton < 3.8's interpreter runs
            const = dict(PAGED=paged, SKIP_PREFIX=False, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
                         IEEE=dtype == "fp32", WHILE_LOOPS=while_loops,
                         stride_qd=1, stride_kd=1, stride_vd=1, stride_od=1)
            aligned = [n for n in mod.tree_attention_kernel.arg_names if n.startswith("stride") and n not in const]
            kernel = compile_kernel(mod.tree_attention_kernel, types, const, aligned=aligned + ["head_dim"],
                                    num_warps=num_warps, num_stages=2, maxnreg=maxnreg)
            if dtype == "fp32":  # both dots (Q K^T and P V) in exact float32, none rounded to TF32
                assert "tf32" not in kernel.asm["ptx"], f"tree_attention fp32 rows={rows} D={d}: a TF32 dot"
            if not while_loops:
                check(kernel, f"tree_attention {dtype} rows={rows} D={d} paged={paged} "
                              f"tiles=({block_m}, {block_n}, {block_d}) warps={num_warps} maxnreg={maxnreg}")
check(compile_kernel(mod.combine_splits_kernel, dict(part_out_ptr="*fp32", part_lse_ptr="*fp32", out_ptr="*bf16",
                                                     lse_ptr="*fp32"), dict(BLOCK_S=2, BLOCK_D=64), num_warps=4),
      "combine_splits")
check(compile_kernel(mod.merge_states_kernel, dict(out_a_ptr="*fp16", lse_a_ptr="*fp32", out_b_ptr="*fp16",
                                                   lse_b_ptr="*fp32", out_ptr="*fp16", lse_ptr="*fp32"),
                     dict(BLOCK_D=64), num_warps=4), "merge_states")
print("compiled")
