"""Verification from logits in Triton (DESIGN.md §5.7): the arithmetic of
csrc/logits/logits_math.h and the random numbers of csrc/common/philox.h.

A row's processed distribution is never written: `row_stats` reads the logits and
returns (max, first argmax, kept-key threshold tau, kept mass S); an entry's
probability is then e / S with e = exp((x - max) / T) on the kept set {key >= tau}.
Thresholds come from a radix select over the order-preserving keys of the raw logits
(radix_key), 4 bits per pass (a 16-bin count or mass histogram per tile as a one-hot
reduction), never a sort: as many passes as the logits' type has bits that vary (bfloat16 4,
float16 5, float32 8: radix_passes), each pick then turned into the threshold on z's keys
(threshold_key). Rows without filters take two passes (max, then the sum of
e). process_logits runs one program per row, tree verification one per request (its walk
enters a node's row when it reaches it). Chain verification splits each row over fixed
vocabulary chunks: without filters, logprobs or synthetic rates in one launch
(chain_fused_kernel: the chunks' statistics with the bonus race in the same pass, then the
walk and any other race); else chain_row_partials_kernel, with filters one
chain_radix_pass_kernel launch per radix pass and chain_kept_mass_kernel, then
chain_walk_race_kernel (see the sections at the end of this file).
"""

import triton
import triton.language as tl

from .philox import (PURPOSE_ACCEPT, PURPOSE_BONUS, PURPOSE_RESIDUAL, bits_to_uniform, philox_bits, philox_groups,
                     philox_tile,
                     uniform_mantissa)
from .rejection import (first_of_quads, prob_mass, race_cut, race_quads_update, race_skips_probs, race_tile_fold,
                        race_tile_update)

F32_MAX = tl.constexpr(3.4028234663852886e38)
LOG2E = tl.constexpr(1.4426950408889634)
RADIX_BITS = tl.constexpr(4)
RADIX_BINS = tl.constexpr(16)
TOP_P_SLACK = tl.constexpr(9.5367431640625e-07)  # 2^-20: csrc/logits/logits_math.h kTopPSlack


@triton.jit
def logit_value(l):
    """NaN -> -inf, +inf -> the largest float32."""
    l = tl.where(l != l, float("-inf"), l)
    return tl.where(l > F32_MAX, F32_MAX, l)


@triton.jit
def order_key(z):
    """Order-preserving keys (int64 holding the uint32 values of logits_math.h order_key) of float32 z.

    In int32: negative floats flip their 31 low bits (then signed order is float order), -0.0 is +0.0;
    adding 2^31 gives the unsigned key."""
    bits = tl.where(z == 0.0, 0, z.to(tl.int32, bitcast=True))
    signed = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    return signed.to(tl.int64) + 2147483647 + 1


@triton.jit
def radix_bits(raw):
    """The radix select's key of raw logits without NaN (float32) in 32-bit arithmetic: an int32 holding the
    uint32 key (radix_key). Two instructions: the bits xor (their sign spread, top bit set), so a negative
    value's bits are all flipped and a non-negative one's top bit."""
    bits = raw.to(tl.int32, bitcast=True)
    return bits ^ ((bits >> 31) | -2147483648)


@triton.jit
def radix_key(raw):
    """The radix select's key of a raw logit (float32 as loaded), as int64 holding a uint32: order_key's
    order with NaN as -inf and +inf kept (above every finite value, also the largest float32 that
    logit_value makes of it); -0.0 sits just below +0.0 (both have the same z: a tie threshold_key keeps).

    The selects run on these keys, not on z's: z = (logit_value(x) - m) / T is a non-decreasing function of
    x, and two entries with the same key have the same x, hence the same z. So the goal-th largest x (by
    count) has the goal-th largest z, and the largest x whose candidates from the top reach a mass is where
    z's select stops too (its candidates from the top are the same entries plus any whose z ties with its z,
    which the threshold on z keeps); threshold_key turns the pick into z's key. Half-precision values widened
    to float32 leave the low bits of their keys constant (bfloat16: 16 bits, float16: 13; a negative value's
    are ones after the flip), so a select over the upper bits alone is exact: radix_passes."""
    return radix_bits(tl.where(raw != raw, float("-inf"), raw)).to(tl.int64) & 0xFFFFFFFF


@triton.jit
def signed_key(z):
    """order_key(z) - 2^31 as int32 (the signed order of the keys: comparisons in 32-bit arithmetic)."""
    bits = tl.where(z == 0.0, 0, z.to(tl.int32, bitcast=True))
    return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


@triton.jit
def threshold_key(prefix, m, temperature, PASSES: tl.constexpr):
    """z's key of the entry a radix select picked (prefix: its radix_key, the bits below the last pass
    still zero): the constant low bits restored (ones below a negative value's upper bits), the value
    sanitized as the entries are, then scaled as they are."""
    low = (tl.full([], 1, tl.int64) << (32 - RADIX_BITS * PASSES)) - 1
    key = tl.where(prefix < 2147483648, prefix | low, prefix)
    signed = (key - 2147483648).to(tl.int32)
    bits = tl.where(signed < 0, signed ^ 0x7FFFFFFF, signed)
    return order_key(scaled_tile(logit_value(bits.to(tl.float32, bitcast=True)), m, temperature))


@triton.jit
def load_row(row_ptr, idx, inside):
    return logit_value(tl.load(row_ptr + idx, mask=inside, other=float("-inf")).to(tl.float32))


@triton.jit
def scaled(x, m, temperature):
    return tl.math.div_rn(x - m, temperature)


@triton.jit
def scaled_tile(x, m, temperature):
    """scaled() of a tile: without the division at temperature 1 (a branch on the row's scalar temperature,
    no select: div_rn(d, 1) is d exactly, so the keys and masses are the same)."""
    if temperature == 1.0:
        z = x - m
    else:
        z = tl.math.div_rn(x - m, temperature)
    return z


@triton.jit
def row_max(row_ptr, vocab, BLOCK: tl.constexpr):
    """(max x, first index of the max) of a row of sanitized logits (index 0 without a finite logit)."""
    best = tl.full([], float("-inf"), tl.float32)
    best_index = tl.full([], 0, tl.int64)
    for start in range(0, vocab, BLOCK):
        idx = start + tl.arange(0, BLOCK).to(tl.int64)
        inside = idx < vocab
        x = load_row(row_ptr, idx, inside)
        tile_best = tl.max(x, 0)
        tile_index = tl.min(tl.where(inside & (x == tile_best), idx, 0x7FFFFFFFFFFFFFFF), 0)
        better = tile_best > best
        best_index = tl.where(better, tile_index, best_index)
        best = tl.where(better, tile_best, best)
    return best, best_index


@triton.jit
def radix_histogram(row_ptr, lo, vocab, m, temperature, floor_key, prefix, shift, BY_MASS: tl.constexpr,
                    LENGTH: tl.constexpr, TILE: tl.constexpr):
    """The histogram [RADIX_BINS] of entries [lo, lo + LENGTH) of a row: per digit (radix_key >> shift) & 15
    the number (BY_MASS: the sum of e = exp(z)) of the candidates, the entries whose radix_key digits above
    `shift` equal prefix's (all entries when shift = 28) and, BY_MASS, whose z has a key >= floor_key (top-p
    after top-k: top-k's threshold; a select by count has no floor: top-k runs first, and it reads neither z
    nor the temperature). Tiles of TILE entries add their one-hot [TILE, 16] into per-thread accumulators
    (one reduction per tile: the skip test; the bins are reduced once at the end: compiled, TILE = 512 over 4
    warps is 4 x 16 accumulators a thread); a tile without a candidate skips the one-hot (after a
    select's first passes few tiles hold one).

    BY_MASS: no counts; the masses stand in for them (a bin is taken as non-empty when it holds mass). The
    pick cannot tell: the highest bin reaching the target holds mass (a bin without mass has the sum from
    the top of the non-empty bin above it, which then reaches too and is higher; with none above, the mass
    above the prefix alone would reach the target, which the previous pick rules out, and with top_p = 0
    the highest bin is the one of the row's maximum, of mass 1); only the fallback to the lowest non-empty
    bin (no bin reaches: rounding) can pass over bins whose entries all have e = 0, and those entries have
    probability 0 kept or not."""
    bins = tl.arange(0, RADIX_BINS)[None, :]
    acc = tl.zeros([TILE, RADIX_BINS], tl.float32)
    # 32-bit keys in the loop: the prefix's bits as int32, the bits above the digit as a mask (0 at shift 28:
    # the int64 shift leaves no low bits), the floor in the keys' signed order
    prefix32 = prefix.to(tl.int32)
    above = (tl.full([], -1, tl.int64) << (shift + RADIX_BITS)).to(tl.int32)
    floor32 = (floor_key - 2147483648).to(tl.int32)
    for start in range(0, LENGTH, TILE):
        # [TILE, 1] columns: the entries are in the accumulators' layout from the load on (no conversion)
        idx = lo + start + tl.arange(0, TILE).to(tl.int64)[:, None]
        inside = idx < vocab
        raw = tl.load(row_ptr + idx, mask=inside, other=float("-inf")).to(tl.float32)
        raw = tl.where(raw != raw, float("-inf"), raw)  # radix_key's and logit_value's NaN, once
        key = radix_bits(raw)
        match = inside & (((key ^ prefix32) & above) == 0)
        if BY_MASS:
            z = scaled_tile(tl.minimum(raw, F32_MAX), m, temperature)
            if floor_key > 0:  # top-k's threshold (a branch on the row's scalar)
                match = match & (signed_key(z) >= floor32)
        if tl.max(tl.max(match.to(tl.int32), 1), 0) > 0:
            digit = (key >> shift) & (RADIX_BINS - 1)  # arithmetic shift: the digit's 4 bits are below bit 32
            if BY_MASS:
                weight = tl.where(match, tl.exp(z), 0.0)
            else:
                weight = match.to(tl.float32)
            acc += tl.where(digit == bins, weight, 0.0)  # the match folded into the column: one select a bin
    return tl.sum(acc, 0)


@triton.jit
def radix_pick(weight, prefix, remaining, above, shift, BY_MASS: tl.constexpr):
    """One pass of the radix select (logits_math.h radix_pick_count / radix_pick_mass) from its histogram
    `weight` (radix_histogram's: counts, or masses BY_MASS): the digit d of the threshold at `shift`, chosen
    from the top (the highest bin whose candidates with the bins above reach the goal; else the lowest
    non-empty bin; empty bins never win). By count `remaining` is the rank left inside the prefix, by mass
    `above` the mass of the candidates above the prefix and `remaining` the target. Returns
    (prefix | d << shift, remaining, above)."""
    bins = tl.arange(0, RADIX_BINS).to(tl.int64)
    # inclusive sums from the top: weight of the candidates in bins >= d
    from_top = tl.sum(weight) - tl.cumsum(weight, 0) + weight
    nonempty = weight > 0
    reach = nonempty & ((above + from_top) >= remaining)
    d = tl.max(tl.where(reach, bins, -1), 0)
    lowest = tl.min(tl.where(nonempty, bins, RADIX_BINS), 0)
    d = tl.where(d >= 0, d, tl.where(lowest < RADIX_BINS, lowest, 0))
    skipped = tl.sum(tl.where(bins > d, weight, 0.0))
    if BY_MASS:
        above = above + skipped
    else:
        remaining = tl.maximum(remaining - skipped, 1.0)
    return prefix | (d << shift), remaining, above


@triton.jit
def radix_select(row_ptr, vocab: tl.constexpr, m, temperature, floor_key, goal, BY_MASS: tl.constexpr,
                 PASSES: tl.constexpr, TILE: tl.constexpr):
    """Threshold (z's key) over the candidates (BY_MASS: the entries whose z has a key >= floor_key): by
    count, the key of the goal-th largest; by mass, the largest key v with sum_{key >= v} e >= goal
    (logits_math.h radix_pick_count / radix_pick_mass, here over radix_key, 4 bits per pass, PASSES passes)."""
    prefix = tl.full([], 0, tl.int64)
    remaining = goal  # by count: rank inside the current prefix; by mass: the target mass
    above = tl.full([], 0.0, tl.float32)
    for p in tl.static_range(PASSES):
        shift = 32 - RADIX_BITS * (p + 1)
        hist = radix_histogram(row_ptr, 0, vocab, m, temperature, floor_key, prefix, shift, BY_MASS, vocab, TILE)
        prefix, remaining, above = radix_pick(hist, prefix, remaining, above, shift, BY_MASS)
    return threshold_key(prefix, m, temperature, PASSES)


@triton.jit
def row_stats(row_ptr, vocab, temperature, top_k, top_p, min_p, PASSES: tl.constexpr, BLOCK: tl.constexpr,
              RADIX_BLOCK: tl.constexpr):
    """(m, argmax, tau, total) of a row (logits_math.h). Greedy (temperature 0) and rows without a
    finite logit stop after the max; total is then 0."""
    m, argmax = row_max(row_ptr, vocab, BLOCK)
    tau = tl.full([], 0, tl.int64)
    total = tl.full([], 0.0, tl.float32)
    has_mass = m > float("-inf")
    if temperature > 0 and has_mass:
        if top_k > 0:
            tau = radix_select(row_ptr, vocab, m, temperature, tau, top_k.to(tl.float32), False, PASSES,
                               RADIX_BLOCK)
        if top_p < 1.0:
            kept_mass = tl.full([], 0.0, tl.float32)
            for start in range(0, vocab, BLOCK):
                idx = start + tl.arange(0, BLOCK).to(tl.int64)
                inside = idx < vocab
                z = scaled(load_row(row_ptr, idx, inside), m, temperature)
                kept_mass += tl.sum(tl.where(inside & (order_key(z) >= tau), tl.exp(z), 0.0))
            tau = tl.maximum(tau, radix_select(row_ptr, vocab, m, temperature, tau,
                                                top_p * kept_mass * (1.0 - TOP_P_SLACK), True, PASSES,
                                                RADIX_BLOCK))
        if min_p > 0.0:
            tau = tl.maximum(tau, order_key(tl.log(min_p)))
        for start in range(0, vocab, BLOCK):
            idx = start + tl.arange(0, BLOCK).to(tl.int64)
            inside = idx < vocab
            z = scaled(load_row(row_ptr, idx, inside), m, temperature)
            total += tl.sum(tl.where(inside & (order_key(z) >= tau), tl.exp(z), 0.0))
    return m, argmax, tau, total


