"""SpeculativeDecoder: the decode loop (DESIGN.md §5.6).

The algorithm is ``generate`` below, one screen long: draft, one target forward
over the draft, verify, commit the accepted K/V, emit. The helpers under it do
the bookkeeping (the ragged batch, masks, positions, the cache).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

import specdec_ops as ops
from specdec_ops._nvtx import nvtx_range
from .cache import RaggedKVCache, forward, vocab_size as _vocab_size
from .sampling import SamplingParams, request_seeds

MAX_TREE_NODES = 255  # draft nodes besides the root: the verify window is at most 256 tokens


class Draft(NamedTuple):
    """What a drafter proposes for the active requests, as a tree rooted at the last committed token.

    tokens:      int64 [B, N]: node tokens; node 0 is the root (the last committed token, no K/V yet).
    parents:     int64 [B, N]: parents[b, 0] = -1, 0 <= parents[b, i] < i; -1 for padding nodes.
    num_nodes:   int64 [B]: real nodes per request, root included (>= 1).
    draft_probs: float32 [B, N, V] or None: row u is q at node u (the distribution u's children were
                 drawn from); None for deterministic drafts (n-gram, greedy, top-k trees).
    chain:       True when every request's nodes form a chain 0 -> 1 -> ... (verified with rejection_sample).
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    num_nodes: torch.Tensor
    draft_probs: torch.Tensor | None
    chain: bool


