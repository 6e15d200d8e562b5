"""specdec_ops as vLLM's rejection sampler (vLLM 0.33).

vLLM verifies drafts in ``vllm.v1.sample.rejection_sampler``: ``RejectionSampler.forward`` processes
the target logits (logits processors, penalties, temperature, top-k, top-p), has its own sampler draw
the bonus tokens, then calls the module function ``rejection_sample(...)``. This module provides a
drop-in for that function with vLLM 0.33's exact signature and output, built on
:func:`specdec_ops.rejection_sample_logits_packed`:

- one fused op reads the processed logits once: no softmax tensor, no separate recovery pass, no
  float64 uniforms tensor, no host sync, and the bonus rows are never touched (vLLM's layout, with
  ``bonus_token_ids`` from vLLM's own sampler);
- greedy requests (temperature 0) are verified by the argmax of the logits, first index on ties;
  sampled requests by speculative sampling with residual normalization (exact: every emitted token is
  distributed as vLLM's target distribution);
- per-request random numbers are Philox streams keyed by a per-request seed (DESIGN.md §5.1), so a
  request's result never depends on which other requests share the batch; seeded requests draw that
  seed from their own ``torch.Generator`` (reproducible from it), the others from torch's generator
  for the device;
- placeholder drafts (-1) are rejected at their position; vLLM's synthetic acceptance mode is
  supported (forced per-position acceptance rates, for benchmarking);
- FLy (``rejection_sample_method="fly"``, vLLM's lossy entropy-gated acceptance) is delegated to
  vLLM's own implementation, so swapping the sampler never breaks a vLLM configuration.

Use::

    from specdec_ops.integrations import vllm as specdec_vllm
    specdec_vllm.install()      # every RejectionSampler now verifies with specdec_ops
    specdec_vllm.uninstall()    # back to vLLM's own

or, with no code at all, ``VLLM_PLUGINS=specdec_ops`` (the ``vllm.general_plugins`` entry point
declared in pyproject.toml calls :func:`register` in every vLLM process).

Two behaviours differ from vLLM's sampler, by design:

- A draft token whose draft probability is 0 is accepted when the target gives it mass (the test is
  ``u * q(x) < p(x)``, DESIGN.md §5.2); vLLM rejects it as a guard. Sampling from q never drafts such a
  token, so the output distribution is the same; only a drafter that proposes tokens outside its own
  distribution sees the difference.
- The random numbers are specdec_ops' (24-bit uniforms in (0, 1), Philox4x32-10), not torch's
  float64 ones: the same seed gives different, equally distributed, tokens than vLLM's sampler.
  ``use_fp64_gumbel`` is accepted and has no effect.

Importing this module needs vLLM 0.33 (``pip install vllm==0.33.0``); it raises ImportError naming
what is missing otherwise. vLLM's model-runner-v2 path (``vllm.v1.worker.gpu.spec_decode``) has a
rejection sampler of its own with another interface; it is not replaced.
"""

from __future__ import annotations

import torch

from .. import logits as _logits

SUPPORTED_VLLM = "0.33"

try:
    import vllm as _vllm
except ImportError as exc:  # pragma: no cover - exercised by tests/test_vllm_adapter.py without vLLM
    raise ImportError(
        f"specdec_ops.integrations.vllm needs vLLM {SUPPORTED_VLLM}.x, which is not installed "
        f"(pip install vllm=={SUPPORTED_VLLM}.0): {exc}") from exc

_VERSION = getattr(_vllm, "__version__", "unknown")
if _VERSION.split("+")[0].split(".")[:2] != SUPPORTED_VLLM.split("."):
    raise ImportError(
        f"specdec_ops.integrations.vllm supports vLLM {SUPPORTED_VLLM}.x (the rejection_sample interface "
        f"it replaces changes between releases); found vLLM {_VERSION}")

from vllm.v1.sample import rejection_sampler as _rs  # noqa: E402

# vLLM's own function, kept for FLy and for uninstall(); taken before any install().
_VLLM_REJECTION_SAMPLE = _rs.rejection_sample
_GREEDY_TEMPERATURE = 0
_SEED_HIGH = 2**63 - 1


def _exclusive_cu(cu_num_draft_tokens: torch.Tensor, batch: int) -> torch.Tensor:
    """vLLM's inclusive prefix sums [B] -> specdec_ops' exclusive ones [B + 1] (on the device)."""
    cu = torch.zeros(batch + 1, dtype=cu_num_draft_tokens.dtype, device=cu_num_draft_tokens.device)
    cu[1:].copy_(cu_num_draft_tokens)
    return cu


def _seeds(num_draft_tokens: list[int], generators: dict[int, torch.Generator], batch: int,
           device: torch.device) -> torch.Tensor:
    """One Philox seed per request: from the request's generator when it has one (and drafts: like
    vLLM, a request without drafts leaves its generator untouched), else from torch's generator for
    the device. Device tensors only: no host sync."""
    seeds = torch.randint(0, _SEED_HIGH, (batch,), dtype=torch.int64, device=device)
    for i, gen in generators.items():
        if num_draft_tokens[i] > 0:
            drawn = torch.randint(0, _SEED_HIGH, (1,), dtype=torch.int64, device=gen.device, generator=gen)
            seeds[i:i + 1].copy_(drawn, non_blocking=True)
    return seeds


