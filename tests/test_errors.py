"""One exception type per kind of bad input, on every backend (DESIGN.md §4).

For every public op and every backend that runs on CPU tensors here (cpu, reference,
triton) a wrong dtype, a wrong shape and a bad index value each raise exactly
SpecDecArgumentError (a ValueError, TypeError and RuntimeError subclass) with the
bad argument named in the message, whichever layer (Python checks or the C++ op)
found it. Calling a C++ op directly (torch.ops.specdec.*) raises torch's own
classes: TypeError for a dtype, ValueError for a shape or value.
"""

import pytest
import torch

import specdec_ops
from specdec_ops import SpecDecArgumentError
from conftest import CPU_BACKENDS

# ---------------------------------------------------------------------------------------------- valid inputs


def chain_args():
    g = torch.Generator().manual_seed(0)
    return dict(target_probs=torch.softmax(torch.randn(2, 3, 8, generator=g), -1),
                draft_token_ids=torch.tensor([[1, 2], [3, 4]]), num_draft_tokens=torch.tensor([2, 1]),
                draft_probs=torch.softmax(torch.randn(2, 2, 8, generator=g), -1), seeds=torch.tensor([1, 2]),
                offsets=torch.tensor([0, 5]), greedy=torch.tensor([False, True]))


def chain_keywords(a):
    """The engine keywords of the chain ops a case sets (issue #14)."""
    return {k: a[k] for k in ("bonus_token_ids", "reject_invalid_drafts", "synthetic_acceptance_rates") if k in a}


def call_chain(a, backend):
    return specdec_ops.rejection_sample(a["target_probs"], a["draft_token_ids"], a["num_draft_tokens"],
                                        a["draft_probs"], seeds=a["seeds"], offsets=a["offsets"],
                                        greedy=a["greedy"], backend=backend, **chain_keywords(a))


def packed_args():
    g = torch.Generator().manual_seed(1)
    return dict(target_probs=torch.softmax(torch.randn(5, 8, generator=g), -1),
                cu_num_draft_tokens=torch.tensor([0, 2, 3]), draft_token_ids=torch.tensor([1, 2, 3]),
                draft_probs=torch.softmax(torch.randn(3, 8, generator=g), -1), seeds=torch.tensor([1, 2]),
                offsets=torch.tensor([0, 5]), greedy=None, max_num_draft_tokens=2)


def call_packed(a, backend):
    return specdec_ops.rejection_sample_packed(a["target_probs"], a["cu_num_draft_tokens"], a["draft_token_ids"],
                                               a["draft_probs"], seeds=a["seeds"], offsets=a["offsets"],
                                               greedy=a["greedy"], max_num_draft_tokens=a["max_num_draft_tokens"],
                                               backend=backend, **chain_keywords(a))


def tree_args():
    g = torch.Generator().manual_seed(2)
    return dict(target_probs=torch.softmax(torch.randn(2, 4, 8, generator=g), -1),
                tree_token_ids=torch.tensor([[0, 1, 2, 3], [0, 4, 5, 6]]),
                parents=torch.tensor([[-1, 0, 0, 1], [-1, 0, 1, 2]]), num_nodes=torch.tensor([4, 3]),
                draft_probs=torch.softmax(torch.randn(2, 4, 8, generator=g), -1), seeds=torch.tensor([1, 2]),
                offsets=torch.tensor([0, 5]), greedy=None)


def call_tree(a, backend):
    return specdec_ops.tree_rejection_sample(a["target_probs"], a["tree_token_ids"], a["parents"], a["num_nodes"],
                                             a["draft_probs"], seeds=a["seeds"], offsets=a["offsets"],
                                             greedy=a["greedy"], backend=backend)


def build_tree_args():
    return dict(parents=torch.tensor([[-1, 0, 0, 1], [-1, 0, 1, -1]]), num_nodes=torch.tensor([4, 3]))


def call_build_tree(a, backend):
    return specdec_ops.build_tree(a["parents"], a["num_nodes"], backend=backend)


def bias_args():
    mask = specdec_ops.build_tree(torch.tensor([[-1, 0, 0, 1], [-1, 0, 1, 2]]), backend="reference").mask
    return dict(mask=mask, prefix_lens=torch.tensor([3, 0]), kv_len=10, dtype=torch.float32)


