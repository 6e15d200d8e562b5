"""Chain rejection sampling in Triton (DESIGN.md §5.2), the same semantics and
random numbers as csrc/sampling (one program per request).

Each program: the acceptance tests of all drafts at once (one uniform each),
the first rejection by a min-reduction, then a single exponential race over
one row (residual at the first rejection, or the bonus row), tiled over the
vocabulary. Greedy requests walk rows with a tiled argmax until the first
mismatch. Races and argmaxes keep per-lane running bests (one tile-wide reduction per
row); one Philox block serves 4 consecutive entries (philox_tile). `vocab` is
specialized (divisible by 16: aligned rows, vectorized loads).

Engine keywords (issue #14), each a constexpr so that a launch without them compiles
to the same code: HAS_BONUS_IDS (a fully accepted request emits its given id, clamped
into [0, V-1], and its bonus row is never read; BONUS_ROWS=False when the target has
none), SYNTHETIC (accept draft k iff u_k < rate[k], greedy requests too, which then
take the argmax of the one row they need).
"""

import triton
import triton.language as tl

from .philox import PURPOSE_ACCEPT, PURPOSE_BONUS, PURPOSE_RESIDUAL, bits_to_uniform, exp_noise, philox_bits, philox_tile


@triton.jit
def prob_mass(p):
    """NaN and negative probabilities count as zero mass."""
    return tl.where(p > 0, p, 0.0)


@triton.jit
def lane_argmax_update(score, idx, best, best_index):
    """Fold one tile into per-lane running (best, best_index) [BLOCK]: a lane sees its
    indices in increasing order, so a strictly larger score keeps the first index on ties."""
    better = score > best
    return tl.where(better, score, best), tl.where(better, idx, best_index)


@triton.jit
def lanes_argmax(best, best_index):
    """(largest score, its first index) over the lanes: the one tile-wide reduction of a row."""
    top = tl.max(best, 0)
    return top, tl.min(tl.where(best == top, best_index, 0x7FFFFFFF), 0)


@triton.jit
def row_argmax(row_ptr, vocab, BLOCK: tl.constexpr):
    """argmax of prob_mass over one row, first index on ties (int64 scalar).

    Entries past the row load 0: they never win, entry 0 has at least that score
    and a smaller index."""
    offs = tl.arange(0, BLOCK)
    best = tl.full([BLOCK], -1.0, tl.float32)
    best_index = tl.zeros([BLOCK], tl.int32)
    for start in range(0, vocab, BLOCK):
        idx = start + offs
        p = tl.load(row_ptr + idx, mask=idx < vocab, other=0.0).to(tl.float32)
        best, best_index = lane_argmax_update(prob_mass(p), idx, best, best_index)
    _, index = lanes_argmax(best, best_index)
    return index.to(tl.int64)


@triton.jit
def race_pass(p_row_ptr, q_row_ptr, draft, use_q, vocab, seed, offset, position, purpose, HAS_Q: tl.constexpr,
              BLOCK: tl.constexpr):
    """Exponential race over max(p - q, 0) if `use_q` (q one-hot at `draft` without HAS_Q), else over p:
    (best score, first index of it). Scores mass / noise, rounded to nearest as the C++ and CUDA kernels;
    0 without mass (0 / noise); entries past the row load 0 and never win (see row_argmax)."""
    offs = tl.arange(0, BLOCK)
    best = tl.full([BLOCK], -1.0, tl.float32)
    best_index = tl.zeros([BLOCK], tl.int32)
    q_end = tl.where(use_q, vocab, 0)   # q entries read: [0, q_end)
    q_at = tl.where(use_q, draft, -1)   # one-hot q: its entry (-1: none)
    for start in range(0, vocab, BLOCK):
        idx = start + offs
        mass = prob_mass(tl.load(p_row_ptr + idx, mask=idx < vocab, other=0.0).to(tl.float32))
        if HAS_Q:
            # Masks from one comparison: a block & a scalar bool is no mask in triton 3.9's interpreter.
            q = prob_mass(tl.load(q_row_ptr + idx, mask=idx < q_end, other=0.0).to(tl.float32))
        else:
            q = tl.where(idx == q_at, 1.0, 0.0)
        diff = mass - q
        score = tl.math.div_rn(tl.where(diff > 0, diff, 0.0),
                               exp_noise(philox_tile(seed, offset, position, purpose, start, BLOCK)))
        best, best_index = lane_argmax_update(score, idx, best, best_index)
    return lanes_argmax(best, best_index)


