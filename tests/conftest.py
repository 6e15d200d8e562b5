"""Shared test setup.

Without a GPU the Triton kernels run under the interpreter: TRITON_INTERPRET=1
must be set before triton is first imported, so it is set here, at collection.
Tests marked `cuda` skip without a CUDA device.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import importlib.util  # noqa: E402

import pytest  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
HAS_TRITON = importlib.util.find_spec("triton") is not None

# Backends that run on CPU tensors here: C++, plain PyTorch, Triton interpreter.
CPU_BACKENDS = ["cpu", "reference"] + (["triton"] if HAS_TRITON else [])


def pytest_collection_modifyitems(config, items):
    skip_cuda = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_cuda)


@pytest.fixture(params=CPU_BACKENDS)
def cpu_backend(request):
    """Each backend that runs on CPU tensors (triton: interpreter)."""
    return request.param
