"""Logits processing shared by target and drafter, per-request seeds, draft sampling noise."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import reference

PURPOSE_DRAFT = 3  # Philox purpose of the drafter's own sampling (0-2 belong to verification, csrc/common/philox.h)


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 means greedy; top_k 0 and top_p 1.0 switch those filters off."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """float32 probabilities after temperature, top-k, top-p (in that order, as transformers applies them).

        The same function processes target and drafter logits, so both sides of
        the verification see the same transformed distributions.
        """
        logits = logits.float()
        if self.greedy:
            return torch.softmax(logits, dim=-1)
        logits = logits / self.temperature
        if self.top_k > 0 and self.top_k < logits.shape[-1]:
            kth = torch.topk(logits, self.top_k, dim=-1).values[..., -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if self.top_p < 1.0:
            sorted_logits, order = torch.sort(logits, dim=-1, descending=False)
            cum = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
            remove_sorted = cum <= 1.0 - self.top_p
            remove_sorted[..., -1] = False  # keep at least the most likely token
            remove = remove_sorted.scatter(-1, order, remove_sorted)
            logits = logits.masked_fill(remove, float("-inf"))
        return torch.softmax(logits, dim=-1)


def request_seeds(seed: int, batch: int) -> torch.Tensor:
    """int64 [B]: one seed per request derived from `seed` (splitmix64, kept below 2**63)."""
    out = []
    for b in range(batch):
        z = (int(seed) * 0x9E3779B97F4A7C15 + (b + 1) * 0xBF58476D1CE4E5B9) & (2**64 - 1)
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & (2**64 - 1)
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & (2**64 - 1)
        out.append((z ^ (z >> 31)) >> 1)
    return torch.tensor(out, dtype=torch.int64)


def sample_rows(probs: torch.Tensor, seeds: torch.Tensor, offsets: torch.Tensor, position: int) -> torch.Tensor:
    """int64 [B]: one token per row of ``probs [B, V]`` by an exponential race on Philox noise.

    Reproducible per request: a function of (seeds[b], offsets[b], position) only.
    """
    vocab = probs.shape[-1]
    idx = torch.arange(vocab, dtype=torch.int64)[None, :]
    seeds = seeds.cpu()[:, None]
    offsets = offsets.cpu()[:, None]
    mask = 0xFFFFFFFF
    words = reference.philox4x32_10(idx >> 2, position & mask, offsets & mask,
                                    (((offsets >> 32) << 8) | PURPOSE_DRAFT) & mask, seeds & mask, seeds >> 32)
    stacked = torch.stack(torch.broadcast_tensors(*words), dim=-1)
    bits = torch.gather(stacked, -1, (idx & 3).expand(stacked.shape[:-1]).unsqueeze(-1)).squeeze(-1)
    noise = -torch.log(reference.bits_to_uniform(bits)).to(probs.device)
    mass = reference.prob_mass(probs)
    score = torch.where(mass > 0, mass / noise, torch.zeros((), device=probs.device))
    return score.argmax(dim=-1)
