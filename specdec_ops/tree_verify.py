"""Lossless tree verification: tree rejection sampling (DESIGN.md §5.3).

Public function: :func:`tree_rejection_sample`. Fake impls for torch.compile
and the Triton launcher live here too.
"""

from __future__ import annotations

import torch

from . import _ops, reference
from ._backend import impl_checks_values, next_pow2, resolve_backend, values_checked_here
from ._checks import (call_native, check_greedy, check_op_rng, check_probs, check_rank, check_tree_inputs,
                      check_tree_values, fail, rng_inputs)
from .types import TreeSampleOutput

__all__ = ["tree_rejection_sample"]


def _check_args(target_probs, tree_token_ids, parents, num_nodes, draft_probs, seeds, offsets, greedy, op=False):
    """Shapes, dtypes and devices of tree_rejection_sample's arguments, as the C++ op checks them
    (csrc/tree_verify/tree_verify_op.cpp check_args); metadata only. Returns (target_probs, draft_probs, seeds,
    offsets, greedy). The wrapper (op=False) normalizes (seeds=None drawn, int32 widened, draft_probs of another
    dtype read as float32); the Triton op's impl (op=True) takes the schema's: int64 seeds and offsets,
    draft_probs in target_probs' dtype."""
    check_rank(target_probs, 3, "target_probs", "[B, N, V]")
    batch, nodes, vocab = target_probs.shape
    if nodes < 1:
        fail(f"target_probs must have N >= 1 nodes (node 0 is the root), got shape {list(target_probs.shape)}")
    target_probs, draft_probs = check_probs(target_probs, draft_probs, (batch, nodes, vocab), "[B, N, V]",
                                            same_dtype=op)
    device = target_probs.device
    check_tree_inputs(tree_token_ids, parents, num_nodes, batch, nodes, device, "target_probs")
    seeds, offsets = (check_op_rng if op else rng_inputs)(seeds, offsets, batch, device, "target_probs")
    return target_probs, draft_probs, seeds, offsets, check_greedy(greedy, batch, device, "target_probs")


def tree_rejection_sample(
    target_probs: torch.Tensor,
    tree_token_ids: torch.Tensor,
    parents: torch.Tensor,
    num_nodes: torch.Tensor | None = None,
    draft_probs: torch.Tensor | None = None,
    *,
    seeds: torch.Tensor | None = None,
    offsets: torch.Tensor | None = None,
    greedy: torch.Tensor | None = None,
    backend: str | None = None,
) -> TreeSampleOutput:
    """Verify a draft token tree losslessly (multi-step speculative sampling).

    Starting at the root (node 0) with p' = p_0: try the children of the current
    node u in index order. With ``draft_probs`` (children drawn i.i.d. from q_u,
    duplicates allowed) accept child c with token x iff ``u_c * q_u(x) < p'(x)``; on
    rejection ``p' <- max(p' - q_u, 0)`` normalized. Without (deterministic,
    distinct children, e.g. top-k) accept iff ``u_c * sum(p') < p'(x)``; on
    rejection zero p'(x). On acceptance move to c with p' = p_c. When no child is
    accepted (or u is a leaf) emit a token drawn from p' by an exponential race
    and stop. An update that would leave p' without mass (rounding) is skipped.
    Greedy requests follow the first child whose token is argmax p_u (first index
    on ties) and otherwise emit argmax p_u. The emitted tokens are distributed
    exactly as sampling from the target token by token. NaN or negative
    probabilities count as zero mass; a p' without any mass emits token 0.

    Parameters
    ----------
    target_probs : float32 | float16 | bfloat16 [B, N, V]
        Row u is the target distribution after node u (the distribution of u's children).
    tree_token_ids : int32 | int64 [B, N]
        Token of each node; entry 0 (the root, the last committed token) is ignored.
    parents : int32 | int64 [B, N]
        parents[b, 0] = -1 and 0 <= parents[b, i] < i for 1 <= i < num_nodes[b];
        entries of padding nodes are ignored (conventionally -1).
    num_nodes : int32 | int64 [B], optional
        Nodes per request, in [1, N], root included; nodes >= num_nodes[b] are
        padding. None means N.
    draft_probs : [B, N, V] float32 / bfloat16 / float16, optional (another dtype than
        target_probs' makes both be read as float32: a copy)
        Row u is q_u, the distribution u's children were drawn from. None means
        deterministic children (accept with probability p'(x) / sum(p')).
    seeds, offsets : int64 [B], optional
        Random numbers are a pure function of (seeds[b], offsets[b], position,
        purpose, vocab index) (Philox4x32-10, identical on every backend). The
        uniform for child c sits at position c - 1, so a chain-shaped tree gives
        exactly :func:`rejection_sample`'s result for the same seeds (draft_probs;
        without draft_probs when the rows sum to exactly 1). seeds=None draws one
        per request from torch's default generator for the device (on the host for
        CPU tensors; on the GPU with torch's CUDA generator: no host sync), and is
        refused under CUDA graph capture; offsets=None means 0.
        Tensors, not ints, so a CUDA graph can replay with new values.
    greedy : bool [B], optional
        True: argmax verification for that request.
    backend : None | "cuda" | "triton" | "cpu" | "reference"

    Returns
    -------
    TreeSampleOutput(token_ids, accepted_path, num_accepted)
        token_ids : int64 [B, N]: tokens of the accepted nodes a1 .. ak, then the
        final (correction or bonus) token, then -1. accepted_path : int32 [B, N]:
        0, a1, ..., ak, then -1; it feeds :func:`kv_commit` as is. num_accepted :
        int32 [B]: k; request b emits k + 1 tokens.

    On CPU, malformed parents, num_nodes outside [1, N] and child token ids
    outside [0, V) raise ValueError naming the argument and the element. On the
    GPU (no host sync) a malformed parent is treated as the root, a child token
    outside [0, V) is rejected and num_nodes is clamped into [1, N]. The outputs
    have fixed shapes (CUDA-graph safe); the CUDA kernel uses a per-call workspace.

    Example
    -------
    >>> p = torch.softmax(torch.randn(1, 4, 100), -1)
    >>> parents = torch.tensor([[-1, 0, 0, 1]])           # root -> {1, 2}, 1 -> {3}
    >>> tokens = torch.tensor([[0, 17, 42, 5]])
    >>> out = tree_rejection_sample(p, tokens, parents)
    >>> out.accepted_path.shape, out.token_ids.shape
    (torch.Size([1, 4]), torch.Size([1, 4]))
    """
    target_probs, draft_probs, seeds, offsets, greedy = _check_args(target_probs, tree_token_ids, parents, num_nodes,
                                                                    draft_probs, seeds, offsets, greedy)
    device = target_probs.device
    backend = resolve_backend(backend, device, "tree_rejection_sample", native_op="tree_rejection_sample",
                              triton_op="tree_rejection_sample_triton")

    if values_checked_here(device, backend):  # the reference: the C++ op and the Triton impl check their own
        check_tree_values(tree_token_ids, parents, num_nodes, target_probs.shape[2])

    if backend == "reference":
        return reference.tree_rejection_sample(target_probs, tree_token_ids, parents, num_nodes, draft_probs,
                                               seeds=seeds, offsets=offsets, greedy=greedy)
    op = (torch.ops.specdec.tree_rejection_sample if backend in ("cpu", "cuda")
          else torch.ops.specdec.tree_rejection_sample_triton)
    token_ids, accepted_path, num_accepted = call_native(op.default, target_probs, tree_token_ids, parents, num_nodes,
                                                         draft_probs, seeds, offsets, greedy)
    return TreeSampleOutput(token_ids, accepted_path, num_accepted)


