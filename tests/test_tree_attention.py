"""tree_attention and merge_attention_states (DESIGN.md §5.4): every CPU backend (C++/composite,
reference, Triton interpreter) against dense attention with tree_attention_bias, over contiguous,
HF-view and paged caches, GQA, LSE, garbage in unused slots, chains (= causal) and N = 1 (= decode)."""

import math

import pytest
import torch
import torch.nn.functional as F

import specdec_ops
from specdec_ops import attention as attention_module, reference

from conftest import CPU_BACKENDS, compile_ahead_of_time

NAN = float("nan")


def random_tree(batch, n, gen, num_nodes=None):
    parents = torch.full((batch, n), -1, dtype=torch.int64)
    for b in range(batch):
        for i in range(1, n):
            parents[b, i] = int(torch.randint(0, i, (1,), generator=gen))
    return specdec_ops.build_tree(parents, num_nodes)


def make_case(batch=2, n=7, hq=4, hk=2, d=64, prefix=(5, 19), slack=3, dtype=torch.float32, seed=0,
              num_nodes=None):
    """q, contiguous caches with NaN in every slot past prefix + N, prefix_lens, mask."""
    gen = torch.Generator().manual_seed(seed)
    prefix_lens = torch.tensor(prefix[:batch])
    s = int(prefix_lens.max()) + n + slack
    q = torch.randn(batch, n, hq, d, generator=gen).to(dtype)
    k = torch.randn(batch, s, hk, d, generator=gen).to(dtype)
    v = torch.randn(batch, s, hk, d, generator=gen).to(dtype)
    for b in range(batch):
        k[b, int(prefix_lens[b]) + n:] = NAN
        v[b, int(prefix_lens[b]) + n:] = NAN
    info = random_tree(batch, n, gen, num_nodes)
    return q, k, v, prefix_lens, info.mask


def tolerances(dtype):
    return {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.float16: dict(atol=2e-3, rtol=2e-3),
            torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}[dtype]


def assert_matches_reference(backend, q, k, v, prefix_lens, mask, block_table=None, sm_scale=None, ref=None):
    out, lse = specdec_ops.tree_attention(q, k, v, prefix_lens, mask, block_table=block_table, sm_scale=sm_scale,
                                          return_lse=True, backend=backend)
    if ref is None:
        ref = reference.tree_attention(q, k, v, prefix_lens, mask, block_table=block_table, sm_scale=sm_scale)
    assert out.dtype == q.dtype and out.shape == q.shape
    assert lse.dtype == torch.float32 and lse.shape == q.shape[:3]
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    torch.testing.assert_close(out.float(), ref[0].float(), **tolerances(q.dtype))
    torch.testing.assert_close(lse, ref[1], atol=1e-4, rtol=1e-4)
    return out, lse


# ---------------------------------------------------------------------------------------------- reference itself


def test_reference_equals_sdpa_with_the_bias():
    q, k, v, prefix_lens, mask = make_case(hq=2, hk=2, slack=0, prefix=(6, 6))
    k, v = k.nan_to_num(), v.nan_to_num()
    kv_len = 6 + 7
    bias = specdec_ops.tree_attention_bias(mask, prefix_lens, kv_len)
    want = F.scaled_dot_product_attention(q.transpose(1, 2), k[:, :kv_len].transpose(1, 2),
                                          v[:, :kv_len].transpose(1, 2), attn_mask=bias).transpose(1, 2)
    out, _ = reference.tree_attention(q, k, v, prefix_lens, mask)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------- layouts


@pytest.mark.parametrize("backend", ["cpu", "triton"])
@pytest.mark.parametrize("hq, hk", [(4, 2), (2, 2), (4, 1), (6, 2)])
def test_contiguous_gqa_with_garbage_past_the_tree(backend, hq, hk):
    if backend not in CPU_BACKENDS:
        pytest.skip("triton not installed")
    q, k, v, prefix_lens, mask = make_case(hq=hq, hk=hk)
    assert_matches_reference(backend, q, k, v, prefix_lens, mask)


