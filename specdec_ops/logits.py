"""Verification straight from logits (DESIGN.md §5.7): per-request temperature, top-k,
top-p and min-p, and the log-probability of every emitted token.

Public functions: :func:`process_logits` (the processed distribution as a function: the
definition the fused ops equal), :func:`rejection_sample_logits` (padded),
:func:`rejection_sample_logits_packed` (ragged) and :func:`tree_rejection_sample_logits`.
Fake impls for torch.compile live here too.

The processed distribution of a row of logits l for a request with temperature T > 0,
each step renormalizing what it keeps: (1) p = softmax(l / T), NaN logits counting as
-inf (+inf as the largest finite float32, so several +inf share the mass); (2) top-k
keeps p_i >= the k-th largest p (ties kept); (3) top-p keeps p_i >= t, t the largest value
whose kept mass is >= top_p (the smallest set of most likely entries reaching top_p, ties
kept); (4) min-p keeps p_i >= min_p * max(p). T = 0 is greedy: argmax of the raw logits,
first index on ties (process_logits returns the one-hot row of that index; the filters
are ignored). A row without a finite logit has no mass (all zeros).

The kernels compute this on z = (x - max x) / T (csrc/logits/logits_math.h): every
filter is a threshold on z found by a radix select over the order-preserving bits of the
float values (count and mass histograms, 4 passes of 8 bits; Triton: 4 bits a pass over the raw
logits' keys, 4 passes for bfloat16, 5 for float16, 8 for float32; no sort); probabilities are
never written out. The verification is then exactly §5.2 / §5.3 with the random numbers
of §5.1, so ``rejection_sample_logits(l, ...)`` equals
``rejection_sample(process_logits(l, ...), ..., greedy=temperature == 0)`` for the same
seeds, token for token (floating-point near-ties aside).

Bad parameter values (temperature < 0 or NaN, top_k < 0, top_p outside (0, 1], min_p
outside [0, 1)) raise SpecDecArgumentError naming the argument on CPU tensors. On the GPU
(no host sync) they are clamped: temperature <= 0 or NaN is greedy, +inf is the largest
float; top_k < 0 is off; top_p NaN or > 1 is off, <= 0 keeps the most likely value only;
min_p NaN or < 0 is off, >= 1 keeps the most likely value only.

The chain ops take the engine keywords of issue #14 (the same as the probability ops):
``bonus_token_ids`` (emitted after a fully accepted chain instead of sampling; the bonus rows are
then never read and may be omitted; the logprob of such a token is NaN), ``reject_invalid_drafts``
(a draft id outside [0, V), such as vLLM's -1 placeholder, is rejected at its position instead of
raising on CPU) and ``synthetic_acceptance_rates`` (benchmarking: accept draft k iff u_k < rate[k]).
"""

from __future__ import annotations

import numbers
from typing import NamedTuple

import torch

from . import _ops, reference
from ._backend import (impl_checks_values, next_pow2, num_sms, resolve_backend, triton_interpreting,
                       values_checked_here)
from ._checks import (INDEX_DTYPES, PROB_DTYPES, call_native, check_bonus_token_ids, check_chain_values,
                      check_cu_values, check_device, check_draft_ids, check_dtype, check_index_tensor,
                      check_keyword_values, check_op_rng, check_packed_layout, check_rank, check_reject_invalid_drafts,
                      check_shape, check_synthetic_rates, check_tensor, check_tree_inputs, check_tree_values, fail,
                      first_bad, packed_max_num_draft_tokens, rng_inputs)
from .types import LogitsSampleOutput, LogitsTreeSampleOutput

__all__ = ["process_logits", "rejection_sample_logits", "rejection_sample_logits_packed",
           "tree_rejection_sample_logits"]


# ---------------------------------------------------------------------------------------------- checks

# name -> (dtype the kernels read, what a valid value is, the predicate of a bad value)
TOP_P_SLACK = 2.0 ** -20  # top-p reaches top_p * (1 - slack) of the mass (csrc/logits/logits_math.h kTopPSlack)

_PARAMS = {
    "temperature": (torch.float32, ">= 0 (0 = greedy) and not NaN", lambda v: ~(v >= 0)),
    "top_k": (torch.int64, ">= 0 (0 = off)", lambda v: v < 0),
    "top_p": (torch.float32, "in (0, 1] (1 = off)", lambda v: ~((v > 0) & (v <= 1))),
    "min_p": (torch.float32, "in [0, 1) (0 = off)", lambda v: ~((v >= 0) & (v < 1))),
}


_INT64_MAX = 2 ** 63 - 1


def _top_k_value(v):
    """A Python int top_k as int64 holds it: >= V is off, so any int beyond int64 is too."""
    return min(int(v), _INT64_MAX) if isinstance(v, numbers.Integral) and not isinstance(v, bool) else v


_PARAM_NAMES = ("temperature", "top_k", "top_p", "min_p")


def _sampling_param(value, name: str, batch: int, device: torch.device, ref_name: str, op: bool = False):
    """A sampling parameter as the kernels read it: None, or a [B] tensor of the kernel dtype
    on `device`. The wrappers (op=False) take Python numbers (one value for every request, checked
    here on any device), lists, and tensors of any integer (top_k) or floating dtype (converted);
    the ops (op=True) tensors of the kernel dtype only (csrc/logits/logits_op.cpp check_param).
    Tensor values are checked apart (_check_param_values), on CPU tensors only."""
    if value is None:
        return None
    dtype, valid, bad_value = _PARAMS[name]
    if not op and isinstance(value, (numbers.Number, bool)) and not isinstance(value, torch.Tensor):
        if isinstance(value, bool):  # True would read as 1 (top_k 1, temperature 1.0): a caller's mistake
            fail(f"{name} must be a number or a tensor [B], got the bool {value!r}")
        if name == "top_k" and not isinstance(value, numbers.Integral):
            fail(f"top_k must be an int or an integer tensor [B], got {value!r}")
        if name == "top_k":
            value = _top_k_value(value)
        if bool(bad_value(torch.tensor(float(value)))):
            fail(f"{name} = {value!r} must be {valid}")
        return torch.full((batch,), value, dtype=dtype, device=device)
    if not op and isinstance(value, (list, tuple)):
        if name == "top_k":
            value = [_top_k_value(v) for v in value]
        value = torch.tensor(value, device=device)
    check_tensor(value, name)
    check_shape(value, (batch,), name, "[B]")
    if op:
        check_dtype(value, (dtype,), name)
    elif name == "top_k":
        check_dtype(value, INDEX_DTYPES, name)
    elif not value.is_floating_point():
        fail(f"{name} must be a floating-point tensor [B], got dtype {str(value.dtype).replace('torch.', '')}")
    check_device(value, device, name, ref_name)
    return value if op else value.to(dtype).contiguous()


def _sampling(temperature, top_k, top_p, min_p, batch, device, ref_name, op=False, values=None):
    """The four sampling parameters (_sampling_param); `values` (default: values_checked_here(device), as
    specdec_ops.distributed relies on) also checks the tensors' values (_check_param_values)."""
    params = tuple(_sampling_param(v, n, batch, device, ref_name, op)
                   for v, n in zip((temperature, top_k, top_p, min_p), _PARAM_NAMES))
    if values_checked_here(device) if values is None else values:
        _check_param_values(params)
    return params


def _check_param_values(params) -> None:
    """Value checks (CPU tensors) of the sampling parameters in the kernels' dtypes, as the C++ ops do them
    (check_param_values_cpu; on the GPU the kernels clamp)."""
    for value, name in zip(params, _PARAM_NAMES):
        if value is None:
            continue
        _, valid, bad_value = _PARAMS[name]
        bad = first_bad(bad_value(value.double() if name != "top_k" else value))
        if bad is not None:
            fail(f"{name}[{bad[0]}] = {value[bad].item()} must be {valid}")


def _check_logits(logits, name):
    check_tensor(logits, name)
    check_dtype(logits, PROB_DTYPES, name)
    if logits.dim() >= 1 and logits.shape[-1] == 0:
        fail(f"{name} must have a non-empty vocab dimension V")


