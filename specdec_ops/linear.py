"""Few-row linear products on the CPU: :func:`skinny_linear`.

A verify forward of a decode step multiplies every weight matrix of the target by the few rows of its
window (1 + the draft's tokens per request). Over a few rows a CPU torch's sgemm reaches neither the
memory bound nor the arithmetic one; ``skinny_linear`` is a kernel for exactly that product
(``csrc/linear/linear_cpu.cpp``: every weight element read from memory once; with AVX-512 dot-product
tiles of 16 or 8 weight rows x 1-2 rows of x up to 3 rows, from 4 rows broadcast tiles whose vectors run
across rows of x; dot-product tiles of 4 x 2 with AVX2). Measured over SmolLM2-135M's 211 weight matrices
(538 MB of float32, one thread, an Intel Xeon with AVX-512; ms for 1 / 2 / 4 / 8 / 16 / 32 rows): F.linear
43.8 / 44.9 / 73.6 / 98.6 / 105.8 / 116.1, this kernel 42.9 / 48.8 / 51.2 / 56.1 / 71.2 / 103.4
(``python bench/bench_forward_cost.py --products``, bench/forward_cost.json; on an AMD EPYC, whose BLAS
multiplies few rows far more slowly, 1 row 46.6 against 26.4). The decode loop uses it for CPU windows of up to
``decoding.forward.SKINNY_ROWS`` rows (``decoding.forward.narrow_linears``) when torch runs one intra-op
thread, except at the 1-4 rows where the model's start-up timing found F.linear faster
(``decoding.forward.linear_choice``); the kernel itself runs on one thread (the package's C++ CPU kernels are
compiled without OpenMP, so ``at::parallel_for`` runs serially).

It is CPU-only and float32-only: a GPU multiplies a few rows with cuBLAS at its memory bound.
"""

from __future__ import annotations

import functools

import torch

from . import _ops
from ._checks import SpecDecArgumentError, call_native

__all__ = ["ISAS", "skinny_linear", "skinny_linear_isa"]

ISAS = ("scalar", "avx2", "avx512")   # skinny_linear's code paths, narrowest first


@functools.cache
def skinny_linear_isa() -> str | None:
    """The widest instruction set :func:`skinny_linear` runs with on this CPU (one of :data:`ISAS`: AVX-512
    and AVX2 need FMA too), or None without the native library."""
    if not _ops.native_loaded():
        return None
    return ISAS[int(torch.ops.specdec.skinny_linear_isa())]


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                  isa: str | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for float32 CPU tensors, fast when ``x`` has few rows.

    Parameters
    ----------
    x : float32 [..., I] on the CPU (its rows are ``x.numel() // I``; any number works, 1-16 is what the
        kernel is for)
    weight : float32 [O, I] on the CPU (an ``nn.Linear`` weight)
    bias : float32 [O] on the CPU, or None
    isa : None (the widest this CPU has) or one of :data:`ISAS` at most that wide (tests run each path)

    Returns
    -------
    out : float32 [..., O], contiguous: ``out[..., o] = sum_i x[..., i] * weight[o, i] + bias[o]``, each a dot
        product summed in vector lanes and then across them (equal to F.linear to rounding).

    Raises SpecDecArgumentError naming the argument for a wrong device, dtype or shape, or an ``isa`` this
    CPU lacks.
    """
    if not _ops.native_loaded():
        raise SpecDecArgumentError(f"skinny_linear needs the native library, which failed to load: "
                                   f"{_ops.NATIVE_ERROR}")
    for name, t in (("x", x), ("weight", weight), ("bias", bias)):
        if t is None and name == "bias":
            continue
        if not isinstance(t, torch.Tensor):
            raise SpecDecArgumentError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.device.type != "cpu":
            raise SpecDecArgumentError(f"{name} must be on the CPU (skinny_linear has a CPU kernel only), got "
                                       f"{t.device}")
    if isa is None:
        code = -1
    elif isa in ISAS:
        code = ISAS.index(isa)
    else:
        raise SpecDecArgumentError(f"isa must be None or one of {ISAS}, got {isa!r}")
    return call_native(torch.ops.specdec.skinny_linear.default, x, weight, bias, code)


def _fake_skinny_linear(x, weight, bias=None, isa=-1):
    torch._check(x.dim() >= 1 and weight.dim() == 2 and x.shape[-1] == weight.shape[1],
                 lambda: f"skinny_linear: x [..., I] and weight [O, I], got {list(x.shape)} and {list(weight.shape)}")
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


if _ops.native_loaded():
    torch.library.register_fake("specdec::skinny_linear")(_fake_skinny_linear)
