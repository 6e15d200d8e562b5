"""Chain rejection sampling in Triton (DESIGN.md §5.2), the same semantics and
random numbers as csrc/sampling (one program per request).

Each program: the acceptance tests of all drafts at once (one uniform each),
the first rejection by a min-reduction, then a single exponential race over
one row (residual at the first rejection, or the bonus row), tiled over the
vocabulary. Greedy requests walk rows with a tiled argmax until the first
mismatch. The Philox block is evaluated per entry (4x the CUDA kernel's RNG
arithmetic, the same numbers).
"""

import triton
import triton.language as tl

from .philox import PURPOSE_ACCEPT, PURPOSE_BONUS, PURPOSE_RESIDUAL, bits_to_uniform, exp_noise, philox_bits


@triton.jit
def prob_mass(p):
    """NaN and negative probabilities count as zero mass."""
    return tl.where(p > 0, p, 0.0)


@triton.jit
def race_scores(mass, noise, inside):
    """Exponential-race scores of a tile: mass / noise (round-to-nearest, as the C++ and CUDA
    kernels), 0 without mass, -1 outside the row (never wins)."""
    return tl.where(inside, tl.where(mass > 0, tl.math.div_rn(mass, noise), 0.0), -1.0)


@triton.jit
def tile_argmax_update(score, idx, best, best_index):
    """Fold one tile into a running (best, best_index): first index on ties, earlier tiles win ties."""
    tile_best = tl.max(score, 0)
    tile_index = tl.min(tl.where(score == tile_best, idx, 0x7FFFFFFFFFFFFFFF), 0)
    better = tile_best > best
    return tl.where(better, tile_best, best), tl.where(better, tile_index, best_index)


@triton.jit
def row_argmax(row_ptr, vocab, BLOCK: tl.constexpr):
    """argmax of prob_mass over one row, first index on ties."""
    best_score = tl.full([], -1.0, tl.float32)
    best_index = tl.full([], 0, tl.int64)
    for start in range(0, vocab, BLOCK):
        idx = start + tl.arange(0, BLOCK).to(tl.int64)
        inside = idx < vocab
        p = tl.load(row_ptr + idx, mask=inside, other=0.0).to(tl.float32)
        score = tl.where(inside, prob_mass(p), -1.0)
        best_score, best_index = tile_argmax_update(score, idx, best_score, best_index)
    return best_index


@triton.jit
def row_race(p_row_ptr, q_row_ptr, draft, residual, vocab, seed, offset, position, HAS_Q: tl.constexpr,
             BLOCK: tl.constexpr):
    """Exponential race over max(p - q, 0) when `residual` (falling back to p if
    it has no mass; q one-hot at `draft` without HAS_Q), over p otherwise."""
    purpose = tl.where(residual, PURPOSE_RESIDUAL, PURPOSE_BONUS)
    best_p = tl.full([], -1.0, tl.float32)
    best_p_index = tl.full([], 0, tl.int64)
    best_r = tl.full([], -1.0, tl.float32)
    best_r_index = tl.full([], 0, tl.int64)
    for start in range(0, vocab, BLOCK):
        idx = start + tl.arange(0, BLOCK).to(tl.int64)
        inside = idx < vocab
        p = tl.load(p_row_ptr + idx, mask=inside, other=0.0).to(tl.float32)
        if HAS_Q:
            q = tl.load(q_row_ptr + idx, mask=inside & residual, other=0.0).to(tl.float32)
        else:
            q = tl.where(idx == draft, 1.0, 0.0)
        mass = prob_mass(p)
        noise = tl.where(mass > 0, exp_noise(philox_bits(seed, offset, position, purpose, idx)), 1.0)
        score_p = race_scores(mass, noise, inside)
        diff = mass - prob_mass(q)
        score_r = race_scores(tl.where(diff > 0, diff, 0.0), noise, inside)
        best_p, best_p_index = tile_argmax_update(score_p, idx, best_p, best_p_index)
        best_r, best_r_index = tile_argmax_update(score_r, idx, best_r, best_r_index)
    return tl.where(residual & (best_r > 0), best_r_index, best_p_index)


@triton.jit(do_not_specialize=["vocab", "num_draft_rows"])
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
    vocab,
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
    kept = tl.load(draft_ids_ptr + draft_base + js, mask=js < accepted, other=-1)
    out = tl.where(js < accepted, kept, tl.where(js == accepted, final, -1))
    tl.store(token_ids_ptr + b * (max_draft + 1) + js, out, mask=js <= max_draft)
    tl.store(num_accepted_ptr + b, accepted.to(tl.int32))
