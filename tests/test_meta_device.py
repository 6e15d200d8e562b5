"""The public API on meta tensors: each op answers with the shapes and dtypes its CPU kernel returns.

Meta tensors carry shapes and no data (shape inference, models built on ``torch.device("meta")``). With
``backend=None`` a wrapper resolves them to the op's meta kernel (torch.ops.specdec.*), never to the
reference backend, which would read data that is not there. Inputs on two devices still raise (tests of
each op), and ``kv_commit`` on meta caches changes nothing.
"""

import pytest
import torch

import specdec_ops as so

B, K, V, N = 2, 3, 16, 4


def chain_inputs():
    g = torch.Generator().manual_seed(0)
    return [torch.softmax(torch.randn(B, K + 1, V, generator=g), -1), torch.randint(0, V, (B, K), generator=g),
            torch.tensor([3, 1])]


def tree_inputs():
    g = torch.Generator().manual_seed(1)
    return [torch.softmax(torch.randn(B, N, V, generator=g), -1), torch.randint(0, V, (B, N), generator=g),
            torch.tensor([[-1, 0, 0, 1]] * B)]


def attention_inputs():
    g = torch.Generator().manual_seed(2)
    mask = so.build_tree(torch.tensor([[-1, 0, 0, 1]] * B)).mask
    return [torch.randn(B, N, 4, 64, generator=g), torch.randn(B, 12, 2, 64, generator=g),
            torch.randn(B, 12, 2, 64, generator=g), torch.tensor([5, 8]), mask]


CASES = {
    "rejection_sample": (chain_inputs, lambda a: so.rejection_sample(*a)),
    "rejection_sample_draft_probs": (lambda: chain_inputs() + [torch.softmax(torch.randn(B, K, V), -1)],
                                     lambda a: so.rejection_sample(*a)),
    "rejection_sample_packed": (lambda: [torch.softmax(torch.randn(4 + B, V), -1), torch.tensor([0, 3, 4]),
                                         torch.tensor([1, 2, 3, 4])],
                                lambda a: so.rejection_sample_packed(*a, max_num_draft_tokens=3)),
    "tree_rejection_sample": (tree_inputs, lambda a: so.tree_rejection_sample(*a)),
    "build_tree": (lambda: [torch.tensor([[-1, 0, 0, 1]] * B)], lambda a: so.build_tree(*a)),
    "tree_attention": (attention_inputs, lambda a: so.tree_attention(*a, return_lse=True)),
    "process_logits": (lambda: [torch.randn(B, V), torch.full((B,), 0.7)],
                       lambda a: so.process_logits(a[0], temperature=a[1])),
    "rejection_sample_logits": (lambda: [torch.randn(B, K + 1, V)] + chain_inputs()[1:] + [torch.full((B,), 0.7)],
                                lambda a: so.rejection_sample_logits(*a[:3], temperature=a[3],
                                                                     return_logprobs=True)),
    "tree_rejection_sample_logits": (lambda: [torch.randn(B, N, V)] + tree_inputs()[1:],
                                     lambda a: so.tree_rejection_sample_logits(*a, return_logprobs=True)),
}


def leaves(out):
    items = out if isinstance(out, tuple) else (out,)
    return [(tuple(t.shape), t.dtype) if t is not None else None for t in items]


@pytest.mark.parametrize("name", sorted(CASES))
def test_meta_tensors_give_the_cpu_kernels_shapes_and_dtypes(name):
    make, call = CASES[name]
    inputs = make()
    want = leaves(call(inputs))
    out = call([t.to("meta") for t in inputs])
    items = out if isinstance(out, tuple) else (out,)
    assert all(t is None or t.device.type == "meta" for t in items)
    assert leaves(out) == want


FAKE_CASES = dict(CASES, **{
    "rejection_sample_logits_packed": (lambda: [torch.randn(4 + B, V), torch.tensor([0, 3, 4]), torch.tensor([1, 2, 3, 4])],
                                       lambda a: so.rejection_sample_logits_packed(*a, max_num_draft_tokens=3,
                                                                                   return_logprobs=True)),
    "tree_attention_bias": (lambda: [so.build_tree(torch.tensor([[-1, 0, 0, 1]] * B)).mask, torch.tensor([5, 8])],
                            lambda a: so.tree_attention_bias(a[0], a[1], 12)),
    "merge_attention_states": (lambda: [torch.randn(B, 3, 8, 4).transpose(2, 3), torch.randn(B, 3, 4),
                                        torch.randn(B, 3, 4, 8), torch.randn(B, 3, 4)],
                               lambda a: so.merge_attention_states(*a)),
})


@pytest.mark.parametrize("name", sorted(FAKE_CASES))
def test_wrappers_run_under_a_fake_tensor_mode(name):
    """make_fx, export and a user's FakeTensorMode run the wrappers on fake CPU tensors, which hold no values:
    the wrappers' value checks are skipped there (they read values: DataDependentOutputException), and every
    output has the eager output's shape, dtype and strides."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    make, call = FAKE_CASES[name]
    inputs = make()
    eager = call(inputs)
    mode = FakeTensorMode()
    fakes = [mode.from_tensor(t) for t in inputs]
    with mode:
        out = call(fakes)
    assert leaves(out) == leaves(eager)
    items, want = (out, eager) if isinstance(out, tuple) else ((out,), (eager,))
    assert [t.stride() for t in items if t is not None] == [t.stride() for t in want if t is not None]


def test_kv_rollback_under_a_fake_tensor_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()
    caches = [mode.from_tensor(torch.zeros(B, 12, 2, 8)) for _ in range(2)]
    seq_lens, num_tokens = mode.from_tensor(torch.tensor([3, 5], dtype=torch.int32)), mode.from_tensor(torch.tensor([2, 1]))
    with mode:
        so.kv_rollback(caches, seq_lens, num_tokens, 4)
    assert seq_lens.shape == (B,)


def test_kv_commit_on_meta_caches_changes_nothing():
    caches = [torch.empty(B, 12, 2, 8, device="meta") for _ in range(2)]
    seq_lens = torch.empty(B, dtype=torch.int32, device="meta")
    so.kv_commit(caches, seq_lens, torch.empty(B, N, dtype=torch.int64, device="meta"))
    assert seq_lens.device.type == "meta" and seq_lens.shape == (B,)


def test_an_explicit_cpu_backend_still_needs_cpu_tensors():
    inputs = [t.to("meta") for t in chain_inputs()]
    with pytest.raises(so.BackendUnavailableError, match="needs CPU tensors"):
        so.rejection_sample(*inputs, backend="cpu")
