"""Vocab-parallel verification for tensor-parallel targets (DESIGN.md §5.8).

A tensor-parallel LM head leaves each rank with the logits of a slice of the
vocabulary, ``[.., V_local]`` covering global ids ``vocab_start ..
vocab_start + V_local - 1``. The functions here verify drafts on those shards
and return, on every rank, the result of the unsharded §5.7 op on the
concatenated logits for the same seeds: no rank ever holds a full row.

The arithmetic is the one of csrc/logits/logits_math.h (R = the number of logits
rows, B*(K+1) or T+B); how its pieces combine across ranks:

* the row maximum m of the sanitized logits x and its first index: one
  all-reduce MAX of int64 keys ``(order-preserving bits of the value, ~global
  index)`` (also the greedy rows' argmax);
* ``z = (x - m) / T`` and ``e = exp(z)`` are then exact per shard; the top-k
  threshold is the kernels' radix select over the order keys of z (4 passes of
  8-bit digits, the count histograms ``[R, 256]`` all-reduced), top-p the same
  with mass histograms (float64, all-gathered), min-p the key of log(min_p), and
  the kept mass S one float64 sum;
* the acceptance test of draft k needs ``p_k(x_k)`` and ``q_k(x_k)``, which only
  the rank owning ``x_k`` has: it decides, and one all-reduce SUM of ``[B, K]``
  flags (with the log-probabilities) tells the others;
* the final token is an exponential race (§5.2) whose noise is keyed by the
  global vocabulary index (§5.1), so each rank races over its shard and one
  all-reduce MAX of packed ``(score, ~global index)`` keys picks the winner
  (the smallest index on ties), for the residual and for its fallback at once;
* the tree walk (§5.3) is sequential in the nodes: per node one all-gather of
  [B, 5] numbers (the owner's acceptance flag, p'(x) and log p(x), each rank's
  mass of the would-be residual) keeps every rank's shard of p' in step.

Float sums (histogram masses, S) are all-gathered and added in rank order, so
every rank gets bit-identical values whatever the collective algorithm; max,
counts and flags are exact and use all-reduce. Every collective has a shape fixed
by B, K, 256 and the world size: the GPU path (NCCL) has no host sync (see
``check_shards``); the CPU path (gloo) compacts candidate lists, which reads
their sizes on the host.

The per-shard work is plain PyTorch here. A fused GPU kernel per step would do
each pass over a shard in one read: the max and argmax; z, e, the key digit
histograms (in shared memory) and the partial sums; and the race over the B
selected rows with Philox generated in registers.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from . import logits as _logits
from ._backend import values_checked_here
from ._checks import (PROB_DTYPES, check_bonus_token_ids, check_chain_values,
                      check_cu_num_draft_tokens, check_cu_values, check_device, check_draft_ids, check_dtype,
                      check_index_tensor, check_rank, check_reject_invalid_drafts, check_shape, check_synthetic_rates,
                      check_tensor, check_tree_inputs, check_tree_values, fail, packed_max_num_draft_tokens, rng_inputs)
from .types import LogitsSampleOutput, LogitsTreeSampleOutput

__all__ = ["rejection_sample_logits", "rejection_sample_logits_packed", "tree_rejection_sample_logits",
           "check_vocab_shards"]

_MASK32 = 0xFFFFFFFF
_FLT_MAX = torch.finfo(torch.float32).max
# torch 2.14 renames all_gather_into_tensor (still there, deprecated) to all_gather_single.
_all_gather_single = getattr(dist, "all_gather_single", None) or getattr(dist, "all_gather_into_tensor", None)
_PURPOSE_ACCEPT, _PURPOSE_RESIDUAL, _PURPOSE_BONUS = 0, 1, 2  # csrc/common/philox.h
_DIGIT_BITS = 8
_NUM_DIGITS = 1 << _DIGIT_BITS
_SHIFTS = (24, 16, 8, 0)  # radix passes over the 32 bits of an order key, most significant first


# ---------------------------------------------------------------------------------------------- collectives


class _Comm:
    """The collectives of one call, on `group`, with tensors on `device`.

    ``stats`` (a dict or None) accumulates ``collectives`` and ``bytes_sent``: what
    this rank sends under ring algorithms (all-reduce of n bytes: 2(w-1)/w * n;
    all-gather of n bytes per rank: (w-1) * n).
    """

    def __init__(self, group, device: torch.device, stats: dict | None):
        if not dist.is_available() or not dist.is_initialized():
            fail("torch.distributed is not initialized: call torch.distributed.init_process_group first "
                 "(group=None means the default group)")
        self.group = group
        # device=None (the call's logits are not even a tensor): the device the group's backend communicates on.
        if device is None:
            gloo = "gloo" in str(dist.get_backend(group)).lower()
            device = torch.device("cpu") if gloo or not torch.cuda.is_available() else \
                torch.device("cuda", torch.cuda.current_device())
        self.device = device
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.stats = stats
        if stats is not None:
            stats.setdefault("collectives", 0)
            stats.setdefault("bytes_sent", 0)

    def _count(self, nbytes: float) -> None:
        if self.stats is not None:
            self.stats["collectives"] += 1
            self.stats["bytes_sent"] += int(nbytes)

    def all_reduce(self, t: torch.Tensor, op) -> torch.Tensor:
        """All-reduce (MAX or SUM) of an exact (integer) or owner-only tensor, in place; returns it."""
        if self.world > 1:
            self._count(2 * (self.world - 1) / self.world * t.numel() * t.element_size())
            dist.all_reduce(t, op=op, group=self.group)
        return t

    def all_gather(self, t: torch.Tensor) -> torch.Tensor:
        """[world, *t.shape]: every rank's t, in rank order."""
        t = t.contiguous()
        if self.world == 1:
            return t.unsqueeze(0)
        out = torch.empty(self.world * t.numel(), dtype=t.dtype, device=t.device)
        self._count((self.world - 1) * t.numel() * t.element_size())
        _all_gather_single(out, t.reshape(-1), group=self.group)
        return out.view((self.world,) + tuple(t.shape))

    def sum_float(self, t: torch.Tensor) -> torch.Tensor:
        """Sum of every rank's float partials, added in rank order: bit-identical on every rank."""
        gathered = self.all_gather(t)
        total = gathered[0].clone()
        for r in range(1, self.world):
            total += gathered[r]
        return total


def check_vocab_shards(vocab_start: int, local_vocab: int, vocab_size: int, *, group=None,
                       device: torch.device | str | None = None, extra: tuple[int, ...] = ()) -> None:
    """Check on every rank that the ranks' shards tile ``[0, vocab_size)`` in rank order.

    All-gathers ``(vocab_start, local_vocab, vocab_size, *extra)`` from every rank
    and raises the same SpecDecArgumentError on every rank when the shards leave a
    gap, overlap, are out of rank order, when ranks disagree on ``vocab_size`` or
    on any entry of ``extra`` (the verification functions pass their batch
    shape and which optional arguments are given, so mismatched calls raise
    instead of hanging in a later collective).

    Parameters
    ----------
    vocab_start : int
        First global id of this rank's shard.
    local_vocab : int
        V_local, the number of ids in this rank's shard (may be 0).
    vocab_size : int
        The global V.
    group : torch.distributed process group, optional
        None means the default group.
    device : torch.device, optional
        Where the exchanged tensor lives (CUDA for NCCL, CPU for gloo); None: CUDA
        when the group's backend is NCCL, else CPU. On CUDA this reads the result
        on the host (one sync): call it once, then pass ``check_shards=False``.
    extra : tuple of int
        Values that must agree across ranks.
    """
    if device is None:
        backend = dist.get_backend(group)
        device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
    comm = _Comm(group, torch.device(device), None)
    mine = torch.tensor([vocab_start, local_vocab, vocab_size, *extra], dtype=torch.int64)
    table = comm.all_gather(mine.to(comm.device)).cpu()
    _check_tiling(table, comm.rank)


