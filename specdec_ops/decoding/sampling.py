"""Per-request sampling parameters, the processed distribution (DESIGN.md §5.7), seeds and draft sampling.

Target and drafter see the same transformed distributions: the drafter's come from ``process_probs``
(``specdec_ops.process_logits``), the target's are processed inside the logits verification ops. Random numbers: request b's
verifier seed comes from ``seed`` and b; a drafter draws from its own stream (``stream_seeds``), never from the
verifier's, since draft tokens correlated with the verifier's uniforms would bias the output.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch

import specdec_ops as ops

_U64 = (1 << 64) - 1

try:
    from numpy import bool_ as np_bool
except ImportError:  # numpy is optional here
    np_bool = bool


@dataclass(frozen=True)
class SamplingParams:
    """Per-request parameters, device tensors indexed by the batch row (DESIGN.md §5.7).

    temperature: float32 [B] (0 = greedy), top_k: int64 [B] (0 = off), top_p: float32 [B] (1 = off),
    min_p: float32 [B] (0 = off), greedy: bool [B]. The host flags say which filters any row uses; the
    others are passed to the ops as off (None).
    """

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    min_p: torch.Tensor
    greedy: torch.Tensor
    all_greedy: bool
    any_greedy: bool
    uses_top_k: bool
    uses_top_p: bool
    uses_min_p: bool

    @classmethod
    def build(cls, batch: int, device, temperature=0.0, top_k=0, top_p=1.0, min_p=0.0) -> SamplingParams:
        """Validated parameters for ``batch`` requests; each argument is one value or a list of ``batch``."""
        temperature = _per_request("temperature", temperature, batch, float)
        top_k = _per_request("top_k", top_k, batch, int)
        top_p = _per_request("top_p", top_p, batch, float)
        min_p = _per_request("min_p", min_p, batch, float)
        for b, t in enumerate(temperature):
            if not (t >= 0.0 and math.isfinite(t)):
                raise ops.SpecDecArgumentError(f"temperature{_at(b, batch)} must be a finite number >= 0 "
                                               f"(0 = greedy), got {t!r}")
        for b, k in enumerate(top_k):
            if k < 0:
                raise ops.SpecDecArgumentError(f"top_k{_at(b, batch)} must be an int >= 0 (0 = off), got {k!r}")
        for b, p in enumerate(top_p):
            if not 0.0 < p <= 1.0:
                raise ops.SpecDecArgumentError(f"top_p{_at(b, batch)} must be in (0, 1] (1 = off), got {p!r}")
        for b, p in enumerate(min_p):
            if not 0.0 <= p < 1.0:
                raise ops.SpecDecArgumentError(f"min_p{_at(b, batch)} must be in [0, 1) (0 = off), got {p!r}")
        greedy = [t == 0.0 for t in temperature]
        sampled = [not g for g in greedy]
        return cls(temperature=torch.tensor(temperature, dtype=torch.float32, device=device),
                   top_k=torch.tensor(top_k, dtype=torch.int64, device=device),
                   top_p=torch.tensor(top_p, dtype=torch.float32, device=device),
                   min_p=torch.tensor(min_p, dtype=torch.float32, device=device),
                   greedy=torch.tensor(greedy, dtype=torch.bool, device=device),
                   all_greedy=all(greedy), any_greedy=any(greedy),
                   uses_top_k=any(s and k > 0 for s, k in zip(sampled, top_k)),
                   uses_top_p=any(s and p < 1.0 for s, p in zip(sampled, top_p)),
                   uses_min_p=any(s and p > 0.0 for s, p in zip(sampled, min_p)))

    def op_kwargs(self) -> dict:
        """The keyword arguments of the package's logits ops (``process_logits``, ``rejection_sample_logits``,
        ``tree_rejection_sample_logits``); a filter no request uses is passed as None (off)."""
        return dict(temperature=self.temperature, top_k=self.top_k if self.uses_top_k else None,
                    top_p=self.top_p if self.uses_top_p else None, min_p=self.min_p if self.uses_min_p else None)

    def select(self, rows: torch.Tensor) -> SamplingParams:
        """The parameters of the requests at ``rows`` (int64 [B'], on the parameters' device)."""
        return SamplingParams(self.temperature[rows], self.top_k[rows], self.top_p[rows], self.min_p[rows],
                              self.greedy[rows], self.all_greedy, self.any_greedy, self.uses_top_k,
                              self.uses_top_p, self.uses_min_p)


def _per_request(name: str, value, batch: int, kind) -> list:
    """One value, a list or tuple of B, or a tensor (0-d, or [B]) -> B Python values of ``kind``; NumPy
    scalars count as numbers. Booleans are refused (True is not a temperature)."""
    if isinstance(value, torch.Tensor):
        if value.dim() > 1:
            raise ops.SpecDecArgumentError(f"{name} must be one value or [B], got a tensor of shape "
                                           f"{list(value.shape)}")
        value = value.tolist()
    per_request = isinstance(value, (list, tuple))
    values = list(value) if per_request else [value] * batch
    if len(values) != batch:
        raise ops.SpecDecArgumentError(f"{name} must be one value or a list of one value per prompt ({batch}), "
                                       f"got a list of {len(values)}")
    number = numbers.Integral if kind is int else numbers.Real
    for b, v in enumerate(values):
        if isinstance(v, (bool, np_bool)) or not isinstance(v, number):
            what = "an int" if kind is int else "a number"
            raise ops.SpecDecArgumentError(f"{name}{_at(b, 2 if per_request else 1)} must be {what}, got {v!r}")
    return [kind(v) for v in values]


def _at(b: int, batch: int) -> str:
    return f"[{b}]" if batch > 1 else ""


def process_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """float32 probabilities ``[R, ..., V]`` of logits ``[R, ..., V]`` for request r = row r (DESIGN.md §5.7):
    ``specdec_ops.process_logits`` with the requests' parameters (greedy rows: one-hot at the argmax of the raw
    logits, first index on ties; a row with no finite logit has no mass). What a drafter samples from and
    hands to verification as ``draft_probs``; the target side never materializes it (the logits ops)."""
    return ops.process_logits(logits, **params.op_kwargs())


# ------------------------------------------------------------------------------------------------ random numbers

DRAFT_STREAM = 0x5DEECE66D  # the drafters' stream: stream_seeds(verifier seeds, DRAFT_STREAM)
DRAFT_POSITIONS = 256       # drafter offsets: verifier offset * 256 + draft position (tree depth or chain index)


def request_seeds(seed: int, batch: int, device) -> torch.Tensor:
    """int64 [B] on ``device``: request b's verifier seed, splitmix64 of (seed, b), kept below 2**63."""
    out = []
    for b in range(batch):
        z = (int(seed) * 0x9E3779B97F4A7C15 + (b + 1) * 0xBF58476D1CE4E5B9) & _U64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _U64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _U64
        out.append((z ^ (z >> 31)) >> 1)
    return torch.tensor(out, dtype=torch.int64, device=device)


