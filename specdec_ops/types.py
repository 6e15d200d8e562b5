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
