"""Compiles the logits Triton kernels for sm_90 ahead of time (no GPU needed); run by
test_logits.py::test_triton_kernels_compile_for_sm90_without_a_gpu in a subprocess without TRITON_INTERPRET."""

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from specdec_ops.triton_kernels.logits import (process_logits_kernel, rejection_sample_logits_kernel,
                                              tree_rejection_sample_logits_kernel)

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
                                        **params), [dict(f, vocab=128256, BLOCK=1024) for f in flags])
compile_all(rejection_sample_logits_kernel,
            dict(logits_ptr="*bf16", draft_probs_ptr="*fp32", draft_ids_ptr="*i64", lengths_ptr="*i64",
                 seeds_ptr="*i64", offsets_ptr="*i64", token_ids_ptr="*i64", num_accepted_ptr="*i32",
                 logprobs_ptr="*fp32", bonus_ptr="*i64", rates_ptr="*fp32", vocab="i32", max_draft="i32",
                 num_draft_rows="i32", bonus_rows="i32", **params),
            [dict(flags[0], PACKED=packed, HAS_DRAFT_PROBS=has_q, LOGPROBS=lp, HAS_BONUS=False, HAS_RATES=False,
                  BLOCK_K=8, vocab=128256, BLOCK=1024)
             for packed in (False, True) for has_q in (False, True) for lp in (False, True)]
            + [dict(flags[1], PACKED=False, HAS_DRAFT_PROBS=False, LOGPROBS=False, HAS_BONUS=False, HAS_RATES=False,
                    BLOCK_K=8, vocab=49152, BLOCK=1024)]
            # the engine keywords (issue #14): external bonus tokens, synthetic acceptance rates
            + [dict(flags[0], PACKED=packed, HAS_DRAFT_PROBS=True, LOGPROBS=True, HAS_BONUS=bonus, HAS_RATES=rates,
                    BLOCK_K=8, vocab=128256, BLOCK=1024)
               for packed in (False, True) for bonus, rates in ((True, True),)])
compile_all(tree_rejection_sample_logits_kernel,
            dict(logits_ptr="*bf16", draft_probs_ptr="*bf16", tokens_ptr="*i64", parents_ptr="*i64",
                 num_nodes_ptr="*i64", seeds_ptr="*i64", offsets_ptr="*i64", token_ids_ptr="*i64",
                 accepted_path_ptr="*i32", num_accepted_ptr="*i32", logprobs_ptr="*fp32", vocab="i32", nodes="i32",
                 **params),
            [dict(flags[0], HAS_NUM_NODES=True, HAS_DRAFT_PROBS=has_q, LOGPROBS=True, BLOCK_N=64, vocab=128256, BLOCK=1024)
             for has_q in (False, True)]
            + [dict(flags[1], HAS_NUM_NODES=False, HAS_DRAFT_PROBS=False, LOGPROBS=False, BLOCK_N=16, vocab=49152,
                    BLOCK=1024)])
print("compiled")
