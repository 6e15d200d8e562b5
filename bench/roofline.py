"""Static performance model of the hot kernels on an H200, read from the compiled code (no GPU needed).

For each hot kernel at its reference shape (issue 11) this compiles the code the GPU would run — the CUDA
sources standalone with nvcc for sm_90 and sm_80 (they include no torch headers), the Triton kernels ahead
of time for sm_90 — and reads registers, spills and shared memory (ptxas -v, cuobjdump -res-usage), the
launch bounds (PTX .maxntid / .minnctapersm) and the SASS of the hot loop (cuobjdump -sass). From these and
the bytes the kernel moves at the reference shape it predicts a time and the fraction of HBM peak.

Model and its assumptions (each one a place where a GPU measurement can correct it: ``--measure``):

* Device: H200 SXM, 132 SMs, 65536 registers, 228 KiB shared memory (227 KiB per block), 2048 threads and
  32 blocks per SM; HBM 4.8e12 B/s; 1.98 GHz; each SM issues 4 warp instructions per cycle (one per
  scheduler, no dual issue); loaded DRAM latency LATENCY_S = 0.6 us; a fixed LAUNCH_S = 2 us per kernel
  (launch, first block, last-block tail).
* Occupancy (blocks per SM) is the minimum over registers (allocated per warp in units of 256), shared
  memory (static, plus the dynamic shared memory a case launches with: Case.dynamic_smem; the table's smem
  column is their sum), threads and the 32-block limit. Waves = ceil(grid / (132 x blocks per SM)).
* Bytes moved are counted per kernel from what its code reads and writes at the reference scenario (named
  in the table), every byte once from HBM: no L2 reuse, no L2 hits for rows read twice. Scattered scalar
  reads count a 32-byte sector each. The minimum is what any implementation must move for the same result.
* The hot loop is the innermost loop (a backward branch in the SASS) holding the kernel's vocab-wide loads
  (and, for races, the Philox rounds). Its instructions are counted statically. The basic blocks around
  the race's log (MUFU.LG2 or logf's polynomial: run only for entries that may still win, or while a race
  is empty) are counted apart and weighted by how often a warp runs them (log_path_fraction: i.i.d.
  scores, a running best beaten by its n-th candidate with probability 1/n; Triton races branch per tile
  on a best shared by the block, the CUDA races per entry on a bar per thread, so a warp runs an entry's
  log path when any of its 32 lanes may win there; a bar the lanes raise to the warp's best every few
  entries, Case.bar_share, makes that rare after the first raise; behind one skip test per group of
  entries, Case.skip_group, the group's exact path counts per group and the log paths inside it per entry);
  per element = that count / (elements one thread handles per trip: the bytes of the body's vector loads,
  the streamed rows, over the bytes of one element of every stream). Issue time = trips x warps x instructions / (busy SMs x 4 x clock).
* Latency time = waves x sequential passes x trips per thread per pass x LATENCY_S: each trip waits for
  its loads once (all the loads of one trip are issued before their first use).
* Kernels with several kinds of vocab-wide loops (the logits kernels: max, radix histogram, exp-sum, race;
  Case.phases) add up issue and latency time over their loops, each found in the SASS by its kind (see
  hot_loop) and weighted by its passes; ins/el is then the mean over the passes. A pass over a row that an
  earlier pass copied into shared memory (phase marked "smem": its loop's loads are LDS) adds issue time only:
  it is no HBM trip (no LATENCY_S; the shared-memory latency, ~30 cycles a trip hidden behind the other warps,
  and bank conflicts are not modelled), and its bytes are not HBM bytes.
* predicted = LAUNCH_S + max(bytes / bandwidth, issue time, latency time); % of peak = the time the
  minimum bytes take at 4.8 TB/s / predicted. An op that launches two kernels (Case.then) is predicted as
  the sum of both kernels' predictions; its row shows the first kernel's resources.

Usage::

    python bench/roofline.py                # table; exit 1 on any spill (sm_80 or sm_90) or compile error
    python bench/roofline.py --json out.json
    python bench/roofline.py --only rejection_cuda_draft
    python bench/roofline.py --only logits  # rejection_sample_logits, CUDA and Triton
    python bench/roofline.py --arch 90      # sm_90 only (the tests; CI's build checks every arch's spills)
    python bench/roofline.py --measure      # on a GPU: also time each kernel (torch.cuda.Event)
    python bench/roofline.py --measure --predicted bench/roofline.json
                                            # on a GPU: measure only, the predictions from the committed
                                            # table while it matches the sources (bench/gpu_check.sh)

Needs nvcc (CUDA_HOME or /usr/local/cuda) and triton; without nvcc it prints a skip note and exits 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# H200 SXM.
SMS = 132
REGS_PER_SM = 65536
SMEM_PER_SM = 228 * 1024
SMEM_PER_BLOCK = 227 * 1024
THREADS_PER_SM = 2048
BLOCKS_PER_SM = 32
BANDWIDTH = 4.8e12
CLOCK_HZ = 1.98e9
ISSUE_PER_SM = 4
LATENCY_S = 0.6e-6
LAUNCH_S = 2.0e-6

PHILOX_CONSTANT = "-0x2daee0ad"  # 0xD2511F53 as it appears in SASS immediates


# ----------------------------------------------------------------------------------------------------------
# Reference shapes and scenarios
# ----------------------------------------------------------------------------------------------------------

V = 128256   # vocabulary (Llama 3)
K = 4        # draft length
N_TREE = 16  # tree nodes
KV = dict(layers=32, batch=64, heads=8, head_dim=128, moves=3, elem=2)
ATT = dict(batch=64, nodes=16, group=4, kv_heads=8, head_dim=128, prefix=8192, elem=2)


@dataclasses.dataclass
class Case:
    """One kernel at one reference shape."""

    name: str
    backend: str                 # "cuda" or "triton"
    shape: str                   # what runs (for the table)
    loop: str                    # which hot loop: "race" (Philox), "scan" (no Philox), "copy" (stores), "mma"
    streams: int                 # rows (or tensors) the hot loop reads side by side
    elem_bytes: int              # bytes of one element of a stream
    bytes_moved: float           # at the scenario
    min_bytes: float
    elems_per_pass: int          # elements of one stream a request (or work item) covers per pass
    items: int                   # requests / work items
    passes: int = 1              # sequential passes over a row per work item
    source: str = ""             # cuda: .cu path; triton: module:function
    function: str = ""           # cuda: regex on the mangled entry name
    triton: dict | None = None   # types, constexprs, num_warps, num_stages, maxnreg
    grid: object = None          # callable(resources) -> (grid blocks, blocks per item), else from launch bounds
    measure: object = None       # callable() -> seconds on a GPU
    elems_per_trip: float = 0.0  # per thread; 0: from the loop's vector loads (mma tiles: BLOCK_N / threads)
    phases: list | None = None   # kernels with several vocab-wide loops: [(loop, passes, streams)] per item,
                                 # replacing loop / streams / passes; issue and latency time add up over them
    loop_pick: object = None     # callable(loop text) -> bool: which of a kernel's loops of the kind is the
                                 # scenario's (kernels whose passes share one loop shape; see hot_loop)
    then: "Case | None" = None   # a second kernel the op launches after this one (its own resources and
                                 # prediction; the row's time is the sum, its resources this kernel's; its
                                 # own `then` follows it, and so on)
    launches: int = 1            # launches of this kernel, one per pass (LAUNCH_S each)
    dynamic_smem: int = 0        # bytes of dynamic shared memory per block (added to the static for occupancy)
    bar_share: int = 0           # CUDA races: entries a thread races between raises of its bar to the warp's
                                 # best (cuda::warp_raise_bar); 0: each thread skips against its own best only
    skip_group: int = 1          # CUDA races: entries behind one skip test and branch (race_group_may_update:
                                 # 4); the group's exact path runs when any of them may win on any lane
    tail_trips: int = 0          # dependent round trips after the kernel's last streamed bytes (a last program's
                                 # work on what the others wrote: tickets, their partials): LATENCY_S each


def _rows(n, elem=4):
    return n * V * elem


def _sector_reads(n):
    return 32 * n


# The Triton chain kernel's split (specdec_ops/rejection.py _launch_triton): BLOCK-entry tiles, programs per SM.
REJECTION_TRITON_BLOCK = 1024
REJECTION_TRITON_PROGRAMS_PER_SM = 5
REJECTION_TRITON_MAXNREG = 96  # the launcher's register cap (ptxas .maxnreg)
REJECTION_TRITON_MAX_PARTS = 256


def _rejection_triton_parts(batch, vocab=V):
    """Mirror of specdec_ops/rejection.py _triton_parts on the H200 -> (parts per request, tiles per part):
    resident // batch parts (SMS x programs per SM resident), at most one tile each, then as few parts as
    cover the row with that many tiles each."""
    tiles = -(-vocab // REJECTION_TRITON_BLOCK)
    parts = max(1, min(SMS * REJECTION_TRITON_PROGRAMS_PER_SM // batch, tiles, REJECTION_TRITON_MAX_PARTS))
    per_part = -(-tiles // parts)
    return -(-tiles // per_part), per_part


def rejection_cases():
    """Chain rejection at B=64 (draft probs, one-hot, greedy) and B=8 (draft probs), fp32, V=128256, K=4.

    Both backends split every request's vocabulary over several blocks / programs (CUDA: vocab_split.h
    vocab_parts_for; Triton: _rejection_triton_parts, the launcher's rule), and every block / program repeats
    the acceptance tests. The Triton rows count those scalar reads (p(x), q(x)) once per program and add the
    workspace: the zeroed counter, per program its partials (a score and an index per row it scans, a 32-byte
    sector each) and its ticket (an atomic), and the last program's reads of every partial. The CUDA rows
    count the acceptance reads once and no workspace."""
    cases = []
    scen = [
        ("draft", 64, "B=64 K=4 fp32 q, reject at 1", 2, True, False),
        ("onehot", 64, "B=64 K=4 fp32 one-hot, reject at 1", 1, False, False),
        ("greedy", 64, "B=64 K=4 fp32 greedy, all accepted", 1, False, True),
        ("draft_b8", 8, "B=8 K=4 fp32 q, reject at 1", 2, True, False),
    ]
    for tag, batch, shape, streams, has_q, greedy in scen:
        rows = K + 1 if greedy else streams
        accept_reads = 0 if greedy else batch * 2 * _sector_reads(2 if has_q else 1)  # p(x), q(x) of 2 drafts
        moved = batch * _rows(rows) + accept_reads
        common = dict(shape=shape, streams=1 if greedy else streams, elem_bytes=4, bytes_moved=moved,
                      min_bytes=batch * _rows(rows), elems_per_pass=V, items=batch, passes=K + 1 if greedy else 1,
                      loop="scan" if greedy else "race")
        cases.append(Case(name=f"rejection_cuda_{tag}", backend="cuda", source="csrc/rejection/rejection_kernels.cu",
                          function=r"rejection_sample_kernelIf", bar_share=4, **common,
                          measure=_measure_rejection(batch, has_q, greedy, "cuda")))
        parts, _ = _rejection_triton_parts(batch)
        slots = K + 1 if greedy else 1  # partials per program: one per row scanned
        workspace = batch * (4                                            # the zeroed counter
                             + parts * (slots * 2 * 32 + 32)              # partial stores, ticket
                             + slots * 2 * (-(-parts * 4 // 32) * 32))    # the merge's reads
        triton_common = dict(common, bytes_moved=moved + (parts - 1) * accept_reads + workspace)
        cases.append(Case(name=f"rejection_triton_{tag}", backend="triton",
                          source="triton_kernels.rejection:rejection_sample_kernel", **triton_common,
                          triton=dict(types=dict(target_ptr="*fp32", draft_probs_ptr="*fp32", greedy_ptr="*i1",
                                                 num_accepted_ptr="*i32", scores_ptr="*fp32", index_ptr="*i32",
                                                 counters_ptr="*i32"),
                                      constexprs=dict(PACKED=False, HAS_DRAFT_PROBS=has_q, HAS_GREEDY=greedy,
                                                      HAS_BONUS_IDS=False, BONUS_ROWS=True, SYNTHETIC=False,
                                                      vocab=V, BLOCK_K=8, BLOCK=REJECTION_TRITON_BLOCK,
                                                      PARTS_BLOCK=min(128, REJECTION_TRITON_MAX_PARTS),
                                                      WHILE_LOOPS=False),
                                      num_warps=4, maxnreg=REJECTION_TRITON_MAXNREG),
                          grid=lambda res, parts=parts, batch=batch: (batch * parts, parts),
                          measure=_measure_rejection(batch, has_q, greedy, "triton")))
    return cases


def _tree_parts(res, batch=64):
    """Mirror of tree_verify_kernels.cu layout_for: blocks per request, a power of two up to
    vthreads / threads (1024 / 128 = 8 at V = 128256), with the whole batch resident at once."""
    threads = res["threads"] or 128
    resident = SMS * blocks_per_sm(res["regs"], res["shared"], threads)
    parts = 1
    while 2 * parts <= 1024 // threads and batch * 2 * parts <= resident:
        parts *= 2
    return parts


def _tree_sumrace_loop(text):
    """The pass of a node without draft probs (sum, support and race of p_u): its race's rare path reads the
    children's tokens (generic loads) and divides at most twice per entry there (the score, 16 entries a
    trip); the residual loop with normalizers (m > 0: a second rejection at one node) also reads generic
    memory (the normalizers) but divides several times per entry."""
    return "LD.E " in text and text.count("MUFU.RCP") <= 32


def _tree_residual_m0_loop(text):
    """The pass after a node's first rejection with draft probs (m = 0): the only race loop that reads no
    generic memory (no normalizers, no children's tokens)."""
    return "LD.E " not in text


def _tree_triton_parts(batch=64, vblock=4096, chunk=512):
    """Mirror of specdec_ops/tree_verify.py _tree_parts: programs per request of the Triton kernel's first
    pass, a power of two up to VBLOCK / CHUNK (4096 / 512 = 8) with batch x parts <= SMs x 4."""
    parts = 1
    while 2 * parts <= vblock // chunk and batch * 2 * parts <= SMS * 4:
        parts *= 2
    return parts


def _tree_triton_split_loop(text):
    """The Triton kernel's split first pass: Philox rounds and 16-byte loads of its UNROLL = 2 tiles per trip,
    VBLOCK x 4 = 0x4000 bytes apart (fp32); the walk's own race (one program per request) loads 2 x 16 bytes
    0x800 apart, and the excluded lanes' race (no draft probs) has no 16-byte loads."""
    return PHILOX_CONSTANT in text and re.search(r"LDG\.E\.128 \S+ desc\[\w+\]\[R\d+\.64\+0x4000\]", text) is not None


def tree_cases():
    """Tree verification B=64 N=16 fp32 V=128256: the root's only child is rejected, then the final race at
    the root (the walk's first pass is its last).

    CUDA (tree_verify_kernels.cu): every request's passes are split over `parts` blocks (_tree_parts). One
    pass reads the row(s) once: without draft probs the sum and support of p_0 with the final race in the
    same pass; with draft probs the sum of the next residual with the final race (the acceptance test reads
    p_0(x), q_0(x) only). The pass ends at the request's barrier; the last block to arrive goes on without
    polling, so a final pass ends like the chain kernel's last-block merge (in LAUNCH_S). Not modelled: a
    walk that goes on after the barrier (an accepted child) waits about 2 x LATENCY_S there per pass, and
    with draft probs each further rejected child of the final node adds a pass over p and q.
    Triton (tree_verify.py): the first pass (here the only one: the sum and support of p_0, or the sum of the
    next residual, with the final race in the same pass) split over `parts` programs per request
    (_tree_triton_parts), each taking 1 / parts of the lanes of every 4096-wide tile (VBLOCK), 2 tiles a trip;
    each program writes its lane sums and partials and takes a ticket, and the last one merges them and walks
    the tree (scalar reads: every program finds the pass from the tree, the last walks it again). Its race
    computes the log and the division for every entry (no skip test, unlike CUDA's): issue-bound. Not
    modelled: the launcher's zeroing of the tickets (a second, tiny launch, as the CUDA kernel's counter
    memset)."""
    cases = []
    for tag, has_q in (("draft", True), ("onehot", False)):
        streams = 2 if has_q else 1
        rows = _rows(streams)
        scalars = _sector_reads(2 if has_q else 1) + 2 * N_TREE * 8  # p_0(x) [q_0(x)]; parents and tokens
        common = dict(shape=f"B=64 N=16 fp32 {'q' if has_q else 'one-hot'}, root's child rejected + race",
                      streams=streams, elem_bytes=4, min_bytes=64 * rows, elems_per_pass=V, items=64, loop="race")
        # CUDA: one pass; partials of 8 blocks (40 B each) and 32 virtual-warp sums, written and read back.
        workspace = 2 * (8 * 40 + 32 * 4)
        cases.append(Case(name=f"tree_verify_cuda_{tag}", backend="cuda",
                          source="csrc/tree_verify/tree_verify_kernels.cu", function=r"tree_verify_kernelIf",
                          bytes_moved=64 * (rows + scalars + workspace), passes=1, bar_share=4,
                          skip_group=1 if has_q else 4,  # the one-hot pass tests each group once
                          grid=lambda res: (64 * _tree_parts(res), _tree_parts(res)),
                          loop_pick=_tree_residual_m0_loop if has_q else _tree_sumrace_loop,
                          measure=_measure_tree(has_q, "cuda"), **common))
        # Triton: one pass; every program reads the tree (and the pass's p_0(x) [q_0(x)]), the last one again;
        # per request the 4096 lane sums, 16 B of partials per program (best, index, count) and a ticket per
        # program (a sector each), written and read back; without draft probs each program writes and reads its
        # list of the root's children (a sector).
        parts = _tree_triton_parts()
        workspace = 2 * (4096 * 4 + parts * 16) + parts * 32 + (0 if has_q else 2 * parts * 32)
        cases.append(Case(name=f"tree_verify_triton_{tag}", backend="triton",
                          source="triton_kernels.tree_verify:tree_verify_kernel",
                          bytes_moved=64 * (rows + (parts + 1) * scalars + workspace), passes=1,
                          triton=dict(types=dict(target_ptr="*fp32", draft_probs_ptr="*fp32", greedy_ptr="*i1",
                                                 normalizers_ptr="*fp32", zeroed_ptr="*i32", kids_ptr="*i32",
                                                 lane_sums_ptr="*fp32", part_best_ptr="*fp32",
                                                 part_index_ptr="*i32", part_count_ptr="*i64", tickets_ptr="*i32",
                                                 accepted_path_ptr="*i32", num_accepted_ptr="*i32"),
                                      constexprs=dict(HAS_NUM_NODES=False, HAS_DRAFT_PROBS=has_q, HAS_GREEDY=False,
                                                      vocab=V, BLOCK_N=16, BLOCK=1024, VBLOCK=4096, PARTS=parts,
                                                      CHUNK=512, UNROLL=2,
                                                      TILES=1 << (-(-V // 4096) - 1).bit_length()),
                                      num_warps=4, maxnreg=128),
                          grid=lambda res, parts=parts: (64 * parts, parts), loop_pick=_tree_triton_split_loop,
                          measure=_measure_tree(has_q, "triton"), **common))
    return cases


def kv_cases():
    """kv_commit's move kernels (kv_move_kernel; the seq_lens launch after them moves a few bytes and is not
    modelled): 32 layers of K and V, bf16, B=64, Hk=8, D=128, 3 moves per request (read + write each)."""
    row = KV["heads"] * KV["head_dim"] * KV["elem"]
    caches = 2 * KV["layers"]
    moved = caches * KV["batch"] * KV["moves"] * row * 2
    common = dict(shape="32 layers K+V bf16 B=64 Hk=8 D=128, 3 moves", streams=1, elem_bytes=1,
                  bytes_moved=moved, min_bytes=moved, elems_per_pass=KV["moves"] * row,
                  items=caches * KV["batch"], loop="copy")

    def cuda_grid(res):
        # kv_kernels.cu kv_move_kernel<true> (paths <= 32 entries): grid (requests, caches, splits),
        # splits = min(ceil(2 SMs / pairs), units / threads); its small seq_lens launch is not modelled.
        pairs = caches * KV["batch"]
        units = KV["heads"] * KV["head_dim"] * KV["elem"] // 16
        splits = max(1, min(-(-2 * SMS // pairs), -(-units // res["threads"])))
        return pairs * splits, splits

    return [
        Case(name="kv_commit_cuda", backend="cuda", source="csrc/kv/kv_kernels.cu", function=r"kv_move_kernelILb1E",
             grid=cuda_grid, measure=_measure_kv("cuda"), **common),
        Case(name="kv_commit_triton", backend="triton", source="triton_kernels.kv_commit:kv_move_kernel",
             triton=dict(types=dict(cache_addresses_ptr="*i64", cache_geometry_ptr="*i64", seq_lens_ptr="*i64",
                                    path_ptr="*i64", block_table_ptr="*i64"),
                         # the launcher's pick for contiguous, 16-byte aligned bf16 caches (kv.py _row_layout)
                         constexprs=dict(ELEM_BYTES=2, PAGED=False, BLOCK_M=4, BLOCK=1024, ROW_TILES=1,
                                         CONTIGUOUS_ROWS=True, VEC=8), num_warps=4),
             grid=lambda res: (caches * KV["batch"], 1), measure=_measure_kv("triton"), **common),
    ]


def attention_cases():
    """Tree attention B=64 N=16 GQA 4 (32 query / 8 KV heads) D=128 bf16 over an 8k prefix; the causal decode
    over the same KV moves the same bytes (its predicted time is the minimum: bytes / bandwidth)."""
    a = ATT
    kv_bytes = a["batch"] * a["kv_heads"] * a["prefix"] * a["head_dim"] * a["elem"] * 2
    rows = a["nodes"] * a["group"]
    import torch  # the launcher's tiles, not a copy of them
    from specdec_ops.attention import _tile_config

    block_m, block_n, block_d, num_warps, maxnreg = _tile_config(torch.bfloat16, rows, a["head_dim"])
    m_tiles = -(-rows // block_m)
    programs = m_tiles * a["batch"] * a["kv_heads"]
    splits = 1 if programs >= SMS else max(1, min(-(-2 * SMS // programs), a["prefix"] // 1024, 32))
    jit = _jit_specialization(_attention_int_args(splits))
    return [Case(
        name="tree_attention_triton", backend="triton", source="triton_kernels.tree_attention:tree_attention_kernel",
        shape=f"B=64 N=16 GQA4 D=128 bf16 prefix 8k (x{m_tiles} m-tiles)", loop="mma", streams=2,
        elem_bytes=a["head_dim"] * a["elem"], bytes_moved=kv_bytes * m_tiles, min_bytes=kv_bytes,
        elems_per_pass=a["prefix"] // splits, items=programs * splits,
        triton=dict(types=dict(q_ptr="*bf16", k_ptr="*bf16", v_ptr="*bf16", prefix_lens_ptr="*i64",
                               mask_ptr="*i64", table_ptr="*i64", out_ptr="*bf16", lse_ptr="*fp32",
                               qk_scale="fp32"),
                    # what the JIT compiles for the launcher's integer arguments at this shape
                    stride_type=jit["stride_type"], aligned=jit["aligned"],
                    constexprs=dict(PAGED=False, SKIP_PREFIX=False, BLOCK_M=block_m, BLOCK_N=block_n,
                                    BLOCK_D=block_d, IEEE=False, WHILE_LOOPS=False, **jit["constants"]),
                    num_warps=num_warps, num_stages=2, **({"maxnreg": maxnreg} if maxnreg else {})),
        grid=lambda res: (programs * splits, 1), measure=_measure_attention(),
        elems_per_trip=block_n / (32 * num_warps))]  # BLOCK_N keys per trip over the block's threads


def _attention_int_args(splits: int) -> dict[str, int]:
    """The integer arguments specdec_ops.attention._launch_tree_attention passes at the ATT shape (contiguous
    [B, S, Hk, D] caches of S = prefix + N slots, q and out [B, N, Hq, D], lse [B, N, Hq]; one split: the
    output strides lead with 0), those the kernel marks do_not_specialize left out."""
    a = ATT
    hq, n, d, slots = a["kv_heads"] * a["group"], a["nodes"], a["head_dim"], a["prefix"] + a["nodes"]
    q = (n * hq * d, hq * d, d, 1)
    kv = (slots * a["kv_heads"] * d, a["kv_heads"] * d, d, 1)
    out = (0, *q) if splits == 1 else (a["batch"] * n * hq * d, *q)
    lse = (0, n * hq, hq, 1) if splits == 1 else (a["batch"] * n * hq, n * hq, hq, 1)
    names = dict(zip(("stride_qb", "stride_qn", "stride_qh", "stride_qd"), q))
    names.update(zip(("stride_k0", "stride_k1", "stride_kh", "stride_kd"), kv))
    names.update(zip(("stride_v0", "stride_v1", "stride_vh", "stride_vd"), kv))
    names.update(zip(("stride_os", "stride_ob", "stride_on", "stride_oh", "stride_od"), out))
    names.update(zip(("stride_ls", "stride_lb", "stride_ln", "stride_lh"), lse))
    names.update(num_words=-(-n // 64), group=a["group"], num_kv_heads=a["kv_heads"], block_size=1,
                 table_stride=0, head_dim=d)
    return names


def _jit_specialization(values: dict[str, int]) -> dict:
    """How Triton's JIT specializes integer arguments by value: 1 becomes a constant, a multiple of 16 (0
    included) is marked divisible by 16, and an int is typed i32 below 2^31. Returns the compile_triton keys:
    constants, aligned, and stride_type (i32 when every stride fits)."""
    return dict(constants={k: 1 for k, v in values.items() if v == 1},
                aligned=[k for k, v in values.items() if v != 1 and v % 16 == 0],
                stride_type="i32" if all(abs(v) < 2 ** 31 for k, v in values.items() if "stride" in k) else "i64")


def _logits_parts(res, batch=64):
    """Mirror of csrc/logits/logits_split.h logits_split_for: blocks per request of the split chain kernel, a
    power of two up to vthreads / threads (1024 / 128 = 8 at V = 128256), with the whole batch resident."""
    threads = res["threads"] or 128
    resident = SMS * blocks_per_sm(res["regs"], res["shared"], threads)
    parts = 1
    while 2 * parts <= 1024 // threads and batch * 2 * parts <= resident:
        parts *= 2
    return parts


def _logits_grid(res, batch, parts):
    """(grid, blocks per request) of the resident-row split kernel; its share size assumes `parts`."""
    if _logits_parts(res, batch) != parts:
        raise RuntimeError(f"split layout: {_logits_parts(res, batch)} parts, the modelled share assumes {parts}")
    return batch * parts, parts


def _logits_unit_temperature_loop(text):
    """The split kernel's loops that run at the scenario (temperature 1, finite logits, sampled rows, the
    resident share's slice of 128: vthreads 1024 over 8 parts), of the several inlined versions of each pass:
    - exp-sums: the sweep without the division by T (kUnitT, no MUFU.RCP), the first try without logit_value
      (no FMNMX.NAN: logits_kernels.cu vthread_sum; the checked sum runs only where a NaN or +inf logit made
      the first one non-finite) and with the slice as a constant (most loads at immediate offsets);
    - the max read back from the share: the value-only fold of sampled rows (no FSETP: greedy rows' argmax
      loop compares and keeps an index);
    - the race: the fast bonus race at temperature 1 (race_mode 1, kRaceBonus): no expf (FFMA.RM), one
      division and one log per entry, both on the cold path (a residual race takes two logs an entry, the
      mode at other temperatures two divisions);
    - radix histograms (ATOMS) as they are."""
    if PHILOX_CONSTANT in text:
        ex2 = text.count("MUFU.EX2")
        return ("FFMA.RM" not in text and ex2 > 0 and text.count("FCHK") == ex2
                and text.count("0.69314718") == ex2)
    if "ATOMS" in text:
        return True
    if "MUFU.EX2" in text:
        loads = re.findall(r"\bLDS\S*\s+\S+,\s*\[([^\]]*)\]", text)
        immediate = sum(1 for a in loads if re.search(r"\+0x[0-9a-f]+$", a))
        return "MUFU.RCP" not in text and "FMNMX.NAN" not in text and 2 * immediate >= len(loads)
    return not ("HMNMX2" in text and "FSETP" in text)


# Rounds of the CUDA early bonus token at the top-p scenario (logits_kernels.cu, the bonus row: a race over
# the entries above the last winner, then the exp-sum above the new one). The bonus row is N(0, 1) noise: the race
# over every entry picks a token top-p 0.9 keeps with probability 0.9 (the kept mass), and a second round, over the
# entries above a dropped winner, keeps with a higher one: 1 + 0.1 + 0.01 rounds at most on average. The model
# averages them over the batch; a request that takes a second round finishes a race and an exp-sum of its row
# later (its blocks then alone on their SMs: not modelled).
BONUS_ROUNDS = 1.11
# The Triton early bonus token (specdec_ops/logits.py _launch_early_bonus) runs one round: the share of the
# scenario's requests whose race winner top-p 0.9 drops (or leaves unsure), which then run the select, the kept
# mass and the walk's race as before: 1 - 0.9 of them, rounded up to whole requests.
TRITON_BONUS_FALLBACK = 0.1


def logits_cases():
    """Chain verification from logits (rejection_sample_logits) B=64 K=4 V=128256 bf16, all drafts accepted.

    All accepted is the worst case in rows: verification must read every one of the K+1 rows (bf16, V x 2
    bytes each: the minimum), each row's statistics are computed, then the bonus row's race runs. Every pass
    reads the row once more: without filters (temperature 1) the max, then the kept mass; with top-p 0.9 also
    the radix select over the bf16 logits' keys (CUDA: 2 passes of 8 bits by mass; Triton: 4 passes of 4 bits),
    then the kept mass; then
    one race over the bonus row. Scalar reads: the draft's logit (and q(x) with draft probs, bf16) per draft row.

    CUDA without filter tensors (logits_kernels.cu rejection_sample_logits_split_kernel, its resident-row
    variant kResident = true: the share fits, 31.5 KB of dynamic shared memory per block at V=128256 bf16):
    every pass of a request is split over `parts` blocks (_logits_parts); each pass writes the blocks'
    partials (32 B each) and 32 virtual-warp sums to the workspace and reads them back after the request's
    barrier. Each row is read from HBM once: the max pass copies each block's share into shared memory
    (cp.async, 16 pieces of 16 B in flight per thread: one HBM trip) and takes the max from there; the kept
    mass and the race (and a greedy row's log-softmax sum) read the share from shared memory. Those
    shared-memory loops count their instructions (issue time: the max read-back, the exp-sum, the race) but
    no HBM bytes and no latency trips (see the model's assumptions). Not modelled: the barrier's wait (about
    2 x LATENCY_S per pass that is not the kernel's last), shared-memory latency and bank conflicts.
    CUDA with top-p: the same kernel's kFiltered variant. Its draft rows take top-p's early acceptance
    (logits_split.h top_p_accepts_early): at this scenario's draft rows, whose draft token holds nearly all
    the mass before and after top-p (the measurement spikes its logit 30 above N(0, 1) logits), the exp-sum
    over every entry accepts the draft and the row runs neither the select nor the kept mass. The bonus row
    takes the early bonus token (logits_kernels.cu): its exp-sum over every entry, then rounds of the race over
    the entries above the last dropped winner and the exp-sum above the new one (logits_split.h
    top_p_verdict_above), BONUS_ROUNDS on average; it runs no radix pass. A draft rejected, or accepted only after
    its select, adds one exp-sum, 2 radix passes over the share (the select over the bf16 logits' 16-bit keys) and
    the kept mass: not in this scenario. Triton without filters: one launch (_logits_triton_fused_case); with
    top-p: the split kernels with the radix passes between them (_logits_triton_filtered_case)."""
    cases = []
    batch, rows = 64, K + 1
    row_bytes = V * 2
    for tag, has_q, top_p in (("onehot", False, False), ("draft", True, False),
                              ("onehot_topp", False, True), ("draft_topp", True, True)):
        scalars = batch * K * _sector_reads(2 if has_q else 1)
        shape = f"B=64 K=4 bf16 {'q' if has_q else 'one-hot'}{', top-p 0.9' if top_p else ''}, all accepted"
        for backend in ("cuda", "triton"):
            if backend == "cuda":
                # Resident rows: the copy (HBM, with the max's loop kind) and the max read-back, [the radix
                # select by mass: 2 passes], the kept mass and the race over the share in shared memory (the
                # race's draft-probs loads, skipped on the bonus row, are not LDS: one stream of the share).
                # With top-p the K draft rows are accepted early (top_p_accepts_early: their exp-sum over
                # every entry is the pass they take instead of the select and the kept mass); the bonus row
                # takes the early bonus token: its exp-sum over every entry, then rounds of a race and the
                # exp-sum above its winner (top_p_verdict_above), BONUS_ROUNDS of them on average.
                if top_p:
                    phases = [("max", rows, 1), ("max", rows, 1, "smem"),
                              ("expsum", K + 1 + BONUS_ROUNDS, 1, "smem"), ("race", BONUS_ROUNDS, 1, "smem")]
                else:
                    phases = [("max", rows, 1), ("max", rows, 1, "smem"), ("expsum", rows, 1, "smem"),
                              ("race", 1, 1, "smem")]
            else:  # (the Triton cases below replace these phases)
                phases = [("expsum", rows, 1), ("race", 1, 1)]
            passes = sum(p[1] for p in phases)
            hbm_passes = sum(p[1] for p in phases if p[3:] != ("smem",))  # passes that read a row from HBM
            common = dict(shape=shape, loop="race", streams=1, elem_bytes=2,
                          bytes_moved=batch * hbm_passes * row_bytes + scalars, min_bytes=batch * rows * row_bytes,
                          elems_per_pass=V, items=batch, passes=passes, phases=phases,
                          measure=_measure_logits(has_q, top_p, backend))
            if backend == "cuda":
                parts = 8  # _logits_parts at this scenario (checked below against the compiled resources)
                exchanges = 2 * rows + 1  # max and kept mass per row, the race: one barrier each
                workspace = exchanges * 2 * (8 * 32 + 32 * 4)  # per request: partials and virtual-warp sums, w + r
                if top_p:
                    # the draft rows' exp-sums over every entry, the bonus row's and its rounds' (a race and an
                    # exp-sum each): one barrier each
                    workspace = (2 * rows + 2 * BONUS_ROUNDS) * 2 * (8 * 32 + 32 * 4)
                common["bytes_moved"] += batch * workspace
                share = -(-V // 1024) * (1024 // parts) * 2  # logits_split.h split_share_bytes: 126 chunks x 128 x bf16
                cases.append(Case(name=f"logits_cuda_{tag}", backend="cuda", source="csrc/logits/logits_kernels.cu",
                                  function=r"36rejection_sample_logits_split_kernelI13__nv_bfloat16S\d_Lb1ELb%dE"
                                  % int(top_p),
                                  grid=lambda res: _logits_grid(res, batch, parts),
                                  loop_pick=_logits_unit_temperature_loop, dynamic_smem=share, bar_share=4,
                                  **common))
            elif not top_p:
                cases.append(_logits_triton_fused_case(tag, shape, has_q, batch, rows, row_bytes, scalars, common))
            else:
                cases.append(_logits_triton_filtered_case(tag, shape, has_q, batch, rows, row_bytes, scalars, common))
    return cases


SPLIT_CHUNK = 8192   # specdec_ops/logits.py SPLIT_CHUNK
SPLIT_BLOCK = 1024   # specdec_ops/logits.py _block (compiled)
SPLIT_PART_BLOCK = 4096  # specdec_ops/logits.py _partials_block(SPLIT_CHUNK)


def _race_group(batch, chunks):
    """Chunks per program of the walk kernel's race on the modelled GPU: the launcher's own rule."""
    from specdec_ops.logits import chain_race_group
    return chain_race_group(batch, chunks, SMS)


def _fused_chunk_loop(text):
    """chain_fused_kernel's loops at the scenario (clean logits): the unsanitized passes (chunk_partials_raw, and
    chunk_partials_race on the bonus row), not chunk_partials (its NaN selects and +inf clamp: a chunk with such
    logits only) nor the race programs' split_race (its skip test's ex2 of x a + b: no running max)."""
    return "3.40282346638528859812e+38" not in text and "FMNMX" in text


_FUSED_MAXNREG = 104  # specdec_ops/logits.py _FUSED_MAXNREG


def _logits_triton_fused_case(tag, shape, has_q, batch, rows, row_bytes, scalars, common):
    """Triton chain verification without filters, logprobs or rates (specdec_ops/logits.py _launch_fused_chain): one
    launch of chain_fused_kernel, grid B x (K+1) x chunks chunk programs, then B x races request programs (races
    over chunks of SPLIT_CHUNK after a rejection, as chain_walk_race_kernel's: 8 a request here);
    chunks of fused_chunk(64, V) = 32768 entries (4 a row: 256 bonus-row programs). Each chunk program reads
    its chunk of a row once: a draft row's as bf16 pairs in tiles of SPLIT_PART_BLOCK (chunk_partials_raw: max,
    exp-sum, one fused multiply-add an entry for the exponent), the bonus row's as quads in tiles of
    SPLIT_BLOCK with the bonus race over the same entries (chunk_partials_race_quads: each quad's Philox block
    in its thread, the skip test, the exact scores of a tile with an entry that may still win, H(trips)/trips
    of them against the chunk's running best: 32 tiles a chunk), 16 B of partials written per chunk (8 B more
    on the bonus row), then its arrival (an atomic). Phases: the exp-sum loop over the K draft rows' share of
    the chunk programs, the race loop over the bonus row's; the issue time counts the chunk programs (the
    request programs' work is the tail). Each request program reads the request's draft ids, draft logits
    (and q(x)) before it waits, then the partials of K+1 rows x chunks (16 B) and the bonus race's winners (8 B
    a chunk) and, program 0 of the request, writes the outputs. Tail after the last chunk's bytes: 3 round
    trips (the last arrival seen by the polling request program, the partials read back, the walk's arithmetic
    and the outputs: a few hundred instructions of one program, counted as a round trip). Counters: 4 B a
    program for its place plus the arrivals and the polls; one memset before the launch (torch.zeros of 1 + 2B
    int32) not counted. Not modelled: a bonus-row program runs about 5x the instructions of a draft-row one;
    the bonus rows' programs take the first places (fused_chunk_program), so the draft rows' programs fill the
    SMs around them and none is left running alone at the end, but an SM left with only one or two of them
    issues at their own pace (a warp's dependent instructions), below the model's 4 a cycle."""
    from specdec_ops.logits import fused_chunk
    chunk = fused_chunk(batch, V) or SPLIT_CHUNK  # the launcher's choice (32768 here)
    chunks = -(-V // chunk)
    race_chunks = -(-V // SPLIT_CHUNK)  # the request programs' race after a rejection: chunks of 8192
    group = _race_group(batch, race_chunks)
    races = -(-race_chunks // group)
    programs = batch * rows * chunks
    partials = programs * 16 + batch * chunks * 8
    walk = batch * races * (rows * chunks * 16 + chunks * 8 + (K + 1) * 8 * 2) + scalars
    counters = (programs + batch * races) * 4 * 2
    types = dict(logits_ptr="*bf16", draft_probs_ptr="*bf16", draft_ids_ptr="*i64", lengths_ptr="*i64",
                 seeds_ptr="*i64", offsets_ptr="*i64", temperature_ptr="*fp32", part_max_ptr="*fp32",
                 part_arg_ptr="*i64", part_sum_ptr="*fp32", bonus_score_ptr="*fp32", bonus_index_ptr="*i32",
                 race_score_ptr="*fp32", race_index_ptr="*i64", counters_ptr="*i32", token_ids_ptr="*i64",
                 num_accepted_ptr="*i32", bonus_ptr="*i64")
    const = dict(PACKED=False, HAS_DRAFT_PROBS=has_q, HAS_T=False, HAS_BONUS=False, CHUNKS=chunks,
                 CHUNKS_P2=1 << (chunks - 1).bit_length(), CHUNK=chunk, PART_BLOCK=SPLIT_PART_BLOCK,
                 RACE_BLOCK=SPLIT_BLOCK, BLOCK=SPLIT_BLOCK, BLOCK_K=8, vocab=V, RACE_GROUP=group, PAIRS=True,
                 QUADS=True, RACE_CHUNKS=race_chunks, RACE_CHUNKS_P2=1 << (race_chunks - 1).bit_length(),
                 RACE_CHUNK=SPLIT_CHUNK)
    return Case(name=f"logits_triton_{tag}", backend="triton", shape=shape, loop="expsum", streams=1,
                elem_bytes=2, bytes_moved=batch * rows * row_bytes + partials + walk + counters,
                min_bytes=batch * rows * row_bytes, elems_per_pass=V, items=batch * rows, passes=1,
                phases=[("expsum", K / rows, 1), ("race", 1 / rows, 1)], loop_pick=_fused_chunk_loop,
                source="triton_kernels.logits:chain_fused_kernel",
                triton=dict(types=types, constexprs=const, num_warps=4, maxnreg=_FUSED_MAXNREG),
                grid=lambda res: (programs, chunks), tail_trips=3, measure=common["measure"])


SPLIT_RADIX_BLOCK = 512  # specdec_ops/logits.py _radix_block (compiled)
RADIX_SPLIT = 4  # specdec_ops/logits.py RADIX_SPLIT: programs per chunk of a radix pass


def _logits_triton_filtered_case(tag, shape, has_q, batch, rows, row_bytes, scalars, common):
    """Triton chain verification with top-p (specdec_ops/logits.py _launch_chain, _launch_filters): the split
    pair (chain_row_partials_kernel, chain_walk_race_kernel) with the thresholds between them. chain_row_partials_kernel; then 4
    launches of chain_radix_pass_kernel (bf16 logits: 16-bit radix keys, 4 bits a pass; grid B x (K+1) x
    chunks), whose first launch takes the draft rows by top-p's early acceptance (chain_row_accepts_early: their
    programs exit; the scenario's drafts hold nearly all the mass; RADIX_SPLIT programs a chunk), each reading
    its part of the bonus row once more and the select's state, writing its part's histogram (16 x 4 B), the
    row's last program (the finisher) reading the row's histograms (L2 in practice, counted as HBM) and
    picking the pass's digit; its loop counted whole, the one-hot histogram included: an
    upper bound, as only the first passes find a candidate in every tile (later tiles skip it); then
    chain_kept_mass_kernel (the thresholds, the bonus row once more: the kept mass over its chunk; the draft rows
    read their flag); then the walk and the bonus row's race (chain_walk_race_kernel, HAS_FILTERS, EARLY).
    Before the filters, top-p's early bonus token (EARLY_BONUS): chain_bonus_race_kernel (grid B x races, the
    eligibility from every draft row's partials in every program, the bonus row's race over every entry) and
    chain_bonus_verdict_kernel (grid B x chunks: the bonus row once more, the mass above the winner); only the
    requests whose winner top-p drops (TRITON_BONUS_FALLBACK of them) then run the radix passes, the kept mass
    and the walk's race (the others' programs read their done flag and exit: bytes, no time)."""
    chunks = -(-V // SPLIT_CHUNK)
    group = _race_group(batch, chunks)
    races = -(-chunks // group)
    programs = batch * rows * chunks
    fallback = math.ceil(batch * TRITON_BONUS_FALLBACK)
    types = dict(logits_ptr="*bf16", draft_probs_ptr="*bf16", temperature_ptr="*fp32", top_k_ptr="*i64",
                 top_p_ptr="*fp32", min_p_ptr="*fp32", part_max_ptr="*fp32", part_arg_ptr="*i64",
                 part_sum_ptr="*fp32", hist_ptr="*fp32", prefix_ptr="*i64", acc_ptr="*fp32",
                 goal_ptr="*fp32", ktau_ptr="*i64", ptau_ptr="*i64", tau_ptr="*i64", part_kept_ptr="*fp32", race_score_ptr="*fp32",
                 race_index_ptr="*i64", tickets_ptr="*i32", token_ids_ptr="*i64", num_accepted_ptr="*i32",
                 logprobs_ptr="*fp32", bonus_ptr="*i64", rates_ptr="*fp32", step="i32", passed="i32",
                 early_ptr="*i8", done_ptr="*i8", bonus_w_ptr="*i64", part_above_ptr="*fp32")
    const = dict(PACKED=False, HAS_T=False, HAS_K=False, HAS_P=True, HAS_MIN_P=False, HAS_BONUS=False, TREE=False,
                 CHUNKS=chunks, CHUNKS_P2=1 << (chunks - 1).bit_length(), CHUNK=SPLIT_CHUNK, vocab=V, EARLY=True,
                 HAS_DRAFT_PROBS=has_q, EARLY_BONUS=True)
    split = dict(shape=shape, streams=1, elem_bytes=2, min_bytes=batch * rows * row_bytes, elems_per_pass=V,
                 items=batch * rows, grid=lambda res: (programs, chunks))
    race = Case(name=f"logits_triton_{tag}_race", backend="triton", loop="race", passes=1,
                bytes_moved=fallback * (row_bytes + chunks * rows * 28 + races * 24) + scalars + batch * races,
                source="triton_kernels.logits:chain_walk_race_kernel",
                triton=dict(types=types, constexprs=dict(const, HAS_DRAFT_PROBS=has_q, LOGPROBS=False,
                                                         HAS_RATES=False, HAS_FILTERS=True, BLOCK_K=8,
                                                         BLOCK=SPLIT_BLOCK, RACE_GROUP=group), num_warps=4),
                **dict(split, items=fallback, grid=lambda res: (fallback * races, races)))
    # Top-p's early acceptance (EARLY: no logprobs) takes the K draft rows (the scenario's drafts hold nearly all
    # the mass): their programs decide it in the first radix launch (the row's chunk partials, the draft's id,
    # logit and q, one flag written) and exit, in the later launches and the kept mass after reading the flag.
    # The bonus rows run the select and the kept mass: items and grid count their programs; the others' reads
    # are counted as bytes, their launch slots not.
    bonus_programs = fallback * chunks
    parts = chunks * RADIX_SPLIT
    early_reads = RADIX_SPLIT * (programs * (chunks * 16 + 3 * 32 + 2) + 4 * programs * 2)
    kept = Case(name=f"logits_triton_{tag}_kept", backend="triton", loop="expsum", passes=1,
                bytes_moved=fallback * row_bytes + bonus_programs * (4 + 2 * 8 + 8) + programs * 2,
                source="triton_kernels.logits:chain_kept_mass_kernel",
                triton=dict(types=types, constexprs=dict(const, PASSES=4, BLOCK=SPLIT_BLOCK), num_warps=4), then=race,
                **dict(split, items=fallback, grid=lambda res: (bonus_programs, chunks)))
    radix = Case(name=f"logits_triton_{tag}_radix", backend="triton", loop="scan", passes=4, launches=4,
                 bytes_moved=4 * (fallback * row_bytes + fallback * parts * (16 * 4 + 32 + 16 * 4)) + early_reads,
                 source="triton_kernels.logits:chain_radix_pass_kernel",
                 triton=dict(types=types, constexprs=dict(const, BY_MASS=True, PASSES=4, BLOCK=SPLIT_RADIX_BLOCK,
                                                          SPLIT=RADIX_SPLIT), num_warps=4),
                 then=kept, **dict(split, items=fallback, grid=lambda res: (fallback * parts, parts)))
    # every program of the bonus race decides its request's eligibility from the K draft rows' partials, ids,
    # logits and q; the verdict reads the bonus row once more (its mass above the winner)
    eligibility = rows * chunks * 16 + (rows - 1) * 3 * 32
    verdict = Case(name=f"logits_triton_{tag}_verdict", backend="triton", loop="expsum", passes=1,
                   bytes_moved=batch * (row_bytes + chunks * (16 + 4 + 8) + rows * 16),
                   source="triton_kernels.logits:chain_bonus_verdict_kernel",
                   triton=dict(types=types, constexprs=dict(const, BLOCK=SPLIT_BLOCK, BLOCK_K=8), num_warps=4),
                   then=radix, **dict(split, items=batch, grid=lambda res: (batch * chunks, chunks)))
    bonus_race = Case(name=f"logits_triton_{tag}_bonus", backend="triton", loop="race", passes=1,
                      bytes_moved=batch * (row_bytes + races * (eligibility + 24)) + scalars,
                      source="triton_kernels.logits:chain_bonus_race_kernel",
                      triton=dict(types=types, constexprs=dict(const, BLOCK=SPLIT_BLOCK, RACE_GROUP=group),
                                  num_warps=4),
                      then=verdict, **dict(split, items=batch, grid=lambda res: (batch * races, races)))
    return Case(name=f"logits_triton_{tag}", backend="triton", loop="expsum", passes=1,
                bytes_moved=batch * rows * row_bytes + programs * 20, phases=[("expsum", 1, 1)],
                source="triton_kernels.logits:chain_row_partials_kernel",
                triton=dict(types=types, constexprs=dict(const, PART_BLOCK=SPLIT_PART_BLOCK), num_warps=4),
                measure=common["measure"], then=bonus_race, **split)


def all_cases():
    return rejection_cases() + tree_cases() + kv_cases() + attention_cases() + logits_cases()


# ----------------------------------------------------------------------------------------------------------
# Toolchain
# ----------------------------------------------------------------------------------------------------------

def find_nvcc():
    for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if home and os.path.exists(os.path.join(home, "bin", "nvcc")):
            return os.path.join(home, "bin", "nvcc")
    return shutil.which("nvcc")


def find_tool(name, nvcc):
    """cuobjdump / nvdisasm: next to nvcc, else the copies Triton ships."""
    cand = [os.path.join(os.path.dirname(nvcc), name)] if nvcc else []
    try:
        import triton
        cand.append(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name))
    except ImportError:
        pass
    for c in cand:
        if os.path.exists(c):
            return c
    return shutil.which(name)


def run(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:3])} ... failed:\n{out.stderr[-3000:]}")
    return out.stdout + out.stderr


# ----------------------------------------------------------------------------------------------------------
# Reading compiled code
# ----------------------------------------------------------------------------------------------------------

def parse_res_usage(text):
    """cuobjdump -res-usage -> {function: dict(regs, stack, shared, local)}."""
    out, fn = {}, None
    for line in text.splitlines():
        m = re.match(r"\s*Function (\S+):", line)
        if m:
            fn = m.group(1)
            continue
        m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", line)
        if m and fn:
            out[fn] = dict(regs=int(m.group(1)), stack=int(m.group(2)), shared=int(m.group(3)),
                           local=int(m.group(4)))
            fn = None
    return out


def parse_ptxas(text):
    """nvcc -Xptxas -v -> {function: spill bytes (stores + loads)}."""
    spills, fn = {}, None
    for line in text.splitlines():
        m = re.search(r"Compiling entry function '(\S+)'", line)
        if m:
            fn = m.group(1)
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and fn:
            spills[fn] = int(m.group(1)) + int(m.group(2))
    return spills


def parse_launch_bounds(ptx):
    """PTX -> {function: (maxntid, minnctapersm)}."""
    out = {}
    for m in re.finditer(r"\.entry (\S+)\(.*?\)\s*((?:\.\w+[^\n]*\n)*)", ptx, re.S):
        attrs = m.group(2)
        ntid = re.search(r"\.maxntid (\d+)", attrs)
        mnc = re.search(r"\.minnctapersm (\d+)", attrs)
        out[m.group(1)] = (int(ntid.group(1)) if ntid else None, int(mnc.group(1)) if mnc else None)
    return out


def split_sass(text):
    """cuobjdump -sass -> {function: [(address, instruction text)]}."""
    funcs, cur = {}, None
    for line in text.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            cur = funcs.setdefault(m.group(1), [])
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m and cur is not None:
            cur.append((int(m.group(1), 16), m.group(2).strip()))
    return funcs


_LOAD = re.compile(r"\b(LDG|LDGSTS)(\.[\w.]+)?\b")
_LOAD_SHARED = re.compile(r"\b(LDS)(\.[\w.]+)?\b")  # passes over rows held in shared memory (Case.phases "smem")
_WIDTH = {".128": 16, ".64": 8, ".U16": 2, ".S16": 2, ".U8": 1, ".S8": 1}


def load_bytes(ins, smem=False):
    m = (_LOAD_SHARED if smem else _LOAD).search(ins)
    if not m:
        return 0
    mods = m.group(2) or ""
    for suffix, width in _WIDTH.items():
        if suffix in mods:
            return width
    return 4


_LOG_MARKERS = ("MUFU.LG2", "0.69314718")  # logf: the hardware log2, or the polynomial's final ln(2) multiply


def _branch_target(ins):
    parts = ins.split()
    op = parts[1] if ins.startswith("@") else parts[0]
    if not op.startswith("BRA"):
        return None
    m = re.search(r"(0x[0-9a-f]+)\s*$", ins)
    return int(m.group(1), 16) if m else None


def philox_groups(body):
    """Philox blocks in a stretch of SASS: each of the 10 rounds multiplies by 0xD2511F53 once (one
    IMAD.WIDE.U32, or an IMAD.HI.U32 with a separate low product)."""
    mults = sum(1 for x in body if PHILOX_CONSTANT in x and ("IMAD.WIDE.U32" in x or "IMAD.HI.U32" in x))
    groups = mults / 10
    return groups if groups >= 1 and groups == int(groups) else 0  # else the constant sits in a register


# A radix histogram loop: shared-memory atomics (CUDA) or 16 bins of counts and mass reduced per tile (Triton's
# one-hot sums, through shared memory: 14-20 block barriers a trip depending on the specialization, where a loop
# with one reduction has 2 and the race's tile argmax 8).
_HISTOGRAM_BARRIERS = 12


def hot_loop(sass, kind, streams, elem_bytes=4, pick=None, smem=False, innermost=False):
    """The hot loop of `kind` (see Case.loop) -> (body instructions, cold instruction count) or None.

    Kinds: "race" (Philox), "scan" (no Philox, no stores), "copy" (stores), "mma"; for the logits kernels'
    passes, none with Philox or stores: "max" (no exp, no histogram), "expsum" (exp, no histogram), "radix"
    (a histogram: see _HISTOGRAM_BARRIERS); of several inlined versions of those the longest is kept.
    `pick` (the case's loop_pick), when given, keeps only the loops whose text it accepts. `smem`: the loop's
    loads are shared-memory loads (LDS; a pass over a row a previous pass copied into shared memory).

    Loops are backward branches; of those holding the loads (and, for races, the Philox rounds) the innermost
    are kept (in the logits kernels' passes, a loop nested in one with wider loads is that loop's elementwise
    tail, the piece a row's end cuts: the outer loop is kept and the tail's instructions are left out of its
    body), then those with the
    widest loads (the vectorized path), and of several versions of one source
    loop the one with the most load bytes when the case reads several streams, else the one with the fewest. Cold instructions are those of the
    race's log path: the largest forward-branch region around each log marker that holds no random bits and
    no loads (the path an entry takes only when it may still win, or when a race is still empty). A shared-memory
    compare-and-swap retry loop counts once, inside the loop around it (no retries: bin contention is not
    modelled). `innermost`: count the smallest such region around each log marker instead (the log path of
    one entry, inside a group's exact path: Case.skip_group)."""
    index = {addr: i for i, (addr, _) in enumerate(sass)}
    loops = []
    for i, (addr, ins) in enumerate(sass):
        t = _branch_target(ins)
        if t is not None and t <= addr and t in index:
            loops.append((index[t], i))
    cands = []
    for lo, hi in set(loops):
        body = [ins for _, ins in sass[lo:hi + 1]]
        text = "\n".join(body)
        nload = sum(load_bytes(x, smem) for x in body)
        philox = PHILOX_CONSTANT in text
        if nload == 0:
            continue
        if re.search(r"\bATOMS\.CAST?\.SPIN", text) and len(body) <= 16:
            continue  # a compare-and-swap retry loop (a 64-bit or float add in shared memory): part of its loop
        if kind == "race" and not philox:
            continue
        if kind == "scan" and (philox or "STG" in text):
            continue
        if kind == "copy" and "STG" not in text and "STS" not in text:
            continue
        if kind == "mma" and not re.search(r"\b(HMMA|HGMMA)", text):
            continue
        histogram = "ATOMS" in text or len(re.findall(r"\bBAR\.SYNC", text)) >= _HISTOGRAM_BARRIERS
        exp = "MUFU.EX2" in text
        if kind in ("max", "expsum", "radix") and (philox or "STG" in text):
            continue
        if kind == "max" and (exp or histogram):
            continue
        if kind == "expsum" and (not exp or histogram):
            continue
        if kind == "radix" and not histogram:
            continue
        if pick is not None and not pick(text):
            continue
        widest = max(load_bytes(x, smem) for x in body)
        cands.append((lo, hi, sum(load_bytes(x, smem) for x in body if load_bytes(x, smem) == widest), widest))
    # The innermost candidates, where a loop nested in another with narrower loads is not the hot one: the
    # elementwise loop over the piece a row's end cuts, inside the loop over 16-byte pieces (split_for_each).
    scan = kind in ("max", "expsum", "radix")  # (a race's nested loops are its exact paths: innermost kept)
    inner = [c for c in cands
             if not any(o is not c and c[0] <= o[0] and o[1] <= c[1] and (o[3] >= c[3] or not scan) for o in cands)]
    if not inner:
        return None
    widest = max(c[3] for c in inner)
    inner = [c for c in inner if c[3] == widest]
    def bases(c):  # distinct address registers of the widest loads: one per streamed row
        found = set()
        for _, x in sass[c[0]:c[1] + 1]:
            if load_bytes(x, smem) == c[3]:
                m = re.search(r"\[(R\d+)(?:\.64)?", x)
                if m:
                    found.add(m.group(1))
        return len(found)
    if kind == "race":
        inner = [c for c in inner if bases(c) == streams] or inner
    if kind in ("max", "expsum", "radix"):  # several inlined versions (greedy log-softmax, by count or mass)
        lo, hi = max(inner, key=lambda c: (c[1] - c[0], c[0]))[:2]  # the longest: an upper bound
    else:
        lo, hi = (max if streams > 1 else min)(inner, key=lambda c: (c[2], c[0]))[:2]
    # Loops nested in the chosen one with narrower loads (that tail) run once a row, not per trip: not counted.
    tails = set()
    widest_here = max(load_bytes(x, smem) for _, x in sass[lo:hi + 1])
    for a, b in set(loops) if scan else ():
        if (a, b) != (lo, hi) and lo <= a and b <= hi and \
                max((load_bytes(x, smem) for _, x in sass[a:b + 1]), default=0) < widest_here:
            tails.update(range(a, b + 1))
    cold = set()
    for j in range(lo, hi + 1):
        if j in tails:
            continue
        if not any(m in sass[j][1] for m in _LOG_MARKERS):
            continue
        best = None
        for i in range(lo, j):
            t = _branch_target(sass[i][1])
            if t is not None and t > sass[j][0] and t in index and index[t] <= hi + 1:
                region = (i + 1, index[t])
                text = [sass[k][1] for k in range(*region)]
                if any(PHILOX_CONSTANT in x or load_bytes(x, smem) for x in text):
                    continue  # the region holds hot work (random bits or loads): not a skipped path
                size = region[1] - region[0]
                if best is None or (size < best[1] - best[0] if innermost else size > best[1] - best[0]):
                    best = region
        if best is not None:
            cold.update(k for k in range(*best) if k not in tails)
    return [ins for k, (_, ins) in enumerate(sass[lo:hi + 1], lo) if k not in tails], len(cold)


# ----------------------------------------------------------------------------------------------------------
# Compiling
# ----------------------------------------------------------------------------------------------------------

def compile_cuda(nvcc, cuobjdump, source, arch, workdir):
    """-> dict(function -> resources + sass) for one .cu file and arch."""
    tag = os.path.basename(source).replace(".cu", "") + f"_sm{arch}"
    keep = os.path.join(workdir, tag)
    os.makedirs(keep, exist_ok=True)
    cubin = os.path.join(keep, tag + ".cubin")
    log = run([nvcc, "-std=c++17", "-O3", f"-arch=sm_{arch}", "-cubin", "--keep", "--keep-dir", keep, "-Xptxas",
               "-v", "-I", os.path.join(ROOT, "csrc"), os.path.join(ROOT, source), "-o", cubin])
    spills = parse_ptxas(log)
    ptx = "".join(open(os.path.join(keep, f)).read() for f in os.listdir(keep) if f.endswith(".ptx"))
    bounds = parse_launch_bounds(ptx)
    res = parse_res_usage(run([cuobjdump, "-res-usage", cubin]))
    sass = split_sass(run([cuobjdump, "-sass", cubin])) if arch == 90 else {}
    out = {}
    for fn, r in res.items():
        ntid, mnc = bounds.get(fn, (None, None))
        out[fn] = dict(r, spills=spills.get(fn, 0), threads=ntid, min_blocks=mnc, sass=sass.get(fn),
                       uses_ctaid_y="SR_CTAID.Y" in "\n".join(x for _, x in sass.get(fn, [])))
    return out


def compile_triton(cuobjdump, case, workdir):
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    module, name = case.source.split(":")
    fn = getattr(importlib.import_module(module), name)
    spec = case.triton
    names = fn.arg_names
    const = {k: v for k, v in spec["constexprs"].items() if k in names}
    sig = {}
    for n in names:
        if n in const:
            sig[n] = "constexpr"
        elif n in spec["types"]:
            sig[n] = spec["types"][n]
        elif n.endswith("_ptr"):
            sig[n] = "*i64"
        elif n.startswith("stride") or n.endswith("_stride"):
            sig[n] = spec.get("stride_type", "i64")
        else:
            sig[n] = "i32"
    missing = [n for n in names if sig[n] == "i32" and n.isupper()]
    if missing:
        raise RuntimeError(f"{case.source}: no value for constexpr {missing} in bench/roofline.py")
    # Pointers from the torch allocator are 16-byte aligned: the launcher's specialization; so are the integer
    # arguments the case names in "aligned" (the JIT specializes those divisible by 16, e.g. the strides of a
    # contiguous cache with D = 128).
    aligned = set(spec.get("aligned", ()))
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in names
             if sig[n].startswith("*") or n in aligned and sig[n] != "constexpr"}
    options = dict(num_warps=spec.get("num_warps", 4), num_stages=spec.get("num_stages", 3))
    if "maxnreg" in spec:
        options["maxnreg"] = spec["maxnreg"]  # the launcher's register cap (ptxas .maxnreg)
    target = GPUTarget("cuda", 90, 32)
    try:
        kernel = triton.compile(ASTSource(fn, sig, constexprs={(names.index(k),): v for k, v in const.items()},
                                          attrs=attrs), target=target, options=options)
    except TypeError:
        kernel = triton.compile(ASTSource(fn, sig, constexprs={(names.index(k),): v for k, v in const.items()}),
                                target=target, options=options)
    cubin = os.path.join(workdir, case.name + ".cubin")
    with open(cubin, "wb") as f:
        f.write(kernel.asm["cubin"])
    res = parse_res_usage(run([cuobjdump, "-res-usage", cubin]))
    sass = split_sass(run([cuobjdump, "-sass", cubin]))
    fname = next(iter(res))
    r = res[fname]
    shared = max(r["shared"], int(getattr(kernel.metadata, "shared", 0) or 0))
    return dict(r, shared=shared, spills=r["local"], threads=32 * options["num_warps"], min_blocks=None,
                sass=sass.get(fname) or next(iter(sass.values())), uses_ctaid_y=False)


# ----------------------------------------------------------------------------------------------------------
# The model
# ----------------------------------------------------------------------------------------------------------

def blocks_per_sm(regs, shared, threads):
    warps = -(-threads // 32)
    regs_per_warp = -(-max(regs, 1) * 32 // 256) * 256
    by_regs = REGS_PER_SM // (regs_per_warp * warps)
    by_smem = SMEM_PER_SM // shared if shared else BLOCKS_PER_SM
    by_threads = THREADS_PER_SM // threads
    return max(0, min(by_regs, by_smem, by_threads, BLOCKS_PER_SM))


def vocab_parts_for(batch, vocab, resident, threads):
    """Mirror of csrc/common/vocab_split.h vocab_parts_for."""
    by_device = resident // batch if batch > 0 else 1
    by_vocab = ((vocab + 3) // 4) // threads
    return max(1, min(by_device, by_vocab))


def log_path_fraction(backend, trips, elems_per_trip, bar_share=0, group=1):
    """Expected fraction of a race loop's trips (Triton) or entries (CUDA) on which a warp runs the log path.

    Triton (race_tile_update): one best per block, a branch per tile; tile t holds a new best with
    probability 1/t, so H(trips) of the trips run it. CUDA (race_update): a branch per entry against a
    thread's bar; the warp runs an entry's log path when any of its 32 lanes may win there: 1 - (1 - 1/c)^32
    with c the entries that entry must beat to win, itself included. With one best per thread
    (bar_share 0) the n-th entry of a thread has c = n; when the lanes raise their bars to the warp's best
    every bar_share entries (cuda::warp_raise_bar) the n-th entry also competes with the other 31 lanes'
    entries before the last raise: c = n + 31 * bar_share * floor((n - 1) / bar_share). With `group` > 1
    entries behind one skip test the fraction is that of the groups whose exact path a warp runs: those where
    any lane may win at any of the group's entries, 1 - prod over its entries of (1 - 1/c)^32. The skip
    test's small margin is not counted."""
    if trips <= 0:
        return 0.0
    if backend == "triton":
        return sum(1.0 / t for t in range(1, trips + 1)) / trips
    n_max = max(1, int(round(trips * elems_per_trip)))

    def seen(n):
        return n + (31 * bar_share * ((n - 1) // bar_share) if bar_share else 0)

    runs = [1.0 - math.prod((1.0 - 1.0 / seen(n)) ** 32 for n in range(g0 + 1, min(g0 + group, n_max) + 1))
            for g0 in range(0, n_max, group)]
    return sum(runs) / len(runs)


def predict(case, res):
    threads = res["threads"] or 1024
    shared = res["shared"] + case.dynamic_smem
    occ = blocks_per_sm(res["regs"], shared, threads)
    if case.grid is not None:
        grid, per_item = case.grid(res)
    elif res.get("uses_ctaid_y"):
        per_item = vocab_parts_for(case.items, case.elems_per_pass, SMS * (res["min_blocks"] or occ), threads)
        grid = case.items * per_item
    else:
        grid, per_item = case.items, 1
    waves = -(-grid // (SMS * max(occ, 1)))
    row = dict(regs=res["regs"], spills=res["spills"], smem=shared, threads=threads, ctas_per_sm=occ,
               grid=grid, sms_busy=min(grid, SMS), waves=waves, bytes_mb=case.bytes_moved / 1e6,
               bytes_vs_min=case.bytes_moved / case.min_bytes)
    t_mem = case.bytes_moved / BANDWIDTH
    t_issue = t_lat = 0.0
    phases = case.phases or [(case.loop, case.passes, case.streams)]
    found, phase_rows = [], []
    for phase in phases:
        kind, passes, streams = phase[:3]
        smem = phase[3:] == ("smem",)  # a pass over shared memory: issue time only, no HBM trip
        loop = hot_loop(res["sass"] or [], kind, streams, case.elem_bytes, case.loop_pick, smem)
        if loop is None:
            if case.phases:
                raise RuntimeError(f"no {kind!r} loop found in the SASS of {case.name}")
            continue
        body, cold = loop
        vector = [load_bytes(x, smem) for x in body if load_bytes(x, smem) >= 8]  # the streamed rows (scalars: indices)
        per_trip_bytes = sum(vector) or sum(load_bytes(x, smem) for x in body)
        elems_per_trip = case.elems_per_trip or per_trip_bytes / (streams * case.elem_bytes)
        trips = math.ceil(case.elems_per_pass / per_item / (threads * elems_per_trip)) if elems_per_trip else 0
        # the log path, as often as a warp runs it (log_path_fraction); behind a group test (skip_group) the
        # group's exact path as often as a warp runs that, the entries' log paths inside it per entry
        log_share = log_path_fraction(case.backend, trips, elems_per_trip, case.bar_share) if cold else 0.0
        group_share, inner = log_share, cold
        if cold and case.skip_group > 1:
            inner = hot_loop(res["sass"] or [], kind, streams, case.elem_bytes, case.loop_pick, smem,
                             innermost=True)[1]
            group_share = log_path_fraction(case.backend, trips, elems_per_trip, case.bar_share, case.skip_group)
        hot = len(body) - cold + group_share * (cold - inner) + log_share * inner
        warps_total = grid * (threads // 32)
        t_issue += passes * trips * warps_total * hot / (min(grid, SMS) * ISSUE_PER_SM * CLOCK_HZ)
        if not smem:
            t_lat += waves * passes * trips * LATENCY_S
        found.append((hot, cold, per_trip_bytes, elems_per_trip, trips, passes))
        phase_rows.append(dict(loop=kind + (" (smem)" if smem else ""), passes=passes, instructions=hot, cold=cold, elems_per_trip=elems_per_trip,
                               trips=trips, log_path_fraction=log_share))
    if found:
        # ins/el: per element of the whole kernel (all passes), weighted by each pass
        total_passes = sum(f[5] for f in found)
        ipe = sum(f[5] * f[0] / f[3] for f in found if f[3]) / total_passes if case.phases else (
            found[0][0] / found[0][3] if found[0][3] else None)
        row.update(loop_instructions=found[0][0], loop_cold=found[0][1], loads_per_trip_bytes=found[0][2],
                   instr_per_elem=ipe, trips=found[0][4], log_path_fraction=phase_rows[0]["log_path_fraction"])
        if case.phases:
            row.update(phases=phase_rows)
    else:
        row.update(loop_instructions=None, loop_cold=None, loads_per_trip_bytes=None, instr_per_elem=None, trips=None)
    predicted = case.launches * LAUNCH_S + max(t_mem, t_issue, t_lat) + case.tail_trips * LATENCY_S
    bound = max((t_mem, "memory"), (t_issue, "issue"), (t_lat, "latency"))[1]
    row.update(t_mem_us=t_mem * 1e6, t_issue_us=t_issue * 1e6, t_lat_us=t_lat * 1e6, predicted_us=predicted * 1e6,
               bound=bound, pct_peak=100 * case.min_bytes / BANDWIDTH / predicted)
    return row


def combine_kernels(case, first, second):
    """The row of an op launching two kernels: the first kernel's resources, both kernels' bytes and time
    (several: `first` is the row so far, `then` the list of the later kernels' rows past the second)."""
    row = dict(first)
    if "then" in first:
        row["then_more"] = first.get("then_more", []) + [first["then"]]
    row["bytes_mb"] = first["bytes_mb"] + second["bytes_mb"]
    row["bytes_vs_min"] = row["bytes_mb"] * 1e6 / case.min_bytes
    row["predicted_us"] = first["predicted_us"] + second["predicted_us"]
    if second["predicted_us"] > first["predicted_us"]:
        row["bound"] = second["bound"]
    row["pct_peak"] = 100 * case.min_bytes / BANDWIDTH / (row["predicted_us"] * 1e-6)
    row["then"] = second
    return row


# ----------------------------------------------------------------------------------------------------------
# Measuring (GPU only)
# ----------------------------------------------------------------------------------------------------------

def _time(fn, iters=50):
    """Time ``fn`` three ways (seconds per call): ``eager``, CUDA events around ``iters`` calls from Python
    (what an eager caller sees, host overhead included); ``graph``, the same calls captured in one CUDA
    graph and replayed (the GPU's time with launch gaps, no host overhead: what the model predicts; None
    when the op cannot be captured, ``graph_error`` says why); ``kernels``, each kernel's mean duration
    per call from torch.profiler (``kernel``: their sum, the GPU busy time)."""
    import collections

    import torch

    def events_time(body, n):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(n):
            body()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3

    fn()
    out = dict(eager=events_time(fn, iters) / iters, graph=None)
    per_graph = 10
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up on a side stream before the capture, as torch's docs do
            fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(per_graph):
                fn()
        graph.replay()
        replays = max(1, iters // per_graph)
        out["graph"] = events_time(graph.replay, replays) / (replays * per_graph)
    except Exception as exc:  # noqa: BLE001 - reported next to the eager time
        out["graph_error"] = f"{type(exc).__name__}: {exc}"[:200]
        torch.cuda.synchronize()
    kernels = collections.Counter()
    try:
        from torch.profiler import ProfilerActivity, profile
        n = 10
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(n):
                fn()
            torch.cuda.synchronize()
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                kernels[e.name] += e.time_range.elapsed_us() * 1e-6 / n
    except Exception as exc:  # noqa: BLE001
        out["profile_error"] = f"{type(exc).__name__}: {exc}"[:200]
    out["kernels"] = dict(kernels.most_common())
    out["kernel"] = sum(kernels.values()) if kernels else None
    return out


def _timing_text(t) -> str:
    """One line of a _time result: graph, kernel and eager microseconds, the kernels by their share."""
    us = lambda v: "-" if v is None else f"{v * 1e6:.1f}"  # noqa: E731
    names = ", ".join(f"{name[:48]} {v * 1e6:.1f}" for name, v in list(t.get("kernels", {}).items())[:6])
    text = f"graph {us(t['graph'])} us, kernels {us(t.get('kernel'))} us, eager {us(t['eager'])} us"
    if "graph_error" in t:
        text += f" (no graph: {t['graph_error'][:80]})"
    return text + (f" [{names}]" if names else "")


def _measure_rejection(batch, has_q, greedy, backend):
    def measure():
        import torch

        import specdec_ops
        g = torch.Generator(device="cuda").manual_seed(0)
        p = torch.rand(batch, K + 1, V, device="cuda", generator=g).softmax(-1)
        q = torch.rand(batch, K, V, device="cuda", generator=g).softmax(-1) if has_q else None
        ids = p[:, :K].argmax(-1) if greedy else torch.randint(0, V, (batch, K), device="cuda", generator=g)
        n = torch.full((batch,), K, dtype=torch.int64, device="cuda")
        seeds = torch.arange(batch, device="cuda")
        offsets = torch.zeros(batch, dtype=torch.int64, device="cuda")
        flags = torch.full((batch,), greedy, dtype=torch.bool, device="cuda")
        return _time(lambda: specdec_ops.rejection_sample(p, ids, n, draft_probs=q, seeds=seeds, offsets=offsets,
                                                          greedy=flags, backend=backend))
    return measure


def _measure_logits(has_q, top_p, backend):
    """rejection_sample_logits at the modelled scenario: each draft token's logit spikes 30 above N(0, 1)
    noise, so p(x) > 0.99 (and top-p 0.9 keeps only x): every draft is accepted (checked before timing)."""
    def measure():
        import torch

        import specdec_ops
        b = 64
        g = torch.Generator(device="cuda").manual_seed(0)
        logits = torch.randn(b, K + 1, V, device="cuda", generator=g)
        ids = torch.randint(0, V, (b, K), device="cuda", generator=g)
        logits[:, :K].scatter_(2, ids[..., None], 30.0)
        q = logits[:, :K].softmax(-1).to(torch.bfloat16) if has_q else None
        logits = logits.to(torch.bfloat16)
        n = torch.full((b,), K, dtype=torch.int64, device="cuda")
        seeds = torch.arange(b, device="cuda")
        offsets = torch.zeros(b, dtype=torch.int64, device="cuda")
        kwargs = dict(draft_probs=q, top_p=0.9 if top_p else None, seeds=seeds, offsets=offsets, backend=backend)
        out = specdec_ops.rejection_sample_logits(logits, ids, n, **kwargs)
        if not bool((out.num_accepted == K).all()):
            raise RuntimeError("not every draft accepted: the scenario is not the modelled one")
        return _time(lambda: specdec_ops.rejection_sample_logits(logits, ids, n, **kwargs))
    return measure


def _measure_tree(has_q, backend):
    """tree_rejection_sample at the modelled scenario: a chain-shaped tree (the root has one child) whose first
    token has no target mass at the root, so it is rejected (checked before timing) and the root's race runs."""
    def measure():
        import torch

        import specdec_ops
        b = 64
        g = torch.Generator(device="cuda").manual_seed(0)
        p = torch.rand(b, N_TREE, V, device="cuda", generator=g).softmax(-1)
        q = torch.rand(b, N_TREE, V, device="cuda", generator=g).softmax(-1) if has_q else None
        parents = torch.arange(-1, N_TREE - 1, device="cuda").expand(b, N_TREE).contiguous()
        tokens = torch.randint(0, V, (b, N_TREE), device="cuda", generator=g)
        p[:, 0].scatter_(1, tokens[:, 1:2], 0.0)
        seeds = torch.arange(b, device="cuda")
        offsets = torch.zeros(b, dtype=torch.int64, device="cuda")
        out = specdec_ops.tree_rejection_sample(p, tokens, parents, draft_probs=q, seeds=seeds, offsets=offsets,
                                                backend=backend)
        if not bool((out.num_accepted == 0).all()):
            raise RuntimeError("a child was accepted: the scenario is not the modelled one")
        return _time(lambda: specdec_ops.tree_rejection_sample(p, tokens, parents, draft_probs=q, seeds=seeds,
                                                               offsets=offsets, backend=backend))
    return measure


def _measure_kv(backend):
    def measure():
        import torch

        import specdec_ops
        k = KV
        cap = 512
        caches = [torch.randn(k["batch"], cap, k["heads"], k["head_dim"], device="cuda", dtype=torch.bfloat16)
                  for _ in range(2 * k["layers"])]
        seq_lens = torch.full((k["batch"],), 100, dtype=torch.int32, device="cuda")
        path = torch.tensor([0, 2, 5, 7], device="cuda").expand(k["batch"], 4).contiguous()

        def step():
            specdec_ops.kv_commit(caches, seq_lens, path, backend=backend)
            seq_lens.fill_(100)
        return _time(step)
    return measure


def _measure_attention():
    def measure():
        import torch

        import specdec_ops
        a = ATT
        hq = a["kv_heads"] * a["group"]
        cap = a["prefix"] + a["nodes"]
        q = torch.randn(a["batch"], a["nodes"], hq, a["head_dim"], device="cuda", dtype=torch.bfloat16)
        kc = torch.randn(a["batch"], cap, a["kv_heads"], a["head_dim"], device="cuda", dtype=torch.bfloat16)
        vc = torch.randn_like(kc)
        prefix = torch.full((a["batch"],), a["prefix"], dtype=torch.int64, device="cuda")
        parents = torch.tensor([-1] + list(range(a["nodes"] - 1)), device="cuda").expand(a["batch"], -1)
        mask = specdec_ops.build_tree(parents.contiguous()).mask
        tree = _time(lambda: specdec_ops.tree_attention(q, kc, vc, prefix, mask, backend="triton"))
        qd = q[:, :1].transpose(1, 2)
        kd, vd = kc[:, :a["prefix"]].transpose(1, 2), vc[:, :a["prefix"]].transpose(1, 2)
        decode = _time(lambda: torch.nn.functional.scaled_dot_product_attention(qd, kd, vd, enable_gqa=True))
        key = "graph" if tree["graph"] and decode["graph"] else "eager"
        print(f"  tree_attention {tree[key] * 1e6:.1f} us vs causal decode (SDPA) {decode[key] * 1e6:.1f} us "
              f"({key}): {tree[key] / decode[key]:.2f}x; SDPA: {_timing_text(decode)}")
        return tree
    return measure


# ----------------------------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------------------------

COLUMNS = [("kernel", "{:<26}"), ("regs", "{:>4}"), ("spill", "{:>5}"), ("smem", "{:>6}"), ("thr", "{:>4}"),
           ("cta/sm", "{:>6}"), ("grid", "{:>6}"), ("waves", "{:>5}"), ("MB", "{:>8.1f}"), ("x min", "{:>5.2f}"),
           ("ins/el", "{:>6}"), ("pred us", "{:>8.1f}"), ("bound", "{:>8}"), ("% peak", "{:>6.0f}")]


def format_row(name, r):
    ipe = f"{r['instr_per_elem']:.1f}" if r.get("instr_per_elem") is not None else "-"
    vals = [name, r["regs"], r["spills"], r["smem"], r["threads"], r["ctas_per_sm"], r["grid"], r["waves"],
            r["bytes_mb"], r["bytes_vs_min"], ipe, r["predicted_us"], r["bound"], r["pct_peak"]]
    text = [fmt.format(v) for (_, fmt), v in zip(COLUMNS, vals)]
    if r["pct_peak"] < 9.95:  # one decimal below 10%: the logits kernels' rows would all read 0-2
        text[-1] = f"{r['pct_peak']:>6.1f}"
    return " ".join(text)


def sources_digest() -> str:
    """sha256 over what a prediction is made from: the CUDA sources and headers (csrc/: .cu, .cuh, .h), the
    Triton kernels, the tree attention launcher's tiles (specdec_ops/attention.py) and this model (whose
    cases mirror the other launchers, as tests/test_roofline.py checks). A saved table (``--json``) records
    it; ``--predicted`` reuses the table only while it is the same."""
    import hashlib

    paths = [os.path.join("bench", "roofline.py"), os.path.join("specdec_ops", "attention.py")]
    for top, kinds in (("csrc", (".cu", ".cuh", ".h")), ("triton_kernels", (".py",))):
        for folder, dirs, files in os.walk(os.path.join(ROOT, top)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            paths += [os.path.relpath(os.path.join(folder, f), ROOT) for f in files if f.endswith(kinds)]
    digest = hashlib.sha256()
    for rel in sorted(paths):
        digest.update(rel.replace(os.sep, "/").encode() + b"\0")
        with open(os.path.join(ROOT, rel), "rb") as f:
            digest.update(f.read() + b"\0")
    return digest.hexdigest()


def load_predictions(path: str, names: list[str]) -> dict | None:
    """The rows ``names`` of a table saved with ``--json``, or None (with a note) when the file is missing,
    lacks a row, or was made from other sources than this checkout's (``sources_digest``)."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        print(f"roofline: no predictions read from {path} ({e}): compiling")
        return None
    if data.get("sources") != sources_digest():
        print(f"roofline: {path} was made from other sources than this checkout's: compiling")
        return None
    rows = data.get("rows", {})
    missing = [n for n in names if n not in rows]
    if missing:
        print(f"roofline: {path} has no row for {', '.join(missing)}: compiling")
        return None
    print(f"roofline: predictions from {path} (made from these sources; nothing compiled)")
    return {n: {k: v for k, v in rows[n].items() if not k.startswith("measure")} for n in names}


def compile_and_predict(cases, archs, nvcc, cuobjdump):
    """Compile every case's kernel (CUDA: each source once per arch, in parallel; Triton: ahead of time for
    sm_90) and predict its row: -> (rows, spill notes, errors)."""
    errors, rows, spill_notes = [], {}, []
    with tempfile.TemporaryDirectory() as workdir:
        sources = sorted({c.source for c in cases if c.backend == "cuda"})
        jobs = [(s, a) for s in sources for a in archs]
        with ThreadPoolExecutor(max_workers=max(1, min(len(jobs), os.cpu_count() or 1))) as pool:
            futures = {job: pool.submit(compile_cuda, nvcc, cuobjdump, job[0], job[1], workdir) for job in jobs}
        compiled = {}
        for job, fut in futures.items():
            try:
                compiled[job] = fut.result()
            except Exception as e:  # noqa: BLE001 - reported in the table, exit 1
                errors.append(f"{job[0]} sm_{job[1]}: {e}")
        for (source, arch), funcs in compiled.items():
            for fn, r in funcs.items():
                if r["spills"] or r["local"]:
                    spill_notes.append(f"{source} sm_{arch} {fn}: {r['spills']} B spills, {r['local']} B local")
        for case in cases:
            try:
                if case.backend == "cuda":
                    funcs = compiled.get((case.source, 90))
                    if funcs is None:
                        continue
                    match = [f for f in funcs if re.search(case.function, f)]
                    if not match:
                        raise RuntimeError(f"no entry matching {case.function!r} in {case.source}")
                    res = funcs[match[0]]
                else:
                    res = compile_triton(cuobjdump, case, workdir)
                    if res["spills"]:
                        spill_notes.append(f"{case.source} sm_90 ({case.name}): {res['spills']} B local")
                rows[case.name] = dict(predict(case, res), backend=case.backend, shape=case.shape)
                follow = case.then
                while follow is not None:
                    res2 = compile_triton(cuobjdump, follow, workdir)
                    if res2["spills"]:
                        spill_notes.append(f"{follow.source} sm_90 ({case.name}): {res2['spills']} B local")
                    rows[case.name] = combine_kernels(case, rows[case.name], predict(follow, res2))
                    follow = follow.then
            except Exception as e:  # noqa: BLE001 - reported, exit 1
                errors.append(f"{case.name}: {str(e)[-600:]}")
    return rows, spill_notes, errors


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", help="write the table as JSON here")
    ap.add_argument("--only", help="comma-separated case names (prefix match)")
    ap.add_argument("--measure", action="store_true", help="time every kernel on the GPU next to the prediction")
    ap.add_argument("--predicted", metavar="JSON",
                    help="take the predictions from this table (--json of an earlier run, e.g. the committed "
                         "bench/roofline.json) instead of compiling, if it was made from this checkout's sources "
                         "(else compile as usual): a GPU run then only measures")
    ap.add_argument("--arch", default="90,80",
                    help="CUDA archs to compile and check for spills (comma-separated; 90 is always compiled: "
                         "the model reads its SASS)")
    args = ap.parse_args(argv)

    # The Triton kernels are compiled ahead of time: the interpreter (a test environment's TRITON_INTERPRET=1)
    # would hand back InterpretedFunctions without compiled code. The variable is put back on return: a caller
    # in the same process (a test) goes on interpreting.
    interpret = os.environ.pop("TRITON_INTERPRET", None)
    try:
        return _run(args)
    finally:
        if interpret is not None:
            os.environ["TRITON_INTERPRET"] = interpret


def _run(args) -> int:
    cases = all_cases()
    if args.only:
        wanted = args.only.split(",")
        cases = [c for c in cases if any(c.name.startswith(w) for w in wanted)]

    rows = load_predictions(args.predicted, [c.name for c in cases]) if args.predicted else None
    if rows is not None:
        spill_notes, errors = [], []
    else:
        nvcc = find_nvcc()
        if nvcc is None:
            print("roofline: SKIP: nvcc not found (set CUDA_HOME); nothing compiled, nothing checked")
            return 0
        cuobjdump = find_tool("cuobjdump", nvcc)
        if cuobjdump is None:
            print("roofline: SKIP: cuobjdump not found (neither next to nvcc nor in triton's package)")
            return 0
        archs = [90] + [a for a in dict.fromkeys(int(x) for x in args.arch.split(",")) if a != 90]
        rows, spill_notes, errors = compile_and_predict(cases, archs, nvcc, cuobjdump)

    if args.measure:
        # CUDA rows first (built ahead), then Triton's (each compiles on first use); one line per kernel as it is
        # timed, so that a run cut off at a time limit still shows what it measured
        for case in sorted(cases, key=lambda c: c.backend != "cuda"):
            if case.name in rows and case.measure is not None:
                r = rows[case.name]
                try:
                    timing = case.measure()
                    t = timing["graph"] or timing["eager"]  # the GPU's time where the op can be captured
                    r.update(measured_us=t * 1e6, measured_pct_peak=100 * case.min_bytes / BANDWIDTH / t,
                             measured_how="graph" if timing["graph"] else "eager",
                             timing={k: v for k, v in timing.items()})
                    print(f"measured {case.name}: {t * 1e6:.1f} us, {r['measured_pct_peak']:.0f}% of peak "
                          f"(predicted {r['predicted_us']:.1f} us, {r['pct_peak']:.0f}%): {_timing_text(timing)}",
                          flush=True)
                except Exception as e:  # noqa: BLE001 - a kernel that cannot be timed is reported
                    r["measure_error"] = str(e)[-300:]
                    print(f"measured {case.name}: FAILED: {r['measure_error'][-200:]}", flush=True)

    hdr = "kernel                     regs spill   smem  thr cta/sm   grid waves       MB x min ins/el  pred us" \
          "    bound % peak"
    if args.measure:
        hdr += "  meas us % peak"
    print(hdr)
    for case in cases:
        if case.name not in rows:
            continue
        r = rows[case.name]
        line = format_row(case.name, r)
        if args.measure:
            line += (f" {r['measured_us']:>8.1f} {r['measured_pct_peak']:>6.0f}" if "measured_us" in r
                     else f"  ({r.get('measure_error', 'not measured')[:60]})")
        print(line)
    print("\nscenarios: " + "; ".join(sorted({f"{c.name.replace('_cuda', '').replace('_triton', '')}: {c.shape}"
                                             for c in cases if c.name in rows})))
    print(f"model: H200 {SMS} SMs, {BANDWIDTH / 1e12:.1f} TB/s, {CLOCK_HZ / 1e9:.2f} GHz x {ISSUE_PER_SM} "
          f"warp-instr/clk/SM, latency {LATENCY_S * 1e6:.1f} us, launch {LAUNCH_S * 1e6:.1f} us (see docstring)")
    for note in spill_notes:
        print("SPILL: " + note)
    for err in errors:
        print("ERROR: " + err)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(rows=rows, spills=spill_notes, errors=errors, sources=sources_digest(),
                           model=dict(sms=SMS, bandwidth=BANDWIDTH, clock_hz=CLOCK_HZ, issue_per_sm=ISSUE_PER_SM,
                                      latency_s=LATENCY_S, launch_s=LAUNCH_S)), f, indent=1)
    return 1 if spill_notes or errors else 0


if __name__ == "__main__":
    sys.exit(main())
