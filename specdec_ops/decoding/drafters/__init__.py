"""Drafters: prompt lookup (NGramDrafter, built from a matcher, a length policy and re-rankers) and a smaller
HF model (ModelDrafter). Each implements the Drafter protocol of ``decoding/types.py``."""

from .model import ModelDrafter
from .ngram import CopyCursor, Match, NGramDrafter, NGramRequest, find_matches
from .policies import (ByMatchLength, CostModel, DraftLengthPolicy, FixedLength, ForwardCost, MatchLengthPrior,
                       RequestStats)

__all__ = ["NGramDrafter", "ModelDrafter", "find_matches", "Match", "NGramRequest", "CopyCursor",
           "DraftLengthPolicy", "FixedLength", "ByMatchLength", "CostModel", "ForwardCost",
           "MatchLengthPrior", "RequestStats"]
