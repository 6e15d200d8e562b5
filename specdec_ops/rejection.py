"""Batched chain rejection sampling with residual normalization (DESIGN.md §5.2).

Public functions: :func:`rejection_sample` (padded ``[B, K+1, V]``) and
:func:`rejection_sample_packed` (ragged ``[T + B, V]``). Fake impls for
torch.compile and the Triton launchers live here too.
"""

from __future__ import annotations

import torch

from typing import NamedTuple

from . import _ops, reference
from ._backend import (impl_checks_values, next_pow2, num_sms, resolve_backend, triton_interpreting,
                       values_checked_here)
from ._checks import (call_native, check_bonus_token_ids, check_chain_values, check_cu_values, check_draft_ids,
                      check_greedy, check_index_tensor, check_keyword_values, check_op_rng, check_packed_layout,
                      check_probs, check_rank, check_reject_invalid_drafts, check_synthetic_rates, fail,
                      packed_max_num_draft_tokens, rng_inputs)
from .types import SampleOutput

__all__ = ["rejection_sample", "rejection_sample_packed"]


# ---------------------------------------------------------------------------------------------- checks


class _Checked(NamedTuple):
    """The checked arguments of a chain op (what its kernels read) and its sizes."""

    target_probs: torch.Tensor
    draft_probs: torch.Tensor | None
    seeds: torch.Tensor
    offsets: torch.Tensor
    greedy: torch.Tensor | None
    bonus_token_ids: torch.Tensor | None
    reject_invalid_drafts: bool
    rates: torch.Tensor | None
    max_draft: int
    vocab: int
    total: int  # packed: T, the number of draft tokens (padded: 0)


def _check_rest(target_probs, draft_probs, draft_shape, shape_str, seeds, offsets, greedy, bonus_token_ids,
                reject_invalid_drafts, synthetic_acceptance_rates, batch, max_draft, total, op) -> _Checked:
    """The arguments both layouts share. The wrapper (op=False) normalizes them: seeds=None drawn, int32
    seeds and offsets widened, draft_probs of another dtype than target_probs' read as float32 (copies). The
    Triton ops' impls (op=True) take them as the schema and the C++ ops do (csrc/rejection/rejection_op.cpp
    check_common): int64 seeds and offsets, draft_probs in target_probs' dtype. Metadata only."""
    device = target_probs.device
    target_probs, draft_probs = check_probs(target_probs, draft_probs, draft_shape, shape_str, same_dtype=op)
    seeds, offsets = (check_op_rng if op else rng_inputs)(seeds, offsets, batch, device, "target_probs")
    return _Checked(target_probs, draft_probs, seeds, offsets, check_greedy(greedy, batch, device, "target_probs"),
                    bonus_token_ids, check_reject_invalid_drafts(reject_invalid_drafts),
                    check_synthetic_rates(synthetic_acceptance_rates, max_draft, device, "target_probs"),
                    max_draft, target_probs.shape[-1], total)


def _check_padded(target_probs, draft_token_ids, num_draft_tokens, draft_probs, seeds, offsets, greedy,
                  bonus_token_ids, reject_invalid_drafts, synthetic_acceptance_rates, op=False) -> _Checked:
    """Shapes, dtypes and devices of rejection_sample's arguments, for the wrapper and (op=True) the Triton
    op's impl: _check_rest."""
    check_rank(target_probs, 3, "target_probs", "[B, K+1, V]")
    batch, rows, vocab = target_probs.shape
    device = target_probs.device
    bonus_token_ids = check_bonus_token_ids(bonus_token_ids, batch, device, "target_probs")
    if bonus_token_ids is None:
        if rows < 1:
            fail(f"target_probs must have K+1 >= 1 rows per request, got shape {list(target_probs.shape)}")
        max_draft = rows - 1
    else:  # K from the drafts: the bonus rows are never read, so the target may omit them
        check_rank(draft_token_ids, 2, "draft_token_ids", "[B, K]")
        max_draft = draft_token_ids.shape[1]
        if rows not in (max_draft, max_draft + 1):
            fail(f"target_probs must have K+1 = {max_draft + 1} or K = {max_draft} rows per request when "
                 f"bonus_token_ids is given (K = draft_token_ids.shape[1]), got shape {list(target_probs.shape)}")
    check_index_tensor(draft_token_ids, (batch, max_draft), "draft_token_ids", "[B, K]", device, "target_probs")
    check_index_tensor(num_draft_tokens, (batch,), "num_draft_tokens", "[B]", device, "target_probs")
    return _check_rest(target_probs, draft_probs, (batch, max_draft, vocab), "[B, K, V]", seeds, offsets, greedy,
                       bonus_token_ids, reject_invalid_drafts, synthetic_acceptance_rates, batch, max_draft, 0, op)


