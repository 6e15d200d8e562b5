"""Drafters: prompt lookup (NGramDrafter) and a smaller HF model (ModelDrafter).

A drafter has four methods the loop calls:
  reset(batch, capacity, vocab_size)    before the first step
  propose(batch, k, tree, sampling)     -> Draft (chain of <= k tokens, or a tree of <= `tree` nodes)
  commit(accepted_path, num_accepted)   after verification (roll its own state back to the accepted path)
  keep(rows)                            finished requests leave the batch
"""

from __future__ import annotations

import torch

import specdec_ops as ops
from .cache import RaggedKVCache, vocab_size
from .decoder import Draft, _device, _dtype, chain_tree, forward_window
from .sampling import sample_rows


def _chain_draft(conts: list[list[int]], roots: torch.Tensor, device) -> Draft:
    """A chain Draft from per-request continuations (ragged, possibly empty)."""
    width = 1 + max((len(c) for c in conts), default=0)
    tokens = torch.zeros(len(conts), width, dtype=torch.int64)
    tokens[:, 0] = roots.cpu()
    for b, c in enumerate(conts):
        tokens[b, 1:1 + len(c)] = torch.tensor(c, dtype=torch.int64)
    parents = (torch.arange(width) - 1).expand(len(conts), width).clone()
    num_nodes = torch.tensor([1 + len(c) for c in conts], dtype=torch.int64)
    parents[torch.arange(width)[None] >= num_nodes[:, None]] = -1
    return Draft(tokens.to(device), parents.to(device), num_nodes.to(device), None, chain=True)


def word_starts(tokenizer, vocab_size: int | None = None) -> torch.Tensor:
    """bool [V] for ``NGramDrafter(word_starts=...)``: True for tokens that begin a word or are not letters
    or digits -- a leading space or newline marker (``Ġ``/``Ċ``/``ĉ`` of byte-level BPE, ``▁`` of
    SentencePiece), punctuation, special tokens -- False for tokens that continue a word ("s", "ing").
    ``vocab_size`` (default: the tokenizer's length) pads the table with True for ids the tokenizer lacks."""
    pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    size = len(pieces) if vocab_size is None else vocab_size
    out = torch.ones(size, dtype=torch.bool)
    flags = [not piece or piece[0] in "\u0120\u010a\u0109\u2581" or not piece[0].isalnum()
             for piece in pieces[:size]]
    out[:len(flags)] = torch.tensor(flags, dtype=torch.bool)
    return out


