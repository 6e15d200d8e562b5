"""SpeculativeDecoder: the decode loop (DESIGN.md §5.6).

The algorithm is ``generate`` below, one screen long: draft, one target forward over the draft, verify
straight from the logits, commit the accepted K/V, emit. The helpers under it do the bookkeeping. The loop
stands on ``types``, ``batch``, ``forward`` and ``sampling``; the drafters stand on the same modules and
never import this one.
"""

from __future__ import annotations

import numbers
import time
from typing import NamedTuple

import numpy as np
import torch

import specdec_ops as ops
from specdec_ops._nvtx import nvtx_range
from .batch import Batch
from .forward import (TREE_ATTENTION, RaggedKVCache, chain_tree, check_model, forward, model_device, model_dtype,
                      tree_of, vocab_size)
from .sampling import SamplingParams, request_seeds
from .types import MAX_TREE_NODES, Draft, Drafter, GenerateOutput, GenerationStats


class SpeculativeDecoder:
    """Speculative decoding of a Hugging Face causal LM with the package's ops.

    Parameters
    ----------
    target_model : transformers causal LM (Llama-style attention: takes position_ids and a 4-D additive mask)
    drafter : a :class:`~specdec_ops.decoding.types.Drafter` (NGramDrafter, ModelDrafter, ...)
    num_speculative_tokens : int >= 1
        Longest chain; with ``tree`` the deepest draft path.
    tree : int | None
        None drafts a chain; an int drafts a tree of up to ``tree`` nodes besides the
        root (1 .. 255) and verifies it in one target forward.
    tree_attention_backend : str | None
        For a target switched to the ``"specdec_tree"`` attention (``specdec_ops.register_hf_attention()``,
        then ``model.set_attn_implementation("specdec_tree")``): the backend of ``tree_attention`` its
        layers run ("cuda", "triton", "cpu", "reference"). None: the kernel on CUDA, SDPA over the additive
        mask elsewhere.
    """

    def __init__(self, target_model, drafter: Drafter, num_speculative_tokens: int = 4, tree: int | None = None,
                 tree_attention_backend: str | None = None):
        if isinstance(num_speculative_tokens, bool) or not isinstance(num_speculative_tokens, int) \
                or num_speculative_tokens < 1:
            raise ops.SpecDecArgumentError(f"num_speculative_tokens must be an int >= 1, got "
                                           f"{num_speculative_tokens!r}")
        if tree is not None and (isinstance(tree, bool) or not isinstance(tree, int)
                                 or not 1 <= tree <= MAX_TREE_NODES):
            raise ops.SpecDecArgumentError(f"tree must be None or an int in [1, {MAX_TREE_NODES}] (draft nodes "
                                           f"besides the root), got {tree!r}")
        check_model(target_model, "target_model")
        if isinstance(drafter, type):
            raise ops.SpecDecArgumentError(f"drafter must be a drafter instance, got the class {drafter.__name__} "
                                           f"(e.g. {drafter.__name__}(...))")
        if tree_attention_backend is not None:
            if getattr(target_model.config, "_attn_implementation", None) != TREE_ATTENTION:
                raise ops.SpecDecArgumentError(
                    f"tree_attention_backend={tree_attention_backend!r} needs a target using the "
                    f"{TREE_ATTENTION!r} attention: call specdec_ops.register_hf_attention() and "
                    f"target_model.set_attn_implementation({TREE_ATTENTION!r}) first")
            if tree_attention_backend not in ops.BACKENDS:
                raise ops.SpecDecArgumentError(f"tree_attention_backend must be None or one of {ops.BACKENDS}, "
                                               f"got {tree_attention_backend!r}")
        for method in ("reset", "propose", "commit", "keep"):
            if not callable(getattr(drafter, method, None)):
                raise ops.SpecDecArgumentError(f"drafter must have reset / propose / commit / keep (the Drafter "
                                               f"protocol); {type(drafter).__name__} has no {method}()")
        self.target = target_model
        self.drafter = drafter
        self.k = num_speculative_tokens
        self.tree = tree
        self.tree_attention_backend = tree_attention_backend
        self.vocab_size = vocab_size(target_model)
        drafter_vocab = getattr(drafter, "vocab_size", None)
        if drafter_vocab is not None and drafter_vocab != self.vocab_size:
            raise ops.SpecDecArgumentError(f"drafter vocab size {drafter_vocab} does not match the target's vocab "
                                           f"size {self.vocab_size}: the drafter must share the target's tokenizer")
        self.cache: RaggedKVCache | None = None

    # ------------------------------------------------------------------------------------- the algorithm

    @torch.inference_mode()
    def generate(self, prompts, max_new_tokens: int = 128, temperature=0.0, top_k=0, top_p=1.0, min_p=0.0,
                 seed: int = 0, eos_token_id=None, logprobs: bool = False, streamer=None) -> GenerateOutput:
        """Generate up to ``max_new_tokens`` tokens for each prompt.

        Parameters
        ----------
        prompts : list[list[int]] (ragged) or int64 [B, L]
        temperature, top_k, top_p, min_p : one value for every request, or a list (or [B] tensor) of B
            (DESIGN.md §5.7);
            temperature 0 = greedy, top_k 0, top_p 1 and min_p 0 = off
        seed : int: request b's random numbers are a function of (seed, b)
        eos_token_id : int, list of ints, or None (the target's generation_config); [] never stops early
        logprobs : fill ``out.logprobs``: per request, the log-probability of each generated token under the
            processed target distribution it was drawn from (greedy requests: log_softmax of the raw logits)
        streamer : ``streamer(request_index, new_tokens)`` is called as tokens are emitted

        Returns
        -------
        GenerateOutput(sequences: generated tokens per request through the first EOS, stats, logprobs)
        """
        start = time.perf_counter()
        stats = GenerationStats()
        batch, sampling = self._prefill(prompts, max_new_tokens, temperature, top_k, top_p, min_p, seed,
                                        eos_token_id, logprobs, stats, streamer)
        while batch.active:                     # the cache holds every token but the last one (the root)
            with nvtx_range("draft"):
                draft = self.drafter.propose(batch, self.k, self.tree, sampling)
            with nvtx_range("verify"):
                logits = self._verify_forward(draft, batch)          # one target forward over every node
            with nvtx_range("sample"):
                out = self._verify(draft, logits, sampling, batch, logprobs)    # straight from the logits
            with nvtx_range("commit"):
                ops.kv_commit(self.cache.commit_views(), self.cache.seq_lens, out.accepted_path)
                self.drafter.commit(out.accepted_path, out.num_accepted)
                appended = batch.emit(out.token_ids, out.num_accepted, out.logprobs, streamer)
                stats_step(stats, draft, out, appended)
            if any(batch.finished):                                  # finished requests stop costing work
                sampling = self._drop_finished(batch, sampling)
        stats.seconds = time.perf_counter() - start
        return GenerateOutput(batch.results, stats, batch.logprobs)

    # ----------------------------------------------------------------------------------------- helpers

    def _prefill(self, prompts, max_new_tokens, temperature, top_k, top_p, min_p, seed, eos_token_id, logprobs,
                 stats, streamer) -> tuple[Batch, SamplingParams]:
        """One forward over the (ragged) prompts fills the cache; their last logits give the first token
        (rejection_sample with no drafts: a draw from p, argmax when greedy), the first root."""
        if not _is_token_id(max_new_tokens) or max_new_tokens < 1:
            raise ops.SpecDecArgumentError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
        max_new_tokens = int(max_new_tokens)
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
            raise ops.SpecDecArgumentError(f"seed must be an int, got {seed!r}")
        prompts = _check_prompts(prompts, self.vocab_size)
        device = model_device(self.target)
        sampling = SamplingParams.build(len(prompts), device, temperature, top_k, top_p, min_p)
        eos = _eos_set(eos_token_id, self.target)
        # the widest window a step can verify: a drafter's own draft length (NGramDrafter(k=...)) overrides k
        own_k = getattr(self.drafter, "k", None)
        longest = max(self.k, own_k) if isinstance(own_k, int) and not isinstance(own_k, bool) else self.k
        window = 1 + (self.tree if self.tree is not None else longest)
        capacity = max(len(p) for p in prompts) + max_new_tokens + window + 1
        batch = Batch(prompts, max_new_tokens, eos, request_seeds(seed, len(prompts), device), capacity, device,
                      logprobs=logprobs)
        self.cache = RaggedKVCache(self.target, len(prompts), capacity, device, model_dtype(self.target))
        with nvtx_range("prefill"):
            width = max(len(p) for p in prompts)
            mask, depth = chain_tree(width, len(prompts), device)
            logits = forward(self.target, self.cache, batch.tokens[:, :width], self.cache.seq_lens, depth, mask,
                             logits_at=batch.lengths - 1, tree_attention_backend=self.tree_attention_backend,
                             start_range=(0, 0))
            self.cache.seq_lens.copy_(batch.lengths)
            none = torch.zeros(len(prompts), 0, dtype=torch.int64, device=device)
            first = ops.rejection_sample_logits(logits[:, None], none, torch.zeros(len(prompts), dtype=torch.int64,
                                                                                   device=device),
                                                seeds=batch.seeds, offsets=batch.offsets, return_logprobs=logprobs,
                                                **sampling.op_kwargs())
            batch.emit(first.token_ids, first.num_accepted, first.logprobs, streamer)
        stats.generated_tokens += len(prompts)
        self.drafter.reset(batch, capacity, self.vocab_size)
        if any(batch.finished):
            sampling = self._drop_finished(batch, sampling)
        return batch, sampling

    def _drop_finished(self, batch: Batch, sampling: SamplingParams) -> SamplingParams:
        rows = batch.keep_unfinished()
        self.cache.keep(rows)
        self.drafter.keep(rows)
        return sampling.select(rows)

    def _verify_forward(self, draft: Draft, batch: Batch) -> torch.Tensor:
        """float32 logits [B, N, V] of the target at every draft node; the nodes' K/V land in the cache window.
        The cache holds every token but the root: its lengths are the batch's host lengths minus one."""
        rows, width = draft.tokens.shape
        if draft.chain:
            mask, depth = chain_tree(width, rows, draft.tokens.device)
        else:
            mask, depth = tree_of(draft.parents, draft.num_nodes)
        lengths = batch.host_lengths()
        return forward(self.target, self.cache, draft.tokens, self.cache.seq_lens, depth, mask,
                       tree_attention_backend=self.tree_attention_backend,
                       start_range=(min(lengths) - 1, max(lengths) - 1))

    def _verify(self, draft: Draft, logits, sampling: SamplingParams, batch: Batch, logprobs: bool) -> Verified:
        """Verification from the target's raw logits [B, N, V] (DESIGN.md §5.7): the ops process each row
        with the request's parameters only when verification reaches it."""
        kwargs = dict(seeds=batch.seeds, offsets=batch.offsets, return_logprobs=logprobs, **sampling.op_kwargs())
        if draft.chain:
            q = None if draft.draft_probs is None else draft.draft_probs[:, :-1].contiguous()
            out = ops.rejection_sample_logits(logits, draft.tokens[:, 1:], draft.num_nodes - 1, q, **kwargs)
            steps = torch.arange(draft.tokens.shape[1], device=logits.device)
            path = torch.where(steps <= out.num_accepted[:, None].long(), steps, -1)
            return Verified(out.token_ids, out.num_accepted, path, out.logprobs)
        out = ops.tree_rejection_sample_logits(logits, draft.tokens, draft.parents, draft.num_nodes,
                                               draft.draft_probs, **kwargs)
        return Verified(out.token_ids, out.num_accepted, out.accepted_path, out.logprobs)