def _check_packed(target_probs, cu_num_draft_tokens, draft_token_ids, draft_probs, seeds, offsets, greedy,
                  max_num_draft_tokens, bonus_token_ids, reject_invalid_drafts, synthetic_acceptance_rates,
                  op=False) -> _Checked:
    """Shapes, dtypes and devices of rejection_sample_packed's arguments (as _check_padded);
    max_num_draft_tokens=None (the wrapper's) reads the largest n_b on the host."""
    check_rank(target_probs, 2, "target_probs", "[T + B, V]")
    device = target_probs.device
    batch, total = check_packed_layout(target_probs, "target_probs", cu_num_draft_tokens, draft_token_ids,
                                       bonus_rows_optional=bonus_token_ids is not None)
    bonus_token_ids = check_bonus_token_ids(bonus_token_ids, batch, device, "target_probs")
    max_draft = packed_max_num_draft_tokens(cu_num_draft_tokens, batch, max_num_draft_tokens)
    return _check_rest(target_probs, draft_probs, (total, target_probs.shape[1]), "[T, V]", seeds, offsets, greedy,
                       bonus_token_ids, reject_invalid_drafts, synthetic_acceptance_rates, batch, max_draft, total,
                       op)


def _check_values(a: _Checked, draft_token_ids, lengths, packed: bool) -> None:
    """Value checks (CPU tensors) of a chain op, as the C++ op does them (check_values_cpu): the lengths, the
    used draft ids (unless reject_invalid_drafts or synthetic rates), the bonus ids and the rates."""
    skip_ids = a.reject_invalid_drafts or a.rates is not None
    if packed:
        check_cu_values(lengths, a.total, a.max_draft)
        if not skip_ids:
            check_draft_ids(draft_token_ids, torch.ones_like(draft_token_ids, dtype=torch.bool), a.vocab)
    else:
        check_chain_values(draft_token_ids, lengths, a.max_draft, a.vocab, reject_invalid_drafts=skip_ids)
    check_keyword_values(a.bonus_token_ids, a.rates, a.vocab)


# ---------------------------------------------------------------------------------------------- padded