class NGramDrafter:
    """Prompt lookup: match the last n tokens (n = `n` down to `min_n`, default 1) in the request's prompt and
    output so far and propose what followed (k tokens; None = num_speculative_tokens). With a tree budget,
    several matches are merged into a trie (longest n-gram first; among equally long ones the earliest
    first, as transformers' prompt lookup picks, or the most recent with ``recent_first=True``).

    ``lengths`` scales the draft with the evidence behind it: a match of m tokens drafts at most
    ``lengths[m - 1]`` tokens (the last entry for longer matches), always capped by k; 0 drafts nothing
    for such matches. ``lengths=(0, 16, 32)`` drafts nothing on a one-token match (rarely accepted), 16
    tokens after a two-token match and 32 after a longer one -- on a CPU, where each verified token costs
    compute and an empty draft is the cheapest forward, this is what ``bench/bench_e2e.py`` measures
    best. None (the default) drafts k tokens for any match.

    ``resume_window=w`` follows the text being copied through small edits: the drafter remembers where in
    the request's tokens its last accepted draft token came from (the cursor), and a match whose
    continuation starts within w tokens after the cursor is preferred over every other match (longest
    n-gram first, then nearest) and drafts at least ``resume_length`` tokens (capped by k). After the
    target replaces a word of a text it is rewriting, the one-token match that resumes the text right
    behind it is the right one, while the earliest match elsewhere usually is not. 0 (the default) is off.

    ``resume_after_edit=r`` (r >= 1) handles the edit itself: when a draft with at least r accepted tokens
    is rejected, the target is taken to have edited the copied text at the rejected token (a corrected
    spelling, a replaced word), and unless a resume match is found the next draft continues the text
    behind the edited word, ``resume_length`` tokens (capped by k), ahead of every other match. The
    edited word ends at the rejected token, or with ``word_starts`` (bool [V], True for tokens that
    begin a word or are not letters or digits; see :func:`word_starts`) at the next word start within 8
    tokens: " fix" "s" edited into " fixes" resumes at " the", not at "s". The next step's ordinary resume
    would find that place one forward later. 0 (the default) is off.

    ``forward_overhead=f`` (more than one request): every request of a batch pays for the widest draft,
    so the drafts (with a tree budget: every trie branch) are cut to the common length c that maximizes
    the expected tokens per verify cost, ``sum_b (1 + p_b + .. + p_b^min(len_b, c)) / (f + B (c + 1))``,
    with p_b request b's acceptance so far (accepted / (accepted + rejected drafts), prior 0.8) and f the cost of a verify
    forward apart from its tokens, in tokens (about 16 for a 135M model on a CPU core). One long draft
    then no longer widens the window of a whole batch. None (the default) is off.

    ``adaptive=True`` drafts per request at most one token more than it had accepted last step (all
    accepted: two more, up to k) -- on a CPU, where every verified token costs compute, this keeps
    low-acceptance stretches from paying for long rejected drafts.
    """

    vocab_size = None  # proposes only tokens it has seen in the request

    def __init__(self, n: int = 3, k: int | None = None, max_matches: int = 16, min_n: int = 1,
                 adaptive: bool = False, recent_first: bool = False, lengths=None, resume_window: int = 0,
                 resume_length: int = 16, forward_overhead: float | None = None, resume_after_edit: int = 0,
                 word_starts=None):
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be an int >= 1, got {n!r}")
        if not isinstance(min_n, int) or not 1 <= min_n <= n:
            raise ValueError(f"min_n must be an int in [1, n = {n}], got {min_n!r}")
        if k is not None and (not isinstance(k, int) or k < 1):
            raise ValueError(f"k must be None or an int >= 1, got {k!r}")
        if lengths is not None:
            lengths = tuple(lengths)
            if not lengths or not all(isinstance(x, int) and x >= 0 for x in lengths):
                raise ValueError(f"lengths must be None or a non-empty sequence of ints >= 0 (draft length per "
                                 f"matched n-gram size), got {lengths!r}")
        for name, value in (("resume_window", resume_window), ("resume_length", resume_length),
                            ("resume_after_edit", resume_after_edit)):
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        if forward_overhead is not None and (isinstance(forward_overhead, bool) or
                                             not isinstance(forward_overhead, (int, float)) or
                                             not forward_overhead >= 0):
            raise ValueError(f"forward_overhead must be None or a number >= 0, got {forward_overhead!r}")
        if word_starts is not None:
            if not isinstance(word_starts, torch.Tensor) or word_starts.dtype != torch.bool or word_starts.dim() != 1:
                raise ValueError("word_starts must be None or a 1-D bool tensor over the vocabulary (True: the "
                                 f"token starts a word), got {word_starts!r:.80}")
            word_starts = word_starts.cpu().tolist()
        self.n, self.k, self.max_matches, self.min_n, self.adaptive = n, k, max_matches, min_n, adaptive
        self.forward_overhead = forward_overhead
        self._accepted: list[int] = []        # per request: draft tokens accepted so far
        self._rejected: list[int] = []        # per request: drafts cut short by a rejection so far
        self.recent_first = recent_first
        self.lengths = lengths
        self.resume_window, self.resume_length = resume_window, resume_length
        self.resume_after_edit, self.word_starts = resume_after_edit, word_starts
        self._depth = self._drafted = None
        self._cursor: list[int] = []          # per request: where the copied text resumes (-1: unknown)
        self._sources: list[list[int]] = []   # per request, per draft node: its token's position (-1: root)
        self._edited: list[int] = []          # per request: source position of the token the target just edited
        self._inner: list[set] = []           # per request: draft nodes with children (a rejection can follow)

    def _length(self, matched: int, k: int) -> int:
        """Draft length for a match of `matched` tokens."""
        if self.lengths is None:
            return k
        return min(k, self.lengths[min(matched, len(self.lengths)) - 1])

    def reset(self, batch, capacity, vocab_size):
        self._depth = None
        self._cursor = [-1] * len(batch.ids)
        self._edited = [-1] * len(batch.ids)
        self._accepted, self._rejected = [0] * len(batch.ids), [0] * len(batch.ids)

    def commit(self, accepted_path, num_accepted):
        if self.forward_overhead is not None:
            for b, (acc, drafted) in enumerate(zip(num_accepted.tolist(), self._drafted.tolist())):
                self._accepted[b] += acc
                self._rejected[b] += acc < drafted
        if self.resume_window or self.resume_after_edit:
            # the cursor moves behind the deepest accepted node's source token (no drafts: it stays)
            last = torch.gather(accepted_path.long(), 1, num_accepted.long()[:, None])[:, 0].tolist()
            accepted = num_accepted.tolist()
            for b, node in enumerate(last):
                src = self._sources[b]
                if len(src) > 1:
                    self._cursor[b] = src[node] + 1 if node > 0 else src[1]
                # a draft token below the last accepted node was rejected after a long enough accepted run:
                # the target edited the copied text at the cursor
                edited = self.resume_after_edit and accepted[b] >= self.resume_after_edit and node in self._inner[b]
                self._edited[b] = self._cursor[b] if edited else -1
        if self.adaptive:
            acc = num_accepted.long().cpu()
            grow = torch.minimum(self._depth + 2, torch.full_like(self._depth, self._kmax))
            self._depth = torch.where(acc >= self._drafted, grow, acc + 1)

    def keep(self, rows):
        if self._depth is not None:
            self._depth = self._depth[rows.cpu()]
        rows = rows.tolist()
        self._cursor = [self._cursor[b] for b in rows]
        if self._edited:
            self._edited = [self._edited[b] for b in rows]
        if self._accepted:
            self._accepted = [self._accepted[b] for b in rows]
            self._rejected = [self._rejected[b] for b in rows]

    def propose(self, batch, k, tree, sampling) -> Draft:
        k = self.k or k
        caps = (batch.remaining() - 1).clamp(min=0).cpu()
        if self.adaptive:
            self._kmax = k
            if self._depth is None:
                self._depth = torch.full((len(batch.ids),), k, dtype=torch.int64)
            caps = torch.minimum(caps, self._depth)
        caps = caps.tolist()
        matches = self._matches(batch.tokens, batch.lengths)   # per request: [(continuation start, n-gram size)]
        lengths = batch.lengths.tolist()
        seqs = batch.tokens.cpu()
        roots = seqs[torch.arange(len(lengths)), batch.lengths.cpu() - 1]
        depths = [{} for _ in lengths]                           # per request: continuation start -> draft length
        if len(self._cursor) != len(lengths):                    # proposing without reset()
            self._cursor, self._edited = [-1] * len(lengths), [-1] * len(lengths)
            self._accepted, self._rejected = [0] * len(lengths), [0] * len(lengths)
        for b, found in enumerate(matches):
            for start, matched in found:
                depths[b].setdefault(start, min(self._length(matched, k), caps[b]))
            resumed = self._resume(seqs[b], lengths[b], self._cursor[b]) if self.resume_window else None
            if resumed is not None:
                start, matched = resumed
                found[:] = [resumed] + [m for m in found if m[0] != start]
                depths[b][start] = min(max(self.resume_length, self._length(matched, k)), k, caps[b])
            elif self._edited[b] >= 0:
                start = self._behind_edit(seqs[b], lengths[b], self._edited[b])
                if start is not None:
                    found[:] = [(start, 0)] + [m for m in found if m[0] != start]
                    depths[b][start] = min(self.resume_length, k, caps[b])
        if tree is None:
            starts = [found[0][0] if found else 0 for found in matches]       # the best match's continuation
            conts = [seqs[b, s:min(s + depths[b].get(s, 0), lengths[b])].tolist() for b, s in enumerate(starts)]
            if self.forward_overhead is not None and len(conts) > 1:
                cut = self._shared_width([len(c) for c in conts])
                conts = [c[:cut] for c in conts]
            self._sources = [[-1] + list(range(s, s + len(c))) for s, c in zip(starts, conts)]
            self._inner = [set(range(len(c))) for c in conts]
            self._drafted = torch.tensor([len(c) for c in conts], dtype=torch.int64)
            return _chain_draft(conts, roots, batch.device)
        if self.forward_overhead is not None and len(matches) > 1:   # every branch capped at the shared width
            longest = [max((min(depths[b][s], lengths[b] - s) for s, _ in found), default=0)
                       for b, found in enumerate(matches)]
            cut = self._shared_width(longest)
            depths = [{s: min(d, cut) for s, d in row.items()} for row in depths]
        return self._trie(matches, depths, seqs, lengths, roots, tree, batch.device)

    def _shared_width(self, lengths: list[int]) -> int:
        """The common draft length that maximizes expected tokens per verify cost (see forward_overhead)."""
        probs = [(a + 4.0) / (a + r + 5.0) for a, r in zip(self._accepted, self._rejected)]   # prior 4 / 5
        best, cut = -1.0, 0
        for c in range(max(lengths) + 1):
            gain = sum(1.0 + p * (1.0 - p ** min(n, c)) / (1.0 - p) for n, p in zip(lengths, probs))
            value = gain / (self.forward_overhead + len(lengths) * (c + 1))
            if value > best:
                best, cut = value, c
        return cut

    def _behind_edit(self, row: torch.Tensor, length: int, edited: int):
        """Where the copied text continues behind the word the target edited at position `edited`: the next
        token, or with word_starts the next word start within 8 tokens. None: nothing left to copy."""
        if edited + 1 >= length:
            return None
        if self.word_starts is not None:
            table = self.word_starts
            for start in range(edited + 1, min(edited + 9, length)):
                tok = int(row[start])
                if tok >= len(table) or table[tok]:
                    return start
        return edited + 1

    def _resume(self, row: torch.Tensor, length: int, cursor: int):
        """(continuation start, n-gram size) of the match that resumes the copied text: its continuation
        starts within resume_window tokens after `cursor`; longest n-gram first, then nearest. None: no such match."""
        if cursor < 0:
            return None
        lo, hi = cursor, min(cursor + self.resume_window, length - 1)
        if lo > hi:
            return None
        row = row[:length].tolist()
        for n in range(self.n, self.min_n - 1, -1):
            if length <= n:
                continue
            suffix = row[length - n:]
            for start in range(max(lo, n), hi + 1):
                if row[start - n:start] == suffix:
                    return start, n
        return None

    def _matches(self, tokens: torch.Tensor, lengths: torch.Tensor) -> list[list[tuple[int, int]]]:
        """For each request its matches as (continuation start, n-gram size), best first: longest n-gram
        first, then earliest (or, with recent_first, most recent) first; each start once."""
        seqs, lengths = tokens.cpu(), lengths.cpu()
        batch, width = seqs.shape
        width = min(width, int(lengths.max()))
        seqs = seqs[:, :width]
        found: list[list[tuple[int, int]]] = [[] for _ in range(batch)]
        rows = torch.arange(batch)
        for n in range(self.n, self.min_n - 1, -1):
            if width <= n:
                continue
            suffix = torch.stack([seqs[rows, (lengths - n + i).clamp(min=0)] for i in range(n)], dim=1)
            windows = seqs.unfold(1, n, 1)                               # [B, width - n + 1, n]
            start = torch.arange(windows.shape[1])
            ok = (windows == suffix[:, None, :]).all(-1) & (start[None] + n < lengths[:, None])
            ok &= (lengths > n)[:, None]
            hits = ok.nonzero()
            if hits.numel() == 0:
                continue
            per_b: dict[int, list[int]] = {}
            for b, i in hits.tolist():
                per_b.setdefault(b, []).append(i + n)
            for b, starts in per_b.items():
                if len(found[b]) < self.max_matches:
                    seen = {s for s, _ in found[b]}
                    found[b].extend((s, n) for s in (reversed(starts) if self.recent_first else starts)
                                    if s not in seen)
                    del found[b][self.max_matches:]
        return found

    def _trie(self, matches, depths, seqs, lengths, roots, budget, device) -> Draft:
        trees, self._sources, self._inner, deepest = [], [], [], []
        for b, found in enumerate(matches):
            toks, pars, children, srcs, depth = [int(roots[b])], [-1], [{}], [-1], [0]
            for s, _ in found:
                node = 0
                for i, tok in enumerate(seqs[b, s:min(s + depths[b][s], lengths[b])].tolist()):
                    nxt = children[node].get(tok)
                    if nxt is None:
                        if len(toks) > budget:
                            break
                        nxt = len(toks)
                        toks.append(tok)
                        pars.append(node)
                        children.append({})
                        srcs.append(s + i)
                        depth.append(i + 1)
                        children[node][tok] = nxt
                    node = nxt
                if len(toks) > budget:
                    break
            trees.append((toks, pars))
            self._sources.append(srcs)
            self._inner.append(set(pars[1:]))
            deepest.append(max(depth))
        self._drafted = torch.tensor(deepest, dtype=torch.int64)   # the deepest path: all accepted or not
        width = max(len(t) for t, _ in trees)
        tokens = torch.zeros(len(trees), width, dtype=torch.int64)
        parents = torch.full((len(trees), width), -1, dtype=torch.int64)
        for b, (t, p) in enumerate(trees):
            tokens[b, :len(t)] = torch.tensor(t)
            parents[b, :len(p)] = torch.tensor(p)
        num_nodes = torch.tensor([len(t) for t, _ in trees], dtype=torch.int64)
        return Draft(tokens.to(device), parents.to(device), num_nodes.to(device), None, chain=False)