@triton.jit
def sanitize_params(temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, r, vocab, HAS_T: tl.constexpr,
                    HAS_K: tl.constexpr, HAS_P: tl.constexpr, HAS_MIN_P: tl.constexpr):
    """row_sampling of logits_math.h: the documented clamps of bad values."""
    t = tl.full([], 1.0, tl.float32)
    k = tl.full([], 0, tl.int64)
    p = tl.full([], 1.0, tl.float32)
    mp = tl.full([], 0.0, tl.float32)
    if HAS_T:
        t = tl.load(temperature_ptr + r)
    if HAS_K:
        k = tl.load(top_k_ptr + r)
    if HAS_P:
        p = tl.load(top_p_ptr + r)
    if HAS_MIN_P:
        mp = tl.load(min_p_ptr + r)
    t = tl.where(t > 0, tl.minimum(t, F32_MAX), 0.0)
    k = tl.where((k > 0) & (k < vocab), k, 0)
    p = tl.where(p < 1.0, tl.maximum(p, 0.0), 1.0)
    mp = tl.where(mp > 0.0, tl.minimum(mp, 1.0), 0.0)
    return t, k, p, mp


@triton.jit
def entry_prob(x, m, temperature, tau, total):
    """p of entries with sanitized logits x (0 off the kept set or without mass)."""
    z = scaled(x, m, temperature)
    kept = order_key(z) >= tau
    prob = tl.where(kept, tl.math.div_rn(tl.exp(z), tl.maximum(total, 1e-30)), 0.0)
    return tl.where(total > 0, prob, 0.0)


@triton.jit
def race_masses(mass, inside):
    """A tile's entries for race_tile_update: no mass (0, NaN, negative) is 0 (scores 0), entries past the
    row are out of the race (-1)."""
    return tl.where(inside, prob_mass(mass), -1.0)


@triton.jit(do_not_specialize=["rows", "inner"])
def process_logits_kernel(logits_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, probs_ptr, rows, inner,
                          vocab: tl.constexpr, HAS_T: tl.constexpr, HAS_K: tl.constexpr, HAS_P: tl.constexpr,
                          HAS_MIN_P: tl.constexpr, PASSES: tl.constexpr, BLOCK: tl.constexpr,
                          RADIX_BLOCK: tl.constexpr):
    j = tl.program_id(0).to(tl.int64)
    t, k, p, mp = sanitize_params(temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, j // inner, vocab, HAS_T, HAS_K,
                                  HAS_P, HAS_MIN_P)
    row_ptr = logits_ptr + j * vocab
    m, argmax, tau, total = row_stats(row_ptr, vocab, t, k, p, mp, PASSES, BLOCK, RADIX_BLOCK)
    for start in range(0, vocab, BLOCK):
        idx = start + tl.arange(0, BLOCK).to(tl.int64)
        inside = idx < vocab
        if t > 0:
            prob = entry_prob(load_row(row_ptr, idx, inside), m, t, tau, total)
        else:
            prob = tl.where(idx == argmax, 1.0, 0.0) * (m > float("-inf")).to(tl.float32)
        tl.store(probs_ptr + j * vocab + idx, prob, mask=inside)


@triton.jit
def write_chain_outputs(token_ids_ptr, num_accepted_ptr, logprobs_ptr, bonus_ptr, draft_ids_ptr, b, n, k, final, lps,
                        js, draft_base, max_draft, vocab, LOGPROBS: tl.constexpr, HAS_BONUS: tl.constexpr):
    """Request b's outputs: its k accepted drafts, then `final` (HAS_BONUS: bonus_ptr[b], clamped into [0, V),
    after a fully accepted chain, k == n: the bonus row is never entered and its logprob stays NaN), -1 after;
    num_accepted = k; the logprobs."""
    if HAS_BONUS:
        bonus = tl.minimum(tl.maximum(tl.load(bonus_ptr + b), 0), vocab - 1)
        final = tl.where(k == n, bonus, final)
    kept = tl.load(draft_ids_ptr + draft_base + js, mask=js < k, other=-1)
    out = tl.where(js < k, kept, tl.where(js == k, final, -1))
    tl.store(token_ids_ptr + b * (max_draft + 1) + js, out, mask=js <= max_draft)
    tl.store(num_accepted_ptr + b, k.to(tl.int32))
    if LOGPROBS:
        tl.store(logprobs_ptr + b * (max_draft + 1) + js, lps, mask=js <= max_draft)


@triton.jit
def draft_uniform(seed, offset, k):
    """The acceptance uniform of the draft at position k (a scalar)."""
    return tl.sum(bits_to_uniform(philox_bits(seed, offset, k, PURPOSE_ACCEPT, tl.zeros([1], tl.int64))), 0)


@triton.jit
def rate_accept(u, k, is_draft, in_vocab, rates_ptr):
    """The synthetic test (engine keyword): the draft at position k is accepted iff u < rate[k]."""
    return is_draft & in_vocab & (u < tl.load(rates_ptr + k, mask=is_draft, other=0.0))


@triton.jit
def sampled_accept(u, p_x, x, k, is_draft, in_vocab, q_row_ptr, rates_ptr, HAS_DRAFT_PROBS: tl.constexpr,
                   HAS_RATES: tl.constexpr):
    """The acceptance test of a sampled request's draft x at position k (accept_draft of
    csrc/common/sampling_math.h: u * q(x) < p(x), q one-hot without HAS_DRAFT_PROBS), or the synthetic test."""
    if HAS_RATES:
        accept = rate_accept(u, k, is_draft, in_vocab, rates_ptr)
    else:
        if HAS_DRAFT_PROBS:
            q_x = tl.load(q_row_ptr + x, mask=is_draft & in_vocab, other=0.0).to(tl.float32)
            q_x = tl.where(q_x > 0, q_x, 0.0)
        else:
            q_x = 1.0
        accept = is_draft & in_vocab & (u * q_x < p_x)
    return accept


@triton.jit
def chain_rows(lengths_ptr, b, max_draft, num_draft_rows, bonus_rows, PACKED: tl.constexpr):
    """(n, target_base, draft_base) of request b: its draft count clamped into [0, max_draft] (packed: its
    cu_num_draft_tokens range clamped into the rows), where its target rows and its draft tokens start."""
    if PACKED:
        lo = tl.minimum(tl.maximum(tl.load(lengths_ptr + b), 0), num_draft_rows)
        hi = tl.minimum(tl.maximum(tl.load(lengths_ptr + b + 1), lo), num_draft_rows)
        n = tl.minimum(hi - lo, max_draft)
        target_base = lo + b * bonus_rows
        draft_base = lo
    else:
        n = tl.minimum(tl.maximum(tl.load(lengths_ptr + b), 0), max_draft)
        target_base = b * (max_draft + bonus_rows)
        draft_base = b * max_draft
    return n, target_base, draft_base


@triton.jit
def pick(vec, js, j):
    """vec[j] of a small vector (a reduction: Triton has no dynamic register indexing)."""
    return tl.sum(tl.where(js == j, vec, tl.zeros_like(vec)), 0)


@triton.jit
def tree_residual(p, q, zs, js, count):
    """r after `count` committed residual updates with normalizers zs[0 .. count-1]
    (tree_verify_math.h tree_residual): r = mass(p), then r <- max(r / z_prev - mass(q), 0)."""
    r = tl.where(p > 0, p, 0.0)
    qm = tl.where(q > 0, q, 0.0)
    prev = tl.full([], 1.0, tl.float32)
    j = count * 0
    while j < count:  # not range(count): triton 3.6's interpreter cannot take a runtime range() bound
        d = tl.math.div_rn(r, prev) - qm
        r = tl.where(d > 0, d, 0.0)
        prev = pick(zs, js, j)
        j += 1
    return r


@triton.jit
def excluded(idx, zeroed, js, count):
    """Whether each index is among the `count` zeroed tokens (one-hot tree walk)."""
    out = idx < 0
    j = count * 0
    while j < count:  # not range(count): see tree_residual
        out = out | (idx == pick(zeroed, js, j))
        j += 1
    return out


@triton.jit
def node_stats(j, t, part_max_ptr, part_arg_ptr, part_sum_ptr, tau_ptr, part_kept_ptr, HAS_FILTERS: tl.constexpr,
               CHUNKS: tl.constexpr, CHUNKS_P2: tl.constexpr):
    """(m, argmax, tau, total) of row j from the split kernels' workspaces (a greedy row's total is its sum at
    T = 1, which no greedy path reads; tau = 0 without filters)."""
    m, argmax, total = combined_row(part_max_ptr, part_arg_ptr, part_sum_ptr, j, t, CHUNKS, CHUNKS_P2)
    tau = tl.full([], 0, tl.int64)
    if HAS_FILTERS:
        tau, total = filtered_total(tau_ptr, part_kept_ptr, j, total, CHUNKS, CHUNKS_P2)
    return m, argmax, tau, total


@triton.jit(do_not_specialize=["nodes"])
def tree_rejection_sample_logits_kernel(
    logits_ptr,          # [B, N, V] raw logits
    draft_probs_ptr,     # [B, N, V] (any valid pointer without HAS_DRAFT_PROBS)
    tokens_ptr,          # int64 [B, N]
    parents_ptr,         # int64 [B, N]
    num_nodes_ptr,       # int64 [B] node counts (the launcher passes N for every request without num_nodes)
    seeds_ptr, offsets_ptr,
    temperature_ptr,     # float32 [B] (any valid pointer without HAS_T; the filters are in the split stats)
    token_ids_ptr,       # int64 out [B, N]
    accepted_path_ptr,   # int32 out [B, N]
    num_accepted_ptr,    # int32 out [B]
    logprobs_ptr,        # float32 out [B, N] (any valid pointer without LOGPROBS)
    part_max_ptr, part_arg_ptr, part_sum_ptr,  # chain_row_partials_kernel's over the B x N rows (TREE)
    tau_ptr, part_kept_ptr,                    # chain_kept_mass_kernel's (HAS_FILTERS)
    vocab: tl.constexpr, nodes,
    HAS_DRAFT_PROBS: tl.constexpr, HAS_T: tl.constexpr, LOGPROBS: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK: tl.constexpr, HAS_FILTERS: tl.constexpr, CHUNKS: tl.constexpr,
    CHUNKS_P2: tl.constexpr,
):
    """The walk of csrc/tree_verify/tree_verify_math.h on processed rows (csrc/logits/logits_cpu.cpp
    tree_request): a node's row statistics (max, argmax, threshold, kept mass) are combined, when the walk
    enters it, from the split kernels' per-chunk partials and thresholds, which every row of the tree got in
    parallel before (node_stats); the walk reads a row only for its acceptance tests, the normalizers after
    a rejection, the final race and the log-probabilities."""
    b = tl.program_id(0).to(tl.int64)
    n = tl.minimum(tl.maximum(tl.load(num_nodes_ptr + b), 1), nodes)
    seed = tl.load(seeds_ptr + b)
    offset = tl.load(offsets_ptr + b)
    t, _, _, _ = sanitize_params(temperature_ptr, temperature_ptr, temperature_ptr, temperature_ptr, b, vocab, HAS_T,
                                 False, False, False)
    js = tl.arange(0, BLOCK_N).to(tl.int64)
    path = tl.where(js == 0, 0, -1).to(tl.int64)
    toks = tl.full([BLOCK_N], -1, tl.int64)
    lps = tl.full([BLOCK_N], float("nan"), tl.float32)
    zs = tl.zeros([BLOCK_N], tl.float32)          # normalizers Z_1 .. Z_m (draft probs)
    zeroed = tl.full([BLOCK_N], -1, tl.int64)     # zeroed tokens (one-hot)
    u = tl.full([], 0, tl.int64)
    k = tl.full([], 0, tl.int64)
    count = tl.full([], 0, tl.int64)              # m: committed updates at u
    rejected = tl.full([], 0, tl.int32)
    sum_p = tl.full([], 0.0, tl.float32)
    nonzero = tl.full([], 0, tl.int64)
    row_ptr = logits_ptr + (b * nodes) * vocab
    q_row_ptr = draft_probs_ptr + (b * nodes) * vocab
    m, argmax, tau, total = node_stats(b * nodes, t, part_max_ptr, part_arg_ptr, part_sum_ptr, tau_ptr, part_kept_ptr,
                                       HAS_FILTERS, CHUNKS, CHUNKS_P2)
    c = n * 0 + 1
    while c < n:  # not range(1, n): n is a runtime value (triton 3.6's interpreter)
        par = tl.load(parents_ptr + b * nodes + c)
        par = tl.where((par >= 0) & (par < c), par, 0)
        x = tl.load(tokens_ptr + b * nodes + c)
        if par == u:
            in_vocab = (x >= 0) & (x < vocab)
            xs = tl.minimum(tl.maximum(x, 0), vocab - 1)
            if t > 0:
                uc = draft_uniform(seed, offset, c - 1)
                p_x = entry_prob(logit_value(tl.load(row_ptr + xs).to(tl.float32)), m, t, tau, total)
                if HAS_DRAFT_PROBS:
                    q_x = tl.load(q_row_ptr + xs).to(tl.float32)
                    z_m = tl.where(count > 0, pick(zs, js, count - 1), 1.0)
                    r_x = tree_residual(p_x, q_x, zs, js, count)
                    accept = in_vocab & (uc * tl.where(q_x > 0, q_x, 0.0) < tl.math.div_rn(r_x, z_m))
                    if accept == 0:
                        new_total = tl.full([], 0.0, tl.float32)
                        for start in range(0, vocab, BLOCK):
                            idx = start + tl.arange(0, BLOCK).to(tl.int64)
                            inside = idx < vocab
                            p = entry_prob(load_row(row_ptr, idx, inside), m, t, tau, total)
                            q = tl.load(q_row_ptr + idx, mask=inside, other=0.0).to(tl.float32)
                            r = tree_residual(p, q, zs, js, count)
                            d = tl.math.div_rn(r, z_m) - tl.where(q > 0, q, 0.0)
                            new_total += tl.sum(tl.where(inside & (d > 0), d, 0.0), 0)
                        if new_total > 0:
                            zs = tl.where(js == count, new_total, zs)
                            count += 1
                else:
                    if rejected == 0:
                        sum_p = tl.zeros_like(sum_p)
                        nonzero = tl.zeros_like(nonzero)
                        for start in range(0, vocab, BLOCK):
                            idx = start + tl.arange(0, BLOCK).to(tl.int64)
                            inside = idx < vocab
                            p = entry_prob(load_row(row_ptr, idx, inside), m, t, tau, total)
                            sum_p += tl.sum(tl.where(inside, p, 0.0), 0)
                            nonzero += tl.sum((inside & (p > 0)).to(tl.int64), 0)
                    is_out = tl.sum(excluded(tl.full([1], 0, tl.int64) + x, zeroed, js, count).to(tl.int32), 0) > 0
                    p_x = tl.where(in_vocab & ~is_out, p_x, 0.0)
                    accept = in_vocab & (uc * sum_p < p_x)
                    if accept == 0:
                        if p_x > 0:
                            if nonzero - count > 1:
                                zeroed = tl.where(js == count, x, zeroed)
                                count += 1
                                sum_p -= p_x
            else:
                accept = x == argmax
            if accept:
                if LOGPROBS:
                    lps = tl.where(js == k, row_logprob(row_ptr, x, m, t, tau, total), lps)
                toks = tl.where(js == k, x, toks)
                k += 1
                path = tl.where(js == k, c, path)
                u = c + tl.zeros_like(u)
                row_ptr = logits_ptr + (b * nodes + u) * vocab
                q_row_ptr = draft_probs_ptr + (b * nodes + u) * vocab
                m, argmax, tau, total = node_stats(b * nodes + u, t, part_max_ptr, part_arg_ptr, part_sum_ptr,
                                                   tau_ptr, part_kept_ptr, HAS_FILTERS, CHUNKS, CHUNKS_P2)
                rejected = tl.zeros_like(rejected)
                count = tl.zeros_like(count)
            else:
                rejected = tl.zeros_like(rejected) + 1
        c += 1
    final = argmax
    if t > 0:
        purpose = tl.where(rejected != 0, PURPOSE_RESIDUAL, PURPOSE_BONUS)
        best = tl.full([], -1.0, tl.float32)
        best_index = tl.full([], 0, tl.int64)
        for start in range(0, vocab, BLOCK):
            idx = start + tl.arange(0, BLOCK).to(tl.int64)
            inside = idx < vocab
            p = entry_prob(load_row(row_ptr, idx, inside), m, t, tau, total)
            if HAS_DRAFT_PROBS:
                q = tl.load(q_row_ptr + idx, mask=inside, other=0.0).to(tl.float32)
                mass = tree_residual(p, q, zs, js, count)
            else:
                mass = tl.where(excluded(idx, zeroed, js, count), 0.0, p)
            bits = philox_bits(seed, offset, u, purpose, idx)
            best, best_index = race_tile_update(race_masses(mass, inside), bits, idx, best, best_index, True)
        final = best_index
    if LOGPROBS:
        lps = tl.where(js == k, row_logprob(row_ptr, final, m, t, tau, total), lps)
        tl.store(logprobs_ptr + b * nodes + js, lps, mask=js < nodes)
    toks = tl.where(js == k, final, toks)
    tl.store(token_ids_ptr + b * nodes + js, toks, mask=js < nodes)
    tl.store(accepted_path_ptr + b * nodes + js, path.to(tl.int32), mask=js < nodes)
    tl.store(num_accepted_ptr + b, k.to(tl.int32))


