"""Loads the native library (every schema of the ``specdec`` namespace) and says
which kernels it holds."""

from __future__ import annotations

import torch

try:  # importing _C runs TORCH_LIBRARY(specdec, ...) and the CPU/CUDA registrations
    from . import _C  # noqa: F401

    NATIVE_ERROR: Exception | None = None
except ImportError as exc:  # pragma: no cover - only without a build
    NATIVE_ERROR = exc


def native_loaded() -> bool:
    return NATIVE_ERROR is None


def constant_under_compile(fn):
    """``torch.compiler.assume_constant_result(fn)`` without importing ``torch._dynamo``.

    The decorator only marks ``fn`` (the attribute Dynamo reads when it traces a call to it), but on
    torch 2.11 to 2.14 at least ``torch.compiler``'s wrapper imports
    ``torch._dynamo`` first: about 1.5 s of every process's ``import specdec_ops``, which otherwise
    costs some 0.1 s beyond ``import torch``. tests/test_ops_import.py checks that the mark is the one
    torch's own decorator sets."""
    fn._dynamo_marked_constant = True
    return fn


@constant_under_compile  # registrations are fixed at import: constant under torch.compile
def has_kernel(op: str, dispatch_key: str) -> bool:
    """Whether ``specdec::<op>`` has a kernel registered for ``dispatch_key`` ("CPU", "CUDA")."""
    if not native_loaded():
        return False
    return torch._C._dispatch_has_kernel_for_dispatch_key(f"specdec::{op}", dispatch_key)


def cuda_kernels_built() -> bool:
    """True when specdec_ops._C was compiled with its CUDA kernels."""
    return has_kernel("rejection_sample", "CUDA")