@triton.jit
def row_race(p_row_ptr, q_row_ptr, draft, residual, vocab, seed, offset, position, HAS_Q: tl.constexpr,
             BLOCK: tl.constexpr):
    """Exponential race over max(p - q, 0) when `residual` (falling back to p if
    it has no mass; q one-hot at `draft` without HAS_Q), over p otherwise (int64 scalar).
    One race per entry; the fallback reruns the row with the same noise."""
    purpose = tl.where(residual, PURPOSE_RESIDUAL, PURPOSE_BONUS)
    best, index = race_pass(p_row_ptr, q_row_ptr, draft, residual, vocab, seed, offset, position, purpose,
                            HAS_Q, BLOCK)
    if residual & (best <= 0):
        best, index = race_pass(p_row_ptr, q_row_ptr, draft, residual & (best > 0), vocab, seed, offset,
                                position, purpose, HAS_Q, BLOCK)
    return index.to(tl.int64)


@triton.jit
def _race_at(target_ptr, draft_probs_ptr, draft_ids_ptr, target_base, draft_base, accepted, residual, vocab, seed,
             offset, HAS_Q: tl.constexpr, BLOCK: tl.constexpr):
    """The token emitted at position `accepted`: the race over the residual after its rejected draft
    (`residual`), else the bonus race over the row."""
    x_rejected = tl.load(draft_ids_ptr + draft_base + accepted, mask=residual, other=-1)
    return row_race(target_ptr + (target_base + accepted) * vocab, draft_probs_ptr + (draft_base + accepted) * vocab,
                    x_rejected, residual, vocab, seed, offset, accepted, HAS_Q, BLOCK)