# ------------------------------------------------------------------------------------------------------------
# Chain verification split over the vocabulary (two launches without filters, no waiting between programs)
#
# One program walking a request's rows would read each row in several passes of V / BLOCK trips one after the
# other on one SM. Rows without top-k / top-p / min-p need only (max, first argmax, sum of exp) per row, which
# combine exactly over fixed chunks of the vocabulary:
#   1. chain_row_partials_kernel, grid (B x (K + 1), chunks): each program reads one chunk of one row once
#      (per tile: its max, then its sum of exp((x - m_c) / T) against the running max) and writes (m_c, first
#      argmax, s_c);
#   2. chain_walk_race_kernel, grid (B, races): each program combines the partials of the request's rows
#      in chunk order (m = max m_c, total = sum_c exp((m_c - m) / T) s_c: the same in every program), walks
#      the acceptance tests, then races over its own RACE_GROUP chunks of the row where the walk stopped
#      (races = ceil(chunks / RACE_GROUP); the launcher groups chunks when one per program would take more
#      than a wave of the GPU); the program that takes the last ticket of the request (an atomic counter in
#      a per-call workspace) combines the programs' winners (largest score, then smallest index: exactly one
#      program's race over the whole row) and writes the outputs. No program ever waits for another, so the
#      interpreter runs it as the GPU does.
# The chunk size is fixed by the launcher (not by the GPU's size), so the sums round the same on any device.
# Every row up to the request's last draft (and its bonus row) is read once, also after an early rejection:
# the price of having no barrier between the rows of a walk.
# ------------------------------------------------------------------------------------------------------------


@triton.jit
def split_row(lengths_ptr, j, max_draft, num_draft_rows, bonus_rows, PACKED: tl.constexpr, HAS_BONUS: tl.constexpr,
              TREE: tl.constexpr):
    """(b, used, target row) of split row j = b x (K+1) + k: `used` where the walk may enter it. TREE: row j is
    node k of request b's tree (K+1 = N nodes, lengths_ptr its node counts, clamped into [1, N])."""
    b = j // (max_draft + 1)
    k = j % (max_draft + 1)
    if TREE:
        used = k < tl.minimum(tl.maximum(tl.load(lengths_ptr + b), 1), max_draft + 1)
        target_row = j
    else:
        n, target_base, _ = chain_rows(lengths_ptr, b, max_draft, num_draft_rows, bonus_rows, PACKED)
        used = k <= n
        if HAS_BONUS:
            used = k < n
        target_row = target_base + k
    return b, used, target_row


@triton.jit(do_not_specialize=["num_draft_rows"])
def chain_row_partials_kernel(
    logits_ptr,          # [rows, V] raw logits
    lengths_ptr,         # int64: num_draft_tokens [B] (padded) or cu_num_draft_tokens [B+1] (packed)
    temperature_ptr,     # float32 [B] (any valid pointer without HAS_T)
    part_max_ptr,        # float32 out [B, K+1, CHUNKS]
    part_arg_ptr,        # int64 out [B, K+1, CHUNKS]
    part_sum_ptr,        # float32 out [B, K+1, CHUNKS]
    vocab: tl.constexpr, max_draft, num_draft_rows, bonus_rows,
    PACKED: tl.constexpr, HAS_T: tl.constexpr, HAS_BONUS: tl.constexpr, TREE: tl.constexpr,
    CHUNKS: tl.constexpr, CHUNK: tl.constexpr, PART_BLOCK: tl.constexpr,
):
    """(max, first argmax, sum of exp((x - max) / T)) of one chunk of one row (T = 1 for greedy rows, whose
    sum only logprobs use). Rows the walk can never enter (past the request's drafts, its bonus row with
    HAS_BONUS) are not read and their partials not written.

    Per tile of PART_BLOCK entries (CHUNK is a multiple of it): the tile's max (one reduction); when it raises
    the running max m, the running sum is rescaled by exp((m_old - m) / T) and, with HAS_T, the argmax moves to
    the tile's first index of its max (a branch per tile, taken about ln(tiles) times per chunk on i.i.d.
    logits); then the tile's sum of exp((x - m) / T) (a second reduction). Per entry that is the sanitized
    load, a max, a subtraction, a product (by log2(e) / T), an ex2 and an add. Without a temperature tensor
    every request samples at T = 1 and the walk never reads the argmax (it serves greedy rows only): the
    chunk's first index is stored in its place."""
    j = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    b, used, target_row = split_row(lengths_ptr, j, max_draft, num_draft_rows, bonus_rows, PACKED, HAS_BONUS, TREE)
    if used:
        inv_t = tl.full([], 1.0, tl.float32)
        if HAS_T:
            t = tl.load(temperature_ptr + b)
            inv_t = tl.where(t > 0, tl.math.div_rn(1.0, tl.minimum(t, F32_MAX)), 1.0)
        m, total, best_index = chunk_partials(logits_ptr + target_row * vocab, c * CHUNK, vocab, inv_t, HAS_T, CHUNK,
                                              PART_BLOCK)
        at = j * CHUNKS + c
        tl.store(part_max_ptr + at, m)
        tl.store(part_arg_ptr + at, best_index.to(tl.int64))
        tl.store(part_sum_ptr + at, total)


@triton.jit
def chunk_partials(row_ptr, lo, vocab, inv_t, HAS_T: tl.constexpr, CHUNK: tl.constexpr, PART_BLOCK: tl.constexpr):
    """(max, first argmax (HAS_T; else lo), sum of exp2((x - max) inv_t log2(e))) of the sanitized logits
    [lo, lo + CHUNK) of a row (chain_row_partials_kernel's docstring)."""
    exp2_scale = inv_t * LOG2E
    m = tl.full([], float("-inf"), tl.float32)
    total = tl.full([], 0.0, tl.float32)
    best_index = tl.zeros([], tl.int32) + lo
    for start in range(0, CHUNK, PART_BLOCK):
        idx = lo + start + tl.arange(0, PART_BLOCK)
        x = load_row(row_ptr, idx, idx < vocab)
        tile_max = tl.max(x, 0)
        if tile_max > m:  # m = -inf before the first finite entry: the sum so far is 0 and stays 0
            if HAS_T:
                best_index = tl.min(tl.where(x == tile_max, idx, 0x7FFFFFFF), 0)
            total = total * tl.exp((m - tile_max) * inv_t)
            m = tile_max
        if m > float("-inf"):  # else every entry so far is -inf (x - m would be NaN): no mass yet
            # exp2 of (x - m) / T * log2(e): the ex2 without the subnormal rescaling tl.exp carries (a
            # term below 2^-126 flushes to 0, against the max's own term 1: under 2^-109 of the sum at
            # any vocabulary size); three instructions per entry with the subtraction
            total += tl.sum(tl.math.exp2((x - m) * exp2_scale), 0)
    return m, total, best_index


@triton.jit
def combined_row(part_max_ptr, part_arg_ptr, part_sum_ptr, j, temperature, CHUNKS: tl.constexpr,
                 CHUNKS_P2: tl.constexpr, VOLATILE: tl.constexpr = False):
    """(m, argmax, total) of row j from its chunk partials: the largest maximum with the smallest index
    (index 0 without a finite logit), and the chunk sums rescaled to m (T = 1 when temperature is 0).
    VOLATILE: partials other programs of the same launch wrote (read past the L1)."""
    cs = tl.arange(0, CHUNKS_P2)
    valid = cs < CHUNKS
    ms = tl.load(part_max_ptr + j * CHUNKS + cs, mask=valid, other=float("-inf"), volatile=VOLATILE)
    args = tl.load(part_arg_ptr + j * CHUNKS + cs, mask=valid, other=0, volatile=VOLATILE)
    sums = tl.load(part_sum_ptr + j * CHUNKS + cs, mask=valid, other=0.0, volatile=VOLATILE)
    m = tl.max(ms, 0)
    finite = ms > float("-inf")
    argmax = tl.min(tl.where(finite & (ms == m), args, 0x7FFFFFFFFFFFFFFF), 0)
    argmax = tl.where(m > float("-inf"), argmax, 0)
    t = tl.where(temperature > 0, temperature, 1.0)
    total = tl.sum(tl.where(finite, tl.exp(scaled(ms, m, t)) * sums, 0.0), 0)
    return m, argmax, total


@triton.jit
def row_logprob(row_ptr, token, m, temperature, tau, total):
    """combined_logprob of the row's entry `token` (an index inside the row)."""
    return combined_logprob(logit_value(tl.load(row_ptr + token).to(tl.float32)), m, temperature, tau, total)


@triton.jit
def combined_logprob(x, m, temperature, tau, total):
    """log p(x) from a combined row: z - log(total) on the kept set {key >= tau} (greedy: tau = 0 and the
    log_softmax of the raw logits), -inf off it."""
    t = tl.where(temperature > 0, temperature, 1.0)
    z = scaled(x, m, t)
    kept = (m > float("-inf")) & (total > 0) & (order_key(z) >= tau)
    return tl.where(kept, z - tl.log(total), float("-inf"))


@triton.jit
def split_race(row_ptr, q_row_ptr, draft, residual, vocab, m, temperature, tau, total, seed, offset, position,
               purpose, lo, LENGTH: tl.constexpr, HAS_T: tl.constexpr, HAS_Q: tl.constexpr, BLOCK: tl.constexpr):
    """(best score, first index) of the exponential race over entries [lo, lo + LENGTH) of a row: over
    max(p - q, 0) when `residual` (q one-hot at `draft` without HAS_Q), else over p; one running best across
    tiles. p = exp((x - m) / T) / total on the kept set {key >= tau}, 0 off it, as entry_prob (T = 1 without
    HAS_T: no division), computed exactly only on a tile's log path. The common tile costs per entry the raw
    load, one ex2 and a compare against a threshold linear in the uniform's float bits (race_skips: no
    sanitizing, no one-hot, no division; an entry it cannot rule out, NaN and inf logits included, goes to
    the exact path); a tile none of whose entries may still win costs no division and no log."""
    best = tl.full([], -1.0, tl.float32)
    best_index = tl.zeros([], tl.int32)
    inv_t = tl.full([], 1.0, tl.float32)
    if HAS_T:
        inv_t = tl.math.div_rn(1.0, temperature)
    exp_a, exp_b = race_exp2_args(m, inv_t)
    # residual rows with draft probs: max(p - q, 0) < best (w - eps) needs e / total < best (w - eps) + q
    total_low = tl.where(residual, total * 0.99999904632568359375, 0.0)
    for start in range(0, LENGTH, BLOCK):
        idx = lo + start + tl.arange(0, BLOCK)
        inside = idx < vocab
        x_raw = tl.load(row_ptr + idx, mask=inside, other=float("-inf")).to(tl.float32)
        bits = philox_tile(seed, offset, position, purpose, lo + start, BLOCK)
        cut_a, cut_c = race_cut(best, total)
        if HAS_Q:
            q = tl.load(q_row_ptr + idx, mask=idx < tl.where(residual, vocab, 0), other=0.0).to(tl.float32)
            q = tl.where(q > 0, q, 0.0)
            skip = race_skips(x_raw, bits, exp_a, exp_b, cut_a, cut_c, q * total_low)
        else:
            skip = race_skips(x_raw, bits, exp_a, exp_b, cut_a, cut_c, 0.0)
        may_win = tl.where(skip, 0, 1)
        if tl.max(may_win, 0) != 0:  # the exact p (two correctly rounded divisions) for the tile's log path
            x = logit_value(x_raw)
            if not HAS_Q:
                q = tl.where(idx == draft, 1.0, 0.0)
            if HAS_T:
                z = scaled(x, m, temperature)
            else:
                z = x - m
            mass = tl.where(total > 0, tl.math.div_rn(tl.exp(z), tl.maximum(total, 1e-30)), 0.0)
            mass = tl.where(order_key(z) >= tau, mass, 0.0)
            target = tl.where(residual, mass - q, mass)
            best, best_index = race_tile_fold(race_masses(target, inside), bits_to_uniform(bits), idx, may_win, best,
                                              best_index, True)
    return best, best_index


