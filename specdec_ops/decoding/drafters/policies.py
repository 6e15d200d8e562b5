"""Draft-length policies: how many tokens of a match's continuation to draft.

One interface, called the same way every step for the whole batch::

    policy.lengths(stats, match_sizes, available, k) -> list[int]   # per request, 0 .. available[b]
    policy.observe(stats_b, match_size, drafted, accepted)           # after verification, per request

``stats`` are the requests' :class:`RequestStats` (acceptance observed so far), ``match_sizes`` the
n-gram size behind each request's best match (0: no match), ``available`` how many tokens each could
draft (continuation left, ``max_new_tokens`` and k). Policies:

- :class:`FixedLength`: k tokens (classic prompt lookup).
- :class:`ByMatchLength`: a table of lengths by match size, e.g. ``(0, 16, 32)``.
- :class:`CostModel`: the length that maximizes expected emitted tokens per unit of verify cost, from
  the acceptance observed so far and the measured cost of a forward over t tokens; in a batch every
  request pays for the widest draft, so one shared width is chosen.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import specdec_ops as ops

MAX_SIZE_BUCKET = 3   # match sizes 1, 2, 3+ keep separate statistics
NUM_BINS = 8          # draft positions j >= 1 grouped by floor(log2 j): 1, 2-3, 4-7, ..., 128+


def position_bin(j: int) -> int:
    """Statistics bin of draft position j >= 1."""
    return min(j.bit_length() - 1, NUM_BINS - 1)


@dataclass
class RequestStats:
    """Acceptance observed for one request: per match-size bucket and position bin, how many drafts reached
    that position (all earlier drafts accepted) and how many were rejected there."""

    reached: list[list[int]] = field(default_factory=lambda: [[0] * NUM_BINS for _ in range(MAX_SIZE_BUCKET + 1)])
    rejected: list[list[int]] = field(default_factory=lambda: [[0] * NUM_BINS for _ in range(MAX_SIZE_BUCKET + 1)])

    def record(self, match_size: int, drafted: int, accepted: int) -> None:
        bucket = min(match_size, MAX_SIZE_BUCKET)
        for j in range(1, min(accepted + 1, drafted) + 1):
            self.reached[bucket][position_bin(j)] += 1
        if accepted < drafted:
            self.rejected[bucket][position_bin(accepted + 1)] += 1


class DraftLengthPolicy(Protocol):
    def lengths(self, stats: Sequence[RequestStats], match_sizes: Sequence[int], available: Sequence[int],
                k: int) -> list[int]:
        """Draft length per request, each in 0 .. available[b]."""

    def observe(self, stats: RequestStats, match_size: int, drafted: int, accepted: int) -> None:
        """A draft of ``drafted`` tokens from a match of ``match_size`` had ``accepted`` tokens accepted."""


class FixedLength:
    """Draft every available token (up to k): classic prompt lookup."""

    def lengths(self, stats, match_sizes, available, k):
        return [min(a, k) for a in available]

    def observe(self, stats, match_size, drafted, accepted):
        stats.record(match_size, drafted, accepted)


def _cost_points(forward_cost) -> list[tuple[int, float]]:
    """Sorted (tokens, cost) points from a {tokens: cost} mapping or a (fixed, per_token) pair."""
    pair = (isinstance(forward_cost, (tuple, list)) and len(forward_cost) == 2
            and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in forward_cost))
    if pair and forward_cost[0] > 0 and forward_cost[1] >= 0:
        fixed, per_token = float(forward_cost[0]), float(forward_cost[1])
        return [(1, fixed + per_token), (2, fixed + 2 * per_token)]
    if isinstance(forward_cost, dict) and forward_cost and all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 1 and isinstance(c, (int, float))
            and not isinstance(c, bool) and c > 0 for t, c in forward_cost.items()):
        return sorted((t, float(c)) for t, c in forward_cost.items())
    raise ops.SpecDecArgumentError(f"forward_cost must be a {{tokens: cost > 0}} mapping of measured verify forwards "
                                   f"or (fixed > 0, per_token >= 0) for fixed + per_token * tokens, got "
                                   f"{forward_cost!r}")


class ByMatchLength:
    """A match of m tokens drafts ``table[m - 1]`` tokens (the last entry for longer matches), capped by k."""

    def __init__(self, table: Sequence[int]):
        table = tuple(table) if isinstance(table, (list, tuple)) else None
        if not table or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in table):
            raise ops.SpecDecArgumentError(f"ByMatchLength table must be a non-empty sequence of ints >= 0 (draft "
                                           f"length per matched n-gram size), got {table!r}")
        self.table = table

    def lengths(self, stats, match_sizes, available, k):
        return [0 if m == 0 else min(a, k, self.table[min(m, len(self.table)) - 1])
                for m, a in zip(match_sizes, available)]

    def observe(self, stats, match_size, drafted, accepted):
        stats.record(match_size, drafted, accepted)


class CostModel:
    """The draft length that maximizes expected emitted tokens per verify cost.

    ``forward_cost`` is what a verify forward over ``t`` tokens (all requests' windows together) costs:
    a mapping ``{tokens: cost}`` of measured points (:func:`~specdec_ops.decoding.measure_forward_cost`;
    linear between them, extended from the last two), or ``(fixed, per_token)`` for ``fixed + per_token
    * t``. On a CPU the measured cost is far from linear (matrix products over 2-3 rows cost much more
    per row than over 1 or 4), which is why a table. Request b emits ``E_b(n) = 1 + S_b(1) + ... +
    S_b(n)`` tokens in expectation when it drafts n tokens, where S_b(j), the chance that the first j
    drafts are accepted, is the product of the hazards (chance of a rejection at position i given all
    before accepted) observed for this request and this match size, per position bin. Each hazard is
    smoothed towards the request's hazard for that bin over all match sizes, and that towards
    ``prior_hazard``, each with ``prior_weight`` pseudo-observations. In a batch every request pays for
    the widest draft, so the policy picks the shared width c maximizing
    ``sum_b E_b(min(available_b, c)) / cost(B (c + 1))``; request b drafts min(available_b, c).
    """

    def __init__(self, forward_cost, prior_hazard: float = 0.5, prior_weight: float = 1.0):
        self.points = _cost_points(forward_cost)
        if not 0.0 < prior_hazard < 1.0:
            raise ops.SpecDecArgumentError(f"prior_hazard must be in (0, 1), got {prior_hazard!r}")
        if not prior_weight > 0.0:
            raise ops.SpecDecArgumentError(f"prior_weight must be > 0, got {prior_weight!r}")
        self.prior_hazard, self.prior_weight = prior_hazard, prior_weight

    def cost(self, tokens: int) -> float:
        """Cost of a verify forward over ``tokens`` tokens (piecewise linear through the measured points)."""
        pts = self.points
        if len(pts) == 1:
            return pts[0][1] * tokens / pts[0][0]
        for (t0, c0), (t1, c1) in zip(pts, pts[1:]):
            if tokens <= t1 or (t1, c1) == pts[-1]:
                return max(c0 + (c1 - c0) * (tokens - t0) / (t1 - t0), 1e-12)
        return pts[-1][1]

    def hazards(self, stats: RequestStats, match_size: int) -> list[float]:
        """Per position bin: the smoothed chance of a rejection there given every earlier draft accepted."""
        bucket = min(match_size, MAX_SIZE_BUCKET)
        w = self.prior_weight
        out = []
        for i in range(NUM_BINS):
            pooled = ((sum(r[i] for r in stats.rejected) + w * self.prior_hazard)
                      / (sum(r[i] for r in stats.reached) + w))
            out.append((stats.rejected[bucket][i] + w * pooled) / (stats.reached[bucket][i] + w))
        return out

    def expected_tokens(self, stats: RequestStats, match_size: int, longest: int) -> list[float]:
        """E(n) for n = 0 .. longest: expected tokens emitted by a draft of n tokens (the final token included)."""
        hazard = self.hazards(stats, match_size)
        out, survive = [1.0], 1.0
        for j in range(1, longest + 1):
            survive *= 1.0 - hazard[position_bin(j)]
            out.append(out[-1] + survive)
        return out

    def lengths(self, stats, match_sizes, available, k):
        available = [0 if m == 0 else min(a, k) for m, a in zip(match_sizes, available)]
        widest = max(available, default=0)
        if widest == 0:
            return available
        gains = [self.expected_tokens(s, m, a) for s, m, a in zip(stats, match_sizes, available)]
        batch = len(available)
        best, width = -1.0, 0
        for c in range(widest + 1):
            value = sum(g[min(len(g) - 1, c)] for g in gains) / self.cost(batch * (c + 1))
            if value > best:
                best, width = value, c
        return [min(a, width) for a in available]

    def observe(self, stats, match_size, drafted, accepted):
        stats.record(match_size, drafted, accepted)