def prefix_attention(q, k, v, prefix, group):
    """[N, Hq, D]: every query of one request over keys 0 .. prefix - 1 alone (no tree key)."""
    kk = k[:prefix].float().repeat_interleave(group, dim=1)
    vv = v[:prefix].float().repeat_interleave(group, dim=1)
    scores = torch.einsum("nhd,lhd->hnl", q.float(), kk) / math.sqrt(q.shape[-1])
    return torch.einsum("hnl,lhd->nhd", scores.softmax(-1), vv)


@pytest.mark.parametrize("backend", ["cpu", "triton", "reference"])
def test_ragged_num_nodes_padding_rows_see_the_prefix_alone_and_their_slots_never_leak(backend):
    if backend not in CPU_BACKENDS:
        pytest.skip("triton not installed")
    n = 9
    q, k, v, prefix_lens, mask = make_case(n=n, num_nodes=torch.tensor([4, 9]), slack=0)
    k[0, 5 + 4: 5 + n] = NAN  # slots of request 0's padding nodes hold garbage too
    v[0, 5 + 4: 5 + n] = NAN
    out, lse = assert_matches_reference(backend, q, k, v, prefix_lens, mask)
    # padding rows (all-zero mask rows) see the prefix, as under tree_attention_bias, and no tree key
    torch.testing.assert_close(out[0, 4:], prefix_attention(q[0, 4:], k[0], v[0], 5, 2), atol=2e-5, rtol=2e-5)
    assert torch.isfinite(lse[0, 4:]).all()
    assert (out[1] != 0).any(dim=-1).all()


@pytest.mark.parametrize("backend", ["cpu", "triton", "reference"])
def test_every_row_equals_sdpa_with_the_bias_padding_and_empty_prefix_included(backend):
    # The bias is the definition: padded trees, a request without a committed prefix (its padding rows
    # see no key: 0 and lse -inf, never NaN), GQA.
    if backend not in CPU_BACKENDS:
        pytest.skip("triton not installed")
    n = 7
    q, k, v, prefix_lens, mask = make_case(n=n, prefix=(0, 6), num_nodes=torch.tensor([3, 5]), slack=0, seed=3)
    out, lse = specdec_ops.tree_attention(q, k, v, prefix_lens, mask, return_lse=True, backend=backend)
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    for b in range(2):
        kv_len = int(prefix_lens[b]) + n
        bias = specdec_ops.tree_attention_bias(mask[b:b + 1], prefix_lens[b:b + 1], kv_len)
        kk = k[b:b + 1, :kv_len].nan_to_num().repeat_interleave(2, dim=2).transpose(1, 2)
        vv = v[b:b + 1, :kv_len].nan_to_num().repeat_interleave(2, dim=2).transpose(1, 2)
        sees = (bias[0, 0] == 0).any(-1)  # [N]: rows with a visible key
        want = F.scaled_dot_product_attention(q[b:b + 1].transpose(1, 2), kk, vv, attn_mask=bias).transpose(1, 2)[0]
        torch.testing.assert_close(out[b][sees], want[sees], atol=2e-5, rtol=2e-5)
        assert (out[b][~sees] == 0).all() and torch.isneginf(lse[b][~sees]).all()
    assert (~(specdec_ops.tree_attention_bias(mask[:1], prefix_lens[:1], n)[0, 0] == 0).any(-1)).sum() == n - 3


@pytest.mark.parametrize("backend", ["cpu", "triton"])
def test_hf_cache_view_any_strides(backend):
    if backend not in CPU_BACKENDS:
        pytest.skip("triton not installed")
    q, k, v, prefix_lens, mask = make_case()
    k_hf, v_hf = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()  # HF [B, H, S, D]
    q_view = q.transpose(1, 2).contiguous().transpose(1, 2)  # HF query [B, H, N, D] viewed back
    ref = reference.tree_attention(q, k, v, prefix_lens, mask)
    assert_matches_reference(backend, q_view, k_hf.transpose(1, 2), v_hf.transpose(1, 2), prefix_lens, mask,
                             ref=ref)


