"""The ragged batch of active requests: tokens so far, random-number state, finishing rules, results."""

from __future__ import annotations

import torch


class Batch:
    """The active requests: their tokens (prompt + generated; the last one is the root), their RNG state,
    and the results of every request, finished or not.

    Device tensors: ``tokens`` int64 [B, capacity], ``lengths`` int64 [B], ``seeds`` / ``offsets`` int64 [B]
    (the verifier's Philox inputs; ``offsets`` advances by one per verify step, on the device). Host:
    ``history`` (per active row, the same tokens as a list, for drafters that match on the host), ``ids``
    (active row -> request index), ``results``.
    """

    def __init__(self, prompts: list[list[int]], max_new_tokens: int, eos: set[int], seeds: torch.Tensor,
                 capacity: int, device, logprobs: bool = False):
        n = len(prompts)
        self.device = device
        width = max(len(p) for p in prompts)
        padded = torch.tensor([p + [0] * (width - len(p)) for p in prompts], dtype=torch.int64)
        self.tokens = torch.zeros(n, capacity, dtype=torch.int64, device=device)
        self.tokens[:, :width] = padded.to(device)
        self.lengths = torch.tensor([len(p) for p in prompts], dtype=torch.int64, device=device)
        self.history: list[list[int]] = [list(p) for p in prompts]
        self._prompt_lengths = [len(p) for p in prompts]
        self.seeds = seeds
        self.offsets = torch.zeros(n, dtype=torch.int64, device=device)
        self.ids = list(range(n))
        self.results: list[list[int]] = [[] for _ in range(n)]
        self.logprobs: list[list[float]] | None = [[] for _ in range(n)] if logprobs else None
        self.max_new_tokens = max_new_tokens
        self.eos = eos
        self._finished = [False] * n

    @property
    def active(self) -> bool:
        return bool(self.ids)

    def __len__(self) -> int:
        return len(self.ids)

    def host_lengths(self) -> list[int]:
        """Per active request, its tokens so far (prompt and generated): ``lengths`` without a device read."""
        return [len(h) for h in self.history]

    def remaining(self) -> list[int]:
        """Per active request, the tokens it may still emit."""
        return [self.max_new_tokens - (len(h) - p) for h, p in zip(self.history, self._prompt_lengths)]

    def emit(self, token_ids: torch.Tensor, num_accepted: torch.Tensor, logprobs: torch.Tensor | None = None,
             streamer=None) -> list[int]:
        """Append each request's ``num_accepted[b] + 1`` tokens of ``token_ids [B, M]`` (cut at EOS and
        max_new_tokens); returns the number appended per request. ``finished`` says who is done."""
        counts = (num_accepted.long() + 1).tolist()
        rows = token_ids.tolist()
        lps = logprobs.tolist() if logprobs is not None and self.logprobs is not None else None
        remaining = self.remaining()
        appended = []
        for b, (row, count) in enumerate(zip(rows, counts)):
            new = row[:min(count, remaining[b])]
            for i, tok in enumerate(new):
                if tok in self.eos:
                    new = new[:i + 1]
                    self._finished[b] = True
                    break
            if len(new) >= remaining[b]:
                self._finished[b] = True
            self.history[b].extend(new)
            self.results[self.ids[b]].extend(new)
            if lps is not None:
                self.logprobs[self.ids[b]].extend(lps[b][:len(new)])
            if streamer is not None:
                streamer(self.ids[b], new)
            appended.append(len(new))
        self._write(rows, appended)
        self.offsets += 1
        return appended

    def _write(self, rows: list[list[int]], appended: list[int]) -> None:
        """Mirror the appended tokens into the device tensors (one copy for the batch)."""
        width = max(appended)
        if width == 0:
            return
        new = torch.tensor([r[:width] + [0] * (width - len(r[:width])) for r in rows], dtype=torch.int64,
                           device=self.device)
        count = torch.tensor(appended, dtype=torch.int64, device=self.device)
        cols = self.lengths[:, None] + torch.arange(width, device=self.device)
        keep = torch.arange(width, device=self.device)[None] < count[:, None]
        cols = torch.where(keep, cols, self.tokens.shape[1] - 1).clamp(max=self.tokens.shape[1] - 1)
        current = self.tokens.gather(1, cols)
        self.tokens.scatter_(1, cols, torch.where(keep, new, current))
        self.lengths += count

    @property
    def finished(self) -> list[bool]:
        return list(self._finished)

    def keep_unfinished(self) -> torch.Tensor:
        """Drop finished requests; returns the kept rows (int64 [B'] on the device)."""
        keep = [b for b, done in enumerate(self._finished) if not done]
        rows = torch.tensor(keep, dtype=torch.int64, device=self.device)
        self.tokens = self.tokens.index_select(0, rows)
        self.lengths = self.lengths.index_select(0, rows)
        self.seeds = self.seeds.index_select(0, rows)
        self.offsets = self.offsets.index_select(0, rows)
        self.history = [self.history[b] for b in keep]
        self._prompt_lengths = [self._prompt_lengths[b] for b in keep]
        self.ids = [self.ids[b] for b in keep]
        self._finished = [False] * len(keep)
        return rows
