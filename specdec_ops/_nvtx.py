"""NVTX ranges for Nsight Systems (no-ops without CUDA)."""

from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def nvtx_range(name: str, device: str | None = None):
    """Mark a region named `name` on the NVTX timeline when `device` is "cuda" (None: when CUDA is available)."""
    if device == "cuda" or (device is None and torch.cuda.is_available()):
        torch.cuda.nvtx.range_push(name)
        try:
            yield
        finally:
            torch.cuda.nvtx.range_pop()
    else:
        yield