def make_paged(k, v, prefix_lens, n, block_size, gen):
    """Scatter contiguous caches into a shuffled paged pool; unused blocks hold NaN."""
    batch, s, hk, d = k.shape
    max_blocks = -(-s // block_size)
    num_blocks = batch * max_blocks + 3
    perm = torch.randperm(num_blocks, generator=gen)
    table = perm[: batch * max_blocks].reshape(batch, max_blocks)
    k_pool = torch.full((num_blocks, block_size, hk, d), NAN, dtype=k.dtype)
    v_pool = torch.full((num_blocks, block_size, hk, d), NAN, dtype=v.dtype)
    for b in range(batch):
        used = int(prefix_lens[b]) + n
        for blk in range(-(-used // block_size)):
            lo, hi = blk * block_size, min((blk + 1) * block_size, used)
            k_pool[table[b, blk], : hi - lo] = k[b, lo:hi]
            v_pool[table[b, blk], : hi - lo] = v[b, lo:hi]
        table[b, -(-used // block_size):] = -7  # table entries past the request's slots: never read
    return k_pool, v_pool, table


@pytest.mark.parametrize("backend", ["cpu", "triton", "reference"])
@pytest.mark.parametrize("block_size", [4, 16])
def test_paged_cache_with_shuffled_block_table(backend, block_size):
    if backend not in CPU_BACKENDS:
        pytest.skip("triton not installed")
    gen = torch.Generator().manual_seed(block_size)
    q, k, v, prefix_lens, mask = make_case(seed=block_size)
    ref = reference.tree_attention(q, k, v, prefix_lens, mask)
    k_pool, v_pool, table = make_paged(k, v, prefix_lens, q.shape[1], block_size, gen)
    k_before, v_before = k_pool.clone(), v_pool.clone()
    assert_matches_reference(backend, q, k_pool, v_pool, prefix_lens, mask, block_table=table.int(), ref=ref)
    assert torch.equal(k_pool.nan_to_num(7.0), k_before.nan_to_num(7.0))  # the pool is read, never written
    assert torch.equal(v_pool.nan_to_num(7.0), v_before.nan_to_num(7.0))


@pytest.mark.parametrize("backend", ["cpu", "triton"])
@pytest.mark.parametrize("d", [128, 256, 96])
def test_head_dims(backend, d):
    if backend not in CPU_BACKENDS:
        pytest.skip("triton not installed")
    q, k, v, prefix_lens, mask = make_case(batch=1, n=5, hq=2, hk=1, d=d, prefix=(21,))
    assert_matches_reference(backend, q, k, v, prefix_lens, mask, sm_scale=0.3)


@pytest.mark.parametrize("backend", ["cpu", "triton"])
def test_float16(backend):
    if backend not in CPU_BACKENDS:
        pytest.skip("triton not installed")
    q, k, v, prefix_lens, mask = make_case(dtype=torch.float16)
    assert_matches_reference(backend, q, k, v, prefix_lens, mask)


def test_bfloat16_cpu():  # no bf16 arithmetic under the Triton interpreter: the GPU test covers it
    q, k, v, prefix_lens, mask = make_case(dtype=torch.bfloat16)
    assert_matches_reference("cpu", q, k, v, prefix_lens, mask)


def test_tree_wider_than_one_mask_word_and_long_prefix():
    backends = [b for b in CPU_BACKENDS if b != "reference"]
    q, k, v, prefix_lens, mask = make_case(batch=2, n=70, hq=2, hk=1, d=64, prefix=(0, 150), seed=3)
    for backend in backends:
        assert_matches_reference(backend, q, k, v, prefix_lens, mask)


@pytest.mark.parametrize("splits", [2, 5])
def test_triton_split_kv_path(monkeypatch, splits):
    if "triton" not in CPU_BACKENDS:
        pytest.skip("triton not installed")
    monkeypatch.setattr(attention_module, "_FORCE_NUM_SPLITS", splits)
    q, k, v, prefix_lens, mask = make_case(n=6, prefix=(0, 90), num_nodes=torch.tensor([6, 3]), seed=splits)
    assert_matches_reference("triton", q, k, v, prefix_lens, mask)


# ---------------------------------------------------------------------------------------------- special trees


def causal_attention(q, k, v, prefix):
    """SDPA over keys [0, prefix + N) with bottom-right causal alignment (GQA expanded)."""
    n, group = q.shape[1], q.shape[2] // k.shape[2]
    kk = k[:, : prefix + n].repeat_interleave(group, dim=2).transpose(1, 2)
    vv = v[:, : prefix + n].repeat_interleave(group, dim=2).transpose(1, 2)
    allowed = torch.ones(n, prefix + n, dtype=torch.bool).tril(diagonal=prefix)
    return F.scaled_dot_product_attention(q.transpose(1, 2), kk, vv, attn_mask=allowed).transpose(1, 2)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_chain_tree_equals_causal_attention(backend):
    n, prefix = 6, 13
    q, k, v, _, _ = make_case(batch=1, n=n, prefix=(prefix,))
    mask = specdec_ops.build_tree(torch.arange(-1, n - 1)[None]).mask
    out = specdec_ops.tree_attention(q, k, v, torch.tensor([prefix]), mask, backend=backend)
    torch.testing.assert_close(out, causal_attention(q, k, v, prefix), atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_single_node_equals_decode_attention(backend):
    prefix = 17
    q, k, v, _, _ = make_case(batch=1, n=1, prefix=(prefix,))
    mask = specdec_ops.build_tree(torch.tensor([[-1]])).mask
    out, lse = specdec_ops.tree_attention(q, k, v, torch.tensor([prefix]), mask, return_lse=True, backend=backend)
    torch.testing.assert_close(out, causal_attention(q, k, v, prefix), atol=2e-5, rtol=2e-5)
    scores = torch.einsum("hd,shd->hs", q[0, 0], k[0, : prefix + 1].repeat_interleave(2, dim=1)) / math.sqrt(64)
    torch.testing.assert_close(lse[0, 0], torch.logsumexp(scores, -1), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_empty_prefix_root_sees_only_itself(backend):
    q, k, v, _, _ = make_case(batch=1, n=3, prefix=(0,))
    mask = specdec_ops.build_tree(torch.tensor([[-1, 0, 0]])).mask
    out = specdec_ops.tree_attention(q, k, v, torch.tensor([0]), mask, backend=backend)
    torch.testing.assert_close(out[0, 0], v[0, 0].repeat_interleave(2, dim=0), atol=1e-6,
                               rtol=1e-6)


# ---------------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_argument_errors_name_the_argument(backend):
    q, k, v, prefix_lens, mask = make_case()

    def call(**kw):
        args = dict(q=q, k_cache=k, v_cache=v, prefix_lens=prefix_lens, mask=mask)
        args.update(kw)
        return specdec_ops.tree_attention(args.pop("q"), args.pop("k_cache"), args.pop("v_cache"),
                                          args.pop("prefix_lens"), args.pop("mask"), backend=backend, **args)

    cases = [
        (dict(q=q[0]), "q"),
        (dict(q=q.int()), "q"),
        (dict(k_cache=k.half()), "k_cache"),
        (dict(v_cache=v[:, :-1]), "v_cache"),
        (dict(k_cache=k[..., :32], v_cache=v[..., :32]), "k_cache"),
        (dict(q=torch.randn(2, 7, 3, 64)), "heads"),
        (dict(prefix_lens=prefix_lens[:1]), "prefix_lens"),
        (dict(prefix_lens=prefix_lens.float()), "prefix_lens"),
        (dict(mask=mask[:, :3]), "mask"),
        (dict(mask=mask.int()), "mask"),
        (dict(block_table=torch.zeros(2, 3)), "block_table"),
        (dict(prefix_lens=torch.tensor([5, 100])), r"prefix_lens\[1\]"),
        (dict(prefix_lens=torch.tensor([-1, 0])), r"prefix_lens\[0\]"),
        (dict(prefix_backend="flash"), "prefix_backend"),
    ]
    for kw, match in cases:
        with pytest.raises(ValueError, match=match):
            call(**kw)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_bad_block_table_entry_raises_on_cpu(backend):
    gen = torch.Generator().manual_seed(0)
    q, k, v, prefix_lens, mask = make_case()
    k_pool, v_pool, table = make_paged(k, v, prefix_lens, q.shape[1], 8, gen)
    table[1, 1] = k_pool.shape[0]
    with pytest.raises(ValueError, match=r"block_table\[1, 1\]"):
        specdec_ops.tree_attention(q, k_pool, v_pool, prefix_lens, mask, block_table=table, backend=backend)


def test_cuda_backend_unavailable_for_cpu_tensors():
    q, k, v, prefix_lens, mask = make_case()
    with pytest.raises(specdec_ops.BackendUnavailableError):
        specdec_ops.tree_attention(q, k, v, prefix_lens, mask, backend="cuda")


# ---------------------------------------------------------------------------------------------- merge


def partial_attention(q, k, v):
    """(out, lse) of q [R, D] over keys k/v [L, D]; L = 0 gives (0, -inf)."""
    if k.shape[0] == 0:
        return torch.zeros_like(q), torch.full(q.shape[:1], float("-inf"))
    scores = q @ k.T / math.sqrt(q.shape[-1])
    return torch.softmax(scores, -1) @ v, torch.logsumexp(scores, -1)


MERGE_BACKENDS = CPU_BACKENDS


@pytest.mark.parametrize("backend", MERGE_BACKENDS)
@pytest.mark.parametrize("split", [0, 5, 12])
def test_merge_equals_attention_over_the_union(backend, split):
    gen = torch.Generator().manual_seed(split)
    q, k, v = (torch.randn(6, 32, generator=gen), torch.randn(12, 32, generator=gen),
               torch.randn(12, 32, generator=gen))
    perm = torch.randperm(12, generator=gen)
    a, b = perm[:split], perm[split:]
    oa, la = partial_attention(q, k[a], v[a])
    ob, lb = partial_attention(q, k[b], v[b])
    out, lse = specdec_ops.merge_attention_states(oa.reshape(2, 3, 32), la.reshape(2, 3), ob.reshape(2, 3, 32),
                                                  lb.reshape(2, 3), backend=backend)
    want_o, want_l = partial_attention(q, k, v)
    torch.testing.assert_close(out.reshape(6, 32), want_o, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.reshape(6), want_l, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", MERGE_BACKENDS)
def test_merge_of_empty_sides_is_zero_never_nan(backend):
    out_a = torch.full((3, 16), NAN).half()  # an all-masked side's output is never read
    lse_a = torch.full((3,), float("-inf"))
    out_b = torch.randn(3, 16).half()
    lse_b = torch.tensor([0.5, float("-inf"), -2.0])
    out, lse = specdec_ops.merge_attention_states(out_a, lse_a, out_b, lse_b, backend=backend)
    assert out.dtype == torch.float16 and lse.dtype == torch.float32
    assert torch.equal(out[0], out_b[0]) and torch.equal(out[2], out_b[2])
    assert (out[1] == 0).all() and torch.isneginf(lse[1])
    torch.testing.assert_close(lse[[0, 2]], lse_b[[0, 2]])


@pytest.mark.parametrize("backend", MERGE_BACKENDS)
def test_merge_of_non_finite_lse_is_the_references(backend):
    """lse = log(e^lse_a + e^lse_b) whatever the sides: +inf with anything is +inf, NaN with anything NaN, and
    their outputs 0, on every backend (the Triton kernel stored -inf for both, and out_b for a NaN lse_a)."""
    inf = float("inf")
    out_a, out_b = torch.randn(4, 16), torch.randn(4, 16)
    lse_a = torch.tensor([inf, NAN, inf, 0.3])
    lse_b = torch.tensor([0.5, 0.5, -inf, NAN])
    out, lse = specdec_ops.merge_attention_states(out_a, lse_a, out_b, lse_b, backend=backend)
    want_out, want_lse = reference.merge_attention_states(out_a, lse_a, out_b, lse_b)
    assert torch.isposinf(lse[[0, 2]]).all() and torch.isnan(lse[[1, 3]]).all() and (out == 0).all()
    torch.testing.assert_close(lse, want_lse, equal_nan=True)
    assert torch.equal(out, want_out)


def test_merge_argument_errors():
    o, l = torch.randn(2, 3, 8), torch.randn(2, 3)
    with pytest.raises(ValueError, match="out_b"):
        specdec_ops.merge_attention_states(o, l, o[:, :2], l)
    with pytest.raises(ValueError, match="lse_b"):
        specdec_ops.merge_attention_states(o, l, o, l.double())
    with pytest.raises(ValueError, match="lse_a"):
        specdec_ops.merge_attention_states(o, l[:, :2], o, l)
    with pytest.raises(ValueError, match="out_a"):
        specdec_ops.merge_attention_states(o.int(), l, o.int(), l)


# ---------------------------------------------------------------------------------------------- op surface


def test_opcheck_tree_attention_and_merge():
    q, k, v, prefix_lens, mask = make_case(batch=2, n=3, hq=2, hk=1, d=16, prefix=(2, 4), slack=0)
    args = (q, k, v, prefix_lens, mask, None, 0.25)
    torch.library.opcheck(torch.ops.specdec.tree_attention.default, args)
    o, l = torch.randn(2, 3, 16), torch.randn(2, 3)
    torch.library.opcheck(torch.ops.specdec.merge_attention_states.default, (o, l, o.flip(0), l.flip(0)))
    strided = torch.randn(2, 16, 3).transpose(1, 2)   # outputs contiguous whatever the inputs' strides
    torch.library.opcheck(torch.ops.specdec.merge_attention_states.default, (strided, l.t().contiguous().t(), o, l))
    if "triton" in CPU_BACKENDS:
        torch.library.opcheck(torch.ops.specdec.tree_attention_triton.default, args)
        torch.library.opcheck(torch.ops.specdec.merge_attention_states_triton.default, (o, l, o.flip(0), l.flip(0)))


def test_compile_fullgraph_tree_attention_and_merge():
    q, k, v, prefix_lens, mask = make_case(batch=2, n=4, hq=2, hk=1, d=16, prefix=(3, 6))

    def f(q, k, v, prefix_lens, mask):
        out, lse = specdec_ops.tree_attention(q, k, v, prefix_lens, mask, return_lse=True, backend="cpu")
        return specdec_ops.merge_attention_states(out, lse, out, lse)

    got = torch.compile(f, fullgraph=True)(q, k, v, prefix_lens, mask)
    want = f(q, k, v, prefix_lens, mask)
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])


# ---------------------------------------------------------------------------------------------- GPU


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_cuda_triton_against_reference(dtype, d):
    q, k, v, prefix_lens, mask = make_case(batch=3, n=33, hq=8, hk=2, d=d, prefix=(0, 700, 5000), dtype=dtype,
                                           num_nodes=torch.tensor([33, 20, 1]))
    ref = reference.tree_attention(q, k, v, prefix_lens, mask)
    out, lse = specdec_ops.tree_attention(q.cuda(), k.cuda(), v.cuda(), prefix_lens.cuda(), mask.cuda(),
                                          return_lse=True)
    tol = tolerances(dtype) if dtype != torch.float32 else dict(atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(out.cpu().float(), ref[0].float(), **tol)
    torch.testing.assert_close(lse.cpu(), ref[1], atol=1e-3, rtol=1e-3)


@pytest.mark.cuda
def test_cuda_paged_and_merge_and_graph_capture():
    gen = torch.Generator().manual_seed(0)
    q, k, v, prefix_lens, mask = make_case(batch=2, n=16, hq=4, hk=2, d=128, prefix=(100, 3000),
                                           dtype=torch.float16)
    ref = reference.tree_attention(q, k, v, prefix_lens, mask)
    k_pool, v_pool, table = make_paged(k, v, prefix_lens, 16, 16, gen)
    args = [t.cuda() for t in (q, k_pool, v_pool, prefix_lens, mask)]
    table = table.cuda()
    out = specdec_ops.tree_attention(*args, block_table=table)
    torch.testing.assert_close(out.cpu().float(), ref[0].float(), atol=2e-3, rtol=2e-3)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # no host sync anywhere on the GPU path
        captured = specdec_ops.tree_attention(*args, block_table=table)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(captured, out)
    o, l = torch.randn(4, 5, 64, device="cuda"), torch.randn(4, 5, device="cuda")
    got = specdec_ops.merge_attention_states(o, l, o.flip(0), l.flip(0))
    want = reference.merge_attention_states(o, l, o.flip(0), l.flip(0))
    torch.testing.assert_close(got[0], want[0], atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------- codegen



@pytest.mark.skipif("triton" not in CPU_BACKENDS or torch.cuda.is_available(),
                    reason="triton not installed, or a GPU compiles the kernels for real in the CUDA tests")
def test_triton_kernels_compile_for_sm90_without_a_gpu():
    """The interpreter does not run Triton's code generator: compile to sm_90 ahead of time to catch
    what only the real compiler rejects (e.g. non-constexpr globals, dtype mismatches in loops)."""
    compile_ahead_of_time("aot_tree_attention_kernel.py")