def rejection_sample(
    target_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    num_draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None = None,
    *,
    seeds: torch.Tensor | None = None,
    offsets: torch.Tensor | None = None,
    greedy: torch.Tensor | None = None,
    backend: str | None = None,
    bonus_token_ids: torch.Tensor | None = None,
    reject_invalid_drafts: bool = False,
    synthetic_acceptance_rates: torch.Tensor | None = None,
) -> SampleOutput:
    """Verify chain drafts losslessly (speculative sampling with residual normalization).

    For request b and k = 0 .. n_b - 1 with x = draft k: accept iff
    ``u_k * q_k(x) < p_k(x)`` (q = 1 at x without ``draft_probs``; greedy: iff x is
    the argmax of p_k, first index on ties). At the first rejection emit a token
    drawn from ``max(p_k - q_k, 0)`` normalized (one-hot: p_k without x; greedy:
    argmax p_k) by an exponential race over the unnormalized residual, and stop;
    if the residual has no mass draw from p_k. If all n_b drafts are accepted,
    emit the bonus token drawn from p_{n_b}. NaN or negative probabilities count
    as zero mass; a row without any mass emits token 0.

    Parameters
    ----------
    target_probs : float32 | float16 | bfloat16 [B, K+1, V]
        Row k is the target distribution p at draft position k; row n_b is the bonus row.
        With ``bonus_token_ids`` also [B, K, V] (no bonus rows; K = draft_token_ids.shape[1]).
    draft_token_ids : int32 | int64 [B, K]
    num_draft_tokens : int32 | int64 [B]
        n_b in 0..K: request b uses draft slots 0..n_b-1 and rows 0..n_b.
    draft_probs : float32 | float16 | bfloat16 [B, K, V], optional
        q at each draft position; None means one-hot drafts (n-gram, greedy drafters).
        A dtype other than target_probs' makes both be read as float32 (a copy).
    seeds, offsets : int64 [B], optional
        Random numbers are a pure function of (seeds[b], offsets[b], position,
        purpose, vocab index) (Philox4x32-10, identical on every backend).
        seeds=None draws one per request from torch's default generator for the
        device (on the host for CPU tensors; on the GPU with torch's CUDA
        generator: no host sync), and is refused under CUDA graph capture;
        offsets=None means 0. Advance offsets by 1 per step for fresh numbers.
        Tensors, not ints, so a CUDA graph can replay with new values.
    greedy : bool [B], optional
        True: argmax verification for that request.
    backend : None | "cuda" | "triton" | "cpu" | "reference"
    bonus_token_ids : int32 | int64 [B] or [B, 1], optional
        The token a request emits after all its n_b drafts are accepted, in place
        of sampling it (greedy: of the argmax), e.g. one sampled by the engine's own
        sampler. The bonus row is then never read, so the target may omit it.
        Every other output and every random number are unchanged. On CPU an id
        outside [0, V) raises; on the GPU it is clamped into [0, V-1].
    reject_invalid_drafts : bool, default False
        True: a draft id outside [0, V) in a used slot (e.g. a -1 placeholder) is
        rejected at its position, with the correction token drawn as for any
        rejection there (the residual over q's full row; one-hot: p_k; greedy:
        argmax p_k), instead of raising on CPU. The GPU always rejects such ids.
    synthetic_acceptance_rates : float32 [R], R >= K, optional
        Benchmarking mode, lossy by design: at position k of every request
        (greedy too) accept a draft id in [0, V) iff the position's acceptance
        uniform u_k < rate[k]; the probabilities play no part in the test. At
        the first rejection the usual correction token, else the bonus token.
        An id outside [0, V) is rejected in this mode, without an error on CPU
        (as with ``reject_invalid_drafts``). On CPU a rate outside [0, 1] (or NaN) raises; on the GPU rates are used
        as given (NaN never accepts).

    Returns
    -------
    SampleOutput(token_ids int64 [B, K+1], num_accepted int32 [B])
        token_ids holds the accepted drafts, then the correction or bonus token,
        then -1. Request b emits num_accepted[b] + 1 tokens.

    On CPU, n_b outside [0, K] and ids out of [0, V) in used slots (unless
    ``reject_invalid_drafts`` or synthetic rates) raise ValueError. On the GPU (no host sync) an
    out-of-range draft id is rejected and n_b is clamped into [0, K].

    Example
    -------
    >>> p = torch.softmax(torch.randn(2, 4, 100), -1)
    >>> out = rejection_sample(p, torch.randint(0, 100, (2, 3)), torch.tensor([3, 1]))
    >>> out.token_ids.shape
    torch.Size([2, 4])
    """
    a = _check_padded(target_probs, draft_token_ids, num_draft_tokens, draft_probs, seeds, offsets, greedy,
                      bonus_token_ids, reject_invalid_drafts, synthetic_acceptance_rates)
    device = target_probs.device
    backend = resolve_backend(backend, device, "rejection_sample", native_op="rejection_sample",
                              triton_op="rejection_sample_triton")

    if values_checked_here(device, backend):  # the reference: the C++ op and the Triton impl check their own
        _check_values(a, draft_token_ids, num_draft_tokens, packed=False)

    if backend == "reference":
        return reference.rejection_sample(a.target_probs, draft_token_ids, num_draft_tokens, a.draft_probs,
                                          seeds=a.seeds, offsets=a.offsets, greedy=a.greedy,
                                          bonus_token_ids=a.bonus_token_ids,
                                          reject_invalid_drafts=a.reject_invalid_drafts,
                                          synthetic_acceptance_rates=a.rates)
    op = torch.ops.specdec.rejection_sample if backend in ("cpu", "cuda") else torch.ops.specdec.rejection_sample_triton
    token_ids, num_accepted = call_native(op.default, a.target_probs, draft_token_ids, num_draft_tokens, a.draft_probs,
                                          a.seeds, a.offsets, a.greedy, a.bonus_token_ids, a.reject_invalid_drafts,
                                          a.rates)
    return SampleOutput(token_ids, num_accepted)