class Verified(NamedTuple):
    token_ids: torch.Tensor      # int64 [B, N]: accepted drafts, then the final token, then -1
    num_accepted: torch.Tensor   # int32 [B]
    accepted_path: torch.Tensor  # int [B, N]: 0, a1, .., then -1 (window offsets of the committed entries)
    logprobs: torch.Tensor | None  # float32 [B, N] (NaN padded) when asked for


def stats_step(stats: GenerationStats, draft: Draft, out: Verified, appended: list[int]) -> None:
    """Counts one verify step. Accepted tokens are the accepted drafts the requests emitted: a draft accepted
    after an EOS or past max_new_tokens is cut with the tokens after it, so each request's step emitted
    min(accepted, appended) drafts and, when appended exceeds that, its correction or bonus token."""
    stats.target_forwards += 1
    stats.request_steps += len(appended)
    stats.draft_tokens += int((draft.num_nodes - 1).sum())
    stats.accepted_tokens += sum(min(a, n) for a, n in zip(out.num_accepted.tolist(), appended))
    stats.generated_tokens += sum(appended)
    stats.step_tokens += sum(appended)


# ---------------------------------------------------------------------------------------------- checks


def _is_token_id(t) -> bool:
    return isinstance(t, numbers.Integral) and not isinstance(t, (bool, np.bool_))


