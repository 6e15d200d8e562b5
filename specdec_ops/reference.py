"""Plain-PyTorch reference implementations: the ground truth that tests and
benchmarks compare every backend with. Written for clarity, not speed: per
request Python loops, whole-row tensor math.

The random numbers follow the one Philox4x32-10 scheme of DESIGN.md §5.1
(csrc/common/philox.h), computed here with int64 tensors holding uint32 values.
"""

from __future__ import annotations

import math

import torch

from .types import SampleOutput, TreeSampleOutput

# Purposes (csrc/common/philox.h): part of the counter, they keep the streams apart.
PURPOSE_ACCEPT = 0
PURPOSE_RESIDUAL = 1
PURPOSE_BONUS = 2

_MASK32 = 0xFFFFFFFF
_M0, _M1 = 0xD2511F53, 0xCD9E8D57
_W0, _W1 = 0x9E3779B9, 0xBB67AE85


def _mulhilo(a: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(hi, lo) 32-bit halves of the 64-bit product a * m, exactly, in int64 (16-bit limbs)."""
    a_lo, a_hi = a & 0xFFFF, a >> 16
    m_lo, m_hi = m & 0xFFFF, m >> 16
    ll, hl, lh, hh = a_lo * m_lo, a_hi * m_lo, a_lo * m_hi, a_hi * m_hi
    mid = (ll >> 16) + (hl & 0xFFFF) + (lh & 0xFFFF)
    lo = ((mid & 0xFFFF) << 16) | (ll & 0xFFFF)
    hi = (hh + (hl >> 16) + (lh >> 16) + (mid >> 16)) & _MASK32
    return hi, lo


def philox4x32_10(c0, c1, c2, c3, k0, k1):
    """Philox4x32-10 on int64 tensors (or ints) holding uint32 values; returns 4 words."""
    c0, c1, c2, c3, k0, k1 = (torch.as_tensor(v, dtype=torch.int64) for v in (c0, c1, c2, c3, k0, k1))
    for _ in range(10):
        hi0, lo0 = _mulhilo(c0, _M0)
        hi1, lo1 = _mulhilo(c2, _M1)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0, k1 = (k0 + _W0) & _MASK32, (k1 + _W1) & _MASK32
    return c0, c1, c2, c3


def philox_bits(seed: int, offset: int, position: int, purpose: int, index: torch.Tensor) -> torch.Tensor:
    """The 32 random bits (int64 tensor) for each vocab index in `index`."""
    seed &= (1 << 64) - 1
    offset &= (1 << 64) - 1
    index = torch.as_tensor(index, dtype=torch.int64)
    words = philox4x32_10(index >> 2, position & _MASK32, offset & _MASK32,
                          (((offset >> 32) << 8) | purpose) & _MASK32, seed & _MASK32, seed >> 32)
    stacked = torch.stack(torch.broadcast_tensors(*words), dim=-1)
    return torch.gather(stacked, -1, (index & 3).unsqueeze(-1)).squeeze(-1)


def bits_to_uniform(bits: torch.Tensor) -> torch.Tensor:
    """float32 uniform strictly inside (0, 1): (2k + 1) / 2^24, k the top 23 bits."""
    return (((bits >> 9) << 1) | 1).to(torch.float32) * 2.0**-24


def philox_uniform(seed: int, offset: int, position: int, purpose: int, index) -> torch.Tensor:
    return bits_to_uniform(philox_bits(seed, offset, position, purpose, torch.as_tensor(index)))


def prob_mass(p: torch.Tensor) -> torch.Tensor:
    """Probabilities as float32 mass: NaN and negative entries count as zero."""
    p = p.float()
    return torch.where(p > 0, p, torch.zeros((), dtype=torch.float32))


def race_sample(mass: torch.Tensor, seed: int, offset: int, position: int, purpose: int) -> int:
    """Exponential race over an unnormalized row: argmax mass_i / E_i, E_i = -log(u_i) (first index on ties)."""
    idx = torch.arange(mass.shape[-1])
    noise = -torch.log(philox_uniform(seed, offset, position, purpose, idx))
    score = torch.where(mass > 0, mass / noise, torch.zeros((), dtype=torch.float32))
    return int(torch.argmax(score))


def _chain_one(p_rows, q_rows, drafts, n, greedy, seed, offset, bonus=None, rates=None):
    """Tokens emitted for one request: accepted drafts, then the correction or bonus token.

    bonus: the externally given bonus id (then p_rows[n] is never read and may be absent);
    rates: the synthetic acceptance rates (accept a draft in the vocabulary iff u_k < rates[k])."""
    vocab = p_rows.shape[-1]
    out = []
    for k in range(n):
        x = int(drafts[k])
        p = prob_mass(p_rows[k])
        in_vocab = 0 <= x < vocab
        if rates is not None:
            u = philox_uniform(seed, offset, k, PURPOSE_ACCEPT, 0)
            if in_vocab and bool(u < rates[k]):
                out.append(x)
                continue
            if greedy:
                return out + [int(torch.argmax(p))]
        elif greedy:
            best = int(torch.argmax(p))
            if x != best:
                return out + [best]
            out.append(x)
            continue
        elif in_vocab:
            u = philox_uniform(seed, offset, k, PURPOSE_ACCEPT, 0)
            q_x = prob_mass(q_rows[k])[x] if q_rows is not None else torch.tensor(1.0)
            if bool(u * q_x < p[x]):
                out.append(x)
                continue
        # Rejected at k: race over the residual max(p - q, 0) (q one-hot at x without draft probabilities;
        # an x outside the vocabulary removes nothing), or over p when the residual has no mass.
        if q_rows is not None:
            q = prob_mass(q_rows[k])
        else:
            q = torch.zeros(vocab)
            if in_vocab:
                q[x] = 1.0
        residual = torch.clamp(p - q, min=0.0)
        if bool((residual > 0).any()):
            return out + [race_sample(residual, seed, offset, k, PURPOSE_RESIDUAL)]
        return out + [race_sample(p, seed, offset, k, PURPOSE_RESIDUAL)]
    if bonus is not None:
        return out + [bonus]
    p = prob_mass(p_rows[n])
    return out + [int(torch.argmax(p)) if greedy else race_sample(p, seed, offset, n, PURPOSE_BONUS)]


def _pack_output(per_request: list[list[int]], width: int, device) -> SampleOutput:
    token_ids = torch.full((len(per_request), width), -1, dtype=torch.int64)
    num_accepted = torch.zeros(len(per_request), dtype=torch.int32)
    for b, toks in enumerate(per_request):
        token_ids[b, : len(toks)] = torch.tensor(toks, dtype=torch.int64)
        num_accepted[b] = len(toks) - 1
    return SampleOutput(token_ids.to(device), num_accepted.to(device))


def _keywords(bonus_token_ids, synthetic_acceptance_rates):
    """Host copies of the engine keywords: (bonus ids as a list or None, rates float32 or None)."""
    bonus = None if bonus_token_ids is None else [int(v) for v in bonus_token_ids.reshape(-1).cpu()]
    rates = None if synthetic_acceptance_rates is None else synthetic_acceptance_rates.float().cpu()
    return bonus, rates


def rejection_sample(target_probs, draft_token_ids, num_draft_tokens, draft_probs=None, *, seeds, offsets,
                     greedy=None, bonus_token_ids=None, reject_invalid_drafts=False,
                     synthetic_acceptance_rates=None) -> SampleOutput:
    """Chain rejection sampling, padded layout (DESIGN.md §5.2), with the engine keywords (issue #14).

    With bonus_token_ids the target may be [B, K, V] (no bonus rows). An id outside the
    vocabulary is rejected at its position here whatever reject_invalid_drafts (which only
    decides whether the public wrappers refuse such ids on CPU)."""
    batch, _, _ = target_probs.shape
    width = draft_token_ids.shape[1] + 1
    bonus, rates = _keywords(bonus_token_ids, synthetic_acceptance_rates)
    results = []
    for b in range(batch):
        results.append(_chain_one(
            target_probs[b].cpu(), None if draft_probs is None else draft_probs[b].cpu(),
            draft_token_ids[b].cpu(), int(num_draft_tokens[b]), greedy is not None and bool(greedy[b]),
            int(seeds[b]), int(offsets[b]), None if bonus is None else bonus[b], rates))
    return _pack_output(results, width, target_probs.device)


def rejection_sample_packed(target_probs, cu_num_draft_tokens, draft_token_ids, draft_probs=None, *, seeds,
                            offsets, greedy=None, max_num_draft_tokens: int, bonus_token_ids=None,
                            reject_invalid_drafts=False, synthetic_acceptance_rates=None) -> SampleOutput:
    """Chain rejection sampling, packed layout: request b owns target rows cu[b] + b .. cu[b+1] + b, or
    cu[b] .. cu[b+1] - 1 when the target has no bonus rows ([T, V], only with bonus_token_ids)."""
    cu = [int(c) for c in cu_num_draft_tokens]
    bonus, rates = _keywords(bonus_token_ids, synthetic_acceptance_rates)
    bonus_rows = target_probs.shape[0] == draft_token_ids.shape[0] + len(cu) - 1
    results = []
    for b in range(len(cu) - 1):
        lo, hi = cu[b], cu[b + 1]
        base = lo + b if bonus_rows else lo
        results.append(_chain_one(
            target_probs[base: base + hi - lo + 1].cpu(), None if draft_probs is None else draft_probs[lo:hi].cpu(),
            draft_token_ids[lo:hi].cpu(), hi - lo, greedy is not None and bool(greedy[b]),
            int(seeds[b]), int(offsets[b]), None if bonus is None else bonus[b], rates))
    return _pack_output(results, max_num_draft_tokens + 1, target_probs.device)


# ---------------------------------------------------------------------------------------------- tree verification


def philox_uniform_rows(seeds: torch.Tensor, offsets: torch.Tensor, position: torch.Tensor, purpose,
                        index: torch.Tensor) -> torch.Tensor:
    """Uniforms [B, len(index)]: request b's numbers for (seeds[b], offsets[b], position[b], purpose[b]).

    The batched form of :func:`philox_uniform` (same counter layout); `position` and
    `purpose` are int64 [B] tensors or ints, `index` an int64 [L] tensor of vocab indices.
    """
    seeds, offsets = seeds.to(torch.int64), offsets.to(torch.int64)
    batch = seeds.shape[0]
    position = torch.as_tensor(position, dtype=torch.int64).expand(batch)
    purpose = torch.as_tensor(purpose, dtype=torch.int64).expand(batch)
    index = torch.as_tensor(index, dtype=torch.int64)[None, :]
    col = lambda t: t[:, None]  # noqa: E731
    words = philox4x32_10(index >> 2, col(position & _MASK32), col(offsets & _MASK32),
                          col(((((offsets >> 32) & _MASK32) << 8) & _MASK32) | purpose),
                          col(seeds & _MASK32), col((seeds >> 32) & _MASK32))
    stacked = torch.stack(torch.broadcast_tensors(*words), dim=-1)
    word = (index & 3).expand(batch, -1).unsqueeze(-1)
    return bits_to_uniform(torch.gather(stacked, -1, word).squeeze(-1))


def tree_rejection_sample(target_probs, tree_token_ids, parents, num_nodes=None, draft_probs=None, *, seeds,
                          offsets, greedy=None) -> TreeSampleOutput:
    """Tree verification (DESIGN.md §5.3), vectorized over the batch.

    Every child has a larger index than its parent, so one forward scan over the
    nodes c = 1 .. N-1 visits the children of every node in index order: request b
    sits at node u[b] with its current distribution p' and tries c when
    parents[b, c] == u[b]. State per request, as in csrc/tree_verify/tree_verify_math.h:
      * with draft_probs: r = p' * Z unnormalized and its normalizer Z (p' = r / Z,
        starting r = p_u, Z = 1); accept iff u * q_u(x) < r(x) / Z; on rejection
        r <- max(r / Z - q_u, 0), Z <- sum(r) (not committed if the sum is 0);
      * without: p' unnormalized with its running sum S; accept iff u * S < p'(x);
        on rejection p'(x) <- 0 and S <- S - p'(x) (not committed if p' would
        have no mass left);
      * greedy: follow the child whose token is argmax p_u.
    Acceptance uniform of child c: position c - 1, purpose accept. At the end an
    exponential race over p' at u (position u; residual purpose if a child of u was
    rejected, else bonus), or argmax p_u for greedy requests.
    Bad values get the GPU's safe behaviour (the wrapper raises on CPU first): a
    malformed parent is the root, a token outside [0, V) is rejected, num_nodes is
    clamped into [1, N].
    """
    device = target_probs.device
    p_all = prob_mass(target_probs.cpu())
    q_all = None if draft_probs is None else prob_mass(draft_probs.cpu())
    batch, nodes, vocab = p_all.shape
    tokens = tree_token_ids.cpu().to(torch.int64)
    par = parents.cpu().to(torch.int64)
    n = torch.full((batch,), nodes, dtype=torch.int64) if num_nodes is None else \
        num_nodes.cpu().to(torch.int64).clamp(1, nodes)
    is_greedy = torch.zeros(batch, dtype=torch.bool) if greedy is None else greedy.cpu().to(torch.bool)
    seeds, offsets = seeds.cpu(), offsets.cpu()
    rows = torch.arange(batch)

    u = torch.zeros(batch, dtype=torch.int64)          # current node
    k = torch.zeros(batch, dtype=torch.int64)          # accepted nodes so far
    path = torch.full((batch, nodes), -1, dtype=torch.int64)
    path[:, 0] = 0
    out = torch.full((batch, nodes), -1, dtype=torch.int64)
    r = p_all[:, 0].clone()                            # p' (unnormalized)
    z = torch.ones(batch)                              # normalizer of p' (draft_probs)
    s = r.sum(-1)                                      # sum of p' (no draft_probs)
    best = torch.argmax(r, -1)                         # argmax p_u (greedy), first index on ties
    rejected = torch.zeros(batch, dtype=torch.bool)    # a child of u was tried and rejected

    for c in range(1, nodes):
        pc = par[:, c]
        pc = torch.where((pc >= 0) & (pc < c), pc, torch.zeros_like(pc))
        tries = (c < n) & (pc == u)
        x = tokens[:, c]
        in_vocab = (x >= 0) & (x < vocab)
        xs = x.clamp(0, vocab - 1)
        uc = philox_uniform_rows(seeds, offsets, c - 1, PURPOSE_ACCEPT, torch.zeros(1, dtype=torch.int64))[:, 0]
        if q_all is not None:
            q = q_all[rows, u]
            accept = in_vocab & (uc * q[rows, xs] < r[rows, xs] / z)
        else:
            p_x = torch.where(in_vocab, r[rows, xs], torch.zeros(()))
            accept = in_vocab & (uc * s < p_x)
        accept = torch.where(is_greedy, x == best, accept) & tries
        reject = tries & ~accept & ~is_greedy

        # Rejection: update p' where the update leaves some mass.
        if q_all is not None:
            d = r / z[:, None] - q
            r_new = torch.where(d > 0, d, torch.zeros(()))   # max(d, 0), NaN -> 0 as in the kernels
            z_new = r_new.sum(-1)
            commit = reject & (z_new > 0)
            r = torch.where(commit[:, None], r_new, r)
            z = torch.where(commit, z_new, z)
        else:
            r_new = r.clone()
            r_new[rows, xs] = torch.where(in_vocab, torch.zeros(()), r[rows, xs])
            commit = reject & (r_new > 0).any(-1)
            r = torch.where(commit[:, None], r_new, r)
            s = torch.where(commit, s - p_x, s)
        rejected |= reject

        # Acceptance: move to c with p' = p_c.
        out[rows[accept], k[accept]] = x[accept]
        k = k + accept.long()
        path[rows[accept], k[accept]] = c
        u = torch.where(accept, c, u)
        p_c = p_all[:, c]
        r = torch.where(accept[:, None], p_c, r)
        z = torch.where(accept, torch.ones(()), z)
        s = torch.where(accept, p_c.sum(-1), s)
        best = torch.where(accept, torch.argmax(p_c, -1), best)
        rejected &= ~accept

    purpose = torch.where(rejected, PURPOSE_RESIDUAL, PURPOSE_BONUS)
    noise = -torch.log(philox_uniform_rows(seeds, offsets, u, purpose, torch.arange(vocab)))
    score = torch.where(r > 0, r / noise, torch.zeros(()))
    final = torch.where(is_greedy, best, torch.argmax(score, -1))
    out[rows, k] = final
    return TreeSampleOutput(out.to(device), path.to(torch.int32).to(device), k.to(torch.int32).to(device))


# ---------------------------------------------------------------------------------------------- tree (§5.4)


def _to_int64_word(bits: int) -> int:
    """A 64-bit pattern as the signed value torch.int64 stores."""
    return bits - (1 << 64) if bits >= (1 << 63) else bits


def build_tree(parents: torch.Tensor, num_nodes: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(mask int64 [B, N, ceil(N/64)], depth int32 [B, N]) by walking every node's ancestors.

    Bit j % 64 of word j // 64 in row i is set iff node j is i or an ancestor of i.
    Nodes >= num_nodes[b] are padding: zero rows, depth -1. A malformed parent (only reachable
    on the GPU, where nothing raises) is treated as the root, as the CUDA kernel does.
    """
    batch, n = parents.shape
    words = (n + 63) // 64
    mask = torch.zeros(batch, n, words, dtype=torch.int64)
    depth = torch.full((batch, n), -1, dtype=torch.int32)
    par = parents.cpu().tolist()
    for b in range(batch):
        real = n if num_nodes is None else min(max(int(num_nodes[b]), 0), n)
        for i in range(real):
            row = [0] * words
            a, steps = i, 0
            while a != -1:
                row[a // 64] |= 1 << (a % 64)
                p = par[b][a]
                a = -1 if a == 0 else (p if 0 <= p < a else 0)
                steps += 1
            depth[b, i] = steps - 1
            mask[b, i] = torch.tensor([_to_int64_word(w) for w in row], dtype=torch.int64)
    return mask.to(parents.device), depth.to(parents.device)


def unpack_tree_mask(mask: torch.Tensor) -> torch.Tensor:
    """bool [B, N, N]: entry [b, i, j] is bit j of row i (node j is i or an ancestor of i)."""
    n = mask.shape[1]
    j = torch.arange(n, device=mask.device)
    words = mask[:, :, j // 64]  # [B, N, N]
    return ((words >> (j % 64)) & 1).bool()


def tree_attention_bias(mask: torch.Tensor, prefix_lens: torch.Tensor, kv_len: int,
                        dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[B, 1, N, kv_len] additive mask (0 visible, -inf hidden), one key at a time."""
    batch, n, _ = mask.shape
    bits = unpack_tree_mask(mask).cpu()
    bias = torch.full((batch, 1, n, kv_len), float("-inf"), dtype=dtype)
    for b in range(batch):
        p = int(prefix_lens[b])
        bias[b, 0, :, : max(0, min(p, kv_len))] = 0  # the prefix: always visible
        for j in range(max(p, 0), min(p + n, kv_len)):  # tree key j - p: visible iff its bit is set
            bias[b, 0, :, j] = torch.where(bits[b, :, j - p], 0.0, float("-inf")).to(dtype)
    return bias.to(mask.device)


def gather_kv(cache: torch.Tensor, b: int, length: int, block_table: torch.Tensor | None = None) -> torch.Tensor:
    """Request b's first `length` cache slots as [length, H, D] (contiguous or paged cache)."""
    if block_table is None:
        return cache[b, :length]
    block_size = cache.shape[1]
    pos = torch.arange(length, device=cache.device)
    blocks = block_table[b].to(cache.device).long()[pos // block_size]
    return cache[blocks, pos % block_size]


def tree_attention(q, k_cache, v_cache, prefix_lens, mask, *, block_table=None, sm_scale=None):
    """(out [B, N, Hq, D] in q's dtype, lse float32 [B, N, Hq]): dense attention with tree_attention_bias.

    Per request: keys 0 .. prefix_lens[b] + N - 1 of the cache, scores in float32 plus the bias,
    softmax, weighted sum. Keys that no node sees are zeroed first (garbage in unused slots, even
    NaN, never reaches the output). Every row sees the prefix (padding rows too: their mask rows are
    0, so they see the prefix alone); a row that sees no key at all gives 0 and lse -inf.
    """
    batch, n, hq, d = q.shape
    hk = k_cache.shape[2]
    scale = d ** -0.5 if sm_scale is None else sm_scale
    out = torch.zeros(batch, n, hq, d, dtype=torch.float32, device=q.device)
    lse = torch.full((batch, n, hq), float("-inf"), dtype=torch.float32, device=q.device)
    for b in range(batch):
        kv_len = int(prefix_lens[b]) + n
        bias = tree_attention_bias(mask[b: b + 1], prefix_lens[b: b + 1], kv_len)[0, 0]  # [N, L]
        seen = (bias == 0).any(0)  # keys some node sees
        k = gather_kv(k_cache, b, kv_len, block_table).float()
        v = gather_kv(v_cache, b, kv_len, block_table).float()
        k = torch.where(seen[:, None, None], k, 0.0).repeat_interleave(hq // hk, dim=1)  # [L, Hq, D]
        v = torch.where(seen[:, None, None], v, 0.0).repeat_interleave(hq // hk, dim=1)
        scores = torch.einsum("nhd,lhd->hnl", q[b].float(), k) * scale + bias  # [Hq, N, L]
        row_lse = torch.logsumexp(scores, dim=-1)  # [Hq, N]
        o = torch.einsum("hnl,lhd->nhd", torch.softmax(scores, dim=-1), v)
        sees = (row_lse > float("-inf")).T  # [N, Hq]: rows with a visible key (the others' softmax is NaN)
        out[b] = torch.where(sees[..., None], o, 0.0)
        lse[b] = row_lse.T
    return out.to(q.dtype), lse


def merge_attention_states(out_a, lse_a, out_b, lse_b):
    """Softmax merge of two partial attentions over disjoint keys (natural-log LSE).

    out = (e^lse_a out_a + e^lse_b out_b) / (e^lse_a + e^lse_b), lse = log(e^lse_a + e^lse_b);
    a side with lse = -inf contributes nothing; both -inf gives out 0, lse -inf.
    """
    la, lb = lse_a.float(), lse_b.float()
    lse = torch.logaddexp(la, lb)
    finite = lse > float("-inf")
    safe = torch.where(finite, lse, 0.0)
    wa = torch.where(finite, torch.exp(la - safe), 0.0)[..., None]
    wb = torch.where(finite, torch.exp(lb - safe), 0.0)[..., None]
    out = torch.where(wa > 0, wa * out_a.float(), 0.0) + torch.where(wb > 0, wb * out_b.float(), 0.0)
    return out.to(out_a.dtype), lse


# ---------------------------------------------------------------------------------------------- KV commit


_BITS_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def kv_path_scan(seq_len: int, path: list[int], capacity: int, block_row: list[int] | None = None,
                 block_size: int = 1, num_blocks: int = 0) -> tuple[int, int | None, str | None]:
    """(m, bad_index, reason) for one request's path (csrc/kv/kv_math.h, kv_scan_path).

    m is the number of leading valid entries: entry 0 must be 0, later entries
    strictly increase, and slots seq_len + a_i and seq_len + i must exist (below
    `capacity`; paged: their block ids in [0, num_blocks)). A negative entry after
    the root starts the -1 padding. bad_index / reason name the first bad entry
    (None, None for a well-formed path); the GPU kernels just stop there.
    """
    if seq_len < 0:
        return 0, 0, "follows a negative seq_lens entry"
    paged = block_row is not None
    where = "outside the request's blocks" if paged else "outside the cache"

    def slot_ok(pos: int) -> bool:
        if pos < 0 or pos >= capacity:
            return False
        return not paged or 0 <= block_row[pos // block_size] < num_blocks

    prev = -1
    for i, a in enumerate(path):
        if i == 0 and a != 0:
            return 0, 0, "must be 0 (the root)"
        if i > 0 and a < 0:
            later = [j for j in range(i + 1, len(path)) if path[j] >= 0]
            if later:
                return i, later[0], "follows the -1 padding (negative entries may only end a path)"
            return i, None, None
        if i > 0 and a <= prev:
            return i, i, f"is not greater than the entry before it ({prev}): a path must be strictly increasing"
        if a >= capacity or not slot_ok(seq_len + a) or not slot_ok(seq_len + i):
            return i, i, f"reaches slot {seq_len + a} {where}"
        prev = a
    return len(path), None, None


def kv_commit(caches, seq_lens, accepted_path, *, block_table=None) -> None:
    """In-place KV commit as the out-of-place gather (DESIGN.md §5.5).

    For every cache and request b with the valid path prefix a_0..a_{m-1}: slots
    seq_lens[b] + i (i < m) receive the OLD contents of slots seq_lens[b] + a_i
    (gathered into a copy first, then written), then seq_lens[b] += m. Malformed
    entries end the path (what the GPU kernels do; the wrappers raise on CPU).
    """
    caches = list(caches)
    batch = seq_lens.shape[0]
    paged = block_table is not None and len(caches) > 0
    if paged:
        num_blocks, block_size = caches[0].shape[0], caches[0].shape[1]
        capacity = block_table.shape[1] * block_size
        table = block_table.tolist()
    else:
        num_blocks, block_size = 0, 1
        capacity = caches[0].shape[1] if caches else 1 << 62
    lens = seq_lens.tolist()
    paths = accepted_path.tolist()
    for b in range(batch):
        m, _, _ = kv_path_scan(lens[b], paths[b], capacity, table[b] if paged else None, block_size, num_blocks)
        src = [lens[b] + a for a in paths[b][:m]]
        dst = [lens[b] + i for i in range(m)]
        for cache in caches:
            if cache.numel() == 0:
                continue
            cache = cache.view(_BITS_OF_SIZE[cache.element_size()])  # bit-exact moves, any dtype
            if paged:
                blocks_src = torch.tensor([table[b][p // block_size] for p in src], dtype=torch.int64)
                offs_src = torch.tensor([p % block_size for p in src], dtype=torch.int64)
                blocks_dst = torch.tensor([table[b][p // block_size] for p in dst], dtype=torch.int64)
                offs_dst = torch.tensor([p % block_size for p in dst], dtype=torch.int64)
                gathered = cache[blocks_src.to(cache.device), offs_src.to(cache.device)].clone()
                cache[blocks_dst.to(cache.device), offs_dst.to(cache.device)] = gathered
            else:
                gathered = cache[b, torch.tensor(src, dtype=torch.int64, device=cache.device)].clone()
                cache[b, torch.tensor(dst, dtype=torch.int64, device=cache.device)] = gathered
        seq_lens[b] += m


# ---------------------------------------------------------------------------------------------- logits (§5.7)

FLOAT32_MAX = torch.finfo(torch.float32).max


TOP_P_SLACK = 2.0 ** -20  # top-p reaches top_p * (1 - slack) of the mass: csrc/logits/logits_math.h kTopPSlack


def sanitize_logits(logits: torch.Tensor) -> torch.Tensor:
    """float32 logits as every backend reads them: NaN -> -inf, +inf -> the largest finite float32."""
    return torch.nan_to_num(logits.float(), nan=float("-inf"), posinf=FLOAT32_MAX, neginf=float("-inf"))


def order_keys(z: torch.Tensor) -> torch.Tensor:
    """Order-preserving int64 keys (uint32 values) of float32 values (csrc/logits/logits_math.h)."""
    bits = z.contiguous().view(torch.int32).to(torch.int64) & _MASK32
    bits = torch.where(bits == 0x80000000, torch.zeros((), dtype=torch.int64), bits)  # -0.0 -> +0.0
    return torch.where(bits >= 0x80000000, bits ^ _MASK32, bits | 0x80000000)


def process_row(row: torch.Tensor, temperature: float, top_k: int, top_p: float, min_p: float):
    """(probs float32 [V], logprobs float32 [V]) of one row of logits (DESIGN.md §5.7).

    The arithmetic every backend follows (csrc/logits/logits_math.h), on z = (x - max x) / T
    with x the sanitized logits (so max z = 0 and the filters are thresholds on z):
      top-k keeps z_i >= the k-th largest z (ties kept); top-p keeps z_i >= t, t the largest
      value of z among the top-k survivors whose mass sum_{z_j >= t} e^z_j is >= top_p (1 - TOP_P_SLACK) times
      theirs; min-p keeps z_i >= log(min_p) (p_i >= min_p * max p). The kept set is
      {z_i >= tau}, tau the largest of the three thresholds; p_i = e^z_i / S with S the kept
      mass, log p_i = z_i - log S. Greedy rows (T = 0): one-hot at the first argmax of x and
      log_softmax(x). A row without a finite logit has no mass: zeros and -inf.
    Sums in float64 (the kernels sum in float32 or float64: equal up to rounding near-ties).
    """
    x = sanitize_logits(row)
    vocab = x.shape[-1]
    m = x.max()
    if not bool(m > float("-inf")):
        return torch.zeros(vocab), torch.full((vocab,), float("-inf"))
    if temperature == 0:
        probs = torch.zeros(vocab)
        probs[int(torch.argmax(x))] = 1.0  # torch.argmax returns the first maximal index
        return probs, torch.log_softmax(x.double(), -1).float()
    # T = +inf counts as FLT_MAX (logits_math.h row_sampling): -inf / inf would be NaN
    z = (x - m) / torch.tensor(min(temperature, FLOAT32_MAX), dtype=torch.float32)
    e = torch.exp(z)
    keys = order_keys(z)
    tau = torch.zeros((), dtype=torch.int64)  # the smallest key: keeps everything
    if 0 < top_k < vocab:
        tau = torch.maximum(tau, torch.topk(keys, top_k).values[-1])
    if top_p < 1:
        kept = keys >= tau
        sorted_keys, order = torch.sort(keys[kept], descending=True)
        cum = torch.cumsum(e[kept][order].double(), 0)
        target = top_p * float(cum[-1]) * (1.0 - TOP_P_SLACK)
        # mass of {key >= v} for each v: the cumulative sum at the last entry holding v
        last = torch.ones_like(sorted_keys, dtype=torch.bool)
        last[:-1] = sorted_keys[:-1] != sorted_keys[1:]
        reach = last & (cum >= target)
        tau_p = sorted_keys[reach][0] if bool(reach.any()) else sorted_keys[-1]
        tau = torch.maximum(tau, tau_p)
    if min_p > 0:
        tau = torch.maximum(tau, order_keys(torch.log(torch.tensor([min_p], dtype=torch.float32)))[0])
    kept = keys >= tau
    total = float(torch.where(kept, e.double(), 0.0).sum())
    probs = torch.where(kept, e / torch.tensor(total, dtype=torch.float32), torch.zeros(()))
    logprobs = torch.where(kept, z - torch.log(torch.tensor(total, dtype=torch.float32)), float("-inf"))
    return probs, logprobs


def _param(values, r: int, default):
    return default if values is None else values[r].item()


def process_logits(logits, temperature=None, top_k=None, top_p=None, min_p=None, *, return_logprobs=False):
    """float32 probabilities of the processed distribution of every row (DESIGN.md §5.7).

    logits [R, ..., V]; the parameters are None or tensors [R] (row r's parameters apply to
    logits[r]). With return_logprobs, (probs, logprobs) with log p (-inf off the kept set).
    """
    inner = math.prod(logits.shape[1:-1])  # (not -1: ambiguous without rows)
    rows = logits.reshape(logits.shape[0], inner, logits.shape[-1]).cpu()
    probs = torch.zeros(rows.shape, dtype=torch.float32)
    logprobs = torch.full(rows.shape, float("-inf"), dtype=torch.float32)
    for r in range(rows.shape[0]):
        params = (float(_param(temperature, r, 1.0)), int(_param(top_k, r, 0)), float(_param(top_p, r, 1.0)),
                  float(_param(min_p, r, 0.0)))
        for j in range(rows.shape[1]):
            probs[r, j], logprobs[r, j] = process_row(rows[r, j], *params)
    probs = probs.reshape(logits.shape).to(logits.device)
    logprobs = logprobs.reshape(logits.shape).to(logits.device)
    return (probs, logprobs) if return_logprobs else probs


def _expand_rows(param, counts):
    return None if param is None else torch.repeat_interleave(param.cpu(), counts)


def _emitted_logprobs(logprobs_rows, token_ids, row_of_slot):
    """float32 [B, W]: logprobs_rows[row_of_slot[b, i], token_ids[b, i]], NaN where token_ids is -1."""
    out = torch.full(token_ids.shape, float("nan"))
    for b in range(token_ids.shape[0]):
        for i in range(token_ids.shape[1]):
            t = int(token_ids[b, i])
            if t >= 0:
                out[b, i] = logprobs_rows[row_of_slot(b, i), t]
    return out


def _chain_logits_one(probs, q_rows, drafts, n, greedy, seed, offset, bonus, rates):
    """§5.2 on the processed rows of one request, with the engine keywords of the chain ops (issue #14).

    probs: float32 [n (+ 1), V] processed target rows (the bonus row, row n, only read when
    `bonus` is None); q_rows: [n, V] or None (one-hot drafts). A draft id outside [0, V) is
    rejected at its position (the correction drawn as for any rejection there). `rates`: None,
    or the synthetic acceptance rates (accept draft k iff u_k < rates[k], u_k the §5.1 acceptance
    uniform; greedy requests too). `bonus`: None, or the external bonus token id (clamped into
    [0, V), the GPU's behaviour; CPU callers raise on one outside first). Returns the emitted
    tokens and whether the last one is an external bonus token.
    """
    vocab = probs.shape[-1]
    out = []
    for k in range(n):
        x = int(drafts[k])
        p = prob_mass(probs[k])
        in_vocab = 0 <= x < vocab
        u = philox_uniform(seed, offset, k, PURPOSE_ACCEPT, 0)
        if rates is not None:
            accept = in_vocab and bool(u < rates[k])
        elif greedy:
            accept = x == int(torch.argmax(p))
        else:
            q_x = prob_mass(q_rows[k])[x] if q_rows is not None and in_vocab else torch.tensor(1.0)
            accept = in_vocab and bool(u * q_x < p[x])
        if accept:
            out.append(x)
            continue
        if greedy:
            return out + [int(torch.argmax(p))], False
        if q_rows is not None:
            q = prob_mass(q_rows[k])
        else:
            q = torch.zeros(vocab)
            if in_vocab:
                q[x] = 1.0
        residual = torch.clamp(p - q, min=0.0)
        if bool((residual > 0).any()):
            return out + [race_sample(residual, seed, offset, k, PURPOSE_RESIDUAL)], False
        return out + [race_sample(p, seed, offset, k, PURPOSE_RESIDUAL)], False
    if bonus is not None:
        return out + [min(max(int(bonus), 0), vocab - 1)], True
    p = prob_mass(probs[n])
    return out + [int(torch.argmax(p)) if greedy else race_sample(p, seed, offset, n, PURPOSE_BONUS)], False


def _chain_logits(flat_logits, row_params, request_rows, flat_drafts, flat_q, draft_rows, counts, width, seeds,
                  offsets, greedy, bonus_token_ids, synthetic_acceptance_rates, return_logprobs, device):
    """The chain ops from logits over any row layout: flat_logits [R, V] with per-row parameters
    row_params (4 tensors [R] or None); request b's target rows are request_rows(b) and its draft
    rows draft_rows(b) (slices of flat_logits and of flat_drafts [T] / flat_q [T, V]); counts[b] = n_b."""
    if flat_logits.shape[0]:
        probs, logprobs = process_logits(flat_logits, *row_params, return_logprobs=True)
        probs, logprobs = probs.cpu(), logprobs.cpu()
    else:  # no rows at all: every request emits its external bonus token
        probs = logprobs = torch.zeros(flat_logits.shape, dtype=torch.float32)
    batch = len(counts)
    token_ids = torch.full((batch, width), -1, dtype=torch.int64)
    num_accepted = torch.zeros(batch, dtype=torch.int32)
    lp = torch.full((batch, width), float("nan"))
    rates = None if synthetic_acceptance_rates is None else synthetic_acceptance_rates.cpu().float()
    bonus = None if bonus_token_ids is None else bonus_token_ids.cpu().reshape(-1)
    drafts = flat_drafts.cpu()
    q_all = None if flat_q is None else flat_q.cpu()
    for b in range(batch):
        rows, drows = request_rows(b), draft_rows(b)
        toks, external = _chain_logits_one(
            probs[rows], None if q_all is None else q_all[drows], drafts[drows], counts[b], bool(greedy[b]),
            int(seeds[b]), int(offsets[b]), None if bonus is None else bonus[b], rates)
        token_ids[b, : len(toks)] = torch.tensor(toks, dtype=torch.int64)
        num_accepted[b] = len(toks) - 1
        for i, t in enumerate(toks[: len(toks) - 1] if external else toks):
            lp[b, i] = logprobs[rows][i, t]
    return token_ids.to(device), num_accepted.to(device), lp.to(device) if return_logprobs else None


def _greedy_of(temperature, batch):
    return torch.zeros(batch, dtype=torch.bool) if temperature is None else temperature.cpu() == 0


def rejection_sample_logits(target_logits, draft_token_ids, num_draft_tokens, draft_probs=None, *, temperature,
                            top_k, top_p, min_p, seeds, offsets, return_logprobs=False, bonus_token_ids=None,
                            synthetic_acceptance_rates=None):
    """§5.7 as its definition: rejection_sample(process_logits(...), greedy=temperature == 0) plus logprobs,
    with the engine keywords of :func:`_chain_logits_one`. target_logits [B, K+1, V], or [B, K, V] when
    bonus_token_ids is given (no bonus rows)."""
    batch, rows, vocab = target_logits.shape
    max_draft = draft_token_ids.shape[1]
    counts = [min(max(int(v), 0), max_draft) for v in num_draft_tokens.cpu()]
    row_params = [_expand_rows(t, torch.full((batch,), rows)) for t in (temperature, top_k, top_p, min_p)]
    flat_q = None if draft_probs is None else draft_probs.reshape(batch * max_draft, vocab)
    return _chain_logits(target_logits.reshape(batch * rows, vocab), row_params,
                         lambda b: slice(b * rows, (b + 1) * rows), draft_token_ids.reshape(-1), flat_q,
                         lambda b: slice(b * max_draft, (b + 1) * max_draft), counts, max_draft + 1, seeds.cpu(),
                         offsets.cpu(), _greedy_of(temperature, batch), bonus_token_ids, synthetic_acceptance_rates,
                         return_logprobs, target_logits.device)


def rejection_sample_logits_packed(target_logits, cu_num_draft_tokens, draft_token_ids, draft_probs=None, *,
                                   temperature, top_k, top_p, min_p, seeds, offsets, return_logprobs=False,
                                   max_num_draft_tokens: int, bonus_token_ids=None, synthetic_acceptance_rates=None):
    """Packed form of :func:`rejection_sample_logits`: request b owns rows cu[b] + b .. cu[b+1] + b, or
    cu[b] .. cu[b+1] - 1 when target_logits has T rows (bonus_token_ids given: no bonus rows)."""
    cu = cu_num_draft_tokens.cpu().to(torch.int64)
    batch = cu.shape[0] - 1
    total = draft_token_ids.shape[0]
    bonus_rows = int(target_logits.shape[0] == total + batch)
    counts = [int(c) for c in cu[1:] - cu[:-1]]
    row_params = [_expand_rows(t, cu[1:] - cu[:-1] + bonus_rows) for t in (temperature, top_k, top_p, min_p)]
    starts = [int(cu[b]) + b * bonus_rows for b in range(batch)]
    return _chain_logits(target_logits, row_params, lambda b: slice(starts[b], starts[b] + counts[b] + bonus_rows),
                         draft_token_ids, draft_probs, lambda b: slice(int(cu[b]), int(cu[b + 1])), counts,
                         max_num_draft_tokens + 1, seeds.cpu(), offsets.cpu(), _greedy_of(temperature, batch),
                         bonus_token_ids, synthetic_acceptance_rates, return_logprobs, target_logits.device)


def tree_rejection_sample_logits(target_logits, tree_token_ids, parents, num_nodes=None, draft_probs=None, *,
                                 temperature, top_k, top_p, min_p, seeds, offsets, return_logprobs=False):
    """§5.7 for trees: tree_rejection_sample(process_logits(...), greedy=temperature == 0) plus logprobs.

    The token at slot i of the output is emitted by node accepted_path[b, i] (its child on the
    path, or the final token drawn at the last node of the path).
    """
    batch, nodes, vocab = target_logits.shape
    probs, logprobs = process_logits(target_logits, temperature, top_k, top_p, min_p, return_logprobs=True)
    greedy = None if temperature is None else (temperature.cpu() == 0)
    out = tree_rejection_sample(probs.cpu(), tree_token_ids.cpu(), parents.cpu(),
                                None if num_nodes is None else num_nodes.cpu(),
                                None if draft_probs is None else draft_probs.cpu(), seeds=seeds.cpu(),
                                offsets=offsets.cpu(), greedy=greedy)
    lp = None
    if return_logprobs:
        rows = logprobs.cpu().reshape(batch * nodes, vocab)
        path = out.accepted_path
        lp = _emitted_logprobs(rows, out.token_ids, lambda b, i: b * nodes + int(path[b, i])).to(target_logits.device)
    device = target_logits.device
    return out.token_ids.to(device), out.accepted_path.to(device), out.num_accepted.to(device), lp