@triton.jit
def race_exp2_args(m, inv_t):
    """(a, b) with 2^(x a + b) >= (1 + 2^-13) exp(z) for every logit x <= m, z = (x - m) / T as the exact path
    rounds it (a the row's scalar; x raw, NaN and +inf give NaN and inf: never skipped). a = (1/T) log2(e)
    (1 - 2^-20): below its exact value by at least 0.75 2^-20 after its three roundings, so (x - m) a exceeds
    the exact path's rounded z log2(e) (four roundings, 2^-22 of it) for x <= m; b = 2^-12 + |m a| 2^-21 - m a
    also covers the roundings of m a and b and of x a + b (2^-18 below 2^7; an exponent beyond only flushes
    to 0 or overflows), whether x a + b is fused or not: 2^(x a + b) >= 2^(2^-13) 2^(z log2(e)) rounded, which
    covers tl.exp's and ex2's relative errors (below 2^-20). See race_skips."""
    a = inv_t * LOG2E * 0.99999904632568359375
    ma = m * a
    b = (0.000244140625 + tl.abs(ma) * 4.76837158203125e-07) - ma
    return a, b


@triton.jit
def race_skips(x_raw, bits, exp_a, exp_b, cut_a, cut_c, q_total):
    """Entries of a tile that provably cannot beat the race's best score (rejection.py race_cut, whose docstring
    has the proof): P < C - A f + q_total with P = ex2(x a + b) (race_exp2_args: P / total >= p, the exact
    path's p = exp(z) / total rounded), f from the random bits (uniform_mantissa), (A, C) = race_cut(best, total)
    and q_total = q(x) total (1 - 2^-20) for a residual with draft probs (else 0). The raw logit is not
    sanitized: NaN and +inf give NaN and inf, never skipped; entries past the row load -inf (P = 0) and race
    as -1 in the fold. An entry whose P flushes to 0 has p < 2^-125 / total (its rounded exponent is below
    -125): a skip needs 0 < C - A f, so -log(u) > 0.99e-5 and its score is below 2^-125 / (total 0.99e-5) <
    1e-30 < best, as race_cut's total >= 0.5 makes sure."""
    return tl.math.exp2(x_raw * exp_a + exp_b) < (cut_c - cut_a * uniform_mantissa(bits)) + q_total


# ------------------------------------------------------------------------------------------------------------
# Filters on the split rows (top-k, top-p, min-p): the radix select of radix_select, one launch per pass.
# Every row the walk may enter (those chain_row_partials_kernel reads) runs a pass as a grid of (row, chunk)
# programs. Pass g of the call (top-k's PASSES passes, then top-p's: radix_passes of the logits' type) is one
# launch: each program first finishes the pick of pass g - 1 (the row's state after pass g - 2 and the CHUNKS x 16 histogram of pass g - 1, read
# from slot (g - 1) % 2 of double-buffered workspaces and combined in a fixed order, so every program of the
# row picks the same digit), chunk 0 stores the new state in slot g % 2, and each program writes its chunk's
# histogram of pass g there. No program waits for another: the launches order the passes. Top-p's target,
# top_p * (the candidates' mass) * (1 - slack), is the sum of its first histogram (every candidate is in one
# of its bins). chain_kept_mass_kernel then finishes the last pick, applies min-p, and sums each chunk's kept
# mass; a row without an active filter (greedy, filters off by value) keeps tau = 0 and the walk takes the
# partials' total, as without filter tensors. Sums round in a fixed order of tiles, chunks and bins: the same
# on every device (not the C++ kernel's order: near-ties at the threshold may differ from it).
# ------------------------------------------------------------------------------------------------------------


@triton.jit
def filtered_total(tau_ptr, part_kept_ptr, j, total, CHUNKS: tl.constexpr, CHUNKS_P2: tl.constexpr):
    """(tau, total) of row j: its threshold and, where it has one (tau > 0), the sum of its chunks' kept
    masses in place of the partials' `total`."""
    tau = tl.load(tau_ptr + j)
    if tau > 0:
        cs = tl.arange(0, CHUNKS_P2)
        total = tl.sum(tl.load(part_kept_ptr + j * CHUNKS + cs, mask=cs < CHUNKS, other=0.0), 0)
    return tau, total


@triton.jit
def row_max_of_chunks(part_max_ptr, j, CHUNKS: tl.constexpr, CHUNKS_P2: tl.constexpr):
    cs = tl.arange(0, CHUNKS_P2)
    return tl.max(tl.load(part_max_ptr + j * CHUNKS + cs, mask=cs < CHUNKS, other=float("-inf")), 0)


@triton.jit
def row_histogram(hist_ptr, j, PARTS: tl.constexpr, PARTS_P2: tl.constexpr):
    """Row j's histogram [16]: its parts' histograms of this pass summed in order (written by the other
    programs of the row before their tickets: volatile loads)."""
    ps = tl.arange(0, PARTS_P2)
    bins = tl.arange(0, RADIX_BINS)
    at = (j * PARTS + ps[:, None]) * RADIX_BINS + bins[None, :]
    valid = (ps[:, None] < PARTS) & (bins[None, :] < RADIX_BINS)
    return tl.sum(tl.load(hist_ptr + at, mask=valid, other=0.0, volatile=True), 0)


@triton.jit
def finish_pass(hist_ptr, prefix_ptr, acc_ptr, goal_ptr, tau_out_ptr, j, prefix, top_k, top_p, m, t, passed,
                BY_MASS: tl.constexpr, PASSES: tl.constexpr, PARTS: tl.constexpr, PARTS_P2: tl.constexpr):
    """The pick of pass `passed` of row j's select (logits_math.h radix_pick_count / radix_pick_mass), by the
    row's last program of the pass: from the row's histogram and the select's state before the pass (`prefix`,
    and acc_ptr / goal_ptr: by count the rank left, by mass the mass above the prefix and the target), the state
    after it; top-p's target (pass 0) is top_p times its candidates' mass, less the slack. After the last pass,
    the threshold (z's key: threshold_key) goes to tau_out_ptr."""
    hist = row_histogram(hist_ptr, j, PARTS, PARTS_P2)
    above = tl.full([], 0.0, tl.float32)
    if passed == 0:
        if BY_MASS:
            remaining = top_p * tl.sum(hist, 0) * (1.0 - TOP_P_SLACK)
        else:
            remaining = top_k.to(tl.float32)
    else:
        remaining = tl.load(acc_ptr + j)
        if BY_MASS:
            above = remaining
            remaining = tl.load(goal_ptr + j)
    prefix, remaining, above = radix_pick(hist, prefix, remaining, above, 28 - RADIX_BITS * passed, BY_MASS)
    tl.store(prefix_ptr + j, prefix)
    if BY_MASS:
        tl.store(acc_ptr + j, above)
        if passed == 0:
            tl.store(goal_ptr + j, remaining)
    else:
        tl.store(acc_ptr + j, remaining)
    if passed == PASSES - 1:
        tl.store(tau_out_ptr + j, threshold_key(prefix, m, t, PASSES))


@triton.jit
def top_p_accepts_early(x_logit, u, q_x, m, t, top_p, total, vocab):
    """Top-p's early acceptance of a sampled draft x with logit x_logit (sanitized), the split kernels' form of
    csrc/logits/logits_split.h top_p_accepts_early, for a row whose only filter is top-p: True when this row's
    select (chain_radix_pass_kernel) keeps x whatever its rounding, and u * q(x) < p_low, a lower bound on the p(x)
    the walk would compute from the kept mass (chain_kept_mass_kernel). `total` is the row's sum of e over every
    entry from its chunk partials (combined_row).

    The masses here are float32 sums of float32 exponentials taken in different kernels, orders and forms
    (partials against a running max, rescaled; tile, chunk and bin sums; the pick's sums from the top), so the
    bound covers them all: with R the exact sum of e^z over the row, every computed mass of a set S of entries is
    within (eps / 2) R + V 2.2e-9 of its exact mass, eps = 4 gamma + 2^-10 (gamma = V 2^-24 / (1 - V 2^-24): any
    float sum of V non-negative terms; the terms with z >= -20 within 1e-4 relative, their arguments' roundings
    and the approximate exponentials included; those below within 2.1e-9 each; a pick's difference of sums within
    a few ulps of R). The select keeps x unless the computed mass of the entries above x's key reaches its target
    top_p (1 - slack) (the computed total), so it keeps x when e_x > R_up (1 + eps / 2 - top_p (1 - slack)
    (1 - eps)) + V 4.4e-9, R_up = (total + V 2.2e-9) (1 + eps) >= R; and any computed kept mass is at most
    R_up (1 + eps / 2) + V 2.2e-9 =: bound, so p_low = e_x (1 - 2^-20) / bound (the 2^-20 for an exponential the
    walk rounds apart). A few percent of the row's mass at V = 128256; the rest goes through the select."""
    vf = tl.full([], vocab, tl.float32)
    vu = vf * 5.9604644775390625e-08  # V 2^-24
    eps = 4.0 * vu / (1.0 - vu) + 0.0009765625
    r_up = (total + vf * 2.2e-9) * (1.0 + eps)
    bound = (r_up * (1.0 + 0.5 * eps) + vf * 2.2e-9) * 1.0001
    e = tl.exp(scaled(x_logit, m, t))
    need = r_up * (1.0 + 0.5 * eps - top_p * (1.0 - TOP_P_SLACK) * (1.0 - eps)) + vf * 4.4e-9
    keeps = (vu < 0.25) & (total > 0) & (e * 0.9999 > need * 1.0001)
    p_low = tl.math.div_rn(e * 0.99999904632568359375, tl.maximum(bound, 1e-30))
    return keeps & (u * q_x < p_low)


@triton.jit
def chain_row_accepts_early(logits_ptr, draft_probs_ptr, draft_ids_ptr, lengths_ptr, seeds_ptr, offsets_ptr,
                            part_max_ptr, part_arg_ptr, part_sum_ptr, j, b, t, top_k, top_p, min_p, vocab, max_draft,
                            num_draft_rows, bonus_rows, PACKED: tl.constexpr, HAS_DRAFT_PROBS: tl.constexpr,
                            CHUNKS: tl.constexpr, CHUNKS_P2: tl.constexpr):
    """Whether chain row j = b x (K+1) + k, a sampled row with top-p on, is a draft row whose draft top-p's early
    acceptance takes (top_p_accepts_early; rows with top-k or min-p on never: their thresholds are not top-p's
    alone). Every program of the row computes it from the same values."""
    k = j % (max_draft + 1)
    n, target_base, draft_base = chain_rows(lengths_ptr, b, max_draft, num_draft_rows, bonus_rows, PACKED)
    is_draft = (k < n) & (top_k == 0) & (min_p == 0.0)
    x = tl.load(draft_ids_ptr + draft_base + k, mask=is_draft, other=-1)
    ok = is_draft & (x >= 0) & (x < vocab)
    x_logit = logit_value(tl.load(logits_ptr + (target_base + k) * vocab + x, mask=ok, other=float("-inf"))
                          .to(tl.float32))
    q_x = 1.0
    if HAS_DRAFT_PROBS:
        q_x = tl.load(draft_probs_ptr + (draft_base + k) * vocab + x, mask=ok, other=0.0).to(tl.float32)
        q_x = tl.where(q_x > 0, q_x, 0.0)
    m, _, total = combined_row(part_max_ptr, part_arg_ptr, part_sum_ptr, j, t, CHUNKS, CHUNKS_P2)
    u = draft_uniform(tl.load(seeds_ptr + b), tl.load(offsets_ptr + b), k)
    return ok & top_p_accepts_early(x_logit, u, q_x, m, t, top_p, total, vocab)


@triton.jit
def race_program_is_last(race_score_ptr, race_index_ptr, tickets_ptr, b, c, races, best, index):
    """Stores race program c's winner (best score, its index) of request b and takes the request's ticket: True in
    the last of its `races` programs, which then merges them (race_programs_winner). No program waits for another."""
    tl.store(race_score_ptr + b * races + c, best)
    tl.store(race_index_ptr + b * races + c, index.to(tl.int64))
    tl.debug_barrier()  # every thread's stores before the ticket
    ticket = tl.atomic_add(tickets_ptr + b, 1, sem="acq_rel")
    return ticket == races - 1


@triton.jit
def race_programs_winner(race_score_ptr, race_index_ptr, b, races, CHUNKS_P2: tl.constexpr):
    """(best score, its smallest index) over request b's race programs' winners (written before their tickets:
    read by the last program, volatile): the race's winner over the whole row."""
    cs = tl.arange(0, CHUNKS_P2)
    valid = cs < races
    scores = tl.load(race_score_ptr + b * races + cs, mask=valid, other=-2.0, volatile=True)
    indices = tl.load(race_index_ptr + b * races + cs, mask=valid, other=0, volatile=True)
    top = tl.max(scores, 0)
    return top, tl.min(tl.where(valid & (scores == top), indices, 0x7FFFFFFFFFFFFFFF), 0)


@triton.jit
def top_p_keeps_above(above, total, top_p, vocab):
    """Whether top-p's select (chain_radix_pass_kernel, chain_kept_mass_kernel) keeps an entry w whatever its
    rounding, from `above`, a float32 sum of e = exp(z) over the entries with logit >= w's (w's own and its ties
    included: an upper bound on the mass strictly above w), and `total`, the row's sum of e over every entry
    from its chunk partials (combined_row). The select keeps w unless its computed mass of the entries above
    w's key reaches its target top_p (1 - slack) (its computed total). With top_p_accepts_early's bound on any
    computed mass of a set of entries (within delta = (eps / 2) R + V 2.2e-9 of the exact mass, R the exact
    sum of e over the row, R <= R_up), the select's mass above w is at most above + 2 delta and its target at
    least top_p (1 - slack) (total - 2 delta): it keeps w when the first is below the second (safety factors
    1 +- 1e-4 over the few roundings here). Unsure (False) within about 2e-3 of the row's mass of the target."""
    vf = tl.full([], vocab, tl.float32)
    vu = vf * 5.9604644775390625e-08  # V 2^-24
    eps = 4.0 * vu / (1.0 - vu) + 0.0009765625
    r_up = (total + vf * 2.2e-9) * (1.0 + eps)
    delta = (0.5 * eps * r_up + vf * 2.2e-9) * 1.0001
    target_low = top_p * (1.0 - TOP_P_SLACK) * (total - 2.0 * delta) * 0.9999
    return (vu < 0.25) & (total > 0) & ((above + 2.0 * delta) * 1.0001 < target_low)


