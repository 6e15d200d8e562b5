"""In-place KV commit (pointer rollback) after verification (DESIGN.md §5.5).

Public functions: :func:`kv_commit` (move the accepted path's K/V entries into
consecutive slots in every cache and advance ``seq_lens``) and
:func:`kv_rollback` (advance ``seq_lens`` over a chain of accepted tokens, which
moves nothing: the same op with an identity path). Fake impls for torch.compile
and the Triton launcher live here too.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch

from . import _ops, reference
from ._backend import impl_checks_values, next_pow2, resolve_backend, tracing
from ._checks import (INDEX_DTYPES, SpecDecArgumentError, check_device, check_dtype, check_rank, check_shape,
                      check_tensor, fail, first_bad, native_message)

__all__ = ["kv_commit", "kv_rollback"]

KV_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.uint8, torch.int8, torch.float8_e4m3fn,
             torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz)
_KV_DTYPE_SET = frozenset(KV_DTYPES)
_UNBOUNDED = 1 << 62  # slots per request when no cache bounds them
_MAX_SEQ_LEN = 2**31 - 1  # seq_lens is int32 (csrc/kv/kv_math.h kKVMaxSeqLen)


# ---------------------------------------------------------------------------------------------- checks


def _check_args(caches, seq_lens, accepted_path, block_table, *, each_cache: bool = True) -> list[torch.Tensor]:
    if isinstance(caches, torch.Tensor) or not isinstance(caches, Sequence):
        fail(f"caches must be a list of tensors (every layer's K and V), got {type(caches).__name__}")
    caches = list(caches)
    check_rank(seq_lens, 1, "seq_lens", "[B]")
    check_dtype(seq_lens, (torch.int32,), "seq_lens")
    if not seq_lens.is_contiguous():
        fail("seq_lens must be contiguous (it is updated in place)")
    device = seq_lens.device
    batch = seq_lens.shape[0]
    if batch >= 2**31:
        fail(f"seq_lens must have fewer than 2^31 requests, got {batch}")
    check_rank(accepted_path, 2, "accepted_path", "[B, M]")
    if accepted_path.shape[0] != batch:
        fail(f"accepted_path must have shape [B, M] with B = {batch} (the size of seq_lens), "
             f"got {list(accepted_path.shape)}")
    check_dtype(accepted_path, INDEX_DTYPES, "accepted_path")
    check_device(accepted_path, device, "accepted_path", "seq_lens")
    paged = block_table is not None
    if paged:
        check_rank(block_table, 2, "block_table", "[B, max_blocks]")
        if block_table.shape[0] != batch:
            fail(f"block_table must have shape [B, max_blocks] with B = {batch}, got {list(block_table.shape)}")
        check_dtype(block_table, INDEX_DTYPES, "block_table")
        check_device(block_table, device, "block_table", "seq_lens")
    if not each_cache or (caches and _caches_look_fine(caches, device, paged, batch)):
        return caches
    layout = "[num_blocks, block_size, H, D]" if paged else "[B, S, H, D]"
    for layer, cache in enumerate(caches):
        name = f"caches[{layer}]"
        check_tensor(cache, name)
        check_rank(cache, 4, name, layout)
        check_dtype(cache, KV_DTYPES, name)
        check_device(cache, device, name, "seq_lens")
        if cache.shape[2] * cache.shape[3] * cache.element_size() >= 2**31:
            fail(f"{name} must have fewer than 2^31 bytes per slot (H * D * element size), got shape "
                 f"{list(cache.shape)}")
        first = caches[0]
        if paged:
            if cache.shape[1] < 1:
                fail(f"{name} must have block_size >= 1, got shape {list(cache.shape)}")
            if cache.shape[:2] != first.shape[:2]:
                fail(f"{name} must have the num_blocks and block_size of caches[0] {list(first.shape[:2])}, "
                     f"got shape {list(cache.shape)}")
        else:
            if cache.shape[0] != batch:
                fail(f"{name} must have shape [B, S, H, D] with B = {batch} (the size of seq_lens), "
                     f"got {list(cache.shape)}")
            if cache.shape[1] != first.shape[1]:
                fail(f"{name} must have the S of caches[0] ({first.shape[1]}), got {list(cache.shape)}")
    return caches


def _caches_look_fine(caches, device, paged: bool, batch: int) -> bool:
    """One cheap pass over the caches (the common case); the detailed checks, which
    name the bad cache, run only when it fails."""
    first = caches[0]
    if not isinstance(first, torch.Tensor) or first.dim() != 4:
        return False
    lead = first.shape[:2]
    if (not paged and lead[0] != batch) or (paged and lead[1] < 1):
        return False
    for cache in caches:
        if (type(cache) is not torch.Tensor and not isinstance(cache, torch.Tensor)) or cache.dim() != 4 \
                or cache.dtype not in _KV_DTYPE_SET or cache.shape[:2] != lead or cache.device != device \
                or cache.shape[2] * cache.shape[3] * cache.element_size() >= 2**31:
            return False
    return True


def _geometry(caches, block_table):
    """(paged, capacity, block_size, num_blocks) as csrc/kv/kv_op.cpp computes them."""
    if not caches:
        return False, _UNBOUNDED, 1, 0
    if block_table is not None:
        return True, block_table.shape[1] * caches[0].shape[1], caches[0].shape[1], caches[0].shape[0]
    return False, caches[0].shape[1], 1, 0


def _check_values(caches, seq_lens, accepted_path, block_table) -> None:
    """The C++ CPU kernel's value checks (csrc/kv/kv_op.cpp, same rule and messages), vectorized,
    for the reference and Triton backends on CPU: the first bad entry of the first bad request."""
    paged, capacity, block_size, num_blocks = _geometry(caches, block_table)
    batch, width = accepted_path.shape
    if batch == 0 or width == 0:
        return
    lens = seq_lens.long()[:, None]
    path = accepted_path.long()
    i = torch.arange(width)[None, :]
    prev = torch.cat([torch.full((batch, 1), -1, dtype=torch.int64), path[:, :-1]], dim=1)
    end = (i > 0) & (path < 0)
    # Why each entry fails (0: it does not), in kv_path_entry_rule's order, then the block table.
    kind = torch.zeros((batch, width), dtype=torch.int64)

    def flag(cond, code):
        kind.masked_fill_((kind == 0) & cond, code)

    flag((lens < 0).expand(batch, width), 1)
    flag((i == 0) & (path != 0), 2)
    flag(end, -1)  # the padding: ends the path, not an error
    flag((i > 0) & (path <= prev), 3)
    flag((path >= capacity) | (i >= capacity) | (path >= capacity - lens) | (i >= capacity - lens), 4)
    flag(i >= _MAX_SEQ_LEN - lens, 5)
    if paged:
        table = block_table.long()
        max_blocks = table.shape[1]
        src = (lens + path).clamp(0, max_blocks * block_size - 1) // block_size
        dst = (lens + i).clamp(0, max_blocks * block_size - 1) // block_size
        src_block, dst_block = table.gather(1, src), table.gather(1, dst)
        flag((src_block < 0) | (src_block >= num_blocks) | (dst_block < 0) | (dst_block >= num_blocks), 4)
    stop = kind != 0
    first = torch.where(stop.any(1), stop.long().argmax(1), width)  # first entry that ends the path
    first_kind = kind.gather(1, first.clamp(max=width - 1)[:, None])[:, 0]
    after_end = (first_kind == -1)[:, None] & (i > first[:, None]) & (path >= 0)
    bad_row = (first < width) & (first_kind > 0) | after_end.any(1)
    rows = bad_row.nonzero()
    if rows.numel() == 0:
        return
    b = int(rows[0, 0])
    seq_len = int(seq_lens[b])
    if first_kind[b] == -1:
        j = int(after_end[b].long().argmax())
        fail(f"accepted_path[{b}, {j}] = {int(path[b, j])} follows the -1 padding (negative entries may only "
             f"end a path)")
    j, code, a = int(first[b]), int(first_kind[b]), int(path[b, int(first[b])])
    if code == 1:
        fail(f"seq_lens[{b}] = {seq_len} is negative")
    if code == 2:
        fail(f"accepted_path[{b}, 0] = {a} must be 0 (the root, slot seq_lens[{b}])")
    if code == 3:
        fail(f"accepted_path[{b}, {j}] = {a} is not greater than accepted_path[{b}, {j - 1}] = "
             f"{int(path[b, j - 1])} (a path must be strictly increasing)")
    if code == 5:
        fail(f"accepted_path[{b}, {j}] = {a} would advance seq_lens[{b}] = {seq_len} to {seq_len + j + 1}, "
             f"past the int32 range ({_MAX_SEQ_LEN})")
    if paged:
        fail(f"accepted_path[{b}, {j}] = {a} reaches slot seq_lens[{b}] + {a} = {seq_len + a} outside request "
             f"{b}'s blocks (block_table row {b}: max_blocks * block_size = {capacity} slots, block ids in "
             f"[0, {num_blocks}))")
    fail(f"accepted_path[{b}, {j}] = {a} reaches slot seq_lens[{b}] + {a} = {seq_len + a} outside the cache "
         f"(S = {capacity})")


# ---------------------------------------------------------------------------------------------- public


def kv_commit(
    caches: Sequence[torch.Tensor],
    seq_lens: torch.Tensor,
    accepted_path: torch.Tensor,
    *,
    block_table: torch.Tensor | None = None,
    backend: str | None = None,
) -> None:
    """Commit the accepted path's K/V entries in place, for every cache at once.

    For every cache and request b with path ``a = accepted_path[b] = (0, a1, ...,
    a_{m-1}, -1, ...)``: for i in 1..m-1, slot ``seq_lens[b] + i`` receives the old
    contents of slot ``seq_lens[b] + a_i`` (the result equals the out-of-place
    gather although the moves overlap); then ``seq_lens[b] += m``. Identity entries
    (a_i == i: chain drafts) copy nothing. Rejected entries are left behind in the
    slots past the new length, to be overwritten by the next step.

    Parameters
    ----------
    caches : list of tensors
        Every layer's K and V cache, updated in place. Contiguous ``[B, S, H, D]``
        with any strides (an HF ``[B, H, S, D]`` cache passes ``.transpose(1, 2)``)
        or paged ``[num_blocks, block_size, H, D]`` with ``block_table``. Dtypes
        float32, float16, bfloat16 or a 1-byte type (uint8, int8, float8); H, D and
        the dtype may differ between caches, S (contiguous) or num_blocks and
        block_size (paged) may not. The caches must not overlap each other. May be
        empty: then only ``seq_lens`` moves.
    seq_lens : int32 [B], contiguous
        The committed length before the window (the window's slot 0 holds the root,
        node 0 of the tree); advanced in place by m on the device.
    accepted_path : int32 | int64 [B, M]
        Offsets into the window, ``0, a1, ..., a_{m-1}`` strictly increasing, then
        -1 padding. ``tree_rejection_sample(...).accepted_path`` feeds it directly;
        for chain drafts the path is ``0, 1, ..., num_accepted``.
    block_table : int32 | int64 [B, max_blocks], optional
        Paged caches: logical slot p of request b lives in block
        ``block_table[b, p // block_size]`` at offset ``p % block_size``.
    backend : None | "cuda" | "triton" | "cpu" | "reference"

    Errors and safe behaviour
    -------------------------
    Bad arguments raise SpecDecArgumentError (a ValueError) naming the argument, on
    every backend. On CPU a malformed path (first entry not 0, not strictly
    increasing, a non-negative entry after the padding, or reaching a slot outside
    the cache S or the request's blocks: beyond max_blocks * block_size or a block id
    outside [0, num_blocks)), a negative ``seq_lens`` entry, and a path that would
    advance ``seq_lens[b]`` past the int32 range (2^31 - 1; only reachable without
    caches) raise it naming accepted_path (or seq_lens) and the element. On the GPU
    (no host sync) the first bad entry ends the path: nothing outside the cache or
    the request's blocks is read or written, and ``seq_lens[b]`` never passes
    2^31 - 1 (it never wraps).

    CUDA graphs and streams
    -----------------------
    CUDA: one kernel launch moves every cache (up to 128 caches per launch; more are
    split into launches on the same stream), then one small launch advances
    ``seq_lens``; both run on the current stream and keep no state between calls, so
    any number of streams and graphs replayed on any stream are safe. The caches'
    pointers and strides are kernel parameters, so capture and replay work as long as
    the caches stay where they were at capture (static caches), while ``seq_lens``,
    ``accepted_path`` and ``block_table`` are read on the device at replay.
    Triton: one move launch per cache element size (one for the usual single dtype),
    then the ``seq_lens`` launch; the caches' offsets and strides sit in a small
    device table built once per set of caches (later calls with the same caches
    reuse it, so warm up once before capturing a graph).

    Example
    -------
    >>> k = torch.randn(1, 16, 2, 8); v = torch.randn(1, 16, 2, 8)
    >>> seq_lens = torch.tensor([4], dtype=torch.int32)
    >>> kv_commit([k, v], seq_lens, torch.tensor([[0, 2, 3, -1]]))  # slots 5, 6 <- 6, 7
    >>> seq_lens
    tensor([7], dtype=torch.int32)
    """
    check_tensor(seq_lens, "seq_lens")
    backend = resolve_backend(backend, seq_lens.device, "kv_commit", native_op="kv_commit",
                              triton_op="kv_commit_triton")
    native = backend != "reference" and not tracing()
    # The ops (C++ and Triton) check every cache themselves (naming it) and, on CPU, the
    # path's values: the Python per-cache checks (~1 us per cache) and value checks run
    # here only for the reference backend (and while tracing, where the op is not run).
    caches = _check_args(caches, seq_lens, accepted_path, block_table, each_cache=not native)
    if seq_lens.device.type == "cpu" and backend == "reference" and not tracing():
        _check_values(caches, seq_lens, accepted_path, block_table)
    if backend == "reference":
        reference.kv_commit(caches, seq_lens, accepted_path, block_table=block_table)
        return None
    op = torch.ops.specdec.kv_commit if backend in ("cpu", "cuda") else torch.ops.specdec.kv_commit_triton
    if native:
        try:
            op.default(caches, seq_lens, accepted_path, block_table)
        except (ValueError, TypeError) as exc:  # argument and path checks (csrc/kv/kv_op.cpp, _triton_kv_commit)
            raise SpecDecArgumentError(native_message(exc)) from None
        except RuntimeError:  # e.g. a non-tensor in caches: name it if it is an argument problem
            _check_args(caches, seq_lens, accepted_path, block_table)
            raise
        return None
    try:
        op.default(caches, seq_lens, accepted_path, block_table)
    except (ValueError, TypeError) as exc:  # e.g. the fake's device check (a cache on the meta device)
        if isinstance(exc, SpecDecArgumentError):
            raise
        raise SpecDecArgumentError(native_message(exc)) from None
    return None


def kv_rollback(
    caches: Sequence[torch.Tensor],
    seq_lens: torch.Tensor,
    num_tokens: torch.Tensor,
    max_tokens: int,
    *,
    block_table: torch.Tensor | None = None,
    backend: str | None = None,
) -> None:
    """Advance ``seq_lens`` over a chain of ``num_tokens[b]`` kept tokens, moving nothing.

    The pointer-only commit for chain drafts (e.g. the draft model's cache): the
    first n_b = ``num_tokens[b]`` slots of the window are kept in place and the
    rest is left behind. It is :func:`kv_commit` with the identity path
    ``0, 1, ..., n_b - 1, -1, ...`` of width ``max_tokens``, so the same checks
    apply (on CPU n_b above ``max_tokens`` or past the cache raise ValueError; on
    the GPU the commit stops at the cache end). Passing the caches is optional
    (they bound the slots); their contents are never touched.

    Parameters
    ----------
    caches : list of tensors, as in :func:`kv_commit` (may be empty)
    seq_lens : int32 [B], advanced in place
    num_tokens : int [B]: n_b in 1..max_tokens (for a chain verified by
        rejection_sample: ``num_accepted + 1``, the root/last token included;
        the root is always kept, as in every path)
    max_tokens : int: a static bound on n_b (keeps shapes fixed for CUDA graphs)
    """
    check_rank(num_tokens, 1, "num_tokens", "[B]")
    check_dtype(num_tokens, INDEX_DTYPES, "num_tokens")
    check_device(num_tokens, seq_lens.device, "num_tokens", "seq_lens")
    check_shape(num_tokens, tuple(seq_lens.shape), "num_tokens", "[B]")
    if not isinstance(max_tokens, int) or max_tokens < 0:
        fail(f"max_tokens must be a non-negative int, got {max_tokens!r}")
    if seq_lens.device.type == "cpu" and not tracing():
        bad = first_bad((num_tokens < 1) | (num_tokens > max_tokens))
        if bad is not None:
            fail(f"num_tokens[{bad[0]}] = {int(num_tokens[bad])} is outside [1, max_tokens = {max_tokens}]")
    steps = torch.arange(max_tokens, device=seq_lens.device, dtype=torch.int32)
    path = torch.where(steps < num_tokens[:, None], steps, -1)
    kv_commit(caches, seq_lens, path, block_table=block_table, backend=backend)


# ---------------------------------------------------------------------------------------------- fakes


def _fake_kv_commit(caches, seq_lens, accepted_path, block_table):
    torch._check(seq_lens.dim() == 1, lambda: "seq_lens must be 1-D [B]")
    torch._check(accepted_path.dim() == 2, lambda: "accepted_path must be 2-D [B, M]")
    # The dispatcher routes a call with any meta tensor here, whatever the other
    # tensors' device: a cache on another device than seq_lens must not pass silently.
    for layer, cache in enumerate(caches):
        if cache.device != seq_lens.device:
            raise SpecDecArgumentError(f"caches[{layer}] must be on the same device as seq_lens "
                                       f"({seq_lens.device}), got {cache.device}")
    for tensor, name in ((accepted_path, "accepted_path"), (block_table, "block_table")):
        if tensor is not None and tensor.device != seq_lens.device:
            raise SpecDecArgumentError(f"{name} must be on the same device as seq_lens ({seq_lens.device}), "
                                       f"got {tensor.device}")
    return None


# ---------------------------------------------------------------------------------------------- triton


_TABLES: OrderedDict = OrderedDict()  # (device, caches' addresses and geometry) -> device tables
_TABLES_KEPT = 64


def _slot_rows(group: list[torch.Tensor]) -> list[tuple[int, ...]]:
    """Per cache: (data address, stride0, stride1, stride_head, stride_dim, head_dim, H * D), in elements."""
    return [(c.data_ptr(), *c.stride(), c.shape[3], c.shape[2] * c.shape[3]) for c in group]


def _row_layout(rows: list[tuple[int, ...]], elem_bytes: int) -> tuple[bool, int]:
    """(CONTIGUOUS_ROWS, VEC) of kv_move_kernel for one group of caches of one element size (their
    _slot_rows), from host-known metadata only (shapes, strides, data addresses: no device sync).

    CONTIGUOUS_ROWS: every cache's slot rows are contiguous (element (h, d) of a slot at h * D + d: stride_dim
    1 unless D == 1, stride_head D unless H == 1), so a row element's offset is its index.
    VEC > 1 (16 bytes of elements) where, in addition, every cache starts on 16 bytes and its slot strides
    (stride0, stride1) and row length are multiples of 16 bytes: the kernel then moves 16-byte vectors. Any
    other layout takes the general path (per-element head/dim strides)."""
    if not all((dim == 1 or stride_dim == 1) and (row == dim or stride_head == dim)
               for _, _, _, stride_head, stride_dim, dim, row in rows):
        return False, 1
    vec = 16 // elem_bytes
    aligned = all(address % 16 == 0 and stride0 % vec == 0 and stride1 % vec == 0 and row % vec == 0
                  for address, stride0, stride1, _, _, _, row in rows)
    return True, vec if aligned else 1


def _cache_tables(group: list[torch.Tensor], device: torch.device):
    """(cache_addresses int64 [C], cache_geometry int64 [C, 6], (CONTIGUOUS_ROWS, VEC), host copy) on
    `device` for one group of caches of one element size: data addresses and (stride0, stride1,
    stride_head, stride_dim, head_dim, H * D) in elements, and the move kernel's variant (_row_layout).

    Memoized per set of caches (addresses, strides, shapes): a decode loop's static
    caches build them once, with a non-blocking copy from pinned memory on CUDA
    (no sync); later calls and CUDA graph replays reuse the same device tensors.
    """
    rows = _slot_rows(group)
    key = (device, group[0].element_size(), tuple(rows))
    tables = _TABLES.get(key)
    if tables is not None:
        _TABLES.move_to_end(key)
        return tables
    host = torch.tensor(rows, dtype=torch.int64).reshape(len(rows), 7)
    if device.type == "cuda":
        host = host.pin_memory()
        table = host.to(device, non_blocking=True)
    else:
        table = host.to(device)
    layout = _row_layout(rows, group[0].element_size())
    tables = (table[:, 0].contiguous(), table[:, 1:].contiguous(), layout, host)  # keep the pinned source alive
    if device.type != "cpu":
        _TABLES[key] = tables
        while len(_TABLES) > _TABLES_KEPT:
            _TABLES.popitem(last=False)
    return tables


def _triton_kv_commit(caches, seq_lens, accepted_path, block_table):
    """specdec::kv_commit_triton: the C++ op's checks (shapes, dtypes and devices of every argument and cache
    always; the path's values on CPU tensors, with its messages: _check_values), then the launches."""
    from .triton_kernels.kv_commit import kv_advance_kernel, kv_move_kernel

    caches = _check_args(caches, seq_lens, accepted_path, block_table)
    if impl_checks_values(seq_lens.device):
        _check_values(caches, seq_lens, accepted_path, block_table)
    batch, max_path = accepted_path.shape
    if batch == 0:
        return None
    paged, capacity, block_size, num_blocks = _geometry(caches, block_table)
    path = accepted_path.contiguous()
    table = block_table.contiguous() if paged else path
    block_m = max(next_pow2(max_path), 2)
    geometry_args = (max_path, path.stride(0), capacity, block_size, num_blocks, table.stride(0))
    # One launch per element size (every cache of the usual single dtype at once). The kernel moves raw
    # elements of that size through the addresses and strides of the device tables, never the tensors
    # themselves: the caches need no reinterpreting view.
    groups: dict[int, list[torch.Tensor]] = {}
    for cache in caches:
        if cache.numel() > 0:
            groups.setdefault(cache.element_size(), []).append(cache)
    for group in groups.values():
        addresses, geometry, (contiguous_rows, vec), _ = _cache_tables(group, seq_lens.device)
        row_elems = max(c.shape[2] * c.shape[3] for c in group)
        block = min(max(next_pow2(row_elems), 16), 1024)
        kv_move_kernel[(batch, len(group))](
            addresses, geometry, seq_lens, path, table, *geometry_args,
            ELEM_BYTES=group[0].element_size(), PAGED=paged, BLOCK_M=block_m, BLOCK=block,
            ROW_TILES=-(-row_elems // block), CONTIGUOUS_ROWS=contiguous_rows, VEC=vec,
        )
    kv_advance_kernel[(batch,)](seq_lens, path, table, *geometry_args, PAGED=paged, BLOCK_M=block_m)
    return None


if _ops.native_loaded():
    torch.library.register_fake("specdec::kv_commit")(_fake_kv_commit)
    torch.library.register_fake("specdec::kv_commit_triton")(_fake_kv_commit)
    torch.library.impl("specdec::kv_commit_triton", ("CPU", "CUDA"))(_triton_kv_commit)
