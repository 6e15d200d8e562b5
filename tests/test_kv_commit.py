"""kv_commit (DESIGN.md §5.5): every backend against the out-of-place gather, all
layouts and dtypes; chain paths; paged blocks nobody owns; error paths; opcheck;
torch.compile; CUDA (equals CPU, safe behaviour on bad paths, graph capture)."""

import os
import random
import re

import pytest
import torch

import specdec_ops
from specdec_ops import reference
from specdec_ops._backend import gpu_value_rules
from conftest import HAS_TRITON, compile_ahead_of_time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.uint8, torch.float8_e4m3fn]
LAYOUTS = ["contiguous", "hf", "strided_dim", "paged"]
BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32}
HEADS = [(2, 8), (1, 16), (3, 4)]  # (H, D) per cache: layers may differ


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(BITS[t.element_size()])


def random_cache(shape, dtype, gen, device="cpu"):
    if dtype.is_floating_point and dtype.itemsize >= 2:
        return torch.randn(shape, generator=gen).to(dtype).to(device)
    raw = torch.randint(0, 256, shape, generator=gen, dtype=torch.uint8)
    return raw.view(dtype).to(device) if dtype.itemsize == 1 else raw.to(dtype).to(device)


def make_cache(layout, batch, slots, heads, dim, dtype, gen, num_blocks=0, block_size=0):
    """(cache passed to kv_commit, the tensor owning its storage)."""
    if layout == "paged":
        owner = random_cache((num_blocks, block_size, heads, dim), dtype, gen)
        return owner, owner
    if layout == "hf":  # an HF [B, H, S, D] cache passes .transpose(1, 2)
        owner = random_cache((batch, heads, slots, dim), dtype, gen)
        return owner.transpose(1, 2), owner
    if layout == "strided_dim":  # head dim not innermost: element-wise units
        owner = random_cache((batch, slots, dim, heads), dtype, gen)
        return owner.permute(0, 1, 3, 2), owner
    owner = random_cache((batch, slots, heads, dim), dtype, gen)
    return owner, owner


def random_path(window: int, width: int, rng: random.Random, chain=False) -> list[int]:
    if chain:
        n = rng.randint(1, min(window, width))
        path = list(range(n))
    else:
        picked = sorted(rng.sample(range(1, window), rng.randint(0, min(window - 1, width - 1))))
        path = [0] + picked
    return path + [-1] * (width - len(path))


def make_case(layout, dtype, *, batch=3, window=7, width=6, seed=0, chain=False, dtypes=None):
    """Caches, seq_lens, accepted_path, block_table for one random case."""
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    block_size, max_blocks = 4, 5
    slots = 16
    paged = layout == "paged"
    num_blocks = batch * max_blocks + 3  # three blocks nobody owns
    if paged:
        perm = torch.randperm(num_blocks, generator=gen)[: batch * max_blocks].view(batch, max_blocks)
        block_table = perm.to(torch.int32)
        capacity = max_blocks * block_size
    else:
        block_table = None
        capacity = slots
    seq_lens = torch.tensor([rng.randint(0, capacity - window) for _ in range(batch)], dtype=torch.int32)
    rows = [random_path(window, width, rng, chain) for _ in range(batch)]
    if not chain:  # at least one request whose moves overlap: slot 2 is written after being read for slot 1
        rows[0] = [0, 2, 3, window - 1] + [-1] * (width - 4)
    path = torch.tensor(rows, dtype=torch.int64)
    caches, owners = [], []
    for layer, (heads, dim) in enumerate(HEADS):
        for _kv in range(2):
            dt = dtype if dtypes is None else dtypes[(2 * layer + _kv) % len(dtypes)]
            cache, owner = make_cache(layout, batch, slots, heads, dim, dt, gen, num_blocks, block_size)
            caches.append(cache)
            owners.append(owner)
    return caches, owners, seq_lens, path, block_table