def call_bias(a, backend):
    return specdec_ops.tree_attention_bias(a["mask"], a["prefix_lens"], a["kv_len"], a["dtype"])


def attention_args():
    g = torch.Generator().manual_seed(3)
    mask = specdec_ops.build_tree(torch.tensor([[-1, 0, 0, 1], [-1, 0, 1, 2]]), backend="reference").mask
    return dict(q=torch.randn(2, 4, 2, 64, generator=g), k_cache=torch.randn(2, 16, 1, 64, generator=g),
                v_cache=torch.randn(2, 16, 1, 64, generator=g), prefix_lens=torch.tensor([3, 0]), mask=mask,
                block_table=None)


def call_attention(a, backend):
    return specdec_ops.tree_attention(a["q"], a["k_cache"], a["v_cache"], a["prefix_lens"], a["mask"],
                                      block_table=a["block_table"], backend=backend)


def merge_args():
    g = torch.Generator().manual_seed(4)
    return dict(out_a=torch.randn(2, 3, 16, generator=g), lse_a=torch.randn(2, 3, generator=g),
                out_b=torch.randn(2, 3, 16, generator=g), lse_b=torch.randn(2, 3, generator=g))


def call_merge(a, backend):
    return specdec_ops.merge_attention_states(a["out_a"], a["lse_a"], a["out_b"], a["lse_b"], backend=backend)


def kv_args():
    return dict(caches=[torch.zeros(2, 12, 1, 4), torch.zeros(2, 12, 1, 4)], seq_lens=torch.tensor([2, 0],
                dtype=torch.int32), accepted_path=torch.tensor([[0, 2, -1], [0, 1, 2]]), block_table=None)


def call_kv(a, backend):
    return specdec_ops.kv_commit(a["caches"], a["seq_lens"], a["accepted_path"], block_table=a["block_table"],
                                 backend=backend)


def rollback_args():
    return dict(caches=[torch.zeros(2, 12, 1, 4)], seq_lens=torch.tensor([2, 0], dtype=torch.int32),
                num_tokens=torch.tensor([1, 3]), max_tokens=3)


def call_rollback(a, backend):
    return specdec_ops.kv_rollback(a["caches"], a["seq_lens"], a["num_tokens"], a["max_tokens"], backend=backend)


def grid_args():
    return dict(selected=torch.tensor([[0, 1, 3]]), beam_indices=torch.tensor([[[0, 1]]]), topk=2)


def call_grid(a, backend):
    return specdec_ops.topk_grid_to_parents(a["selected"], a["beam_indices"], a["topk"])


def logits_chain_args():
    g = torch.Generator().manual_seed(7)
    return dict(target_logits=torch.randn(2, 3, 8, generator=g), draft_token_ids=torch.tensor([[1, 2], [3, 4]]),
                num_draft_tokens=torch.tensor([2, 1]), draft_probs=torch.softmax(torch.randn(2, 2, 8, generator=g), -1),
                temperature=torch.tensor([0.7, 0.0]), top_k=torch.tensor([3, 0]), top_p=torch.tensor([0.9, 1.0]),
                min_p=torch.tensor([0.0, 0.1]), seeds=torch.tensor([1, 2]), offsets=torch.tensor([0, 5]))


def _sampling_kwargs(a):
    return {k: a[k] for k in ("temperature", "top_k", "top_p", "min_p", "seeds", "offsets")}


# The engine keywords of the chain ops (issue #14), passed when a case sets them.
LOGITS_ENGINE = ("bonus_token_ids", "reject_invalid_drafts", "synthetic_acceptance_rates")


def _engine_kwargs(a):
    return {k: a[k] for k in LOGITS_ENGINE if k in a}


def call_logits_chain(a, backend):
    return specdec_ops.rejection_sample_logits(a["target_logits"], a["draft_token_ids"], a["num_draft_tokens"],
                                               a["draft_probs"], return_logprobs=True, backend=backend,
                                               **_sampling_kwargs(a), **_engine_kwargs(a))


