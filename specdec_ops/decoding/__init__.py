"""Speculative decoding of Hugging Face causal LMs with the package's ops (DESIGN.md §5.6).

    from specdec_ops.decoding import SpeculativeDecoder, ModelDrafter, NGramDrafter
    decoder = SpeculativeDecoder(target_model, NGramDrafter(n=3), num_speculative_tokens=4, tree=None)
    out = decoder.generate([[1, 2, 3], [4, 5]], max_new_tokens=64)
    out.sequences, out.stats
"""

from .decoder import Draft, GenerateOutput, GenerationStats, SpeculativeDecoder
from .drafters import ModelDrafter, NGramDrafter, word_starts

__all__ = ["SpeculativeDecoder", "ModelDrafter", "NGramDrafter", "Draft", "GenerateOutput", "GenerationStats",
           "word_starts"]