class ModelDrafter:
    """Drafts with a smaller HF causal LM sharing the target's vocabulary, with its own ragged KV cache.

    Chain: k autoregressive drafter steps, tokens sampled from the drafter's processed distribution q
    (argmax when greedy); q goes to verification. Tree (EAGLE-2 style): expand the `branch` best frontier
    nodes by their `branch` most likely children for up to k levels, rank every node by cumulative log q
    and keep the best `tree` (an ancestor-closed set); children are distinct and deterministic, so
    verification needs no q. After verification the drafter's cache rolls back to the committed tokens.
    """

    def __init__(self, model, branch: int = 4):
        self.model = model
        self.vocab_size = vocab_size(model)
        self.branch = branch
        self.cache = None

    def reset(self, batch, capacity, vocab_size):
        self.cache = RaggedKVCache(self.model, len(batch.ids), capacity + 2 * capacity // 8 + 64,
                                   _device(self.model), _dtype(self.model))
        self._valid = self.cache.seq_lens.clone()
        self._base = None
        self._tree_window = None

    def keep(self, rows):
        self.cache.keep(rows)
        self._valid = self._valid.index_select(0, rows)

    def commit(self, accepted_path, num_accepted):
        # The window starts at the root (slot base - 1); what stays is the root and the accepted nodes the
        # drafter forwarded itself, the rest is re-read by the next step's first drafter forward.
        self.cache.seq_lens.copy_(self._base - 1)
        if self._tree_window is None:
            # chain: the drafter forwarded the root and d1 .. d_{k-1} in order, so the accepted ones among
            # those are already in place: pointer-only rollback, nothing moves
            kept = 1 + torch.minimum(num_accepted.to(self._base.dtype), self._kept)
            ops.kv_rollback([], self.cache.seq_lens, kept, max_tokens=self._max_kept + 1)
        else:
            # tree: the accepted path's nodes, as window offsets of the drafter's last tree forward, while
            # they were forwarded (leaves never are); kv_commit moves them into place
            path = accepted_path.long()
            node = torch.gather(self._tree_nodes, 1, path.clamp(min=0))
            offset = torch.gather(self._tree_window, 1, node)
            forwarded = ((path >= 0) & (offset >= 0)).long().cumprod(1).bool()
            ops.kv_commit(self.cache.commit_views(), self.cache.seq_lens, torch.where(forwarded, offset, -1))
        self._valid = self.cache.seq_lens.clone()

    # ------------------------------------------------------------------------------------------- drafting

    def propose(self, batch, k, tree, sampling) -> Draft:
        logits = self._catch_up(batch)                          # forward the committed tokens it has not seen
        self._base = batch.lengths.to(torch.int32)
        if tree is not None:
            return self._propose_tree(batch, logits, k, tree, sampling)
        caps = (batch.remaining() - 1).clamp(min=0, max=k)
        depth = max(int(caps.max()), 0)
        tokens, probs = [], []
        for j in range(depth):
            q = sampling.probs(logits)
            tok = q.argmax(-1) if sampling.greedy else sample_rows(q, batch.seeds, batch.offsets, j)
            tokens.append(tok)
            probs.append(q)
            if j + 1 < depth:
                logits = self._step(tok[:, None])[:, 0]
        self._max_kept = max(depth - 1, 0)
        self._kept = torch.full_like(self._base, self._max_kept)
        self._tree_window = None
        roots = batch.tokens[torch.arange(len(batch.ids)), batch.lengths - 1]
        tokens = torch.stack([roots] + tokens, dim=1)
        num_nodes = (caps + 1).to(tokens.device)
        width = tokens.shape[1]
        parents = (torch.arange(width, device=tokens.device) - 1).expand(tokens.shape[0], width).clone()
        parents[torch.arange(width, device=tokens.device)[None] >= num_nodes[:, None]] = -1
        draft_probs = None
        if not sampling.greedy:
            draft_probs = torch.stack(probs + [torch.zeros_like(probs[0])], dim=1) if probs else None
        return Draft(tokens, parents, num_nodes, draft_probs, chain=True)

    def _catch_up(self, batch) -> torch.Tensor:
        """Forward tokens[valid:length] of every request (ragged); float32 logits [B, V] after the root."""
        pending = batch.lengths - self._valid.long()
        width = int(pending.max())
        cols = self._valid.long()[:, None] + torch.arange(width, device=pending.device)
        ids = torch.gather(batch.tokens, 1, cols.clamp(max=batch.tokens.shape[1] - 1))
        ids = ids.masked_fill(torch.arange(width, device=pending.device)[None] >= pending[:, None], 0)
        mask, depth = chain_tree(width, ids.shape[0], ids.device)
        logits = forward_window(self.model, self.cache, ids, depth, mask, logits_at=pending - 1)
        self.cache.seq_lens.copy_(batch.lengths)
        self._valid = batch.lengths.to(torch.int32)
        return logits

    def _step(self, ids) -> torch.Tensor:
        mask, depth = chain_tree(ids.shape[1], ids.shape[0], ids.device)
        logits = forward_window(self.model, self.cache, ids, depth, mask)
        self.cache.seq_lens += ids.shape[1]
        return logits

    def _propose_tree(self, batch, root_logits, k, budget, sampling) -> Draft:
        bsz, dev, branch = len(batch.ids), root_logits.device, self.branch
        rows = torch.arange(bsz, device=dev)
        roots = batch.tokens[rows, batch.lengths - 1]
        # node table (node 0 = root): token, parent, cumulative log q, depth
        tok, par = roots[:, None], torch.full((bsz, 1), -1, dtype=torch.int64, device=dev)
        score, dep = torch.zeros(bsz, 1, device=dev), torch.zeros(bsz, 1, dtype=torch.int64, device=dev)
        window = torch.zeros(bsz, 1, dtype=torch.int64, device=dev)    # nodes the drafter has forwarded
        frontier, logq = torch.zeros(bsz, 1, dtype=torch.int64, device=dev), None
        q = sampling.probs(root_logits)[:, None]                       # [B, F, V]: q at each frontier node
        max_depth = max(1, min(k, int((batch.remaining() - 1).clamp(min=1).max())))
        for d in range(1, max_depth + 1):
            logq = torch.log(q)
            top = torch.topk(logq, min(branch, logq.shape[-1]), dim=-1)    # [B, F, branch]
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
            logits = self._forward_nodes(window, tok, par, dep)         # [B, W, V]
            q = sampling.probs(logits[:, -frontier.shape[1]:])
        # keep the `budget` best nodes (ties: earlier first), in creation order so parents come first
        n_total = tok.shape[1]
        order = torch.sort(score[:, 1:], dim=-1, descending=True, stable=True).indices
        keep = order[:, :min(budget, n_total - 1)].sort(-1).values + 1
        keep = torch.cat([torch.zeros(bsz, 1, dtype=torch.int64, device=dev), keep], 1)
        remap = torch.full((bsz, n_total), -1, dtype=torch.int64, device=dev)
        remap.scatter_(1, keep, torch.arange(keep.shape[1], device=dev).expand(bsz, -1).contiguous())
        new_par = torch.gather(par, 1, keep)
        new_par = torch.where(new_par >= 0, torch.gather(remap, 1, new_par.clamp(min=0)), new_par)
        num_nodes = torch.full((bsz,), keep.shape[1], dtype=torch.int64, device=dev)
        # for commit: final node -> node table index -> offset in the drafter's last tree window (-1: not forwarded)
        self._tree_nodes = keep
        self._tree_window = torch.full((bsz, n_total), -1, dtype=torch.int64, device=dev).scatter_(
            1, window, torch.arange(window.shape[1], device=dev).expand(bsz, -1).contiguous())
        self.cache.seq_lens.copy_(self._base)
        return Draft(torch.gather(tok, 1, keep), new_par, num_nodes, None, chain=False)

    def _forward_nodes(self, window, tok, par, dep):
        """Forward the forwarded-node set `window` [B, W] (root first, ancestor-closed) as a tree window
        placed after the committed prefix minus the root; the root's entry is rewritten identically."""
        bsz = window.shape[0]
        remap = torch.full_like(tok, -1)
        remap.scatter_(1, window, torch.arange(window.shape[1], device=tok.device).expand(bsz, -1).contiguous())
        wpar = torch.gather(par, 1, window)
        wpar = torch.where(wpar >= 0, torch.gather(remap, 1, wpar.clamp(min=0)), wpar)
        mask, _ = ops.build_tree(wpar)
        self.cache.seq_lens.copy_(self._base - 1)
        return forward_window(self.model, self.cache, torch.gather(tok, 1, window), torch.gather(dep, 1, window),
                              mask)