def _check_tiling(table: torch.Tensor, rank: int) -> None:
    """Raise (the same message on every rank) unless the rows of `table` tile [0, V) in rank order."""
    rows = [[int(v) for v in row] for row in table]
    who = f"(this is rank {rank})"
    sizes = {row[2] for row in rows}
    if len(sizes) != 1:
        fail("vocab_size differs across ranks: " + ", ".join(f"rank {r}: {row[2]}" for r, row in enumerate(rows))
             + f" {who}")
    for r, row in enumerate(rows):
        if row[3:] != rows[0][3:]:
            fail(f"rank {r} was called with different shapes or optional arguments than rank 0 "
                 f"({row[3:]} vs {rows[0][3:]}: batch size, rows, K, and which of draft_probs, temperature, "
                 f"top_k, top_p, min_p, seeds, return_logprobs are given) {who}")
    vocab = rows[0][2]
    expected = 0
    for r, (start, size, *_) in enumerate(rows):
        if size < 0 or start != expected:
            spans = ", ".join(f"rank {i}: [{s}, {s + n})" for i, (s, n, *_) in enumerate(rows))
            fail(f"the vocab shards do not tile [0, {vocab}) in rank order: rank {r} starts at {start} "
                 f"where {expected} was expected ({spans}) {who}")
        expected = start + size
    if expected != vocab:
        spans = ", ".join(f"rank {i}: [{s}, {s + n})" for i, (s, n, *_) in enumerate(rows))
        fail(f"the vocab shards cover [0, {expected}) but vocab_size is {vocab} ({spans}) {who}")


# ---------------------------------------------------------------------------------------------- per-shard math


def _philox_blocks(seeds, offsets, position, purpose, group: torch.Tensor) -> torch.Tensor:
    """§5.1 Philox blocks [B, G, 4] (uint32 words in int64) for the blocks `group` [G] of 4 vocab ids.

    Philox4x32-10 on int64 tensors holding uint32 words (the 64-bit product of two
    uint32 words is exact modulo 2^64, and its halves are read back with masks).
    `position` is an int64 [B] tensor, `purpose` an int or an int64 [B] tensor.
    """
    col = lambda t: t.to(torch.int64)[:, None]  # noqa: E731
    c0 = group.to(torch.int64)[None, :]
    c1 = col(position) & _MASK32
    c2 = col(offsets) & _MASK32
    purpose = col(purpose) if isinstance(purpose, torch.Tensor) else purpose
    c3 = ((((col(offsets) >> 32) & _MASK32) << 8) | purpose) & _MASK32
    k0 = col(seeds) & _MASK32
    k1 = (col(seeds) >> 32) & _MASK32
    for _ in range(10):
        p0 = c0 * 0xD2511F53
        p1 = c2 * 0xCD9E8D57
        c0, c1, c2, c3 = ((p1 >> 32) & _MASK32) ^ c1 ^ k0, p1 & _MASK32, ((p0 >> 32) & _MASK32) ^ c3 ^ k1, p0 & _MASK32
        k0 = (k0 + 0x9E3779B9) & _MASK32
        k1 = (k1 + 0xBB67AE85) & _MASK32
    return torch.stack(torch.broadcast_tensors(c0, c1, c2, c3), dim=-1)


def _bits_to_uniform(bits: torch.Tensor) -> torch.Tensor:
    """float32 uniform strictly inside (0, 1): (2k + 1) / 2^24, k the top 23 bits (csrc/common/philox.h)."""
    return (((bits >> 9) << 1) | 1).to(torch.float32) * 2.0**-24


def _philox_uniform(seeds, offsets, position, purpose, index: torch.Tensor) -> torch.Tensor:
    """§5.1 uniforms [B, L] of request b for the global vocab ids `index` [L]."""
    index = index.to(torch.int64)
    words = _philox_blocks(seeds, offsets, position, purpose, index >> 2)
    word = (index & 3).expand(words.shape[:-1]).unsqueeze(-1)
    return _bits_to_uniform(torch.gather(words, -1, word).squeeze(-1))


def _philox_uniform_span(seeds, offsets, position, purpose, start: int, length: int, device) -> torch.Tensor:
    """§5.1 uniforms [B, length] of request b for the global ids start .. start + length - 1 (each
    Philox block computed once, also for a span that does not start at a multiple of 4)."""
    first, last = start >> 2, (start + length + 3) >> 2
    words = _philox_blocks(seeds, offsets, position, purpose, torch.arange(first, last, device=device))
    flat = words.flatten(1)  # (not reshape(B, -1): ambiguous without requests)
    return _bits_to_uniform(flat[:, start - 4 * first: start - 4 * first + length])


def _ordered(x: torch.Tensor) -> torch.Tensor:
    """int64 keys with the order of the float32 values `x` (-0.0 taken as +0.0; no NaN expected)."""
    bits = (x + 0.0).view(torch.int32).to(torch.int64)
    return torch.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)


def _unordered(key: torch.Tensor) -> torch.Tensor:
    bits = torch.where(key >= 0, key, key ^ 0x7FFFFFFF)
    return bits.to(torch.int32).view(torch.float32)


def _pack(value_key: torch.Tensor, global_index: torch.Tensor) -> torch.Tensor:
    """(value key in int32 range, global index) -> int64 whose MAX is the largest value, then the smallest index."""
    return (value_key << 32) | (_MASK32 - global_index)


