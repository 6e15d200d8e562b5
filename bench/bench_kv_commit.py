"""Benchmark kv_commit: one op over every layer's K and V vs a per-layer PyTorch
gather-and-copy loop.

Setup (issue #5): 32 layers x K and V (64 caches), head dim 128, 8 KV heads, bf16,
B in {1, 32, 64}; three kinds of accepted paths (window of 64 slots after a
committed prefix): "tree", 1-8 entries, a root-to-node path of a random 64-node
tree; "moves3", 0 2 3 4 (three moved slots per request: the issue 11 reference
shape at B = 64); "chain", 0 1 2 3 4 (a fully accepted chain: nothing moves, so
it times the early exit; its GB/s is 0 by definition). Reports
the median time per commit, the speedup over the loop, and the achieved
bandwidth on the bytes actually moved (each moved slot is read once and written
once: 2 * moves * H * D * 2 bytes per cache), with the share of peak on a known GPU.

Each timed call first restores seq_lens (a [B] copy): its time, measured alone,
is subtracted from both columns. On CUDA the op is also timed replayed from a
CUDA graph (graph_ms: no launch or Python overhead); pct_peak uses the better of
the two.

    python bench/bench_kv_commit.py --quick                 # CPU smoke run
    python bench/bench_kv_commit.py --device cuda --json kv.json
    nsys profile --capture-range=cudaProfilerApi python bench/bench_kv_commit.py --device cuda
"""

from __future__ import annotations

import random

import torch
from common import Table, base_parser, gbps, nvtx_range, peak_bandwidth_gbps, profiled_region, time_fn

import specdec_ops

WINDOW = 64  # tree nodes, root included


def tree_paths(batch: int, rng: random.Random) -> torch.Tensor:
    """int32 [B, 8]: the root-to-node path of a random node of a random 64-node tree, -1 padded."""
    rows = []
    for _ in range(batch):
        parents = [-1] + [rng.randrange(0, i) for i in range(1, WINDOW)]
        while True:
            node = rng.randrange(WINDOW)
            path = []
            while node >= 0:
                path.append(node)
                node = parents[node]
            if len(path) <= 8:
                break
        path.reverse()
        rows.append(path + [-1] * (8 - len(path)))
    return torch.tensor(rows, dtype=torch.int32)


