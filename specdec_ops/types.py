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
