"""Result types of the public API."""

from __future__ import annotations

from typing import NamedTuple

import torch


class SampleOutput(NamedTuple):
    """Result of chain rejection sampling.

    token_ids:    int64 [B, K+1]: accepted drafts, then the correction or bonus token, then -1.
    num_accepted: int32 [B]: accepted drafts; request b emits num_accepted[b] + 1 tokens.
    """

    token_ids: torch.Tensor
    num_accepted: torch.Tensor


class TreeSampleOutput(NamedTuple):
    """Result of tree verification (tree_rejection_sample).

    token_ids:     int64 [B, N]: tokens of the accepted path (without the root), then the final token, then -1.
    accepted_path: int32 [B, N]: node indices 0, a1, ..., ak of the accepted path, then -1 (feeds kv_commit).
    num_accepted:  int32 [B]: k, the number of accepted draft nodes; request b emits k + 1 tokens.
    """

    token_ids: torch.Tensor
    accepted_path: torch.Tensor
    num_accepted: torch.Tensor


class LogitsSampleOutput(NamedTuple):
    """Result of chain verification from logits (rejection_sample_logits[_packed]).

    token_ids:    int64 [B, K+1]: accepted drafts, then the correction or bonus token, then -1.
    num_accepted: int32 [B]: accepted drafts; request b emits num_accepted[b] + 1 tokens.
    logprobs:     float32 [B, K+1] or None: log-probability of each emitted token under the processed
                  target distribution of the row that emitted it (greedy: log_softmax); NaN at padding.
    """

    token_ids: torch.Tensor
    num_accepted: torch.Tensor
    logprobs: torch.Tensor | None


class LogitsTreeSampleOutput(NamedTuple):
    """Result of tree verification from logits (tree_rejection_sample_logits).

    token_ids, accepted_path, num_accepted: as in TreeSampleOutput.
    logprobs: float32 [B, N] or None: log-probability of token_ids[b, i] under the processed distribution
              of node accepted_path[b, i]; NaN at padding.
    """

    token_ids: torch.Tensor
    accepted_path: torch.Tensor
    num_accepted: torch.Tensor
    logprobs: torch.Tensor | None