def _check_prompts(prompts, vocab_size: int) -> list[list[int]]:
    if isinstance(prompts, np.ndarray):
        prompts = torch.from_numpy(prompts) if prompts.dtype.kind in "iu" else prompts.tolist()
    if isinstance(prompts, torch.Tensor):
        if prompts.dim() != 2 or prompts.dtype not in (torch.int32, torch.int64):
            raise ops.SpecDecArgumentError(f"prompts must be a list of token-id lists or an int64 [B, L] tensor, "
                                           f"got {prompts.dtype} of shape {list(prompts.shape)}")
        prompts = prompts.tolist()
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise ops.SpecDecArgumentError("prompts must be a non-empty list of token-id lists")
    out = []
    for b, p in enumerate(prompts):
        if isinstance(p, (torch.Tensor, np.ndarray)) and p.ndim == 1:
            p = p.tolist()        # its elements checked below: a float or bool tensor is refused there
        if not isinstance(p, (list, tuple)):
            raise ops.SpecDecArgumentError(f"prompts must be a list of token-id lists; prompts[{b}] is "
                                           f"{type(p).__name__} {p!r}")
        if not p:
            raise ops.SpecDecArgumentError(f"prompts[{b}] is empty: every prompt needs at least one token")
        for i, t in enumerate(p):
            if not _is_token_id(t):
                raise ops.SpecDecArgumentError(f"prompts[{b}][{i}] = {t!r} is not an integer token id")
            if not 0 <= int(t) < vocab_size:
                raise ops.SpecDecArgumentError(f"prompts[{b}][{i}] = {int(t)} is outside the target's vocabulary "
                                               f"[0, {vocab_size})")
        out.append([int(t) for t in p])
    return out


def _eos_set(eos_token_id, target) -> set[int]:
    """The EOS ids: ``eos_token_id`` (an int or a list of ints; [] = none), else the target's generation_config."""
    if eos_token_id is None:
        eos_token_id = getattr(getattr(target, "generation_config", None), "eos_token_id", None)
        if eos_token_id is None:
            return set()
    if isinstance(eos_token_id, torch.Tensor):
        eos_token_id = eos_token_id.tolist()
    ids = list(eos_token_id) if isinstance(eos_token_id, (list, tuple, set, frozenset)) else [eos_token_id]
    for e in ids:
        if not _is_token_id(e):
            raise ops.SpecDecArgumentError(f"eos_token_id must be an int, a list of ints or None, got "
                                           f"{eos_token_id!r}")
    return {int(e) for e in ids}
