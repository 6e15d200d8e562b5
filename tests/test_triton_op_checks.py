"""The Triton ops (specdec::<op>_triton) check their arguments as their C++ twins do (DESIGN.md §4).

A direct call of a registered Triton impl, and a wrapper compiled by torch.compile (whose Python checks read no
values while tracing), reach the kernel only with arguments the C++ op would take: shapes, ranks, dtypes and
devices on every device, index values on CPU tensors. Each case runs the Triton op and its twin
(torch.ops.specdec.<op>: C++, or the CPU composite for the attention ops) on the same bad arguments: both raise,
the Triton op SpecDecArgumentError naming the argument. Tensors are tiny: the bad cases raise before any launch.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import importlib.util  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

import specdec_ops  # noqa: E402
from specdec_ops import SpecDecArgumentError  # noqa: E402
from specdec_ops._backend import gpu_value_rules, triton_interpreting  # noqa: E402

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
needs_interpreter = pytest.mark.skipif(not triton_interpreting(), reason="needs TRITON_INTERPRET=1 (CPU tensors)")

OPS = torch.ops.specdec


# ---------------------------------------------------------------------------------------------- valid arguments
# Each factory returns the op's arguments in schema order (a dict: the cases replace entries by name).


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def chain_args():
    return dict(target_probs=torch.softmax(torch.randn(2, 3, 8, generator=_gen(0)), -1),
                draft_token_ids=torch.tensor([[1, 2], [3, 4]]), num_draft_tokens=torch.tensor([2, 1]),
                draft_probs=None, seeds=torch.tensor([1, 2]), offsets=torch.tensor([0, 5]), greedy=None,
                bonus_token_ids=None, reject_invalid_drafts=False, synthetic_acceptance_rates=None)


def packed_args():
    return dict(target_probs=torch.softmax(torch.randn(5, 8, generator=_gen(1)), -1),
                cu_num_draft_tokens=torch.tensor([0, 2, 3]), draft_token_ids=torch.tensor([1, 2, 3]),
                draft_probs=None, seeds=torch.tensor([1, 2]), offsets=torch.tensor([0, 5]), greedy=None,
                max_num_draft_tokens=2, bonus_token_ids=None, reject_invalid_drafts=False,
                synthetic_acceptance_rates=None)


def tree_args():
    return dict(target_probs=torch.softmax(torch.randn(2, 4, 8, generator=_gen(2)), -1),
                tree_token_ids=torch.tensor([[0, 1, 2, 3], [0, 4, 5, 6]]),
                parents=torch.tensor([[-1, 0, 0, 1], [-1, 0, 1, 2]]), num_nodes=torch.tensor([4, 3]),
                draft_probs=None, seeds=torch.tensor([1, 2]), offsets=torch.tensor([0, 5]), greedy=None)


def process_args():
    return dict(logits=torch.randn(3, 5, generator=_gen(3)), temperature=torch.tensor([1.0, 0.5, 0.0]),
                top_k=None, top_p=None, min_p=None)


def _params(batch):
    return dict(temperature=torch.ones(batch), top_k=torch.full((batch,), 3), top_p=torch.full((batch,), 0.9),
                min_p=None)


def logits_args():
    return dict(target_logits=torch.randn(2, 3, 8, generator=_gen(4)), draft_token_ids=torch.tensor([[1, 2], [3, 4]]),
                num_draft_tokens=torch.tensor([2, 1]), draft_probs=None, **_params(2), seeds=torch.tensor([1, 2]),
                offsets=torch.tensor([0, 5]), return_logprobs=False, bonus_token_ids=None,
                synthetic_acceptance_rates=None)


def logits_packed_args():
    return dict(target_logits=torch.randn(5, 8, generator=_gen(5)), cu_num_draft_tokens=torch.tensor([0, 2, 3]),
                draft_token_ids=torch.tensor([1, 2, 3]), draft_probs=None, **_params(2), seeds=torch.tensor([1, 2]),
                offsets=torch.tensor([0, 5]), return_logprobs=False, max_num_draft_tokens=2, bonus_token_ids=None,
                synthetic_acceptance_rates=None)


def logits_tree_args():
    t = tree_args()
    return dict(target_logits=torch.randn(2, 4, 8, generator=_gen(6)), tree_token_ids=t["tree_token_ids"],
                parents=t["parents"], num_nodes=t["num_nodes"], draft_probs=None, **_params(2), seeds=t["seeds"],
                offsets=t["offsets"], return_logprobs=False)


def kv_args(paged=False):
    g = _gen(7)
    if paged:  # 3 blocks of 4 slots, 2 per request
        caches = [torch.randn(3, 4, 2, 4, generator=g) for _ in range(2)]
        table = torch.tensor([[0, 1], [2, -1]])
    else:
        caches = [torch.randn(2, 8, 2, 4, generator=g) for _ in range(2)]
        table = None
    return dict(caches=caches, seq_lens=torch.tensor([2, 1], dtype=torch.int32),
                accepted_path=torch.tensor([[0, 2, 3, -1], [0, 1, -1, -1]]), block_table=table)


def attention_args(paged=False):
    from specdec_ops import build_tree

    g = _gen(8)
    mask = build_tree(torch.tensor([[-1, 0, 0], [-1, 0, 1]]), backend="reference").mask
    if paged:  # 4 blocks of 4 slots, 2 per request
        k, v = (torch.randn(4, 4, 1, 16, generator=g) for _ in range(2))
        table = torch.tensor([[0, 1], [2, 3]])
    else:
        k, v = (torch.randn(2, 8, 1, 16, generator=g) for _ in range(2))
        table = None
    return dict(q=torch.randn(2, 3, 2, 16, generator=g), k_cache=k, v_cache=v, prefix_lens=torch.tensor([4, 0]),
                mask=mask, block_table=table, sm_scale=0.25)


def merge_args():
    g = _gen(9)
    return dict(out_a=torch.randn(2, 3, 8, generator=g), lse_a=torch.randn(2, 3, generator=g),
                out_b=torch.randn(2, 3, 8, generator=g), lse_b=torch.randn(2, 3, generator=g))


FACTORIES = {
    "rejection_sample": chain_args, "rejection_sample_packed": packed_args, "tree_rejection_sample": tree_args,
    "process_logits": process_args, "rejection_sample_logits": logits_args,
    "rejection_sample_logits_packed": logits_packed_args, "tree_rejection_sample_logits": logits_tree_args,
    "kv_commit": kv_args, "kv_commit_paged": lambda: kv_args(paged=True), "tree_attention": attention_args,
    "tree_attention_paged": lambda: attention_args(paged=True), "merge_attention_states": merge_args,
}


# ---------------------------------------------------------------------------------------------- bad arguments


def _set(**changes):
    """A case's change: entry name -> new value, or a function of the valid arguments giving it."""
    def apply(a):
        for k, v in changes.items():
            a[k] = v(a) if callable(v) else v
        return a
    return apply


