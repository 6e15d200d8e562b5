"""Compiles the logits Triton kernels for sm_90 ahead of time (no GPU needed); run by
test_logits.py::test_triton_kernels_compile_for_sm90_without_a_gpu in a subprocess without TRITON_INTERPRET."""

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from specdec_ops.triton_kernels.logits import (chain_bonus_race_kernel, chain_bonus_verdict_kernel,
                                              chain_fused_kernel, chain_kept_mass_kernel, chain_radix_pass_kernel,
                                              chain_row_partials_kernel, chain_walk_race_kernel,
                                              process_logits_kernel, tree_rejection_sample_logits_kernel)

from aot_common import check, compile_kernel

target = GPUTarget("cuda", 90, 32)


def compile_all(fn, types, variants):
    names = fn.arg_names
    for const in variants:
        sig = {n: "constexpr" if n in const else types[n] for n in names}
        src = ASTSource(fn, sig, constexprs={(names.index(k),): v for k, v in const.items()})
        triton.compile(src, target=target, options=dict(num_warps=8))


params = dict(temperature_ptr="*fp32", top_k_ptr="*i64", top_p_ptr="*fp32", min_p_ptr="*fp32")
flags = [dict(HAS_T=True, HAS_K=True, HAS_P=True, HAS_MIN_P=True), dict(HAS_T=False, HAS_K=False, HAS_P=False,
                                                                         HAS_MIN_P=False)]
compile_all(process_logits_kernel, dict(logits_ptr="*bf16", probs_ptr="*fp32", rows="i32", inner="i32", vocab="i32",
                                        **params), [dict(f, vocab=128256, PASSES=4, BLOCK=1024, RADIX_BLOCK=512) for f in flags])
compile_all(tree_rejection_sample_logits_kernel,
            dict(logits_ptr="*bf16", draft_probs_ptr="*bf16", tokens_ptr="*i64", parents_ptr="*i64",
                 num_nodes_ptr="*i64", seeds_ptr="*i64", offsets_ptr="*i64", token_ids_ptr="*i64",
                 accepted_path_ptr="*i32", num_accepted_ptr="*i32", logprobs_ptr="*fp32", vocab="i32", nodes="i32",
                 part_max_ptr="*fp32", part_arg_ptr="*i64", part_sum_ptr="*fp32", tau_ptr="*i64",
                 part_kept_ptr="*fp32", **params),
            [dict(HAS_T=True, HAS_DRAFT_PROBS=has_q, LOGPROBS=True, BLOCK_N=64, vocab=128256, BLOCK=1024,
                  HAS_FILTERS=True, CHUNKS=16, CHUNKS_P2=16) for has_q in (False, True)]
            + [dict(HAS_T=False, HAS_DRAFT_PROBS=False, LOGPROBS=False, BLOCK_N=16, vocab=49152, BLOCK=1024,
                    HAS_FILTERS=False, CHUNKS=6, CHUNKS_P2=8)])
# the split chain kernels at the launcher's sizes for V = 128256: chunks of 8192, 16 chunks
split = dict(logits_ptr="*bf16", draft_probs_ptr="*bf16", draft_ids_ptr="*i64", lengths_ptr="*i64",
             seeds_ptr="*i64", offsets_ptr="*i64", temperature_ptr="*fp32", part_max_ptr="*fp32", part_arg_ptr="*i64",
             part_sum_ptr="*fp32", race_score_ptr="*fp32", race_index_ptr="*i64", tickets_ptr="*i32",
             token_ids_ptr="*i64", num_accepted_ptr="*i32", logprobs_ptr="*fp32", bonus_ptr="*i64", rates_ptr="*fp32",
             max_draft="i32", num_draft_rows="i32", bonus_rows="i32", tau_ptr="*i64", part_kept_ptr="*fp32",
             top_k_ptr="*i64", top_p_ptr="*fp32", min_p_ptr="*fp32", hist_ptr="*fp32",
             prefix_ptr="*i64", acc_ptr="*fp32", goal_ptr="*fp32", ktau_ptr="*i64", ptau_ptr="*i64", passed="i32",
             early_ptr="*i8", done_ptr="*i8", bonus_w_ptr="*i64", part_above_ptr="*fp32")
compile_all(chain_row_partials_kernel, split,
            [dict(PACKED=packed, HAS_T=has_t, HAS_BONUS=False, TREE=tree, CHUNKS=16, CHUNK=8192, PART_BLOCK=4096,
                  vocab=128256)
             for packed, has_t, tree in ((False, False, False), (True, True, False), (False, True, True))])
