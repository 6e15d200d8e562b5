"""Compiles the chain rejection Triton kernel for sm_90 ahead of time (no GPU needed); run by
test_rejection.py::test_triton_kernel_compiles_for_sm90_without_a_gpu in a subprocess without TRITON_INTERPRET.
Fails on any spill, and without 128-bit loads of the probabilities (vocab divisible by 16, as Llama 3's; the
slices of the split start at multiples of BLOCK, so they stay aligned). num_warps=4 and maxnreg: the launcher's."""

from aot_common import check, compile_kernel

from specdec_ops.rejection import _TRITON_MAXNREG
from specdec_ops.triton_kernels.rejection import rejection_sample_kernel as fn

for dtype in ("bf16", "fp32"):
    types = dict(target_ptr=f"*{dtype}", draft_probs_ptr=f"*{dtype}", draft_ids_ptr="*i64", lengths_ptr="*i64",
                 seeds_ptr="*i64", offsets_ptr="*i64", greedy_ptr="*i1", token_ids_ptr="*i64",
                 num_accepted_ptr="*i32", bonus_ids_ptr="*i64", rates_ptr="*fp32", scores_ptr="*fp32",
                 index_ptr="*i32", counters_ptr="*i32", max_draft="i32", num_draft_rows="i32", tiles_per_part="i32",
                 num_parts="i32")
    for packed in (False, True):
        for has_q in (False, True):
            # keywords: off, or every engine keyword on (external bonus ids, no bonus rows, synthetic rates)
            for keywords in ((False, True, False), (True, False, True)):
                bonus_ids, bonus_rows, synthetic = keywords
                const = dict(PACKED=packed, HAS_DRAFT_PROBS=has_q, HAS_GREEDY=True, HAS_BONUS_IDS=bonus_ids,
                             BONUS_ROWS=bonus_rows, SYNTHETIC=synthetic, BLOCK_K=8, BLOCK=1024, vocab=128256,
                             PARTS_BLOCK=128, WHILE_LOOPS=False)
                check(compile_kernel(fn, types, const, num_warps=4, maxnreg=_TRITON_MAXNREG),
                      f"chain {dtype} packed={packed} draft_probs={has_q} keywords={bonus_ids}", vector_loads=True)
print("compiled")