def _check_draft_probs(draft_probs, target_logits, shape, shape_str, op=False):
    """draft_probs in the logits' dtype or float32 are read as they are; the wrappers read any other
    dtype as float32 (a copy), the ops refuse it (csrc/logits/logits_op.cpp check_draft)."""
    if draft_probs is None:
        return None
    check_shape(draft_probs, shape, "draft_probs", shape_str)
    check_dtype(draft_probs, PROB_DTYPES, "draft_probs")
    check_device(draft_probs, target_logits.device, "draft_probs", "target_logits")
    if draft_probs.dtype not in (target_logits.dtype, torch.float32):
        if op:
            fail(f"draft_probs must be float32 or the dtype of target_logits ({target_logits.dtype}), got "
                 f"{draft_probs.dtype}")
        draft_probs = draft_probs.float()
    return draft_probs


def _check_process(logits, temperature, top_k, top_p, min_p, op=False):
    """Shapes, dtypes and devices of process_logits' arguments (op=True: the Triton op's, as the C++ op checks
    them). Returns the parameters (_sampling_param)."""
    _check_logits(logits, "logits")
    if logits.dim() < 2:
        fail(f"logits must be at least 2-D [R, ..., V], got shape {tuple(logits.shape)}")
    return _sampling(temperature, top_k, top_p, min_p, logits.shape[0], logits.device, "logits", op, values=False)


class _Checked(NamedTuple):
    """The checked arguments of a verification op (what its kernels read) and its sizes."""

    draft_probs: torch.Tensor | None
    params: tuple  # (temperature, top_k, top_p, min_p)
    seeds: torch.Tensor
    offsets: torch.Tensor
    bonus_token_ids: torch.Tensor | None
    rates: torch.Tensor | None
    max_draft: int  # chain: K; tree: N - 1
    vocab: int
    total: int  # packed: T, the number of draft tokens (else 0)


def _check_rest(target_logits, draft_probs, draft_shape, shape_str, temperature, top_k, top_p, min_p, seeds,
                offsets, bonus_token_ids, rates, batch, max_draft, total, op) -> _Checked:
    """The arguments every verification op shares. The wrappers (op=False) normalize them (Python numbers,
    seeds=None drawn, int32 widened, draft_probs of another dtype read as float32); the Triton ops' impls
    (op=True) take them as the schema and the C++ ops do (csrc/logits/logits_op.cpp): parameters in the kernels'
    dtypes, int64 seeds and offsets. Metadata only."""
    device = target_logits.device
    draft_probs = _check_draft_probs(draft_probs, target_logits, draft_shape, shape_str, op)
    rates = check_synthetic_rates(rates, max_draft, device, "target_logits")
    params = _sampling(temperature, top_k, top_p, min_p, batch, device, "target_logits", op, values=False)
    seeds, offsets = (check_op_rng if op else rng_inputs)(seeds, offsets, batch, device, "target_logits")
    return _Checked(draft_probs, params, seeds, offsets, bonus_token_ids, rates, max_draft, target_logits.shape[-1],
                    total)


def _check_padded(target_logits, draft_token_ids, num_draft_tokens, draft_probs, temperature, top_k, top_p, min_p,
                  seeds, offsets, bonus_token_ids, rates, op=False) -> _Checked:
    """Shapes, dtypes and devices of rejection_sample_logits' arguments (wrapper and, op=True, Triton op)."""
    check_rank(target_logits, 3, "target_logits", "[B, K+1, V]")
    _check_logits(target_logits, "target_logits")
    batch, rows, vocab = target_logits.shape
    device = target_logits.device
    bonus_token_ids = check_bonus_token_ids(bonus_token_ids, batch, device, "target_logits")
    max_draft = rows - 1
    if (bonus_token_ids is not None and isinstance(draft_token_ids, torch.Tensor) and draft_token_ids.dim() == 2
            and draft_token_ids.shape[1] == rows):
        max_draft = rows  # [B, K, V]: no bonus rows (never read with external bonus tokens)
    if max_draft < 0:
        fail(f"target_logits must have K+1 >= 1 rows per request, got shape {list(target_logits.shape)}")
    if (bonus_token_ids is None and isinstance(draft_token_ids, torch.Tensor) and draft_token_ids.dim() == 2
            and draft_token_ids.shape[1] == rows):
        fail(f"target_logits must have K+1 = {rows + 1} rows per request for draft_token_ids [B, K = {rows}] (the "
             f"bonus rows may be omitted only when bonus_token_ids is given), got shape {list(target_logits.shape)}")
    check_index_tensor(draft_token_ids, (batch, max_draft), "draft_token_ids", "[B, K]", device, "target_logits")
    check_index_tensor(num_draft_tokens, (batch,), "num_draft_tokens", "[B]", device, "target_logits")
    return _check_rest(target_logits, draft_probs, (batch, max_draft, vocab), "[B, K, V]", temperature, top_k, top_p,
                       min_p, seeds, offsets, bonus_token_ids, rates, batch, max_draft, 0, op)


def _check_packed(target_logits, cu_num_draft_tokens, draft_token_ids, draft_probs, temperature, top_k, top_p, min_p,
                  seeds, offsets, max_num_draft_tokens, bonus_token_ids, rates, op=False) -> _Checked:
    """Shapes, dtypes and devices of rejection_sample_logits_packed's arguments (as _check_padded);
    max_num_draft_tokens=None (the wrapper's) reads the largest n_b on the host."""
    check_rank(target_logits, 2, "target_logits", "[T + B, V]")
    _check_logits(target_logits, "target_logits")
    device = target_logits.device
    batch, total = check_packed_layout(target_logits, "target_logits", cu_num_draft_tokens, draft_token_ids,
                                       bonus_rows_optional=bonus_token_ids is not None)
    bonus_token_ids = check_bonus_token_ids(bonus_token_ids, batch, device, "target_logits")
    max_draft = packed_max_num_draft_tokens(cu_num_draft_tokens, batch, max_num_draft_tokens)
    return _check_rest(target_logits, draft_probs, (total, target_logits.shape[1]), "[T, V]", temperature, top_k,
                       top_p, min_p, seeds, offsets, bonus_token_ids, rates, batch, max_draft, total, op)


def _check_tree(target_logits, tree_token_ids, parents, num_nodes, draft_probs, temperature, top_k, top_p, min_p,
                seeds, offsets, op=False) -> _Checked:
    """Shapes, dtypes and devices of tree_rejection_sample_logits' arguments (as _check_padded)."""
    check_rank(target_logits, 3, "target_logits", "[B, N, V]")
    _check_logits(target_logits, "target_logits")
    batch, nodes, vocab = target_logits.shape
    if nodes < 1:
        fail(f"target_logits must have N >= 1 nodes (node 0 is the root), got shape {list(target_logits.shape)}")
    check_tree_inputs(tree_token_ids, parents, num_nodes, batch, nodes, target_logits.device, "target_logits")
    return _check_rest(target_logits, draft_probs, (batch, nodes, vocab), "[B, N, V]", temperature, top_k, top_p,
                       min_p, seeds, offsets, None, None, batch, nodes - 1, 0, op)


_check_engine_values = check_keyword_values  # (specdec_ops.distributed's name for it)


def _check_used_draft_ids(a: _Checked, draft_token_ids, lengths, packed: bool) -> None:
    """Value check (CPU tensors): the used draft ids lie in the vocabulary. The wrappers' alone: the ops do not
    check them (the kernels reject such an id; reject_invalid_drafts is no op argument)."""
    used = (torch.ones_like(draft_token_ids, dtype=torch.bool) if packed
            else torch.arange(a.max_draft) < lengths[:, None])
    check_draft_ids(draft_token_ids, used, a.vocab)


