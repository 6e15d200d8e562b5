"""ModelDrafter: drafting with a smaller Hugging Face model of the same vocabulary."""

from __future__ import annotations

import torch

import specdec_ops as ops
from ..forward import RaggedKVCache, chain_tree, check_model, forward, model_device, model_dtype, vocab_size
from ..sampling import DRAFT_STREAM, draft_offsets, process_probs, sample_tokens, stream_seeds
from ..types import Draft, chain_draft


class ModelDrafter:
    """Drafts with a smaller HF causal LM sharing the target's vocabulary, with its own ragged KV cache.

    Chain: k autoregressive drafter steps, each token drawn from the drafter's processed distribution q
    (same sampling parameters as the target; argmax for greedy requests) with the package's sampler on
    the device, from the drafter's own random stream (independent of the verifier's); q goes to
    verification. Tree (EAGLE-2 style): expand the ``branch`` best frontier nodes by their ``branch`` most
    likely children for up to k levels, rank every node by cumulative log q and keep the best ``tree``
    (an ancestor-closed set); children are distinct and deterministic, so verification needs no q.

    The drafter's cache holds the committed tokens it has forwarded (``cache.seq_lens``, written once per
    step in ``commit``, and their host copy ``lengths``); each step first forwards the committed tokens it
    has not seen (the catch-up), then drafts in windows placed after them. Every forward gets its slot
    range from host lengths (the batch's and ``lengths``): the only device read of a step is ``commit``'s
    of the accepted counts, which the loop reads at once anyway to emit the tokens.
    """

    def __init__(self, model, branch: int = 4):
        if isinstance(branch, bool) or not isinstance(branch, int) or branch < 1:
            raise ops.SpecDecArgumentError(f"branch must be an int >= 1, got {branch!r}")
        check_model(model, "model")
        self.model = model
        self.vocab_size = vocab_size(model)
        self.branch = branch
        self.cache: RaggedKVCache | None = None

    # ---------------------------------------------------------------------------------------- protocol

    def reset(self, batch, capacity, vocab_size):
        self._capacity = capacity + 2
        self.cache = RaggedKVCache(self.model, len(batch), self._capacity, model_device(self.model),
                                   model_dtype(self.model))
        self.seeds = stream_seeds(batch.seeds, DRAFT_STREAM).to(model_device(self.model))
        self.lengths = [0] * len(batch)   # cache.seq_lens on the host
        self._last = None   # what the last proposal left in the drafter's cache, for commit

    def keep(self, rows):
        self.cache.keep(rows)
        self.seeds = self.seeds.index_select(0, rows)
        self.lengths = [self.lengths[b] for b in rows.tolist()]   # only when requests finish

    def commit(self, accepted_path, num_accepted):
        kind, lengths, host_lengths, info = self._last
        if kind == "chain":
            # the drafter forwarded the root and d1 .. d_forwarded in place: the accepted ones stay
            kept = torch.clamp(num_accepted.long(), max=info)
            self.cache.seq_lens.copy_(lengths + kept)
            self.lengths = [n + min(a, info) for n, a in zip(host_lengths, num_accepted.tolist())]
            return
        # tree: the accepted path's nodes as offsets of the drafter's last tree window (root at slot length - 1),
        # while they were forwarded (leaves never are); kv_commit moves them into place
        nodes, window_offset = info
        path = accepted_path.long()
        offset = torch.gather(window_offset, 1, torch.gather(nodes, 1, path.clamp(min=0)))
        forwarded = ((path >= 0) & (offset >= 0)).long().cumprod(1).bool()
        self.cache.seq_lens.copy_(lengths - 1)
        ops.kv_commit(self.cache.commit_views(), self.cache.seq_lens, torch.where(forwarded, offset, -1))
        self.lengths = [n - 1 + c for n, c in zip(host_lengths, forwarded.sum(1).tolist())]

    def propose(self, batch, k, tree, sampling) -> Draft:
        logits = self._catch_up(batch)                          # q after the root, [B, V]
        lengths, host = batch.lengths, batch.host_lengths()
        caps = [max(min(r - 1, k), 0) for r in batch.remaining()]
        if tree is not None:
            return self._propose_tree(batch, logits, caps, k, tree, sampling)
        depth = max(caps)
        tokens, probs = [], []
        for j in range(depth):
            q = process_probs(logits, sampling)
            tok = q.argmax(-1) if sampling.all_greedy else sample_tokens(q, self.seeds,
                                                                        draft_offsets(batch.offsets, j))
            tokens.append(tok)
            probs.append(q)
            if j + 1 < depth:                                   # d_{j+1} at slot length + j
                mask, pos = chain_tree(1, len(batch), tok.device)
                logits = forward(self.model, self.cache, tok[:, None], lengths + j, pos, mask,
                                 start_range=(min(host) + j, max(host) + j))[:, 0]
        self._last = ("chain", lengths, host, max(depth - 1, 0))
        roots = batch.tokens.gather(1, (lengths - 1)[:, None])
        draft_tokens = torch.cat([roots] + [t[:, None] for t in tokens], dim=1)
        num_nodes = torch.tensor([c + 1 for c in caps], dtype=torch.int64, device=draft_tokens.device)
        draft_probs = None
        if not sampling.all_greedy and probs:
            draft_probs = torch.stack(probs + [torch.zeros_like(probs[0])], dim=1)
        return chain_draft(draft_tokens, num_nodes, draft_probs)

    # ---------------------------------------------------------------------------------------- helpers

    def _catch_up(self, batch) -> torch.Tensor:
        """Forward tokens[seq_lens:length] of every request (ragged; the root included): logits [B, V] after
        the root. The cache's seq_lens stay until commit."""
        valid = self.cache.seq_lens.long()
        pending = batch.lengths - valid
        width = max(n - v for n, v in zip(batch.host_lengths(), self.lengths))
        steps = torch.arange(width, device=pending.device)
        cols = (valid[:, None] + steps).clamp(max=batch.tokens.shape[1] - 1)
        ids = torch.gather(batch.tokens, 1, cols).masked_fill(steps[None] >= pending[:, None], 0)
        mask, depth = chain_tree(width, len(batch), ids.device)
        return forward(self.model, self.cache, ids, valid, depth, mask, logits_at=pending - 1,
                       start_range=(min(self.lengths), max(self.lengths)))

    def _propose_tree(self, batch, root_logits, caps, k, budget, sampling) -> Draft:
        """The tree of at most ``budget`` nodes besides the root, request b's paths at most ``caps[b]`` deep."""
        bsz, dev, branch = len(batch), root_logits.device, self.branch
        max_depth = max(1, max(caps))
        start = batch.lengths - 1                                    # the window's root slot
        host = batch.host_lengths()
        # the last expansion forwards 1 + branch (max_depth - 1) nodes from the root's slot: beyond what the
        # loop's window needs, so the cache grows once to what any step of this generation can take
        need = max(host) + branch * (max_depth - 1)
        if need > self.cache.capacity:
            self.cache.grow(max(need, self._capacity + branch * max(k - 1, 0)))
        start_range = (min(host) - 1, max(host) - 1)
        roots = batch.tokens.gather(1, start[:, None])
        # node table (node 0 = root): token, parent, cumulative log q, depth
        tok, par = roots, torch.full((bsz, 1), -1, dtype=torch.int64, device=dev)
        score, dep = torch.zeros(bsz, 1, device=dev), torch.zeros(bsz, 1, dtype=torch.int64, device=dev)
        window = torch.zeros(bsz, 1, dtype=torch.int64, device=dev)    # nodes the drafter has forwarded
        frontier = torch.zeros(bsz, 1, dtype=torch.int64, device=dev)
        q = process_probs(root_logits, sampling)[:, None]              # [B, F, V]: q at each frontier node
        for d in range(1, max_depth + 1):
            top = torch.topk(torch.log(q), min(branch, q.shape[-1]), dim=-1)    # [B, F, branch]
            child_score = (torch.gather(score, 1, frontier)[:, :, None] + top.values).flatten(1)
            child_par = frontier[:, :, None].expand_as(top.indices).flatten(1)
            first = tok.shape[1]
            tok = torch.cat([tok, top.indices.flatten(1)], 1)
            par = torch.cat([par, child_par], 1)
            score = torch.cat([score, child_score], 1)
            dep = torch.cat([dep, torch.full_like(child_par, d)], 1)
            if d == max_depth:
                break
            best = torch.topk(child_score, min(branch, child_score.shape[1]), dim=-1).indices
            frontier = first + best                                    # expand the best new nodes next
            window = torch.cat([window, frontier], 1)
            logits = self._forward_nodes(window, tok, par, dep, start, start_range)    # [B, W, V]
            q = process_probs(logits[:, -frontier.shape[1]:], sampling)
        # keep the `budget` best nodes of request b's at most caps[b] deep (ties: earlier first; a child never
        # scores above its parent, so the set is ancestor-closed), in creation order so parents come first;
        # the rest of the row is padding (the root's token, parent -1)
        n_total = tok.shape[1]
        cap = torch.tensor(caps, dtype=torch.int64, device=dev)
        eligible = dep[:, 1:] <= cap[:, None]
        ranked = torch.where(eligible, score[:, 1:], float("-inf"))
        order = torch.sort(ranked, dim=-1, descending=True, stable=True).indices[:, :min(budget, n_total - 1)]
        valid = torch.gather(eligible, 1, order)
        keep = torch.where(valid, order + 1, n_total).sort(-1).values    # the padding last
        valid = keep < n_total
        keep = torch.cat([torch.zeros(bsz, 1, dtype=torch.int64, device=dev), keep.masked_fill(~valid, 0)], 1)
        valid = torch.cat([torch.ones(bsz, 1, dtype=torch.bool, device=dev), valid], 1)
        remap = torch.full((bsz, n_total), -1, dtype=torch.int64, device=dev)
        slots = torch.arange(keep.shape[1], device=dev).expand(bsz, -1)
        remap.scatter_(1, keep, torch.where(valid, slots, 0))    # (the padding writes the root's 0 at 0)
        new_par = torch.gather(par, 1, keep)
        new_par = torch.where((new_par >= 0) & valid, torch.gather(remap, 1, new_par.clamp(min=0)), -1)
        num_nodes = valid.sum(1)
        window_offset = torch.full((bsz, n_total), -1, dtype=torch.int64, device=dev).scatter_(
            1, window, torch.arange(window.shape[1], device=dev).expand(bsz, -1).contiguous())
        self._last = ("tree", batch.lengths, batch.host_lengths(), (keep, window_offset))
        return Draft(torch.gather(tok, 1, keep), new_par, num_nodes, None, chain=False)

    def _forward_nodes(self, window, tok, par, dep, start, start_range):
        """Forward the forwarded-node set ``window`` [B, W] (root first, ancestor-closed) as a tree window at
        slot ``start`` (the root's slot: its entry is rewritten identically); ``start_range``: its (min, max)
        on the host."""
        bsz = window.shape[0]
        remap = torch.full_like(tok, -1)
        remap.scatter_(1, window, torch.arange(window.shape[1], device=tok.device).expand(bsz, -1).contiguous())
        wpar = torch.gather(par, 1, window)
        wpar = torch.where(wpar >= 0, torch.gather(remap, 1, wpar.clamp(min=0)), wpar)
        mask, _ = ops.build_tree(wpar)
        return forward(self.model, self.cache, torch.gather(tok, 1, window), start, torch.gather(dep, 1, window),
                       mask, start_range=start_range)
