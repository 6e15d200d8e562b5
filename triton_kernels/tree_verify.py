"""Tree verification in Triton (DESIGN.md §5.3), the same semantics, arithmetic
and random numbers as csrc/tree_verify.

One launch, grid (B, PARTS): the walk's first vocab-wide pass is split over the
PARTS programs of a request, the rest of the walk runs in one of them.

* The first pass. Every program finds it from scalar reads alone (no waiting):
  greedy, the argmax of p_0; without draft_probs, the sum and support of p_0
  with, in the same pass, the final race at the root as if every child of the
  root were rejected (their tokens excluded; csrc/tree_verify/tree_verify_math.h
  race_update_excluding / tree_onehot_final recover the walk's exclusions
  exactly); with draft_probs, the acceptance tests walk down (they read p_u(x),
  q_u(x) only) to the first rejection, at node u with no update committed yet,
  and the pass is the sum of the next residual r_1 with, in the same pass, the
  race over r_1 (the final token if that child was u's last and the sum is
  positive); a walk that ends at a leaf u without a rejection races over p_u.
  The pass's sums are kept per lane of a VBLOCK-wide tile (lane l adds entries
  l, l + VBLOCK, l + 2 VBLOCK, ... in that order; the VBLOCK lane sums, written
  to a per-call workspace, are then reduced as one tensor), and program `part`
  takes lanes part * L .. part * L + L - 1 (L = VBLOCK / PARTS) of every tile,
  CHUNK of them at a time, UNROLL tiles per trip: the rounding of every sum is
  fixed by VBLOCK alone (the launcher picks it from the vocab and the device
  type, never from the batch), and race and argmax partials merge exactly
  (largest score, then smallest index), so no choice of PARTS, CHUNK or UNROLL
  changes a result. Under the interpreter VBLOCK is the walk's BLOCK (the lanes
  of its own row loops); on a GPU 4096, so that 8 programs of 4 warps each hold
  4 consecutive entries per thread (16-byte loads, one Philox block per 4).
* The rest. Each program writes its partials, then takes a ticket (an acq_rel
  atomic per request on a zeroed per-call counter); the program that draws the
  last ticket merges the partials and runs the walk, the others exit: no program
  ever waits for another (the interpreter runs programs one after another). The
  walk scans the nodes c = 1 .. n-1 in index order (every child comes after its
  parent, so this visits the children of each node in order) with scalar state
  and takes the first pass's results where the walk needs them; its later
  vocab-wide steps (rows below the root without draft_probs, later rejections
  with draft_probs, greedy rows below the root) are tiled reductions over a row
  in that one program: argmax (greedy), sum and support of p_u, the sum of the
  next residual, and the final exponential race over p'.

p' is never materialized: with draft_probs it is recomputed per entry from p_u,
q_u and the normalizers of the committed updates, kept in a [B, N] workspace;
without, the zeroed tokens are kept there (see tree_verify_math.h). Divisions use
div_rn, as the C++ and CUDA kernels do. Races keep one running best across tiles
(race_tile_update in rejection.py: a tile whose entries provably cannot win costs a
skip test per entry and no log), one Philox block serves 4 entries, and `vocab` is
specialized (aligned rows, vectorized loads).
"""

import triton
import triton.language as tl

from .philox import PURPOSE_ACCEPT, PURPOSE_BONUS, PURPOSE_RESIDUAL, bits_to_uniform, exp_noise, philox_bits, philox_tile
from .rejection import lanes_argmax, prob_mass, race_tile_update, row_argmax


@triton.jit
def residual_step(r, z, q):
    """max(r / z - mass(q), 0): one residual update of an entry."""
    d = tl.math.div_rn(r, z) - prob_mass(q)
    return tl.where(d > 0, d, 0.0)


@triton.jit
def first_residual(p, q):
    """r_1 = max(mass(p) - mass(q), 0): residual_step(mass(p), Z_0 = 1, q) without its correctly rounded division
    (x / 1 is x exactly), which costs a call's worth of instructions per entry in a hot loop."""
    d = prob_mass(p) - prob_mass(q)
    return tl.where(d > 0, d, 0.0)


@triton.jit
def tree_residual(p, q, z_ptr, m):
    """r_m: the entry after m committed updates with normalizers z_ptr[0 .. m-1] (Z_0 = 1)."""
    r = prob_mass(p)
    prev = tl.full([], 1.0, tl.float32)
    j = tl.zeros([], tl.int64)
    while j < m:  # while loops: triton 3.6's interpreter cannot take a runtime range() bound
        r = residual_step(r, prev, q)
        prev = tl.load(z_ptr + j)
        j += 1
    return r