def logits_packed_args():
    a = logits_chain_args()
    g = torch.Generator().manual_seed(8)
    a.update(target_logits=torch.randn(5, 8, generator=g), cu_num_draft_tokens=torch.tensor([0, 2, 3]),
             draft_token_ids=torch.tensor([1, 2, 3]), draft_probs=torch.softmax(torch.randn(3, 8, generator=g), -1),
             max_num_draft_tokens=2)
    del a["num_draft_tokens"]
    return a


def call_logits_packed(a, backend):
    return specdec_ops.rejection_sample_logits_packed(
        a["target_logits"], a["cu_num_draft_tokens"], a["draft_token_ids"], a["draft_probs"], return_logprobs=True,
        max_num_draft_tokens=a["max_num_draft_tokens"], backend=backend, **_sampling_kwargs(a), **_engine_kwargs(a))


def logits_tree_args():
    a = logits_chain_args()
    g = torch.Generator().manual_seed(9)
    a.update(target_logits=torch.randn(2, 4, 8, generator=g), tree_token_ids=torch.tensor([[0, 1, 2, 3], [0, 4, 5, 6]]),
             parents=torch.tensor([[-1, 0, 0, 1], [-1, 0, 1, 2]]), num_nodes=torch.tensor([4, 3]),
             draft_probs=torch.softmax(torch.randn(2, 4, 8, generator=g), -1))
    del a["draft_token_ids"], a["num_draft_tokens"]
    return a


def call_logits_tree(a, backend):
    return specdec_ops.tree_rejection_sample_logits(a["target_logits"], a["tree_token_ids"], a["parents"],
                                                    a["num_nodes"], a["draft_probs"], return_logprobs=True,
                                                    backend=backend, **_sampling_kwargs(a))


def process_args():
    return dict(logits=torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(10)),
                temperature=torch.tensor([0.7, 0.0]), top_k=torch.tensor([3, 0]), top_p=torch.tensor([0.9, 1.0]),
                min_p=torch.tensor([0.0, 0.1]))


def call_process(a, backend):
    return specdec_ops.process_logits(a["logits"], a["temperature"], a["top_k"], a["top_p"], a["min_p"],
                                      backend=backend)


def _set(**changes):
    def mutate(a):
        a.update({k: (v(a) if callable(v) else v) for k, v in changes.items()})
    return mutate


def _poke(name, index, value):
    def mutate(a):
        a[name] = a[name].clone()
        a[name][index] = value
    return mutate


# ---------------------------------------------------------------------------------------------- the table

# Bad sampling parameters: the same cases for every logits op.
SAMPLING_BAD = [
    ("dtype", "top_k", _set(top_k=lambda a: a["top_k"].float())),
    ("dtype", "temperature", _set(temperature=lambda a: a["temperature"].long())),
    ("shape", "top_p", _set(top_p=torch.tensor([0.9, 1.0, 1.0]))),
    ("value", "temperature", _poke("temperature", 0, -1.0)),
    ("value", "temperature", _poke("temperature", 1, float("nan"))),
    ("value", "top_k", _poke("top_k", 0, -1)),
    ("value", "top_p", _poke("top_p", 0, 0.0)),
    ("value", "top_p", _poke("top_p", 1, 1.5)),
    ("value", "min_p", _poke("min_p", 1, 1.0)),
    ("value", "min_p", _poke("min_p", 0, -0.1)),
]

# Bad engine keywords (issue #14): the same cases for the four chain ops (B = 2, K = 2, V = 8).
ENGINE_BAD = [
    ("shape", "bonus_token_ids", _set(bonus_token_ids=torch.tensor([1, 2, 3]))),
    ("shape", "bonus_token_ids", _set(bonus_token_ids=torch.tensor([[1, 2]]))),
    ("dtype", "bonus_token_ids", _set(bonus_token_ids=torch.tensor([1.0, 2.0]))),
    ("value", "bonus_token_ids", _set(bonus_token_ids=torch.tensor([1, 8]))),
    ("value", "bonus_token_ids", _set(bonus_token_ids=torch.tensor([[-1], [2]]))),
    ("shape", "synthetic_acceptance_rates", _set(synthetic_acceptance_rates=torch.tensor([0.5]))),
    ("shape", "synthetic_acceptance_rates", _set(synthetic_acceptance_rates=torch.tensor([[0.5, 0.5]]))),
    ("dtype", "synthetic_acceptance_rates",
     _set(synthetic_acceptance_rates=torch.tensor([0.5, 0.5], dtype=torch.float64))),
    ("value", "synthetic_acceptance_rates", _set(synthetic_acceptance_rates=torch.tensor([0.5, 1.5]))),
    ("value", "synthetic_acceptance_rates", _set(synthetic_acceptance_rates=torch.tensor([float("nan"), 0.5]))),
    ("dtype", "reject_invalid_drafts", _set(reject_invalid_drafts=1)),
]