compile_all(chain_walk_race_kernel, split,
            [dict(PACKED=False, HAS_DRAFT_PROBS=True, HAS_T=True, LOGPROBS=not early, HAS_BONUS=False,
                  HAS_RATES=False, HAS_FILTERS=filters, EARLY=early, CHUNKS=16, CHUNKS_P2=16, CHUNK=8192, BLOCK_K=8,
                  BLOCK=1024, vocab=128256, RACE_GROUP=group, EARLY_BONUS=False)
             for filters, early, group in ((False, False, 2), (True, False, 1), (True, True, 2))]
            + [dict(PACKED=False, HAS_DRAFT_PROBS=True, HAS_T=True, LOGPROBS=False, HAS_BONUS=False, HAS_RATES=False,
                    HAS_FILTERS=True, EARLY=True, CHUNKS=16, CHUNKS_P2=16, CHUNK=8192, BLOCK_K=8, BLOCK=1024,
                    vocab=128256, RACE_GROUP=2, EARLY_BONUS=True)])
# top-p's early bonus token (the race over the bonus row, then the verdict), as launched: 4 warps, no spills
for has_q in (False, True):
    check(compile_kernel(chain_bonus_race_kernel, split,
                         dict(PACKED=False, HAS_T=True, HAS_K=True, HAS_MIN_P=True, HAS_DRAFT_PROBS=has_q, CHUNKS=16,
                              CHUNKS_P2=16, CHUNK=8192, BLOCK=1024, RACE_GROUP=2, vocab=128256), num_warps=4),
          f"chain_bonus_race_kernel draft_probs={has_q}")
check(compile_kernel(chain_bonus_verdict_kernel, split,
                     dict(PACKED=False, HAS_T=True, CHUNKS=16, CHUNKS_P2=16, CHUNK=8192, BLOCK=1024, BLOCK_K=8,
                          vocab=128256), num_warps=4), "chain_bonus_verdict_kernel")
# with filters: the radix passes (both selects) and the kept mass, 4 warps as launched, no spills; bf16 logits
# (4 passes a select) and float32 (8); top-p's early acceptance (EARLY, chain rows without logprobs) with and
# without draft probabilities
filtered = dict(PACKED=False, HAS_T=True, HAS_K=True, HAS_P=True, HAS_MIN_P=True, HAS_BONUS=False, TREE=False,
                CHUNKS=16, CHUNKS_P2=16, CHUNK=8192, vocab=128256)
for logits, passes in (("*bf16", 4), ("*fp32", 8)):
    types = dict(split, logits_ptr=logits)
    for by_mass, early, has_q in ((False, False, False), (True, False, False), (True, True, False),
                                  (True, True, True)):
        check(compile_kernel(chain_radix_pass_kernel, types,
                             dict(filtered, BY_MASS=by_mass, PASSES=passes, BLOCK=512, EARLY=early,
                                  HAS_DRAFT_PROBS=has_q, EARLY_BONUS=early, SPLIT=4), num_warps=4),
              f"chain_radix_pass_kernel {logits} BY_MASS={by_mass} EARLY={early} HAS_DRAFT_PROBS={has_q}")
    for early in (False, True):
        check(compile_kernel(chain_kept_mass_kernel, types, dict(filtered, BLOCK=1024, EARLY=early,
                                                                 EARLY_BONUS=early),
                             num_warps=4), f"chain_kept_mass_kernel {logits} EARLY={early}")
# chain verification in one launch (no filters, logprobs or rates), as launched (4 warps), no spills: bf16
# pairs (with the bonus race over quads, or entry by entry), float32 logits; with and without temperatures,
# draft probs, packed rows, external bonus ids; chunks of 8192 and 32768 (fused_chunk at B = 64)
fused = dict(split, bonus_score_ptr="*fp32", bonus_index_ptr="*i32", counters_ptr="*i32", batch="i32")
for logits, pairs, quads, has_t, has_q, packed, has_bonus, chunk in (
        ("*bf16", True, True, False, False, False, False, 32768),
        ("*bf16", True, True, True, True, False, False, 32768),
        ("*bf16", True, False, False, True, False, False, 8192),
        ("*bf16", True, True, True, False, True, True, 8192),
        ("*fp32", False, False, True, True, False, False, 8192),
        ("*fp16", False, False, False, False, True, False, 32768)):
    chunks = -(-128256 // chunk)
    check(compile_kernel(chain_fused_kernel, dict(fused, logits_ptr=logits, draft_probs_ptr=logits),
                         dict(PACKED=packed, HAS_DRAFT_PROBS=has_q, HAS_T=has_t, HAS_BONUS=has_bonus, CHUNKS=chunks,
                              CHUNKS_P2=1 << (chunks - 1).bit_length(), CHUNK=chunk, PART_BLOCK=4096,
                              RACE_BLOCK=1024, BLOCK=1024, BLOCK_K=8, RACE_GROUP=2, RACE_CHUNKS=16,
                              RACE_CHUNKS_P2=16, RACE_CHUNK=8192, PAIRS=pairs, QUADS=quads, vocab=128256),
                         num_warps=4, maxnreg=104),
          f"chain_fused_kernel {logits} QUADS={quads} HAS_T={has_t} HAS_DRAFT_PROBS={has_q} PACKED={packed} "
          f"HAS_BONUS={has_bonus} CHUNK={chunk}")
print("compiled")
