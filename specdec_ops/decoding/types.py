"""The types the decode loop and the drafters share: a draft, the outputs, and the drafter interface.

Nothing here imports the loop or a drafter: ``decoder.py`` and ``drafters/`` both stand on this module,
``batch.py``, ``forward.py`` and ``sampling.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple, Protocol, runtime_checkable

import torch

if TYPE_CHECKING:
    from .batch import Batch
    from .sampling import SamplingParams

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


def chain_draft(tokens: torch.Tensor, num_nodes: torch.Tensor, draft_probs: torch.Tensor | None = None) -> Draft:
    """A chain Draft from node tokens ``[B, N]`` (root first) and real node counts ``[B]``."""
    batch, width = tokens.shape
    steps = torch.arange(width, device=tokens.device)
    parents = torch.where(steps[None] < num_nodes[:, None].to(tokens.device), steps - 1, -1).expand(batch, width)
    return Draft(tokens, parents.contiguous(), num_nodes.to(tokens.device), draft_probs, chain=True)


@runtime_checkable
class Drafter(Protocol):
    """What the loop calls, in this order: ``reset`` once, then per step ``propose`` and ``commit``, and
    ``keep`` whenever finished requests leave the batch. A drafter keeps one state object per request."""

    def reset(self, batch: Batch, capacity: int, vocab_size: int) -> None:
        """Before the first step: ``batch`` holds the prompts and the first generated token (the root)."""

    def propose(self, batch: Batch, k: int, tree: int | None, sampling: SamplingParams) -> Draft:
        """A chain of at most ``k`` tokens (``tree`` None) or a tree of at most ``tree`` nodes besides the root,
        each path at most ``k`` deep, below each active request's root. Request b drafts at most
        ``batch.remaining()[b] - 1`` tokens. A drafter built with its own longer draft length exposes it as an
        int attribute ``k`` (``NGramDrafter(k=...)``): the loop sizes its KV cache for the longer of the two."""

    def commit(self, accepted_path: torch.Tensor, num_accepted: torch.Tensor) -> None:
        """After verification: ``accepted_path`` int [B, N] (node indices 0, a1, .., then -1) and
        ``num_accepted`` int32 [B] of the last proposal; the batch already holds the emitted tokens."""

    def keep(self, rows: torch.Tensor) -> None:
        """Only the active requests at ``rows`` (int64 [B']) stay."""


@dataclass
class GenerationStats:
    """Counters of one ``generate`` call."""

    target_forwards: int = 0      # verify forwards of the target (prefill not counted)
    draft_tokens: int = 0         # draft tokens proposed
    accepted_tokens: int = 0      # draft tokens accepted and emitted (not those cut by an EOS or max_new_tokens)
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
    """``sequences``: generated tokens per request through the first EOS; ``logprobs``: per request one float
    per generated token (``generate(logprobs=True)``), else None."""

    sequences: list[list[int]]
    stats: GenerationStats = field(default_factory=GenerationStats)
    logprobs: list[list[float]] | None = None
