"""Chain rejection sampling in Triton (DESIGN.md §5.2), the same semantics and
random numbers as csrc/sampling, each request split over several programs.

Grid (B, S): program (b, s) owns the vocab slice [s * L, min((s + 1) * L, V)) of
request b's rows, L a multiple of the tile BLOCK (the launcher picks S from the
SM count and the batch so that the grid fills the GPU in one wave; S = 1 is the
one-program form). Every program: the acceptance tests of all drafts at once
(one uniform each, the same in every program: O(K) loads), the first rejection
by a min-reduction, then an exponential race (or, greedy, argmax) over its
slice of one row (residual at the first rejection, or the bonus row); greedy
requests take the argmax of their slice of every row the walk may visit. Each
program writes its partial (best score, first index) per row into a per-call
workspace, then takes a ticket on a per-request counter (atomic, acq_rel, its
stores ordered before it by a barrier); the program that draws the last ticket
merges the partials (largest score, then smallest index: exactly the race or
argmax over the whole row, since every entry's noise is keyed by its global
index) and writes the outputs; greedy requests are walked there row by row
until the first mismatch. A residual without mass (rounding) is rerun there as
the race over p over the whole row (rare). No program waits for another (the
interpreter runs programs one after another). Argmaxes keep per-lane running
bests (one tile-wide reduction per slice); races keep one running best across
tiles, so that a tile none of whose entries can still win costs a skip test per
entry and no log (race_quads_update); one Philox block serves 4 consecutive
entries, held with their masses by one thread (quad_masses, philox_groups).
`vocab` is specialized (divisible by 16: aligned rows, vectorized loads).

Engine keywords (issue #14), each a constexpr so that a launch without them compiles
to the same code: HAS_BONUS_IDS (a fully accepted request emits its given id, clamped
into [0, V-1], and its bonus row is never read; BONUS_ROWS=False when the target has
none), SYNTHETIC (accept draft k iff u_k < rate[k], greedy requests too, which then
take the argmax of the one row they need).
"""

import triton
import triton.language as tl

from .philox import (PURPOSE_ACCEPT, PURPOSE_BONUS, PURPOSE_RESIDUAL, bits_to_uniform, philox_bits, philox_groups,
                     uniform_mantissa)


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
def _argmax_tiles(row_ptr, start, hi, best, best_index, BLOCK: tl.constexpr):
    """Two tiles per trip: both loads are issued before either is used (64 bytes in flight per thread at
    BLOCK = 1024 over 128 threads, fp32), then folded in index order, so each lane still sees its indices in
    increasing order. Entries at or past `hi` (the slice's end, at most the row's) load 0."""
    idx = start + tl.arange(0, BLOCK)
    p = tl.load(row_ptr + idx, mask=idx < hi, other=0.0).to(tl.float32)
    p_next = tl.load(row_ptr + idx + BLOCK, mask=idx + BLOCK < hi, other=0.0).to(tl.float32)
    best, best_index = lane_argmax_update(prob_mass(p), idx, best, best_index)
    return lane_argmax_update(prob_mass(p_next), idx + BLOCK, best, best_index)


@triton.jit
def slice_argmax(row_ptr, lo, hi, vocab, BLOCK: tl.constexpr, WHILE_LOOPS: tl.constexpr):
    """(largest prob_mass, its first index) over entries [lo, hi) of one row, lo a multiple of BLOCK (int32
    scalars); (-1, 0) for an empty slice. Entries past the slice (or the row) load 0 and never win (see
    row_argmax: the slice's own first entry has at least that score and a smaller index)."""
    best = tl.full([BLOCK], -1.0, tl.float32)
    best_index = tl.zeros([BLOCK], tl.int32)
    end = tl.minimum(hi, vocab)
    if WHILE_LOOPS:  # triton 3.6's interpreter cannot take a runtime range() bound
        start = lo
        while start < hi:
            best, best_index = _argmax_tiles(row_ptr, start, end, best, best_index, BLOCK)
            start += 2 * BLOCK
    else:
        for start in range(lo, hi, 2 * BLOCK):
            best, best_index = _argmax_tiles(row_ptr, start, end, best, best_index, BLOCK)
    return lanes_argmax(best, best_index)