def _poke(name, index, value):
    def apply(a):
        a[name] = a[name].clone()
        a[name][index] = value
        return a
    return apply


# (op, kind, change, message regex: the argument named). kind "shape" covers shapes, ranks and dtypes (checked on
# every device), "value" index values (checked on CPU tensors).
CASES = [
    ("rejection_sample", "shape", _set(draft_token_ids=lambda a: a["draft_token_ids"][:, :1]), "draft_token_ids"),
    ("rejection_sample", "shape", _set(num_draft_tokens=torch.tensor([2, 1, 0])), "num_draft_tokens"),
    ("rejection_sample", "shape", _set(seeds=torch.tensor([1])), "seeds"),
    ("rejection_sample", "shape", _set(seeds=torch.tensor([1, 2], dtype=torch.int32)), "seeds"),
    ("rejection_sample", "shape", _set(draft_probs=lambda a: a["target_probs"][:, :2].half()), "draft_probs"),
    ("rejection_sample", "shape", _set(greedy=torch.tensor([1, 0])), "greedy"),
    ("rejection_sample", "shape", _set(bonus_token_ids=torch.tensor([[1, 2]])), "bonus_token_ids"),
    ("rejection_sample", "shape", _set(synthetic_acceptance_rates=torch.tensor([0.5])), "synthetic_acceptance_rates"),
    ("rejection_sample", "value", _set(num_draft_tokens=torch.tensor([3, 1])), r"num_draft_tokens\[0\] = 3"),
    ("rejection_sample", "value", _set(num_draft_tokens=torch.tensor([2, -1])), r"num_draft_tokens\[1\] = -1"),
    ("rejection_sample", "value", _poke("draft_token_ids", (0, 1), 8), "draft_token_ids"),
    ("rejection_sample", "value", _poke("draft_token_ids", (1, 0), -1), "draft_token_ids"),
    ("rejection_sample", "value", _set(bonus_token_ids=torch.tensor([0, 8])), "bonus_token_ids"),
    ("rejection_sample", "value", _set(synthetic_acceptance_rates=torch.tensor([0.5, 2.0])),
     "synthetic_acceptance_rates"),
    ("rejection_sample_packed", "shape", _set(target_probs=lambda a: a["target_probs"][:4]), "target_probs"),
    ("rejection_sample_packed", "shape", _set(cu_num_draft_tokens=torch.tensor([[0, 2, 3]])), "cu_num_draft_tokens"),
    ("rejection_sample_packed", "shape", _set(draft_token_ids=lambda a: a["draft_token_ids"].float()),
     "draft_token_ids"),
    ("rejection_sample_packed", "shape", _set(max_num_draft_tokens=-1), "max_num_draft_tokens"),
    ("rejection_sample_packed", "value", _set(cu_num_draft_tokens=torch.tensor([0, 2, 1])), "non-decreasing"),
    ("rejection_sample_packed", "value", _set(cu_num_draft_tokens=torch.tensor([1, 2, 3])),
     r"cu_num_draft_tokens\[0\]"),
    ("rejection_sample_packed", "value", _set(max_num_draft_tokens=1), "more than max_num_draft_tokens = 1"),
    ("rejection_sample_packed", "value", _poke("draft_token_ids", 2, 99), "draft_token_ids"),
    ("rejection_sample_packed", "value", _set(bonus_token_ids=torch.tensor([-1, 0])), "bonus_token_ids"),
    ("tree_rejection_sample", "shape", _set(parents=lambda a: a["parents"][:, :3]), "parents"),
    ("tree_rejection_sample", "shape", _set(parents=lambda a: a["parents"].float()), "parents"),
    ("tree_rejection_sample", "shape", _set(num_nodes=torch.tensor([4])), "num_nodes"),
    ("tree_rejection_sample", "shape", _set(offsets=torch.tensor([0.0, 5.0])), "offsets"),
    ("tree_rejection_sample", "value", _poke("parents", (0, 1), 5), r"parents\[0, 1\] = 5"),
    ("tree_rejection_sample", "value", _poke("parents", (1, 0), 0), r"parents\[1, 0\]"),
    ("tree_rejection_sample", "value", _set(num_nodes=torch.tensor([4, 0])), r"num_nodes\[1\] = 0"),
    ("tree_rejection_sample", "value", _poke("tree_token_ids", (1, 2), 8), r"tree_token_ids\[1, 2\] = 8"),
    # the segfault of the audit: temperature of shape [0] for 3 rows
    ("process_logits", "shape", _set(temperature=torch.zeros(0)), "temperature"),
    ("process_logits", "shape", _set(top_k=torch.tensor([2])), "top_k"),
    ("process_logits", "shape", _set(logits=torch.zeros(3, 5, dtype=torch.int64)), "logits"),
    ("process_logits", "shape", _set(logits=torch.zeros(5)), "logits"),
    ("process_logits", "shape", _set(temperature=torch.ones(3, dtype=torch.float64)), "temperature"),
    ("process_logits", "shape", _set(top_k=torch.ones(3, dtype=torch.int32)), "top_k"),
    ("process_logits", "value", _set(temperature=torch.tensor([1.0, -1.0, 0.0])), r"temperature\[1\]"),
    ("process_logits", "value", _set(temperature=torch.tensor([1.0, float("nan"), 0.0])), r"temperature\[1\]"),
    ("process_logits", "value", _set(top_k=torch.tensor([1, 2, -1])), r"top_k\[2\]"),
    ("process_logits", "value", _set(top_p=torch.tensor([0.5, 0.0, 1.0])), r"top_p\[1\]"),
    ("process_logits", "value", _set(min_p=torch.tensor([1.0, 0.0, 0.0])), r"min_p\[0\]"),
    ("rejection_sample_logits", "shape", _set(num_draft_tokens=torch.tensor([2, 1, 0])), "num_draft_tokens"),
    ("rejection_sample_logits", "shape", _set(temperature=torch.ones(1)), "temperature"),
    ("rejection_sample_logits", "shape", _set(draft_probs=lambda a: torch.ones(2, 2, 8, dtype=torch.float16)),
     "draft_probs"),
    ("rejection_sample_logits", "shape", _set(seeds=torch.tensor([1, 2], dtype=torch.int32)), "seeds"),
    ("rejection_sample_logits", "shape", _set(bonus_token_ids=torch.tensor([1, 2, 3])), "bonus_token_ids"),
    ("rejection_sample_logits", "value", _set(num_draft_tokens=torch.tensor([5, 1])), r"num_draft_tokens\[0\] = 5"),
    ("rejection_sample_logits", "value", _set(top_p=torch.tensor([0.5, 2.0])), r"top_p\[1\]"),
    ("rejection_sample_logits", "value", _set(bonus_token_ids=torch.tensor([0, 8])), "bonus_token_ids"),
    ("rejection_sample_logits", "value", _set(synthetic_acceptance_rates=torch.tensor([0.5, -0.5])),
     "synthetic_acceptance_rates"),
    ("rejection_sample_logits_packed", "shape", _set(target_logits=lambda a: a["target_logits"][:4]),
     "target_logits"),
    ("rejection_sample_logits_packed", "shape", _set(cu_num_draft_tokens=torch.tensor([0, 2, 3], dtype=torch.float32)),
     "cu_num_draft_tokens"),
    ("rejection_sample_logits_packed", "value", _set(cu_num_draft_tokens=torch.tensor([0, 2, 1])), "non-decreasing"),
    ("rejection_sample_logits_packed", "value", _set(max_num_draft_tokens=1), "more than max_num_draft_tokens = 1"),
    ("rejection_sample_logits_packed", "value", _set(min_p=torch.tensor([0.5, 1.5])), r"min_p\[1\]"),
    ("tree_rejection_sample_logits", "shape", _set(tree_token_ids=lambda a: a["tree_token_ids"][:1]),
     "tree_token_ids"),
    ("tree_rejection_sample_logits", "shape", _set(top_k=torch.ones(2)), "top_k"),
    ("tree_rejection_sample_logits", "value", _set(parents=torch.tensor([[-1, 5, 0, 1], [-1, 0, 1, 2]])),
     r"parents\[0, 1\] = 5"),
    ("tree_rejection_sample_logits", "value", _set(num_nodes=torch.tensor([5, 3])), r"num_nodes\[0\] = 5"),
    ("tree_rejection_sample_logits", "value", _poke("tree_token_ids", (0, 3), -3), r"tree_token_ids\[0, 3\]"),
    ("tree_rejection_sample_logits", "value", _set(temperature=torch.tensor([1.0, -2.0])), r"temperature\[1\]"),
    ("kv_commit", "shape", _set(accepted_path=lambda a: a["accepted_path"][:1]), "accepted_path"),
    ("kv_commit", "shape", _set(seq_lens=torch.tensor([2, 1])), "seq_lens"),
    ("kv_commit", "shape", _set(caches=lambda a: [a["caches"][0], a["caches"][1][:, :4]]), r"caches\[1\]"),
    ("kv_commit", "shape", _set(caches=lambda a: [a["caches"][0], a["caches"][1].double()]), r"caches\[1\]"),
    ("kv_commit", "value", _poke("accepted_path", (0, 2), 2), r"accepted_path\[0, 2\] = 2"),
    ("kv_commit", "value", _poke("accepted_path", (1, 0), 1), r"accepted_path\[1, 0\] = 1"),
    ("kv_commit", "value", _poke("accepted_path", (0, 3), 6), r"accepted_path\[0, 3\] = 6 .*outside the cache"),
    ("kv_commit", "value", _poke("seq_lens", 1, -1), r"seq_lens\[1\] = -1"),
    ("kv_commit_paged", "shape", _set(block_table=lambda a: a["block_table"].float()), "block_table"),
    ("kv_commit_paged", "value", _poke("block_table", (0, 0), 3), r"accepted_path\[0, \d\] = \d .*blocks"),
    ("tree_attention", "shape", _set(mask=lambda a: a["mask"][:, :2]), "mask"),
    ("tree_attention", "shape", _set(k_cache=lambda a: a["k_cache"].half()), "k_cache"),
    ("tree_attention", "shape", _set(prefix_lens=torch.tensor([4.0, 0.0])), "prefix_lens"),
    ("tree_attention", "value", _set(prefix_lens=torch.tensor([6, 0])), r"prefix_lens\[0\] = 6"),
    ("tree_attention", "value", _set(prefix_lens=torch.tensor([4, -1])), r"prefix_lens\[1\] = -1"),
    ("tree_attention_paged", "value", _poke("block_table", (1, 0), 4), r"block_table\[1, 0\] = 4"),
    ("merge_attention_states", "shape", _set(lse_b=lambda a: a["lse_b"][:1]), "lse_b"),
    ("merge_attention_states", "shape", _set(out_b=lambda a: a["out_b"].half()), "out_b"),
]


