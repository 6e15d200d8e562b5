"""Vocab-parallel verification benchmark (DESIGN.md §5.8): all-gather + unsharded op vs the sharded op.

Spawns gloo worlds on 127.0.0.1 (CPU tensors). Each rank holds a [B, K+1, V/world]
shard of float32 target logits. Per case and world size it times, after a
barrier, (a) all-gathering the full logits and running the unsharded §5.7 op
(``specdec_ops.rejection_sample_logits``, C++ CPU backend) on them, and (b)
``specdec_ops.distributed.rejection_sample_logits`` on the shards, both with
temperature 0.8, top-k 50, top-p 0.9 and min-p 0.02 (``--no-filters``: temperature
only). Reported: the median wall time (the slowest rank), and the bytes each rank
sends under ring algorithms (all-gather of n bytes per rank: (world-1) * n; the
sharded op counts its own collectives through ``comm_stats``). Both return the
same tokens (checked).

    python bench/bench_vocab_parallel.py                # worlds 2 and 4, B 8/64, V 49152/128256, K 4
    python bench/bench_vocab_parallel.py --quick        # world 2, B 8, V 49152 (smoke run)
    python bench/bench_vocab_parallel.py --json out.json --png out.png

The machine's cores are shared by all ranks of a world (a 4-process world on
2 cores is oversubscribed): read the CPU times as what they are. NCCL on several
GPUs was not measured (no multi-GPU machine).
"""

from __future__ import annotations

import datetime
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from charts import Canvas
from common import Table, base_parser

K = 4
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _timed(fn, repeat: int) -> tuple[float, object]:
    """Median over `repeat` runs of the slowest rank's wall time (ms), after one warm-up run."""
    out = fn()
    times = []
    for _ in range(repeat):
        dist.barrier()
        t0 = time.perf_counter()
        out = fn()
        elapsed = torch.tensor([(time.perf_counter() - t0) * 1e3], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        times.append(float(elapsed))
    times.sort()
    return times[len(times) // 2], out


def _rank_main(rank, world, port, cases, repeat, filters, outdir):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, root)
    import specdec_ops
    from specdec_ops import distributed

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=600))
    rows = []
    for batch, vocab in cases:
        local = vocab // world
        g = torch.Generator().manual_seed(batch * 7 + vocab)
        full = torch.randn(batch, K + 1, vocab, generator=g) * 2  # every rank builds the same logits
        shard = full[..., rank * local:(rank + 1) * local].contiguous()
        drafts = full[:, :K].argmax(-1)
        drafts[1::2] = torch.randint(0, vocab, (batch // 2, K), generator=g)
        n = torch.full((batch,), K, dtype=torch.int64)
        params = dict(temperature=torch.full((batch,), 0.8), seeds=torch.arange(batch, dtype=torch.int64),
                      offsets=torch.zeros(batch, dtype=torch.int64))
        if filters:
            params.update(top_k=torch.full((batch,), 50), top_p=torch.full((batch,), 0.9),
                          min_p=torch.full((batch,), 0.02))
        del full

        def gathered():
            out = torch.empty(world * shard.numel(), dtype=shard.dtype)
            _all_gather_single(out, shard.reshape(-1))
            logits = out.view(world, batch, K + 1, local).permute(1, 2, 0, 3).reshape(batch, K + 1, vocab)
            return specdec_ops.rejection_sample_logits(logits, drafts, n, backend="cpu", **params)

        stats = {}

        def sharded():
            stats.clear()
            return distributed.rejection_sample_logits(shard, drafts, n, vocab_start=rank * local, vocab_size=vocab,
                                                       comm_stats=stats, **params)

        base_ms, base_out = _timed(gathered, repeat)
        ours_ms, ours_out = _timed(sharded, repeat)
        same = bool(torch.equal(base_out.token_ids, ours_out.token_ids))
        rows.append(dict(world=world, B=batch, K=K, V=vocab, filters=filters,
                         allgather_ms=base_ms, allgather_bytes_per_rank=(world - 1) * shard.numel() * 4,
                         sharded_ms=ours_ms, sharded_bytes_per_rank=stats["bytes_sent"],
                         sharded_collectives=stats["collectives"], same_tokens=same))
    if rank == 0:
        torch.save(rows, os.path.join(outdir, "rows.pt"))
    dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------- PNG (no matplotlib)


def write_png(rows, path):
    """Two panels (bytes sent per rank, log scale; wall time, log scale): grey = all-gather + op, blue = sharded."""
    import math

    width, panel_h, top = 60 + 70 * len(rows), 220, 60
    height = 2 * (panel_h + top) + 40
    canvas = Canvas(width, height)
    grey, blue, black = (150, 150, 150), (40, 90, 200), (0, 0, 0)
    panels = [("BYTES SENT PER RANK LOG10", "allgather_bytes_per_rank", "sharded_bytes_per_rank"),
              ("WALL MS LOG10", "allgather_ms", "sharded_ms")]
    for p, (title, a, b) in enumerate(panels):
        y_base = top + p * (panel_h + top) + panel_h
        canvas.text(10, y_base - panel_h - 20, title + "  GREY ALLGATHER+OP  BLUE SHARDED", black)
        values = [max(r[a], 1e-3) for r in rows] + [max(r[b], 1e-3) for r in rows]
        lo, hi = math.floor(math.log10(min(values))), math.ceil(math.log10(max(values)))
        hi = max(hi, lo + 1)
        for decade in range(lo, hi + 1):
            y = y_base - int((decade - lo) / (hi - lo) * (panel_h - 10))
            canvas.rect(40, y, width - 10, y + 1, (220, 220, 220))
            canvas.text(5, y - 5, str(decade), black)
        for i, r in enumerate(rows):
            x = 50 + 70 * i
            for j, (key, color) in enumerate(((a, grey), (b, blue))):
                h = int((math.log10(max(r[key], 1e-3)) - lo) / (hi - lo) * (panel_h - 10))
                canvas.rect(x + 26 * j, y_base - h, x + 26 * j + 22, y_base, color)
            canvas.text(x, y_base + 4, f"W{r['world']} B{r['B']}", black)
            canvas.text(x, y_base + 16, f"V{r['V'] // 1000}K", black)
    canvas.save(path)


def main():
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--worlds", default="2,4", help="world sizes (comma separated)")
    parser.add_argument("--batches", default="8,64")
    parser.add_argument("--vocabs", default="49152,128256")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-filters", action="store_true", help="temperature only (no top-k/top-p/min-p)")
    parser.add_argument("--png", default=None, help="also draw the table as a PNG at this path")
    args = parser.parse_args()
    if args.device != "cpu":
        parser.error("this benchmark runs gloo on CPU tensors (NCCL on several GPUs is not covered)")
    worlds = [2] if args.quick else [int(w) for w in args.worlds.split(",")]
    cases = [(8, 49152)] if args.quick else [(int(b), int(v)) for b in args.batches.split(",")
                                             for v in args.vocabs.split(",")]
    repeat = 1 if args.quick else args.repeat
    table = Table(["world", "B", "V", "allgather_ms", "sharded_ms", "allgather_bytes_per_rank",
                   "sharded_bytes_per_rank", "sharded_collectives", "same_tokens"])
    for world in worlds:
        with tempfile.TemporaryDirectory() as outdir:
            mp.spawn(_rank_main, args=(world, _free_port(), cases, repeat, not args.no_filters, outdir),
                     nprocs=world, join=True)
            for row in torch.load(os.path.join(outdir, "rows.pt")):
                table.add(**row)
    table.write_json(args.json)
    if args.png:
        write_png(table.rows, args.png)


if __name__ == "__main__":
    main()
