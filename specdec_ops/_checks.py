"""Argument checks shared by the Python wrappers and the Triton ops' impls (DESIGN.md §4): every
message names the argument and says what was expected."""

from __future__ import annotations

from collections.abc import Sequence

import torch

PROB_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)


class SpecDecArgumentError(ValueError, TypeError, RuntimeError):
    """A bad argument to a specdec_ops function.

    It is a ``ValueError`` (the Python convention for bad arguments), a
    ``TypeError`` (for wrong dtypes) and a ``RuntimeError`` (what torch's own
    checks raise), so callers catching any of the three see it.
    """


class BackendUnavailableError(RuntimeError):
    """The requested backend is not available for this op, device or build."""


def fail(msg: str) -> None:
    raise SpecDecArgumentError(msg)


def check_tensor(t, name: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        fail(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    return t


def check_rank(t: torch.Tensor, rank: int, name: str, shape: str) -> None:
    check_tensor(t, name)
    if t.dim() != rank:
        fail(f"{name} must be {rank}-D {shape}, got shape {tuple(t.shape)}")


def check_shape(t: torch.Tensor, expected: Sequence[int], name: str, shape: str) -> None:
    check_rank(t, len(expected), name, shape)
    if tuple(t.shape) != tuple(expected):
        fail(f"{name} must have shape {shape} = {list(expected)}, got {list(t.shape)}")


def check_dtype(t: torch.Tensor, allowed: Sequence[torch.dtype], name: str) -> None:
    if t.dtype not in allowed:
        names = ", ".join(str(d).replace("torch.", "") for d in allowed)
        fail(f"{name} must have dtype {names}; got {str(t.dtype).replace('torch.', '')}")


def check_device(t: torch.Tensor, device: torch.device, name: str, ref_name: str) -> None:
    if t.device != device:
        fail(f"{name} must be on the same device as {ref_name} ({device}), got {t.device}")


def check_index_tensor(t, shape: Sequence[int], name: str, shape_str: str, device: torch.device,
                       ref_name: str) -> None:
    check_shape(t, shape, name, shape_str)
    check_dtype(t, INDEX_DTYPES, name)
    check_device(t, device, name, ref_name)


def rng_inputs(seeds, offsets, batch: int, device: torch.device, ref_name: str):
    """Validated (seeds, offsets) int64 [B] on `device`.

    seeds=None draws one seed per request from torch's default generator for
    `device`: on the host for CPU tensors (DESIGN.md §5.1), on the device itself
    otherwise (torch's CUDA generator: no host-to-device copy, no sync). Under CUDA
    graph capture seeds=None is refused (SpecDecArgumentError): a captured draw would
    bake one set of seeds into every replay, so pass a seeds tensor and refill it
    between replays. offsets=None means 0. int32 values are widened to int64.
    """
    if seeds is None:
        if device.type == "cpu":
            seeds = torch.randint(0, 2**62, (batch,), dtype=torch.int64)
        else:
            if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                fail("seeds=None is not allowed under CUDA graph capture (the drawn seeds would be replayed "
                     "unchanged): pass seeds, an int64 [B] tensor on the device, and refill it between replays")
            seeds = torch.randint(0, 2**62, (batch,), dtype=torch.int64, device=device)
    else:
        check_shape(seeds, (batch,), "seeds", "[B]")
        check_dtype(seeds, INDEX_DTYPES, "seeds")
        check_device(seeds, device, "seeds", ref_name)
        seeds = seeds.to(torch.int64)
    if offsets is None:
        offsets = torch.zeros(batch, dtype=torch.int64, device=device)
    else:
        check_shape(offsets, (batch,), "offsets", "[B]")
        check_dtype(offsets, INDEX_DTYPES, "offsets")
        check_device(offsets, device, "offsets", ref_name)
        offsets = offsets.to(torch.int64)
    return seeds, offsets


def check_op_rng(seeds, offsets, batch: int, device: torch.device, ref_name: str):
    """The ops' seeds and offsets as their schema takes them (what rng_inputs makes of a wrapper's arguments):
    int64 [B] on `device`, as the C++ ops check them (csrc/common/torch_checks.h check_rng_args). Returns them."""
    for t, name in ((seeds, "seeds"), (offsets, "offsets")):
        check_shape(t, (batch,), name, "[B]")
        check_dtype(t, (torch.int64,), name)
        check_device(t, device, name, ref_name)
    return seeds, offsets


def native_message(exc: BaseException) -> str:
    """The message of an error raised by a C++ check, without torch's C++ backtrace."""
    return str(exc).split("\nException raised from")[0]


def call_native(op, *args):
    """Run a specdec:: op (C++/CUDA or Triton), re-raising its argument errors as SpecDecArgumentError.

    The C++ checks raise ValueError (shapes, ranks, devices, index values) and
    TypeError (dtypes) (csrc/common/torch_checks.h); a wrapper calling through here
    raises SpecDecArgumentError with the same message on every backend, as its
    Python checks do. Other errors (CUDA errors, RuntimeError) pass unchanged.
    Under torch.compile the op is called directly (the checks run at trace time).
    """
    if torch.compiler.is_compiling():
        return op(*args)
    try:
        return op(*args)
    except SpecDecArgumentError:
        raise
    except (ValueError, TypeError) as exc:
        raise SpecDecArgumentError(native_message(exc)) from None


def check_greedy(greedy, batch: int, device: torch.device, ref_name: str):
    if greedy is None:
        return None
    check_shape(greedy, (batch,), "greedy", "[B]")
    check_dtype(greedy, (torch.bool,), "greedy")
    check_device(greedy, device, "greedy", ref_name)
    return greedy


def first_bad(mask: torch.Tensor):
    """Index tuple of the first True element of `mask` (CPU tensors only), or None."""
    if not bool(mask.any()):
        return None
    flat = int(mask.reshape(-1).nonzero()[0, 0])
    return tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), mask.shape))