def _op_name(case_op):
    return case_op.replace("_paged", "")


def _case_id(case):
    op, kind, _, match = case
    return f"{op}-{kind}-{match.split(' ')[0]}"


@pytest.mark.parametrize("op,kind,change,match", CASES, ids=[_case_id(c) for c in CASES])
def test_triton_op_raises_as_its_twin(op, kind, change, match):
    name = _op_name(op)
    with pytest.raises(SpecDecArgumentError, match=match):
        getattr(OPS, name + "_triton").default(*change(FACTORIES[op]()).values())
    # parity: the twin (C++ op, or the CPU composite of the attention ops) refuses them too
    with pytest.raises((ValueError, TypeError), match=match.split(" ")[0]):
        getattr(OPS, name).default(*change(FACTORIES[op]()).values())


def test_every_triton_op_is_covered():
    covered = {_op_name(op) for op, *_ in CASES}
    registered = {name[len("specdec::"): -len("_triton")] for name in torch._C._dispatch_get_all_op_names()
                  if name.startswith("specdec::") and name.endswith("_triton")}
    assert len(registered) >= 10, registered
    assert registered <= covered, registered - covered
    assert {_op_name(op) for op, kind, *_ in CASES if kind == "value"} >= registered - {"merge_attention_states"}


@needs_interpreter
@pytest.mark.parametrize("op", ["rejection_sample", "rejection_sample_packed", "tree_rejection_sample",
                                "process_logits", "kv_commit", "kv_commit_paged", "tree_attention",
                                "tree_attention_paged", "merge_attention_states"])
