"""Adapters that put specdec_ops inside existing serving engines.

Each adapter is its own module and imports its engine only when imported itself, so
``import specdec_ops`` never needs an engine installed:

- :mod:`specdec_ops.integrations.vllm`: specdec_ops as vLLM's rejection sampler.
"""
