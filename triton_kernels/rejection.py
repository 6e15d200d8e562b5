"""Chain rejection sampling in Triton (DESIGN.md §5.2), the same semantics and
random numbers as csrc/sampling (one program per request).

Each program: the acceptance tests of all drafts at once (one uniform each),
the first rejection by a min-reduction, then a single exponential race over
one row (residual at the first rejection, or the bonus row), tiled over the
vocabulary. Greedy requests walk rows with a tiled argmax until the first
mismatch. Races and argmaxes keep per-lane running bests (one tile-wide reduction per
row); one Philox block serves 4 consecutive entries (philox_tile). `vocab` is
specialized (divisible by 16: aligned rows, vectorized loads).
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
    vocab: tl.constexpr,  # fixed per model: specialized (aligned rows, vectorized loads, static loop bounds)
    max_draft,
    num_draft_rows,
    PACKED: tl.constexpr,
    HAS_DRAFT_PROBS: tl.constexpr,
    HAS_GREEDY: tl.constexpr,
    BLOCK_K: tl.constexpr,   # power of two >= K + 1
    BLOCK: tl.constexpr,     # vocab tile
):
    b = tl.program_id(0).to(tl.int64)
    # Rows of request b, clamped so malformed lengths never address outside the inputs.
    if PACKED:
        lo = tl.minimum(tl.maximum(tl.load(lengths_ptr + b), 0), num_draft_rows)
        hi = tl.minimum(tl.maximum(tl.load(lengths_ptr + b + 1), lo), num_draft_rows)
        n = tl.minimum(hi - lo, max_draft)
        target_base = lo + b
        draft_base = lo
    else:
        n = tl.minimum(tl.maximum(tl.load(lengths_ptr + b), 0), max_draft)
        target_base = b * (max_draft + 1)
        draft_base = b * max_draft
    seed = tl.load(seeds_ptr + b)
    offset = tl.load(offsets_ptr + b)
    greedy = 0
    if HAS_GREEDY:
        greedy = tl.load(greedy_ptr + b).to(tl.int32)

    ks = tl.arange(0, BLOCK_K).to(tl.int64)
    in_draft = ks < n
    x = tl.load(draft_ids_ptr + draft_base + ks, mask=in_draft, other=-1)

    if greedy != 0:
        k = tl.full([], 0, tl.int64)
        accepted = n
        final = tl.full([], 0, tl.int64)
        searching = 1
        while searching != 0:
            best = row_argmax(target_ptr + (target_base + k) * vocab, vocab, BLOCK)
            x_k = tl.load(draft_ids_ptr + draft_base + k, mask=k < n, other=-1)
            stop = (k >= n) | (x_k != best)
            accepted = tl.where(stop, k, accepted)
            final = tl.where(stop, best, final)
            searching = tl.where(stop, 0, 1)
            k += 1
    else:
        in_vocab = (x >= 0) & (x < vocab)
        u = bits_to_uniform(philox_bits(seed, offset, ks, PURPOSE_ACCEPT, tl.zeros([BLOCK_K], tl.int64)))
        p_x = tl.load(target_ptr + (target_base + ks) * vocab + x, mask=in_draft & in_vocab, other=0.0)
        if HAS_DRAFT_PROBS:
            q_x = tl.load(draft_probs_ptr + (draft_base + ks) * vocab + x, mask=in_draft & in_vocab, other=0.0)
            q_x = prob_mass(q_x.to(tl.float32))
        else:
            q_x = tl.full([BLOCK_K], 1.0, tl.float32)
        ok = in_vocab & (u * q_x < prob_mass(p_x.to(tl.float32)))
        accepted = tl.min(tl.where(in_draft & ~ok, ks, n), 0)
        residual = accepted < n
        x_rejected = tl.load(draft_ids_ptr + draft_base + accepted, mask=residual, other=-1)
        final = row_race(target_ptr + (target_base + accepted) * vocab,
                         draft_probs_ptr + (draft_base + accepted) * vocab,
                         x_rejected, residual, vocab, seed, offset, accepted, HAS_DRAFT_PROBS, BLOCK)

    js = tl.arange(0, BLOCK_K).to(tl.int64)
    out = tl.where(js < accepted, x, tl.where(js == accepted, final, -1))
    tl.store(token_ids_ptr + b * (max_draft + 1) + js, out, mask=js <= max_draft)
    tl.store(num_accepted_ptr + b, accepted.to(tl.int32))
