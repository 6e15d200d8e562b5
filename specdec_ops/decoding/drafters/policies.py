"""Draft-length policies: how many tokens of a match's continuation to draft.

One interface, called the same way every step for the whole batch::

    policy.lengths(stats, match_sizes, available, k) -> list[int]   # per request, 0 .. available[b]
    policy.observe(stats_b, match_size, drafted, accepted)           # after verification, per request
                                                                      # (every step; drafted may be 0)
    policy.observe_forward(tokens, seconds)                          # optional: a timed verify forward
    policy.padded_width(width, batch) -> int                         # optional: the window to verify in

``stats`` are the requests' :class:`RequestStats` (acceptance observed so far), ``match_sizes`` the
n-gram size behind each request's best match (0: no match), ``available`` how many tokens each could
draft (continuation left, ``max_new_tokens`` and k). Statistics are kept per match-size bucket
(:func:`size_bucket`: sizes 1, 2-3, 4-7, 8-15, 16-31, 32+) and draft-position bin. Policies:

- :class:`FixedLength`: k tokens (classic prompt lookup).
- :class:`ByMatchLength`: a table of lengths by match size, e.g. ``(0, 16, 32)``.
- :class:`CostModel`: the length that maximizes expected emitted tokens per unit of verify cost, from
  the acceptance observed so far (optimistic where evidence is thin, fading where it is old) and the
  cost of a forward over t tokens (:class:`ForwardCost`: measured at start-up, then kept current from
  the loop's own timed forwards); in a batch every request pays for the widest draft, so one shared
  width is chosen. Its prior is one hazard everywhere or a :class:`MatchLengthPrior` (a longer match
  diverges less: what ``default_setup`` uses).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import specdec_ops as ops

MAX_SIZE_BUCKET = 6   # match sizes grouped by floor(log2 size) + 1: 1, 2-3, 4-7, 8-15, 16-31, 32+
NUM_BINS = 8          # draft positions j >= 1 grouped by floor(log2 j): 1, 2-3, 4-7, ..., 128+


def position_bin(j: int) -> int:
    """Statistics bin of draft position j >= 1."""
    return min(j.bit_length() - 1, NUM_BINS - 1)


def size_bucket(match_size: int) -> int:
    """Statistics bucket of a match of ``match_size`` tokens: 0 (no match), then 1 + floor(log2 size), at
    most MAX_SIZE_BUCKET (sizes 1 | 2-3 | 4-7 | 8-15 | 16-31 | 32+)."""
    return min(match_size.bit_length(), MAX_SIZE_BUCKET) if match_size > 0 else 0


def _zeros() -> list[list[float]]:
    return [[0.0] * NUM_BINS for _ in range(MAX_SIZE_BUCKET + 1)]


@dataclass
class RequestStats:
    """Acceptance observed for one request: per match-size bucket and position bin, how many drafts reached
    that position (all earlier drafts accepted) and how many were rejected there (weights: :meth:`decay`
    scales old evidence down)."""

    reached: list[list[float]] = field(default_factory=lambda: _zeros())
    rejected: list[list[float]] = field(default_factory=lambda: _zeros())

    def record(self, match_size: int, drafted: int, accepted: int) -> None:
        bucket = size_bucket(match_size)
        for j in range(1, min(accepted + 1, drafted) + 1):
            self.reached[bucket][position_bin(j)] += 1
        if accepted < drafted:
            self.rejected[bucket][position_bin(accepted + 1)] += 1

    def decay(self, factor: float) -> None:
        """Scale every count by ``factor`` (older evidence weighs less)."""
        if factor != 1.0:
            for table in (self.reached, self.rejected):
                for row in table:
                    for i, x in enumerate(row):
                        row[i] = x * factor


class DraftLengthPolicy(Protocol):
    def lengths(self, stats: Sequence[RequestStats], match_sizes: Sequence[int], available: Sequence[int],
                k: int) -> list[int]:
        """Draft length per request, each in 0 .. available[b]."""

    def observe(self, stats: RequestStats, match_size: int, drafted: int, accepted: int) -> None:
        """After every step: a draft of ``drafted`` tokens (0: none) from a match of ``match_size`` had
        ``accepted`` tokens accepted."""


class FixedLength:
    """Draft every available token (up to k): classic prompt lookup."""

    def lengths(self, stats, match_sizes, available, k):
        return [min(a, k) for a in available]

    def observe(self, stats, match_size, drafted, accepted):
        if drafted:
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
        if drafted:
            stats.record(match_size, drafted, accepted)


class ForwardCost:
    """What a verify forward over ``t`` tokens costs, kept current from the loop's own timed forwards.

    It starts from a measured table ``{tokens: seconds}`` (:func:`~specdec_ops.decoding.measure_forward_cost`)
    or ``(fixed, per_token)`` for ``fixed + per_token * t``, and from there on each timed verify forward
    (:meth:`observe`) counts: a width forwarded at least ``min_samples`` times costs the median of its last
    ``window`` timings, every other table point its start-up value times the median ratio of the recent
    timings to the start-up table (the load now against the load at start-up). So one noisy start-up
    measurement is outvoted within a few steps, and a change of load moves every width alike.

    Costs are piecewise linear between points (extended past the last one with the start-up table's last
    slope), an untimed width never more than ``t`` one-token forwards, and :meth:`cheapest` pads a forward to the cheapest
    width at least as wide: on a CPU a forward over 2-3 tokens costs more than one over 4 (the matrix
    products switch kernels), so a short draft is verified in a wider, cheaper window.
    """

    def __init__(self, measured, window: int = 16, min_samples: int = 3):
        self.start_up = _cost_points(measured)
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ops.SpecDecArgumentError(f"window must be an int >= 1, got {window!r}")
        if isinstance(min_samples, bool) or not isinstance(min_samples, int) or not 1 <= min_samples <= window:
            raise ops.SpecDecArgumentError(f"min_samples must be an int in [1, window = {window}], got "
                                           f"{min_samples!r}")
        self.window, self.min_samples = window, min_samples
        self.samples: dict[int, deque] = {}              # tokens -> the last `window` timings
        self.ratios: deque = deque(maxlen=2 * window)    # timing / start-up cost, latest forwards
        self._points: list[tuple[int, float]] | None = None
        self._observed: dict[int, float] = {}
        self._cheapest: dict[tuple[int, int], list[tuple[int, float]]] = {}

    def observe(self, tokens: int, seconds: float) -> None:
        """A verify forward over ``tokens`` tokens (all requests' windows) took ``seconds``."""
        if tokens < 1 or not seconds > 0.0:
            return
        self.samples.setdefault(tokens, deque(maxlen=self.window)).append(seconds)
        self.ratios.append(seconds / _interpolate(self.start_up, tokens))
        self._points, self._cheapest = None, {}

    def points(self) -> list[tuple[int, float]]:
        """The current (tokens, cost) points, sorted by tokens."""
        if self._points is None:
            self._points = sorted(self._merged().items())
        return self._points

    def _merged(self) -> dict[int, float]:
        scale = statistics.median(self.ratios) if self.ratios else 1.0
        observed = {t: statistics.median(timings) for t, timings in self.samples.items()
                    if len(timings) >= self.min_samples}
        points = {t: c * scale for t, c in self.start_up}
        points.update(observed)
        one = _interpolate(sorted(points.items()), 1)
        for t in points:                   # an untimed point: never more than t one-token forwards
            if t not in observed:
                points[t] = min(points[t], t * one)
        self._observed = observed
        return points

    def __call__(self, tokens: int) -> float:
        """Cost of a forward over ``tokens`` tokens (not padded)."""
        points = self.points()
        if tokens in self._observed:
            return self._observed[tokens]
        last, one = points[-1], _interpolate(points, 1)
        if tokens > last[0] and len(self.start_up) > 1:      # past the table: the start-up slope
            (t0, c0), (t1, c1) = self.start_up[-2:]
            scale = statistics.median(self.ratios) if self.ratios else 1.0
            cost = last[1] + (tokens - last[0]) * max(c1 - c0, 0.0) / (t1 - t0) * scale
        else:
            cost = _interpolate(points, tokens)
        return max(min(cost, tokens * one), 1e-12)

    def cheapest(self, batch: int, width: int, limit: int | None = None) -> tuple[int, float]:
        """(padded width >= ``width``, its cost): the cheapest forward of ``batch`` windows of one width; with
        ``limit``, of the widths up to ``limit`` only (the window the decode loop sized its cache for: a
        draft is never padded past it). Ties go to the narrower width."""
        widest = max(width, -(-self.points()[-1][0] // batch))
        table = self._cheapest.get((batch, widest))
        if table is None:           # suffix minimum over widths 1 .. widest
            table = [(0, 0.0)] * (widest + 2)
            table[widest + 1] = (widest + 1, float("inf"))
            for w in range(widest, 0, -1):
                cost = self(batch * w)
                table[w] = (w, cost) if cost <= table[w + 1][1] else table[w + 1]
            self._cheapest[(batch, widest)] = table
        if limit is None or table[width][0] <= limit:
            return table[width]
        return min(((w, self(batch * w)) for w in range(width, max(width, limit) + 1)), key=lambda wc: (wc[1], wc[0]))


def _interpolate(points: list[tuple[int, float]], tokens: int) -> float:
    """Piecewise linear through sorted (tokens, cost) points; one point scales linearly; past the ends the
    nearest segment is extended."""
    if len(points) == 1:
        return points[0][1] * tokens / points[0][0]
    for (t0, c0), (t1, c1) in zip(points, points[1:]):
        if tokens <= t1 or (t1, c1) == points[-1]:
            return max(c0 + (c1 - c0) * (tokens - t0) / (t1 - t0), 1e-12)
    return points[-1][1]


class MatchLengthPrior:
    """Prior hazard of a draft by the size of the match it copies: a match twice as long diverges less.

    ``prior(bucket, position_bin)`` -> the chance that a draft from a match in size ``bucket``
    (:func:`size_bucket`) is rejected at a position of ``position_bin`` given every earlier position was
    accepted: ``first * first_ratio ** (bucket - 1)`` at the first draft position, ``later * later_ratio **
    (bucket - 1)`` past it. The defaults are the rates plain greedy decoding of SmolLM2-135M-Instruct
    shows on the tuning prompts (``python bench/replay_drafters.py --hazards``: the longest match's
    continuation against the tokens the target produced, every position of every tuning prompt):
    a one-token match is wrong at its first token 4 times in 5, each doubling of the match halves that,
    and past the first token the hazard starts near 0.3 and falls by a third per doubling.
    """

    def __init__(self, first: float = 0.8, first_ratio: float = 0.5, later: float = 0.3, later_ratio: float = 0.65):
        for name, value in (("first", first), ("later", later)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value < 1.0:
                raise ops.SpecDecArgumentError(f"MatchLengthPrior {name} must be in (0, 1), got {value!r}")
        for name, value in (("first_ratio", first_ratio), ("later_ratio", later_ratio)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value <= 1.0:
                raise ops.SpecDecArgumentError(f"MatchLengthPrior {name} must be in (0, 1], got {value!r}")
        self.first, self.first_ratio, self.later, self.later_ratio = first, first_ratio, later, later_ratio

    def __call__(self, bucket: int, position: int) -> float:
        steps = max(bucket, 1) - 1
        return self.first * self.first_ratio ** steps if position == 0 else self.later * self.later_ratio ** steps

    def __repr__(self) -> str:
        return (f"MatchLengthPrior(first={self.first}, first_ratio={self.first_ratio}, later={self.later}, "
                f"later_ratio={self.later_ratio})")


class CostModel:
    """The draft length that maximizes expected emitted tokens per verify cost.

    ``forward_cost`` is what a verify forward over ``t`` tokens (all requests' windows together) costs: a
    :class:`ForwardCost`, or what builds one (a measured ``{tokens: seconds}`` table from
    :func:`~specdec_ops.decoding.measure_forward_cost`, or ``(fixed, per_token)``); the drafter feeds it
    its timed verify forwards, so it follows the machine's load. A draft of n tokens is verified in a
    window of ``ForwardCost.cheapest(B, n + 1, 1 + k)`` (padded where a wider forward is cheaper, never past
    the loop's window of 1 + k nodes, which its KV cache is sized for).

    Request b emits ``E_b(n) = 1 + S_b(1) + ... + S_b(n)`` tokens in expectation when it drafts n tokens,
    where S_b(j), the chance that the first j drafts are accepted, is the product of the hazards (chance
    of a rejection at position i given all before accepted) per position bin. A hazard is estimated from
    this request's drafts from matches of this size, smoothed towards the request's hazard over all match
    sizes, that towards the hazard of this match size over every request the policy has seen (``shared``)
    and that towards the prior, each with ``prior_weight`` pseudo-observations (``pool_sizes=False`` skips
    the request's hazard over all match sizes: with a prior that tells match sizes apart, a request's
    evidence from one size says little about another). The prior is
    ``prior_hazard``: one hazard for every match size and position, or a callable ``(size bucket,
    position bin) -> hazard`` such as :class:`MatchLengthPrior`. Optimism under
    uncertainty: past the first position the policy uses ``h - optimism * sqrt(h (1 - h) / (n +
    prior_weight))`` (n: drafts of this request that reached the position), so a draft that is accepted
    grows until the evidence says where it breaks; at the first position, which decides whether a draft
    pays at all, the estimate itself, and where that finds no draft worth its cost, a short draft (what
    the cheapest window for one draft token holds, 3 tokens on a CPU) is tried if the optimistic first
    hazard finds it worth its cost, so exploring costs little. Evidence decays every step, a request's by ``decay`` and
    the shared one by ``shared_decay``: where drafting was rejected the evidence fades while nothing is
    drafted, so the policy tries again instead of locking drafting off for good, and a request that keeps
    drafting follows its latest acceptance.

    In a batch every request pays for the widest draft, so the policy picks the shared width c maximizing
    ``sum_b E_b(min(available_b, c)) / cost(B (c + 1))``; request b drafts min(available_b, c).
    """

    def __init__(self, forward_cost, prior_hazard: float = 0.6, prior_weight: float = 2.0, optimism: float = 0.5,
                 decay: float = 0.97, shared_decay: float = 0.99, pool_sizes: bool = True):
        self.forward = forward_cost if isinstance(forward_cost, ForwardCost) else ForwardCost(forward_cost)
        if callable(prior_hazard):
            table = [[prior_hazard(b, i) for i in range(NUM_BINS)] for b in range(MAX_SIZE_BUCKET + 1)]
            if not all(isinstance(h, (int, float)) and 0.0 < h < 1.0 for row in table for h in row):
                raise ops.SpecDecArgumentError(f"prior_hazard {prior_hazard!r} must give a hazard in (0, 1) for every "
                                               f"(size bucket, position bin)")
        elif isinstance(prior_hazard, bool) or not isinstance(prior_hazard, (int, float)) \
                or not 0.0 < prior_hazard < 1.0:
            raise ops.SpecDecArgumentError(f"prior_hazard must be in (0, 1) or a callable (size bucket, position bin) "
                                           f"-> hazard, got {prior_hazard!r}")
        else:
            table = [[float(prior_hazard)] * NUM_BINS for _ in range(MAX_SIZE_BUCKET + 1)]
        if not prior_weight > 0.0:
            raise ops.SpecDecArgumentError(f"prior_weight must be > 0, got {prior_weight!r}")
        if not 0.0 <= optimism:
            raise ops.SpecDecArgumentError(f"optimism must be >= 0, got {optimism!r}")
        for name, value in (("decay", decay), ("shared_decay", shared_decay)):
            if not 0.0 < value <= 1.0:
                raise ops.SpecDecArgumentError(f"{name} must be in (0, 1], got {value!r}")
        self.prior_hazard, self.prior_weight, self.optimism, self.decay = prior_hazard, prior_weight, optimism, decay
        self._prior = table                # [size bucket][position bin]
        self.pool_sizes = bool(pool_sizes)
        self.shared_decay = shared_decay
        self.shared = RequestStats()       # every request's drafts: the prior of a request's own estimates

    @property
    def points(self) -> list[tuple[int, float]]:
        """The forward cost's current (tokens, cost) points."""
        return self.forward.points()

    def cost(self, tokens: int) -> float:
        """Cost of a verify forward over ``tokens`` tokens (not padded)."""
        return self.forward(tokens)

    def hazards(self, stats: RequestStats, match_size: int, optimistic: bool = False) -> list[float]:
        """Per position bin: the chance of a rejection there given every earlier draft accepted: the smoothed
        estimate less the uncertainty bonus, at the first position only when ``optimistic``."""
        bucket = size_bucket(match_size)
        w = self.prior_weight
        out = []
        shared = self.shared
        prior = self._prior[bucket]
        for i in range(NUM_BINS):
            across = (shared.rejected[bucket][i] + w * prior[i]) / (shared.reached[bucket][i] + w)
            pooled = ((sum(r[i] for r in stats.rejected) + w * across) / (sum(r[i] for r in stats.reached) + w)
                      if self.pool_sizes else across)
            reached = stats.reached[bucket][i]
            h = (stats.rejected[bucket][i] + w * pooled) / (reached + w)
            if optimistic or i > 0:
                h = max(h - self.optimism * math.sqrt(h * (1.0 - h) / (reached + w)), 0.0)
            out.append(h)
        return out

    def expected_tokens(self, stats: RequestStats, match_size: int, longest: int,
                        optimistic: bool = False) -> list[float]:
        """E(n) for n = 0 .. longest: expected tokens emitted by a draft of n tokens (the final token included)."""
        hazard = self.hazards(stats, match_size, optimistic)
        out, survive = [1.0], 1.0
        for j in range(1, longest + 1):
            survive *= 1.0 - hazard[position_bin(j)]
            out.append(out[-1] + survive)
        return out

    def lengths(self, stats, match_sizes, available, k):
        """The width worth most on the estimates; where that is no draft, a short exploratory draft (as many
        tokens as the cheapest window for one draft token holds) when the optimistic estimates find it
        worth its cost."""
        available = [0 if m == 0 else min(a, k) for m, a in zip(match_sizes, available)]
        widest = max(available, default=0)
        if widest == 0:
            return available
        batch = len(available)
        width = self._best_width([self.expected_tokens(s, m, a) for s, m, a in zip(stats, match_sizes, available)],
                                 batch, widest, k)
        if width == 0 and self.optimism > 0:
            short = min(widest, self.forward.cheapest(batch, 2, 1 + k)[0] - 1)
            width = self._best_width([self.expected_tokens(s, m, min(a, short), optimistic=True)
                                      for s, m, a in zip(stats, match_sizes, available)], batch, short, k)
        return [min(a, width) for a in available]

    def _best_width(self, gains: list[list[float]], batch: int, widest: int, k: int) -> int:
        best, width = -1.0, 0
        for c in range(widest + 1):
            value = sum(g[min(len(g) - 1, c)] for g in gains) / self.forward.cheapest(batch, c + 1, 1 + k)[1]
            if value > best:
                best, width = value, c
        return width

    def padded_width(self, width: int, batch: int, limit: int | None = None) -> int:
        """The window to verify ``batch`` drafts of ``width`` nodes (root included) in: the cheapest one at
        least as wide and at most ``limit`` (1 + the longest draft the loop allows: its cache holds no more)."""
        return self.forward.cheapest(batch, width, limit)[0]

    def observe(self, stats, match_size, drafted, accepted):
        stats.decay(self.decay)
        self.shared.decay(self.shared_decay)
        if drafted:
            stats.record(match_size, drafted, accepted)
            self.shared.record(match_size, drafted, accepted)

    def observe_forward(self, tokens: int, seconds: float) -> None:
        self.forward.observe(tokens, seconds)