@triton.jit
def bonus_race_eligible(logits_ptr, draft_probs_ptr, draft_ids_ptr, lengths_ptr, seeds_ptr, offsets_ptr,
                        temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, part_max_ptr, part_arg_ptr, part_sum_ptr,
                        b, vocab, max_draft, num_draft_rows, bonus_rows, PACKED: tl.constexpr,
                        HAS_T: tl.constexpr, HAS_K: tl.constexpr, HAS_MIN_P: tl.constexpr,
                        HAS_DRAFT_PROBS: tl.constexpr, CHUNKS: tl.constexpr, CHUNKS_P2: tl.constexpr):
    """Whether request b takes top-p's early bonus token (chain_bonus_race_kernel): sampled, top-p its only
    filter, its bonus row without +inf logits, and every draft taken by top-p's early acceptance
    (chain_row_accepts_early, as chain_radix_pass_kernel decides it), so that its bonus row emits."""
    n, _, _ = chain_rows(lengths_ptr, b, max_draft, num_draft_rows, bonus_rows, PACKED)
    t, top_k, top_p, min_p = sanitize_params(temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, b, vocab, HAS_T,
                                             HAS_K, True, HAS_MIN_P)
    m = row_max_of_chunks(part_max_ptr, b * (max_draft + 1) + n, CHUNKS, CHUNKS_P2)
    ok = (t > 0) & (top_p < 1.0) & (top_k == 0) & (min_p == 0.0) & (m > float("-inf")) & (m < F32_MAX)
    k = tl.zeros([], tl.int64)
    while ok & (k < n):
        ok = chain_row_accepts_early(logits_ptr, draft_probs_ptr, draft_ids_ptr, lengths_ptr, seeds_ptr, offsets_ptr,
                                     part_max_ptr, part_arg_ptr, part_sum_ptr, b * (max_draft + 1) + k, b, t,
                                     top_k, top_p, min_p, vocab, max_draft, num_draft_rows, bonus_rows, PACKED,
                                     HAS_DRAFT_PROBS, CHUNKS, CHUNKS_P2)
        k += 1
    return ok


@triton.jit(do_not_specialize=["num_draft_rows"])
def chain_bonus_race_kernel(
    logits_ptr, draft_probs_ptr, draft_ids_ptr, lengths_ptr, seeds_ptr, offsets_ptr, temperature_ptr, top_k_ptr,
    top_p_ptr, min_p_ptr, part_max_ptr, part_arg_ptr, part_sum_ptr,
    race_score_ptr,      # float32 workspace [B, RACES]
    race_index_ptr,      # int64 workspace [B, RACES]
    tickets_ptr,         # int32 [B], zero before the launch
    bonus_w_ptr,         # int64 out [B]: the race's winner over every entry of the bonus row, -1: not eligible
    vocab: tl.constexpr, max_draft, num_draft_rows, bonus_rows,
    PACKED: tl.constexpr, HAS_T: tl.constexpr, HAS_K: tl.constexpr, HAS_MIN_P: tl.constexpr,
    HAS_DRAFT_PROBS: tl.constexpr, CHUNKS: tl.constexpr, CHUNKS_P2: tl.constexpr, CHUNK: tl.constexpr,
    BLOCK: tl.constexpr, RACE_GROUP: tl.constexpr,
):
    """Top-p's early bonus token, its race (csrc/logits/logits_kernels.cu's split kernel does the same in one
    launch): for a request whose bonus row emits (bonus_race_eligible), the bonus row's race over every entry,
    p = e / (the sum over every entry), no select (split_race with tau = 0), RACE_GROUP chunks a program (grid
    B x RACES, as chain_walk_race_kernel); the request's last program writes the winner w. Kept by top-p (the
    verdict, chain_bonus_verdict_kernel), w wins the race over the kept entries too: the same random numbers,
    every kept entry's score scaled alike (floating-point near-ties aside, as between backends)."""
    b = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1).to(tl.int64)
    eligible = bonus_race_eligible(logits_ptr, draft_probs_ptr, draft_ids_ptr, lengths_ptr, seeds_ptr, offsets_ptr,
                                   temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, part_max_ptr, part_arg_ptr,
                                   part_sum_ptr, b, vocab, max_draft, num_draft_rows, bonus_rows, PACKED, HAS_T,
                                   HAS_K, HAS_MIN_P, HAS_DRAFT_PROBS, CHUNKS, CHUNKS_P2)
    if eligible:
        n, target_base, _ = chain_rows(lengths_ptr, b, max_draft, num_draft_rows, bonus_rows, PACKED)
        t = tl.full([], 1.0, tl.float32)
        if HAS_T:
            t = tl.minimum(tl.load(temperature_ptr + b), F32_MAX)
        m, _, total = combined_row(part_max_ptr, part_arg_ptr, part_sum_ptr, b * (max_draft + 1) + n, t, CHUNKS,
                                   CHUNKS_P2)
        lo = tl.program_id(1) * (CHUNK * RACE_GROUP)  # int32, as the race's indices
        best, index = split_race(logits_ptr + (target_base + n) * vocab, draft_probs_ptr, -1, False, vocab, m, t,
                                 tl.zeros([], tl.int64), total, tl.load(seeds_ptr + b), tl.load(offsets_ptr + b), n,
                                 PURPOSE_BONUS, lo, CHUNK * RACE_GROUP, HAS_T, False, BLOCK)
        races = (CHUNKS + RACE_GROUP - 1) // RACE_GROUP
        if race_program_is_last(race_score_ptr, race_index_ptr, tickets_ptr, b, c, races, best, index):
            top, final = race_programs_winner(race_score_ptr, race_index_ptr, b, races, CHUNKS_P2)
            tl.store(bonus_w_ptr + b, tl.where(top > 0, final, -1))  # (a row without mass: the full path)
    elif c == 0:
        tl.store(bonus_w_ptr + b, -1)


@triton.jit(do_not_specialize=["num_draft_rows"])
def chain_bonus_verdict_kernel(
    logits_ptr, draft_ids_ptr, lengths_ptr, temperature_ptr, top_p_ptr, part_max_ptr, part_arg_ptr, part_sum_ptr,
    bonus_w_ptr,         # int64 [B] chain_bonus_race_kernel's winners (-1: none)
    part_above_ptr,      # float32 workspace [B, CHUNKS]
    tickets_ptr,         # int32 [B], zero before the launch
    done_ptr,            # int8 out [B]: 1 where the request's outputs are written here (w kept by top-p)
    token_ids_ptr, num_accepted_ptr,
    vocab: tl.constexpr, max_draft, num_draft_rows, bonus_rows,
    PACKED: tl.constexpr, HAS_T: tl.constexpr, CHUNKS: tl.constexpr, CHUNKS_P2: tl.constexpr,
    CHUNK: tl.constexpr, BLOCK: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Top-p's verdict on the early bonus token w (grid B x CHUNKS): each program sums e over its chunk's entries
    with logit >= w's, the request's last one adds the chunks in order and, where top-p surely keeps w
    (top_p_keeps_above), writes the request's outputs (its n drafts, accepted early, then w) and done = 1; the
    filters and the walk then skip the request. Else done = 0: the select decides as before."""
    b = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    w = tl.load(bonus_w_ptr + b)
    if w >= 0:
        n, target_base, draft_base = chain_rows(lengths_ptr, b, max_draft, num_draft_rows, bonus_rows, PACKED)
        t = tl.full([], 1.0, tl.float32)
        if HAS_T:
            t = tl.minimum(tl.load(temperature_ptr + b), F32_MAX)
        row_ptr = logits_ptr + (target_base + n) * vocab
        m = row_max_of_chunks(part_max_ptr, b * (max_draft + 1) + n, CHUNKS, CHUNKS_P2)
        x_w = logit_value(tl.load(row_ptr + w).to(tl.float32))
        above = tl.full([], 0.0, tl.float32)
        for start in range(0, CHUNK, BLOCK):
            idx = c.to(tl.int64) * CHUNK + start + tl.arange(0, BLOCK)
            inside = idx < vocab
            x = load_row(row_ptr, idx, inside)
            above += tl.sum(tl.where(inside & (x >= x_w), tl.exp(scaled_tile(x, m, t)), 0.0), 0)
        tl.store(part_above_ptr + b * CHUNKS + c, above)
        tl.debug_barrier()
        ticket = tl.atomic_add(tickets_ptr + b, 1, sem="acq_rel")
        if ticket == CHUNKS - 1:
            cs = tl.arange(0, CHUNKS_P2)
            above = tl.sum(tl.load(part_above_ptr + b * CHUNKS + cs, mask=cs < CHUNKS, other=0.0, volatile=True), 0)
            _, _, total = combined_row(part_max_ptr, part_arg_ptr, part_sum_ptr, b * (max_draft + 1) + n, t, CHUNKS,
                                       CHUNKS_P2)
            top_p = tl.load(top_p_ptr + b)
            keeps = top_p_keeps_above(above, total, tl.where(top_p < 1.0, tl.maximum(top_p, 0.0), 1.0), vocab)
            if keeps:
                js = tl.arange(0, BLOCK_K).to(tl.int64)
                write_chain_outputs(token_ids_ptr, num_accepted_ptr, token_ids_ptr, token_ids_ptr, draft_ids_ptr, b,
                                    n, n, w, js, js, draft_base, max_draft, vocab, False, False)
            tl.store(done_ptr + b, keeps.to(tl.int8))
    elif c == 0:
        tl.store(done_ptr + b, tl.zeros([], tl.int8))


@triton.jit(do_not_specialize=["num_draft_rows", "step", "passed"])
def chain_radix_pass_kernel(
    logits_ptr, lengths_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr,
    part_max_ptr,        # float32 [rows, CHUNKS] from chain_row_partials_kernel
    hist_ptr,            # float32 [rows, CHUNKS x SPLIT, 16] this pass's histograms (counts or masses) per part
    prefix_ptr,          # int64 [rows] the select's prefix after the picks so far (the row's finisher writes)
    acc_ptr,             # float32 [rows] by count: the rank left; by mass: the mass above the prefix
    goal_ptr,            # float32 [rows] top-p's target mass (stored by the finisher of its pass 0)
    ktau_ptr,            # int64 [rows] top-k's threshold, z's key (its last pass's finisher): top-p's floor
    ptau_ptr,            # int64 [rows] top-p's threshold, z's key (its last pass's finisher)
    tickets_ptr,         # int32 [rows] this launch's, zero before it
    early_ptr,           # int8 [rows] (EARLY) 1: top-p's early acceptance took the row's draft (top-p's pass 0)
    part_arg_ptr, part_sum_ptr,  # (EARLY) chain_row_partials_kernel's, for the row's total
    draft_probs_ptr, draft_ids_ptr, seeds_ptr, offsets_ptr,  # (EARLY) the acceptance test's
    done_ptr,            # int8 [B] (EARLY_BONUS) 1: chain_bonus_verdict_kernel wrote the request's outputs
    passed,              # this launch's pass in its select (from 0)
    vocab: tl.constexpr, max_draft, num_draft_rows, bonus_rows,
    PACKED: tl.constexpr, HAS_T: tl.constexpr, HAS_K: tl.constexpr, HAS_P: tl.constexpr, HAS_MIN_P: tl.constexpr,
    HAS_BONUS: tl.constexpr, TREE: tl.constexpr, BY_MASS: tl.constexpr, PASSES: tl.constexpr,
    EARLY: tl.constexpr, HAS_DRAFT_PROBS: tl.constexpr,
    CHUNKS: tl.constexpr, CHUNKS_P2: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr,
    SPLIT: tl.constexpr = 1, EARLY_BONUS: tl.constexpr = False,
):
    """One pass of the split radix select (BY_MASS: top-p's, else top-k's) over one part of one row (grid rows x
    CHUNKS x SPLIT: a part is CHUNK / SPLIT entries). Every program reads the select's state after the previous
    pass, writes its part's histogram and takes a ticket; the row's last program (the finisher) adds the parts'
    histograms in order and picks the pass's digit (finish_pass), so no program reads more than its own part
    and the state, and the finisher the row's histograms once. EARLY (chain rows, no logprobs, no synthetic
    rates): top-p's first pass decides top-p's early acceptance of the row's draft (chain_row_accepts_early;
    part 0 stores it), and a row it takes runs no pass of top-p's select. EARLY_BONUS: the rows of a request
    top-p's early bonus token decided (done) run none."""
    PARTS: tl.constexpr = CHUNKS * SPLIT
    PARTS_P2: tl.constexpr = CHUNKS_P2 * SPLIT
    PART: tl.constexpr = CHUNK // SPLIT
    j = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    b, used, target_row = split_row(lengths_ptr, j, max_draft, num_draft_rows, bonus_rows, PACKED, HAS_BONUS, TREE)
    if EARLY_BONUS:
        used = used & (tl.load(done_ptr + b) == 0)
    t, top_k, top_p, min_p = sanitize_params(temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, b, vocab, HAS_T,
                                             HAS_K, HAS_P, HAS_MIN_P)
    m = row_max_of_chunks(part_max_ptr, j, CHUNKS, CHUNKS_P2)
    sampled = used & (t > 0) & (m > float("-inf"))
    if BY_MASS:
        active = sampled & (top_p < 1.0)
        if EARLY:
            if active:
                if passed == 0:
                    early = chain_row_accepts_early(logits_ptr, draft_probs_ptr, draft_ids_ptr, lengths_ptr,
                                                    seeds_ptr, offsets_ptr, part_max_ptr, part_arg_ptr, part_sum_ptr,
                                                    j, b, t, top_k, top_p, min_p, vocab, max_draft, num_draft_rows,
                                                    bonus_rows, PACKED, HAS_DRAFT_PROBS, CHUNKS, CHUNKS_P2)
                    if c == 0:
                        tl.store(early_ptr + j, early.to(tl.int8))  # (c: the part)
                else:
                    early = tl.load(early_ptr + j) != 0
                active = active & (early == 0)
    else:
        active = sampled & (top_k > 0)
    if active:
        floor_key = tl.full([], 0, tl.int64)
        if BY_MASS:
            if HAS_K:
                if top_k > 0:  # top-k ran first: its threshold is top-p's floor
                    floor_key = tl.load(ktau_ptr + j)
        prefix = tl.full([], 0, tl.int64)
        if passed > 0:
            prefix = tl.load(prefix_ptr + j)
        hist = radix_histogram(logits_ptr + target_row * vocab, c.to(tl.int64) * PART, vocab, m, t, floor_key, prefix,
                               28 - RADIX_BITS * passed, BY_MASS, PART, BLOCK)
        bins = tl.arange(0, RADIX_BINS)
        tl.store(hist_ptr + (j * PARTS + c) * RADIX_BINS + bins, hist)
        tl.debug_barrier()  # every thread's stores before the ticket
        if tl.atomic_add(tickets_ptr + j, 1, sem="acq_rel") == PARTS - 1:
            if BY_MASS:
                finish_pass(hist_ptr, prefix_ptr, acc_ptr, goal_ptr, ptau_ptr, j, prefix, top_k, top_p, m, t, passed,
                            True, PASSES, PARTS, PARTS_P2)
            else:
                finish_pass(hist_ptr, prefix_ptr, acc_ptr, goal_ptr, ktau_ptr, j, prefix, top_k, top_p, m, t, passed,
                            False, PASSES, PARTS, PARTS_P2)