def _check_chain_values(a: _Checked, draft_token_ids, lengths, packed: bool, draft_ids: bool) -> None:
    """Value checks (CPU tensors) of a chain op: the parameters, the lengths and the engine keywords, as the C++
    ops do them (csrc/logits/logits_op.cpp), and with `draft_ids` the used draft ids."""
    _check_param_values(a.params)
    if packed:
        check_cu_values(lengths, a.total, a.max_draft)
    else:  # the lengths only
        check_chain_values(draft_token_ids, lengths, a.max_draft, a.vocab, reject_invalid_drafts=True)
    if draft_ids:
        _check_used_draft_ids(a, draft_token_ids, lengths, packed)
    check_keyword_values(a.bonus_token_ids, a.rates, a.vocab)


def _wrapper_values(a: _Checked, draft_token_ids, lengths, packed: bool, reject_invalid_drafts: bool,
                    device: torch.device, backend: str) -> None:
    """A chain wrapper's value checks (CPU tensors, not while tracing): every value for the reference backend,
    the draft ids alone for the ops, which check the rest themselves."""
    draft_ids = not (reject_invalid_drafts or a.rates is not None)
    if values_checked_here(device, backend):
        _check_chain_values(a, draft_token_ids, lengths, packed, draft_ids)
    elif draft_ids and values_checked_here(device):
        _check_used_draft_ids(a, draft_token_ids, lengths, packed)


def _check_tree_values(a: _Checked, tree_token_ids, parents, num_nodes) -> None:
    """Value checks (CPU tensors) of the tree op, as the C++ op does them: the parameters, then the tree."""
    _check_param_values(a.params)
    check_tree_values(tree_token_ids, parents, num_nodes, a.vocab)


# The logits ops that have a Triton kernel (specdec::<op>_triton), fixed at import.
_TRITON_OPS = frozenset(op for op in ("process_logits", "rejection_sample_logits", "rejection_sample_logits_packed",
                                      "tree_rejection_sample_logits")
                        if _ops.native_loaded() and hasattr(torch.ops.specdec, op + "_triton"))


def _backend(backend, device, op):
    return resolve_backend(backend, device, op, native_op=op, triton_op=op + "_triton" if op in _TRITON_OPS else None)


# ---------------------------------------------------------------------------------------------- process_logits


def process_logits(
    logits: torch.Tensor,
    temperature=None,
    top_k=None,
    top_p=None,
    min_p=None,
    *,
    backend: str | None = None,
) -> torch.Tensor:
    """The processed distribution of every row of logits (DESIGN.md §5.7), as float32 probabilities.

    Parameters
    ----------
    logits : float32 | float16 | bfloat16 [R, ..., V]
        Raw logits; the sampling parameters index dim 0 (every row logits[r, ...] uses request r's).
    temperature : float32 [R] | float | None
        0 = greedy: the row is one-hot at the argmax of the raw logits (first index on ties) and the
        filters are ignored. None = 1.0 for every row.
    top_k : int [R] | int | None
        Keep the entries with p_i >= the k-th largest p (ties kept); 0 or >= V = off.
    top_p : float32 [R] | float | None
        Keep the smallest set of most likely entries whose mass reaches top_p (ties kept); 1 = off.
    min_p : float32 [R] | float | None
        Keep p_i >= min_p * max(p); 0 = off.
    backend : None | "cuda" | "triton" | "cpu" | "reference"

    Returns
    -------
    float32 tensor of the shape of logits: p after temperature, top-k, top-p and min-p, each step
    renormalized. A row without a finite logit is all zeros.

    Example
    -------
    >>> probs = process_logits(torch.randn(2, 3, 100), temperature=torch.tensor([0.7, 0.0]), top_p=0.9)
    >>> probs.shape
    torch.Size([2, 3, 100])
    """
    params = _check_process(logits, temperature, top_k, top_p, min_p)
    device = logits.device
    backend = _backend(backend, device, "process_logits")
    if values_checked_here(device, backend):  # the reference: the C++ op and the Triton impl check their own
        _check_param_values(params)
    if backend == "reference":
        return reference.process_logits(logits, *params)
    op = torch.ops.specdec.process_logits if backend in ("cpu", "cuda") else torch.ops.specdec.process_logits_triton
    return call_native(op.default, logits, *params)


# ---------------------------------------------------------------------------------------------- chain


def _logprobs_out(logprobs, return_logprobs):
    return logprobs if return_logprobs else None


def _engine_args(a):
    """The trailing op arguments of the engine keywords: none when both are off (the schema defaults)."""
    return () if a.bonus_token_ids is None and a.rates is None else (a.bonus_token_ids, a.rates)


def rejection_sample_logits(
    target_logits: torch.Tensor,
    draft_token_ids: torch.Tensor,
    num_draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None = None,
    *,
    temperature=None,
    top_k=None,
    top_p=None,
    min_p=None,
    seeds: torch.Tensor | None = None,
    offsets: torch.Tensor | None = None,
    return_logprobs: bool = False,
    bonus_token_ids: torch.Tensor | None = None,
    reject_invalid_drafts: bool = False,
    synthetic_acceptance_rates: torch.Tensor | None = None,
    backend: str | None = None,
) -> LogitsSampleOutput:
    """Verify chain drafts losslessly from the target's raw logits, with per-request sampling parameters.

    Equals ``rejection_sample(process_logits(target_logits, temperature, top_k, top_p, min_p),
    draft_token_ids, num_draft_tokens, draft_probs, seeds=seeds, offsets=offsets,
    greedy=temperature == 0)`` token for token (floating-point near-ties aside), without writing
    the probabilities: each row is processed only when verification reaches it.

    Parameters
    ----------
    target_logits : float32 | float16 | bfloat16 [B, K+1, V] (or [B, K, V] with bonus_token_ids)
        Row k: the target's logits at draft position k; row n_b is request b's bonus row (never
        read when bonus_token_ids is given, so the target may omit it).
    draft_token_ids : int32 | int64 [B, K]
    num_draft_tokens : int32 | int64 [B]
        n_b in 0..K.
    draft_probs : float32 | float16 | bfloat16 [B, K, V], optional
        The drafter's processed distribution (the same sampling parameters); None = one-hot drafts.
    temperature, top_k, top_p, min_p : [B] tensors, Python numbers (every request) or None
        As in :func:`process_logits`; greedy (temperature 0) and sampled requests mix in one batch.
    seeds, offsets : int64 [B], optional
        The random numbers of §5.1 (as in rejection_sample).
    return_logprobs : bool
        Also return the log-probability of every emitted token.
    bonus_token_ids : int32 | int64 [B] or [B, 1], optional
        The engine's own bonus tokens: a request whose n_b drafts are all accepted emits
        bonus_token_ids[b] at slot n_b instead of sampling one (greedy: instead of the argmax); its
        logprob is NaN. The random numbers of every other slot are unchanged. An id outside [0, V)
        raises on CPU and is clamped into [0, V-1] on the GPU.
    reject_invalid_drafts : bool
        True: a draft id outside [0, V) in a used slot (e.g. vLLM's -1 placeholder) is rejected at its
        position, the correction drawn as for any rejection there (no error on CPU). False: CPU raises
        on such ids; the GPU rejects them.
    synthetic_acceptance_rates : float32 [R], R >= K, optional
        Benchmarking mode (lossy): at position k of every request accept a valid draft iff u_k < rate[k]
        (u_k the §5.1 acceptance uniform; greedy requests too), an invalid id is rejected; then the usual
        correction or bonus token. Rates outside [0, 1] raise on CPU; on the GPU they are used as given
        (NaN never accepts).
    backend : None | "cuda" | "triton" | "cpu" | "reference"

    Returns
    -------
    LogitsSampleOutput(token_ids int64 [B, K+1], num_accepted int32 [B], logprobs float32 [B, K+1] or None)
        token_ids and num_accepted as in rejection_sample (-1 padded). logprobs[b, i] is
        log p(token_ids[b, i]) under the processed target distribution of the row that emitted it
        (greedy requests: log_softmax of the raw logits); NaN at padding and at an external bonus token.

    Example
    -------
    >>> logits = torch.randn(2, 4, 100)
    >>> out = rejection_sample_logits(logits, torch.randint(0, 100, (2, 3)), torch.tensor([3, 1]),
    ...                               temperature=torch.tensor([0.8, 0.0]), top_p=0.95, return_logprobs=True)
    >>> out.logprobs.shape
    torch.Size([2, 4])
    """
    reject_invalid_drafts = check_reject_invalid_drafts(reject_invalid_drafts)
    a = _check_padded(target_logits, draft_token_ids, num_draft_tokens, draft_probs, temperature, top_k, top_p,
                      min_p, seeds, offsets, bonus_token_ids, synthetic_acceptance_rates)
    device = target_logits.device
    backend = _backend(backend, device, "rejection_sample_logits")
    _wrapper_values(a, draft_token_ids, num_draft_tokens, False, reject_invalid_drafts, device, backend)

    if backend == "reference":
        return LogitsSampleOutput(*reference.rejection_sample_logits(
            target_logits, draft_token_ids, num_draft_tokens, a.draft_probs, temperature=a.params[0],
            top_k=a.params[1], top_p=a.params[2], min_p=a.params[3], seeds=a.seeds, offsets=a.offsets,
            return_logprobs=return_logprobs, bonus_token_ids=a.bonus_token_ids, synthetic_acceptance_rates=a.rates))
    op = (torch.ops.specdec.rejection_sample_logits if backend in ("cpu", "cuda")
          else torch.ops.specdec.rejection_sample_logits_triton)
    token_ids, num_accepted, logprobs = call_native(op.default, target_logits, draft_token_ids, num_draft_tokens,
                                                    a.draft_probs, *a.params, a.seeds, a.offsets,
                                                    bool(return_logprobs), *_engine_args(a))
    return LogitsSampleOutput(token_ids, num_accepted, _logprobs_out(logprobs, return_logprobs))