# ---------------------------------------------------------------------------------------------- fakes


def _fake_outputs(target_probs):
    batch, nodes = target_probs.shape[0], target_probs.shape[1]
    return (target_probs.new_empty((batch, nodes), dtype=torch.int64),
            target_probs.new_empty((batch, nodes), dtype=torch.int32),
            target_probs.new_empty((batch,), dtype=torch.int32))


def _fake_tree(target_probs, tree_token_ids, parents, num_nodes, draft_probs, seeds, offsets, greedy):
    torch._check(target_probs.dim() == 3, lambda: "target_probs must be 3-D [B, N, V]")
    return _fake_outputs(target_probs)


# ---------------------------------------------------------------------------------------------- triton


_TRITON_WARPS = 4
_RESIDENT_PER_SM = 4  # programs per SM a split launch counts on (the CUDA tree kernel's launch bound)
# The Triton kernel's register cap (ptxas .maxnreg): 128 x 128 threads keeps the 4 programs per SM the layout counts
# on. Without it the exact block size (.reqntid) lets ptxas trade registers for occupancy and spill: 4-56 B in some
# variants under the ptxas of Triton 3.6 (CUDA 12.8) and 3.9 (CUDA 13.4); with it none spills (108-119 registers).
_TRITON_MAXNREG = 128
_VBLOCK = 4096        # GPU: the first pass's tile (4 entries per thread in each of 8 programs of 4 warps)


def _tree_parts(batch: int, vblock: int, chunk: int, device: torch.device) -> int:
    """Programs per request of the Triton kernel's first pass (PARTS): a power of two, at most vblock / chunk
    (8 at a large vocab: every program holds >= 4 entries per thread) and, on a GPU, at most what fills the
    device once (batch x PARTS <= SMs x 4), as the CUDA kernel's layout_for; 2 (1 for tiny rows) under the
    interpreter, which runs programs one after another. From shapes and the device only (no sync)."""
    if device.type != "cuda":
        return 2 if vblock >= 8 else 1
    resident = torch.cuda.get_device_properties(device).multi_processor_count * _RESIDENT_PER_SM
    parts = 1
    while 2 * parts <= vblock // chunk and batch * 2 * parts <= resident:
        parts *= 2
    return parts