def rejection_sample(
    draft_token_ids: torch.Tensor,
    num_draft_tokens: list[int],
    max_spec_len: int,
    cu_num_draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_logits: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    sampling_metadata,
    synthetic_mode: bool = False,
    synthetic_conditional_rates: torch.Tensor | None = None,
    use_fp64_gumbel: bool = False,
    fly_window_size: int | None = None,
    fly_entropy_threshold: float | None = None,
    fly_entropy_top_k: int = 3,
) -> torch.Tensor:
    """vLLM 0.33's ``rejection_sample`` on specdec_ops' fused logits op.

    Parameters
    ----------
    draft_token_ids : int32 | int64 [T]
        The drafts of all requests, packed; -1 marks a placeholder (rejected at its position).
    num_draft_tokens : list[int] of B
        n_b per request (host list, as vLLM passes it; used only to decide which generators advance).
    max_spec_len : int
        K: the output has K + 1 columns.
    cu_num_draft_tokens : int32 | int64 [B]
        Inclusive prefix sums of n_b (vLLM's convention).
    draft_probs : float32 [T, V] or None
        The drafter's distribution at each draft position; None for one-hot drafts (n-gram, EAGLE greedy).
    target_logits : float32 [T, V]
        The processed target logits (temperature, top-k, top-p already applied by vLLM; no bonus rows).
    bonus_token_ids : int64 [B, 1]
        vLLM's sampled bonus tokens, emitted after a fully accepted draft.
    sampling_metadata : vllm.v1.sample.metadata.SamplingMetadata
        ``all_greedy``, ``temperature`` (0 = greedy) and ``generators`` are read.
    synthetic_mode, synthetic_conditional_rates : bool, float32 [>= K]
        vLLM's synthetic acceptance mode: accept position k with the given conditional rate.
    use_fp64_gumbel : bool
        Accepted for compatibility; no effect (see the module docstring).
    fly_window_size, fly_entropy_threshold, fly_entropy_top_k
        FLy settings: when ``fly_window_size`` is set the call goes to vLLM's own implementation.

    Returns
    -------
    int32 [B, K + 1]
        Accepted drafts, then the correction or bonus token, then -1 (vLLM's PLACEHOLDER_TOKEN_ID).
    """
    if fly_window_size is not None:  # lossy by design and vLLM's own: delegate, do not reimplement
        return _VLLM_REJECTION_SAMPLE(
            draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs, target_logits,
            bonus_token_ids, sampling_metadata, synthetic_mode=synthetic_mode,
            synthetic_conditional_rates=synthetic_conditional_rates, use_fp64_gumbel=use_fp64_gumbel,
            fly_window_size=fly_window_size, fly_entropy_threshold=fly_entropy_threshold,
            fly_entropy_top_k=fly_entropy_top_k)

    batch = len(num_draft_tokens)
    device = target_logits.device
    if sampling_metadata.all_greedy:
        # temperature 0: the argmax of the logits (vLLM passes temperature=None when all are greedy)
        temperature = torch.zeros(batch, dtype=torch.float32, device=device)
    else:
        # vLLM has already divided the sampled requests' logits by their temperature: verify at 1.
        temperature = (sampling_metadata.temperature != _GREEDY_TEMPERATURE).to(torch.float32)
    if synthetic_mode or not sampling_metadata.all_greedy:
        seeds = _seeds(num_draft_tokens, sampling_metadata.generators, batch, device)
    else:  # greedy verification draws no random numbers: no generator advances
        seeds = torch.zeros(batch, dtype=torch.int64, device=device)

    out = _logits.rejection_sample_logits_packed(
        target_logits, _exclusive_cu(cu_num_draft_tokens, batch), draft_token_ids, draft_probs,
        temperature=temperature, seeds=seeds, bonus_token_ids=bonus_token_ids, reject_invalid_drafts=True,
        synthetic_acceptance_rates=synthetic_conditional_rates if synthetic_mode else None,
        max_num_draft_tokens=max_spec_len)
    return out.token_ids.to(torch.int32)


def installed() -> bool:
    """Whether vLLM's rejection sampler currently calls specdec_ops."""
    return _rs.rejection_sample is rejection_sample


def install() -> None:
    """Make vLLM's ``RejectionSampler`` verify with specdec_ops (idempotent; undo with :func:`uninstall`)."""
    _rs.rejection_sample = rejection_sample


def uninstall() -> None:
    """Give vLLM its own ``rejection_sample`` back (idempotent)."""
    _rs.rejection_sample = _VLLM_REJECTION_SAMPLE


def register() -> None:
    """The ``vllm.general_plugins`` entry point (``VLLM_PLUGINS=specdec_ops``): installs the sampler in
    every vLLM process that loads plugins. Safe to call more than once."""
    install()


__all__ = ["SUPPORTED_VLLM", "install", "installed", "register", "rejection_sample", "uninstall"]