@triton.jit(do_not_specialize=["num_draft_rows"])
def chain_kept_mass_kernel(
    logits_ptr, lengths_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, part_max_ptr,
    ktau_ptr, ptau_ptr,  # chain_radix_pass_kernel's thresholds: top-k's, top-p's
    tau_ptr,             # int64 out [rows] the kept-key threshold (0: every entry kept; -1: accepted early)
    part_kept_ptr,       # float32 out [rows, CHUNKS] the chunks' kept masses (where tau > 0)
    early_ptr,           # int8 [rows] (EARLY) chain_radix_pass_kernel's early acceptances (rows with top-p on)
    done_ptr,            # int8 [B] (EARLY_BONUS) 1: chain_bonus_verdict_kernel wrote the request's outputs
    vocab: tl.constexpr, max_draft, num_draft_rows, bonus_rows,
    PACKED: tl.constexpr, HAS_T: tl.constexpr, HAS_K: tl.constexpr, HAS_P: tl.constexpr, HAS_MIN_P: tl.constexpr,
    HAS_BONUS: tl.constexpr, TREE: tl.constexpr, EARLY: tl.constexpr, CHUNKS: tl.constexpr,
    CHUNKS_P2: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr, EARLY_BONUS: tl.constexpr = False,
):
    """A row's threshold (row_stats: top-k's, raised by top-p's and by min-p's) and its chunk's kept mass. A row
    whose draft top-p's early acceptance took (EARLY) gets tau = -1 and no kept mass: the walk accepts it.
    EARLY_BONUS: a request top-p's early bonus token decided (done) is not read (the walk skips it)."""
    j = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    b, used, target_row = split_row(lengths_ptr, j, max_draft, num_draft_rows, bonus_rows, PACKED, HAS_BONUS, TREE)
    if EARLY_BONUS:
        used = used & (tl.load(done_ptr + b) == 0)
    t, top_k, top_p, min_p = sanitize_params(temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, b, vocab, HAS_T,
                                             HAS_K, HAS_P, HAS_MIN_P)
    m = row_max_of_chunks(part_max_ptr, j, CHUNKS, CHUNKS_P2)
    tau = tl.full([], 0, tl.int64)
    early = tl.zeros([], tl.int32)
    if EARLY:
        if used & (t > 0) & (m > float("-inf")) & (top_p < 1.0):
            early = (tl.load(early_ptr + j) != 0).to(tl.int32)
    if early != 0:
        tau = tl.full([], -1, tl.int64)
    elif used & (t > 0) & (m > float("-inf")):
        # the selects' thresholds, stored by their last passes' finishers (top-k runs first: its threshold is
        # top-p's floor). A pick of an entry of the row is never 0 as z's key (z >= -inf, whose key is 0x7fffff).
        floor_key = tl.full([], 0, tl.int64)
        if HAS_K:
            if top_k > 0:
                floor_key = tl.load(ktau_ptr + j)
        tau = floor_key
        if HAS_P:
            if top_p < 1.0:
                tau = tl.maximum(tl.load(ptau_ptr + j), floor_key)
        if HAS_MIN_P:
            if min_p > 0.0:
                tau = tl.maximum(tau, order_key(tl.log(min_p)))
        if tau > 0:
            row_ptr = logits_ptr + target_row * vocab
            kept = tl.full([], 0.0, tl.float32)
            for start in range(0, CHUNK, BLOCK):
                idx = c.to(tl.int64) * CHUNK + start + tl.arange(0, BLOCK)
                inside = idx < vocab
                z = scaled_tile(load_row(row_ptr, idx, inside), m, t)
                kept += tl.sum(tl.where(inside & (order_key(z) >= tau), tl.exp(z), 0.0))
            tl.store(part_kept_ptr + j * CHUNKS + c, kept)
    if c == 0:
        tl.store(tau_ptr + j, tau)


@triton.jit(do_not_specialize=["num_draft_rows"])
def chain_walk_race_kernel(
    logits_ptr, draft_probs_ptr, draft_ids_ptr, lengths_ptr, seeds_ptr, offsets_ptr, temperature_ptr,
    part_max_ptr, part_arg_ptr, part_sum_ptr,  # from chain_row_partials_kernel
    tau_ptr,             # int64 [B x (K+1)] kept-key thresholds (HAS_FILTERS: chain_kept_mass_kernel)
    part_kept_ptr,       # float32 [B x (K+1), CHUNKS] the chunks' kept masses (HAS_FILTERS, where tau > 0)
    race_score_ptr,      # float32 workspace [B, RACES]: the race programs' winners' scores
    race_index_ptr,      # int64 workspace [B, RACES]
    tickets_ptr,         # int32 [B], zero before the launch
    token_ids_ptr, num_accepted_ptr, logprobs_ptr, bonus_ptr, rates_ptr,
    done_ptr,            # int8 [B] (EARLY_BONUS) 1: chain_bonus_verdict_kernel wrote the request's outputs
    vocab: tl.constexpr, max_draft, num_draft_rows, bonus_rows,
    PACKED: tl.constexpr, HAS_DRAFT_PROBS: tl.constexpr, HAS_T: tl.constexpr, LOGPROBS: tl.constexpr,
    HAS_BONUS: tl.constexpr, HAS_RATES: tl.constexpr, HAS_FILTERS: tl.constexpr, EARLY: tl.constexpr,
    CHUNKS: tl.constexpr, CHUNKS_P2: tl.constexpr, CHUNK: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK: tl.constexpr, RACE_GROUP: tl.constexpr = 1, EARLY_BONUS: tl.constexpr = False,
):
    """The walk of a request's rows (csrc/logits/logits_cpu.cpp chain_request, with the engine keywords of issue
    #14: HAS_BONUS emits bonus_ptr[b], clamped into [0, V), after a fully accepted chain without reading a bonus
    row, its logprob NaN; HAS_RATES accepts a valid draft k iff u_k < rates[k]) on combined row statistics,
    then this program's RACE_GROUP chunks of the final race (grid B x RACES, RACES = ceil(CHUNKS / RACE_GROUP):
    a program racing more tiles runs fewer first tiles, which always take the exact path); the request's last
    program to finish writes the outputs.
    HAS_FILTERS: a row with a threshold (tau > 0) keeps {key >= tau} and its total is the sum of the chunks'
    kept masses; EARLY: a row with tau = -1 is a draft row whose draft top-p's early acceptance took
    (chain_radix_pass_kernel): accepted. EARLY_BONUS: a request top-p's early bonus token decided (done) is
    skipped (its outputs are written)."""
    b = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1).to(tl.int64)
    if EARLY_BONUS:
        if tl.load(done_ptr + b) != 0:
            return
    n, target_base, draft_base = chain_rows(lengths_ptr, b, max_draft, num_draft_rows, bonus_rows, PACKED)
    seed = tl.load(seeds_ptr + b)
    offset = tl.load(offsets_ptr + b)
    t = tl.full([], 1.0, tl.float32)
    if HAS_T:
        t = tl.load(temperature_ptr + b)
    t = tl.where(t > 0, tl.minimum(t, F32_MAX), 0.0)
    js = tl.arange(0, BLOCK_K).to(tl.int64)
    lps = tl.full([BLOCK_K], float("nan"), tl.float32)

    k = tl.full([], 0, tl.int64)
    final = tl.full([], 0, tl.int64)
    m = tl.full([], 0.0, tl.float32)
    total = tl.full([], 0.0, tl.float32)
    tau = tl.full([], 0, tl.int64)
    x = tl.full([], -1, tl.int64)
    race = tl.full([], 0, tl.int32)  # 1: the final token is this race's (a sampled request's rejection or bonus row)
    searching = 1
    if HAS_BONUS:
        searching = (n > 0).to(tl.int32)  # the bonus row is never entered
    while searching != 0:
        row_ptr = logits_ptr + (target_base + k) * vocab
        m, argmax, total = combined_row(part_max_ptr, part_arg_ptr, part_sum_ptr, b * (max_draft + 1) + k, t,
                                        CHUNKS, CHUNKS_P2)
        if HAS_FILTERS:
            tau, total = filtered_total(tau_ptr, part_kept_ptr, b * (max_draft + 1) + k, total, CHUNKS, CHUNKS_P2)
        is_draft = k < n
        x = tl.load(draft_ids_ptr + draft_base + k, mask=is_draft, other=-1)
        in_vocab = (x >= 0) & (x < vocab)
        x_logit = logit_value(tl.load(row_ptr + x, mask=is_draft & in_vocab, other=float("-inf")).to(tl.float32))
        if t > 0:
            accept = sampled_accept(draft_uniform(seed, offset, k), entry_prob(x_logit, m, t, tau, total), x, k,
                                    is_draft, in_vocab, draft_probs_ptr + (draft_base + k) * vocab, rates_ptr,
                                    HAS_DRAFT_PROBS, HAS_RATES)
            if EARLY:
                accept = accept | (tau < 0)  # accepted early: the test against the kept mass would accept too
            token = x
            race = tl.where(accept, 0, 1).to(tl.int32)
        else:
            if HAS_RATES:
                accept = rate_accept(draft_uniform(seed, offset, k), k, is_draft, in_vocab, rates_ptr)
                token = tl.where(accept, x, argmax)  # an accepted draft need not be the argmax here
            else:
                accept = is_draft & (x == argmax)
                token = argmax
        if LOGPROBS:
            if accept:
                lps = tl.where(js == k, combined_logprob(x_logit, m, t, tau, total), lps)
            else:
                if race == 0:  # greedy: the argmax's logprob
                    lps = tl.where(js == k, row_logprob(row_ptr, token, m, t, tau, total), lps)
        if accept:
            k += 1
            if HAS_BONUS:
                searching = (k < n).to(tl.int32)
        else:
            final = token
            searching = 0

    writer = c == 0
    if race != 0:
        writer, final, lps = final_row_race(logits_ptr, draft_probs_ptr, race_score_ptr, race_index_ptr, tickets_ptr,
                                            b, c, k, n, x, m, t, tau, total, seed, offset, target_base, draft_base,
                                            lps, js, vocab, HAS_T, HAS_DRAFT_PROBS, LOGPROBS, CHUNKS, CHUNKS_P2, CHUNK,
                                            BLOCK, RACE_GROUP)
    if writer:
        write_chain_outputs(token_ids_ptr, num_accepted_ptr, logprobs_ptr, bonus_ptr, draft_ids_ptr, b, n, k, final,
                            lps, js, draft_base, max_draft, vocab, LOGPROBS, HAS_BONUS)


@triton.jit
def final_row_race(logits_ptr, draft_probs_ptr, race_score_ptr, race_index_ptr, tickets_ptr, b, c, k, n, x, m, t, tau,
                   total, seed, offset, target_base, draft_base, lps, js, vocab, HAS_T: tl.constexpr,
                   HAS_DRAFT_PROBS: tl.constexpr, LOGPROBS: tl.constexpr, CHUNKS: tl.constexpr,
                   CHUNKS_P2: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr, RACE_GROUP: tl.constexpr):
    """Race program c's chunks (RACE_GROUP of CHUNK entries from c RACE_GROUP CHUNK) of the race at row k of
    request b: over max(p - q, 0) after a rejected draft x (k < n), over p on the bonus row (and, alone in the
    request's last program, over p once more when the residual has no mass at all); (m, t, tau, total) the
    row's statistics. Returns (writer: this program is the request's last and writes its outputs, the final
    token there, lps with its logprob at k under LOGPROBS)."""
    residual = k < n
    purpose = tl.where(residual, PURPOSE_RESIDUAL, PURPOSE_BONUS)
    row_ptr = logits_ptr + (target_base + k) * vocab
    q_row_ptr = draft_probs_ptr + (draft_base + k) * vocab
    lo = c.to(tl.int32) * (CHUNK * RACE_GROUP)  # int32, as the race's indices
    best, index = split_race(row_ptr, q_row_ptr, x, residual, vocab, m, t, tau, total, seed, offset, k, purpose, lo,
                             CHUNK * RACE_GROUP, HAS_T, HAS_DRAFT_PROBS, BLOCK)
    races = (CHUNKS + RACE_GROUP - 1) // RACE_GROUP
    writer = race_program_is_last(race_score_ptr, race_index_ptr, tickets_ptr, b, c, races, best, index)
    final = tl.full([], 0, tl.int64)
    if writer:
        top, final = race_programs_winner(race_score_ptr, race_index_ptr, b, races, CHUNKS_P2)
        if residual & (top <= 0):  # no residual mass: the race over p, every chunk here
            _, fallback = split_race(row_ptr, q_row_ptr, x, residual & (top > 0), vocab, m, t, tau, total, seed,
                                     offset, k, purpose, 0, CHUNKS * CHUNK, HAS_T, HAS_DRAFT_PROBS, BLOCK)
            final = fallback.to(tl.int64)
        if LOGPROBS:
            lps = tl.where(js == k, row_logprob(row_ptr, final, m, t, tau, total), lps)
    return writer, final, lps