def rejection_sample_logits_packed(
    target_logits: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None = None,
    *,
    temperature=None,
    top_k=None,
    top_p=None,
    min_p=None,
    seeds: torch.Tensor | None = None,
    offsets: torch.Tensor | None = None,
    return_logprobs: bool = False,
    max_num_draft_tokens: int | None = None,
    bonus_token_ids: torch.Tensor | None = None,
    reject_invalid_drafts: bool = False,
    synthetic_acceptance_rates: torch.Tensor | None = None,
    backend: str | None = None,
) -> LogitsSampleOutput:
    """:func:`rejection_sample_logits` over a ragged (packed) batch.

    Parameters
    ----------
    target_logits : float32 | float16 | bfloat16 [T + B, V] (or [T, V] with bonus_token_ids)
        Request b owns rows ``cu[b] + b .. cu[b+1] + b``: its n_b draft rows, then its bonus row. With
        bonus_token_ids the bonus rows are never read and may be omitted: [T, V], request b owning rows
        ``cu[b] .. cu[b+1] - 1`` (vLLM's layout; decided by the row count, read in place).
    cu_num_draft_tokens : int32 | int64 [B + 1]
        Exclusive prefix sums of n_b, starting at 0 and ending at T.
    draft_token_ids : int32 | int64 [T]
    draft_probs : float32 | float16 | bfloat16 [T, V], optional
    temperature, top_k, top_p, min_p : per request [B] (not per row), numbers or None.
    seeds, offsets, return_logprobs, backend : as in :func:`rejection_sample_logits`.
    max_num_draft_tokens : int, optional
        K, the output width minus one; give it to keep shapes fixed (CUDA graphs) and avoid a host read.
    bonus_token_ids, reject_invalid_drafts, synthetic_acceptance_rates :
        As in :func:`rejection_sample_logits` (synthetic rates: R >= max_num_draft_tokens).

    Returns
    -------
    LogitsSampleOutput(token_ids int64 [B, K+1], num_accepted int32 [B], logprobs float32 [B, K+1] or None),
    identical to :func:`rejection_sample_logits` on the same requests and seeds.
    """
    reject_invalid_drafts = check_reject_invalid_drafts(reject_invalid_drafts)
    a = _check_packed(target_logits, cu_num_draft_tokens, draft_token_ids, draft_probs, temperature, top_k, top_p,
                      min_p, seeds, offsets, max_num_draft_tokens, bonus_token_ids, synthetic_acceptance_rates)
    device = target_logits.device
    backend = _backend(backend, device, "rejection_sample_logits_packed")
    _wrapper_values(a, draft_token_ids, cu_num_draft_tokens, True, reject_invalid_drafts, device, backend)

    if backend == "reference":
        return LogitsSampleOutput(*reference.rejection_sample_logits_packed(
            target_logits, cu_num_draft_tokens, draft_token_ids, a.draft_probs, temperature=a.params[0],
            top_k=a.params[1], top_p=a.params[2], min_p=a.params[3], seeds=a.seeds, offsets=a.offsets,
            return_logprobs=return_logprobs, max_num_draft_tokens=a.max_draft,
            bonus_token_ids=a.bonus_token_ids, synthetic_acceptance_rates=a.rates))
    op = (torch.ops.specdec.rejection_sample_logits_packed if backend in ("cpu", "cuda")
          else torch.ops.specdec.rejection_sample_logits_packed_triton)
    token_ids, num_accepted, logprobs = call_native(op.default, target_logits, cu_num_draft_tokens, draft_token_ids,
                                                    a.draft_probs, *a.params, a.seeds, a.offsets,
                                                    bool(return_logprobs), a.max_draft, *_engine_args(a))
    return LogitsSampleOutput(token_ids, num_accepted, _logprobs_out(logprobs, return_logprobs))


# ---------------------------------------------------------------------------------------------- tree


def tree_rejection_sample_logits(
    target_logits: torch.Tensor,
    tree_token_ids: torch.Tensor,
    parents: torch.Tensor,
    num_nodes: torch.Tensor | None = None,
    draft_probs: torch.Tensor | None = None,
    *,
    temperature=None,
    top_k=None,
    top_p=None,
    min_p=None,
    seeds: torch.Tensor | None = None,
    offsets: torch.Tensor | None = None,
    return_logprobs: bool = False,
    backend: str | None = None,
) -> LogitsTreeSampleOutput:
    """Tree verification (§5.3) from the target's raw logits, with per-request sampling parameters.

    Equals ``tree_rejection_sample(process_logits(target_logits, ...), tree_token_ids, parents,
    num_nodes, draft_probs, seeds=seeds, offsets=offsets, greedy=temperature == 0)`` (floating-point
    near-ties aside); a node's row is processed only when the walk reaches the node.

    Parameters
    ----------
    target_logits : float32 | float16 | bfloat16 [B, N, V]
        Row u: the target's logits after node u (the distribution of u's children).
    tree_token_ids : int32 | int64 [B, N]
    parents : int32 | int64 [B, N]
        parents[b, 0] = -1, 0 <= parents[b, i] < i.
    num_nodes : int32 | int64 [B], optional
    draft_probs : float32 | float16 | bfloat16 [B, N, V], optional
        Row u: the drafter's processed distribution u's children were drawn from.
    temperature, top_k, top_p, min_p, seeds, offsets, return_logprobs, backend :
        as in :func:`rejection_sample_logits`.

    Returns
    -------
    LogitsTreeSampleOutput(token_ids int64 [B, N], accepted_path int32 [B, N], num_accepted int32 [B],
    logprobs float32 [B, N] or None)
        As tree_rejection_sample; logprobs[b, i] is the log-probability of token_ids[b, i] under the
        processed distribution of node accepted_path[b, i] (the node that emitted it); NaN at padding.
    """
    a = _check_tree(target_logits, tree_token_ids, parents, num_nodes, draft_probs, temperature, top_k, top_p, min_p,
                    seeds, offsets)
    device = target_logits.device
    backend = _backend(backend, device, "tree_rejection_sample_logits")

    if values_checked_here(device, backend):  # the reference: the C++ op and the Triton impl check their own
        _check_tree_values(a, tree_token_ids, parents, num_nodes)

    if backend == "reference":
        return LogitsTreeSampleOutput(*reference.tree_rejection_sample_logits(
            target_logits, tree_token_ids, parents, num_nodes, a.draft_probs, temperature=a.params[0],
            top_k=a.params[1], top_p=a.params[2], min_p=a.params[3], seeds=a.seeds, offsets=a.offsets,
            return_logprobs=return_logprobs))
    op = (torch.ops.specdec.tree_rejection_sample_logits if backend in ("cpu", "cuda")
          else torch.ops.specdec.tree_rejection_sample_logits_triton)
    token_ids, accepted_path, num_accepted, logprobs = call_native(
        op.default, target_logits, tree_token_ids, parents, num_nodes, a.draft_probs, *a.params, a.seeds, a.offsets,
        bool(return_logprobs))
    return LogitsTreeSampleOutput(token_ids, accepted_path, num_accepted, _logprobs_out(logprobs, return_logprobs))