@dataclass
class GenerationStats:
    target_forwards: int = 0      # verify forwards of the target (prefill not counted)
    draft_tokens: int = 0         # draft tokens proposed
    accepted_tokens: int = 0      # draft tokens accepted
    generated_tokens: int = 0     # tokens emitted (the prefill's first token, then accepted + one per request-step)
    step_tokens: int = 0          # tokens emitted by verify forwards
    request_steps: int = 0        # (request, verify forward) pairs
    seconds: float = 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens emitted per verify forward, per request (1.0 = no speedup)."""
        return self.step_tokens / max(self.request_steps, 1)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / max(self.draft_tokens, 1)

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict:
        return {"target_forwards": self.target_forwards, "draft_tokens": self.draft_tokens,
                "accepted_tokens": self.accepted_tokens, "generated_tokens": self.generated_tokens,
                "step_tokens": self.step_tokens, "mean_accepted_length": self.mean_accepted_length,
                "acceptance_rate": self.acceptance_rate,
                "tokens_per_second": self.tokens_per_second, "seconds": self.seconds}

    # Read-only mapping access too: stats["target_forwards"], "tokens_per_second" in stats, dict(stats).
    def __getitem__(self, key):
        return self.as_dict()[key]

    def __contains__(self, key) -> bool:
        return key in self.as_dict()

    def __iter__(self):
        return iter(self.as_dict())

    def keys(self):
        return self.as_dict().keys()

    def get(self, key, default=None):
        return self.as_dict().get(key, default)


@dataclass
class GenerateOutput:
    sequences: list[list[int]]
    stats: GenerationStats = field(default_factory=GenerationStats)


class SpeculativeDecoder:
    """Speculative decoding of a Hugging Face causal LM with the package's ops.

    Parameters
    ----------
    target_model : transformers causal LM (Llama-style attention: takes position_ids and a 4-D additive mask)
    drafter : ModelDrafter | NGramDrafter
    num_speculative_tokens : int >= 1
        Chain length; with ``tree`` the deepest draft path.
    tree : int | None
        None drafts a chain; an int drafts a tree of up to ``tree`` nodes besides the
        root (1 .. 255) and verifies it in one target forward.
    """

    def __init__(self, target_model, drafter, num_speculative_tokens: int = 4, tree: int | None = None):
        if not isinstance(num_speculative_tokens, int) or num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be an int >= 1, got {num_speculative_tokens!r}")
        if tree is not None and (not isinstance(tree, int) or not 1 <= tree <= MAX_TREE_NODES):
            raise ValueError(f"tree must be None or an int in [1, {MAX_TREE_NODES}] (draft nodes besides the "
                             f"root), got {tree!r}")
        self.target = target_model
        self.drafter = drafter
        self.k = num_speculative_tokens
        self.tree = tree
        self.vocab_size = _vocab_size(target_model)
        drafter_vocab = getattr(drafter, "vocab_size", None)
        if drafter_vocab is not None and drafter_vocab != self.vocab_size:
            raise ValueError(f"drafter vocab size {drafter_vocab} does not match the target's vocab size "
                             f"{self.vocab_size}: the drafter must share the target's tokenizer")

    # ------------------------------------------------------------------------------------- the algorithm

    @torch.inference_mode()
    def generate(self, prompts, max_new_tokens: int = 128, temperature: float = 0.0, top_k: int = 0,
                 top_p: float = 1.0, seed: int = 0, eos_token_id=None, streamer=None) -> GenerateOutput:
        """Generate up to `max_new_tokens` tokens for each prompt (list[list[int]] or int64 [B, L]).

        ``eos_token_id``: int or list of ints; None uses the target's generation_config (pass [] to never
        stop early). ``streamer(request_index, new_tokens)`` is called as tokens are emitted.
        Returns GenerateOutput(sequences: generated tokens per request through the first EOS, stats).
        """
        start = time.perf_counter()
        sampling = _check_sampling(temperature, top_k, top_p)
        stats = GenerationStats()
        batch = self._prefill(prompts, max_new_tokens, seed, eos_token_id, sampling, stats, streamer)
        while batch.active:                     # the cache holds every token but the last one (the root)
            with nvtx_range("draft"):
                draft = self.drafter.propose(batch, self.k, self.tree, sampling)
            with nvtx_range("verify"):
                logits = self._verify_forward(draft)                        # one target forward over every node
            with nvtx_range("sample"):
                out = self._accept(draft, sampling.probs(logits), sampling, batch)
            with nvtx_range("commit"):
                ops.kv_commit(self.cache.commit_views(), self.cache.seq_lens, out.accepted_path)
                self.drafter.commit(out.accepted_path, out.num_accepted)
                finished = batch.emit(out.token_ids, out.num_accepted, stats, draft, streamer)
            if finished:                                                    # finished requests stop costing work
                self._drop_finished(batch)
        stats.seconds = time.perf_counter() - start
        return GenerateOutput(batch.results, stats)

    # ----------------------------------------------------------------------------------------- helpers

    def _prefill(self, prompts, max_new_tokens, seed, eos_token_id, sampling, stats, streamer) -> Batch:
        """One forward over the (ragged) prompts fills the cache; their last logits give the first token
        (rejection_sample with no drafts: a draw from p, argmax when greedy), the first root."""
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
        prompts = _check_prompts(prompts, self.vocab_size)
        if eos_token_id is None:
            eos_token_id = getattr(getattr(self.target, "generation_config", None), "eos_token_id", None)
        eos = set() if eos_token_id is None else {int(e) for e in (
            eos_token_id if isinstance(eos_token_id, (list, tuple, set)) else [eos_token_id])}
        device = _device(self.target)
        window = 1 + (self.tree if self.tree is not None else self.k)
        capacity = max(len(p) for p in prompts) + max_new_tokens + window + 1
        batch = Batch(prompts, max_new_tokens, eos, request_seeds(seed, len(prompts)), capacity, device)
        self.cache = RaggedKVCache(self.target, len(prompts), capacity, device, _dtype(self.target))
        with nvtx_range("prefill"):
            logits = self._forward_chain(self.target, self.cache, batch.tokens[:, :int(batch.lengths.max())],
                                         logits_at=batch.lengths - 1)   # only the last prompt position's row
            self.cache.seq_lens.copy_(batch.lengths)
            probs = sampling.probs(logits)[:, None]
            greedy = torch.full((len(prompts),), sampling.greedy, dtype=torch.bool, device=device)
            first = ops.rejection_sample(probs, torch.zeros(len(prompts), 0, dtype=torch.int64, device=device),
                                         torch.zeros(len(prompts), dtype=torch.int64, device=device),
                                         seeds=batch.seeds.to(device), offsets=batch.offsets.to(device),
                                         greedy=greedy)
            finished = batch.emit(first.token_ids, first.num_accepted, None, None, streamer)
        stats.generated_tokens += len(prompts)
        self.drafter.reset(batch, capacity, self.vocab_size)
        if finished:
            self._drop_finished(batch)
        return batch

    def _drop_finished(self, batch):
        rows = batch.keep_unfinished()
        self.cache.keep(rows)
        self.drafter.keep(rows)

    def _verify_forward(self, draft: Draft) -> torch.Tensor:
        """float32 logits [B, N, V] of the target at every draft node; the nodes' K/V land in the cache window."""
        parents = draft.parents
        if draft.chain:
            mask, depth = chain_tree(parents.shape[1], parents.shape[0], parents.device)
        else:   # padding nodes hang off the root, so every query row sees at least itself
            pad = torch.arange(parents.shape[1], device=parents.device) >= draft.num_nodes[:, None]
            pad[:, 0] = False
            mask, depth = ops.build_tree(parents.masked_fill(pad, 0))
        return forward_window(self.target, self.cache, draft.tokens, depth, mask)

    def _accept(self, draft: Draft, target_probs, sampling: SamplingParams, batch: Batch) -> Verified:
        greedy = torch.full((draft.tokens.shape[0],), sampling.greedy, dtype=torch.bool, device=target_probs.device)
        seeds, offsets = batch.seeds.to(target_probs.device), batch.offsets.to(target_probs.device)
        if draft.chain:
            q = None if draft.draft_probs is None else draft.draft_probs[:, :-1].contiguous()
            out = ops.rejection_sample(target_probs, draft.tokens[:, 1:], draft.num_nodes - 1, q,
                                       seeds=seeds, offsets=offsets, greedy=greedy)
            steps = torch.arange(draft.tokens.shape[1], device=target_probs.device)
            path = torch.where(steps <= out.num_accepted[:, None].long(), steps, -1)
            return Verified(out.token_ids, out.num_accepted, path)
        out = ops.tree_rejection_sample(target_probs, draft.tokens, draft.parents, draft.num_nodes,
                                        draft.draft_probs, seeds=seeds, offsets=offsets, greedy=greedy)
        return Verified(out.token_ids, out.num_accepted, out.accepted_path)

    def _forward_chain(self, model, cache, tokens, logits_at=None):
        mask, depth = chain_tree(tokens.shape[1], tokens.shape[0], tokens.device)
        return forward_window(model, cache, tokens, depth, mask, logits_at=logits_at)


