"""Merging partial attentions (DESIGN.md §5.4) and the flash-attn cascade built on it.

Public function: :func:`merge_attention_states`, the exact softmax merge of two
partial attentions over disjoint key sets. ``tree_attention(prefix_backend="flash_attn")``
runs the prefix in flash-attn and the tree in the Triton kernel and merges them here
(:func:`_cascade_flash_attn`). Fake impls, the CPU composite and the Triton launcher
live here too.
"""

from __future__ import annotations

import torch

from . import _ops, reference
from ._backend import next_pow2, resolve_backend
from ._checks import PROB_DTYPES, check_device, check_dtype, check_shape, check_tensor, fail

__all__ = ["merge_attention_states"]

ATTN_DTYPES = PROB_DTYPES  # float32, float16, bfloat16


def _cascade_flash_attn(q, k_cache, v_cache, prefix_lens, mask, block_table, sm_scale):
    """Prefix in flash-attn (varlen, LSE out), tree keys in the Triton kernel, merged (GPU only)."""
    if q.device.type != "cuda" or block_table is not None:
        fail("prefix_backend='flash_attn' needs CUDA tensors and a contiguous cache")
    try:
        from flash_attn import flash_attn_varlen_func
    except ImportError as exc:
        fail(f"prefix_backend='flash_attn' needs the flash_attn package ({exc})")
    batch, n, hq, d = q.shape
    s = k_cache.shape[1]
    # Prefix: queries [B * N], keys of request b are its first prefix_lens[b] slots.
    lens = prefix_lens.to(torch.int32)
    cu_q = torch.arange(0, (batch + 1) * n, n, dtype=torch.int32, device=q.device)
    cu_k = torch.zeros(batch + 1, dtype=torch.int32, device=q.device)
    cu_k[1:] = torch.cumsum(lens, 0)
    slot = torch.arange(s, device=q.device)
    keep = slot[None, :] < lens[:, None]
    k_packed = k_cache[keep]  # data-dependent shape: this path syncs (documented)
    v_packed = v_cache[keep]
    out_p, lse_p, _ = flash_attn_varlen_func(q.reshape(batch * n, hq, d), k_packed, v_packed, cu_q, cu_k, n,
                                             s, softmax_scale=sm_scale, causal=False, return_attn_probs=True)
    lse_p = lse_p.reshape(hq, batch, n).permute(1, 2, 0) if lse_p.dim() == 2 else lse_p.reshape(batch, hq, n)\
        .transpose(1, 2)
    lse_p = torch.where(lens[:, None, None] > 0, lse_p.float(), float("-inf"))
    out_p = torch.where(lens[:, None, None, None] > 0, out_p.reshape(batch, n, hq, d), 0)
    # Tree part only: the Triton kernel with an empty prefix over keys shifted to the tree's slots.
    from .attention import _launch_tree_attention  # the tree part (specdec_ops.attention imports this module)

    out_t, lse_t = _launch_tree_attention(q, k_cache, v_cache, prefix_lens, mask, None, sm_scale, skip_prefix=True)
    return torch.ops.specdec.merge_attention_states_triton.default(out_p.contiguous(), lse_p.contiguous(), out_t,
                                                                   lse_t)


# ---------------------------------------------------------------------------------------------- merge


def _check_merge_args(out_a, lse_a, out_b, lse_b) -> None:
    check_tensor(out_a, "out_a")
    if out_a.dim() < 1:
        fail("out_a must have at least 1 dim [..., D]")
    check_dtype(out_a, ATTN_DTYPES, "out_a")
    for t, name in ((out_b, "out_b"),):
        check_shape(t, tuple(out_a.shape), name, "[..., D] (the shape of out_a)")
        if t.dtype != out_a.dtype:
            fail(f"{name} must have the dtype of out_a ({out_a.dtype}), got {t.dtype}")
        check_device(t, out_a.device, name, "out_a")
    for t, name in ((lse_a, "lse_a"), (lse_b, "lse_b")):
        check_shape(t, tuple(out_a.shape[:-1]), name, "[...] (out_a's shape without D)")
        check_dtype(t, (torch.float32,), name)
        check_device(t, out_a.device, name, "out_a")