@triton.jit(do_not_specialize=["num_draft_rows"])
def rejection_sample_kernel(
    target_ptr,          # [rows, V] probabilities
    draft_probs_ptr,     # [draft rows, V] (any valid pointer without HAS_DRAFT_PROBS)
    draft_ids_ptr,       # int64 [draft rows]
    lengths_ptr,         # int64: num_draft_tokens [B] (padded) or cu_num_draft_tokens [B+1] (packed)
    seeds_ptr,           # int64 [B]
    offsets_ptr,         # int64 [B]
    greedy_ptr,          # bool [B] (any valid pointer without HAS_GREEDY)
    token_ids_ptr,       # int64 out [B, K+1]
    num_accepted_ptr,    # int32 out [B]
    bonus_ids_ptr,       # int64 [B] (any valid pointer without HAS_BONUS_IDS)
    rates_ptr,           # float32 [R >= K] (any valid pointer without SYNTHETIC)
    vocab: tl.constexpr,  # fixed per model: specialized (aligned rows, vectorized loads, static loop bounds)
    max_draft,
    num_draft_rows,
    PACKED: tl.constexpr,
    HAS_DRAFT_PROBS: tl.constexpr,
    HAS_GREEDY: tl.constexpr,
    HAS_BONUS_IDS: tl.constexpr,
    BONUS_ROWS: tl.constexpr,  # whether the target holds a bonus row per request (False only with HAS_BONUS_IDS)
    SYNTHETIC: tl.constexpr,
    BLOCK_K: tl.constexpr,   # power of two >= K + 1
    BLOCK: tl.constexpr,     # vocab tile
):
    b = tl.program_id(0).to(tl.int64)
    # Rows of request b, clamped so malformed lengths never address outside the inputs.
    if PACKED:
        lo = tl.minimum(tl.maximum(tl.load(lengths_ptr + b), 0), num_draft_rows)
        hi = tl.minimum(tl.maximum(tl.load(lengths_ptr + b + 1), lo), num_draft_rows)
        n = tl.minimum(hi - lo, max_draft)
        if BONUS_ROWS:
            target_base = lo + b
        else:
            target_base = lo
        draft_base = lo
    else:
        n = tl.minimum(tl.maximum(tl.load(lengths_ptr + b), 0), max_draft)
        if BONUS_ROWS:
            target_base = b * (max_draft + 1)
        else:
            target_base = b * max_draft
        draft_base = b * max_draft
    seed = tl.load(seeds_ptr + b)
    offset = tl.load(offsets_ptr + b)
    greedy = 0
    if HAS_GREEDY:
        greedy = tl.load(greedy_ptr + b).to(tl.int32)

    ks = tl.arange(0, BLOCK_K).to(tl.int64)
    in_draft = ks < n
    x = tl.load(draft_ids_ptr + draft_base + ks, mask=in_draft, other=-1)
    walk = greedy != 0  # greedy verification walks the argmaxes of the rows
    if SYNTHETIC:
        walk = False  # every request takes the synthetic test

    if walk:
        k = tl.full([], 0, tl.int64)
        accepted = n
        final = tl.full([], 0, tl.int64)
        searching = 1
        if HAS_BONUS_IDS:  # the bonus row is never read: stop after the last draft row
            final = tl.minimum(tl.maximum(tl.load(bonus_ids_ptr + b), 0), vocab - 1)
            searching = tl.where(n > 0, 1, 0)
        while searching != 0:
            best = row_argmax(target_ptr + (target_base + k) * vocab, vocab, BLOCK)
            x_k = tl.load(draft_ids_ptr + draft_base + k, mask=k < n, other=-1)
            stop = (k >= n) | (x_k != best)
            accepted = tl.where(stop, k, accepted)
            final = tl.where(stop, best, final)
            searching = tl.where(stop, 0, 1)
            k += 1
            if HAS_BONUS_IDS:
                searching = tl.where(k >= n, 0, searching)
    else:
        in_vocab = (x >= 0) & (x < vocab)
        u = bits_to_uniform(philox_bits(seed, offset, ks, PURPOSE_ACCEPT, tl.zeros([BLOCK_K], tl.int64)))
        if SYNTHETIC:
            # Masks from one comparison (see race_pass): in_draft alone, then in_vocab in `ok`.
            rate = tl.load(rates_ptr + ks, mask=in_draft, other=0.0)
            ok = in_vocab & (u < rate)
        else:
            p_x = tl.load(target_ptr + (target_base + ks) * vocab + x, mask=in_draft & in_vocab, other=0.0)
            if HAS_DRAFT_PROBS:
                q_x = tl.load(draft_probs_ptr + (draft_base + ks) * vocab + x, mask=in_draft & in_vocab, other=0.0)
                q_x = prob_mass(q_x.to(tl.float32))
            else:
                q_x = tl.full([BLOCK_K], 1.0, tl.float32)
            ok = in_vocab & (u * q_x < prob_mass(p_x.to(tl.float32)))
        accepted = tl.min(tl.where(in_draft & ~ok, ks, n), 0)
        residual = accepted < n
        argmax_only = False
        if SYNTHETIC:
            argmax_only = greedy != 0  # a greedy request's correction (or bonus) is an argmax
        if HAS_BONUS_IDS:
            final = tl.minimum(tl.maximum(tl.load(bonus_ids_ptr + b), 0), vocab - 1)
            if residual:  # else the given id: the bonus row is never read
                if argmax_only:
                    final = row_argmax(target_ptr + (target_base + accepted) * vocab, vocab, BLOCK)
                else:
                    final = _race_at(target_ptr, draft_probs_ptr, draft_ids_ptr, target_base, draft_base,
                                     accepted, residual, vocab, seed, offset, HAS_DRAFT_PROBS, BLOCK)
        elif argmax_only:
            final = row_argmax(target_ptr + (target_base + accepted) * vocab, vocab, BLOCK)
        else:
            final = _race_at(target_ptr, draft_probs_ptr, draft_ids_ptr, target_base, draft_base, accepted,
                             residual, vocab, seed, offset, HAS_DRAFT_PROBS, BLOCK)

    js = tl.arange(0, BLOCK_K).to(tl.int64)
    out = tl.where(js < accepted, x, tl.where(js == accepted, final, -1))
    tl.store(token_ids_ptr + b * (max_draft + 1) + js, out, mask=js <= max_draft)
    tl.store(num_accepted_ptr + b, accepted.to(tl.int32))
