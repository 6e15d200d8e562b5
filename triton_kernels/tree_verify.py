"""Tree verification in Triton (DESIGN.md §5.3), the same semantics, arithmetic
and random numbers as csrc/tree_verify (one program per request).

Each program scans the nodes c = 1 .. n-1 in index order (every child comes
after its parent, so this visits the children of each node in order) and walks
the tree with scalar state; the vocab-wide steps are tiled reductions over one
row: argmax (greedy), sum and support of p_u (the first child tried at u
without draft_probs), the sum of the next residual (a rejection with
draft_probs), and the final exponential race over p'. p' is never materialized:
with draft_probs it is recomputed per entry from p_u, q_u and the normalizers of
the committed updates, kept in a [B, N] workspace; without, the zeroed tokens
are kept there (see csrc/tree_verify/tree_verify_math.h). Divisions use
div_rn, as the C++ and CUDA kernels do. The race and argmax keep per-lane bests
(one tile-wide reduction per row), one Philox block serves 4 entries, and `vocab`
is specialized (aligned rows, vectorized loads).
"""

import triton
import triton.language as tl

from .philox import PURPOSE_ACCEPT, PURPOSE_BONUS, PURPOSE_RESIDUAL, bits_to_uniform, exp_noise, philox_bits, philox_tile
from .rejection import lane_argmax_update, lanes_argmax, prob_mass, row_argmax


@triton.jit
def residual_step(r, z, q):
    """max(r / z - mass(q), 0): one residual update of an entry."""
    d = tl.math.div_rn(r, z) - prob_mass(q)
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

    Per-lane running bests, one tile-wide reduction; one Philox block per 4 entries;
    scores mass / noise (0 without mass); entries past the row load 0 and never win."""
    offs = tl.arange(0, BLOCK)
    best = tl.full([BLOCK], -1.0, tl.float32)
    best_index = tl.zeros([BLOCK], tl.int32)
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
        score = tl.math.div_rn(mass, exp_noise(philox_tile(seed, offset, position, purpose, start, BLOCK)))
        best, best_index = lane_argmax_update(score, idx, best, best_index)
    _, index = lanes_argmax(best, best_index)
    return index.to(tl.int64)


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
    token_ids_ptr,       # int64 out [B, N]
    accepted_path_ptr,   # int32 out [B, N]
    num_accepted_ptr,    # int32 out [B]
    nodes,
    vocab: tl.constexpr,  # fixed per model: specialized (aligned rows, vectorized loads, static loop bounds)
    HAS_NUM_NODES: tl.constexpr,
    HAS_DRAFT_PROBS: tl.constexpr,
    HAS_GREEDY: tl.constexpr,
    BLOCK_N: tl.constexpr,   # power of two >= N
    BLOCK: tl.constexpr,     # vocab tile
):
    b = tl.program_id(0).to(tl.int64)
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
    tl.store(out_path, 0)

    u = tl.zeros([], tl.int64)
    k = tl.zeros([], tl.int64)
    if greedy != 0:
        best = row_argmax(target, vocab, BLOCK)
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
        c = tl.full([], 1, tl.int64)
        while c < n:
            par = tl.load(parents + c)
            par = tl.where((par >= 0) & (par < c), par, 0)
            if par == u:
                x = tl.load(tokens + c)
                in_vocab = (x >= 0) & (x < vocab)
                xs = tl.where(in_vocab, x, 0)
                uc = bits_to_uniform(philox_bits(seed, offset, c - 1, PURPOSE_ACCEPT, tl.zeros([], tl.int64)))
                p_row = target + u * vocab
                if HAS_DRAFT_PROBS:
                    q_row = draft + u * vocab
                    z_m = normalizer(z, m)
                    q_x = tl.load(q_row + xs).to(tl.float32)
                    r_x = tree_residual(tl.load(p_row + xs).to(tl.float32), q_x, z, m)
                    accept = in_vocab & (uc * prob_mass(q_x) < tl.math.div_rn(r_x, z_m))
                    if not accept:
                        new_total = next_residual_sum(p_row, q_row, vocab, z, m, z_m, BLOCK)
                        if new_total > 0:
                            tl.store(z + m, new_total)
                            tl.debug_barrier()
                            m += 1
                else:
                    if rejected == 0:
                        total, nonzero = row_sum_count(p_row, vocab, BLOCK)
                    p_x = prob_mass(tl.load(p_row + xs).to(tl.float32))
                    j = tl.zeros([], tl.int64)
                    while j < m:
                        p_x = tl.where(tl.load(zeroed + j) == x, 0.0, p_x)
                        j += 1
                    p_x = tl.where(in_vocab, p_x, 0.0)
                    accept = in_vocab & (uc * total < p_x)
                    if (not accept) & (p_x > 0) & (nonzero - m > 1):
                        tl.store(zeroed + m, x.to(tl.int32))
                        tl.debug_barrier()
                        m += 1
                        total -= p_x
                if accept:
                    tl.store(out_tokens + k, x)
                    tl.store(out_path + k + 1, (tl.zeros([], tl.int64) + c).to(tl.int32))
                    k += 1
                    u = c + tl.zeros([], tl.int64)
                    rejected = tl.zeros([], tl.int32)
                    m = tl.zeros([], tl.int64)
                else:
                    rejected = tl.full([], 1, tl.int32)
            c += 1
        purpose = tl.where(rejected != 0, PURPOSE_RESIDUAL, PURPOSE_BONUS)
        final = final_race(target + u * vocab, draft + u * vocab, vocab, z, zeroed, m, seed, offset, u, purpose,
                           HAS_DRAFT_PROBS, BLOCK)

    tl.store(out_tokens + k, final)
    tl.store(num_accepted_ptr + b, k.to(tl.int32))
    js = tl.arange(0, BLOCK_N).to(tl.int64)
    pad = (js > k) & (js < nodes)
    tl.store(out_tokens + js, tl.full([BLOCK_N], -1, tl.int64), mask=pad)
    tl.store(out_path + js, tl.full([BLOCK_N], -1, tl.int32), mask=pad)