def stream_seeds(seeds: torch.Tensor, stream: int) -> torch.Tensor:
    """int64 [B] on the seeds' device: an independent seed per request for another consumer of random numbers
    (a drafter), a splitmix64 finalizer of ``seeds ^ stream`` computed in 32-bit halves (no host copy)."""
    lo, hi = seeds & 0xFFFFFFFF, (seeds >> 32) & 0xFFFFFFFF
    lo, hi = lo ^ (stream & 0xFFFFFFFF), hi ^ ((stream >> 32) & 0xFFFFFFFF)
    for mul_lo, mul_hi, shift in ((0x1CE4E5B9, 0xBF58476D, 30), (0x133111EB, 0x94D049BB, 27)):
        lo, hi = _xorshift(lo, hi, shift)
        lo, hi = _mul64(lo, hi, mul_lo, mul_hi)
    lo, hi = _xorshift(lo, hi, 31)
    return ((hi & 0x7FFFFFFF) << 32) | lo


def _xorshift(lo, hi, shift):
    """(lo, hi) of z ^ (z >> shift) for 0 < shift < 32, halves in int64 tensors holding 32-bit values."""
    return lo ^ (((lo >> shift) | (hi << (32 - shift))) & 0xFFFFFFFF), hi ^ (hi >> shift)


def _mul64(lo, hi, c_lo: int, c_hi: int):
    """(lo, hi) of z * c mod 2**64 from 16-bit partial products (no int64 overflow)."""
    a0, a1 = lo & 0xFFFF, lo >> 16
    b0, b1 = c_lo & 0xFFFF, c_lo >> 16
    p00, p01, p10, p11 = a0 * b0, a0 * b1, a1 * b0, a1 * b1
    mid = (p00 >> 16) + (p01 & 0xFFFF) + (p10 & 0xFFFF)
    new_lo = (p00 & 0xFFFF) | ((mid & 0xFFFF) << 16)
    carry = p11 + (p01 >> 16) + (p10 >> 16) + (mid >> 16)            # the high 32 bits of lo * c_lo
    cross = ((lo & 0xFFFF) * c_hi + (((lo >> 16) * c_hi) & 0xFFFF) * 65536) & 0xFFFFFFFF
    cross = (cross + ((hi & 0xFFFF) * c_lo + (((hi >> 16) * c_lo) & 0xFFFF) * 65536)) & 0xFFFFFFFF
    return new_lo, (carry + cross) & 0xFFFFFFFF


def draft_offsets(offsets: torch.Tensor, position: int) -> torch.Tensor:
    """int64 [B]: the drafter's Philox offsets at draft ``position`` of the step whose verifier offsets are
    ``offsets``: every (step, position) pair gets its own numbers."""
    if not 0 <= position < DRAFT_POSITIONS:
        raise ValueError(f"draft position {position} outside [0, {DRAFT_POSITIONS})")
    return offsets * DRAFT_POSITIONS + position


def sample_tokens(probs: torch.Tensor, seeds: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """int64 [B]: one token per row of ``probs [B, V]`` with the package's sampler (the exponential race of
    ``rejection_sample`` with no drafts: its bonus draw), on the device, a function of (seeds[b], offsets[b])."""
    batch = probs.shape[0]
    none = torch.zeros(batch, 0, dtype=torch.int64, device=probs.device)
    counts = torch.zeros(batch, dtype=torch.int64, device=probs.device)
    return ops.rejection_sample(probs[:, None, :], none, counts, seeds=seeds, offsets=offsets).token_ids[:, 0]