def merge_attention_states(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor, *,
                           backend: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact softmax merge of two partial attentions over disjoint key sets.

    Parameters
    ----------
    out_a, out_b : float32 | float16 | bfloat16 [..., D] (e.g. [B, N, H, D])
        Normalized partial outputs.
    lse_a, lse_b : float32 [...]
        Their natural-log log-sum-exp of the scores (flash-attn convention); -inf for a
        side that saw no key, which then contributes nothing.
    backend : None | "cuda" | "triton" | "cpu" | "reference"

    Returns
    -------
    (out [..., D] in out_a's dtype, lse float32 [...])
        ``lse = log(e^lse_a + e^lse_b)``, ``out = (e^lse_a out_a + e^lse_b out_b) / e^lse``;
        both sides -inf gives out 0 and lse -inf (never NaN).
    """
    _check_merge_args(out_a, lse_a, out_b, lse_b)
    backend = resolve_backend(backend, out_a.device, "merge_attention_states",
                              native_op="merge_attention_states", triton_op="merge_attention_states_triton")
    if backend == "reference":
        return reference.merge_attention_states(out_a, lse_a, out_b, lse_b)
    op = (torch.ops.specdec.merge_attention_states if backend in ("cpu", "cuda")
          else torch.ops.specdec.merge_attention_states_triton)
    out, lse = op.default(out_a, lse_a, out_b, lse_b)
    return out, lse


# ---------------------------------------------------------------------------------------------- CPU composites

def _merge_fp32(out_a, lse_a, out_b, lse_b):
    """Merge in float32 (out [..., D], lse [...]); -inf sides contribute nothing."""
    lse = torch.logaddexp(lse_a, lse_b)
    finite = lse > float("-inf")
    safe = torch.where(finite, lse, torch.zeros_like(lse))
    wa = torch.where(finite, torch.exp(lse_a - safe), torch.zeros_like(lse)).unsqueeze(-1)
    wb = torch.where(finite, torch.exp(lse_b - safe), torch.zeros_like(lse)).unsqueeze(-1)
    zero = torch.zeros((), dtype=torch.float32)
    return torch.where(wa > 0, wa * out_a, zero) + torch.where(wb > 0, wb * out_b, zero), lse


def _merge_cpu(out_a, lse_a, out_b, lse_b):
    _check_merge_args(out_a, lse_a, out_b, lse_b)
    out, lse = _merge_fp32(out_a.float(), lse_a, out_b.float(), lse_b)
    # contiguous whatever the inputs' strides, as the fake and the Triton kernel give them
    return out.to(out_a.dtype).contiguous(), lse.contiguous()


# ---------------------------------------------------------------------------------------------- fake


def _fake_merge(out_a, lse_a, out_b, lse_b):
    torch._check(out_b.shape == out_a.shape, lambda: "out_b must have the shape of out_a")
    return (torch.empty_like(out_a, memory_format=torch.contiguous_format),
            out_a.new_empty(out_a.shape[:-1], dtype=torch.float32))


# ---------------------------------------------------------------------------------------------- triton


def _merge_triton(out_a, lse_a, out_b, lse_b):
    from .triton_kernels.tree_attention import merge_states_kernel

    _check_merge_args(out_a, lse_a, out_b, lse_b)
    d = out_a.shape[-1]
    rows = lse_a.numel()
    out = torch.empty(out_a.shape, dtype=out_a.dtype, device=out_a.device)
    lse = torch.empty(out_a.shape[:-1], dtype=torch.float32, device=out_a.device)
    if rows == 0 or d == 0:
        if rows:
            lse.copy_(torch.logaddexp(lse_a, lse_b))
        return out, lse
    merge_states_kernel[(rows,)](
        out_a.contiguous(), lse_a.contiguous(), out_b.contiguous(), lse_b.contiguous(), out, lse, d,
        BLOCK_D=max(16, next_pow2(d)),
    )
    return out, lse


if _ops.native_loaded():
    for _name in ("merge_attention_states", "merge_attention_states_triton"):
        torch.library.register_fake(f"specdec::{_name}")(_fake_merge)
    torch.library.impl("specdec::merge_attention_states", "CPU")(_merge_cpu)
    torch.library.impl("specdec::merge_attention_states", "CUDA")(_merge_triton)
    torch.library.impl("specdec::merge_attention_states_triton", ("CPU", "CUDA"))(_merge_triton)