def torch_loop(caches, seq_lens, path, block_table=None):
    """The baseline an engine writes without the op: per layer, gather the path's
    slots into a temporary and scatter them to the consecutive slots (padding
    entries copy a slot onto itself)."""
    valid = path >= 0
    steps = torch.arange(path.shape[1], device=path.device)
    src = seq_lens[:, None].long() + torch.where(valid, path.long(), steps)
    dst = seq_lens[:, None].long() + steps
    if block_table is None:
        rows = torch.arange(path.shape[0], device=path.device)[:, None]
        for cache in caches:
            cache[rows, dst] = cache[rows, src]
    else:
        block_size = caches[0].shape[1]
        src_block, src_off = block_table.gather(1, src // block_size).long(), src % block_size
        dst_block, dst_off = block_table.gather(1, dst // block_size).long(), dst % block_size
        for cache in caches:
            cache[dst_block, dst_off] = cache[src_block, src_off]
    seq_lens += valid.sum(1, dtype=torch.int32)


def fixed_paths(batch: int, kind: str) -> torch.Tensor:
    """int32 [B, 8]: every request's path 0 2 3 4 ("moves3": three moves) or 0 1 2 3 4 ("chain": none)."""
    row = [0, 2, 3, 4] if kind == "moves3" else [0, 1, 2, 3, 4]
    return torch.tensor([row + [-1] * (8 - len(row))] * batch, dtype=torch.int32)


def moved_bytes(path: torch.Tensor, caches) -> int:
    steps = torch.arange(path.shape[1])
    moves = int(((path.cpu() >= 0) & (path.cpu() != steps)).sum())
    per_slot = sum(c.shape[2] * c.shape[3] * c.element_size() for c in caches)
    return 2 * moves * per_slot


def make_caches(layout, batch, prefix, layers, heads, dim, dtype, device):
    slots = prefix + WINDOW
    if layout == "paged":
        block_size = 16
        max_blocks = (slots + block_size - 1) // block_size
        num_blocks = batch * max_blocks
        table = torch.randperm(num_blocks, device=device).view(batch, max_blocks).to(torch.int32)
        shape = (num_blocks, block_size, heads, dim)
    else:
        table, shape = None, (batch, slots, heads, dim)
    caches = [torch.randn(shape, device=device).to(dtype) for _ in range(2 * layers)]
    return caches, table


def graph_time(run, reset, device, repeat):
    """Time of run() replayed from a CUDA graph, minus the graph of reset() alone
    (no launch or Python overhead: the kernel's own bandwidth)."""
    try:
        graph, reset_graph = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            run()
        with torch.cuda.graph(reset_graph):
            reset()
        return time_fn(graph.replay, device, repeat=repeat) - time_fn(reset_graph.replay, device, repeat=repeat)
    except Exception as exc:  # report, keep benchmarking
        print(f"  (CUDA graph timing failed: {type(exc).__name__}: {exc})")
        return None


def main():
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=None, help="layers (default 32; 8 with --quick on CPU)")
    parser.add_argument("--heads", type=int, default=8, help="KV heads per layer")
    parser.add_argument("--prefix", type=int, default=None, help="committed length (default: 16 CPU, 1024 CUDA)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = args.device
    layers = args.layers or (8 if args.quick and device == "cpu" else 32)
    prefix = args.prefix if args.prefix is not None else (16 if device == "cpu" else 1024)
    batches = [1, 32, 64] if not (args.quick and device == "cpu") else [1, 8]
    layouts = ["contiguous", "paged"]
    backends = ["cuda", "triton"] if device == "cuda" else ["cpu"]
    repeat = 5 if args.quick else 20
    peak = peak_bandwidth_gbps(device)
    rng = random.Random(0)

    print(f"kv_commit: {layers} layers x K,V, H={args.heads}, D=128, bf16, prefix {prefix}, tree of {WINDOW} "
          f"nodes, tree paths of 1-8 entries / 3 moves / a fully accepted chain, device {device}")
    table_out = Table(["B", "layout", "paths", "backend", "moved_MB", "op_ms", "graph_ms", "loop_ms", "speedup", "op_GBps",
                       "graph_GBps", "pct_peak"])
    for batch in batches:
        for layout, kind in [(layout, kind) for layout in layouts for kind in ("tree", "moves3", "chain")]:
            caches, block_table = make_caches(layout, batch, prefix, layers, args.heads, 128, torch.bfloat16,
                                              device)
            path = (tree_paths(batch, rng) if kind == "tree" else fixed_paths(batch, kind)).to(device)
            base_lens = torch.full((batch,), prefix, dtype=torch.int32, device=device)
            seq_lens = base_lens.clone()
            nbytes = moved_bytes(path, caches)

            # sanity: the op and the loop agree
            check = [c[:, :].clone() for c in caches]
            lens_a, lens_b = base_lens.clone(), base_lens.clone()
            specdec_ops.kv_commit(check, lens_a, path, block_table=block_table)
            torch_loop(caches, lens_b, path, block_table)
            assert torch.equal(lens_a, lens_b)
            assert all(torch.equal(a, b) for a, b in zip(check, caches)), "op and loop disagree"
            del check

            def reset():
                seq_lens.copy_(base_lens)

            t_reset = time_fn(reset, device, repeat=repeat)

            def run_loop():
                reset()
                torch_loop(caches, seq_lens, path, block_table)

            with profiled_region(device):
                with nvtx_range(f"loop B={batch} {layout} {kind}", device):
                    t_loop = time_fn(run_loop, device, repeat=repeat) - t_reset
                for backend in backends:
                    def run_op():
                        reset()
                        specdec_ops.kv_commit(caches, seq_lens, path, block_table=block_table, backend=backend)

                    with nvtx_range(f"kv_commit B={batch} {layout} {kind} {backend}", device):
                        t_op = time_fn(run_op, device, repeat=repeat) - t_reset
                    t_graph = graph_time(run_op, reset, device, repeat) if device == "cuda" else None
                    rate = gbps(nbytes, t_op)
                    graph_rate = None if t_graph is None else gbps(nbytes, t_graph)
                    best = rate if graph_rate is None else max(rate, graph_rate)
                    table_out.add(B=batch, layout=layout, paths=kind, backend=backend, moved_MB=nbytes / 1e6, op_ms=t_op,
                                  graph_ms=t_graph, loop_ms=t_loop, speedup=t_loop / t_op, op_GBps=rate,
                                  graph_GBps=graph_rate, pct_peak=None if peak is None else 100.0 * best / peak)
            caches.clear()  # free this shape's caches before the next allocates (the closures above hold the list)
    table_out.write_json(args.json)


if __name__ == "__main__":
    main()
