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
import struct
import sys
import tempfile
import time
import zlib

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

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

_FONT = {  # 3x5 glyphs, rows top to bottom, 3 bits each
    "0": "111101101101111", "1": "010110010010111", "2": "111001111100111", "3": "111001111001111",
    "4": "101101111001001", "5": "111100111001111", "6": "111100111101111", "7": "111001001001001",
    "8": "111101111101111", "9": "111101111001111", "W": "101101101111101", "B": "110101110101110",
    "V": "101101101101010", "K": "101110100110101", "M": "101111111101101", "S": "111100111001111",
    "=": "000111000111000", " ": "000000000000000", "/": "001001010100100", "X": "101101010101101",
    "G": "111100101101111", "A": "010101111101101", "L": "100100100100111", "H": "101101111101101",
    "R": "110101110101101", "D": "110101101101110", "T": "111010010010010", "E": "111100111100111",
    "N": "101111111111101", "O": "111101101101111", "P": "111101111100100", "Y": "101101010010010",
    "C": "111100100100111", "I": "111010010010111", ".": "000000000000010", "-": "000000111000000",
    "U": "101101101101111", "+": "000010111010000", "F": "111100111100100",
}


def _text(img, x, y, s, color, scale=2):
    for ch in s.upper():
        glyph = _FONT.get(ch, _FONT[" "])
        for i, bit in enumerate(glyph):
            if bit == "1":
                r, c = divmod(i, 3)
                for dy in range(scale):
                    for dx in range(scale):
                        px, py = x + c * scale + dx, y + r * scale + dy
                        if 0 <= py < len(img) and 0 <= px < len(img[0]):
                            img[py][px] = color
        x += 4 * scale


def _rect(img, x0, y0, x1, y1, color):
    for y in range(max(0, y0), min(len(img), y1)):
        row = img[y]
        for x in range(max(0, x0), min(len(row), x1)):
            row[x] = color


def write_png(rows, path):
    """Two panels (bytes sent per rank, log scale; wall time, log scale): grey = all-gather + op, blue = sharded."""
    import math

    width, panel_h, top = 60 + 70 * len(rows), 220, 60
    height = 2 * (panel_h + top) + 40
    img = [[(255, 255, 255)] * width for _ in range(height)]
    grey, blue, black = (150, 150, 150), (40, 90, 200), (0, 0, 0)
    panels = [("BYTES SENT PER RANK LOG10", "allgather_bytes_per_rank", "sharded_bytes_per_rank"),
              ("WALL MS LOG10", "allgather_ms", "sharded_ms")]
    for p, (title, a, b) in enumerate(panels):
        y_base = top + p * (panel_h + top) + panel_h
        _text(img, 10, y_base - panel_h - 20, title + "  GREY ALLGATHER+OP  BLUE SHARDED", black)
        values = [max(r[a], 1e-3) for r in rows] + [max(r[b], 1e-3) for r in rows]
        lo, hi = math.floor(math.log10(min(values))), math.ceil(math.log10(max(values)))
        hi = max(hi, lo + 1)
        for decade in range(lo, hi + 1):
            y = y_base - int((decade - lo) / (hi - lo) * (panel_h - 10))
            _rect(img, 40, y, width - 10, y + 1, (220, 220, 220))
            _text(img, 5, y - 5, str(decade), black)
        for i, r in enumerate(rows):
            x = 50 + 70 * i
            for j, (key, color) in enumerate(((a, grey), (b, blue))):
                h = int((math.log10(max(r[key], 1e-3)) - lo) / (hi - lo) * (panel_h - 10))
                _rect(img, x + 26 * j, y_base - h, x + 26 * j + 22, y_base, color)
            _text(img, x, y_base + 4, f"W{r['world']} B{r['B']}", black)
            _text(img, x, y_base + 16, f"V{r['V'] // 1000}K", black)
    raw = b"".join(b"\x00" + bytes(v for px in row for v in px) for row in img)

    def chunk(tag, data):
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)) + \
        chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")
    with open(path, "wb") as f:
        f.write(png)


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