class Verified(NamedTuple):
    token_ids: torch.Tensor      # int64 [B, N]: accepted drafts, then the final token, then -1
    num_accepted: torch.Tensor   # int32 [B]
    accepted_path: torch.Tensor  # int [B, N]: 0, a1, .., then -1 (window offsets of the committed entries)


# ------------------------------------------------------------------------------------- the ragged batch


class Batch:
    """The active requests: their tokens so far (prompt + generated; the last one is the root), RNG state,
    finishing rules and the results of every request (finished or not)."""

    def __init__(self, prompts, max_new_tokens, eos, seeds, capacity, device):
        n = len(prompts)
        self.device = device
        self.tokens = torch.zeros(n, capacity, dtype=torch.int64, device=device)
        for b, p in enumerate(prompts):
            self.tokens[b, :len(p)] = torch.tensor(p, dtype=torch.int64)
        self.lengths = torch.tensor([len(p) for p in prompts], dtype=torch.int64, device=device)
        self.prompt_lengths = self.lengths.clone()
        self.seeds = seeds
        self.offsets = torch.zeros(n, dtype=torch.int64)   # advanced by one per verify step of the request
        self.ids = list(range(n))                          # active row -> request index
        self.results: list[list[int]] = [[] for _ in range(n)]
        self.max_new_tokens = max_new_tokens
        self.eos = eos
        self._finished: list[bool] = [False] * n

    @property
    def active(self) -> bool:
        return bool(self.ids)

    def remaining(self) -> torch.Tensor:
        """int64 [B]: tokens each active request may still emit."""
        return self.max_new_tokens - (self.lengths - self.prompt_lengths)

    def emit(self, token_ids, num_accepted, stats: GenerationStats, draft: Draft, streamer) -> bool:
        """Append each request's accepted tokens + final token; True when some request finished."""
        counts = (num_accepted.long() + 1).tolist()
        rows = token_ids.tolist()
        remaining = self.remaining().tolist()
        any_done = False
        if stats is not None:   # None: the prefill's first token
            stats.target_forwards += 1
            stats.request_steps += len(counts)
            stats.draft_tokens += int((draft.num_nodes - 1).sum())
            stats.accepted_tokens += int(num_accepted.sum())
        for b, (row, count) in enumerate(zip(rows, counts)):
            new = row[:min(count, remaining[b])]
            for i, tok in enumerate(new):
                if tok in self.eos:
                    new = new[:i + 1]
                    self._finished[b] = True
                    break
            if len(new) >= remaining[b]:
                self._finished[b] = True
            start = int(self.lengths[b])
            self.tokens[b, start:start + len(new)] = torch.tensor(new, dtype=torch.int64)
            self.lengths[b] += len(new)
            self.results[self.ids[b]].extend(new)
            if stats is not None:
                stats.generated_tokens += len(new)
                stats.step_tokens += len(new)
            if streamer is not None:
                streamer(self.ids[b], new)
            any_done |= self._finished[b]
        self.offsets += 1
        return any_done

    def keep_unfinished(self) -> torch.Tensor:
        keep = [b for b, done in enumerate(self._finished) if not done]
        rows = torch.tensor(keep, dtype=torch.int64, device=self.device)
        self.tokens = self.tokens.index_select(0, rows)
        self.lengths = self.lengths.index_select(0, rows)
        self.prompt_lengths = self.prompt_lengths.index_select(0, rows)
        self.seeds = self.seeds[rows.cpu()]
        self.offsets = self.offsets[rows.cpu()]
        self.ids = [self.ids[b] for b in keep]
        self._finished = [False] * len(keep)
        return rows