@triton.jit
def normalizer(z_ptr, m):
    """Z_m (1 before any update)."""
    return tl.where(m > 0, tl.load(z_ptr + tl.maximum(m - 1, 0)), 1.0)


@triton.jit
def row_sum_count(row_ptr, vocab, BLOCK: tl.constexpr):
    """Sum of mass(p) over a row and the number of entries with mass."""
    total = tl.zeros([BLOCK], tl.float32)
    count = tl.zeros([BLOCK], tl.int64)
    for start in range(0, vocab, BLOCK):
        idx = start + tl.arange(0, BLOCK)
        mass = prob_mass(tl.load(row_ptr + idx, mask=idx < vocab, other=0.0).to(tl.float32))
        total += mass
        count += (mass > 0).to(tl.int64)
    return tl.sum(total, 0), tl.sum(count, 0)


@triton.jit
def next_residual_sum(p_row_ptr, q_row_ptr, vocab, z_ptr, m, z_m, BLOCK: tl.constexpr):
    """Sum over the row of r_{m+1} = max(r_m / Z_m - q, 0)."""
    total = tl.zeros([BLOCK], tl.float32)
    for start in range(0, vocab, BLOCK):
        idx = start + tl.arange(0, BLOCK)
        inside = idx < vocab
        p = tl.load(p_row_ptr + idx, mask=inside, other=0.0).to(tl.float32)
        q = tl.load(q_row_ptr + idx, mask=inside, other=0.0).to(tl.float32)
        total += residual_step(tree_residual(p, q, z_ptr, m), z_m, q)
    return tl.sum(total, 0)


@triton.jit
def final_race(p_row_ptr, q_row_ptr, vocab, z_ptr, zeroed_ptr, m, seed, offset, position, purpose,
               HAS_Q: tl.constexpr, BLOCK: tl.constexpr):
    """Exponential race over p' at a node: r_m (HAS_Q) or p_u without the m zeroed tokens.

    A running best over tiles (race_tile_update: entries that cannot win skip the log); one Philox block
    per 4 entries; scores mass / noise (0 without mass); entries past the row load 0 and never win."""
    offs = tl.arange(0, BLOCK)
    best = tl.full([], -1.0, tl.float32)
    best_index = tl.zeros([], tl.int32)
    for start in range(0, vocab, BLOCK):
        idx = start + offs
        inside = idx < vocab
        p = tl.load(p_row_ptr + idx, mask=inside, other=0.0).to(tl.float32)
        if HAS_Q:
            q = tl.load(q_row_ptr + idx, mask=inside, other=0.0).to(tl.float32)
            mass = tree_residual(p, q, z_ptr, m)
        else:
            mass = prob_mass(p)
            j = tl.zeros([], tl.int64)
            while j < m:
                mass = tl.where(idx == tl.load(zeroed_ptr + j), 0.0, mass)
                j += 1
        bits = philox_tile(seed, offset, position, purpose, start, BLOCK)
        best, best_index = race_tile_update(mass, bits, idx, best, best_index, True)
    return best_index.to(tl.int64)