def test_valid_arguments_pass(op):
    """The checks take what the wrappers pass (the ops' outputs equal the twins')."""
    def outputs(x):
        return () if x is None else (x,) if isinstance(x, torch.Tensor) else tuple(x)

    got = outputs(getattr(OPS, _op_name(op) + "_triton").default(*FACTORIES[op]().values()))
    want = outputs(getattr(OPS, _op_name(op)).default(*FACTORIES[op]().values()))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, equal_nan=True)


# ---------------------------------------------------------------------------------------------- documented passes


@needs_interpreter
def test_invalid_drafts_pass_where_the_cpu_op_takes_them():
    """reject_invalid_drafts and synthetic rates: an id outside the vocabulary is rejected, no error, on both."""
    for keywords in (dict(reject_invalid_drafts=True), dict(synthetic_acceptance_rates=torch.tensor([0.5, 0.5]))):
        outs = []
        for op in (OPS.rejection_sample_triton, OPS.rejection_sample):
            a = _poke("draft_token_ids", (0, 0), -1)(chain_args())
            a.update(keywords)
            outs.append(op.default(*a.values()))
        assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
        assert int(outs[0][1][0]) == 0  # rejected at its position


@needs_interpreter
def test_logits_ops_leave_the_draft_ids_to_the_wrappers():
    """The logits ops do not check draft ids (no reject_invalid_drafts argument: the kernels reject such an id),
    the C++ op as the Triton op; the wrappers do, on every backend."""
    a = _poke("draft_token_ids", (0, 0), 99)(logits_args())
    assert torch.equal(OPS.rejection_sample_logits_triton.default(*a.values())[0],
                       OPS.rejection_sample_logits.default(*a.values())[0])
    for backend in ("cpu", "triton", "reference"):
        with pytest.raises(SpecDecArgumentError, match="draft_token_ids"):
            specdec_ops.rejection_sample_logits(a["target_logits"], a["draft_token_ids"], a["num_draft_tokens"],
                                                seeds=a["seeds"], backend=backend)
        specdec_ops.rejection_sample_logits(a["target_logits"], a["draft_token_ids"], a["num_draft_tokens"],
                                            seeds=a["seeds"], reject_invalid_drafts=True, backend=backend)