@triton.jit
def race_cut(best, total):
    """(A, C) of a race's skip test against its best score so far `best` (a scalar), for entries whose masses
    are at most P / total: an entry with random bits of mantissa f (uniform_mantissa) is skipped when
    P < C - A f (+ q total (1 - 2^-20) for a residual against draft probs q), A = best total (1 - 2^-20),
    C = 2 A - A (2e-5 + 2^-24). Probabilities given as such race with total = 1 and P their mass.

    Why a skipped entry cannot win. Write eps = 1e-5 and w = 1 - u = (2 - f) - 2^-24. A is below best total;
    C - A f rounds within A 2.5e-7 of A (w - 2e-5) (A 2^-24 in C, twice A 2^-24 in the products), a sum with
    q total (1 - 2^-20) within 2^-24 of itself; eps covers all of them. So a skip means P / total <
    best (w - eps) + q: the entry's race mass r = max(p - q, 0) (p without draft probs), p <= P / total, has
    r < best (w - eps), so either r = 0 (its score 0 does not beat best > 0) or, with t = r / best < 1,
    u <= (1 - t)(1 - eps): the condition of race_may_win's proof (csrc/common/sampling_math.h) under which the
    score r / -log(u), log and division rounded, stays below best. NaN compares false (never skipped).

    Not while best <= 1e-30 (a race still empty or without mass, where entries without mass may win; the
    rounding bounds need normal numbers) nor for total < 0.5 (a row without mass): A = 0, C = -inf, nothing
    skipped. best = inf gives NaN: nothing skipped either."""
    fast = (best > 1e-30) & (total >= 0.5)
    a = tl.where(fast, best * total * 0.99999904632568359375, 0.0)
    c = tl.where(fast, 2.0 * a - (a * 2e-5 + a * 5.9604644775390625e-08), float("-inf"))
    return a, c


@triton.jit
def race_skips_probs(mass, bits, cut_a, cut_c):
    """Entries of a race over given masses (probabilities, or residuals max(p - q, 0)) that provably cannot beat
    its best score: mass < C - A f, (A, C) = race_cut(best, 1), f = uniform_mantissa(bits)."""
    return mass < cut_c - cut_a * uniform_mantissa(bits)


@triton.jit
def race_tile_update(mass, bits, idx, best, best_index, noisy):
    """Fold one tile of a race into its running (best score, first index): scalars, the race so far.

    The common tile has no entry that may still win: a skip test per entry (mass < C - A f, race_cut: two
    instructions with f from the random bits), one tile-wide OR, no log. Otherwise the entries that may win
    score mass / -log(u) (u = bits_to_uniform(bits)), rounded to nearest as in the C++ and CUDA kernels (the
    others cannot win: -1), and a tile argmax follows. Not `noisy`: an argmax of the masses (score = mass).
    mass < 0: out of the race. Tiles come in increasing index order, so a strictly larger score keeps the
    first index on ties."""
    cut_a, cut_c = race_cut(best, 1.0)
    may_win = tl.where(noisy, tl.where(race_skips_probs(mass, bits, cut_a, cut_c), 0, 1), tl.where(mass > best, 1, 0))
    if tl.max(may_win, 0) != 0:
        best, best_index = race_tile_fold(mass, bits_to_uniform(bits), idx, may_win, best, best_index, noisy)
    return best, best_index


@triton.jit
def race_tile_fold(mass, u, idx, may_win, best, best_index, noisy):
    """The log path of race_tile_update: the entries that may win (may_win != 0; mass < 0, out of the race,
    never) score mass / -log(u) (mass when not `noisy`), the others -1; the tile's largest score, first index
    on ties, replaces the running best if strictly larger. Callers whose masses cost divisions (logits.py
    split_race) run the skip test on an upper bound of them and compute the exact masses for this fold only."""
    racing = (may_win != 0) & (mass >= 0)
    score = tl.where(racing, tl.where(noisy, tl.math.div_rn(mass, -tl.log(u)), mass), -1.0)
    top = tl.max(score, 0)
    top_index = tl.min(tl.where(score == top, idx, 0x7FFFFFFF), 0)
    if top > best:
        best = top
        best_index = top_index
    return best, best_index


