"""Backend choice (DESIGN.md §4).

backend=None picks the best available: the CUDA kernel (or Triton) for CUDA
tensors, the C++ kernel for CPU tensors. "cuda", "triton", "cpu" and
"reference" force one and raise BackendUnavailableError when it cannot run.
"triton" accepts CPU tensors when TRITON_INTERPRET=1 was set before triton was
imported (how the Triton kernels are tested without a GPU).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib.util
import os
from collections.abc import Sequence

import torch

from . import _ops
from ._checks import BackendUnavailableError, SpecDecArgumentError

BACKENDS = ("cuda", "triton", "cpu", "reference")


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (the current device for an index-less one); cached."""
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (>= 1): Triton block sizes."""
    return 1 << max(0, int(n) - 1).bit_length()


@functools.cache
def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def triton_interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _why_unavailable(backend: str, device: torch.device, op: str, native_op: str | None,
                     triton_op: str | None) -> str | None:
    if backend == "reference":
        return None
    if backend == "cpu":
        if device.type != "cpu":
            return f"backend='cpu' needs CPU tensors, got {device}"
        if native_op is None or not _ops.has_kernel(native_op, "CPU"):
            return f"{op} has no C++ CPU kernel in this build ({_ops.NATIVE_ERROR or 'not registered'})"
        return None
    if backend == "cuda":
        if device.type != "cuda":
            return f"backend='cuda' needs CUDA tensors, got {device}"
        if native_op is None or not _ops.has_kernel(native_op, "CUDA"):
            return (f"{op} has no CUDA kernel in this build (specdec_ops was built without CUDA, "
                    "or the op has none): use backend='triton' or rebuild with a CUDA torch and nvcc")
        return None
    if backend == "triton":
        if triton_op is None:
            return f"{op} has no Triton kernel"
        if not triton_available():
            return "backend='triton' needs the triton package (pip install triton)"
        if device.type == "cuda":
            return None
        if device.type == "cpu" and triton_interpreting():
            return None
        return (f"backend='triton' needs CUDA tensors, or CPU tensors with TRITON_INTERPRET=1 set before "
                f"triton is imported; got {device}")
    raise SpecDecArgumentError(f"backend must be one of None, {', '.join(repr(b) for b in BACKENDS)}; got {backend!r}")


def _resolve_uncached(backend: str | None, device: torch.device, op: str, native_op: str | None,
                      triton_op: str | None) -> str:
    if backend is not None:
        why = _why_unavailable(backend, device, op, native_op, triton_op)
        if why is not None:
            raise BackendUnavailableError(f"{op}: {why}")
        return backend
    if device.type == "meta" and native_op is not None and _ops.has_kernel(native_op, "Meta"):
        return "cpu"      # the native op's meta kernel: output shapes and dtypes, no data
    order: Sequence[str] = ("cuda", "triton") if device.type == "cuda" else ("cpu",)
    for candidate in order:
        if _why_unavailable(candidate, device, op, native_op, triton_op) is None:
            return candidate
    return "reference"


_RESOLVED: dict[tuple, str] = {}


@_ops.constant_under_compile
def resolve_backend(backend: str | None, device: torch.device, op: str, *, native_op: str | None = None,
                    triton_op: str | None = None) -> str:
    """The backend to run `op` on for tensors on `device` (the one resolver of every op).

    native_op / triton_op name the specdec:: ops holding the C++/CUDA and the
    Triton kernels (None when the op has no such kernel). The answer is a constant
    of the build: torch.compile bakes it in (Dynamo cannot trace the dispatcher
    queries), and eager calls remember it per (backend, device type, op), except
    for "triton", whose availability on CPU tensors depends on TRITON_INTERPRET.
    """
    device = torch.device(device)
    key = (backend, device.type, op, native_op, triton_op)
    resolved = _RESOLVED.get(key)
    if resolved is None:
        resolved = _resolve_uncached(backend, device, op, native_op, triton_op)
        if backend != "triton":
            _RESOLVED[key] = resolved
    return resolved


def tracing() -> bool:
    """Whether the tensors at hand may hold no values: under torch.compile, or under a FakeTensorMode (make_fx,
    export, a user's fake mode), where reading a value raises. Value checks are skipped then."""
    return torch.compiler.is_compiling() or torch._guards.detect_fake_mode() is not None


def values_checked_here(device: torch.device, backend: str | None = None) -> bool:
    """Whether a Python wrapper checks index *values* itself (DESIGN.md §4).

    Values are checked on CPU tensors only (on the GPU that would need a host sync;
    bad values get the documented safe behaviour there) and not while tracing (`tracing`).
    Pass the resolved `backend` for ops whose C++ CPU kernel and Triton impl check
    values themselves: then "cpu" and "triton" are left to the op (same messages,
    also under torch.compile, where the op runs with real tensors) and the reference
    backend is checked here. backend=None: the wrapper checks for every backend.
    """
    if device.type != "cpu" or tracing():
        return False
    return backend not in ("cpu", "triton")


# True inside gpu_value_rules(), in that thread or task only (a context variable: other threads' calls keep
# their checks).
_GPU_VALUE_RULES = contextvars.ContextVar("specdec_gpu_value_rules", default=False)


def impl_checks_values(device: torch.device) -> bool:
    """Whether an op's impl (a specdec::*_triton op, as every C++ op) checks index *values*: on CPU tensors only
    (on the GPU it would need a host sync), whether or not a wrapper around it is being traced (the impl runs
    with real tensors, at run time); not inside :func:`gpu_value_rules`."""
    return device.type == "cpu" and not _GPU_VALUE_RULES.get()


@contextlib.contextmanager
def gpu_value_rules():
    """Tests: inside it the Triton ops' impls do not check index values on CPU tensors, so that the Triton
    interpreter shows what the kernels do with bad values on the GPU (DESIGN.md §4's safe behaviour).
    Shapes, dtypes and devices are still checked."""
    token = _GPU_VALUE_RULES.set(True)
    try:
        yield
    finally:
        _GPU_VALUE_RULES.reset(token)