@needs_interpreter
def test_gpu_value_rules_let_the_interpreter_show_the_gpu_behaviour():
    """Inside gpu_value_rules() the Triton impls skip their CPU value checks (tests of the GPU's safe behaviour);
    shapes are still checked."""
    a = tree_args()
    a["parents"] = torch.tensor([[-1, 5, 0, 1], [-1, 0, 1, 2]])
    with gpu_value_rules():
        token_ids, _, _ = OPS.tree_rejection_sample_triton.default(*a.values())
        assert bool(((token_ids >= -1) & (token_ids < 8)).all())
        with pytest.raises(SpecDecArgumentError, match="parents"):
            OPS.tree_rejection_sample_triton.default(*_set(parents=lambda b: b["parents"][:, :3])(a).values())
    with pytest.raises(SpecDecArgumentError, match="parents"):
        OPS.tree_rejection_sample_triton.default(*a.values())


# ---------------------------------------------------------------------------------------------- compiled wrappers


def _compiled_chain(a):
    return specdec_ops.rejection_sample(a["target_probs"], a["draft_token_ids"], a["num_draft_tokens"],
                                        seeds=a["seeds"], offsets=a["offsets"], backend="triton",
                                        bonus_token_ids=a["bonus_token_ids"]).token_ids


def _compiled_packed(a):
    return specdec_ops.rejection_sample_packed(a["target_probs"], a["cu_num_draft_tokens"], a["draft_token_ids"],
                                               seeds=a["seeds"], max_num_draft_tokens=a["max_num_draft_tokens"],
                                               backend="triton").token_ids


