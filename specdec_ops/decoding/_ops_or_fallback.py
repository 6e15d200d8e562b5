"""The package ops the loop calls, with private pure-PyTorch stand-ins.

The loop is written against the public contract (DESIGN.md §5.3-§5.5):
``build_tree``, ``tree_attention_bias``, ``tree_rejection_sample`` and
``kv_commit``. While a package build lacks one of them (they are developed on
separate branches), the stand-in below with the same signature and semantics is
used instead. ``FALLBACKS`` lists which ones are in use; the stand-ins are
PRIVATE to the decode loop, plain and slow, and go away once the real ops are
everywhere.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

import specdec_ops

from .. import reference

FALLBACKS: list[str] = []


class _TreeInfo(NamedTuple):
    mask: torch.Tensor
    depth: torch.Tensor


class _TreeSampleOutput(NamedTuple):
    token_ids: torch.Tensor
    accepted_path: torch.Tensor
    num_accepted: torch.Tensor


def _ancestors(parents: torch.Tensor) -> torch.Tensor:
    """bool [B, N, N]: entry (i, j) is True iff j is i or an ancestor of i (parents valid, -1 = root)."""
    batch, n = parents.shape
    anc = torch.eye(n, dtype=torch.bool).expand(batch, n, n).clone()
    cur = parents.long().clone()
    rows = torch.arange(batch)[:, None]
    for _ in range(n):
        valid = cur >= 0
        if not bool(valid.any()):
            break
        anc[rows.expand(batch, n)[valid], torch.arange(n).expand(batch, n)[valid], cur[valid]] = True
        cur = torch.where(valid, torch.gather(parents.long(), 1, cur.clamp(min=0)), cur)
    return anc


def _build_tree(parents, num_nodes=None):
    """Stand-in for specdec_ops.build_tree (DESIGN.md §5.4), valid parents assumed."""
    batch, n = parents.shape
    parents = parents.long().cpu()
    if num_nodes is not None:
        pad = torch.arange(n) >= num_nodes.cpu()[:, None].long()
        parents = torch.where(pad, torch.full_like(parents, -1), parents)
    anc = _ancestors(parents)
    if num_nodes is not None:
        anc &= ~pad[:, :, None]
    depth = anc.sum(-1).to(torch.int32) - 1
    words = (n + 63) // 64
    bits = torch.zeros(batch, n, words * 64, dtype=torch.int64)
    bits[:, :, :n] = anc.long()
    weights = torch.ones(64, dtype=torch.int64) << torch.arange(64)
    mask = (bits.view(batch, n, words, 64) * weights).sum(-1)
    return _TreeInfo(mask.to(parents.device), depth)


def _tree_attention_bias(mask, prefix_lens, kv_len, dtype=torch.float32):
    """Stand-in for specdec_ops.tree_attention_bias (DESIGN.md §5.4)."""
    batch, n, _ = mask.shape
    t = torch.arange(n, device=mask.device)
    bits = (mask[:, :, t // 64] >> (t % 64)) & 1                       # [B, N(node i), N(bit t)]
    key = torch.arange(kv_len, device=mask.device)
    rel = key[None, :] - prefix_lens.long()[:, None]                    # [B, kv_len]
    in_tree = (rel >= 0) & (rel < n)
    tree_bit = torch.gather(bits, 2, rel.clamp(0, n - 1)[:, None, :].expand(batch, n, kv_len)).bool()
    visible = (rel < 0)[:, None, :] | (in_tree[:, None, :] & tree_bit)
    bias = torch.zeros(batch, 1, n, kv_len, dtype=dtype, device=mask.device)
    return bias.masked_fill_(~visible[:, None], float("-inf"))


def _kv_commit(caches, seq_lens, accepted_path, *, block_table=None, backend=None):
    """Stand-in for specdec_ops.kv_commit (DESIGN.md §5.5), contiguous caches only: an out-of-place gather."""
    assert block_table is None
    path = accepted_path.long()
    valid = path >= 0
    length = valid.sum(1)
    base = seq_lens.long()[:, None]
    moved = valid & (path != torch.arange(path.shape[1], device=path.device))
    if bool(moved.any()):
        rows = torch.arange(path.shape[0], device=path.device)[:, None].expand_as(path)[moved]
        dst = (base + torch.arange(path.shape[1], device=path.device))[moved]
        src = (base + path)[moved]
        for cache in caches:
            cache[rows, dst] = cache[rows, src]
    seq_lens += length.to(seq_lens.dtype)


def _tree_rejection_sample(target_probs, tree_token_ids, parents, num_nodes=None, draft_probs=None, *, seeds=None,
                           offsets=None, greedy=None, backend=None):
    """Stand-in for specdec_ops.tree_rejection_sample (DESIGN.md §5.3): per-request Python walk.

    Random numbers come from the package's Philox scheme (reference.philox_uniform
    / race_sample), so results are reproducible, though not bit-identical to the real op.
    """
    batch, n, vocab = target_probs.shape
    token_ids = torch.full((batch, n), -1, dtype=torch.int64)
    path_out = torch.full((batch, n), -1, dtype=torch.int32)
    num_acc = torch.zeros(batch, dtype=torch.int32)
    probs = reference.prob_mass(target_probs.cpu())
    q_all = None if draft_probs is None else reference.prob_mass(draft_probs.cpu())
    nn_ = [n] * batch if num_nodes is None else num_nodes.tolist()
    par = parents.cpu().tolist()
    toks = tree_token_ids.cpu().tolist()
    seeds = seeds.tolist() if seeds is not None else torch.randint(0, 2**62, (batch,)).tolist()
    offs = offsets.tolist() if offsets is not None else [0] * batch
    gr = greedy.tolist() if greedy is not None else [False] * batch
    for b in range(batch):
        children = [[] for _ in range(n)]
        for i in range(1, nn_[b]):
            children[par[b][i]].append(i)
        node, path, out = 0, [0], []
        while True:
            p = probs[b, node].clone()
            if q_all is not None and float(p.sum()) > 0:
                p = p / p.sum()
            chosen = None
            if gr[b]:
                best = int(torch.argmax(p))
                chosen = next((c for c in children[node] if toks[b][c] == best), None)
                final = best
            else:
                for c in children[node]:
                    x = toks[b][c]
                    u = float(reference.philox_uniform(seeds[b], offs[b], c, reference.PURPOSE_ACCEPT, 0))
                    if q_all is not None:
                        q = q_all[b, node]
                        if u * float(q[x]) < float(p[x]):
                            chosen = c
                            break
                        res = torch.clamp(p - q / q.sum(), min=0)
                        if float(res.sum()) > 0:
                            p = res / res.sum()
                    else:
                        if u * float(p.sum()) < float(p[x]):
                            chosen = c
                            break
                        p[x] = 0.0
                if chosen is None:
                    final = reference.race_sample(p if float(p.sum()) > 0 else probs[b, node], seeds[b], offs[b],
                                                  node, reference.PURPOSE_RESIDUAL)
            if chosen is None:
                out.append(final)
                break
            out.append(toks[b][chosen])
            path.append(chosen)
            node = chosen
        token_ids[b, :len(out)] = torch.tensor(out)
        path_out[b, :len(path)] = torch.tensor(path, dtype=torch.int32)
        num_acc[b] = len(path) - 1
    dev = target_probs.device
    return _TreeSampleOutput(token_ids.to(dev), path_out.to(dev), num_acc.to(dev))


def _pick(name, fallback):
    op = getattr(specdec_ops, name, None)
    if op is not None:
        return op
    FALLBACKS.append(name)
    return fallback


build_tree = _pick("build_tree", _build_tree)
tree_attention_bias = _pick("tree_attention_bias", _tree_attention_bias)
tree_rejection_sample = _pick("tree_rejection_sample", _tree_rejection_sample)
kv_commit = _pick("kv_commit", _kv_commit)
rejection_sample = specdec_ops.rejection_sample
