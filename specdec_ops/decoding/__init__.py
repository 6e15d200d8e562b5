"""Speculative decoding of Hugging Face causal LMs with the package's ops (DESIGN.md §5.6).

    from specdec_ops.decoding import SpeculativeDecoder, NGramDrafter, default_setup
    decoder = SpeculativeDecoder(target_model, NGramDrafter(n=3), num_speculative_tokens=4, tree=None)
    decoder = SpeculativeDecoder(target_model, **default_setup(target_model, tokenizer))   # the CLI's setup
    out = decoder.generate([[1, 2, 3], [4, 5]], max_new_tokens=64)
    out.sequences, out.stats

Layers, each importing only those above it: ``types`` (Draft, outputs, the Drafter protocol), ``batch``,
``forward`` (the model forward over a ragged KV cache), ``sampling`` (§5.7's processed distribution,
seeds); then ``drafters/`` and ``decoder`` (the loop) side by side; then ``setup`` (``default_setup``).
"""

from .decoder import SpeculativeDecoder
from .drafters import (ByMatchLength, CopyCursor, CostModel, FixedLength, ForwardCost, Match, MatchLengthPrior,
                       ModelDrafter, NGramDrafter, find_matches)
from .sampling import SamplingParams, process_probs
from .setup import default_drafter, default_setup, measure_forward_cost
from .types import Draft, Drafter, GenerateOutput, GenerationStats

__all__ = ["SpeculativeDecoder", "ModelDrafter", "NGramDrafter", "default_setup", "default_drafter",
           "measure_forward_cost", "Draft", "Drafter", "GenerateOutput", "GenerationStats", "SamplingParams",
           "process_probs",
           "find_matches", "Match", "FixedLength", "ByMatchLength", "CostModel", "ForwardCost",
           "MatchLengthPrior", "CopyCursor"]
