"""Argument checks shared by the Python wrappers (DESIGN.md §4): every message
names the argument and says what was expected."""

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
