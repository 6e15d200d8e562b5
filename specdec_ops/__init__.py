"""specdec_ops: kernels for exactly lossless speculative decoding.

Ops (``torch.ops.specdec.*``) with typed wrappers here: chain and tree rejection
sampling, tree attention masks and tree attention, in-place KV commit. See
DESIGN.md §5 for the contract and README.md for examples.
"""

from . import _ops
from ._backend import BACKENDS
from ._checks import BackendUnavailableError, SpecDecArgumentError
from .sampling import rejection_sample, rejection_sample_packed
from .types import SampleOutput

__version__ = "0.1.0"