# ---------------------------------------------------------------------------------------------- fakes


def _fake_process(logits, temperature, top_k, top_p, min_p):
    torch._check(logits.dim() >= 2, lambda: "logits must be at least 2-D [R, ..., V]")
    return logits.new_empty(logits.shape, dtype=torch.float32)


def _fake_logprobs(ref, shape, return_logprobs):
    return ref.new_empty(shape if return_logprobs else (0,), dtype=torch.float32)


def _fake_padded(target_logits, draft_token_ids, num_draft_tokens, draft_probs, temperature, top_k, top_p, min_p,
                 seeds, offsets, return_logprobs, bonus_token_ids=None, synthetic_acceptance_rates=None):
    torch._check(target_logits.dim() == 3, lambda: "target_logits must be 3-D [B, K+1, V]")
    torch._check(draft_token_ids.dim() == 2, lambda: "draft_token_ids must be 2-D [B, K]")
    batch, width = target_logits.shape[0], draft_token_ids.shape[1] + 1
    return (target_logits.new_empty((batch, width), dtype=torch.int64),
            target_logits.new_empty((batch,), dtype=torch.int32),
            _fake_logprobs(target_logits, (batch, width), return_logprobs))


def _fake_packed(target_logits, cu_num_draft_tokens, draft_token_ids, draft_probs, temperature, top_k, top_p, min_p,
                 seeds, offsets, return_logprobs, max_num_draft_tokens, bonus_token_ids=None,
                 synthetic_acceptance_rates=None):
    torch._check(target_logits.dim() == 2, lambda: "target_logits must be 2-D [T + B, V]")
    batch, width = cu_num_draft_tokens.shape[0] - 1, max_num_draft_tokens + 1
    return (target_logits.new_empty((batch, width), dtype=torch.int64),
            target_logits.new_empty((batch,), dtype=torch.int32),
            _fake_logprobs(target_logits, (batch, width), return_logprobs))


def _fake_tree(target_logits, tree_token_ids, parents, num_nodes, draft_probs, temperature, top_k, top_p, min_p,
               seeds, offsets, return_logprobs):
    torch._check(target_logits.dim() == 3, lambda: "target_logits must be 3-D [B, N, V]")
    batch, nodes = target_logits.shape[0], target_logits.shape[1]
    return (target_logits.new_empty((batch, nodes), dtype=torch.int64),
            target_logits.new_empty((batch, nodes), dtype=torch.int32),
            target_logits.new_empty((batch,), dtype=torch.int32),
            _fake_logprobs(target_logits, (batch, nodes), return_logprobs))


# ---------------------------------------------------------------------------------------------- triton


def _block(vocab):
    """Vocab tile of the logits kernels: a power of two >= 4 (Philox draws 4 numbers a block: V = 1 and 2 too)."""
    return max(4, min(next_pow2(vocab), 4096 if triton_interpreting() else 1024))


def _radix_block(vocab):
    """Tile of the radix histograms: [tile, 16] one-hot accumulators (compiled: 512 entries over 4 warps, 4 x 16
    accumulators a thread, 96 registers on sm_90: the tile's skip test, a block reduction with two barriers,
    is shared by 4 entries a thread; 80 instructions per entry and pass against 90 at 256)."""
    return max(4, min(next_pow2(vocab), 4096 if triton_interpreting() else 512))


def _radix_passes(dtype):
    """Radix passes (4 bits each) of a select over logits of this type (triton_kernels/logits.py radix_key):
    the bits that vary in its values widened to float32 (bfloat16 16, float16 19, float32 32)."""
    return {torch.bfloat16: 4, torch.float16: 5}.get(dtype, 8)


def _param_ptrs(ref, params):
    """Kernel pointers of the sampling parameters (ref where absent) and their HAS_* flags."""
    return [ref if t is None else t.contiguous() for t in params], {
        f"HAS_{name}": t is not None for name, t in zip(("T", "K", "P", "MIN_P"), params)}


def _triton_process(logits, temperature, top_k, top_p, min_p):
    """specdec::process_logits_triton: the C++ op's checks (shapes, dtypes and devices always; the parameters'
    values on CPU tensors), then the launch."""
    from .triton_kernels.logits import process_logits_kernel

    params = _check_process(logits, temperature, top_k, top_p, min_p, op=True)
    if impl_checks_values(logits.device):
        _check_param_values(params)
    x = logits.contiguous()
    probs = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    if x.numel() == 0:
        return probs
    vocab = x.shape[-1]
    rows = x.numel() // vocab
    ptrs, flags = _param_ptrs(x, (temperature, top_k, top_p, min_p))
    process_logits_kernel[(rows,)](x, *ptrs, probs, rows, rows // x.shape[0], vocab, **flags,
                                   PASSES=_radix_passes(x.dtype), BLOCK=_block(vocab), RADIX_BLOCK=_radix_block(vocab))
    return probs


# Chain verification splits each row into chunks of this many entries (a multiple of the tile): fixed here
# rather than sized from the GPU, so that the sums round the same on every device.
SPLIT_CHUNK = 8192


def _partials_block(chunk):
    """Tile of chain_row_partials_kernel: the largest power of two dividing `chunk`, at most 4096 (32 entries
    per thread over 4 warps: the two reductions per tile cost under one instruction per entry, and 64 bytes
    of bf16 are in flight per thread)."""
    return min(chunk & -chunk, 4096)


# Programs per chunk of each radix pass (chain_radix_pass_kernel's SPLIT): fixed, as the chunk is, so that the
# histograms' sums round the same on every device; fewer where the chunk holds fewer radix tiles.
RADIX_SPLIT = 4


def _radix_split(chunk, radix_block):
    """chain_radix_pass_kernel's parts per chunk: RADIX_SPLIT, or as many whole radix tiles as the chunk holds."""
    split = RADIX_SPLIT
    while split > 1 and chunk % (split * radix_block):
        split //= 2
    return split