# ---------------------------------------------------------------------------------------------- packed


def rejection_sample_packed(
    target_probs: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None = None,
    *,
    seeds: torch.Tensor | None = None,
    offsets: torch.Tensor | None = None,
    greedy: torch.Tensor | None = None,
    max_num_draft_tokens: int | None = None,
    backend: str | None = None,
    bonus_token_ids: torch.Tensor | None = None,
    reject_invalid_drafts: bool = False,
    synthetic_acceptance_rates: torch.Tensor | None = None,
) -> SampleOutput:
    """:func:`rejection_sample` over a ragged (packed) batch, as engines lay it out.

    Parameters
    ----------
    target_probs : float32 | float16 | bfloat16 [T + B, V]
        Request b owns rows ``cu[b] + b .. cu[b+1] + b``: its n_b draft rows, then its bonus row.
        With ``bonus_token_ids`` also [T, V] (vLLM's layout, read in place): request b owns
        rows ``cu[b] .. cu[b+1] - 1``.
    cu_num_draft_tokens : int32 | int64 [B + 1]
        Exclusive prefix sums of n_b, starting at 0 and ending at T.
    draft_token_ids : int32 | int64 [T]
    draft_probs : float32 | float16 | bfloat16 [T, V], optional
    seeds, offsets, greedy, backend : as in :func:`rejection_sample`.
    max_num_draft_tokens : int, optional
        K, the output width minus one. Give it to keep the output shape fixed
        (CUDA graphs) and avoid reading the largest n_b on the host.
    bonus_token_ids, reject_invalid_drafts, synthetic_acceptance_rates :
        As in :func:`rejection_sample` (synthetic_acceptance_rates: R >= K).

    Returns
    -------
    SampleOutput(token_ids int64 [B, K+1], num_accepted int32 [B]), -1 padded.
    Identical to :func:`rejection_sample` on the same requests and seeds.
    """
    a = _check_packed(target_probs, cu_num_draft_tokens, draft_token_ids, draft_probs, seeds, offsets, greedy,
                      max_num_draft_tokens, bonus_token_ids, reject_invalid_drafts, synthetic_acceptance_rates)
    device = target_probs.device
    backend = resolve_backend(backend, device, "rejection_sample_packed", native_op="rejection_sample_packed",
                              triton_op="rejection_sample_packed_triton")

    if values_checked_here(device, backend):
        _check_values(a, draft_token_ids, cu_num_draft_tokens, packed=True)

    if backend == "reference":
        return reference.rejection_sample_packed(a.target_probs, cu_num_draft_tokens, draft_token_ids, a.draft_probs,
                                                 seeds=a.seeds, offsets=a.offsets, greedy=a.greedy,
                                                 max_num_draft_tokens=a.max_draft,
                                                 bonus_token_ids=a.bonus_token_ids,
                                                 reject_invalid_drafts=a.reject_invalid_drafts,
                                                 synthetic_acceptance_rates=a.rates)
    op = (torch.ops.specdec.rejection_sample_packed if backend in ("cpu", "cuda")
          else torch.ops.specdec.rejection_sample_packed_triton)
    token_ids, num_accepted = call_native(op.default, a.target_probs, cu_num_draft_tokens, draft_token_ids,
                                          a.draft_probs, a.seeds, a.offsets, a.greedy, a.max_draft,
                                          a.bonus_token_ids, a.reject_invalid_drafts, a.rates)
    return SampleOutput(token_ids, num_accepted)


# ---------------------------------------------------------------------------------------------- fakes


def _fake_outputs(target_probs, batch, max_draft):
    return (target_probs.new_empty((batch, max_draft + 1), dtype=torch.int64),
            target_probs.new_empty((batch,), dtype=torch.int32))


def _fake_padded(target_probs, draft_token_ids, num_draft_tokens, draft_probs, seeds, offsets, greedy,
                 bonus_token_ids=None, reject_invalid_drafts=False, synthetic_acceptance_rates=None):
    torch._check(target_probs.dim() == 3, lambda: "target_probs must be 3-D [B, K+1, V]")
    torch._check(draft_token_ids.dim() == 2, lambda: "draft_token_ids must be 2-D [B, K]")
    return _fake_outputs(target_probs, target_probs.shape[0], draft_token_ids.shape[1])