def gather_expected(caches, seq_lens, path, block_table):
    """The out-of-place gather, written independently of reference.py."""
    out = [bits(c).clone() for c in caches]
    new_lens = seq_lens.clone()
    for b in range(seq_lens.shape[0]):
        entries = [int(x) for x in path[b] if x >= 0]
        s = int(seq_lens[b])
        for old, new in zip([bits(c) for c in caches], out):
            for i, a in enumerate(entries):
                if block_table is None:
                    new[b, s + i] = old[b, s + a]
                else:
                    bs = old.shape[1]
                    src, dst = s + a, s + i
                    new[block_table[b, dst // bs], dst % bs] = old[block_table[b, src // bs], src % bs]
        new_lens[b] += len(entries)
    return out, new_lens


def assert_committed(caches, expected, seq_lens, expected_lens):
    assert torch.equal(seq_lens, expected_lens)
    for layer, (c, e) in enumerate(zip(caches, expected)):
        assert torch.equal(bits(c).cpu(), e.cpu()), f"cache {layer} differs"


# ---------------------------------------------------------------------------------------------- correctness


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_matches_out_of_place_gather(cpu_backend, layout, dtype):
    seed = 10 * LAYOUTS.index(layout) + DTYPES.index(dtype)
    caches, owners, seq_lens, path, table = make_case(layout, dtype, seed=seed)
    assert any(int(path[b, i]) > i for b in range(path.shape[0]) for i in range(path.shape[1]))  # real moves
    expected, expected_lens = gather_expected(caches, seq_lens, path, table)
    specdec_ops.kv_commit(caches, seq_lens, path, block_table=table, backend=cpu_backend)
    assert_committed(caches, expected, seq_lens, expected_lens)
    if layout in ("hf", "strided_dim"):  # updated in place through the view
        assert owners[0].data_ptr() == caches[0].data_ptr()


@pytest.mark.parametrize("seed", range(6))
def test_long_overlapping_paths_every_backend_agrees(cpu_backend, seed):
    # windows of 12 with up to 12 entries: many moves whose sources are later destinations
    caches, _, seq_lens, path, table = make_case("contiguous", torch.float32, batch=2, window=12, width=12,
                                                 seed=100 + seed)
    expected, expected_lens = gather_expected(caches, seq_lens, path, table)
    specdec_ops.kv_commit(caches, seq_lens, path.to(torch.int32), backend=cpu_backend)
    assert_committed(caches, expected, seq_lens, expected_lens)


def test_mixed_dtypes_in_one_call(cpu_backend):
    caches, _, seq_lens, path, table = make_case("paged", None, dtypes=[torch.bfloat16, torch.float8_e5m2,
                                                                        torch.float32], seed=7)
    assert len({c.dtype for c in caches}) == 3
    expected, expected_lens = gather_expected(caches, seq_lens, path, table)
    specdec_ops.kv_commit(caches, seq_lens, path, block_table=table.to(torch.int64), backend=cpu_backend)
    assert_committed(caches, expected, seq_lens, expected_lens)


def test_paged_blocks_not_owned_by_any_request_untouched(cpu_backend):
    caches, _, seq_lens, path, table = make_case("paged", torch.float16, seed=3)
    owned = set(table.flatten().tolist())
    free = [k for k in range(caches[0].shape[0]) if k not in owned]
    assert len(free) == 3
    before = [bits(c)[free].clone() for c in caches]
    specdec_ops.kv_commit(caches, seq_lens, path, block_table=table, backend=cpu_backend)
    for c, old in zip(caches, before):
        assert torch.equal(bits(c)[free], old)


@pytest.mark.parametrize("layout", ["contiguous", "paged"])
def test_chain_paths_leave_caches_bitwise_unchanged(cpu_backend, layout):
    caches, _, seq_lens, path, table = make_case(layout, torch.bfloat16, chain=True, seed=11)
    before = [bits(c).clone() for c in caches]
    lens_before = seq_lens.clone()
    specdec_ops.kv_commit(caches, seq_lens, path, block_table=table, backend=cpu_backend)
    for c, old in zip(caches, before):
        assert torch.equal(bits(c), old)
    assert torch.equal(seq_lens, lens_before + (path >= 0).sum(1).to(torch.int32))


def test_kv_rollback_moves_only_seq_lens(cpu_backend):
    caches, _, seq_lens, _, _ = make_case("contiguous", torch.float16, seed=5)
    before = [bits(c).clone() for c in caches]
    lens_before = seq_lens.clone()
    num_tokens = torch.tensor([1, 3, 5])
    specdec_ops.kv_rollback(caches, seq_lens, num_tokens, 5, backend=cpu_backend)
    assert torch.equal(seq_lens, lens_before + num_tokens.to(torch.int32))
    for c, old in zip(caches, before):
        assert torch.equal(bits(c), old)
    specdec_ops.kv_rollback([], seq_lens, num_tokens, 6, backend=cpu_backend)  # no caches: pointer only
    assert torch.equal(seq_lens, lens_before + 2 * num_tokens.to(torch.int32))
    with pytest.raises(ValueError, match="num_tokens"):
        specdec_ops.kv_rollback(caches, seq_lens, torch.tensor([1, 7, 1]), 5, backend=cpu_backend)
    with pytest.raises(ValueError, match=r"num_tokens\[0\]"):
        specdec_ops.kv_rollback(caches, seq_lens, torch.tensor([0, 2, 1]), 5, backend=cpu_backend)


def test_tree_accepted_path_feeds_directly(cpu_backend):
    # the shape tree_rejection_sample returns: int32 [B, N], node 0 first, -1 padded
    caches, _, seq_lens, _, _ = make_case("contiguous", torch.float32, seed=9)
    lens_before = seq_lens.clone()
    path = torch.tensor([[0, 2, 5, -1, -1, -1], [0, -1, -1, -1, -1, -1], [0, 1, 3, 4, 6, -1]], dtype=torch.int32)
    expected, expected_lens = gather_expected(caches, seq_lens, path, None)
    specdec_ops.kv_commit(caches, seq_lens, path, backend=cpu_backend)
    assert_committed(caches, expected, seq_lens, expected_lens)
    assert (seq_lens - lens_before).tolist() == [3, 1, 5]


def test_empty_batch_path_and_cache_list(cpu_backend):
    caches, _, _, _, _ = make_case("contiguous", torch.float32, seed=1)
    empty = torch.zeros(0, dtype=torch.int32)
    specdec_ops.kv_commit([c[:0] for c in caches], empty, torch.zeros(0, 4, dtype=torch.int64),
                          backend=cpu_backend)
    seq_lens = torch.tensor([2, 0, 5], dtype=torch.int32)
    specdec_ops.kv_commit(caches, seq_lens, torch.zeros(3, 0, dtype=torch.int64), backend=cpu_backend)
    assert seq_lens.tolist() == [2, 0, 5]
    specdec_ops.kv_commit([], seq_lens, torch.tensor([[0, 4, -1], [0, -1, -1], [0, 1, 2]]), backend=cpu_backend)
    assert seq_lens.tolist() == [4, 1, 8]


@pytest.mark.skipif(not HAS_TRITON, reason="needs triton")
@pytest.mark.parametrize("layout", ["contiguous", "paged"])
def test_triton_kernel_ends_path_at_first_bad_entry(layout):
    # The GPU rule, run by the Triton kernel in the interpreter (the op itself does
    # not check values): each bad entry ends its path, nothing outside is touched.
    caches, _, seq_lens, path, table = make_case(layout, torch.float32, seed=21)
    capacity = 16 if table is None else 20
    path[0] = torch.tensor([0, 2, 2, 4, -1, -1])           # not increasing at 2
    path[1] = torch.tensor([0, 3, capacity, 5, -1, -1])    # outside at 2
    path[2] = torch.tensor([0, -2, -1, 3, -1, -1])         # padding in the middle (garbage after it)
    if table is not None:
        table[0, 1] = -1  # request 0's second block unallocated: its path may end earlier
    expected = [c.clone() for c in caches]
    expected_lens = seq_lens.clone()
    reference.kv_commit(expected, expected_lens, path, block_table=table)
    with gpu_value_rules():  # the kernel's GPU behaviour (the impl checks values on CPU tensors)
        torch.ops.specdec.kv_commit_triton.default(caches, seq_lens, path, table)
    assert torch.equal(seq_lens, expected_lens)
    for c, e in zip(caches, expected):
        assert torch.equal(bits(c), bits(e))
    assert (expected_lens - make_case(layout, torch.float32, seed=21)[2]).tolist()[1:] == [2, 1]


def test_fully_accepted_chain_paged_with_unallocated_blocks_moves_nothing(cpu_backend):
    # The early exit (kv_math.h kv_path_moves_nothing) never reads the block table: an
    # identity path whose later blocks are unallocated still ends where the blocks end.
    caches, _, seq_lens, path, table = make_case("paged", torch.float16, seed=23)
    seq_lens[:] = torch.tensor([2, 3, 0], dtype=torch.int32)
    path[:] = torch.tensor([0, 1, 2, 3, 4, 5])
    table[1, 1:] = -1  # request 1: slots 4.. unallocated, so its path ends after entry 0 (slot 3)
    before = [bits(c).clone() for c in caches]
    lens_before = seq_lens.clone()
    with pytest.raises(specdec_ops.SpecDecArgumentError, match=r"accepted_path\[1, 1\]"):
        specdec_ops.kv_commit(caches, seq_lens, path, block_table=table, backend=cpu_backend)
    assert torch.equal(seq_lens, lens_before)
    if cpu_backend == "triton":  # the GPU rule, in the interpreter: the path just ends
        with gpu_value_rules():  # the kernel's GPU behaviour (the impl checks values on CPU tensors)
            torch.ops.specdec.kv_commit_triton.default(caches, seq_lens, path, table)
        assert seq_lens.tolist() == [8, 4, 6]
    for c, b in zip(caches, before):
        assert torch.equal(bits(c), b)


@pytest.mark.skipif(not HAS_TRITON, reason="needs triton")
@pytest.mark.parametrize("dtypes,move_launches", [
    ([torch.bfloat16], 1), ([torch.float16, torch.bfloat16], 1), ([torch.float32, torch.uint8, torch.float16], 3),
])
def test_triton_one_move_launch_per_element_size(monkeypatch, dtypes, move_launches):
    # DESIGN §5.5: one launch covers all caches (per element size: bit moves through integer
    # views), then one launch advances seq_lens; 32 layers of K and V are 2 launches, not 64.
    from specdec_ops.triton_kernels import kv_commit as kernels

    grids = {"move": [], "advance": []}

    class Counting:
        def __init__(self, kernel, name):
            self.kernel, self.name = kernel, name

        def __getitem__(self, grid):
            grids[self.name].append(tuple(grid))
            return self.kernel[grid]

    monkeypatch.setattr(kernels, "kv_move_kernel", Counting(kernels.kv_move_kernel, "move"))
    monkeypatch.setattr(kernels, "kv_advance_kernel", Counting(kernels.kv_advance_kernel, "advance"))
    caches, _, seq_lens, path, table = make_case("paged", torch.float32, seed=25, dtypes=dtypes)
    expected, expected_lens = gather_expected(caches, seq_lens, path, table)
    specdec_ops.kv_commit(caches, seq_lens, path, block_table=table, backend="triton")
    assert_committed(caches, expected, seq_lens, expected_lens)
    assert len(grids["move"]) == move_launches and len(grids["advance"]) == 1
    assert sum(g[1] for g in grids["move"]) == len(caches) and all(g[0] == 3 for g in grids["move"])


def row_layout_cache(kind, lead, heads, dim, dtype, gen):
    """A cache of `kind` for the Triton row-layout tests: "aligned" (contiguous rows, 16-byte aligned),
    "odd_offset" (contiguous rows, storage sliced one element in: not 16-byte aligned), "odd_row"
    (contiguous, H * D not a multiple of 16 bytes), "odd_slot_stride" (contiguous rows, slot stride not a
    multiple of 16 bytes), "hf" (an HF [B, H, S, D] cache's transpose) or
    "strided_dim" (head dim not innermost)."""
    shape = (*lead, heads, dim)
    if kind == "odd_offset":
        flat = random_cache((lead[0] * lead[1] * heads * dim + 1,), dtype, gen)
        return flat[1:].view(shape)
    if kind == "hf":
        return random_cache((lead[0], heads, lead[1], dim), dtype, gen).transpose(1, 2)
    if kind == "strided_dim":
        return random_cache((*lead, dim, heads), dtype, gen).permute(0, 1, 3, 2)
    if kind == "odd_row":
        return random_cache((*lead, heads, dim - 1), dtype, gen)
    if kind == "odd_slot_stride":  # H * D = 8 elements (16 bytes) but slots 12 elements (24 bytes) apart
        return random_cache((*lead, 3, 4), dtype, gen)[:, :, :2]
    return random_cache(shape, dtype, gen)


# (cache kinds of one call, CONTIGUOUS_ROWS, VEC for bf16): the fast path only when every cache allows it
ROW_LAYOUTS = [
    (["aligned"] * 4, True, 8),
    (["aligned", "odd_offset", "aligned", "aligned"], True, 1),  # one misaligned cache: scalar accesses
    (["odd_row", "odd_row"], True, 1),
    (["aligned", "odd_slot_stride"], True, 1),
    (["aligned", "hf", "aligned", "aligned"], False, 1),  # one cache without contiguous rows: general path
    (["strided_dim", "aligned"], False, 1),
    (["hf", "hf"], False, 1),
]


@pytest.mark.skipif(not HAS_TRITON, reason="needs triton")
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("kinds,contiguous_rows,vec", ROW_LAYOUTS,
                         ids=lambda x: "-".join(x) if isinstance(x, list) else str(x))
def test_triton_row_layout_fast_path_taken_only_when_every_cache_allows_it(monkeypatch, paged, kinds,
                                                                          contiguous_rows, vec):
    # The launcher picks kv_move_kernel's CONTIGUOUS_ROWS / VEC from shapes, strides and data addresses; the
    # result is the out-of-place gather on either path (the same bits: these are copies).
    from specdec_ops.triton_kernels import kv_commit as kernels

    move_kernel, launches = kernels.kv_move_kernel, []

    class Recording:
        def __getitem__(self, grid):
            def launch(*args, **meta):
                launches.append(meta)
                return move_kernel[grid](*args, **meta)
            return launch

    monkeypatch.setattr(kernels, "kv_move_kernel", Recording())
    gen = torch.Generator().manual_seed(31)
    rng = random.Random(31)
    batch, slots, block_size, max_blocks, window = 3, 16, 4, 5, 7
    num_blocks = batch * max_blocks + 2
    table = torch.randperm(num_blocks, generator=gen)[: batch * max_blocks].view(batch, max_blocks).to(torch.int32)
    lead = (num_blocks, block_size) if paged else (batch, slots)
    capacity = max_blocks * block_size if paged else slots
    caches = [row_layout_cache(kind, lead, 2, 32, torch.bfloat16, gen) for kind in kinds]
    seq_lens = torch.tensor([rng.randint(0, capacity - window) for _ in range(batch)], dtype=torch.int32)
    path = torch.tensor([[0, 2, 3, 6, -1, -1], [0, 1, 4, 5, 6, -1], [0, 3, -1, -1, -1, -1]])
    table = table if paged else None
    expected, expected_lens = gather_expected(caches, seq_lens, path, table)
    specdec_ops.kv_commit(caches, seq_lens, path, block_table=table, backend="triton")
    assert_committed(caches, expected, seq_lens, expected_lens)
    assert [(m["CONTIGUOUS_ROWS"], m["VEC"]) for m in launches] == [(contiguous_rows, vec)]


@pytest.mark.skipif(not HAS_TRITON, reason="needs triton")
def test_triton_row_layout_from_shapes_strides_and_addresses():
    # Each element size is its own launch group with its own VEC (16 bytes); size-1 dims' strides do not matter.
    from specdec_ops.kv import _row_layout, _slot_rows

    def layout(group):
        return _row_layout(_slot_rows(group), group[0].element_size())

    gen = torch.Generator().manual_seed(33)
    bf16 = [row_layout_cache("aligned", (2, 8), 2, 32, torch.bfloat16, gen) for _ in range(2)]
    fp32 = [row_layout_cache("odd_offset", (2, 8), 2, 32, torch.float32, gen)]
    fp8 = [row_layout_cache("aligned", (2, 8), 2, 32, torch.float8_e4m3fn, gen).view(torch.uint8)]
    assert layout(bf16) == (True, 8)
    assert layout(fp32) == (True, 1)
    assert layout(fp8) == (True, 16)
    assert layout([row_layout_cache("aligned", (2, 8), 1, 8, torch.float32, gen)]) == (True, 4)
    # size-1 dims: their strides do not matter for contiguity; a slot stride off 16 bytes does
    one_head = torch.empty(2, 8, 1, 16, dtype=torch.bfloat16).as_strided((2, 8, 1, 16), (128, 16, 999, 1))
    assert layout([one_head]) == (True, 8)
    wide_slots = torch.empty(2, 8, 3, 8, dtype=torch.bfloat16)[:, :, :2]  # stride(1) = 24 elements: 48 bytes
    assert layout([wide_slots]) == (True, 8)
    odd_slots = torch.empty(2, 8, 3, 4, dtype=torch.bfloat16)[:, :, :2]  # stride(1) = 12 elements: 24 bytes
    assert layout([odd_slots]) == (True, 1)
    half_row = torch.empty(2, 8, 2, 4, dtype=torch.bfloat16)[:, :, :1]  # slots 16 bytes apart, rows of 8 bytes
    assert layout([half_row]) == (True, 1)
    padded = torch.empty(2, 8, 2, 9, dtype=torch.bfloat16)[..., :8]  # stride(2) = 9 != D: rows not contiguous
    assert layout([padded]) == (False, 1)
    assert layout([bf16[0], padded]) == (False, 1)


@pytest.mark.skipif(not HAS_TRITON, reason="needs triton")
def test_triton_kernels_compile_for_sm90_without_a_gpu():
    compile_ahead_of_time("aot_kv_commit_kernel.py")


def test_cuda_kernels_keep_no_global_mutable_state():
    # Defect: seq_lens was advanced through __device__ ticket counters shared by every launch
    # on a stream row (csrc/kv/kv_kernels.cu g_kv_tickets): wrong with > 32 streams or graphs
    # replayed on another stream. No .cu file may declare a __device__ / __managed__ variable.
    pattern = re.compile(r"^\s*(?:static\s+)?(?:__device__|__managed__)\s+[^()]*?(?:;|=|\[)", re.M)
    found = []
    for folder, _, files in os.walk(os.path.join(ROOT, "csrc")):
        for name in files:
            if name.endswith((".cu", ".cuh")):
                with open(os.path.join(folder, name)) as f:
                    found += [f"{name}: {m.group(0).strip()}" for m in pattern.finditer(f.read())]
    assert not found, found


def test_seq_lens_never_wrap_past_int32(cpu_backend):
    # Without caches no slot bound applies: the int32 range of seq_lens is the bound.
    top = 2**31 - 1
    seq_lens = torch.tensor([top - 3, 5], dtype=torch.int32)
    path = torch.tensor([[0, 1, 2, 3], [0, 1, -1, -1]])
    with pytest.raises(specdec_ops.SpecDecArgumentError, match=r"accepted_path\[0, 3\].*seq_lens\[0\]"):
        specdec_ops.kv_commit([], seq_lens, path, backend=cpu_backend)
    assert seq_lens.tolist() == [top - 3, 5]
    path[0, 3] = -1
    specdec_ops.kv_commit([], seq_lens, path, backend=cpu_backend)
    assert seq_lens.tolist() == [top, 7]
    if cpu_backend == "triton":  # the GPU rule: the path ends at the int32 bound
        seq_lens = torch.tensor([top - 3], dtype=torch.int32)
        with gpu_value_rules():  # the kernel's GPU behaviour (the impl checks values on CPU tensors)
            torch.ops.specdec.kv_commit_triton.default([], seq_lens, torch.tensor([[0, 1, 2, 3, 4]]), None)
        assert seq_lens.tolist() == [top]


def test_cache_on_the_meta_device_is_refused(cpu_backend):
    # Defect: one meta cache made the dispatcher route the whole call to the fake impl,
    # which did nothing: no error, no commit.
    caches, seq_lens, path, _ = _case_for_errors()
    lens_before = seq_lens.clone()
    with pytest.raises(specdec_ops.SpecDecArgumentError, match=r"caches\[1\] must be on the same device"):
        specdec_ops.kv_commit([caches[0], caches[1].to("meta")], seq_lens, path, backend=cpu_backend)
    assert torch.equal(seq_lens, lens_before)
    with pytest.raises(ValueError, match=r"caches\[0\] must be on the same device"):
        torch.ops.specdec.kv_commit.default([caches[0].to("meta")], seq_lens, path, None)


# ---------------------------------------------------------------------------------------------- errors


def _case_for_errors():
    caches, _, seq_lens, path, table = make_case("contiguous", torch.float32, seed=2)
    seq_lens[:] = torch.tensor([3, 0, 6], dtype=torch.int32)
    return caches, seq_lens, path, table


@pytest.mark.parametrize("bad_row,element", [
    ([1, 2, -1, -1, -1, -1], r"accepted_path\[1, 0\]"),     # first entry not 0
    ([-1, -1, -1, -1, -1, -1], r"accepted_path\[1, 0\]"),   # first entry not 0 (empty path)
    ([0, 3, 3, -1, -1, -1], r"accepted_path\[1, 2\]"),      # not strictly increasing
    ([0, 4, 2, -1, -1, -1], r"accepted_path\[1, 2\]"),      # decreasing
    ([0, 2, 16, -1, -1, -1], r"accepted_path\[1, 2\]"),     # beyond S
    ([0, 2, -1, 5, -1, -1], r"accepted_path\[1, 3\]"),      # non-negative entry after the padding
    ([0, 2, -3, -1, -1, -1], None),                          # any negative entry ends the path: fine
])
def test_malformed_path_raises_value_error(cpu_backend, bad_row, element):
    caches, seq_lens, path, _ = _case_for_errors()
    path[1] = torch.tensor(bad_row)
    before = [c.clone() for c in caches]
    lens_before = seq_lens.clone()
    if element is None:
        specdec_ops.kv_commit(caches, seq_lens, path, backend=cpu_backend)
        assert int(seq_lens[1]) == 2
        return
    with pytest.raises(ValueError, match=element):
        specdec_ops.kv_commit(caches, seq_lens, path, backend=cpu_backend)
    assert torch.equal(seq_lens, lens_before)  # checked before anything moves
    for c, old in zip(caches, before):
        assert torch.equal(c, old)


def test_path_reaching_outside_the_cache_by_seq_len(cpu_backend):
    caches, seq_lens, path, _ = _case_for_errors()
    seq_lens[2] = 12
    path[2] = torch.tensor([0, 1, 4, -1, -1, -1])  # slot 16 == S
    with pytest.raises(ValueError, match=r"accepted_path\[2, 2\]"):
        specdec_ops.kv_commit(caches, seq_lens, path, backend=cpu_backend)
    path[2] = torch.tensor([0, 2**62, -1, -1, -1, -1])  # no overflow
    with pytest.raises(ValueError, match=r"accepted_path\[2, 1\]"):
        specdec_ops.kv_commit(caches, seq_lens, path, backend=cpu_backend)
    seq_lens[2] = -1
    with pytest.raises(ValueError, match=r"seq_lens\[2\]"):
        specdec_ops.kv_commit(caches, seq_lens, path, backend=cpu_backend)


def test_paged_path_outside_the_requests_blocks(cpu_backend):
    caches, _, seq_lens, path, table = make_case("paged", torch.float16, seed=4)
    seq_lens[0] = 13
    path[0] = torch.tensor([0, 1, 6, -1, -1, -1])  # slot 19 is in block column 4, the last one
    specdec_ops.kv_commit([c.clone() for c in caches], seq_lens.clone(), path, block_table=table,
                          backend=cpu_backend)
    path[0] = torch.tensor([0, 1, 7, -1, -1, -1])  # slot 20 == max_blocks * block_size
    with pytest.raises(ValueError, match=r"accepted_path\[0, 2\]"):
        specdec_ops.kv_commit(caches, seq_lens, path, block_table=table, backend=cpu_backend)
    path[0] = torch.tensor([0, 1, 6, -1, -1, -1])
    table[0, 4] = -1  # unallocated block
    with pytest.raises(ValueError, match=r"accepted_path\[0, 2\]"):
        specdec_ops.kv_commit(caches, seq_lens, path, block_table=table, backend=cpu_backend)
    table[0, 4] = caches[0].shape[0]  # block id out of range
    with pytest.raises(ValueError, match=r"accepted_path\[0, 2\]"):
        specdec_ops.kv_commit(caches, seq_lens, path, block_table=table, backend=cpu_backend)


@pytest.mark.parametrize("mutate,name", [
    (lambda a: a.update(seq_lens=a["seq_lens"].long()), "seq_lens"),
    (lambda a: a.update(seq_lens=a["seq_lens"][:2]), "accepted_path|caches"),
    (lambda a: a.update(accepted_path=a["accepted_path"].float()), "accepted_path"),
    (lambda a: a.update(accepted_path=a["accepted_path"][0]), "accepted_path"),
    (lambda a: a.update(caches=[a["caches"][0].double()]), r"caches\[0\]"),
    (lambda a: a.update(caches=[a["caches"][0], a["caches"][1][0]]), r"caches\[1\]"),
    (lambda a: a.update(caches=[a["caches"][0], a["caches"][1][:, :8]]), r"caches\[1\]"),
    (lambda a: a.update(caches=[a["caches"][0][:2]]), r"caches\[0\]"),
    (lambda a: a.update(caches=a["caches"][0]), "caches"),
    (lambda a: a.update(caches=[a["caches"][0], 3]), r"caches\[1\] must be a torch.Tensor"),
    (lambda a: a.update(block_table=torch.zeros(3, 2)), "block_table"),
    (lambda a: a.update(block_table=torch.zeros(2, 2, dtype=torch.int32)), "block_table"),
])
def test_bad_arguments_name_the_argument(cpu_backend, mutate, name):
    caches, seq_lens, path, _ = _case_for_errors()
    args = dict(caches=caches, seq_lens=seq_lens, accepted_path=path, block_table=None)
    mutate(args)
    with pytest.raises(specdec_ops.SpecDecArgumentError, match=name):
        specdec_ops.kv_commit(args["caches"], args["seq_lens"], args["accepted_path"],
                              block_table=args["block_table"], backend=cpu_backend)


@pytest.mark.parametrize("layout", ["contiguous", "paged"])
def test_value_errors_identical_on_every_backend(layout):
    # The Python value checks (reference, triton on CPU) and the C++ ones (cpu) raise the same
    # message for the same bad element, or all accept the path and commit the same result.
    rng = random.Random(7)
    gen = torch.Generator().manual_seed(7)
    raised = 0
    for trial in range(150):
        caches, _, seq_lens, path, table = make_case(layout, torch.float32, seed=trial % 5)
        rows = []
        for _ in range(path.shape[0]):
            row = [0]
            while len(row) < rng.randint(1, path.shape[1]):
                row.append(row[-1] + rng.randint(1, 2))
            row += [-1] * (path.shape[1] - len(row))
            rows.append([rng.choice([-1, -2, 0, 1, 3, 8, 13, 19, 25]) if rng.random() < 0.05 else a for a in row])
        path = torch.tensor(rows)
        seq_lens = torch.tensor([rng.choice([-1, 0, 3, 9, 14] + [2] * 15) for _ in range(seq_lens.shape[0])],
                                dtype=torch.int32)
        if table is not None and rng.random() < 0.3:
            table.view(-1)[torch.randint(0, table.numel(), (2,), generator=gen)] = rng.choice([-1, 99])
        outcomes = []
        for backend in ("cpu", "reference") + (("triton",) if HAS_TRITON and trial % 10 == 0 else ()):
            mine, lens = [c.clone() for c in caches], seq_lens.clone()
            try:
                specdec_ops.kv_commit(mine, lens, path, block_table=table, backend=backend)
                outcomes.append(("ok", lens.tolist(), [bits(c) for c in mine]))
            except specdec_ops.SpecDecArgumentError as exc:
                outcomes.append(("error", str(exc), None))
        raised += outcomes[0][0] == "error"
        for other in outcomes[1:]:
            assert other[:2] == outcomes[0][:2], (path, seq_lens, table)
            if other[2] is not None:
                assert all(torch.equal(x, y) for x, y in zip(other[2], outcomes[0][2]))
    assert 30 < raised < 140  # both outcomes are exercised


def test_native_op_checks_too():
    caches, seq_lens, path, _ = _case_for_errors()
    with pytest.raises(TypeError, match="seq_lens must be int32"):  # a dtype: TypeError, like torch's own
        torch.ops.specdec.kv_commit.default(caches, seq_lens.long(), path, None)
    with pytest.raises(ValueError, match=r"caches\[1\] must have the S"):
        torch.ops.specdec.kv_commit.default([caches[0], caches[1][:, :8]], seq_lens, path, None)
    path[0, 1] = 0
    with pytest.raises(ValueError, match=r"accepted_path\[0, 1\] = 0 is not greater"):
        torch.ops.specdec.kv_commit.default(caches, seq_lens, path, None)


def test_unavailable_backend_is_clear():
    caches, seq_lens, path, _ = _case_for_errors()
    with pytest.raises(specdec_ops.BackendUnavailableError, match="cuda"):
        specdec_ops.kv_commit(caches, seq_lens, path, backend="cuda")


# ---------------------------------------------------------------------------------------------- torch integration


def _opcheck_samples():
    for layout in ("contiguous", "hf", "paged"):
        caches, _, seq_lens, path, table = make_case(layout, torch.bfloat16, batch=2, seed=31)
        yield caches[:2], seq_lens, path, table


@pytest.mark.parametrize("op_name", ["kv_commit"] + (["kv_commit_triton"] if HAS_TRITON else []))
def test_opcheck(op_name):
    op = getattr(torch.ops.specdec, op_name).default
    for caches, seq_lens, path, table in _opcheck_samples():
        torch.library.opcheck(op, ([c.clone() for c in caches], seq_lens.clone(), path, table),
                              test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))


def test_schema_declares_the_mutations():
    schema = torch.ops.specdec.kv_commit.default._schema
    mutable = [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    assert mutable == ["caches", "seq_lens"]


def test_torch_compile_fullgraph():
    caches, _, seq_lens, path, table = make_case("paged", torch.float16, seed=41)
    expected, expected_lens = gather_expected(caches, seq_lens, path, table)

    @torch.compile(fullgraph=True, backend="aot_eager")
    def step(caches, seq_lens, path, table):
        specdec_ops.kv_commit(caches, seq_lens, path, block_table=table)
        return seq_lens + 0

    out = step(caches, seq_lens, path, table)
    assert torch.equal(out, expected_lens)
    assert_committed(caches, expected, seq_lens, expected_lens)


def test_torch_compile_fullgraph_inductor():
    caches, _, seq_lens, path, _ = make_case("contiguous", torch.float32, seed=43)
    expected, expected_lens = gather_expected(caches, seq_lens, path, None)
    compiled = torch.compile(lambda c, s, p: specdec_ops.kv_commit(c, s, p), fullgraph=True)
    compiled(caches, seq_lens, path)
    assert_committed(caches, expected, seq_lens, expected_lens)


# ---------------------------------------------------------------------------------------------- CUDA


def _to_cuda(caches, seq_lens, path, table):
    return ([c.cuda() for c in caches], seq_lens.cuda(), path.cuda(), None if table is None else table.cuda())


@pytest.mark.cuda
@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cuda_equals_cpu(backend, layout, dtype):
    if backend == "triton" and not HAS_TRITON:
        pytest.skip("needs triton")
    caches, _, seq_lens, path, table = make_case(layout, dtype, batch=5, seed=51)
    gpu = _to_cuda(caches, seq_lens, path, table)
    if layout != "paged":  # views keep their strides on the device
        gpu = ([c.cuda() if c.is_contiguous() else _same_strides_cuda(c) for c in caches],) + gpu[1:]
    specdec_ops.kv_commit(caches, seq_lens, path, block_table=table, backend="cpu")
    specdec_ops.kv_commit(*gpu[:3], block_table=gpu[3], backend=backend)
    torch.cuda.synchronize()
    assert torch.equal(gpu[1].cpu(), seq_lens)
    for c, g in zip(caches, gpu[0]):
        assert torch.equal(bits(g).cpu(), bits(c))


def _same_strides_cuda(c):
    out = torch.empty_strided(c.shape, c.stride(), dtype=c.dtype, device="cuda")
    out.copy_(c)
    return out


@pytest.mark.cuda
@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("layout", ["contiguous", "paged"])
def test_cuda_bad_entries_end_the_path(backend, layout):
    caches, _, seq_lens, path, table = make_case(layout, torch.float16, batch=4, seed=61)
    capacity = 16 if table is None else 20
    path[0] = torch.tensor([0, 2, 2, 4, -1, -1])
    path[1] = torch.tensor([0, 3, capacity + 100, 5, -1, -1])
    path[2] = torch.tensor([5, 6, -1, -1, -1, -1])
    path[3] = torch.tensor([0, 1, -1, 3, -1, -1])
    if table is not None:
        table[2, 1] = -1
    gpu = _to_cuda(caches, seq_lens, path, table)
    reference.kv_commit(caches, seq_lens, path, block_table=table)
    specdec_ops.kv_commit(*gpu[:3], block_table=gpu[3], backend=backend)
    torch.cuda.synchronize()
    assert torch.equal(gpu[1].cpu(), seq_lens)
    for c, g in zip(caches, gpu[0]):
        assert torch.equal(bits(g).cpu(), bits(c))


@pytest.mark.cuda
def test_cuda_mixed_devices_name_the_cache():
    caches, seq_lens, path, _ = _case_for_errors()
    for backend in ("cpu", "reference"):
        with pytest.raises(ValueError, match=r"caches\[1\]"):
            specdec_ops.kv_commit([caches[0], caches[1].cuda()], seq_lens, path, backend=backend)
    with pytest.raises(ValueError, match=r"caches\[0\]"):
        specdec_ops.kv_commit([caches[0]], seq_lens.cuda(), path.cuda(), backend="cuda")


@pytest.mark.cuda
def test_cuda_many_caches_and_wide_paths():
    # more caches than one launch's table (128) and paths longer than one warp pass (32)
    gen = torch.Generator().manual_seed(71)
    rng = random.Random(71)
    batch, slots, width = 3, 80, 40
    caches = [random_cache((batch, slots, 2, 64), torch.bfloat16, gen) for _ in range(130)]
    seq_lens = torch.tensor([0, 5, 30], dtype=torch.int32)
    path = torch.tensor([random_path(45, width, rng) for _ in range(batch)])
    path[0] = torch.tensor(list(range(0, 2 * width, 2))[:width])
    expected, expected_lens = gather_expected(caches, seq_lens, path, None)
    gpu = _to_cuda(caches, seq_lens, path, None)
    specdec_ops.kv_commit(*gpu[:3], backend="cuda")
    torch.cuda.synchronize()
    assert_committed(gpu[0], expected, gpu[1].cpu(), expected_lens)


@pytest.mark.cuda
@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_cuda_many_streams_at_once(backend):
    # More streams than the old ticket rows (32), each committing its own batch at once.
    if backend == "triton" and not HAS_TRITON:
        pytest.skip("needs triton")
    cases = [make_case("paged", torch.bfloat16, batch=3, seed=100 + k) for k in range(40)]
    streams = [torch.cuda.Stream() for _ in cases]
    gpus = [_to_cuda(c[0], c[2], c[3], c[4]) for c in cases]
    torch.cuda.synchronize()
    for stream, gpu in zip(streams, gpus):
        with torch.cuda.stream(stream):
            for _ in range(2):  # two commits in a row on one stream: the second reads the first's seq_lens
                specdec_ops.kv_commit(*gpu[:3], block_table=gpu[3], backend=backend)
    torch.cuda.synchronize()
    for (caches, _, seq_lens, path, table), gpu in zip(cases, gpus):
        for _ in range(2):
            reference.kv_commit(caches, seq_lens, path, block_table=table)
        assert torch.equal(gpu[1].cpu(), seq_lens)
        for c, g in zip(caches, gpu[0]):
            assert torch.equal(bits(g).cpu(), bits(c))


@pytest.mark.cuda
def test_cuda_graph_replayed_on_another_stream():
    caches, _, seq_lens, path, table = make_case("paged", torch.bfloat16, batch=4, seed=85)
    g_caches, g_lens, g_path, g_table = _to_cuda(caches, seq_lens, path, table)
    specdec_ops.kv_commit(g_caches, g_lens, g_path, block_table=g_table, backend="cuda")  # warm up
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        specdec_ops.kv_commit(g_caches, g_lens, g_path, block_table=g_table, backend="cuda")
    for c, g in zip(caches, g_caches):
        g.copy_(c)
    g_lens.copy_(seq_lens)
    expected, expected_lens = gather_expected(caches, seq_lens, path, table)
    other = torch.cuda.Stream()
    other.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(other):
        graph.replay()
    torch.cuda.synchronize()
    assert_committed(g_caches, expected, g_lens.cpu(), expected_lens)


@pytest.mark.cuda
def test_cuda_graph_capture_and_replay():
    caches, _, seq_lens, path, table = make_case("paged", torch.bfloat16, batch=4, seed=81)
    g_caches, g_lens, g_path, g_table = _to_cuda(caches, seq_lens, path, table)
    specdec_ops.kv_commit(g_caches, g_lens, g_path, block_table=g_table, backend="cuda")  # warm up
    torch.cuda.synchronize()
    for c, g in zip(caches, g_caches):
        g.copy_(c)
    g_lens.copy_(seq_lens)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        specdec_ops.kv_commit(g_caches, g_lens, g_path, block_table=g_table, backend="cuda")
    rng = random.Random(82)
    for step in range(3):  # new paths, lengths and contents each replay
        fresh_caches, _, fresh_lens, fresh_path, _ = make_case("paged", torch.bfloat16, batch=4, seed=90 + step)
        for c, g in zip(fresh_caches, g_caches):
            g.copy_(c)
        fresh_lens = torch.tensor([rng.randint(0, 20 - 7) for _ in range(4)], dtype=torch.int32)
        g_lens.copy_(fresh_lens)
        g_path.copy_(fresh_path)
        expected, expected_lens = gather_expected(fresh_caches, fresh_lens, fresh_path, table)
        graph.replay()
        torch.cuda.synchronize()
        assert_committed(g_caches, expected, g_lens.cpu(), expected_lens)