def _unpack(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return packed >> 32, _MASK32 - (packed & _MASK32)


def _local_argmax(values: torch.Tensor, vocab_start: int) -> torch.Tensor:
    """Packed (value, global index) of each row's maximum (first index on ties); int64 min for an empty shard."""
    if values.shape[-1] == 0:
        return torch.full(values.shape[:-1], torch.iinfo(torch.int64).min, dtype=torch.int64, device=values.device)
    best, idx = values.max(dim=-1)
    return _pack(_ordered(best), idx + vocab_start)


# CPU shards compact candidate lists (their sizes read on the host); CUDA shards keep fixed shapes.
# Tests turn compaction off to run the CUDA path's arithmetic on CPU tensors.
_CPU_COMPACTION = True


def _compacts(device: torch.device) -> bool:
    return device.type == "cpu" and _CPU_COMPACTION


_KEY_MIN = -(1 << 31)  # the smallest signed key: a threshold that keeps everything


def _order_key(z: torch.Tensor) -> torch.Tensor:
    """Order-preserving int32 keys of float32 values, -0.0 as +0.0: ``order_key`` of
    csrc/logits/logits_math.h (a uint32) minus 2^31, so that int32 comparisons order them."""
    bits = (z + 0.0).view(torch.int32)
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


def _radix_select(keys: torch.Tensor, *, rows: int, row_id: torch.Tensor | None = None,
                  member: torch.Tensor | None = None, k: torch.Tensor | None = None,
                  mass: torch.Tensor | None = None, top_p: torch.Tensor | None = None,
                  comm: "_Comm | None" = None) -> torch.Tensor:
    """Per row, the key threshold of top-k (``k`` given) or top-p (``mass`` and ``top_p`` given)
    over this rank's candidates and every other rank's, picked from the combined histograms as
    ``radix_pick_count`` / ``radix_pick_mass`` of csrc/logits/logits_math.h pick it.

    keys int32 (signed order keys, :func:`_order_key`): [R, V_local] with `member` bool
    [R, V_local] (None: all entries) marking the candidates, or 1-D candidates with their
    row in `row_id`. Top-k: the
    key of the k-th largest candidate. Top-p: the largest key v with sum_{key >= v} mass >=
    top_p * (candidate mass), scanning non-empty bins only (an entry whose e underflows to 0
    still ties with its key); masses in float64. Four passes of 8-bit digits, most significant
    first; after each only the candidates in the chosen bin stay (on CPU they are compacted,
    which changes no histogram). `comm` None: a single shard (tests). Returns the signed key
    int64 [R].

    Collectives per pass: top-k all-reduces int32 counts [R, 256]; top-p all-gathers the
    float64 masses [R, 256] with empty bins sent as -1 and adds them in rank order.
    """
    device = keys.device
    bins = torch.arange(_NUM_DIGITS, device=device)
    prefix = torch.zeros(rows, dtype=torch.int64, device=device)
    remaining = k
    above = torch.zeros(rows, dtype=torch.float64, device=device)
    target = None
    if row_id is None:
        count_w = (torch.ones((), dtype=torch.int32, device=device).expand_as(keys) if member is None
                   else member.to(torch.int32))
        if mass is not None and member is not None:
            mass = torch.where(member, mass, 0.0)
    else:
        count_w = torch.ones_like(keys, dtype=torch.int32)
    for shift in _SHIFTS:
        digit = ((keys >> shift) & (_NUM_DIGITS - 1)).long()
        if shift == _SHIFTS[0]:
            digit = digit ^ (_NUM_DIGITS >> 1)  # the top digit of the unsigned key
        counts = torch.zeros(rows, _NUM_DIGITS, dtype=torch.int32, device=device)
        if row_id is None:
            counts.scatter_add_(1, digit, count_w)
        else:
            counts.view(-1).index_add_(0, row_id * _NUM_DIGITS + digit, count_w)
        if mass is None:  # top-k: the bin holding the remaining-th largest candidate
            if comm is not None:
                counts = comm.all_reduce(counts, dist.ReduceOp.SUM)
            nonempty = counts > 0
            at_or_above = counts.flip(-1).cumsum(-1).flip(-1)  # candidates in bins >= d
            ok = nonempty & (at_or_above >= remaining[:, None])
        else:  # top-p: the highest bin whose mass, with everything above it, reaches the target
            masses = torch.zeros(rows, _NUM_DIGITS, dtype=torch.float64, device=device)
            if row_id is None:
                masses.scatter_add_(1, digit, mass)
            else:
                masses.view(-1).index_add_(0, row_id * _NUM_DIGITS + digit, mass)
            encoded = torch.where(counts > 0, masses, -1.0)
            if comm is not None:
                gathered = comm.all_gather(encoded)
                masses, nonempty = gathered[0].clamp(min=0.0), gathered[0] >= 0
                for r in range(1, comm.world):
                    masses = masses + gathered[r].clamp(min=0.0)
                    nonempty = nonempty | (gathered[r] >= 0)
            else:
                masses, nonempty = encoded.clamp(min=0.0), encoded >= 0
            if target is None:
                target = top_p.double() * masses.sum(-1) * (1.0 - _logits.TOP_P_SLACK)
            scan = torch.cat([above[:, None], masses.flip(-1)], dim=1).cumsum(-1)[:, :-1].flip(-1)
            ok = nonempty & (scan + masses >= target[:, None])  # scan[d] = above + mass of bins > d
        highest = torch.where(ok, bins, -1).amax(-1)
        lowest = torch.where(nonempty, bins, _NUM_DIGITS).amin(-1) % _NUM_DIGITS
        d = torch.where(highest >= 0, highest, lowest)
        if mass is None:
            padded = torch.cat([at_or_above, torch.zeros(rows, 1, dtype=at_or_above.dtype, device=device)], 1)
            remaining = torch.where(highest >= 0, remaining - padded.gather(1, (d + 1)[:, None]).squeeze(1), 1)
        else:
            above = scan.gather(1, d[:, None]).squeeze(1)
        prefix = prefix | (d << shift)
        if shift == _SHIFTS[-1]:
            break
        if row_id is None:
            in_bin = digit == d[:, None]
            if _compacts(device):  # compaction reads its size on the host: CPU only
                row_id, col = (in_bin & (count_w > 0)).nonzero(as_tuple=True)
                keys, count_w = keys[row_id, col], count_w[row_id, col]
                mass = None if mass is None else mass[row_id, col]
            else:
                count_w = torch.where(in_bin, count_w, 0)
                mass = None if mass is None else torch.where(in_bin, mass, 0.0)
        else:
            in_bin = digit == d[row_id]
            row_id, keys, count_w = row_id[in_bin], keys[in_bin], count_w[in_bin]
            mass = None if mass is None else mass[in_bin]
    return prefix + _KEY_MIN


def _row_sampling(params, row_request, vocab_size):
    """Per-row parameters as the kernels sanitize them (``row_sampling`` of logits_math.h):
    (greedy bool [R], temperature [R] (1 for greedy rows), top_k [R] (0 = off), top_p [R] or
    None, min_p [R] or None); the filters are None when not given and off on greedy rows."""
    temperature, top_k, top_p, min_p = params
    rows = row_request.shape[0]
    device = row_request.device
    if temperature is None:
        greedy = torch.zeros(rows, dtype=torch.bool, device=device)
        temp = torch.ones(rows, device=device)
    else:
        t = temperature[row_request]
        greedy = ~(t > 0)
        temp = torch.where(greedy, 1.0, t.clamp(max=_FLT_MAX))
    if top_k is not None:
        k = top_k[row_request]
        top_k = torch.where((k > 0) & (k < vocab_size) & ~greedy, k, 0)
    if top_p is not None:
        p = top_p[row_request]
        top_p = torch.where((p < 1) & ~greedy, p.clamp(min=0.0), 1.0)
    if min_p is not None:
        mp = min_p[row_request]
        min_p = torch.where((mp > 0) & ~greedy, mp.clamp(max=1.0), 0.0)
    return greedy, temp, top_k, top_p, min_p


class _Rows:
    """The processed distributions (§5.7, csrc/logits/logits_math.h) of this rank's shard of R rows.

    x = the logits with NaN as -inf and +inf as the largest float; m, argmax: the global max of
    x and its first index; z = (x - m) / T (T = 1 on greedy rows), e = exp(z); the kept set is
    {order_key(z) >= tau}, tau the largest of the top-k, top-p and min-p thresholds; S the
    global float64 sum of kept e (rank order), total = float32(S); p = e / total on the kept
    set, log p = z - log(total). Greedy rows: p is one-hot at argmax and log p = log_softmax(x)
    (= z - log(total) with T = 1 and nothing filtered).
    """

    def __init__(self, comm: _Comm, logits: torch.Tensor, row_request: torch.Tensor, vocab_start: int,
                 vocab_size: int, params):
        inf = float("inf")
        greedy, temp, top_k, top_p, min_p = _row_sampling(params, row_request, vocab_size)
        self.greedy = greedy
        x = logits.float().nan_to_num(nan=-inf, posinf=_FLT_MAX, neginf=-inf)
        packed = comm.all_reduce(_local_argmax(x, vocab_start), dist.ReduceOp.MAX)
        m_key, self.argmax = _unpack(packed)
        m = _unordered(m_key)
        self.has_mass = m > -inf
        # A row without a finite logit: z = -inf - 0 = -inf, e = 0 everywhere.
        z = (x - torch.where(self.has_mass, m, 0.0)[:, None]) / temp[:, None]
        e = torch.exp(z)
        self.z, self.e = z, e
        self.keys = self.tau = None  # set when a filter is given: kept = keys >= tau
        if top_k is not None or top_p is not None or min_p is not None:
            keys = _order_key(z)
            tau = torch.full((z.shape[0],), _KEY_MIN, dtype=torch.int64, device=z.device)
            survivors = None
            rows = z.shape[0]
            cpu = _compacts(z.device)
            if top_k is not None:
                # On CPU only each row's local top max(k) can hold the global k-th largest (any entry
                # below the local k-th is below it): run the radix select over those alone.
                width = min(int(top_k.max()), z.shape[1]) if cpu else 0
                if width:
                    cand = torch.topk(keys, width, dim=1, sorted=False).values
                    row_id = torch.arange(rows, device=z.device).repeat_interleave(width)
                    tau_k = _radix_select(cand.reshape(-1), rows=rows, row_id=row_id, k=top_k, comm=comm)
                elif cpu:
                    empty = torch.zeros(0, dtype=torch.int64)
                    tau_k = _radix_select(empty.int(), rows=rows, row_id=empty, k=top_k, comm=comm)
                else:
                    tau_k = _radix_select(keys, rows=rows, k=top_k, comm=comm)
                tau = torch.where(top_k > 0, tau_k, tau)
                survivors = keys >= tau[:, None]
            if top_p is not None:
                if cpu and survivors is not None:
                    row_id, col = survivors.nonzero(as_tuple=True)
                    tau_p = _radix_select(keys[row_id, col], rows=rows, row_id=row_id,
                                          mass=e[row_id, col].double(), top_p=top_p, comm=comm)
                else:
                    tau_p = _radix_select(keys, rows=rows, member=survivors, mass=e.double(), top_p=top_p,
                                          comm=comm)
                tau = torch.maximum(tau, torch.where(top_p < 1, tau_p, _KEY_MIN))
            if min_p is not None:
                tau = torch.maximum(tau, torch.where(min_p > 0, _order_key(torch.log(min_p)).long(), _KEY_MIN))
            self.keys, self.tau = keys, tau
            e = torch.where(keys >= tau[:, None], e, 0.0)
        self.total = comm.sum_float(e.sum(dim=-1, dtype=torch.float64)).float()
        self.log_total = torch.log(self.total)

    def _kept(self, rows: torch.Tensor, local_index: torch.Tensor | None = None) -> torch.Tensor | bool:
        if self.keys is None:
            return True
        if local_index is None:
            return self.keys[rows] >= self.tau[rows][:, None]
        return self.keys[rows, local_index] >= self.tau[rows]

    def probs(self, rows: torch.Tensor) -> torch.Tensor:
        """Processed probabilities [len(rows), V_local] of sampled rows (0 for a row without mass)."""
        total = self.total[rows]
        return torch.where((total > 0)[:, None] & self._kept(rows), self.e[rows] / total[:, None], 0.0)

    def prob_at(self, rows: torch.Tensor, local_index: torch.Tensor) -> torch.Tensor:
        """Processed probability of one local entry per sampled row."""
        total = self.total[rows]
        return torch.where((total > 0) & self._kept(rows, local_index), self.e[rows, local_index] / total, 0.0)

    def logprob(self, rows: torch.Tensor, local_index: torch.Tensor) -> torch.Tensor:
        """log p of one local entry per row: z - log(total) on the kept set, -inf elsewhere."""
        z = self.z[rows, local_index]
        kept = (z > -float("inf")) & self.has_mass[rows] & self._kept(rows, local_index)
        return torch.where(kept, z - self.log_total[rows], -float("inf"))


# ---------------------------------------------------------------------------------------------- chain verification


def _verify_chain(comm: _Comm, rows: _Rows, row_of: torch.Tensor, num_draft: torch.Tensor, drafts: torch.Tensor,
                  draft_probs: torch.Tensor | None, draft_row_of: torch.Tensor, greedy: torch.Tensor,
                  seeds: torch.Tensor, offsets: torch.Tensor, vocab_start: int, return_logprobs: bool,
                  vocab_size: int = 0, bonus: torch.Tensor | None = None, rates: torch.Tensor | None = None):
    """§5.2 on the processed rows: (token_ids [B, K+1], num_accepted [B], logprobs or None).

    row_of [B, K+1]: the logits row of (request, position), draft_row_of [B, K] the
    draft_probs row; positions beyond n_b hold any valid row (they are masked), and so does
    position n_b when `bonus` (external bonus tokens [B], issue #14) is given: its result is
    replaced by bonus[b] (clamped into [0, vocab_size)) with a NaN logprob. `rates`: synthetic
    acceptance rates [R >= K]: a draft id in [0, vocab_size) at slot k is accepted iff u_k < rates[k].
    """
    batch, k_plus_1 = row_of.shape
    max_draft = k_plus_1 - 1
    device = row_of.device
    local = rows.e.shape[-1]
    positions = torch.arange(k_plus_1, device=device)

    # Acceptance of every draft slot, decided by the rank owning the draft token.
    flat_rows = row_of[:, :max_draft].reshape(-1)
    x = drafts.reshape(-1)
    x_local = x - vocab_start
    owned = (x_local >= 0) & (x_local < local)
    safe_local = torch.where(owned, x_local, 0)
    if local and x.numel():
        p_x = rows.prob_at(flat_rows, safe_local)
    else:
        p_x = torch.zeros_like(x, dtype=torch.float32)
    if draft_probs is not None and local and x.numel():
        q_x = draft_probs[draft_row_of.reshape(-1), safe_local].float()
        q_x = torch.where(q_x > 0, q_x, torch.zeros((), device=device))
    else:
        q_x = torch.ones_like(p_x)
    slot = positions[:max_draft].expand(batch, -1).reshape(-1)
    u = _philox_uniform(seeds.repeat_interleave(max_draft), offsets.repeat_interleave(max_draft), slot,
                        _PURPOSE_ACCEPT, torch.zeros(1, dtype=torch.int64, device=device))[:, 0]
    accept_here = owned & (u * q_x < p_x)
    decided = torch.stack([accept_here.float(), torch.zeros_like(p_x)], dim=-1)
    if return_logprobs and local and x.numel():
        decided[:, 1] = torch.where(owned, rows.logprob(flat_rows, safe_local), torch.zeros((), device=device))
    decided = comm.all_reduce(decided, dist.ReduceOp.SUM).view(batch, max_draft, 2)
    sampled_accept = decided[..., 0] > 0
    greedy_accept = drafts == rows.argmax[row_of[:, :max_draft]]
    accept = torch.where(greedy[:, None], greedy_accept, sampled_accept)
    if rates is not None:  # synthetic mode: the same uniforms against the rates (greedy requests too)
        in_vocab = (drafts >= 0) & (drafts < vocab_size)
        accept = in_vocab & (u.view(batch, max_draft) < rates[None, :max_draft])
    accept = accept & (positions[None, :max_draft] < num_draft[:, None])
    num_accepted = accept.to(torch.int32).cumprod(dim=1).sum(dim=1, dtype=torch.int32) if max_draft else \
        torch.zeros(batch, dtype=torch.int32, device=device)
    rejected = num_accepted < num_draft

    # The final token: an exponential race over this rank's shard of the residual (after a
    # rejection) and of p (the fallback when the residual has no mass; the bonus row).
    final_pos = num_accepted.to(torch.int64)
    final_row = row_of.gather(1, final_pos[:, None]).squeeze(1)
    local_ids = torch.arange(local, device=device)
    p = rows.probs(final_row)
    if max_draft:
        x_final = drafts.gather(1, final_pos.clamp(max=max_draft - 1)[:, None]).squeeze(1)
    else:
        x_final = torch.full((batch,), -1, dtype=torch.int64, device=device)
    if draft_probs is not None:
        q_row = draft_row_of.gather(1, final_pos.clamp(max=max(max_draft - 1, 0))[:, None]).squeeze(1) if \
            max_draft else torch.zeros(batch, dtype=torch.int64, device=device)
        q = draft_probs[q_row].float() if local and max_draft else torch.zeros_like(p)
        q = torch.where(q > 0, q, torch.zeros((), device=device))
    else:
        q = (local_ids[None, :] == (x_final - vocab_start)[:, None]).float()
    residual = torch.where(rejected[:, None], (p - q).clamp(min=0.0), p)
    purpose = torch.where(rejected, _PURPOSE_RESIDUAL, _PURPOSE_BONUS)
    noise = -torch.log(_philox_uniform_span(seeds, offsets, final_pos, purpose, vocab_start, local, device))
    zero = torch.zeros((), device=device)
    races = torch.stack([torch.where(residual > 0, residual / noise, zero), torch.where(p > 0, p / noise, zero)],
                        dim=1)  # [B, 2, V_local]
    keys = torch.empty(batch, 3, dtype=torch.int64, device=device)
    keys[:, :2] = _local_argmax(races, vocab_start)
    keys[:, 2] = (residual > 0).any(dim=-1).to(torch.int64) if local else 0
    keys = comm.all_reduce(keys, dist.ReduceOp.MAX)
    _, residual_winner = _unpack(keys[:, 0])
    _, p_winner = _unpack(keys[:, 1])
    sampled_token = torch.where(keys[:, 2] > 0, residual_winner, p_winner)
    final_token = torch.where(greedy, rows.argmax[final_row], sampled_token)
    external = None
    if bonus is not None:
        external = num_accepted.to(torch.int64) == num_draft
        final_token = torch.where(external, bonus.to(torch.int64).clamp(0, vocab_size - 1), final_token)

    token_ids = torch.full((batch, k_plus_1), -1, dtype=torch.int64, device=device)
    if max_draft:
        token_ids[:, :max_draft] = torch.where(positions[None, :max_draft] < num_accepted[:, None], drafts, -1)
    token_ids.scatter_(1, final_pos[:, None], final_token[:, None])
    logprobs = None
    if return_logprobs:
        f_local = final_token - vocab_start
        f_owned = (f_local >= 0) & (f_local < local)
        final_lp = torch.zeros(batch, device=device)
        if local:
            final_lp = torch.where(f_owned, rows.logprob(final_row, torch.where(f_owned, f_local, 0)), zero)
        final_lp = comm.all_reduce(final_lp, dist.ReduceOp.SUM)
        if external is not None:
            final_lp = torch.where(external, float("nan"), final_lp)
        logprobs = torch.full((batch, k_plus_1), float("nan"), device=device)
        if max_draft:
            logprobs[:, :max_draft] = torch.where(positions[None, :max_draft] < num_accepted[:, None],
                                                  decided[..., 1], logprobs[:, :max_draft])
        logprobs.scatter_(1, final_pos[:, None], final_lp[:, None])
    return token_ids, num_accepted, logprobs


# ---------------------------------------------------------------------------------------------- public API


def _check_engine(bonus_token_ids, reject_invalid_drafts, batch, device):
    """The engine keywords' own checks (issue #14): (bonus_token_ids as [B] or None, reject_invalid_drafts)."""
    return (check_bonus_token_ids(bonus_token_ids, batch, device, "local_logits"),
            check_reject_invalid_drafts(reject_invalid_drafts))


def _check_engine_values(bonus, rates, vocab_size):
    if bonus is not None or rates is not None:
        _logits._check_engine_values(bonus, rates, vocab_size)


def _bonus_only(bonus, width, vocab_size, return_logprobs, device):
    """The result when the target has no rows at all (external bonus tokens, no drafts): every request
    emits its bonus token (clamped into [0, vocab_size)) with a NaN logprob."""
    batch = bonus.shape[0]
    token_ids = torch.full((batch, width), -1, dtype=torch.int64, device=device)
    token_ids[:, 0] = bonus.to(torch.int64).clamp(0, vocab_size - 1)
    logprobs = torch.full((batch, width), float("nan"), device=device) if return_logprobs else None
    return LogitsSampleOutput(token_ids, torch.zeros(batch, dtype=torch.int32, device=device), logprobs)


def _agree(comm: _Comm, check_shards: bool, error: Exception | None, fields: list[int]) -> None:
    """Raise on every rank when any rank's local checks failed or (check_shards) the shards do not tile.

    fields = [vocab_start, V_local, vocab_size, *shapes, flags of the optional arguments]; one
    all-gather of them plus this rank's error flag, so that a bad call on one rank raises on
    every rank instead of leaving the others waiting in a later collective.
    """
    if not check_shards:
        if error is not None:
            raise error
        start, local, vocab = fields[:3]
        if start + local > vocab:
            fail(f"this rank's shard [{start}, {start + local}) exceeds vocab_size = {vocab}")
        return
    table = comm.all_gather(torch.tensor(fields + [int(error is not None)], dtype=torch.int64,
                                         device=comm.device)).cpu()
    if error is not None:
        raise error
    failed = [r for r in range(comm.world) if int(table[r, -1])]
    if failed:
        fail(f"rank(s) {failed} rejected their arguments (see the error raised there); this is rank {comm.rank}")
    _check_tiling(table[:, :-1], comm.rank)


def _check_common(local_logits, vocab_start, vocab_size):
    """Checks of the logits' dtype and of vocab_start / vocab_size (the tiling is checked with the other ranks)."""
    check_dtype(local_logits, PROB_DTYPES, "local_logits")
    for value, name in ((vocab_start, "vocab_start"), (vocab_size, "vocab_size")):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            fail(f"{name} must be a non-negative int, got {value!r}")
    if vocab_size < 1:
        fail("vocab_size must be >= 1")


def _check_draft_probs(draft_probs, shape, shape_str, device):
    if draft_probs is not None:
        check_shape(draft_probs, shape, "draft_probs", shape_str)
        check_dtype(draft_probs, PROB_DTYPES, "draft_probs")
        check_device(draft_probs, device, "draft_probs", "local_logits")


def _local_sampling_rng(temperature, top_k, top_p, min_p, seeds, offsets, batch, device):
    """This rank's checks of the sampling parameters and, when given, of seeds / offsets:
    (params, seeds, offsets), seeds still None when not given (:func:`_shared_rng` draws them)."""
    params = _logits._sampling(temperature, top_k, top_p, min_p, batch, device, "local_logits")
    if seeds is not None:
        seeds, offsets = rng_inputs(seeds, offsets, batch, device, "local_logits")
    return params, seeds, offsets


def _request_flags(draft_probs, temperature, top_k, top_p, min_p, seeds, return_logprobs, *more) -> int:
    """Which optional arguments are given, as bits (the ranks must agree on them)."""
    given = (draft_probs is not None, temperature is not None, top_k is not None, top_p is not None,
             min_p is not None, seeds is not None, bool(return_logprobs), *more)
    return sum(1 << i for i, g in enumerate(given) if g)


def _shared_rng(comm: _Comm, seeds, offsets, batch, device):
    """(seeds, offsets) after the ranks agreed; seeds=None: one per request drawn on the group's first
    rank (torch's default generator) and broadcast, so that every rank races with the same numbers."""
    if seeds is not None:
        return seeds, offsets
    drawn = torch.randint(0, 2**62, (batch,), dtype=torch.int64).to(device)
    shared = comm.all_reduce(drawn if comm.rank == 0 else torch.zeros_like(drawn), dist.ReduceOp.SUM)
    return rng_inputs(shared, offsets, batch, device, "local_logits")


def rejection_sample_logits(
    local_logits: torch.Tensor,
    draft_token_ids: torch.Tensor,
    num_draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None = None,
    *,
    vocab_start: int,
    vocab_size: int,
    group=None,
    temperature=None,
    top_k=None,
    top_p=None,
    min_p=None,
    seeds: torch.Tensor | None = None,
    offsets: torch.Tensor | None = None,
    return_logprobs: bool = False,
    bonus_token_ids: torch.Tensor | None = None,
    reject_invalid_drafts: bool = False,
    synthetic_acceptance_rates: torch.Tensor | None = None,
    check_shards: bool = True,
    comm_stats: dict | None = None,
) -> LogitsSampleOutput:
    """Chain verification from vocab-sharded target logits (DESIGN.md §5.8), padded layout.

    Every rank of `group` calls this with its shard of the logits; every rank
    returns the same result, which equals :func:`specdec_ops.rejection_sample_logits`
    (§5.7) on the concatenated logits for the same seeds (floating-point near-ties
    aside), for any number of ranks and any tiling.

    Parameters
    ----------
    local_logits : float32 | float16 | bfloat16 [B, K+1, V_local]
        This rank's shard: global ids vocab_start .. vocab_start + V_local - 1. Row k
        is the target at draft position k; row n_b is the bonus row.
    draft_token_ids : int32 | int64 [B, K]
        Global ids, the same on every rank.
    num_draft_tokens : int32 | int64 [B]
        n_b in 0..K, the same on every rank.
    draft_probs : float32 | float16 | bfloat16 [B, K, V_local], optional
        This rank's shard of the drafter's processed distribution; None means one-hot drafts.
    vocab_start, vocab_size : int
        The shards tile [0, vocab_size) in rank order; their sizes may differ (and may be 0).
    group : torch.distributed process group, optional
        None means the default group. NCCL for CUDA tensors, gloo for CPU tensors.
    temperature, top_k, top_p, min_p : [B] tensors, Python numbers or None
        As in :func:`specdec_ops.process_logits` (temperature 0 = greedy: argmax of the
        raw logits, first index on ties), the same on every rank.
    seeds, offsets : int64 [B], optional
        §5.1; the noise is keyed by the global vocabulary index. seeds=None draws the
        seeds on the group's first rank and broadcasts them; offsets=None means 0.
    return_logprobs : bool
        Also return the log-probability of each emitted token (NaN padding).
    bonus_token_ids, reject_invalid_drafts, synthetic_acceptance_rates :
        The engine keywords of :func:`specdec_ops.rejection_sample_logits` (the same on every rank;
        with bonus_token_ids local_logits may omit the bonus rows: [B, K, V_local]).
    check_shards : bool
        All-gather (vocab_start, V_local, vocab_size, the shapes, which optional
        arguments are given, whether the local argument checks passed) and raise on
        every rank when the shards do not tile [0, vocab_size) or the ranks disagree:
        a bad call then never leaves other ranks waiting in a later collective. On
        CUDA this reads 9 numbers on the host (one sync): check once with
        :func:`check_vocab_shards` and pass False for a step without host sync. Pass the same
        value on every rank.
    comm_stats : dict, optional
        Accumulates ``collectives`` and ``bytes_sent`` (this rank, ring algorithms).

    Returns
    -------
    LogitsSampleOutput(token_ids int64 [B, K+1], num_accepted int32 [B], logprobs float32 [B, K+1] or None)
        The same on every rank, as in §5.7.

    Collectives: 5 (no filter; 6 with logprobs) to 13 of O(B * (K+1)) numbers; the 4
    radix passes of top-k and of top-p exchange [B * (K+1), 256] histograms.

    Example
    -------
    >>> # on each of 2 ranks, V = 1000 split as [0, 600) and [600, 1000):
    >>> out = rejection_sample_logits(logits_shard, drafts, n, vocab_start=0 if rank == 0 else 600,
    ...                               vocab_size=1000, temperature=t, top_p=0.9, seeds=s)
    """
    comm = _Comm(group, local_logits.device if isinstance(local_logits, torch.Tensor) else None, comm_stats)
    device = comm.device
    shape = (list(local_logits.shape) if isinstance(local_logits, torch.Tensor) else []) + [-1] * 3
    error = None
    try:  # every local check before the agreement step: a rank that fails here still joins it
        check_tensor(local_logits, "local_logits")
        check_rank(local_logits, 3, "local_logits", "[B, K+1, V_local]")
        batch, k_plus_1, local = local_logits.shape
        bonus, reject_invalid_drafts = _check_engine(bonus_token_ids, reject_invalid_drafts, batch, device)
        max_draft = k_plus_1 - 1
        if (bonus is not None and isinstance(draft_token_ids, torch.Tensor) and draft_token_ids.dim() == 2
                and draft_token_ids.shape[1] == k_plus_1):
            max_draft = k_plus_1  # [B, K, V_local]: no bonus rows
        if max_draft < 0:
            fail(f"local_logits must have K+1 >= 1 rows per request, got shape {list(local_logits.shape)}")
        _check_common(local_logits, vocab_start, vocab_size)
        check_index_tensor(draft_token_ids, (batch, max_draft), "draft_token_ids", "[B, K]", device, "local_logits")
        check_index_tensor(num_draft_tokens, (batch,), "num_draft_tokens", "[B]", device, "local_logits")
        _check_draft_probs(draft_probs, (batch, max_draft, local), "[B, K, V_local]", device)
        rates = check_synthetic_rates(synthetic_acceptance_rates, max_draft, device, "local_logits")
        params, seeds, offsets = _local_sampling_rng(temperature, top_k, top_p, min_p, seeds, offsets, batch, device)
        num_draft = num_draft_tokens.to(torch.int64)
        drafts = draft_token_ids.to(torch.int64)
        if values_checked_here(device):
            check_chain_values(drafts, num_draft, max_draft, vocab_size,
                               reject_invalid_drafts=reject_invalid_drafts or rates is not None)
            _check_engine_values(bonus, rates, vocab_size)
    except Exception as e:  # noqa: BLE001 (raised below, after the other ranks have heard of it)
        error = e
    flags = _request_flags(draft_probs, temperature, top_k, top_p, min_p, seeds, return_logprobs,
                           bonus_token_ids is not None, synthetic_acceptance_rates is not None,
                           reject_invalid_drafts is True)
    _agree(comm, check_shards, error, [_int_or(vocab_start), shape[2] if error is None else -1,
                                       _int_or(vocab_size), shape[0], shape[1], -1, flags])
    seeds, offsets = _shared_rng(comm, seeds, offsets, batch, device)
    num_draft = num_draft.clamp(0, max_draft)
    if batch * k_plus_1 == 0 and bonus is not None:
        return _bonus_only(bonus, max_draft + 1, vocab_size, bool(return_logprobs), device)
    flat = local_logits.reshape(batch * k_plus_1, local)
    row_request = torch.arange(batch, device=device).repeat_interleave(k_plus_1)
    rows = _Rows(comm, flat, row_request, vocab_start, vocab_size, params)
    greedy = rows.greedy.view(batch, k_plus_1)[:, 0]
    if k_plus_1 == max_draft + 1:
        row_of = torch.arange(batch * k_plus_1, device=device).view(batch, k_plus_1)
    else:  # no bonus rows: position K reads any row of the request (its result is replaced)
        positions = torch.arange(max_draft + 1, device=device).clamp(max=k_plus_1 - 1)
        row_of = torch.arange(batch, device=device)[:, None] * k_plus_1 + positions[None, :]
    draft_row_of = torch.arange(batch * max_draft, device=device).view(batch, max_draft)
    flat_q = None if draft_probs is None else draft_probs.reshape(batch * max_draft, local)
    return LogitsSampleOutput(*_verify_chain(comm, rows, row_of, num_draft, drafts, flat_q, draft_row_of, greedy,
                                             seeds, offsets, vocab_start, bool(return_logprobs), vocab_size, bonus,
                                             rates))


def _int_or(value, default: int = -1) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def rejection_sample_logits_packed(
    local_logits: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None = None,
    *,
    vocab_start: int,
    vocab_size: int,
    group=None,
    temperature=None,
    top_k=None,
    top_p=None,
    min_p=None,
    seeds: torch.Tensor | None = None,
    offsets: torch.Tensor | None = None,
    return_logprobs: bool = False,
    max_num_draft_tokens: int | None = None,
    bonus_token_ids: torch.Tensor | None = None,
    reject_invalid_drafts: bool = False,
    synthetic_acceptance_rates: torch.Tensor | None = None,
    check_shards: bool = True,
    comm_stats: dict | None = None,
) -> LogitsSampleOutput:
    """Chain verification from vocab-sharded target logits (DESIGN.md §5.8), packed layout.

    As :func:`rejection_sample_logits` with the ragged layout of §5.2's packed op;
    identical results to the padded form for the same requests and seeds.

    Parameters
    ----------
    local_logits : float32 | float16 | bfloat16 [T + B, V_local]
        Request b owns rows cu[b] + b .. cu[b+1] + b (its n_b drafts, then its bonus row).
    cu_num_draft_tokens : int32 | int64 [B + 1]
        Exclusive prefix sums of n_b, starting at 0; the same on every rank.
    draft_token_ids : int32 | int64 [T]
        Global ids, the same on every rank.
    draft_probs : float32 | float16 | bfloat16 [T, V_local], optional
        This rank's shard of the drafter's processed distribution; None means one-hot.
    vocab_start, vocab_size, group, temperature, top_k, top_p, min_p, seeds, offsets, return_logprobs,
    check_shards, comm_stats
        As in :func:`rejection_sample_logits`.
    max_num_draft_tokens : int, optional
        K of the output (keeps shapes fixed); None reads the largest n_b on the host.
    bonus_token_ids, reject_invalid_drafts, synthetic_acceptance_rates :
        As in :func:`rejection_sample_logits`; with bonus_token_ids local_logits may omit the bonus
        rows ([T, V_local], request b owning rows cu[b] .. cu[b+1] - 1).

    Returns
    -------
    LogitsSampleOutput(token_ids int64 [B, K+1], num_accepted int32 [B], logprobs float32 [B, K+1] or None)
    """
    comm = _Comm(group, local_logits.device if isinstance(local_logits, torch.Tensor) else None, comm_stats)
    device = comm.device
    shape = (list(local_logits.shape) if isinstance(local_logits, torch.Tensor) else []) + [-1] * 3
    error = None
    try:  # every local check before the agreement step: a rank that fails here still joins it
        check_tensor(local_logits, "local_logits")
        check_rank(local_logits, 2, "local_logits", "[T + B, V_local]")
        total_rows, local = local_logits.shape
        batch = check_cu_num_draft_tokens(cu_num_draft_tokens, device, "local_logits")
        bonus, reject_invalid_drafts = _check_engine(bonus_token_ids, reject_invalid_drafts, batch, device)
        bonus_rows = 1
        if (bonus is not None and isinstance(draft_token_ids, torch.Tensor) and draft_token_ids.dim() == 1
                and draft_token_ids.shape[0] == total_rows):
            bonus_rows = 0  # [T, V_local]: no bonus rows
        total = total_rows - batch * bonus_rows
        if total < 0:
            fail(f"local_logits must have T + B rows with B = {batch}, got {total_rows}")
        _check_common(local_logits, vocab_start, vocab_size)
        check_index_tensor(draft_token_ids, (total,), "draft_token_ids", "[T]", device, "local_logits")
        _check_draft_probs(draft_probs, (total, local), "[T, V_local]", device)
        cu = cu_num_draft_tokens.to(torch.int64)
        max_draft = packed_max_num_draft_tokens(cu, batch, max_num_draft_tokens)
        params, seeds, offsets = _local_sampling_rng(temperature, top_k, top_p, min_p, seeds, offsets, batch, device)
        drafts_flat = draft_token_ids.to(torch.int64)
        rates = check_synthetic_rates(synthetic_acceptance_rates, max_draft, device, "local_logits")
        if values_checked_here(device):
            check_cu_values(cu, total, max_draft)
            if not (reject_invalid_drafts or rates is not None):
                check_draft_ids(drafts_flat, torch.ones_like(drafts_flat, dtype=torch.bool), vocab_size)
            _check_engine_values(bonus, rates, vocab_size)
        shape[2] = max_draft
    except Exception as e:  # noqa: BLE001 (raised below, after the other ranks have heard of it)
        error = e
    flags = _request_flags(draft_probs, temperature, top_k, top_p, min_p, seeds, return_logprobs,
                           bonus_token_ids is not None, synthetic_acceptance_rates is not None,
                           reject_invalid_drafts is True)
    _agree(comm, check_shards, error, [_int_or(vocab_start), shape[1] if error is None else -1,
                                       _int_or(vocab_size), shape[0], cu_num_draft_tokens.shape[0]
                                       if isinstance(cu_num_draft_tokens, torch.Tensor) else -1, shape[2], flags])
    seeds, offsets = _shared_rng(comm, seeds, offsets, batch, device)
    if total_rows == 0 and bonus is not None:
        return _bonus_only(bonus, max_draft + 1, vocab_size, bool(return_logprobs), device)
    # Padded views of the ragged layout (fixed shapes, no host sync): slot k of request b (without bonus
    # rows, slot n_b reads any row: its result is replaced by the external bonus token).
    num_draft = (cu[1:] - cu[:-1]).clamp(0, max_draft)
    positions = torch.arange(max_draft + 1, device=device)
    first_row = cu[:-1] + torch.arange(batch, device=device) * bonus_rows
    row_of = (first_row[:, None] + torch.minimum(positions[None, :], num_draft[:, None] - 1 + bonus_rows))
    row_of = row_of.clamp(0, max(total_rows - 1, 0))
    draft_slot = cu[:-1, None] + torch.minimum(positions[None, :max_draft], (num_draft[:, None] - 1).clamp(min=0))
    draft_slot = draft_slot.clamp(0, max(total - 1, 0))
    padded_drafts = torch.cat([drafts_flat, torch.full((1,), -1, dtype=torch.int64, device=device)])
    drafts = torch.where(positions[None, :max_draft] < num_draft[:, None], padded_drafts[draft_slot], -1)
    ends = cu[1:] + torch.arange(1, batch + 1, device=device) * bonus_rows  # exclusive end row of each request
    row_request = torch.searchsorted(ends, torch.arange(total_rows, device=device), right=True)
    row_request = row_request.clamp(max=max(batch - 1, 0))
    if total == 0:
        draft_probs = None  # no draft slot is used
    rows = _Rows(comm, local_logits, row_request, vocab_start, vocab_size, params)
    greedy = rows.greedy[row_of[:, 0]]
    return LogitsSampleOutput(*_verify_chain(comm, rows, row_of, num_draft, drafts, draft_probs, draft_slot, greedy,
                                             seeds, offsets, vocab_start, bool(return_logprobs), vocab_size, bonus,
                                             rates))


# ---------------------------------------------------------------------------------------------- tree verification


def _verify_tree(comm: _Comm, rows: _Rows, tokens: torch.Tensor, parents: torch.Tensor, num_nodes: torch.Tensor,
                 draft_probs: torch.Tensor | None, greedy: torch.Tensor, seeds: torch.Tensor, offsets: torch.Tensor,
                 vocab_start: int, return_logprobs: bool):
    """§5.3 on the processed rows (row b * N + u is node u of request b), the forward scan of
    reference.tree_rejection_sample with p' held as this rank's shard.

    One all-gather of [B, 5] numbers per node c = 1 .. N-1 (the owner's acceptance flag, p'(x)
    and log p(x), this rank's mass of the would-be residual and whether it has any), then the
    race of the chain at the node the walk ends on.
    """
    batch, nodes = tokens.shape
    device = tokens.device
    local = rows.e.shape[-1]
    ar = torch.arange(batch, device=device)
    zero = torch.zeros((), device=device)
    # Global row sums of the processed probabilities (s of the walk without draft_probs), rank order.
    all_rows = torch.arange(batch * nodes, device=device)
    row_sums = comm.sum_float(rows.probs(all_rows).sum(dim=-1))
    flat_q = None if draft_probs is None else draft_probs.reshape(batch * nodes, local)

    u = torch.zeros(batch, dtype=torch.int64, device=device)  # current node
    k = torch.zeros(batch, dtype=torch.int64, device=device)  # accepted nodes so far
    path = torch.full((batch, nodes), -1, dtype=torch.int64, device=device)
    path[:, 0] = 0
    out = torch.full((batch, nodes), -1, dtype=torch.int64, device=device)
    lp_out = torch.full((batch, nodes), float("nan"), device=device)
    r = rows.probs(ar * nodes)  # p' (unnormalized), this rank's shard
    z = torch.ones(batch, device=device)  # normalizer of p' (draft_probs)
    s = row_sums[ar * nodes]  # sum of p' (no draft_probs)
    best = rows.argmax[ar * nodes]  # argmax p_u (greedy)
    rejected = torch.zeros(batch, dtype=torch.bool, device=device)
    no_token = torch.zeros(1, dtype=torch.int64, device=device)
    for c in range(1, nodes):
        pc = parents[:, c]
        pc = torch.where((pc >= 0) & (pc < c), pc, 0)
        tries = (c < num_nodes) & (pc == u)
        x = tokens[:, c]
        x_local = x - vocab_start
        owned = (x_local >= 0) & (x_local < local)
        xs = torch.where(owned, x_local, 0)
        uc = _philox_uniform(seeds, offsets, torch.full((batch,), c - 1, device=device), _PURPOSE_ACCEPT, no_token)[:, 0]
        r_x = r[ar, xs] if local else torch.zeros(batch, device=device)
        payload = torch.zeros(batch, 5, dtype=torch.float64, device=device)
        if flat_q is not None:
            q = flat_q[ar * nodes + u].float() if local else torch.zeros_like(r)
            q = torch.where(q > 0, q, zero)
            q_x = q[ar, xs] if local else torch.zeros(batch, device=device)
            accept_here = owned & (uc * q_x < r_x / z)
            d = r / z[:, None] - q
            r_new = torch.where(d > 0, d, zero)
            payload[:, 3] = r_new.sum(dim=-1).double()
        else:
            accept_here = owned & (uc * s < torch.where(owned, r_x, zero))
            r_new = r.clone()
            if local:
                r_new[ar, xs] = torch.where(owned, zero, r_x)
            payload[:, 3] = (r_new > 0).any(dim=-1).double() if local else 0.0
        payload[:, 0] = accept_here.double()
        payload[:, 1] = torch.where(owned, r_x, zero).double()
        if return_logprobs and local:
            payload[:, 2] = torch.where(owned, rows.logprob(ar * nodes + u, xs), zero).double()
        gathered = comm.all_gather(payload)
        combined = gathered.sum(dim=0)  # flags and owner-only values: exact
        mass_new = gathered[0, :, 3].float()
        for rank in range(1, comm.world):
            mass_new = mass_new + gathered[rank, :, 3].float()  # float32 partial sums, rank order
        accept = torch.where(greedy, x == best, combined[:, 0] > 0) & tries
        reject = tries & ~accept & ~greedy
        if flat_q is not None:
            commit = reject & (mass_new > 0)
            r = torch.where(commit[:, None], r_new, r)
            z = torch.where(commit, mass_new, z)
        else:
            commit = reject & (combined[:, 3] > 0)
            r = torch.where(commit[:, None], r_new, r)
            s = torch.where(commit, s - combined[:, 1].float(), s)
        rejected |= reject

        out[ar, k] = torch.where(accept, x, out[ar, k])
        lp_out[ar, k] = torch.where(accept, combined[:, 2].float(), lp_out[ar, k])
        k = k + accept.long()
        path[ar, k] = torch.where(accept, c, path[ar, k])
        u = torch.where(accept, c, u)
        r = torch.where(accept[:, None], rows.probs(ar * nodes + c), r)
        z = torch.where(accept, 1.0, z)
        s = torch.where(accept, row_sums[ar * nodes + c], s)
        best = torch.where(accept, rows.argmax[ar * nodes + c], best)
        rejected &= ~accept

    purpose = torch.where(rejected, _PURPOSE_RESIDUAL, _PURPOSE_BONUS)
    noise = -torch.log(_philox_uniform_span(seeds, offsets, u, purpose, vocab_start, local, device))
    keys = comm.all_reduce(_local_argmax(torch.where(r > 0, r / noise, zero), vocab_start), dist.ReduceOp.MAX)
    _, winner = _unpack(keys)
    final = torch.where(greedy, best, winner)
    out[ar, k] = final
    logprobs = None
    if return_logprobs:
        f_local = final - vocab_start
        f_owned = (f_local >= 0) & (f_local < local)
        final_lp = torch.zeros(batch, device=device)
        if local:
            final_lp = torch.where(f_owned, rows.logprob(ar * nodes + u, torch.where(f_owned, f_local, 0)), zero)
        lp_out[ar, k] = comm.all_reduce(final_lp, dist.ReduceOp.SUM)
        logprobs = lp_out
    return out, path.to(torch.int32), k.to(torch.int32), logprobs


def tree_rejection_sample_logits(
    local_logits: torch.Tensor,
    tree_token_ids: torch.Tensor,
    parents: torch.Tensor,
    num_nodes: torch.Tensor | None = None,
    draft_probs: torch.Tensor | None = None,
    *,
    vocab_start: int,
    vocab_size: int,
    group=None,
    temperature=None,
    top_k=None,
    top_p=None,
    min_p=None,
    seeds: torch.Tensor | None = None,
    offsets: torch.Tensor | None = None,
    return_logprobs: bool = False,
    check_shards: bool = True,
    comm_stats: dict | None = None,
) -> LogitsTreeSampleOutput:
    """Tree verification from vocab-sharded target logits: §5.3 / §5.7 on shards (DESIGN.md §5.8).

    Every rank returns the result of :func:`specdec_ops.tree_rejection_sample_logits` on the
    concatenated logits for the same seeds (floating-point near-ties aside). The walk over the
    tree is sequential in the nodes: one all-gather of [B, 5] numbers per node (N - 1 per step)
    on top of the chain's collectives for the processed rows.

    Parameters
    ----------
    local_logits : float32 | float16 | bfloat16 [B, N, V_local]
        This rank's shard; row u is the target after node u.
    tree_token_ids : int32 | int64 [B, N]
        Global ids of the nodes' tokens (entry 0 ignored), the same on every rank.
    parents : int32 | int64 [B, N]
        parents[b, 0] = -1, 0 <= parents[b, i] < i; the same on every rank.
    num_nodes : int32 | int64 [B], optional
        Nodes >= num_nodes[b] are padding; None means N.
    draft_probs : float32 | float16 | bfloat16 [B, N, V_local], optional
        This rank's shard of q at each node (the distribution its children were drawn from).
    vocab_start, vocab_size, group, temperature, top_k, top_p, min_p, seeds, offsets, return_logprobs,
    check_shards, comm_stats
        As in :func:`rejection_sample_logits`.

    Returns
    -------
    LogitsTreeSampleOutput(token_ids int64 [B, N], accepted_path int32 [B, N], num_accepted int32 [B],
    logprobs float32 [B, N] or None)
        The same on every rank, as in §5.7.
    """
    comm = _Comm(group, local_logits.device if isinstance(local_logits, torch.Tensor) else None, comm_stats)
    device = comm.device
    shape = (list(local_logits.shape) if isinstance(local_logits, torch.Tensor) else []) + [-1] * 3
    error = None
    try:  # every local check before the agreement step: a rank that fails here still joins it
        check_tensor(local_logits, "local_logits")
        check_rank(local_logits, 3, "local_logits", "[B, N, V_local]")
        batch, nodes, local = local_logits.shape
        if nodes < 1:
            fail(f"local_logits must have N >= 1 nodes (node 0 is the root), got shape {list(local_logits.shape)}")
        _check_common(local_logits, vocab_start, vocab_size)
        check_tree_inputs(tree_token_ids, parents, num_nodes, batch, nodes, device, "local_logits")
        _check_draft_probs(draft_probs, (batch, nodes, local), "[B, N, V_local]", device)
        params, seeds, offsets = _local_sampling_rng(temperature, top_k, top_p, min_p, seeds, offsets, batch, device)
        if values_checked_here(device):
            check_tree_values(tree_token_ids, parents, num_nodes, vocab_size)
    except Exception as e:  # noqa: BLE001 (raised below, after the other ranks have heard of it)
        error = e
    flags = _request_flags(draft_probs, temperature, top_k, top_p, min_p, seeds, return_logprobs,
                           num_nodes is not None)
    _agree(comm, check_shards, error, [_int_or(vocab_start), shape[2] if error is None else -1,
                                       _int_or(vocab_size), shape[0], shape[1], -2, flags])
    seeds, offsets = _shared_rng(comm, seeds, offsets, batch, device)
    n = torch.full((batch,), nodes, dtype=torch.int64, device=device) if num_nodes is None else \
        num_nodes.to(torch.int64).clamp(1, nodes)
    flat = local_logits.reshape(batch * nodes, local)
    row_request = torch.arange(batch, device=device).repeat_interleave(nodes)
    rows = _Rows(comm, flat, row_request, vocab_start, vocab_size, params)
    greedy = rows.greedy.view(batch, nodes)[:, 0]
    return LogitsTreeSampleOutput(*_verify_tree(comm, rows, tree_token_ids.to(torch.int64), parents.to(torch.int64),
                                                n, draft_probs, greedy, seeds, offsets, vocab_start,
                                                bool(return_logprobs)))