@triton.jit
def first_of_quads(h0, h1, h2, h3, i0):
    """The smallest index i0[g] + i over the quads' entries where h_i holds (0x7FFFFFFF for none)."""
    return tl.min(tl.where(h0, i0, tl.where(h1, i0 + 1, tl.where(h2, i0 + 2, tl.where(h3, i0 + 3, 0x7FFFFFFF)))), 0)


@triton.jit
def quad_score(e, bits, inside):
    """An entry's race score e / -log(u), rounded as race_tile_fold's (-1 past the row)."""
    return tl.where(inside, tl.math.div_rn(e, -tl.log(bits_to_uniform(bits))), -1.0)


@triton.jit
def race_quads_update(e0, e1, e2, e3, r0, r1, r2, r3, i0, inside, best, best_index):
    """race_tile_update (noisy) over a tile held as quads (e_i the masses, r_i the random bits of entries i0 + i):
    the skip test per entry, one tile-wide OR; a tile with an entry that may still win scores every entry of
    the row: an entry the test skips scores below the best so far (race_cut), so the tile's largest score
    beats the best exactly when race_tile_fold's would, at the same entry."""
    cut_a, cut_c = race_cut(best, 1.0)
    skip = (race_skips_probs(e0, r0, cut_a, cut_c) & race_skips_probs(e1, r1, cut_a, cut_c)
            & race_skips_probs(e2, r2, cut_a, cut_c) & race_skips_probs(e3, r3, cut_a, cut_c))
    if tl.max(tl.where(skip, 0, tl.where(inside, 1, 0)), 0) != 0:
        s0 = quad_score(e0, r0, inside)
        s1 = quad_score(e1, r1, inside)
        s2 = quad_score(e2, r2, inside)
        s3 = quad_score(e3, r3, inside)
        top = tl.max(tl.maximum(tl.maximum(s0, s1), tl.maximum(s2, s3)), 0)
        top_index = first_of_quads(s0 == top, s1 == top, s2 == top, s3 == top, i0)
        if top > best:
            best = top
            best_index = top_index
    return best, best_index


@triton.jit
def quad_masses(row_ptr, i0, end):
    """prob_mass of the entries i0 + 0 .. i0 + 3 of a row (i0 an int32 tensor of multiples of 4; entries at or past
    `end` load 0): four [G] tensors in the layout of i0, the one Philox's blocks take (philox_groups over
    i0 // 4), so that a quad's masses and random bits meet in one thread. Four 4-byte loads a quad (a warp's
    load touches the same lines as its neighbours': one HBM read), against philox_tile's exchange of the bits
    between threads (a round trip through shared memory and barriers a tile)."""
    m0 = prob_mass(tl.load(row_ptr + i0, mask=i0 < end, other=0.0).to(tl.float32))
    m1 = prob_mass(tl.load(row_ptr + (i0 + 1), mask=i0 + 1 < end, other=0.0).to(tl.float32))
    m2 = prob_mass(tl.load(row_ptr + (i0 + 2), mask=i0 + 2 < end, other=0.0).to(tl.float32))
    m3 = prob_mass(tl.load(row_ptr + (i0 + 3), mask=i0 + 3 < end, other=0.0).to(tl.float32))
    return m0, m1, m2, m3


@triton.jit
def one_hot_residual(m, i, q_at):
    """Race masses m of entries i with a one-hot draft at q_at removed: max(m - 1, 0) there, m elsewhere."""
    return tl.where(i == q_at, prob_mass(m - 1.0), m)


