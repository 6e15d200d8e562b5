"""Tree verification (tree_rejection_sample) benchmark.

CPU (same process): the C++ op against the reference backend (vectorized plain
PyTorch), both modes (draft_probs / deterministic children).

GPU (--device cuda): CUDA kernel vs Triton kernel (vs reference on the small
cases) for N in {16, 64} nodes, V in {32000, 128256}, B in {1, 32}, with the
achieved GB/s of the rows the kernel streams (every vocab-wide pass it makes:
the sum of p_u at each node whose children are tried without draft_probs, one
pass over p_u and q_u per rejected child with draft_probs, the final race) —
re-reads are counted, so L2 hits can push this above DRAM bandwidth. NVTX ranges
name each case; torch.cuda.profiler.start/stop bracket the measured region:
    nsys profile --capture-range=cudaProfilerApi python bench/bench_tree_verify.py --device cuda

    python bench/bench_tree_verify.py            # CPU table
    python bench/bench_tree_verify.py --quick    # smoke run
"""

from __future__ import annotations

import torch

from common import (Table, gbps, nvtx_range, peak_bandwidth_gbps, profiled_region, run_device_table,
                    time_fn)

import specdec_ops  # noqa: E402  (common puts the checkout on sys.path)


def tree_parents(nodes: int, branching: int = 3) -> list[int]:
    """Breadth-first tree with `branching` children per node, truncated to `nodes` nodes."""
    parents, frontier = [-1], [0]
    while len(parents) < nodes:
        nxt = []
        for u in frontier:
            for _ in range(branching):
                if len(parents) < nodes:
                    parents.append(u)
                    nxt.append(len(parents) - 1)
        frontier = nxt
    return parents


def make_case(batch, nodes, vocab, device, one_hot, dtype=torch.float32, seed=0):
    """Target and draft distributions close to each other (acceptance like a decent drafter);
    children drawn i.i.d. from q of their parent (draft_probs) or the top-k of q (one-hot)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    parents1 = torch.tensor(tree_parents(nodes, 3 if nodes <= 16 else 4))
    logits = torch.randn(batch, nodes, vocab, generator=g)
    # a few likely tokens per row, as language models have: ~60% / 15% / 5% of the mass
    peaks = torch.randint(0, vocab, (batch, nodes, 3), generator=g)
    logits.scatter_add_(-1, peaks, torch.tensor([12.0, 10.6, 9.5]).expand(batch, nodes, 3).contiguous())
    target = torch.softmax(logits, -1)
    q = torch.softmax(logits + 0.7 * torch.randn(batch, nodes, vocab, generator=g), -1)
    tokens = torch.zeros(batch, nodes, dtype=torch.int64)
    for u in range(nodes):
        children = (parents1 == u).nonzero().flatten()
        if children.numel() == 0:
            continue
        if one_hot:
            tokens[:, children] = torch.topk(q[:, u], children.numel(), -1).indices
        else:
            tokens[:, children] = torch.multinomial(q[:, u], children.numel(), replacement=True, generator=g)
    parents = parents1.repeat(batch, 1)
    return dict(target_probs=target.to(dtype).to(device), tree_token_ids=tokens.to(device),
                parents=parents.to(device), draft_probs=None if one_hot else q.to(dtype).to(device),
                seeds=torch.arange(batch, dtype=torch.int64, device=device),
                offsets=torch.zeros(batch, dtype=torch.int64, device=device))


def call(case, backend):
    return specdec_ops.tree_rejection_sample(case["target_probs"], case["tree_token_ids"], case["parents"], None,
                                             case["draft_probs"], seeds=case["seeds"], offsets=case["offsets"],
                                             backend=backend)


def bytes_streamed(case, out):
    """Bytes of the vocab-wide passes the kernels make for this result (see the module docstring)."""
    probs, draft = case["target_probs"], case["draft_probs"]
    row = probs.shape[-1] * probs.element_size()
    parents = case["parents"][0].cpu().tolist()
    paths = out.accepted_path.cpu().tolist()
    ks = out.num_accepted.cpu().tolist()
    passes = 0
    for path, k in zip(paths, ks):
        on_path = path[: k + 1]
        for j, u in enumerate(on_path):
            children = [c for c in range(len(parents)) if c > 0 and parents[c] == u]
            nxt = on_path[j + 1] if j < k else None
            tried_rejected = [c for c in children if nxt is None or c < nxt]
            if draft is not None:
                passes += 2 * len(tried_rejected)
            elif children:
                passes += 1
        passes += 2 if draft is not None else 1   # final race (q too with draft_probs)
    return passes * row


def run_cpu(args):
    table = Table(["mode", "B", "N", "V", "ours_ms", "reference_ms", "x_vs_reference", "mean_accepted"])
    cases = [(1, 16, 32000), (8, 16, 32000)] if args.quick else \
        [(1, 16, 32000), (8, 16, 32000), (8, 64, 32000), (32, 16, 32000), (8, 16, 128256)]
    repeat = 3 if args.quick else 10
    for one_hot in (False, True):
        mode = "one_hot" if one_hot else "draft_probs"
        for batch, nodes, vocab in cases:
            case = make_case(batch, nodes, vocab, "cpu", one_hot)
            t_ours = time_fn(lambda: call(case, "cpu"), "cpu", repeat=repeat)
            t_ref = time_fn(lambda: call(case, "reference"), "cpu", warmup=1, repeat=2 if args.quick else 3)
            acc = float(call(case, "cpu").num_accepted.float().mean())
            table.add(mode=mode, B=batch, N=nodes, V=vocab, ours_ms=t_ours, reference_ms=t_ref,
                      x_vs_reference=t_ref / t_ours, mean_accepted=acc)
    return table


def run_gpu(args):
    peak = peak_bandwidth_gbps("cuda")
    table = Table(["mode", "dtype", "B", "N", "V", "backend", "ms", "GB/s", "pct_peak", "x_vs_triton",
                   "mean_accepted"])
    shapes = [(32, 64, 128256)] if args.quick else \
        [(b, n, v) for v in (32000, 128256) for n in (16, 64) for b in (1, 32)] + [(64, 16, 128256)]  # reference shape
    dtypes = (torch.float32,) if args.quick else (torch.float32, torch.bfloat16)
    with profiled_region("cuda"):
        for dtype in dtypes:
            for one_hot in (False, True):
                mode = "one_hot" if one_hot else "draft_probs"
                for batch, nodes, vocab in shapes:
                    case = make_case(batch, nodes, vocab, "cuda", one_hot, dtype)
                    times = {}
                    for backend in ("triton", "cuda", "reference"):
                        if backend == "reference" and (batch > 1 or args.quick):
                            continue
                        fn = lambda: call(case, backend)  # noqa: E731
                        with nvtx_range(f"tree_rejection_sample {mode} {dtype} B={batch} N={nodes} V={vocab} "
                                        f"{backend}", "cuda"):
                            times[backend] = time_fn(fn, "cuda", warmup=2 if backend == "reference" else 5,
                                                     repeat=3 if backend == "reference" else 50)
                        out = fn()
                        bw = gbps(bytes_streamed(case, out), times[backend])
                        table.add(mode=mode, dtype=str(dtype).replace("torch.", ""), B=batch, N=nodes, V=vocab,
                                  backend=backend, ms=times[backend], **{"GB/s": bw},
                                  pct_peak=(100 * bw / peak) if peak else "-",
                                  x_vs_triton=times["triton"] / times[backend],
                                  mean_accepted=float(out.num_accepted.float().mean()))
    return table


def main():
    run_device_table(__doc__, run_gpu, run_cpu)


if __name__ == "__main__":
    main()