# --------------------------------------------------------------------------------- masks and forwards


def forward_window(model, cache: RaggedKVCache, tokens, depth, mask, logits_at=None) -> torch.Tensor:
    """Target/drafter forward over a window of tree nodes ``tokens [B, N]`` placed at slots
    ``seq_lens[b] + i``: positions ``seq_lens + depth``, the additive mask from tree_attention_bias.
    Returns float32 logits [B, N, V], or [B, V] at window offsets ``logits_at`` (int64 [B]).

    A model switched to the ``"specdec_tree"`` attention (specdec_ops.hf_attention) gets the bitmask and
    prefix lengths too and runs the tree_attention kernel instead of SDPA over the bias (on CUDA, or on
    any device when ``model.specdec_tree_backend`` names a backend)."""
    kv_len = cache.set_window(tokens.shape[1])
    prefix = cache.seq_lens
    bias = ops.tree_attention_bias(mask, prefix, kv_len, dtype=_dtype(model))
    positions = prefix.long()[:, None] + depth.long()
    extra = {}
    if getattr(model.config, "_attn_implementation", None) == "specdec_tree":
        extra = {"tree_mask": mask.contiguous(), "prefix_lens": prefix.clone()}
        backend = getattr(model, "specdec_tree_backend", None)
        if backend is not None:
            extra["tree_attention_backend"] = backend
    return forward(model, cache, tokens, positions, bias, logits_at=logits_at, **extra)


_CHAIN_TREES: dict = {}


def chain_tree(width: int, batch: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(mask, depth) of build_tree for a chain of `width` nodes, for every request (cached by width)."""
    key = (width, str(device))
    if key not in _CHAIN_TREES:
        parents = (torch.arange(width, device=device) - 1)[None]
        info = ops.build_tree(parents)
        _CHAIN_TREES[key] = (info[0], info[1])
    mask, depth = _CHAIN_TREES[key]
    return mask.expand(batch, *mask.shape[1:]), depth.expand(batch, -1)


# ---------------------------------------------------------------------------------------------- checks


def _check_prompts(prompts, vocab_size: int) -> list[list[int]]:
    if isinstance(prompts, torch.Tensor):
        if prompts.dim() != 2 or prompts.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"prompts must be a list of token-id lists or an int64 [B, L] tensor, got "
                             f"{prompts.dtype} of shape {list(prompts.shape)}")
        prompts = prompts.tolist()
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError("prompts must be a non-empty list of token-id lists")
    out = []
    for b, p in enumerate(prompts):
        p = p.tolist() if isinstance(p, torch.Tensor) else list(p)
        if not p:
            raise ValueError(f"prompts[{b}] is empty: every prompt needs at least one token")
        for i, t in enumerate(p):
            if not 0 <= int(t) < vocab_size:
                raise ValueError(f"prompts[{b}][{i}] = {int(t)} is outside the target's vocabulary "
                                 f"[0, {vocab_size})")
        out.append([int(t) for t in p])
    return out


def _check_sampling(temperature, top_k, top_p) -> SamplingParams:
    if not temperature >= 0.0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature!r}")
    if not isinstance(top_k, int) or top_k < 0:
        raise ValueError(f"top_k must be an int >= 0 (0 = off), got {top_k!r}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
    return SamplingParams(float(temperature), top_k, float(top_p))


def _device(model) -> torch.device:
    return next(model.parameters()).device


def _dtype(model) -> torch.dtype:
    return next(model.parameters()).dtype