@triton.jit
def _race_tile(p_row_ptr, q_row_ptr, q_end, q_at, start, best, best_index, vocab, seed, offset, position, purpose,
               HAS_Q: tl.constexpr, BLOCK: tl.constexpr):
    """One tile [start, start + BLOCK) of race_pass as quads (quad_masses, philox_groups, race_quads_update).
    Without draft probs the one-hot q changes one entry of the row: only a tile holding it pays the select."""
    g = start // 4 + tl.arange(0, BLOCK // 4)
    i0 = 4 * g
    m0, m1, m2, m3 = quad_masses(p_row_ptr, i0, vocab)
    if HAS_Q:
        # Masks from one comparison: a block & a scalar bool is no mask in triton 3.9's interpreter.
        q0, q1, q2, q3 = quad_masses(q_row_ptr, i0, q_end)
        m0 = prob_mass(m0 - q0)
        m1 = prob_mass(m1 - q1)
        m2 = prob_mass(m2 - q2)
        m3 = prob_mass(m3 - q3)
    elif (q_at >= start) & (q_at < start + BLOCK):
        m0 = one_hot_residual(m0, i0, q_at)
        m1 = one_hot_residual(m1, i0 + 1, q_at)
        m2 = one_hot_residual(m2, i0 + 2, q_at)
        m3 = one_hot_residual(m3, i0 + 3, q_at)
    r0, r1, r2, r3 = philox_groups(seed, offset, position, purpose, g)
    # a quad past the row stays out (score -1); one across its end scores its outside entries 0 (mass 0), never
    # the first index of a tile's top: its in-row entries precede them
    return race_quads_update(m0, m1, m2, m3, r0, r1, r2, r3, i0, i0 < vocab, best, best_index)


@triton.jit
def race_pass(p_row_ptr, q_row_ptr, draft, use_q, lo, hi, vocab, seed, offset, position, purpose,
              HAS_Q: tl.constexpr, BLOCK: tl.constexpr, WHILE_LOOPS: tl.constexpr):
    """Exponential race over max(p - q, 0) if `use_q` (q one-hot at `draft` without HAS_Q), else over p, on
    entries [lo, hi) of the row (lo a multiple of BLOCK): (best score, first index of it), (-1, 0) for an
    empty slice. Scores mass / noise, rounded to nearest as the C++ and CUDA kernels; 0 without mass
    (0 / noise); entries past the row load 0 and never win (the slice's first entry scores at least 0 with
    a smaller index). The noise of entry i is keyed by i alone (philox_groups over the global quads), so any
    slicing gives every entry its score. Entries that provably cannot beat the race so far skip the log and
    the division (race_tile_update)."""
    best = tl.full([], -1.0, tl.float32)
    best_index = tl.full([], 0, tl.int32)
    q_end = tl.where(use_q, vocab, 0)   # q entries read: [0, q_end)
    # one-hot q: its entry, -1 for none (a draft outside [0, V) has none: int32 then cannot alias an entry)
    q_at = tl.where(use_q & (draft >= 0) & (draft < vocab), draft, -1).to(tl.int32)
    if WHILE_LOOPS:
        start = lo
        while start < hi:
            best, best_index = _race_tile(p_row_ptr, q_row_ptr, q_end, q_at, start, best, best_index, vocab, seed,
                                          offset, position, purpose, HAS_Q, BLOCK)
            start += BLOCK
    else:
        for start in range(lo, hi, BLOCK):
            best, best_index = _race_tile(p_row_ptr, q_row_ptr, q_end, q_at, start, best, best_index, vocab, seed,
                                          offset, position, purpose, HAS_Q, BLOCK)
    return best, best_index


@triton.jit
def merge_parts(scores_ptr, index_ptr, base, num_parts, PARTS_BLOCK: tl.constexpr):
    """Merge of the partials base .. base + num_parts - 1 (one slot of one request, written by the other
    programs before their tickets): (largest score, smallest index among those with it), the result of one
    race or argmax over the whole row. .cg loads: read from L2, where the other programs' stores are."""
    ps = tl.arange(0, PARTS_BLOCK)
    live = ps < num_parts
    score = tl.load(scores_ptr + base + ps, mask=live, other=-2.0, cache_modifier=".cg")
    index = tl.load(index_ptr + base + ps, mask=live, other=0x7FFFFFFF, cache_modifier=".cg")
    top = tl.max(score, 0)
    return top, tl.min(tl.where(score == top, index, 0x7FFFFFFF), 0)