def check_draft_ids(draft_token_ids: torch.Tensor, used: torch.Tensor, vocab: int) -> None:
    """Value check (CPU tensors): the used draft ids lie in [0, vocab)."""
    bad = first_bad(used & ((draft_token_ids < 0) | (draft_token_ids >= vocab)))
    if bad is not None:
        fail(f"draft_token_ids{list(bad)} = {int(draft_token_ids[bad])} is outside the vocabulary [0, {vocab})")


def check_cu_num_draft_tokens(cu_num_draft_tokens, device: torch.device, ref_name: str) -> int:
    """Rank, dtype and device of the packed layout's cu_num_draft_tokens [B + 1]; returns B."""
    check_rank(cu_num_draft_tokens, 1, "cu_num_draft_tokens", "[B + 1]")
    if cu_num_draft_tokens.shape[0] < 1:
        fail("cu_num_draft_tokens must have shape [B + 1] with B >= 0, got shape [0]")
    check_dtype(cu_num_draft_tokens, INDEX_DTYPES, "cu_num_draft_tokens")
    check_device(cu_num_draft_tokens, device, "cu_num_draft_tokens", ref_name)
    return cu_num_draft_tokens.shape[0] - 1


def check_packed_layout(target: torch.Tensor, target_name: str, cu_num_draft_tokens,
                        draft_token_ids, bonus_rows_optional: bool = False) -> tuple[int, int]:
    """cu_num_draft_tokens [B + 1] and draft_token_ids [T] of the packed layout, on the device of the
    (2-D) target, whose rows must number T + B (or T, when ``bonus_rows_optional``: the caller was given
    ``bonus_token_ids`` and reads no bonus row). Returns (B, T)."""
    device = target.device
    batch = check_cu_num_draft_tokens(cu_num_draft_tokens, device, target_name)
    check_rank(draft_token_ids, 1, "draft_token_ids", "[T]")
    check_dtype(draft_token_ids, INDEX_DTYPES, "draft_token_ids")
    check_device(draft_token_ids, device, "draft_token_ids", target_name)
    total = draft_token_ids.shape[0]
    if bonus_rows_optional and target.shape[0] != total + batch:
        if target.shape[0] != total:
            fail(f"{target_name} must have T + B = {total + batch} rows, or T = {total} rows when bonus_token_ids "
                 f"is given (T = {total} draft tokens, B = {batch} requests), got shape {list(target.shape)}")
    elif target.shape[0] != total + batch:
        fail(f"{target_name} must have T + B = {total + batch} rows (T = {total} draft tokens, B = {batch} "
             f"requests), got shape {list(target.shape)}")
    return batch, total


def packed_max_num_draft_tokens(cu_num_draft_tokens: torch.Tensor, batch: int, max_num_draft_tokens) -> int:
    """K of the packed layout: the given max_num_draft_tokens (checked), else the largest n_b (a host read)."""
    if max_num_draft_tokens is None:
        # Reads the largest n_b on the host: pass max_num_draft_tokens to avoid the sync.
        return int((cu_num_draft_tokens[1:] - cu_num_draft_tokens[:-1]).max()) if batch else 0
    if not isinstance(max_num_draft_tokens, int) or max_num_draft_tokens < 0:
        fail(f"max_num_draft_tokens must be a non-negative int, got {max_num_draft_tokens!r}")
    return max_num_draft_tokens