def _launch_filters(target, lengths, ptrs, flags, partials, rows, chunks, chunk, block, radix_block, common,
                    early=None, done=None):
    """The thresholds of the split rows (top-k, top-p, min-p): chain_radix_pass_kernel launches per select
    present (4 over bfloat16 logits, 5 over float16, 8 over float32: _radix_passes; grid rows x chunks x
    _radix_split parts, each pass's pick finished by the row's last program), then chain_kept_mass_kernel.
    `early` (chain rows without logprobs or synthetic rates: the walk's draft_probs, draft ids, seeds and
    offsets): top-p's early acceptance (triton_kernels/logits.py chain_row_accepts_early) spares the rows whose
    draft it takes the select; their tau is -1. `done` (int8 [B], top-p's early bonus token:
    _launch_early_bonus): the requests it decided run no pass. Returns (tau [rows] int64, part_kept [rows,
    chunks] float32)."""
    from .triton_kernels.logits import chain_kept_mass_kernel, chain_radix_pass_kernel

    part_max, part_arg, part_sum = partials
    new = target.new_empty
    split = _radix_split(chunk, radix_block)
    passes = _radix_passes(target.dtype)
    launches = passes * (int(flags["HAS_K"]) + int(flags["HAS_P"]))
    hist = new((rows, chunks * split, 16), dtype=torch.float32)
    prefix = new((rows,), dtype=torch.int64)
    acc = new((rows,), dtype=torch.float32)
    goal = new((rows,), dtype=torch.float32)
    ktau = new((rows,), dtype=torch.int64)
    ptau = new((rows,), dtype=torch.int64)
    tickets = torch.zeros((max(launches, 1), rows), dtype=torch.int32, device=target.device)
    tau = new((rows,), dtype=torch.int64)
    part_kept = new((rows, chunks), dtype=torch.float32)
    use_early = early is not None and flags["HAS_P"]
    early_flags = new((rows,), dtype=torch.int8) if use_early else tau  # any valid pointer without EARLY
    test = (early["draft_probs"], early["draft_ids"], early["seeds"], early["offsets"]) if use_early else (target,) * 4
    bonus = dict(EARLY_BONUS=done is not None)
    done = tau if done is None else done  # any valid pointer without EARLY_BONUS
    step = 0
    for by_mass, present in ((False, flags["HAS_K"]), (True, flags["HAS_P"])):
        for passed in range(passes if present else 0):
            chain_radix_pass_kernel[(rows, chunks * split)](
                target, lengths, *ptrs, part_max, hist, prefix, acc, goal, ktau, ptau, tickets[step], early_flags,
                part_arg, part_sum, *test, done, passed, **common, BY_MASS=by_mass, PASSES=passes, EARLY=use_early,
                HAS_DRAFT_PROBS=use_early and early["has_draft_probs"], BLOCK=radix_block, SPLIT=split, **bonus)
            step += 1
    chain_kept_mass_kernel[(rows, chunks)](target, lengths, *ptrs, part_max, ktau, ptau, tau, part_kept, early_flags,
                                           done, **common, EARLY=use_early, BLOCK=block, **bonus)
    return tau, part_kept