def _fake_packed(target_probs, cu_num_draft_tokens, draft_token_ids, draft_probs, seeds, offsets, greedy,
                 max_num_draft_tokens, bonus_token_ids=None, reject_invalid_drafts=False,
                 synthetic_acceptance_rates=None):
    torch._check(target_probs.dim() == 2, lambda: "target_probs must be 2-D [T + B, V]")
    return _fake_outputs(target_probs, cu_num_draft_tokens.shape[0] - 1, max_num_draft_tokens)


# ---------------------------------------------------------------------------------------------- triton


# Programs per SM the split chain kernel is sized for, as csrc/common/vocab_split.h vocab_parts_for sizes the
# CUDA kernel: parts per request so that the batch fills the device in one wave. 4 warps each at <= 96
# registers keep 5 resident per SM. The launcher caps them there (ptxas .maxnreg): with the exact block size
# (.reqntid) alone, ptxas trades registers for occupancy and spills (7 per SM at 72 registers).
_TRITON_PROGRAMS_PER_SM = 5
_TRITON_MAXNREG = 96
_TRITON_MAX_PARTS = 256  # merge width bound (PARTS_BLOCK)


def _triton_block(vocab: int) -> int:
    """Vocab tile of rejection_sample_kernel: a multiple of 4 (its race holds whole Philox quads: quad_masses)."""
    return max(4, min(next_pow2(vocab), 8192 if triton_interpreting() else 1024))