# ------------------------------------------------------------------------------------------------------------
# Chain verification in one launch (no filter tensors, no logprobs, no synthetic rates): chain_fused_kernel.
# Every program first takes its place from a counter (atomic: the order in which programs start). The first
# B x (K+1) x CHUNKS places are chunk programs: a chunk of a split row's partials (as chain_row_partials_kernel
# computes them) and, on a sampled request's bonus row, in the same pass over the logits, the bonus race
# over the chunk (chunk_partials_race; over quads for bfloat16 rows: chunk_partials_race_quads); each then
# counts itself in its request's arrivals. The bonus rows' programs, the longest, take the first places. The
# launcher sizes the chunks from the shapes (fused_chunk: longer with larger batches, as a race restarts in
# every chunk and its first tiles cost the most). The last B x RACES
# places are request programs: each loads what its request's walk reads besides the partials (draft ids,
# their logits and q(x), the acceptance uniforms), waits until every chunk program of the request has
# arrived, walks the rows (every row's test at once: chain_walk_vector) and ends the request: where the walk
# ends on the bonus row, with the chunks' race winners merged (program 0 writes the outputs); where it ends
# at a rejection (or on a bonus row the fused race leaves undecided: a chunk with NaN or infinite logits, a
# row without mass), with its chunks of that row's race (final_row_race, as chain_walk_race_kernel's). Every
# request program computes the same walk from the same data. A request program only ever waits for chunk
# programs, which took earlier places: all of them have started and none of them waits, so there is no
# deadlock whatever the GPU runs at once (under the interpreter, which runs the programs one by one in
# order, every chunk program has finished before the first request program starts).
# ------------------------------------------------------------------------------------------------------------


