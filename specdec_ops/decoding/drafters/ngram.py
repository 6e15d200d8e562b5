"""Prompt lookup, composed from small parts: a pure matcher, a draft-length policy, optional re-rankers.

    NGramDrafter(n=3, k=None)                        classic prompt lookup (DESIGN.md §5.6): the longest
                                                     n-gram match, earliest first, drafts k tokens
    NGramDrafter(n=3, length=CostModel(cost),        what ``default_setup`` builds: the draft length that
                 rerank=[CopyCursor(8)])             maximizes expected tokens per verify cost, and the
                                                     match that resumes the text being copied first

The matcher (:func:`find_matches`) is a pure function of a token list. A length policy
(:mod:`.policies`) decides how many tokens of a match's continuation to draft. A re-ranker reorders the
matches of a request (the copy cursor). What a drafter remembers of a request lives in one
:class:`NGramRequest` per request.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

import specdec_ops as ops
from ..types import Draft, chain_draft
from .policies import DraftLengthPolicy, FixedLength, RequestStats


@dataclass(frozen=True)
class Match:
    """A prompt-lookup match: the continuation starts at ``start`` (a position in the request's tokens),
    after an n-gram of ``size`` tokens equal to the request's last ``size`` tokens."""

    start: int
    size: int


def find_matches(tokens: Sequence[int], max_n: int, min_n: int = 1, limit: int = 16) -> list[Match]:
    """Where the last n tokens of ``tokens`` occurred before, for n = ``max_n`` down to ``min_n``.

    Order (the tie rule): longest match first; among equally long matches the earliest occurrence first
    (as transformers' prompt lookup picks). A match counts with its longest size only (each continuation
    start once), its continuation is never empty, and at most ``limit`` matches are returned.
    """
    length = len(tokens)
    if length < 2 or max_n < 1:
        return []
    last = tokens[-1]
    found = []
    for end in range(length - 1):                  # occurrences of the last token, then extend backwards
        if tokens[end] != last:
            continue
        size = 1
        while size < max_n and size <= end and tokens[end - size] == tokens[length - 1 - size]:
            size += 1
        if size >= min_n:
            found.append(Match(end + 1, size))
    found.sort(key=lambda m: (-m.size, m.start))
    return found[:limit]


@dataclass
class NGramRequest:
    """One request's drafting state."""

    stats: RequestStats = field(default_factory=RequestStats)   # acceptance observed so far (length policies)
    cursor: int = -1               # where the copied text continues (CopyCursor); -1: unknown
    sources: list[int] = field(default_factory=list)   # per node of the last draft: its token's position (root -1)
    match_sizes: list[int] = field(default_factory=list)  # per node: size of the match it came from
    drafted: int = 0               # deepest path of the last draft


class CopyCursor:
    """Re-ranker: follow the text being copied through small edits.

    The cursor is where the request's last accepted draft token came from, plus one. A match whose
    continuation starts within ``window`` tokens at or after the cursor goes first (longest n-gram, then
    nearest): after the target replaces a word of a text it is rewriting, the short match that resumes
    the text right behind the edit is the right one, while the earliest match elsewhere usually is not.
    """

    def __init__(self, window: int = 8):
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ops.SpecDecArgumentError(f"CopyCursor window must be an int >= 1, got {window!r}")
        self.window = window

    def rerank(self, state: NGramRequest, tokens: Sequence[int], matches: list[Match]) -> list[Match]:
        if state.cursor < 0:
            return matches
        near = [m for m in matches if state.cursor <= m.start <= state.cursor + self.window]
        if not near:
            return matches
        near.sort(key=lambda m: (-m.size, m.start - state.cursor))
        best = near[0]
        return [best] + [m for m in matches if m != best]

    def commit(self, state: NGramRequest, last_node: int) -> None:
        """The deepest accepted node's source + 1 (nothing accepted: the first drafted token's source)."""
        if len(state.sources) > 1:
            state.cursor = state.sources[last_node] + 1 if last_node > 0 else state.sources[1]


class NGramDrafter:
    """Prompt lookup: match the last n tokens (n = ``n`` down to ``min_n``) in the request's tokens so far
    (prompt and output) and propose what followed.

    Parameters
    ----------
    n : int >= 1, the longest n-gram matched
    k : int | None, the longest draft (None: the decoder's num_speculative_tokens)
    min_n : int in [1, n], the shortest n-gram matched
    length : a draft-length policy (:mod:`~specdec_ops.decoding.drafters.policies`): how many tokens of the
        best match's continuation to draft; None = :class:`FixedLength` (k tokens, classic prompt lookup)
    rerank : re-rankers applied in order to each request's matches (e.g. ``[CopyCursor(8)]``)
    max_matches : matches kept per request (a tree merges them into a trie: best first)

    A continuation stops before the first end-of-sequence token (``batch.eos``): nothing after it is ever
    emitted, so drafting past it only widens the verify forward (transformers' prompt lookup does the same).
    With a policy that pads (``padded_width``, the cost model) a chain is verified in the cheapest window
    at least as wide as the draft, and the policy is fed each verify step's wall time (``observe_forward``:
    from the end of ``propose`` to ``commit``, after the loop's host sync).

    With a tree budget the matches (best first) are merged into a trie of at most ``tree`` nodes, each
    branch as long as the length policy gives its match.
    """

    vocab_size = None  # proposes only tokens it has seen in the request

    def __init__(self, n: int = 3, k: int | None = None, *, min_n: int = 1, length: DraftLengthPolicy | None = None,
                 rerank: Sequence = (), max_matches: int = 16):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ops.SpecDecArgumentError(f"n must be an int >= 1, got {n!r}")
        if isinstance(min_n, bool) or not isinstance(min_n, int) or not 1 <= min_n <= n:
            raise ops.SpecDecArgumentError(f"min_n must be an int in [1, n = {n}], got {min_n!r}")
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise ops.SpecDecArgumentError(f"k must be None or an int >= 1, got {k!r}")
        if isinstance(max_matches, bool) or not isinstance(max_matches, int) or max_matches < 1:
            raise ops.SpecDecArgumentError(f"max_matches must be an int >= 1, got {max_matches!r}")
        if length is not None and not callable(getattr(length, "lengths", None)):
            raise ops.SpecDecArgumentError(f"length must be None or a draft-length policy (FixedLength, "
                                           f"ByMatchLength, CostModel), got {length!r}")
        for r in rerank:
            if not callable(getattr(r, "rerank", None)):
                raise ops.SpecDecArgumentError(f"rerank entries must have rerank() (e.g. CopyCursor), got {r!r}")
        self.n, self.k, self.min_n, self.max_matches = n, k, min_n, max_matches
        self.length = length if length is not None else FixedLength()
        self.rerank = list(rerank)
        self.requests: list[NGramRequest] = []
        self._timer: tuple[float, int] | None = None     # (end of the last propose, its forward's tokens)

    # ---------------------------------------------------------------------------------------- protocol

    def reset(self, batch, capacity, vocab_size):
        self.requests = [NGramRequest() for _ in range(len(batch))]
        self._timer = None

    def keep(self, rows):
        self.requests = [self.requests[b] for b in rows.tolist()]

    def commit(self, accepted_path, num_accepted):
        accepted = num_accepted.tolist()
        if self._timer is not None and hasattr(self.length, "observe_forward"):
            self.length.observe_forward(self._timer[1], time.perf_counter() - self._timer[0])
        self._timer = None
        last = torch.gather(accepted_path.long(), 1, num_accepted.long()[:, None])[:, 0].tolist()
        for state, acc, node in zip(self.requests, accepted, last):
            size = state.match_sizes[1] if len(state.match_sizes) > 1 else 0
            self.length.observe(state.stats, size, state.drafted, acc)
            for r in self.rerank:
                if hasattr(r, "commit"):
                    r.commit(state, node)

    def propose(self, batch, k, tree, sampling) -> Draft:
        k = self.k or k
        if len(self.requests) != len(batch):      # proposing without reset()
            self.requests = [NGramRequest() for _ in range(len(batch))]
        caps = [max(min(r - 1, k), 0) for r in batch.remaining()]
        ranked = []
        for state, tokens in zip(self.requests, batch.history):
            matches = find_matches(tokens, self.n, self.min_n, self.max_matches)
            for r in self.rerank:
                matches = r.rerank(state, tokens, matches)
            ranked.append(matches)
        draft = self._chain(batch, ranked, caps, k) if tree is None else self._trie(batch, ranked, caps, k, tree)
        self._timer = (time.perf_counter(), draft.tokens.numel())
        return draft

    @staticmethod
    def _available(tokens: Sequence[int], start: int, cap: int, eos: set[int]) -> int:
        """Tokens of the continuation at ``start`` worth drafting: at most ``cap``, none from the first EOS on."""
        end = min(len(tokens), start + cap)
        if eos:
            for i in range(start, end):
                if tokens[i] in eos:
                    return i - start
        return end - start

    # ---------------------------------------------------------------------------------------- drafts

    def _chain(self, batch, ranked, caps, k) -> Draft:
        best = [m[0] if m else None for m in ranked]
        avail = [0 if m is None else self._available(t, m.start, cap, batch.eos)
                 for m, cap, t in zip(best, caps, batch.history)]
        lengths = self.length.lengths([s.stats for s in self.requests],
                                      [0 if m is None else m.size for m in best], avail, k)
        conts = []
        for state, m, n, tokens in zip(self.requests, best, lengths, batch.history):
            n = 0 if m is None else n
            conts.append(tokens[m.start:m.start + n] if n else [])
            state.sources = [-1] + ([] if not n else list(range(m.start, m.start + n)))
            state.match_sizes = [0] + [m.size] * n if n else [0]
            state.drafted = n
        width = 1 + max(len(c) for c in conts)
        if width > 1 and hasattr(self.length, "padded_width"):
            width = self.length.padded_width(width, len(conts), 1 + k)
        rows = [[t[-1]] + c + [0] * (width - 1 - len(c)) for t, c in zip(batch.history, conts)]
        tokens = torch.tensor(rows, dtype=torch.int64, device=batch.device)
        num_nodes = torch.tensor([1 + len(c) for c in conts], dtype=torch.int64, device=batch.device)
        return chain_draft(tokens, num_nodes)

    def _trie(self, batch, ranked, caps, k, budget) -> Draft:
        trees = []
        for state, matches, cap, tokens in zip(self.requests, ranked, caps, batch.history):
            toks, pars, children, srcs, sizes, depth = [tokens[-1]], [-1], [{}], [-1], [0], [0]
            for m in matches:
                avail = self._available(tokens, m.start, cap, batch.eos)
                n = self.length.lengths([state.stats], [m.size], [avail], k)[0]
                node = 0
                for i, tok in enumerate(tokens[m.start:m.start + n]):
                    nxt = children[node].get(tok)
                    if nxt is None:
                        if len(toks) > budget:
                            break
                        nxt = len(toks)
                        toks.append(tok)
                        pars.append(node)
                        children.append({})
                        srcs.append(m.start + i)
                        sizes.append(m.size)
                        depth.append(i + 1)
                        children[node][tok] = nxt
                    node = nxt
                if len(toks) > budget:
                    break
            state.sources, state.match_sizes, state.drafted = srcs, sizes, max(depth)
            trees.append((toks, pars))
        width = max(len(t) for t, _ in trees)
        tokens = torch.tensor([t + [0] * (width - len(t)) for t, _ in trees], dtype=torch.int64)
        parents = torch.tensor([p + [-1] * (width - len(p)) for _, p in trees], dtype=torch.int64)
        num_nodes = torch.tensor([len(t) for t, _ in trees], dtype=torch.int64)
        dev = batch.device
        return Draft(tokens.to(dev), parents.to(dev), num_nodes.to(dev), None, chain=False)