# op: (valid inputs, call, backends it has among cpu/reference/triton (None: no backend argument),
#      [(kind, argument named in the message, mutation)])
OPS = {
    "rejection_sample": (chain_args, call_chain, ("cpu", "reference", "triton"), [
        ("dtype", "target_probs", _set(target_probs=lambda a: a["target_probs"].double())),
        ("dtype", "draft_token_ids", _set(draft_token_ids=lambda a: a["draft_token_ids"].float())),
        ("dtype", "num_draft_tokens", _set(num_draft_tokens=lambda a: a["num_draft_tokens"].float())),
        ("dtype", "draft_probs", _set(draft_probs=lambda a: a["draft_probs"].long())),
        ("dtype", "seeds", _set(seeds=lambda a: a["seeds"].float())),
        ("dtype", "offsets", _set(offsets=lambda a: a["offsets"].float())),
        ("dtype", "greedy", _set(greedy=lambda a: a["greedy"].long())),
        ("shape", "target_probs", _set(target_probs=lambda a: a["target_probs"][0])),
        ("shape", "draft_token_ids", _set(draft_token_ids=torch.zeros(2, 3, dtype=torch.int64))),
        ("shape", "num_draft_tokens", _set(num_draft_tokens=torch.tensor([1, 1, 1]))),
        ("shape", "draft_probs", _set(draft_probs=lambda a: a["draft_probs"][..., :7])),
        ("shape", "seeds", _set(seeds=torch.tensor([1, 2, 3]))),
        ("value", "draft_token_ids", _poke("draft_token_ids", (0, 1), 8)),
        ("value", "draft_token_ids", _poke("draft_token_ids", (1, 0), -1)),
        ("value", "num_draft_tokens", _poke("num_draft_tokens", 1, 3)),
        ("value", "num_draft_tokens", _poke("num_draft_tokens", 0, -1)),
        ("dtype", "reject_invalid_drafts", _set(reject_invalid_drafts=torch.tensor(True))),
        ("shape", "target_probs", _set(bonus_token_ids=torch.tensor([1, 2]),
                                       target_probs=lambda a: a["target_probs"][:, :1])),  # neither K+1 nor K rows
   ] + ENGINE_BAD),
    "rejection_sample_packed": (packed_args, call_packed, ("cpu", "reference", "triton"), [
        ("dtype", "target_probs", _set(target_probs=lambda a: a["target_probs"].double())),
        ("dtype", "cu_num_draft_tokens", _set(cu_num_draft_tokens=lambda a: a["cu_num_draft_tokens"].float())),
        ("dtype", "draft_token_ids", _set(draft_token_ids=lambda a: a["draft_token_ids"].float())),
        ("dtype", "draft_probs", _set(draft_probs=lambda a: a["draft_probs"].long())),
        ("dtype", "seeds", _set(seeds=lambda a: a["seeds"].float())),
        ("shape", "cu_num_draft_tokens", _set(cu_num_draft_tokens=torch.tensor([[0, 2, 3]]))),
        ("shape", "draft_token_ids", _set(draft_token_ids=torch.tensor([[1, 2, 3]]))),
        ("shape", "draft_probs", _set(draft_probs=lambda a: a["draft_probs"][:, :7])),
        ("shape", "seeds", _set(seeds=torch.tensor([1]))),
        ("value", "cu_num_draft_tokens", _poke("cu_num_draft_tokens", 0, 1)),
        ("value", "cu_num_draft_tokens", _set(cu_num_draft_tokens=torch.tensor([0, 3, 2]), max_num_draft_tokens=3)),
        ("value", "draft_token_ids", _poke("draft_token_ids", 2, 8)),
        ("value", "max_num_draft_tokens", _set(max_num_draft_tokens=1)),
        ("value", "max_num_draft_tokens", _set(max_num_draft_tokens=-1)),
        ("dtype", "reject_invalid_drafts", _set(reject_invalid_drafts=torch.tensor(True))),
        ("shape", "target_probs", _set(bonus_token_ids=torch.tensor([1, 2]),
                                       target_probs=lambda a: a["target_probs"][:4])),  # neither T + B nor T rows
   ] + ENGINE_BAD),
    "tree_rejection_sample": (tree_args, call_tree, ("cpu", "reference", "triton"), [
        ("dtype", "target_probs", _set(target_probs=lambda a: a["target_probs"].double())),
        ("dtype", "tree_token_ids", _set(tree_token_ids=lambda a: a["tree_token_ids"].float())),
        ("dtype", "parents", _set(parents=lambda a: a["parents"].float())),
        ("dtype", "num_nodes", _set(num_nodes=lambda a: a["num_nodes"].float())),
        ("dtype", "draft_probs", _set(draft_probs=lambda a: a["draft_probs"].long())),
        ("dtype", "seeds", _set(seeds=lambda a: a["seeds"].float())),
        ("shape", "tree_token_ids", _set(tree_token_ids=lambda a: a["tree_token_ids"][:, :3])),
        ("shape", "parents", _set(parents=lambda a: a["parents"][:, :3])),
        ("shape", "num_nodes", _set(num_nodes=torch.tensor([4, 3, 2]))),
        ("shape", "draft_probs", _set(draft_probs=lambda a: a["draft_probs"][..., :7])),
        ("value", "parents", _poke("parents", (0, 2), 2)),
        ("value", "parents", _poke("parents", (1, 0), 0)),
        ("value", "tree_token_ids", _poke("tree_token_ids", (0, 1), 8)),
        ("value", "num_nodes", _poke("num_nodes", 0, 0)),
        ("value", "num_nodes", _poke("num_nodes", 1, 5)),
    ]),
    "build_tree": (build_tree_args, call_build_tree, ("cpu", "reference"), [
        ("dtype", "parents", _set(parents=lambda a: a["parents"].float())),
        ("dtype", "num_nodes", _set(num_nodes=lambda a: a["num_nodes"].float())),
        ("shape", "parents", _set(parents=lambda a: a["parents"][0])),
        ("shape", "num_nodes", _set(num_nodes=torch.tensor([4]))),
        ("value", "parents", _poke("parents", (0, 3), 3)),
        ("value", "parents", _poke("parents", (1, 0), 1)),
        ("value", "num_nodes", _poke("num_nodes", 1, 5)),
    ]),
    "tree_attention_bias": (bias_args, call_bias, None, [
        ("dtype", "mask", _set(mask=lambda a: a["mask"].int())),
        ("dtype", "prefix_lens", _set(prefix_lens=lambda a: a["prefix_lens"].float())),
        ("dtype", "dtype", _set(dtype=torch.int32)),
        ("shape", "mask", _set(mask=lambda a: torch.cat([a["mask"], a["mask"]], dim=2))),
        ("shape", "prefix_lens", _set(prefix_lens=torch.tensor([3, 0, 1]))),
        ("value", "prefix_lens", _poke("prefix_lens", 1, -2)),
        ("value", "kv_len", _set(kv_len=-1)),
    ]),
    "tree_attention": (attention_args, call_attention, ("cpu", "reference", "triton"), [
        ("dtype", "q", _set(q=lambda a: a["q"].double())),
        ("dtype", "k_cache", _set(k_cache=lambda a: a["k_cache"].half())),
        ("dtype", "prefix_lens", _set(prefix_lens=lambda a: a["prefix_lens"].float())),
        ("dtype", "mask", _set(mask=lambda a: a["mask"].int())),
        ("shape", "q", _set(q=lambda a: a["q"][0])),
        ("shape", "k_cache", _set(k_cache=lambda a: a["k_cache"][..., :32])),
        ("shape", "v_cache", _set(v_cache=lambda a: a["v_cache"][:, :8])),
        ("shape", "prefix_lens", _set(prefix_lens=torch.tensor([3]))),
        ("value", "prefix_lens", _poke("prefix_lens", 0, 13)),
        ("value", "prefix_lens", _poke("prefix_lens", 1, -1)),
    ]),
    "merge_attention_states": (merge_args, call_merge, ("cpu", "reference", "triton"), [
        ("dtype", "out_a", _set(out_a=lambda a: a["out_a"].double(), out_b=lambda a: a["out_b"].double())),
        ("dtype", "out_b", _set(out_b=lambda a: a["out_b"].half())),
        ("dtype", "lse_a", _set(lse_a=lambda a: a["lse_a"].half())),
        ("shape", "out_b", _set(out_b=lambda a: a["out_b"][:, :2])),
        ("shape", "lse_b", _set(lse_b=lambda a: a["lse_b"][:1])),
    ]),
    "kv_commit": (kv_args, call_kv, ("cpu", "reference", "triton"), [
        ("dtype", "seq_lens", _set(seq_lens=lambda a: a["seq_lens"].long())),
        ("dtype", "accepted_path", _set(accepted_path=lambda a: a["accepted_path"].float())),
        ("dtype", r"caches\[1\]", _set(caches=lambda a: [a["caches"][0], a["caches"][1].double()])),
        ("dtype", "block_table", _set(block_table=torch.zeros(2, 3))),
        ("shape", "accepted_path", _set(accepted_path=lambda a: a["accepted_path"][0])),
        ("shape", r"caches\[0\]", _set(caches=lambda a: [a["caches"][0][0], a["caches"][1]])),
        ("shape", r"caches\[1\]", _set(caches=lambda a: [a["caches"][0], a["caches"][1][:, :8]])),
        ("shape", "seq_lens", _set(seq_lens=torch.tensor([[2, 0]], dtype=torch.int32))),
        ("value", "accepted_path", _poke("accepted_path", (0, 0), 1)),
        ("value", "accepted_path", _poke("accepted_path", (1, 2), 1)),
        ("value", "accepted_path", _poke("accepted_path", (0, 1), 11)),
        ("value", "seq_lens", _poke("seq_lens", 1, -1)),
        ("value", r"caches\[1\]", _set(caches=lambda a: [a["caches"][0], a["caches"][1].to("meta")])),
    ]),
    "kv_rollback": (rollback_args, call_rollback, ("cpu", "reference", "triton"), [
        ("dtype", "num_tokens", _set(num_tokens=lambda a: a["num_tokens"].float())),
        ("shape", "num_tokens", _set(num_tokens=torch.tensor([1, 2, 3]))),
        ("value", "num_tokens", _poke("num_tokens", 0, 0)),
        ("value", "num_tokens", _poke("num_tokens", 1, 4)),
        ("value", "max_tokens", _set(max_tokens=-1)),
    ]),
    "process_logits": (process_args, call_process, ("cpu", "reference", "triton"), [
        ("dtype", "logits", _set(logits=lambda a: a["logits"].double())),
        ("shape", "logits", _set(logits=lambda a: a["logits"][0, 0])),
    ] + SAMPLING_BAD),
    "rejection_sample_logits": (logits_chain_args, call_logits_chain, ("cpu", "reference", "triton"), [
        ("dtype", "target_logits", _set(target_logits=lambda a: a["target_logits"].double())),
        ("dtype", "draft_token_ids", _set(draft_token_ids=lambda a: a["draft_token_ids"].float())),
        ("dtype", "draft_probs", _set(draft_probs=lambda a: a["draft_probs"].long())),
        ("shape", "target_logits", _set(target_logits=lambda a: a["target_logits"][0])),
        ("shape", "draft_probs", _set(draft_probs=lambda a: a["draft_probs"][..., :7])),
        ("value", "draft_token_ids", _poke("draft_token_ids", (0, 1), 8)),
        ("value", "draft_token_ids", _poke("draft_token_ids", (1, 0), -1)),
        ("value", "num_draft_tokens", _poke("num_draft_tokens", 1, 3)),
        # [B, K, V] (no bonus rows) needs bonus_token_ids
        ("shape", "target_logits", _set(target_logits=lambda a: a["target_logits"][:, :2])),
    ] + SAMPLING_BAD + ENGINE_BAD),
    "rejection_sample_logits_packed": (logits_packed_args, call_logits_packed, ("cpu", "reference", "triton"), [
        ("dtype", "target_logits", _set(target_logits=lambda a: a["target_logits"].double())),
        ("dtype", "cu_num_draft_tokens", _set(cu_num_draft_tokens=lambda a: a["cu_num_draft_tokens"].float())),
        ("shape", "draft_token_ids", _set(draft_token_ids=torch.tensor([[1, 2, 3]]))),
        ("value", "cu_num_draft_tokens", _poke("cu_num_draft_tokens", 0, 1)),
        ("value", "draft_token_ids", _poke("draft_token_ids", 2, 8)),
        ("value", "draft_token_ids", _poke("draft_token_ids", 0, -1)),
        # [T, V] (no bonus rows) needs bonus_token_ids
        ("shape", "target_logits", _set(target_logits=lambda a: a["target_logits"][:3])),
    ] + SAMPLING_BAD + ENGINE_BAD),
    "tree_rejection_sample_logits": (logits_tree_args, call_logits_tree, ("cpu", "reference", "triton"), [
        ("dtype", "target_logits", _set(target_logits=lambda a: a["target_logits"].double())),
        ("dtype", "parents", _set(parents=lambda a: a["parents"].float())),
        ("shape", "parents", _set(parents=lambda a: a["parents"][:, :3])),
        ("value", "parents", _poke("parents", (0, 2), 2)),
        ("value", "tree_token_ids", _poke("tree_token_ids", (0, 1), 8)),
        ("value", "num_nodes", _poke("num_nodes", 1, 5)),
    ] + SAMPLING_BAD),
    "topk_grid_to_parents": (grid_args, call_grid, None, [
        ("dtype", "selected", _set(selected=lambda a: a["selected"].float())),
        ("dtype", "beam_indices", _set(beam_indices=lambda a: a["beam_indices"].float())),
        ("shape", "beam_indices", _set(beam_indices=torch.tensor([[[0, 1, 2]]]))),
        ("shape", "selected", _set(selected=torch.tensor([0, 1, 3]))),
        ("value", "selected", _poke("selected", (0, 2), 6)),
        ("value", "selected", _set(selected=torch.tensor([[0, 4, 5]]), beam_indices=torch.tensor([[[2, 3]]]))),
        ("value", "topk", _set(topk=0)),
    ]),
}