@triton.jit
def bf16_pairs(row_ptr, lo, vocab, HALF: tl.constexpr):
    """Entries lo .. lo + 2 HALF - 1 of a bfloat16 row (its start 4-byte aligned, vocab even) as 32-bit words: (x_even,
    x_odd, i) float32 [HALF] with x_even[w] entry i[w] = lo + 2 w and x_odd[w] entry i[w] + 1 (past the row:
    -inf). A bfloat16 is the top half of its float32: the conversion is a shift or a mask, one instruction an
    entry (a bfloat16 load converts the odd entry in two)."""
    w = lo // 2 + tl.arange(0, HALF)
    words = tl.load(row_ptr.to(tl.pointer_type(tl.int32)) + w, mask=w < vocab // 2, other=-8323200)  # 2 x -inf
    return (words << 16).to(tl.float32, bitcast=True), (words & -65536).to(tl.float32, bitcast=True), 2 * w


@triton.jit
def chunk_partials_raw(row_ptr, lo, vocab, inv_t, HAS_T: tl.constexpr, PAIRS: tl.constexpr, CHUNK: tl.constexpr,
                       PART_BLOCK: tl.constexpr):
    """chunk_partials without sanitizing the logits: (m, total, first argmax), equal to chunk_partials' where the
    chunk's logits are finite or -inf with at least one finite (up to the sums' rounding); total is NaN
    otherwise (a NaN logit, +inf, or no finite logit: x s - c is NaN somewhere), and the caller then runs
    chunk_partials. Per entry: the load's conversion, a max, one fused multiply-add (x s - c, against c = m s
    rounded once: exp_reference), an ex2 and an add. PAIRS: a bfloat16 row read as pairs (bf16_pairs)."""
    exp2_scale = inv_t * LOG2E
    m = tl.full([], float("-inf"), tl.float32)
    c = m
    total = tl.full([], 0.0, tl.float32)
    best_index = tl.zeros([], tl.int32) + lo
    for start in range(0, CHUNK, PART_BLOCK):
        if PAIRS:
            xe, xo, ie = bf16_pairs(row_ptr, lo + start, vocab, PART_BLOCK // 2)
            tile_max = tl.max(tl.maximum(xe, xo), 0)
        else:
            idx = lo + start + tl.arange(0, PART_BLOCK)
            x = tl.load(row_ptr + idx, mask=idx < vocab, other=float("-inf")).to(tl.float32)
            tile_max = tl.max(x, 0)
        if tile_max > m:
            if HAS_T:
                if PAIRS:
                    best_index = tl.min(tl.where(xe == tile_max, ie, tl.where(xo == tile_max, ie + 1, 0x7FFFFFFF)), 0)
                else:
                    best_index = tl.min(tl.where(x == tile_max, idx, 0x7FFFFFFF), 0)
            total, c, _ = sum_reference_raised(total, c, tile_max, exp2_scale)
            m = tile_max
        if PAIRS:
            total += tl.sum(tl.math.exp2(xe * exp2_scale - c) + tl.math.exp2(xo * exp2_scale - c), 0)
        else:
            total += tl.sum(tl.math.exp2(x * exp2_scale - c), 0)
    return m, total * exp_reference(m, c, exp2_scale), best_index


@triton.jit
def exp_reference(m, c, exp2_scale):
    """2^(c - m s) (s = exp2_scale, c = m s rounded once), within an ulp of 1: the factor that turns a sum of
    2^(x s - c) (one fused multiply-add an entry) into the sum of 2^((x - m) s) that the partials hold. m s - c
    is exactly d = fma(m, s, -c) (a product's rounding error is a float); 2^-d = 1 - d ln 2 to within d^2 (|d|
    is at most an ulp of m s, relative). NaN where m is not finite (as the sums then are)."""
    return 1.0 - (m * exp2_scale - c) * 0.6931471805599453


@triton.jit
def race_chunk_start(lo):
    """A chunk race's state before its first tile: (max, reference, sum, first argmax, best score, its index) =
    (-inf, -inf, 0, lo, -1, lo)."""
    m = tl.full([], float("-inf"), tl.float32)
    return m, m, tl.full([], 0.0, tl.float32), tl.zeros([], tl.int32) + lo, tl.full([], -1.0, tl.float32), \
        tl.zeros([], tl.int32) + lo


@triton.jit
def sum_reference_raised(total, c, tile_max, exp2_scale):
    """A running sum of 2^(x s - c) (c = m s rounded) moved to the reference of a new, larger max tile_max:
    (total 2^(c - c'), c', 2^(c - c')) with c' = tile_max s."""
    c_new = tile_max * exp2_scale
    rescale = tl.math.exp2(c - c_new)
    return total * rescale, c_new, rescale


@triton.jit
def race_reference_raised(total, best, c, tile_max, exp2_scale):
    """sum_reference_raised for a chunk race's running sum and best score (both against 2^c): (total, best, c'),
    best times the same 2^(c - c') while a score (-1, no score yet, stays)."""
    total, c_new, rescale = sum_reference_raised(total, c, tile_max, exp2_scale)
    return total, tl.where(best > 0, best * rescale, best), c_new


@triton.jit
def race_partials_at_max(total, best, m, c, exp2_scale):
    """A chunk race's sum and best score against 2^c turned to the chunk's max m (exp_reference)."""
    to_m = exp_reference(m, c, exp2_scale)
    return total * to_m, tl.where(best > 0, best * to_m, best)


@triton.jit
def chunk_partials_race(row_ptr, lo, vocab, inv_t, seed, offset, position, HAS_T: tl.constexpr, CHUNK: tl.constexpr,
                        RACE_BLOCK: tl.constexpr):
    """chunk_partials_raw and, in the same pass, the bonus race over the chunk: (m, total, first argmax, score,
    index) with score the largest e / -log(u) over the chunk's entries, e = exp2((x - m) inv_t log2(e)) the
    terms of the sum (relative to the chunk's final max m; computed as chunk_partials_raw's, 2^(x s - c) times
    exp_reference at the end), u the bonus uniforms of the entries (purpose
    PURPOSE_BONUS at `position`, philox_tile), index its first entry. That is split_race's race over p = e /
    total, every score scaled by the same 1 / total: the same winner (floating-point near-ties aside, as
    between backends). When a tile raises the running max, the best score so far is rescaled with the sum. An
    entry is ruled out as the probability races rule theirs out (race_tile_update: e < C - A f against the
    best so far, rejection.py race_cut with total 1; the fold then scores the same e): per entry the partials'
    work, the random bits (a quarter Philox block), two instructions of the skip test and its share of the
    tile's OR; a tile with an entry that may still win (the first always, then about one in t of the t-th)
    scores the tile exactly. Meaningful only where total is not NaN (chunk_partials_raw)."""
    exp2_scale = inv_t * LOG2E
    m, c, total, best_index, best, race_index = race_chunk_start(lo)
    for start in range(0, CHUNK, RACE_BLOCK):
        idx = lo + start + tl.arange(0, RACE_BLOCK)
        inside = idx < vocab
        x = tl.load(row_ptr + idx, mask=inside, other=float("-inf")).to(tl.float32)
        bits = philox_tile(seed, offset, position, PURPOSE_BONUS, lo + start, RACE_BLOCK)
        tile_max = tl.max(x, 0)
        if tile_max > m:
            if HAS_T:
                best_index = tl.min(tl.where(x == tile_max, idx, 0x7FFFFFFF), 0)
            total, best, c = race_reference_raised(total, best, c, tile_max, exp2_scale)
            m = tile_max
        e = tl.math.exp2(x * exp2_scale - c)
        total += tl.sum(e, 0)
        best, race_index = race_tile_update(tl.where(inside, e, -1.0), bits, idx, best, race_index, True)
    total, best = race_partials_at_max(total, best, m, c, exp2_scale)
    return m, total, best_index, best, race_index


@triton.jit
def bf16_quads(row_ptr, lo, vocab, GROUPS: tl.constexpr):
    """Entries lo .. lo + 4 GROUPS - 1 of a bfloat16 row (its start 8-byte aligned, vocab a multiple of 4) as
    64-bit words: (x0, x1, x2, x3, i0, inside), x_i[g] float32 entry i0[g] + i = lo + 4 g + i (past the row:
    -inf, inside False). Each quad's entries stay in one thread, as its Philox block does (philox_groups over
    i0 // 4)."""
    g = lo // 4 + tl.arange(0, GROUPS)
    inside = g < vocab // 4
    # 8-byte loads (a warp's still one 256-byte line): in the layout of the random bits, which the compiler
    # would otherwise exchange between threads to meet a 16-byte load's (the select hides the contiguity)
    words = tl.load(row_ptr.to(tl.pointer_type(tl.int64)) + tl.where(inside, g, 0), mask=inside,
                    other=-35747867511423104)  # 4 x -inf
    low = words.to(tl.int32)
    high = (words >> 32).to(tl.int32)
    return ((low << 16).to(tl.float32, bitcast=True), (low & -65536).to(tl.float32, bitcast=True),
            (high << 16).to(tl.float32, bitcast=True), (high & -65536).to(tl.float32, bitcast=True), 4 * g, inside)


@triton.jit
def chunk_partials_race_quads(row_ptr, lo, vocab, inv_t, seed, offset, position, HAS_T: tl.constexpr,
                              CHUNK: tl.constexpr, RACE_BLOCK: tl.constexpr):
    """chunk_partials_race over a bfloat16 row read as quads (bf16_quads: vocab a multiple of 4, the row 8-byte
    aligned), each quad's random bits from its own Philox block in the same thread (philox_groups): the same
    results (up to the sum's order), without the exchange of the random bits between threads that
    philox_tile's layout costs (a round trip through shared memory and four barriers a tile)."""
    GROUPS: tl.constexpr = RACE_BLOCK // 4
    exp2_scale = inv_t * LOG2E
    m, c, total, best_index, best, race_index = race_chunk_start(lo)
    for start in range(0, CHUNK, RACE_BLOCK):
        x0, x1, x2, x3, i0, inside = bf16_quads(row_ptr, lo + start, vocab, GROUPS)
        r0, r1, r2, r3 = philox_groups(seed, offset, position, PURPOSE_BONUS, i0 // 4)
        tile_max = tl.max(tl.maximum(tl.maximum(x0, x1), tl.maximum(x2, x3)), 0)
        if tile_max > m:
            if HAS_T:
                best_index = first_of_quads(x0 == tile_max, x1 == tile_max, x2 == tile_max, x3 == tile_max, i0)
            total, best, c = race_reference_raised(total, best, c, tile_max, exp2_scale)
            m = tile_max
        e0 = tl.math.exp2(x0 * exp2_scale - c)
        e1 = tl.math.exp2(x1 * exp2_scale - c)
        e2 = tl.math.exp2(x2 * exp2_scale - c)
        e3 = tl.math.exp2(x3 * exp2_scale - c)
        total += tl.sum((e0 + e1) + (e2 + e3), 0)
        best, race_index = race_quads_update(e0, e1, e2, e3, r0, r1, r2, r3, i0, inside, best, race_index)
    total, best = race_partials_at_max(total, best, m, c, exp2_scale)
    return m, total, best_index, best, race_index


@triton.jit
def bonus_chunks_winner(part_max_ptr, bonus_score_ptr, bonus_index_ptr, jb, b, exp2_scale, CHUNKS: tl.constexpr,
                        CHUNKS_P2: tl.constexpr):
    """(ok, winner) of the fused bonus race of request b (its bonus row jb): the chunks' best scores rescaled to
    the row's max, the largest, its first index. Not ok where a chunk's race is undecided (NaN: its logits
    were not clean) or no score is positive (a row without mass): the request programs then race the row."""
    cs = tl.arange(0, CHUNKS_P2)
    valid = cs < CHUNKS
    ms = tl.load(part_max_ptr + jb * CHUNKS + cs, mask=valid, other=float("-inf"), volatile=True)
    scores = tl.load(bonus_score_ptr + b * CHUNKS + cs, mask=valid, other=-1.0, volatile=True)
    indices = tl.load(bonus_index_ptr + b * CHUNKS + cs, mask=valid, other=0, volatile=True)
    m = tl.max(ms, 0)
    scaled = tl.where(valid & (scores > 0), scores * tl.math.exp2((ms - m) * exp2_scale), -1.0)
    top = tl.max(scaled, 0)
    winner = tl.min(tl.where(valid & (scaled == top), indices, 0x7FFFFFFF), 0)
    undecided = tl.max(tl.where(valid & (scores != scores), 1, 0), 0)
    return (undecided == 0) & (top > 0) & (m > float("-inf")), winner.to(tl.int64)


@triton.jit
def chain_walk_vector(part_max_ptr, part_arg_ptr, part_sum_ptr, b, n, t, ks, x, x_logit, q_x, u, max_draft,
                      vocab, HAS_BONUS: tl.constexpr, CHUNKS: tl.constexpr, CHUNKS_P2: tl.constexpr):
    """chain_walk_race_kernel's walk of request b (no filters, no rates) with every row's test at once (lanes
    ks = 0 .. BLOCK_K - 1: row k's statistics as combined_row's, its draft x, logit x_logit, q(x) (1 one-hot),
    acceptance uniform u), then the first row whose test fails: (k, final, race, x, m, total) with k the
    accepted drafts, final the token there (a greedy row's argmax, a sampled row's rejected draft), race 1
    where a sampled request's race at row k decides it (a rejection, or the bonus row), x row k's draft (-1 on
    the bonus row), (m, total) row k's statistics. Under HAS_BONUS the walk stops after n accepted drafts (k =
    n, race 0: the bonus id follows)."""
    rows = b * (max_draft + 1) + tl.minimum(ks, n)
    cs = tl.arange(0, CHUNKS_P2)
    at = rows[:, None] * CHUNKS + cs[None, :]
    valid_c = (cs < CHUNKS)[None, :] & (ks >= 0)[:, None]
    ms = tl.load(part_max_ptr + at, mask=valid_c, other=float("-inf"), volatile=True)
    args = tl.load(part_arg_ptr + at, mask=valid_c, other=0, volatile=True)
    sums = tl.load(part_sum_ptr + at, mask=valid_c, other=0.0, volatile=True)
    m = tl.max(ms, 1)
    finite = ms > float("-inf")
    argmax = tl.min(tl.where(finite & (ms == m[:, None]), args, 0x7FFFFFFFFFFFFFFF), 1)
    argmax = tl.where(m > float("-inf"), argmax, 0)
    t1 = tl.where(t > 0, t, 1.0)
    total = tl.sum(tl.where(finite, tl.exp(scaled(ms, m[:, None], t1)) * sums, 0.0), 1)
    is_draft = ks < n
    in_vocab = (x >= 0) & (x < vocab)
    sampled = is_draft & in_vocab & (u * q_x < entry_prob(x_logit, m, t1, 0, total))
    accept = tl.where(t > 0, sampled, is_draft & (x == argmax))
    if HAS_BONUS:
        valid = ks < n
    else:
        valid = ks <= n
    stop = valid & (accept == 0)
    k = tl.min(tl.where(stop, ks, 0x7FFFFFFF), 0)
    found = k != 0x7FFFFFFF
    k = tl.where(found, k, n)
    at_k = ks == k
    final = tl.sum(tl.where(at_k, tl.where(t > 0, x, argmax), 0), 0)
    race = tl.where(found & (t > 0), 1, 0)
    return (k, final, race, tl.sum(tl.where(at_k & is_draft, x, 0), 0) - tl.where(k < n, 0, 1),
            tl.sum(tl.where(at_k, m, 0.0), 0), tl.sum(tl.where(at_k, total, 0.0), 0))


@triton.jit(do_not_specialize=["num_draft_rows", "batch"])
def chain_fused_kernel(
    logits_ptr, draft_probs_ptr, draft_ids_ptr, lengths_ptr, seeds_ptr, offsets_ptr, temperature_ptr,
    part_max_ptr, part_arg_ptr, part_sum_ptr,  # float32 / int64 / float32 workspaces [B x (K+1), CHUNKS]
    bonus_score_ptr,     # float32 workspace [B, CHUNKS]: the bonus row's chunks' race winners (fused race)
    bonus_index_ptr,     # int32 workspace [B, CHUNKS]
    race_score_ptr,      # float32 workspace [B, RACES]: the request programs' race winners
    race_index_ptr,      # int64 workspace [B, RACES]
    counters_ptr,        # int32 [1 + 2 B], zero before the launch: places, arrivals, race tickets
    token_ids_ptr, num_accepted_ptr, bonus_ptr,
    vocab: tl.constexpr, max_draft, num_draft_rows, bonus_rows, batch,
    PACKED: tl.constexpr, HAS_DRAFT_PROBS: tl.constexpr, HAS_T: tl.constexpr, HAS_BONUS: tl.constexpr,
    CHUNKS: tl.constexpr, CHUNKS_P2: tl.constexpr, CHUNK: tl.constexpr, PART_BLOCK: tl.constexpr,
    RACE_BLOCK: tl.constexpr, BLOCK: tl.constexpr, BLOCK_K: tl.constexpr, RACE_GROUP: tl.constexpr,
    RACE_CHUNKS: tl.constexpr, RACE_CHUNKS_P2: tl.constexpr, RACE_CHUNK: tl.constexpr,
    PAIRS: tl.constexpr = False, QUADS: tl.constexpr = False,
):
    """Chain verification of B requests in one launch (see the section's comment): grid B x (K+1) x CHUNKS +
    B x RACES programs, RACES = ceil(RACE_CHUNKS / RACE_GROUP): the request programs' race after a rejection
    runs over chunks of RACE_CHUNK entries (RACE_GROUP of them a program), the partials' chunks are CHUNK.
    Outputs as chain_walk_race_kernel's. PAIRS: bfloat16 logits read as 32-bit pairs (bf16_pairs: vocab even,
    rows 4-byte aligned); QUADS: the bonus race over quads (bf16_quads: vocab a multiple of 4, rows 8-byte
    aligned)."""
    place = tl.atomic_add(counters_ptr, 1, sem="relaxed")
    chunk_programs = batch * (max_draft + 1) * CHUNKS
    if place < chunk_programs:
        fused_chunk_program(logits_ptr, lengths_ptr, seeds_ptr, offsets_ptr, temperature_ptr, part_max_ptr,
                            part_arg_ptr, part_sum_ptr, bonus_score_ptr, bonus_index_ptr, counters_ptr, place, vocab,
                            max_draft, num_draft_rows, bonus_rows, batch, PACKED, HAS_T, HAS_BONUS, CHUNKS, CHUNK,
                            PART_BLOCK, RACE_BLOCK, PAIRS, QUADS)
    else:
        fused_request_program(logits_ptr, draft_probs_ptr, draft_ids_ptr, lengths_ptr, seeds_ptr, offsets_ptr,
                              temperature_ptr, part_max_ptr, part_arg_ptr, part_sum_ptr, bonus_score_ptr,
                              bonus_index_ptr, race_score_ptr, race_index_ptr, counters_ptr, token_ids_ptr,
                              num_accepted_ptr, bonus_ptr, place - chunk_programs, vocab, max_draft, num_draft_rows,
                              bonus_rows, batch, PACKED, HAS_DRAFT_PROBS, HAS_T, HAS_BONUS, CHUNKS, CHUNKS_P2,
                              BLOCK, BLOCK_K, RACE_GROUP, RACE_CHUNKS, RACE_CHUNKS_P2, RACE_CHUNK)


@triton.jit
def request_temperature(temperature_ptr, b, HAS_T: tl.constexpr):
    """Request b's temperature as the walk takes it: 0 (greedy) unless positive, at most the largest float."""
    t = tl.full([], 1.0, tl.float32)
    if HAS_T:
        t = tl.load(temperature_ptr + b)
    return tl.where(t > 0, tl.minimum(t, F32_MAX), 0.0)


@triton.jit
def fused_chunk_program(logits_ptr, lengths_ptr, seeds_ptr, offsets_ptr, temperature_ptr, part_max_ptr, part_arg_ptr,
                        part_sum_ptr, bonus_score_ptr, bonus_index_ptr, counters_ptr, place, vocab, max_draft,
                        num_draft_rows, bonus_rows, batch, PACKED: tl.constexpr, HAS_T: tl.constexpr,
                        HAS_BONUS: tl.constexpr, CHUNKS: tl.constexpr, CHUNK: tl.constexpr, PART_BLOCK: tl.constexpr,
                        RACE_BLOCK: tl.constexpr, PAIRS: tl.constexpr, QUADS: tl.constexpr):
    """Chunk program `place` of chain_fused_kernel, chunk place % CHUNKS of a row: the first B x CHUNKS places
    take every request's row n (its last, where a sampled request's bonus race runs: the longest programs
    start first, so none of them is left running alone at the end), the others the request's other K rows in
    order (request b = r // K, r = place // CHUNKS - B; its row r % K, past n one further). A row the walk can
    never enter is not read; its programs only arrive."""
    c = place % CHUNKS
    r = (place // CHUNKS).to(tl.int64)
    first = r < batch
    per_request = tl.maximum(max_draft, 1)  # (K = 0: every place is a first one)
    b = tl.where(first, r, (r - batch) // per_request)
    n, target_base, _ = chain_rows(lengths_ptr, b, max_draft, num_draft_rows, bonus_rows, PACKED)
    k = tl.where(first, n, (r - batch) % per_request)
    k = tl.where(first | (k < n), k, k + 1)
    j = b * (max_draft + 1) + k
    if HAS_BONUS:
        used = k < n
    else:
        used = k <= n
    if used:
        t = request_temperature(temperature_ptr, b, HAS_T)
        inv_t = tl.where(t > 0, tl.math.div_rn(1.0, tl.where(t > 0, t, 1.0)), 1.0)
        row_ptr = logits_ptr + (target_base + k) * vocab
        lo = c * CHUNK
        score = tl.full([], 0.0, tl.float32)
        index = tl.zeros([], tl.int32)
        racing = (k == n) & (t > 0)  # a sampled request's bonus row (with HAS_BONUS never entered: not used)
        if racing:
            if QUADS:
                m, total, best_index, score, index = chunk_partials_race_quads(
                    row_ptr, lo, vocab, inv_t, tl.load(seeds_ptr + b), tl.load(offsets_ptr + b), n, HAS_T, CHUNK,
                    RACE_BLOCK)
            else:
                m, total, best_index, score, index = chunk_partials_race(
                    row_ptr, lo, vocab, inv_t, tl.load(seeds_ptr + b), tl.load(offsets_ptr + b), n, HAS_T, CHUNK,
                    RACE_BLOCK)
        else:
            m, total, best_index = chunk_partials_raw(row_ptr, lo, vocab, inv_t, HAS_T, PAIRS, CHUNK, PART_BLOCK)
        if total != total:  # a NaN or +inf logit, or none finite: the sanitized pass, the race undecided
            m, total, best_index = chunk_partials(row_ptr, lo, vocab, inv_t, HAS_T, CHUNK, PART_BLOCK)
            score = tl.full([], float("nan"), tl.float32)
        at = j * CHUNKS + c
        tl.store(part_max_ptr + at, m)
        tl.store(part_arg_ptr + at, best_index.to(tl.int64))
        tl.store(part_sum_ptr + at, total)
        if racing:
            tl.store(bonus_score_ptr + b * CHUNKS + c, score)
            tl.store(bonus_index_ptr + b * CHUNKS + c, index)
    tl.debug_barrier()  # every thread's stores before the arrival
    tl.atomic_add(counters_ptr + 1 + b, 1, sem="release")


@triton.jit
def fused_request_program(logits_ptr, draft_probs_ptr, draft_ids_ptr, lengths_ptr, seeds_ptr, offsets_ptr,
                          temperature_ptr, part_max_ptr, part_arg_ptr, part_sum_ptr, bonus_score_ptr, bonus_index_ptr,
                          race_score_ptr, race_index_ptr, counters_ptr, token_ids_ptr, num_accepted_ptr, bonus_ptr, r,
                          vocab, max_draft, num_draft_rows, bonus_rows, batch, PACKED: tl.constexpr,
                          HAS_DRAFT_PROBS: tl.constexpr, HAS_T: tl.constexpr, HAS_BONUS: tl.constexpr,
                          CHUNKS: tl.constexpr, CHUNKS_P2: tl.constexpr, BLOCK: tl.constexpr, BLOCK_K: tl.constexpr,
                          RACE_GROUP: tl.constexpr, RACE_CHUNKS: tl.constexpr, RACE_CHUNKS_P2: tl.constexpr,
                          RACE_CHUNK: tl.constexpr):
    """Request program r of chain_fused_kernel: program c = r % RACES of request b = r // RACES (its race's
    chunks: RACE_GROUP of RACE_CHUNK entries)."""
    races = (RACE_CHUNKS + RACE_GROUP - 1) // RACE_GROUP
    b = (r // races).to(tl.int64)
    c = (r % races).to(tl.int64)
    n, target_base, draft_base = chain_rows(lengths_ptr, b, max_draft, num_draft_rows, bonus_rows, PACKED)
    t = request_temperature(temperature_ptr, b, HAS_T)
    seed = tl.load(seeds_ptr + b)
    offset = tl.load(offsets_ptr + b)
    # what the walk reads besides the partials, loaded while the chunk programs finish
    ks = tl.arange(0, BLOCK_K).to(tl.int64)
    is_draft = ks < n
    x = tl.load(draft_ids_ptr + draft_base + ks, mask=is_draft, other=-1)
    in_vocab = (x >= 0) & (x < vocab)
    row_ptrs = logits_ptr + (target_base + tl.minimum(ks, n)) * vocab
    x_logit = logit_value(tl.load(row_ptrs + x, mask=is_draft & in_vocab, other=float("-inf")).to(tl.float32))
    if HAS_DRAFT_PROBS:
        q_x = tl.load(draft_probs_ptr + (draft_base + ks) * vocab + x, mask=is_draft & in_vocab, other=0.0)
        q_x = q_x.to(tl.float32)
        q_x = tl.where(q_x > 0, q_x, 0.0)
    else:
        q_x = tl.full([BLOCK_K], 1.0, tl.float32)
    u = bits_to_uniform(philox_bits(seed, offset, ks, PURPOSE_ACCEPT, tl.zeros([BLOCK_K], tl.int64)))
    arrived = tl.atomic_add(counters_ptr + 1 + b, 0, sem="acquire")
    while arrived < (max_draft + 1) * CHUNKS:  # the request's chunk programs all started before this one
        arrived = tl.atomic_add(counters_ptr + 1 + b, 0, sem="acquire")
    k, final, race, x_k, m, total = chain_walk_vector(part_max_ptr, part_arg_ptr, part_sum_ptr, b, n, t, ks, x,
                                                      x_logit, q_x, u, max_draft, vocab, HAS_BONUS, CHUNKS, CHUNKS_P2)
    if (race != 0) & (k == n):
        t1 = tl.where(t > 0, t, 1.0)
        ok, winner = bonus_chunks_winner(part_max_ptr, bonus_score_ptr, bonus_index_ptr, b * (max_draft + 1) + n, b,
                                         tl.math.div_rn(1.0, t1) * LOG2E, CHUNKS, CHUNKS_P2)
        if ok:
            final = winner
            race = 0
    writer = c == 0
    if race != 0:
        writer, final, _ = final_row_race(
            logits_ptr, draft_probs_ptr, race_score_ptr, race_index_ptr, counters_ptr + 1 + batch, b, c, k, n, x_k, m,
            t, tl.zeros([], tl.int64), total, seed, offset, target_base, draft_base, ks.to(tl.float32), ks, vocab,
            HAS_T, HAS_DRAFT_PROBS, False, RACE_CHUNKS, RACE_CHUNKS_P2, RACE_CHUNK, BLOCK, RACE_GROUP)
    if writer:
        write_chain_outputs(token_ids_ptr, num_accepted_ptr, token_ids_ptr, bonus_ptr, draft_ids_ptr, b, n, k, final,
                            ks, ks, draft_base, max_draft, vocab, False, HAS_BONUS)