def check_cu_values(cu: torch.Tensor, total: int, max_num_draft_tokens: int) -> None:
    """Value checks (CPU tensors) of cu_num_draft_tokens: starts at 0, non-decreasing, ends at T,
    no request with more than max_num_draft_tokens drafts."""
    if int(cu[0]) != 0:
        fail(f"cu_num_draft_tokens[0] must be 0, got {int(cu[0])}")
    bad = first_bad(cu[1:] < cu[:-1])
    if bad is not None:
        fail(f"cu_num_draft_tokens must be non-decreasing: element {bad[0] + 1} = {int(cu[bad[0] + 1])} "
             f"< {int(cu[bad[0]])}")
    if int(cu[-1]) != total:
        fail(f"cu_num_draft_tokens[B] = {int(cu[-1])} must equal the number of draft tokens T = {total}")
    bad = first_bad(cu[1:] - cu[:-1] > max_num_draft_tokens)
    if bad is not None:
        fail(f"request {bad[0]} has {int(cu[bad[0] + 1] - cu[bad[0]])} draft tokens, more than "
             f"max_num_draft_tokens = {max_num_draft_tokens}")


def check_tree_values(tree_token_ids: torch.Tensor, parents: torch.Tensor, num_nodes, vocab: int) -> None:
    """Value checks (CPU tensors) of a token tree, as the C++ ops do them (same messages): num_nodes in
    [1, N], parents[b, 0] = -1, every used node's parent an earlier node, used tokens in [0, vocab)."""
    batch, nodes = parents.shape
    if num_nodes is not None:
        bad = first_bad((num_nodes < 1) | (num_nodes > nodes))
        if bad is not None:
            fail(f"num_nodes[{bad[0]}] = {int(num_nodes[bad])} is outside [1, N = {nodes}]")
        n = num_nodes.to(torch.int64)
    else:
        n = torch.full((batch,), nodes, dtype=torch.int64)
    bad = first_bad(parents[:, 0] != -1)
    if bad is not None:
        fail(f"parents[{bad[0]}, 0] = {int(parents[bad[0], 0])} must be -1 (node 0 is the root)")
    idx = torch.arange(nodes)
    used = (idx >= 1) & (idx < n[:, None])
    bad = first_bad(used & ((parents < 0) | (parents >= idx)))
    if bad is not None:
        b, i = bad
        fail(f"parents[{b}, {i}] = {int(parents[b, i])} is malformed: a node's parent must be an earlier node, "
             f"in [0, {i})")
    bad = first_bad(used & ((tree_token_ids < 0) | (tree_token_ids >= vocab)))
    if bad is not None:
        b, i = bad
        fail(f"tree_token_ids[{b}, {i}] = {int(tree_token_ids[b, i])} is outside the vocabulary [0, {vocab})")


def check_chain_values(draft_token_ids: torch.Tensor, num_draft_tokens: torch.Tensor, max_draft: int,
                       vocab: int, reject_invalid_drafts: bool = False) -> None:
    """Value checks (CPU tensors) of the padded chain layout: num_draft_tokens in [0, K], the used
    draft ids (slots k < n_b) in [0, vocab) unless ``reject_invalid_drafts`` (then any id is allowed:
    an id outside the vocabulary is rejected at its position)."""
    bad = first_bad((num_draft_tokens < 0) | (num_draft_tokens > max_draft))
    if bad is not None:
        fail(f"num_draft_tokens[{bad[0]}] = {int(num_draft_tokens[bad])} is outside [0, K = {max_draft}]")
    if not reject_invalid_drafts:
        check_draft_ids(draft_token_ids, torch.arange(max_draft) < num_draft_tokens[:, None], vocab)


# ------------------------------------------------------------------- engine keywords of the chain ops


def check_reject_invalid_drafts(reject_invalid_drafts) -> bool:
    """``reject_invalid_drafts`` must be a Python bool (it selects a code path, it is not data)."""
    if not isinstance(reject_invalid_drafts, bool):
        fail(f"reject_invalid_drafts must be a bool, got {reject_invalid_drafts!r}")
    return reject_invalid_drafts