def _cases():
    for op, (_, _, backends, bad) in OPS.items():
        for backend in (backends or (None,)):
            if backend not in CPU_BACKENDS and backend is not None:
                continue
            for kind, name, mutate in bad:
                yield pytest.param(op, backend, kind, name, mutate, id=f"{op}-{backend}-{kind}-{name}")


# The ops that write into their inputs (the caches and seq_lens): every case runs their valid call, whose writes
# the bad call then sees.
IN_PLACE = ("kv_commit", "kv_rollback")


def _same_inputs(a, b):
    """Whether two valid-input dicts from one op's `make` hold the same values (tensors: same dtype, shape and
    elements; lists element by element)."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same_inputs(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same_inputs(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and a.device == b.device
                and torch.equal(a, b))
    return type(a) is type(b) and a == b


@pytest.fixture(scope="module")
def valid_inputs_passed():
    """(op, backend) -> the valid inputs seen to pass in this module (a copy of `make()`'s)."""
    return {}


@pytest.mark.parametrize("op,backend,kind,name,mutate", list(_cases()))
def test_bad_input_raises_spec_dec_argument_error_naming_it(op, backend, kind, name, mutate, valid_inputs_passed):
    make, call, _, _ = OPS[op]
    args = make()
    # the valid inputs pass: `make` builds the same inputs for every case of an op, so the call runs once per op
    # and backend in a process (a Triton launch is most of a case's time), the later cases checking that their
    # inputs are those; every case of an op that writes into its inputs calls it
    passed = valid_inputs_passed.get((op, backend))
    if op in IN_PLACE or passed is None:
        copy = {k: (v.clone() if isinstance(v, torch.Tensor) else [t.clone() for t in v] if isinstance(v, list) else v)
                for k, v in args.items()}
        call(args, backend)
        valid_inputs_passed[(op, backend)] = copy
    else:
        assert _same_inputs(args, passed), "make() built other inputs than the ones seen to pass"
    mutate(args)
    with pytest.raises(SpecDecArgumentError, match=name) as info:
        call(args, backend)
    assert type(info.value) is SpecDecArgumentError  # one class for every kind, whichever layer raised it


def test_every_public_op_is_covered():
    public = {name for name in specdec_ops.__all__ if callable(getattr(specdec_ops, name))
              and name[0].islower() and name not in ("register_hf_attention",)}
    assert public - set(OPS) <= {"paths_to_parents", "parents_to_paths"}, public - set(OPS)


@pytest.mark.parametrize("paths,match", [
    ([(0,), (0,)], "twice"), ([(0,), (1, 0)], "no parent path"), ([(0,), (-1,)], "negative"), ([()], "empty"),
])
def test_paths_to_parents_errors(paths, match):
    with pytest.raises(SpecDecArgumentError, match=match) as info:
        specdec_ops.paths_to_parents(paths)
    assert type(info.value) is SpecDecArgumentError


# ---------------------------------------------------------------------------------------------- direct op calls


@pytest.mark.parametrize("call,error,match", [
    (lambda a: torch.ops.specdec.rejection_sample.default(
        a["target_probs"], a["draft_token_ids"].float(), a["num_draft_tokens"], None, a["seeds"], a["offsets"],
        None), TypeError, "draft_token_ids"),
    (lambda a: torch.ops.specdec.rejection_sample.default(
        a["target_probs"], a["draft_token_ids"][:, :1], a["num_draft_tokens"], None, a["seeds"], a["offsets"],
        None), ValueError, "draft_token_ids"),
    (lambda a: torch.ops.specdec.rejection_sample.default(
        a["target_probs"], a["draft_token_ids"] + 8, a["num_draft_tokens"], None, a["seeds"], a["offsets"],
        None), ValueError, "draft_token_ids"),
    (lambda a: torch.ops.specdec.rejection_sample.default(
        a["target_probs"], a["draft_token_ids"], a["num_draft_tokens"], None, a["seeds"].float(), a["offsets"],
        None), TypeError, "seeds"),
    (lambda a: torch.ops.specdec.rejection_sample.default(
        a["target_probs"], a["draft_token_ids"], a["num_draft_tokens"], None, a["seeds"], a["offsets"], None,
        a["draft_token_ids"][:, 0] + 8), ValueError, "bonus_token_ids"),
    (lambda a: torch.ops.specdec.rejection_sample.default(
        a["target_probs"], a["draft_token_ids"], a["num_draft_tokens"], None, a["seeds"], a["offsets"], None,
        None, False, torch.ones(2, dtype=torch.float64)), TypeError, "synthetic_acceptance_rates"),
])
def test_direct_chain_op_calls_raise_torch_classes(call, error, match):
    with pytest.raises(error, match=match) as info:
        call(chain_args())
    assert not isinstance(info.value, SpecDecArgumentError)


def test_direct_tree_and_kv_op_calls_raise_torch_classes():
    t = tree_args()
    with pytest.raises(TypeError, match="parents"):
        torch.ops.specdec.tree_rejection_sample.default(t["target_probs"], t["tree_token_ids"], t["parents"].float(),
                                                        None, None, t["seeds"], t["offsets"], None)
    bad = t["parents"].clone()
    bad[0, 2] = 3
    with pytest.raises(ValueError, match=r"parents\[0, 2\]"):
        torch.ops.specdec.tree_rejection_sample.default(t["target_probs"], t["tree_token_ids"], bad, None, None,
                                                        t["seeds"], t["offsets"], None)
    with pytest.raises(ValueError, match="parents"):
        torch.ops.specdec.build_tree.default(t["parents"][0], None)
    k = kv_args()
    with pytest.raises(TypeError, match="accepted_path"):
        torch.ops.specdec.kv_commit.default(k["caches"], k["seq_lens"], k["accepted_path"].float(), None)
    with pytest.raises(ValueError, match="accepted_path"):
        torch.ops.specdec.kv_commit.default(k["caches"], k["seq_lens"], k["accepted_path"][:1], None)