def _tree_layout(batch, vocab, device, parts=None, block=None, vblock=None, chunk=None, unroll=None):
    """(BLOCK, VBLOCK, PARTS, CHUNK, UNROLL) of a launch; the keywords override (tests). VBLOCK depends on the
    vocab and the device type only, so a request's result does not depend on the batch."""
    interpreting = device.type != "cuda"
    if block is None:
        block = max(4, min(next_pow2(vocab), 8192 if interpreting else 1024))  # philox_tile: multiple of 4
    if vblock is None:
        vblock = block if interpreting else max(4, min(next_pow2(vocab), _VBLOCK))
    if parts is None:
        parts = _tree_parts(batch, vblock, vblock // 2 if interpreting else min(vblock, 4 * 32 * _TRITON_WARPS),
                            device)
    if chunk is None:
        chunk = vblock // parts if interpreting else min(vblock // parts, 4 * 32 * _TRITON_WARPS)
    if unroll is None:
        unroll = 1 if interpreting else 2
    for name, value in (("block", block), ("vblock", vblock), ("parts", parts), ("chunk", chunk)):
        if value < 1 or value & (value - 1):
            raise ValueError(f"{name} must be a power of two, got {value}")
    if block % 4 or chunk % 4 or vblock % (parts * chunk) or unroll < 1:
        raise ValueError(f"bad layout: block={block} vblock={vblock} parts={parts} chunk={chunk} unroll={unroll}")
    return block, vblock, parts, chunk, unroll


def _triton_tree(target_probs, tree_token_ids, parents, num_nodes, draft_probs, seeds, offsets, greedy, **layout):
    """specdec::tree_rejection_sample_triton: the C++ op's checks (shapes, dtypes and devices always; the tree's
    values on CPU tensors), then the launch of triton_kernels/tree_verify.py; `layout` (parts, block, vblock,
    chunk, unroll) overrides _tree_layout's choice (tests)."""
    from .triton_kernels.tree_verify import tree_verify_kernel

    _check_args(target_probs, tree_token_ids, parents, num_nodes, draft_probs, seeds, offsets, greedy, op=True)
    if impl_checks_values(target_probs.device):
        check_tree_values(tree_token_ids, parents, num_nodes, target_probs.shape[2])

    token_ids, accepted_path, num_accepted = _fake_outputs(target_probs)
    batch, nodes, vocab = target_probs.shape
    if batch == 0:
        return token_ids, accepted_path, num_accepted
    target = target_probs.contiguous()
    has_draft = draft_probs is not None
    block, vblock, parts, chunk, unroll = _tree_layout(batch, vocab, target.device, **layout)
    # Per-request scratch of the node being tried: normalizers (draft_probs) or zeroed tokens; per program the
    # root's children's tokens (no draft_probs); the first pass's lane sums and partials; the tickets (zeroed).
    normalizers = target.new_empty((batch * nodes if has_draft else 1,), dtype=torch.float32)
    zeroed = target.new_empty((1 if has_draft else batch * nodes,), dtype=torch.int32)
    kids = target.new_empty((1 if has_draft else batch * parts * nodes,), dtype=torch.int32)
    lane_sums = target.new_empty((batch * vblock,), dtype=torch.float32)
    part_best = target.new_empty((batch * parts,), dtype=torch.float32)
    part_index = target.new_empty((batch * parts,), dtype=torch.int32)
    part_count = target.new_empty((batch * parts,), dtype=torch.int64)
    tickets = target.new_zeros((batch,), dtype=torch.int32) if parts > 1 else part_index
    tree_verify_kernel[(batch, parts)](
        target, draft_probs.contiguous() if has_draft else target,
        tree_token_ids.contiguous().to(torch.int64), parents.contiguous().to(torch.int64),
        seeds if num_nodes is None else num_nodes.contiguous().to(torch.int64),
        seeds.contiguous(), offsets.contiguous(), seeds if greedy is None else greedy.contiguous(),
        normalizers, zeroed, kids, lane_sums, part_best, part_index, part_count, tickets,
        token_ids, accepted_path, num_accepted,
        nodes, vocab,
        HAS_NUM_NODES=num_nodes is not None, HAS_DRAFT_PROBS=has_draft, HAS_GREEDY=greedy is not None,
        BLOCK_N=next_pow2(nodes), BLOCK=block, VBLOCK=vblock, PARTS=parts, CHUNK=chunk, UNROLL=unroll,
        TILES=next_pow2(-(-vocab // vblock)), num_warps=_TRITON_WARPS, maxnreg=_TRITON_MAXNREG,
    )
    return token_ids, accepted_path, num_accepted


if _ops.native_loaded():
    torch.library.register_fake("specdec::tree_rejection_sample")(_fake_tree)
    torch.library.register_fake("specdec::tree_rejection_sample_triton")(_fake_tree)
    torch.library.impl("specdec::tree_rejection_sample_triton", ("CPU", "CUDA"))(_triton_tree)