def check_bonus_token_ids(bonus_token_ids, batch: int, device: torch.device, ref_name: str):
    """bonus_token_ids: None, or int32/int64 [B] or [B, 1] on the target's device. Returns None or a
    [B] view (no copy)."""
    if bonus_token_ids is None:
        return None
    check_tensor(bonus_token_ids, "bonus_token_ids")
    if bonus_token_ids.dim() == 2 and tuple(bonus_token_ids.shape) == (batch, 1):
        bonus_token_ids = bonus_token_ids.view(batch) if bonus_token_ids.is_contiguous() \
            else bonus_token_ids[:, 0]
    check_shape(bonus_token_ids, (batch,), "bonus_token_ids", "[B] or [B, 1]")
    check_dtype(bonus_token_ids, INDEX_DTYPES, "bonus_token_ids")
    check_device(bonus_token_ids, device, "bonus_token_ids", ref_name)
    return bonus_token_ids


def check_bonus_values(bonus_token_ids: torch.Tensor, vocab: int) -> None:
    """Value check (CPU tensors): every bonus id lies in [0, vocab)."""
    bad = first_bad((bonus_token_ids < 0) | (bonus_token_ids >= vocab))
    if bad is not None:
        fail(f"bonus_token_ids[{bad[0]}] = {int(bonus_token_ids[bad])} is outside the vocabulary [0, {vocab})")


def check_synthetic_rates(rates, num_positions: int, device: torch.device, ref_name: str):
    """synthetic_acceptance_rates: None, or float32 [R] with R >= K (the draft positions), on the
    target's device. Returns the tensor unchanged."""
    if rates is None:
        return None
    check_tensor(rates, "synthetic_acceptance_rates")
    check_rank(rates, 1, "synthetic_acceptance_rates", "[R], R >= K")
    check_dtype(rates, (torch.float32,), "synthetic_acceptance_rates")
    check_device(rates, device, "synthetic_acceptance_rates", ref_name)
    if rates.shape[0] < num_positions:
        fail(f"synthetic_acceptance_rates must have one rate per draft position (R >= K = {num_positions}), "
             f"got shape {list(rates.shape)}")
    return rates


def check_synthetic_values(rates: torch.Tensor) -> None:
    """Value check (CPU tensors): every rate lies in [0, 1] (NaN is refused)."""
    bad = first_bad(~((rates >= 0) & (rates <= 1)))
    if bad is not None:
        fail(f"synthetic_acceptance_rates[{bad[0]}] = {float(rates[bad])} is outside [0, 1]")


def check_keyword_values(bonus_token_ids, rates, vocab: int) -> None:
    """Value checks (CPU tensors) of the chain ops' engine keywords, either of them None: bonus ids in
    [0, vocab), rates in [0, 1] (the GPU clamps the bonus ids and uses the rates as given)."""
    if bonus_token_ids is not None:
        check_bonus_values(bonus_token_ids, vocab)
    if rates is not None:
        check_synthetic_values(rates)


def check_tree_inputs(tree_token_ids, parents, num_nodes, batch: int, nodes: int, device: torch.device,
                      ref_name: str) -> None:
    """Shapes, dtypes and devices of a token tree: tree_token_ids and parents [B, N], num_nodes [B] or None."""
    for t, name in ((tree_token_ids, "tree_token_ids"), (parents, "parents")):
        check_index_tensor(t, (batch, nodes), name, "[B, N]", device, ref_name)
    if num_nodes is not None:
        check_index_tensor(num_nodes, (batch,), "num_nodes", "[B]", device, ref_name)


def check_probs(target_probs, draft_probs, draft_shape, shape_str, same_dtype: bool = False):
    """Checked (target_probs, draft_probs) of the probability ops; probabilities of two different dtypes
    are both taken as float32 (a copy: the kernels compute in float32 anyway), or refused with
    ``same_dtype`` (the ops' own rule: their impls take what a wrapper passes them)."""
    check_dtype(target_probs, PROB_DTYPES, "target_probs")
    if target_probs.shape[-1] == 0:
        fail("target_probs must have a non-empty vocab dimension V")
    if draft_probs is not None:
        check_shape(draft_probs, draft_shape, "draft_probs", shape_str)
        check_dtype(draft_probs, PROB_DTYPES, "draft_probs")
        check_device(draft_probs, target_probs.device, "draft_probs", "target_probs")
        if draft_probs.dtype != target_probs.dtype:
            if same_dtype:
                fail(f"draft_probs must have the dtype of target_probs ({target_probs.dtype}), got "
                     f"{draft_probs.dtype}")
            target_probs, draft_probs = target_probs.float(), draft_probs.float()
    return target_probs, draft_probs