def _split_sizes(vocab, chunk=None, block=None, radix_block=None):
    """(block, radix_block, chunk, chunks) of the split kernels for rows of `vocab` entries; the arguments given
    override the defaults. A row shorter than SPLIT_CHUNK is one chunk of its power-of-two size (a multiple of
    block): the programs do not sweep 8192 masked entries of a 16-entry row."""
    block = block or _block(vocab)
    radix_block = radix_block or min(block, _radix_block(vocab))
    chunk = chunk or max(block, min(SPLIT_CHUNK, next_pow2(vocab)))
    if chunk % block or block % 4 or chunk % radix_block:
        raise ValueError(f"chunk ({chunk}) must be a multiple of block ({block}) and of radix_block ({radix_block}), "
                         "block of 4")
    return block, radix_block, chunk, -(-vocab // chunk)


def _split_rows(target, lengths, params, rows, max_draft, num_draft_rows, bonus_rows, packed, has_bonus, tree,
                chunk=None, block=None, radix_block=None, early=None, early_bonus=None):
    """Every row's statistics over vocabulary chunks: chain_row_partials_kernel, and with filter tensors the
    thresholds (_launch_filters), before them top-p's early bonus token where `early_bonus` asks for it
    (_launch_early_bonus). Rows are b x (max_draft + 1) + k (TREE: node k of request b, `lengths` the node
    counts). Returns (kernel pointers and sizes for the walk: a dict)."""
    from .triton_kernels.logits import chain_row_partials_kernel

    vocab = target.shape[-1]
    ptrs, flags = _param_ptrs(target, params)
    block, radix_block, chunk, chunks = _split_sizes(vocab, chunk, block, radix_block)
    part_max = target.new_empty((rows, chunks), dtype=torch.float32)
    part_arg = target.new_empty((rows, chunks), dtype=torch.int64)
    part_sum = target.new_empty((rows, chunks), dtype=torch.float32)
    common = dict(PACKED=packed, HAS_T=flags["HAS_T"], HAS_BONUS=has_bonus, TREE=tree, CHUNKS=chunks, CHUNK=chunk)
    chain_row_partials_kernel[(rows, chunks)](
        target, lengths, ptrs[0], part_max, part_arg, part_sum, vocab, max_draft, num_draft_rows, int(bonus_rows),
        PART_BLOCK=_partials_block(chunk), **common)
    has_filters = any(p is not None for p in params[1:])
    tau, part_kept = part_max, part_sum  # any valid pointers without filters
    done = None
    if has_filters and early is not None and flags["HAS_P"] and early_bonus is not None and bonus_rows \
            and not has_bonus and not tree:
        done = _launch_early_bonus(target, lengths, ptrs, flags, (part_max, part_arg, part_sum), early, early_bonus,
                                   max_draft, num_draft_rows, packed, chunks, chunk)
    if has_filters:
        tau, part_kept = _launch_filters(
            target, lengths, ptrs, flags, (part_max, part_arg, part_sum), rows, chunks, chunk, block, radix_block,
            dict(vocab=vocab, max_draft=max_draft, num_draft_rows=num_draft_rows, bonus_rows=int(bonus_rows),
                 CHUNKS_P2=next_pow2(chunks), HAS_K=flags["HAS_K"], HAS_P=flags["HAS_P"],
                 HAS_MIN_P=flags["HAS_MIN_P"], **common), early=early, done=done)
    return dict(ptrs=ptrs, flags=flags, block=block, chunk=chunk, chunks=chunks, has_filters=has_filters,
                stats=(part_max, part_arg, part_sum, tau, part_kept),
                early=has_filters and early is not None and flags["HAS_P"], done=done)


def _launch_early_bonus(target, lengths, ptrs, flags, partials, early, bonus, max_draft, num_draft_rows, packed,
                        chunks, chunk):
    """Top-p's early bonus token (chain rows with top-p on, no logprobs, no synthetic rates, bonus rows given):
    chain_bonus_race_kernel races every entry of the bonus row of each request whose drafts top-p's early
    acceptance takes (grid B x races, as the walk's race), then chain_bonus_verdict_kernel (grid B x chunks) writes
    the outputs of those whose winner top-p surely keeps. Returns done (int8 [B]): the requests decided here,
    which the filters and the walk then skip. `bonus`: the walk's outputs (token_ids, num_accepted) and sizes."""
    from .triton_kernels.logits import chain_bonus_race_kernel, chain_bonus_verdict_kernel

    batch, group, block = bonus["batch"], bonus["race_group"], bonus["block"]
    races = -(-chunks // group)
    new = target.new_empty
    bonus_w = new((batch,), dtype=torch.int64)
    done = new((batch,), dtype=torch.int8)
    tickets = torch.zeros((2, batch), dtype=torch.int32, device=target.device)
    consts = dict(vocab=target.shape[-1], max_draft=max_draft, num_draft_rows=num_draft_rows, bonus_rows=1,
                  PACKED=packed, HAS_T=flags["HAS_T"], CHUNKS=chunks, CHUNKS_P2=next_pow2(chunks), CHUNK=chunk,
                  BLOCK=block)
    chain_bonus_race_kernel[(batch, races)](
        target, early["draft_probs"], early["draft_ids"], lengths, early["seeds"], early["offsets"], *ptrs,
        *partials, new((batch, races), dtype=torch.float32), new((batch, races), dtype=torch.int64), tickets[0],
        bonus_w, **consts, HAS_K=flags["HAS_K"], HAS_MIN_P=flags["HAS_MIN_P"],
        HAS_DRAFT_PROBS=early["has_draft_probs"], RACE_GROUP=group)
    chain_bonus_verdict_kernel[(batch, chunks)](
        target, early["draft_ids"], lengths, ptrs[0], ptrs[2], *partials, bonus_w,
        new((batch, chunks), dtype=torch.float32), tickets[1], done, bonus["token_ids"], bonus["num_accepted"],
        **consts, BLOCK_K=next_pow2(max_draft + 1))
    if bonus.get("stats") is not None:
        bonus["stats"].update(bonus_w=bonus_w, done=done)
    return done


_RACE_PROGRAMS_PER_SM = 6  # chain_walk_race_kernel's programs resident per SM (80 registers, 4 warps)


def chain_race_group(batch: int, chunks: int, sms: int) -> int:
    """Chunks per program of chain_walk_race_kernel's race on a GPU with `sms` SMs: 2 when one chunk per
    program would take more than one wave, else 1. The race's winner does not depend on it (every entry's noise
    is keyed by its index, the programs' winners merge exactly); a program that races more tiles runs fewer
    first tiles, which always take the exact path. bench/roofline.py models the same choice."""
    return 2 if chunks >= 2 and batch * chunks > _RACE_PROGRAMS_PER_SM * sms else 1


# chain_fused_kernel's chunks: SPLIT_CHUNK doubled up to FUSED_CHUNK_MAX while every request's bonus row still
# splits into programs enough for FUSED_BONUS_PROGRAMS over the batch (two per SM of the largest GPUs).
FUSED_CHUNK_MAX = 32768
FUSED_BONUS_PROGRAMS = 256


def fused_chunk(batch: int, vocab: int) -> int | None:
    """Entries per chunk program of chain_fused_kernel for `batch` requests of `vocab` entries a row (None:
    _split_sizes' default). A bonus race restarts in every chunk, and the first tiles of a race take the exact
    path (about H(t) / t of t tiles do), so longer chunks cut the bonus row's work; while at least
    FUSED_BONUS_PROGRAMS programs share the bonus rows (they start first: fused_chunk_program) the GPU stays
    evenly busy. From the shapes alone, not the GPU's size, so the sums round the same on every device."""
    chunk = SPLIT_CHUNK
    while (chunk < FUSED_CHUNK_MAX and 2 * chunk < vocab
           and batch * -(-vocab // (2 * chunk)) >= FUSED_BONUS_PROGRAMS):
        chunk *= 2
    return chunk if chunk > SPLIT_CHUNK else None


# chain_fused_kernel's register cap (ptxas .maxnreg): without it the ptxas of Triton 3.6 kept the kernel at 96
# registers and spilled 8 bytes (the draft-probs race's division slow path); with it every Triton from 3.6 compiles
# it without spills: 88-96 registers, up to 102 with a temperature tensor and draft probs (tests/aot_logits_kernel.py).
_FUSED_MAXNREG = 104


def _launch_fused_chain(target, ids, lengths, q, has_q, temperature, seeds, offsets, batch, max_draft, packed,
                        bonus_rows, bonus, has_bonus, block, chunk, chunks, race_chunk, race_chunks, group, token_ids,
                        num_accepted):
    """chain_fused_kernel: the whole chain verification in one launch (rows without filters, no logprobs, no
    synthetic rates). Grid: B x (K+1) x chunks chunk programs (chunks of `chunk` entries), then B x races
    request programs (races = ceil(race_chunks / group): after a rejection each races `group` chunks of
    `race_chunk` entries of the row); bfloat16 rows are read as 32-bit pairs where the vocabulary is even and
    the logits 4-byte aligned (PAIRS), the bonus race over quads where the vocabulary is a multiple of 4 and
    the logits 8-byte aligned (QUADS). Workspaces: the chunks' partials and bonus-race winners, the request
    programs' race winners, and one zeroed int32 counter tensor (the places, each request's arrivals, each
    request's race tickets)."""
    from .triton_kernels.logits import chain_fused_kernel

    rows = batch * (max_draft + 1)
    races = -(-race_chunks // group)
    new = target.new_empty
    counters = torch.zeros((1 + 2 * batch,), dtype=torch.int32, device=target.device)
    chain_fused_kernel[(rows * chunks + batch * races,)](
        target, q, ids, lengths, seeds, offsets, target if temperature is None else temperature.contiguous(),
        new((rows, chunks), dtype=torch.float32), new((rows, chunks), dtype=torch.int64),
        new((rows, chunks), dtype=torch.float32), new((batch, chunks), dtype=torch.float32),
        new((batch, chunks), dtype=torch.int32), new((batch, races), dtype=torch.float32),
        new((batch, races), dtype=torch.int64), counters, token_ids, num_accepted, bonus,
        target.shape[-1], max_draft, ids.numel(), int(bonus_rows), batch,
        PACKED=packed, HAS_DRAFT_PROBS=has_q, HAS_T=temperature is not None, HAS_BONUS=has_bonus, CHUNKS=chunks,
        CHUNKS_P2=next_pow2(chunks), CHUNK=chunk, PART_BLOCK=_partials_block(chunk), RACE_BLOCK=block, BLOCK=block,
        BLOCK_K=next_pow2(max_draft + 1), RACE_GROUP=group, RACE_CHUNKS=race_chunks,
        RACE_CHUNKS_P2=next_pow2(race_chunks), RACE_CHUNK=race_chunk,
        PAIRS=target.dtype == torch.bfloat16 and target.shape[-1] % 2 == 0 and target.data_ptr() % 4 == 0,
        QUADS=target.dtype == torch.bfloat16 and target.shape[-1] % 4 == 0 and target.data_ptr() % 8 == 0,
        num_warps=4, maxnreg=_FUSED_MAXNREG)


def _launch_chain(target_logits, draft_token_ids, lengths, draft_probs, params, seeds, offsets, return_logprobs,
                  batch, max_draft, packed, bonus_rows, bonus_token_ids, rates, chunk=None, block=None,
                  radix_block=None, race_group=None, early_bonus_token=True, stats=None, fused=True, race_chunk=None):
    """The Triton chain kernels, every row split over chunks of `chunk` entries (tiles of `block`; the radix
    histograms' of `radix_block`). Without filter tensors, logprobs or synthetic rates (and `fused`): one launch
    of chain_fused_kernel (its chunks by default fused_chunk's; the race after a rejection over chunks of
    `race_chunk` entries, by default at most SPLIT_CHUNK). Else _split_rows, then chain_walk_race_kernel (its
    race over `race_group` chunks a program: chain_race_group on a GPU, 1 off it, by default).
    `early_bonus_token` (where it applies: _split_rows): top-p's early bonus token; `stats`, a dict, receives
    its workspaces (tests)."""
    from .triton_kernels.logits import chain_walk_race_kernel

    token_ids = target_logits.new_empty((batch, max_draft + 1), dtype=torch.int64)
    num_accepted = target_logits.new_empty((batch,), dtype=torch.int32)
    logprobs = _fake_logprobs(target_logits, (batch, max_draft + 1), return_logprobs)
    if batch == 0:
        return token_ids, num_accepted, logprobs
    target = target_logits.contiguous()
    ids = draft_token_ids.contiguous().to(torch.int64)
    vocab = target.shape[-1]
    bonus = ids if bonus_token_ids is None else bonus_token_ids.contiguous().to(torch.int64)
    lengths = lengths.contiguous().to(torch.int64)
    q = target if draft_probs is None else draft_probs.contiguous()
    seeds, offsets = seeds.contiguous(), offsets.contiguous()
    # top-p's early acceptance: not with logprobs (they need every row's kept mass) nor synthetic rates
    early = None if return_logprobs or rates is not None else dict(
        draft_probs=q, draft_ids=ids, seeds=seeds, offsets=offsets, has_draft_probs=draft_probs is not None)
    fuse = fused and not return_logprobs and rates is None and all(p is None for p in params[1:])
    block, radix_block, chunk, chunks = _split_sizes(vocab, chunk or (fused_chunk(batch, vocab) if fuse else None),
                                                     block, radix_block)
    # the race after the walk: over chunks of at most SPLIT_CHUNK entries (the fused kernel's partials may
    # take longer chunks), RACE_GROUP of them a program
    race_chunk = (race_chunk or min(chunk, SPLIT_CHUNK)) if fuse else chunk
    race_chunks = -(-vocab // race_chunk)
    group = race_group or (chain_race_group(batch, race_chunks, num_sms(target.device))
                           if target.device.type == "cuda" else 1)
    if fuse:
        _launch_fused_chain(target, ids, lengths, q, draft_probs is not None, params[0], seeds, offsets, batch,
                            max_draft, packed, bonus_rows, bonus, bonus_token_ids is not None, block, chunk, chunks,
                            race_chunk, race_chunks, group, token_ids, num_accepted)
        return token_ids, num_accepted, logprobs
    early_bonus = dict(batch=batch, race_group=group, block=block, token_ids=token_ids, num_accepted=num_accepted,
                       stats=stats) if early_bonus_token else None
    split = _split_rows(target, lengths, params, batch * (max_draft + 1), max_draft, ids.numel(), bonus_rows, packed,
                        bonus_token_ids is not None, False, chunk, block, radix_block, early=early,
                        early_bonus=early_bonus)
    races = -(-chunks // group)
    race_score = target.new_empty((batch, races), dtype=torch.float32)
    race_index = target.new_empty((batch, races), dtype=torch.int64)
    tickets = torch.zeros((batch,), dtype=torch.int32, device=target.device)
    chain_walk_race_kernel[(batch, races)](
        target, q, ids, lengths, seeds, offsets, split["ptrs"][0], *split["stats"], race_score, race_index, tickets,
        token_ids, num_accepted, logprobs if return_logprobs else target, bonus,
        target if rates is None else rates.contiguous(), tickets if split["done"] is None else split["done"], vocab,
        max_draft, ids.numel(), int(bonus_rows),
        PACKED=packed, HAS_T=split["flags"]["HAS_T"], HAS_BONUS=bonus_token_ids is not None,
        HAS_DRAFT_PROBS=draft_probs is not None, HAS_RATES=rates is not None, LOGPROBS=bool(return_logprobs),
        HAS_FILTERS=split["has_filters"], EARLY=split["early"], CHUNKS=chunks, CHUNKS_P2=next_pow2(chunks), CHUNK=split["chunk"],
        BLOCK_K=next_pow2(max_draft + 1), BLOCK=split["block"], RACE_GROUP=group,
        EARLY_BONUS=split["done"] is not None)
    return token_ids, num_accepted, logprobs


def _triton_padded(target_logits, draft_token_ids, num_draft_tokens, draft_probs, temperature, top_k, top_p, min_p,
                   seeds, offsets, return_logprobs, bonus_token_ids=None, synthetic_acceptance_rates=None):
    """specdec::rejection_sample_logits_triton: the C++ op's checks (shapes, dtypes and devices always; on CPU
    tensors the values of the parameters, lengths and engine keywords, not the draft ids: the kernel rejects an
    id outside the vocabulary), then the launch. [B, K, V] (no bonus rows) only with external bonus tokens."""
    a = _check_padded(target_logits, draft_token_ids, num_draft_tokens, draft_probs, temperature, top_k, top_p,
                      min_p, seeds, offsets, bonus_token_ids, synthetic_acceptance_rates, op=True)
    if impl_checks_values(target_logits.device):
        _check_chain_values(a, draft_token_ids, num_draft_tokens, packed=False, draft_ids=False)
    return _launch_chain(target_logits, draft_token_ids, num_draft_tokens, draft_probs,
                         (temperature, top_k, top_p, min_p), seeds, offsets, return_logprobs,
                         target_logits.shape[0], a.max_draft, packed=False,
                         bonus_rows=target_logits.shape[1] == a.max_draft + 1, bonus_token_ids=a.bonus_token_ids,
                         rates=a.rates)


def _triton_packed(target_logits, cu_num_draft_tokens, draft_token_ids, draft_probs, temperature, top_k, top_p,
                   min_p, seeds, offsets, return_logprobs, max_num_draft_tokens, bonus_token_ids=None,
                   synthetic_acceptance_rates=None):
    """specdec::rejection_sample_logits_packed_triton: the C++ op's checks (as _triton_padded), then the launch."""
    a = _check_packed(target_logits, cu_num_draft_tokens, draft_token_ids, draft_probs, temperature, top_k, top_p,
                      min_p, seeds, offsets, max_num_draft_tokens, bonus_token_ids, synthetic_acceptance_rates,
                      op=True)
    if impl_checks_values(target_logits.device):
        _check_chain_values(a, draft_token_ids, cu_num_draft_tokens, packed=True, draft_ids=False)
    batch = cu_num_draft_tokens.shape[0] - 1
    return _launch_chain(target_logits, draft_token_ids, cu_num_draft_tokens, draft_probs,
                         (temperature, top_k, top_p, min_p), seeds, offsets, return_logprobs,
                         batch, a.max_draft, packed=True, bonus_rows=target_logits.shape[0] == a.total + batch,
                         bonus_token_ids=a.bonus_token_ids, rates=a.rates)


def _triton_tree(target_logits, tree_token_ids, parents, num_nodes, draft_probs, temperature, top_k, top_p, min_p,
                 seeds, offsets, return_logprobs, chunk=None, block=None, radix_block=None):
    """specdec::tree_rejection_sample_logits_triton: the C++ op's checks (shapes, dtypes and devices always; the
    parameters' and the tree's values on CPU tensors), then every node's row statistics from the split kernels
    over the B x N rows (_split_rows: the partials and, with filter tensors, the radix passes of all rows in
    parallel); then one program per request walks its tree, combining a node's statistics where it enters the
    node. chunk, block and radix_block override the split sizes (tests)."""
    from .triton_kernels.logits import tree_rejection_sample_logits_kernel

    a = _check_tree(target_logits, tree_token_ids, parents, num_nodes, draft_probs, temperature, top_k, top_p, min_p,
                    seeds, offsets, op=True)
    if impl_checks_values(target_logits.device):
        _check_tree_values(a, tree_token_ids, parents, num_nodes)
    batch, nodes, vocab = target_logits.shape
    token_ids = target_logits.new_empty((batch, nodes), dtype=torch.int64)
    accepted_path = target_logits.new_empty((batch, nodes), dtype=torch.int32)
    num_accepted = target_logits.new_empty((batch,), dtype=torch.int32)
    logprobs = _fake_logprobs(target_logits, (batch, nodes), return_logprobs)
    if batch == 0:
        return token_ids, accepted_path, num_accepted, logprobs
    target = target_logits.contiguous()
    tokens = tree_token_ids.contiguous().to(torch.int64)
    counts = (torch.full((batch,), nodes, dtype=torch.int64, device=target.device) if num_nodes is None
              else num_nodes.contiguous().to(torch.int64))
    split = _split_rows(target, counts, (temperature, top_k, top_p, min_p), batch * nodes, nodes - 1, 0, 0, False,
                        False, True, chunk, block, radix_block)
    tree_rejection_sample_logits_kernel[(batch,)](
        target, target if draft_probs is None else draft_probs.contiguous(), tokens,
        parents.contiguous().to(torch.int64), counts, seeds.contiguous(), offsets.contiguous(), split["ptrs"][0],
        token_ids, accepted_path, num_accepted, logprobs if return_logprobs else target, *split["stats"], vocab, nodes,
        HAS_DRAFT_PROBS=draft_probs is not None, HAS_T=split["flags"]["HAS_T"],
        LOGPROBS=bool(return_logprobs), BLOCK_N=next_pow2(nodes), BLOCK=split["block"],
        HAS_FILTERS=split["has_filters"], CHUNKS=split["chunks"], CHUNKS_P2=next_pow2(split["chunks"]))
    return token_ids, accepted_path, num_accepted, logprobs


if _ops.native_loaded():
    for _name, _fake, _impl in (("process_logits", _fake_process, _triton_process),
                                ("rejection_sample_logits", _fake_padded, _triton_padded),
                                ("rejection_sample_logits_packed", _fake_packed, _triton_packed),
                                ("tree_rejection_sample_logits", _fake_tree, _triton_tree)):
        if _impl is not None and _name in _TRITON_OPS:
            torch.library.register_fake(f"specdec::{_name}_triton")(_fake)
            torch.library.impl(f"specdec::{_name}_triton", ("CPU", "CUDA"))(_impl)
    torch.library.register_fake("specdec::process_logits")(_fake_process)
    torch.library.register_fake("specdec::rejection_sample_logits")(_fake_padded)
    torch.library.register_fake("specdec::rejection_sample_logits_packed")(_fake_packed)
    torch.library.register_fake("specdec::tree_rejection_sample_logits")(_fake_tree)