@triton.jit
def request_rows(lengths_ptr, b, max_draft, num_draft_rows, PACKED: tl.constexpr, BONUS_ROWS: tl.constexpr):
    """(n, first target row, first draft row) of request b, clamped so malformed lengths never address outside
    the inputs."""
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
    return n, target_base, draft_base


@triton.jit(do_not_specialize=["num_draft_rows", "tiles_per_part", "num_parts"])
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
    scores_ptr,          # float32 workspace [B, K+1, parts]: each part's best score per slot
    index_ptr,           # int32 workspace [B, K+1, parts]: its first index
    counters_ptr,        # int32 workspace [B], zeroed by the launcher: tickets taken per request
    vocab: tl.constexpr,  # fixed per model: specialized (aligned rows, vectorized loads)
    max_draft,
    num_draft_rows,
    tiles_per_part,      # part s covers entries [s * L, min((s + 1) * L, V)), L = tiles_per_part * BLOCK
    num_parts,           # programs per request (grid axis 1)
    PACKED: tl.constexpr,
    HAS_DRAFT_PROBS: tl.constexpr,
    HAS_GREEDY: tl.constexpr,
    HAS_BONUS_IDS: tl.constexpr,
    BONUS_ROWS: tl.constexpr,  # whether the target holds a bonus row per request (False only with HAS_BONUS_IDS)
    SYNTHETIC: tl.constexpr,
    BLOCK_K: tl.constexpr,   # power of two >= K + 1
    BLOCK: tl.constexpr,     # vocab tile
    PARTS_BLOCK: tl.constexpr,  # power of two >= num_parts
    WHILE_LOOPS: tl.constexpr,  # slice loops as while loops (triton 3.6's interpreter: no runtime range() bound)
):
    b = tl.program_id(0).to(tl.int64)
    part = tl.program_id(1)
    n, target_base, draft_base = request_rows(lengths_ptr, b, max_draft, num_draft_rows, PACKED, BONUS_ROWS)
    seed = tl.load(seeds_ptr + b)
    offset = tl.load(offsets_ptr + b)
    greedy = 0
    if HAS_GREEDY:
        greedy = tl.load(greedy_ptr + b).to(tl.int32)
    # This program's slice of the vocabulary: whole tiles, so the noise of every entry is unchanged.
    v_lo = part * (tiles_per_part * BLOCK)
    v_hi = tl.minimum(v_lo + tiles_per_part * BLOCK, vocab)
    slot0 = b * (max_draft + 1) * num_parts  # partials of request b: slot k of part s at slot0 + k * parts + s

    ks = tl.arange(0, BLOCK_K).to(tl.int64)
    in_draft = ks < n
    x = tl.load(draft_ids_ptr + draft_base + ks, mask=in_draft, other=-1)
    walk = greedy != 0  # greedy verification walks the argmaxes of the rows
    if SYNTHETIC:
        walk = False  # every request takes the synthetic test
    argmax_only = False
    if SYNTHETIC:
        argmax_only = greedy != 0  # a greedy request's correction (or bonus) is an argmax

    # 1. Every part: the acceptance tests (the same in every part), then its slice of the row(s).
    accepted = n.to(tl.int32)  # int32: one register across the race
    residual = n < 0
    if walk:
        # The argmax of the slice of every row the walk may visit (the merge walks them).
        rows = n + 1
        if HAS_BONUS_IDS:  # the bonus row is never read
            rows = n
        k = tl.full([], 0, tl.int64)
        while k < rows:
            top, index = slice_argmax(target_ptr + (target_base + k) * vocab, v_lo, v_hi, vocab, BLOCK, WHILE_LOOPS)
            tl.store(scores_ptr + slot0 + k * num_parts + part, top)
            tl.store(index_ptr + slot0 + k * num_parts + part, index)
            k += 1
    else:
        in_vocab = (x >= 0) & (x < vocab)
        u = bits_to_uniform(philox_bits(seed, offset, ks, PURPOSE_ACCEPT, tl.zeros([BLOCK_K], tl.int64)))
        if SYNTHETIC:
            # Masks from one comparison (see _race_tile): in_draft alone, then in_vocab in `ok`.
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
        accepted = tl.min(tl.where(in_draft & ~ok, ks, n), 0).to(tl.int32)
        residual = accepted < n
        reads_row = True
        if HAS_BONUS_IDS:
            reads_row = residual  # else the given id: the bonus row is never read
        if reads_row:
            p_row = target_ptr + (target_base + accepted) * vocab
            if argmax_only:
                top, index = slice_argmax(p_row, v_lo, v_hi, vocab, BLOCK, WHILE_LOOPS)
            else:
                x_rejected = tl.load(draft_ids_ptr + draft_base + accepted, mask=residual, other=-1)
                purpose = tl.where(residual, PURPOSE_RESIDUAL, PURPOSE_BONUS)
                top, index = race_pass(p_row, draft_probs_ptr + (draft_base + accepted) * vocab, x_rejected,
                                       residual, v_lo, v_hi, vocab, seed, offset, accepted, purpose,
                                       HAS_DRAFT_PROBS, BLOCK, WHILE_LOOPS)
            tl.store(scores_ptr + slot0 + part, top)
            tl.store(index_ptr + slot0 + part, index)

    # 2. A ticket per part (its stores ordered before it); the part that draws the last one merges.
    tl.debug_barrier()
    ticket = tl.atomic_add(counters_ptr + b, 1, sem="acq_rel", scope="gpu")
    if ticket == num_parts - 1:
        # The request's rows again (reloaded after the ticket: nothing of them stays live across the race).
        n, target_base, draft_base = request_rows(lengths_ptr, b, max_draft, num_draft_rows, PACKED, BONUS_ROWS)
        final = tl.full([], 0, tl.int64)
        if HAS_BONUS_IDS:
            final = tl.minimum(tl.maximum(tl.load(bonus_ids_ptr + b), 0), vocab - 1)
        if walk:
            k = tl.full([], 0, tl.int32)
            searching = 1
            if HAS_BONUS_IDS:  # the bonus row is never read: stop after the last draft row
                searching = tl.where(n > 0, 1, 0)
            while searching != 0:
                _, best = merge_parts(scores_ptr, index_ptr, slot0 + k * num_parts, num_parts, PARTS_BLOCK)
                best = best.to(tl.int64)
                x_k = tl.load(draft_ids_ptr + draft_base + k, mask=k < n, other=-1)
                stop = (k >= n) | (x_k != best)
                accepted = tl.where(stop, k, accepted)
                final = tl.where(stop, best, final)
                searching = tl.where(stop, 0, 1)
                k += 1
                if HAS_BONUS_IDS:
                    searching = tl.where(k >= n, 0, searching)
        else:
            reads_row = True
            if HAS_BONUS_IDS:
                reads_row = residual
            if reads_row:
                top, index = merge_parts(scores_ptr, index_ptr, slot0, num_parts, PARTS_BLOCK)
                if not argmax_only:
                    if residual & (top <= 0):
                        # The residual has no mass (rounding): the race over p, the same noise, over the
                        # whole row in this program alone (rare: correctness over speed).
                        _, index = race_pass(target_ptr + (target_base + accepted) * vocab, draft_probs_ptr,
                                             -1, residual & (top > 0), 0, vocab, vocab, seed, offset, accepted,
                                             PURPOSE_RESIDUAL, HAS_DRAFT_PROBS, BLOCK, WHILE_LOOPS)
                final = index.to(tl.int64)

        js = tl.arange(0, BLOCK_K).to(tl.int64)
        drafts = tl.load(draft_ids_ptr + draft_base + js, mask=js < accepted, other=-1)
        out = tl.where(js < accepted, drafts, tl.where(js == accepted, final, -1))
        tl.store(token_ids_ptr + b * (max_draft + 1) + js, out, mask=js <= max_draft)
        tl.store(num_accepted_ptr + b, accepted)