def _compiled_tree(a):
    return specdec_ops.tree_rejection_sample(a["target_probs"], a["tree_token_ids"], a["parents"], a["num_nodes"],
                                             seeds=a["seeds"], backend="triton").token_ids


def _compiled_process(a):
    return specdec_ops.process_logits(a["logits"], a["temperature"], backend="triton")


def _compiled_logits(a):
    return specdec_ops.rejection_sample_logits(a["target_logits"], a["draft_token_ids"], a["num_draft_tokens"],
                                               top_p=a["top_p"], seeds=a["seeds"], backend="triton").token_ids


def _compiled_logits_packed(a):
    return specdec_ops.rejection_sample_logits_packed(a["target_logits"], a["cu_num_draft_tokens"],
                                                      a["draft_token_ids"], seeds=a["seeds"],
                                                      max_num_draft_tokens=a["max_num_draft_tokens"],
                                                      backend="triton").token_ids


def _compiled_logits_tree(a):
    return specdec_ops.tree_rejection_sample_logits(a["target_logits"], a["tree_token_ids"], a["parents"],
                                                    a["num_nodes"], seeds=a["seeds"], backend="triton").token_ids


def _compiled_kv(a):
    specdec_ops.kv_commit(a["caches"], a["seq_lens"], a["accepted_path"], block_table=a["block_table"],
                          backend="triton")
    return a["seq_lens"]