@triton.jit
def split_sum_race(p_row_ptr, q_row_ptr, q_end, kids_ptr, num_kids, lane_sums_ptr, vocab, part, seed, offset,
                   position, purpose, noisy, HAS_Q: tl.constexpr, PARTS: tl.constexpr, VBLOCK: tl.constexpr,
                   CHUNK: tl.constexpr, UNROLL: tl.constexpr, TILES: tl.constexpr):
    """Program `part`'s share of the first pass: lanes part * L .. part * L + L - 1 (L = VBLOCK / PARTS) of
    every VBLOCK-wide tile of the row, CHUNK lanes at a time, UNROLL tiles per trip.

    HAS_Q: mass = r_1 = max(mass(p) - mass(q), 0) (r_0 / Z_0 with Z_0 = 1; q read below q_end only: q_end = 0
    gives mass(p)); else mass(p), with the num_kids tokens at kids_ptr (-1: none) excluded from the race (not
    from the sums). Every lane adds its entries in index order; the lane sums go to lane_sums_ptr (VBLOCK of
    them per row). Returns the number of entries with mass (not HAS_Q) and the race's (best score, first index)
    over the lanes; not `noisy` (greedy: q_end = 0, no exclusions) the scores are the masses (mass / 1), and
    the race is row_argmax's argmax.

    The exclusions stay out of the tile loop: a lane holding an excluded token (in any tile) drops out of the
    tile loop's race and is raced again on its own, its TILES entries at once, with every excluded token's
    mass 0 (the same scores: philox_bits gives philox_tile's words). A lane's best is its largest score, first
    index on ties, however its entries are visited, so the merge is the race over the lanes with exclusions."""
    LANES: tl.constexpr = VBLOCK // PARTS
    top = tl.full([], -1.0, tl.float32)
    index = tl.zeros([], tl.int32)
    count = tl.zeros([], tl.int64)
    for chunk in range(0, LANES // CHUNK):
        lanes = part * LANES + chunk * CHUNK + tl.arange(0, CHUNK)
        total = tl.zeros([CHUNK], tl.float32)
        counts = tl.zeros([CHUNK], tl.int32)
        racing = lanes >= 0  # lanes in the tile loop's race: without HAS_Q, not those holding an excluded token
        if not HAS_Q:
            j = tl.zeros([], tl.int32)
            while j < num_kids:
                racing = racing & (lanes != tl.load(kids_ptr + j) % VBLOCK)  # -1 % VBLOCK is no lane
                j += 1
        best = tl.full([], -1.0, tl.float32)
        best_index = tl.zeros([], tl.int32)
        for tile in range(0, vocab, VBLOCK * UNROLL):
            for r in tl.static_range(UNROLL):  # UNROLL consecutive tiles per trip: each lane keeps its order
                start = tile + r * VBLOCK + part * LANES + chunk * CHUNK  # the lanes' first entry
                idx = start + tl.arange(0, CHUNK)
                p = tl.load(p_row_ptr + idx, mask=idx < vocab, other=0.0).to(tl.float32)
                if HAS_Q:
                    q = tl.load(q_row_ptr + idx, mask=idx < q_end, other=0.0).to(tl.float32)
                    mass = first_residual(p, q)
                else:
                    mass = prob_mass(p)
                    counts += (mass > 0).to(tl.int32)
                total += mass
                bits = philox_tile(seed, offset, position, purpose, start, CHUNK)
                best, best_index = race_tile_update(tl.where(racing, mass, -1.0), bits, idx, best, best_index, noisy)
        tl.store(lane_sums_ptr + lanes, total)
        if not HAS_Q:
            count += tl.sum(counts.to(tl.int64), 0)
        index = tl.where((best > top) | ((best == top) & (best_index < index)), best_index, index)
        top = tl.maximum(top, best)
    if not HAS_Q:
        entries = tl.arange(0, TILES) * VBLOCK
        j = tl.zeros([], tl.int32)
        while j < num_kids:
            lane = tl.load(kids_ptr + j) % VBLOCK
            if (lane >= part * LANES) & (lane < part * LANES + LANES):
                idx = entries + lane
                mass = prob_mass(tl.load(p_row_ptr + idx, mask=idx < vocab, other=0.0).to(tl.float32))
                i = tl.zeros([], tl.int32)
                while i < num_kids:
                    mass = tl.where(idx == tl.load(kids_ptr + i), 0.0, mass)
                    i += 1
                score = tl.math.div_rn(mass, exp_noise(philox_bits(seed, offset, position, purpose, idx.to(tl.int64))))
                lane_top, lane_index = lanes_argmax(score, idx)
                index = tl.where((lane_top > top) | ((lane_top == top) & (lane_index < index)), lane_index, index)
                top = tl.maximum(top, lane_top)
            j += 1
    return count, top, index


@triton.jit
def accept_uniform(seed_ptr, offset_ptr, c):
    """The acceptance uniform of child c (position c - 1). Seed and offset are loaded here, in the walk's
    loop: otherwise the compiler keeps the Philox key schedule in registers across the whole walk."""
    bits = philox_bits(tl.load(seed_ptr), tl.load(offset_ptr), c - 1, PURPOSE_ACCEPT, tl.zeros([], tl.int64))
    return bits_to_uniform(bits)


@triton.jit
def merged_race(best_ptr, index_ptr, PARTS: tl.constexpr):
    """The first pass's race (or argmax) over the row: the programs' (best, index) merged exactly."""
    ps = tl.arange(0, PARTS)
    _, index = lanes_argmax(tl.load(best_ptr + ps, cache_modifier=".cg"), tl.load(index_ptr + ps, cache_modifier=".cg"))
    return index.to(tl.int64)


@triton.jit
def merged_sum(lane_sums_ptr, VBLOCK: tl.constexpr):
    """The first pass's sum: the reduction of its VBLOCK lane sums."""
    return tl.sum(tl.load(lane_sums_ptr + tl.arange(0, VBLOCK), cache_modifier=".cg"), 0)


@triton.jit
def onehot_final(race_index, kept, kept_mass, seed, offset, position):
    """The final token at a node whose children were all rejected (no draft_probs), from the race that
    excluded every child token and `kept`: the child token with mass the walk left unzeroed because it was
    the last entry of p' with mass, or -1 (tree_verify_math.h tree_onehot_final). With kept >= 0 only kept
    has mass: it wins if its score is positive, else every entry scores 0 and entry 0 wins."""
    bits = philox_bits(seed, offset, position, PURPOSE_RESIDUAL, tl.maximum(kept, 0))
    score = tl.math.div_rn(kept_mass, exp_noise(bits))
    return tl.where(kept < 0, race_index, tl.where(score > 0, kept, 0))



@triton.jit(do_not_specialize=["nodes"])
def tree_verify_kernel(
    target_ptr,          # [B, N, V] probabilities
    draft_probs_ptr,     # [B, N, V] (any valid pointer without HAS_DRAFT_PROBS)
    tokens_ptr,          # int64 [B, N]
    parents_ptr,         # int64 [B, N]
    num_nodes_ptr,       # int64 [B] (any valid pointer without HAS_NUM_NODES)
    seeds_ptr,           # int64 [B]
    offsets_ptr,         # int64 [B]
    greedy_ptr,          # bool [B] (any valid pointer without HAS_GREEDY)
    normalizers_ptr,     # float32 workspace [B, N] (HAS_DRAFT_PROBS)
    zeroed_ptr,          # int32 workspace [B, N] (not HAS_DRAFT_PROBS)
    kids_ptr,            # int32 workspace [B, PARTS, N] (not HAS_DRAFT_PROBS): the root's children's tokens
    lane_sums_ptr,       # float32 workspace [B, VBLOCK]: the first pass's lane sums
    part_best_ptr,       # float32 workspace [B, PARTS]: each program's race / argmax best ...
    part_index_ptr,      # int32 workspace [B, PARTS]: ... and its first index
    part_count_ptr,      # int64 workspace [B, PARTS]: entries with mass (not HAS_DRAFT_PROBS)
    tickets_ptr,         # int32 [B], zeroed: programs of the request done with the first pass
    token_ids_ptr,       # int64 out [B, N]
    accepted_path_ptr,   # int32 out [B, N]
    num_accepted_ptr,    # int32 out [B]
    nodes,
    vocab: tl.constexpr,  # fixed per model: specialized (aligned rows, vectorized loads, static loop bounds)
    HAS_NUM_NODES: tl.constexpr,
    HAS_DRAFT_PROBS: tl.constexpr,
    HAS_GREEDY: tl.constexpr,
    BLOCK_N: tl.constexpr,   # power of two >= N
    BLOCK: tl.constexpr,     # vocab tile of the walk's own row loops
    VBLOCK: tl.constexpr,    # the first pass's tile (its lanes fix the order of its sums): a power of two
    PARTS: tl.constexpr,     # programs per request: a power of two dividing VBLOCK // CHUNK
    CHUNK: tl.constexpr,     # lanes a program holds at a time: a power of two, a multiple of 4
    UNROLL: tl.constexpr,    # tiles per trip of the first pass
    TILES: tl.constexpr,     # power of two >= cdiv(vocab, VBLOCK)
):
    b = tl.program_id(0).to(tl.int64)
    part = tl.program_id(1)
    n = tl.zeros([], tl.int64) + nodes
    if HAS_NUM_NODES:
        n = tl.minimum(tl.maximum(tl.load(num_nodes_ptr + b), 1), nodes)
    seed = tl.load(seeds_ptr + b)
    offset = tl.load(offsets_ptr + b)
    greedy = 0
    if HAS_GREEDY:
        greedy = tl.load(greedy_ptr + b).to(tl.int32)
    row0 = b * nodes
    target = target_ptr + row0 * vocab
    draft = draft_probs_ptr + row0 * vocab
    tokens = tokens_ptr + row0
    parents = parents_ptr + row0
    z = normalizers_ptr + row0
    zeroed = zeroed_ptr + row0
    out_tokens = token_ids_ptr + row0
    out_path = accepted_path_ptr + row0
    lane_sums = lane_sums_ptr + b * VBLOCK
    parts_at = b * PARTS

    # ---- the first vocab-wide pass, this program's share (every program finds it from scalar reads)
    first_u = tl.zeros([], tl.int64)      # the node of the pass
    found = tl.zeros([], tl.int32)        # draft_probs: a child of first_u was rejected
    num_kids = tl.zeros([], tl.int32)     # no draft_probs: children of the root (tokens at kids)
    kids = kids_ptr + (parts_at + part) * nodes
    if greedy == 0:
        c = tl.full([], 1, tl.int64)
        if HAS_DRAFT_PROBS:
            # The acceptance tests down to the first rejection (no update committed: m = 0, Z_0 = 1).
            while (c < n) & (found == 0):
                par = tl.load(parents + c)
                par = tl.where((par >= 0) & (par < c), par, 0)
                if par == first_u:
                    x = tl.load(tokens + c)
                    in_vocab = (x >= 0) & (x < vocab)
                    xs = tl.where(in_vocab, x, 0)
                    uc = accept_uniform(seeds_ptr + b, offsets_ptr + b, c)
                    m0 = tl.zeros([], tl.int64)
                    q_x = tl.load(draft + first_u * vocab + xs).to(tl.float32)
                    r_x = tree_residual(tl.load(target + first_u * vocab + xs).to(tl.float32), q_x, z, m0)
                    if in_vocab & (uc * prob_mass(q_x) < tl.math.div_rn(r_x, normalizer(z, m0))):
                        first_u = c + tl.zeros([], tl.int64)
                    else:
                        found = tl.full([], 1, tl.int32)
                c += 1
        else:
            # The root's children: their tokens are excluded from the root's race.
            while c < n:
                par = tl.load(parents + c)
                par = tl.where((par >= 0) & (par < c), par, 0)
                if par == 0:
                    x = tl.load(tokens + c)
                    tl.store(kids + num_kids, tl.where((x >= 0) & (x < vocab), x, -1).to(tl.int32))
                    num_kids += 1
                c += 1
            tl.debug_barrier()
            found = (num_kids > 0).to(tl.int32)
    # greedy: the argmax of p_0 (the race's loop with unit noise)
    purpose = tl.where(found != 0, PURPOSE_RESIDUAL, PURPOSE_BONUS)
    count, top, index = split_sum_race(
        target + first_u * vocab, draft + first_u * vocab, tl.where(found != 0, vocab, 0), kids, num_kids, lane_sums,
        vocab, part, seed, offset, first_u, purpose, greedy == 0, HAS_DRAFT_PROBS, PARTS, VBLOCK, CHUNK, UNROLL, TILES)
    tl.store(part_best_ptr + parts_at + part, top)
    tl.store(part_index_ptr + parts_at + part, index)
    tl.store(part_count_ptr + parts_at + part, count)
    if PARTS > 1:
        tl.debug_barrier()  # every thread's partials before the ticket (released by the atomic)
        if tl.atomic_add(tickets_ptr + b, 1, sem="acq_rel") != PARTS - 1:
            return  # not the last: the program that draws the last ticket goes on

    # ---- the walk, in the program that drew the last ticket (loading its scalars anew keeps the split pass's
    # values from living on through the walk)
    if True:
        tl.debug_barrier()  # (also keeps the compiler from reusing the loads below from before the pass)
        seed = tl.load(seeds_ptr + b)
        offset = tl.load(offsets_ptr + b)
        tl.store(out_path, 0)
        u = tl.zeros([], tl.int64)
        k = tl.zeros([], tl.int64)
        if greedy != 0:
            best = merged_race(part_best_ptr + parts_at, part_index_ptr + parts_at, PARTS)
            c = tl.full([], 1, tl.int64)
            while c < n:
                par = tl.load(parents + c)
                par = tl.where((par >= 0) & (par < c), par, 0)
                x = tl.load(tokens + c)
                if (par == u) & (x == best):
                    tl.store(out_tokens + k, x)
                    tl.store(out_path + k + 1, (tl.zeros([], tl.int64) + c).to(tl.int32))
                    k += 1
                    u = c + tl.zeros([], tl.int64)
                    best = row_argmax(target + u * vocab, vocab, BLOCK)
                c += 1
            final = best
        else:
            rejected = tl.zeros([], tl.int32)     # a child of u was tried and rejected
            m = tl.zeros([], tl.int64)            # committed updates / zeroed tokens at u
            total = tl.zeros([], tl.float32)      # no draft_probs: sum of p'
            nonzero = tl.zeros([], tl.int64)      # no draft_probs: entries of p_u with mass
            kept = tl.full([], -1, tl.int64)      # no draft_probs: a rejected token with mass left unzeroed
            c = tl.full([], 1, tl.int64)
            while c < n:
                par = tl.load(parents + c)
                par = tl.where((par >= 0) & (par < c), par, 0)
                if par == u:
                    x = tl.load(tokens + c)
                    in_vocab = (x >= 0) & (x < vocab)
                    xs = tl.where(in_vocab, x, 0)
                    uc = accept_uniform(seeds_ptr + b, offsets_ptr + b, c)
                    p_row = target + u * vocab
                    if HAS_DRAFT_PROBS:
                        q_row = draft + u * vocab
                        z_m = normalizer(z, m)
                        q_x = tl.load(q_row + xs).to(tl.float32)
                        r_x = tree_residual(tl.load(p_row + xs).to(tl.float32), q_x, z, m)
                        accept = in_vocab & (uc * prob_mass(q_x) < tl.math.div_rn(r_x, z_m))
                        if not accept:
                            if (found != 0) & (u == first_u) & (m == 0):
                                new_total = merged_sum(lane_sums, VBLOCK)  # the first pass: sum of r_1 at first_u
                            else:
                                new_total = next_residual_sum(p_row, q_row, vocab, z, m, z_m, BLOCK)
                            if new_total > 0:
                                tl.store(z + m, new_total)
                                tl.debug_barrier()
                                m += 1
                    else:
                        if rejected == 0:
                            if u == 0:
                                total = merged_sum(lane_sums, VBLOCK)
                                nonzero = tl.sum(tl.load(part_count_ptr + parts_at + tl.arange(0, PARTS),
                                                         cache_modifier=".cg"), 0)
                            else:
                                total, nonzero = row_sum_count(p_row, vocab, BLOCK)
                        p_x = prob_mass(tl.load(p_row + xs).to(tl.float32))
                        j = tl.zeros([], tl.int64)
                        while j < m:
                            p_x = tl.where(tl.load(zeroed + j) == x, 0.0, p_x)
                            j += 1
                        p_x = tl.where(in_vocab, p_x, 0.0)
                        accept = in_vocab & (uc * total < p_x)
                        if (not accept) & (p_x > 0):
                            if nonzero - m > 1:
                                tl.store(zeroed + m, x.to(tl.int32))
                                tl.debug_barrier()
                                m += 1
                                total -= p_x
                            else:
                                kept = x
                    if accept:
                        tl.store(out_tokens + k, x)
                        tl.store(out_path + k + 1, (tl.zeros([], tl.int64) + c).to(tl.int32))
                        k += 1
                        u = c + tl.zeros([], tl.int64)
                        rejected = tl.zeros([], tl.int32)
                        m = tl.zeros([], tl.int64)
                        kept = tl.full([], -1, tl.int64)
                    else:
                        rejected = tl.full([], 1, tl.int32)
                c += 1
            if HAS_DRAFT_PROBS:
                # The first pass raced over r_1 (a rejection there, committed) or over p_u (a leaf).
                from_first = (u == first_u) & (m == found)
            else:
                from_first = u == 0
            if from_first:
                final = merged_race(part_best_ptr + parts_at, part_index_ptr + parts_at, PARTS)
                if not HAS_DRAFT_PROBS:
                    kept_mass = prob_mass(tl.load(target + tl.maximum(kept, 0)).to(tl.float32))
                    final = onehot_final(final, kept, kept_mass, seed, offset, u)
            else:
                purpose = tl.where(rejected != 0, PURPOSE_RESIDUAL, PURPOSE_BONUS)
                final = final_race(target + u * vocab, draft + u * vocab, vocab, z, zeroed, m, seed, offset, u,
                                   purpose, HAS_DRAFT_PROBS, BLOCK)

        tl.store(out_tokens + k, final)
        tl.store(num_accepted_ptr + b, k.to(tl.int32))
        js = tl.arange(0, BLOCK_N).to(tl.int64)
        pad = (js > k) & (js < nodes)
        tl.store(out_tokens + js, tl.full([BLOCK_N], -1, tl.int64), mask=pad)
        tl.store(out_path + js, tl.full([BLOCK_N], -1, tl.int32), mask=pad)
