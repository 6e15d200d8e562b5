"""specdec_ops: kernels for exactly lossless speculative decoding.

Ops (``torch.ops.specdec.*``) with typed wrappers here: chain and tree rejection
sampling, tree attention masks and tree attention, in-place KV commit. See
DESIGN.md §5 for the contract and README.md for examples.
"""

import importlib.util as _importlib_util
import os as _os
import sys as _sys

try:  # installed: setup.py maps triton_kernels/ to specdec_ops.triton_kernels
    from . import triton_kernels  # noqa: F401
except ImportError:  # a source checkout on PYTHONPATH (build_ext --inplace): triton_kernels/ sits beside the package
    _src = _os.path.join(_os.path.dirname(_os.path.dirname(_os.path.abspath(__file__))), "triton_kernels")
    _spec = _importlib_util.spec_from_file_location(
        __name__ + ".triton_kernels", _os.path.join(_src, "__init__.py"), submodule_search_locations=[_src])
    triton_kernels = _importlib_util.module_from_spec(_spec)
    _sys.modules[_spec.name] = triton_kernels
    _spec.loader.exec_module(triton_kernels)

from . import _ops  # noqa: E402
from ._backend import BACKENDS  # noqa: E402
from ._checks import BackendUnavailableError, SpecDecArgumentError
from .kv import kv_commit, kv_rollback
from .rejection import rejection_sample, rejection_sample_packed
from .attention_merge import merge_attention_states
from .tree import TreeInfo, build_tree, parents_to_paths, paths_to_parents, topk_grid_to_parents
from .attention import tree_attention, tree_attention_bias
from .tree_verify import tree_rejection_sample
from .types import SampleOutput, TreeSampleOutput
from .logits import (process_logits, rejection_sample_logits, rejection_sample_logits_packed,  # noqa: E402
                     tree_rejection_sample_logits)
from .types import LogitsSampleOutput, LogitsTreeSampleOutput  # noqa: E402
from . import distributed  # noqa: E402  (vocab-parallel verification, DESIGN.md §5.8)
from . import linear  # noqa: E402,F401  (few-row CPU products of the decode loop's forward)

__version__ = "0.1.0"

__all__ = [
    "BACKENDS", "BackendUnavailableError", "SpecDecArgumentError",
    "SampleOutput", "TreeSampleOutput", "TreeInfo",
    "rejection_sample", "rejection_sample_packed", "tree_rejection_sample",
    "build_tree", "tree_attention_bias", "tree_attention", "merge_attention_states",
    "paths_to_parents", "parents_to_paths", "topk_grid_to_parents",
    "kv_commit", "kv_rollback", "register_hf_attention",
    "LogitsSampleOutput", "LogitsTreeSampleOutput", "process_logits", "rejection_sample_logits",
    "rejection_sample_logits_packed", "tree_rejection_sample_logits",
]


def register_hf_attention() -> None:
    """Register the ``"specdec_tree"`` attention implementation with transformers (see hf_attention)."""
    from .decoding.hf_attention import register

    register()