def _triton_parts(batch: int, tiles: int, resident: int, parts: int | None = None) -> tuple[int, int]:
    """(parts per request, tiles per part) of rejection_sample_kernel for a row of `tiles` tiles: `parts`
    when given, else resident // batch (vocab_parts_for's rule), at least 1, at most one tile per part;
    then as few parts as cover the row with that many tiles each (no empty part)."""
    if parts is None:
        parts = resident // batch if batch > 0 else 1
    parts = max(1, min(parts, tiles, _TRITON_MAX_PARTS))
    per_part = -(-tiles // parts)
    return -(-tiles // per_part), per_part


def _interpreter_needs_while_loops() -> bool:
    """Triton before 3.8 interprets a runtime range() bound with int() of a 1-element array, which numpy >= 2.4
    refuses: the kernel then loops over its slice with `while` (the compiled kernel keeps `for`)."""
    import triton

    major, minor = (int(x) for x in triton.__version__.split(".")[:2])
    return triton_interpreting() and (major, minor) < (3, 8)


def _launch_triton(target_probs, draft_token_ids, lengths, draft_probs, seeds, offsets, greedy, bonus_token_ids,
                   rates, batch, max_draft, packed, bonus_rows, parts=None, block=None, while_loops=None):
    """Launch rejection_sample_kernel on grid (B, parts). `parts`, `block` and `while_loops` override the
    launcher's choices (tests: several parts under the interpreter, the while-loop form)."""
    from .triton_kernels.rejection import rejection_sample_kernel

    token_ids, num_accepted = _fake_outputs(target_probs, batch, max_draft)
    if batch == 0:
        return token_ids, num_accepted
    target = target_probs.contiguous()
    ids = draft_token_ids.contiguous().to(torch.int64)
    vocab = target.shape[-1]
    block = block or _triton_block(vocab)
    assert block % 4 == 0 and block & (block - 1) == 0, "the vocab tile must be a power of two >= 4"
    tiles = -(-vocab // block)
    if triton_interpreting() or target.device.type != "cuda":
        resident = 2 * batch  # the interpreter runs programs one by one: at most 2 parts by default
    else:
        resident = num_sms(target.device) * _TRITON_PROGRAMS_PER_SM
    num_parts, tiles_per_part = _triton_parts(batch, tiles, resident, parts)
    # Per-call workspace: partials [B, K+1, parts] and a ticket counter per request (zeroed on the stream).
    scores = target.new_empty((batch, max_draft + 1, num_parts), dtype=torch.float32)
    index = target.new_empty((batch, max_draft + 1, num_parts), dtype=torch.int32)
    counters = target.new_zeros((batch,), dtype=torch.int32)
    if bonus_token_ids is not None:
        bonus_token_ids = bonus_token_ids.reshape(batch).contiguous()
    rejection_sample_kernel[(batch, num_parts)](
        target, target if draft_probs is None else draft_probs.contiguous(), ids,
        lengths.contiguous().to(torch.int64), seeds.contiguous(), offsets.contiguous(),
        seeds if greedy is None else greedy.contiguous(), token_ids, num_accepted,
        seeds if bonus_token_ids is None else bonus_token_ids,
        target if rates is None else rates.contiguous(),
        scores, index, counters,
        vocab, max_draft, ids.numel(), tiles_per_part, num_parts,
        PACKED=packed, HAS_DRAFT_PROBS=draft_probs is not None, HAS_GREEDY=greedy is not None,
        HAS_BONUS_IDS=bonus_token_ids is not None, BONUS_ROWS=bonus_rows, SYNTHETIC=rates is not None,
        BLOCK_K=next_pow2(max_draft + 1), BLOCK=block,
        PARTS_BLOCK=next_pow2(min(tiles, _TRITON_MAX_PARTS)),
        WHILE_LOOPS=_interpreter_needs_while_loops() if while_loops is None else while_loops,
        num_warps=4, maxnreg=_TRITON_MAXNREG,
    )
    return token_ids, num_accepted


def _triton_padded(target_probs, draft_token_ids, num_draft_tokens, draft_probs, seeds, offsets, greedy,
                   bonus_token_ids=None, reject_invalid_drafts=False, synthetic_acceptance_rates=None, **launch):
    """specdec::rejection_sample_triton: the C++ op's checks (shapes, dtypes and devices always; index values on
    CPU tensors: _check_values), then the launch. On the GPU the kernel rejects an id outside the vocabulary
    wherever it is, whatever reject_invalid_drafts says (it only governs the CPU value check)."""
    a = _check_padded(target_probs, draft_token_ids, num_draft_tokens, draft_probs, seeds, offsets, greedy,
                      bonus_token_ids, reject_invalid_drafts, synthetic_acceptance_rates, op=True)
    if impl_checks_values(target_probs.device):
        _check_values(a, draft_token_ids, num_draft_tokens, packed=False)
    return _launch_triton(target_probs, draft_token_ids, num_draft_tokens, draft_probs, seeds, offsets, greedy,
                          a.bonus_token_ids, a.rates, target_probs.shape[0], a.max_draft, packed=False,
                          bonus_rows=a.bonus_token_ids is None or target_probs.shape[1] == a.max_draft + 1, **launch)


def _triton_packed(target_probs, cu_num_draft_tokens, draft_token_ids, draft_probs, seeds, offsets, greedy,
                   max_num_draft_tokens, bonus_token_ids=None, reject_invalid_drafts=False,
                   synthetic_acceptance_rates=None, **launch):
    """specdec::rejection_sample_packed_triton: the C++ op's checks (as _triton_padded), then the launch."""
    a = _check_packed(target_probs, cu_num_draft_tokens, draft_token_ids, draft_probs, seeds, offsets, greedy,
                      max_num_draft_tokens, bonus_token_ids, reject_invalid_drafts, synthetic_acceptance_rates,
                      op=True)
    if impl_checks_values(target_probs.device):
        _check_values(a, draft_token_ids, cu_num_draft_tokens, packed=True)
    batch = cu_num_draft_tokens.shape[0] - 1
    return _launch_triton(target_probs, draft_token_ids, cu_num_draft_tokens, draft_probs, seeds, offsets, greedy,
                          a.bonus_token_ids, a.rates, batch, a.max_draft, packed=True,
                          bonus_rows=target_probs.shape[0] == a.total + batch, **launch)


if _ops.native_loaded():
    torch.library.register_fake("specdec::rejection_sample")(_fake_padded)
    torch.library.register_fake("specdec::rejection_sample_triton")(_fake_padded)
    torch.library.register_fake("specdec::rejection_sample_packed")(_fake_packed)
    torch.library.register_fake("specdec::rejection_sample_packed_triton")(_fake_packed)
    torch.library.impl("specdec::rejection_sample_triton", ("CPU", "CUDA"))(_triton_padded)
    torch.library.impl("specdec::rejection_sample_packed_triton", ("CPU", "CUDA"))(_triton_packed)