def _compiled_attention(a):
    return specdec_ops.tree_attention(a["q"], a["k_cache"], a["v_cache"], a["prefix_lens"], a["mask"],
                                      backend="triton")


COMPILED = [
    ("rejection_sample", _compiled_chain, _set(num_draft_tokens=torch.tensor([3, 1])), "num_draft_tokens"),
    ("rejection_sample", _compiled_chain, _poke("draft_token_ids", (0, 1), 8), "draft_token_ids"),
    ("rejection_sample", _compiled_chain, _set(bonus_token_ids=torch.tensor([0, 9])), "bonus_token_ids"),
    ("rejection_sample_packed", _compiled_packed, _set(cu_num_draft_tokens=torch.tensor([0, 2, 1])),
     "non-decreasing"),
    ("tree_rejection_sample", _compiled_tree, _poke("parents", (0, 2), 2), r"parents\[0, 2\]"),
    ("process_logits", _compiled_process, _set(temperature=torch.tensor([1.0, -1.0, 0.0])), r"temperature\[1\]"),
    ("rejection_sample_logits", _compiled_logits, _set(num_draft_tokens=torch.tensor([3, 1])), "num_draft_tokens"),
    ("rejection_sample_logits", _compiled_logits, _set(top_p=torch.tensor([0.5, 0.0])), r"top_p\[1\]"),
    ("rejection_sample_logits_packed", _compiled_logits_packed, _set(max_num_draft_tokens=1),
     "more than max_num_draft_tokens = 1"),
    ("tree_rejection_sample_logits", _compiled_logits_tree, _set(num_nodes=torch.tensor([4, 0])),
     r"num_nodes\[1\] = 0"),
    ("kv_commit", _compiled_kv, _poke("accepted_path", (0, 2), 2), r"accepted_path\[0, 2\] = 2"),
    ("tree_attention", _compiled_attention, _set(prefix_lens=torch.tensor([6, 0])), r"prefix_lens\[0\] = 6"),
]


@needs_interpreter
@pytest.mark.parametrize("op,fn,change,match", COMPILED, ids=[f"{c[0]}-{c[3].split(' ')[0]}" for c in COMPILED])
def test_compiled_wrapper_on_the_triton_backend_checks_values(op, fn, change, match):
    """Under torch.compile the wrappers read no values (tracing); the Triton op, run with the real tensors,
    refuses the bad value, as the C++ op does on backend='cpu'."""
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=False, backend="aot_eager")
    with pytest.raises(ValueError, match=match):
        compiled(change(FACTORIES[op]()))
