"""Compiles the tree verification Triton kernel for sm_90 ahead of time (no GPU needed); run by
test_tree_rejection.py::test_triton_kernel_compiles_for_sm90_without_a_gpu in a subprocess without
TRITON_INTERPRET. Fails on any spill, and without 128-bit loads of the probabilities. The launcher's
layout at a large vocab: 4 warps at most 128 registers each (maxnreg), BLOCK = 1024, VBLOCK = 4096,
CHUNK = 512, UNROLL = 2, and every PARTS it picks (8: a batch that leaves room, ... 1: a full device)."""

from aot_common import check, compile_kernel

from specdec_ops.triton_kernels.tree_verify import tree_verify_kernel as fn

for dtype in ("bf16", "fp32"):
    types = dict(target_ptr=f"*{dtype}", draft_probs_ptr=f"*{dtype}", tokens_ptr="*i64", parents_ptr="*i64",
                 num_nodes_ptr="*i64", seeds_ptr="*i64", offsets_ptr="*i64", greedy_ptr="*i1",
                 normalizers_ptr="*fp32", zeroed_ptr="*i32", kids_ptr="*i32", lane_sums_ptr="*fp32",
                 part_best_ptr="*fp32", part_index_ptr="*i32", part_count_ptr="*i64", tickets_ptr="*i32",
                 token_ids_ptr="*i64", accepted_path_ptr="*i32", num_accepted_ptr="*i32", nodes="i32")
    for parts in (8, 4, 2, 1):
        for has_q in (False, True):
            for has_greedy in (False, True):
                const = dict(HAS_NUM_NODES=has_q, HAS_DRAFT_PROBS=has_q, HAS_GREEDY=has_greedy, BLOCK_N=64,
                             BLOCK=1024, VBLOCK=4096, PARTS=parts, CHUNK=512, UNROLL=2,
                             TILES=32, vocab=128256)
                check(compile_kernel(fn, types, const, num_warps=4, maxnreg=128),
                      f"tree {dtype} parts={parts} draft_probs={has_q} greedy={has_greedy}", vector_loads=True)
print("compiled")
