"""Chain rejection sampling benchmark.

CPU (same process): the op from logits (softmax + rejection_sample) against
transformers' own speculative sampling (`_speculative_sampling`, called once per
request as assisted generation does) and against the reference backend.

GPU (--device cuda): CUDA kernel vs Triton kernel vs the reference backend on
probabilities, with achieved GB/s of the bytes the kernel must read (the raced
row(s) per request plus the acceptance gathers) against the device's peak.
NVTX ranges name each case; torch.cuda.profiler.start/stop bracket the measured
region:  nsys profile --capture-range=cudaProfilerApi python bench/bench_rejection.py --device cuda

    python bench/bench_rejection.py            # CPU table
    python bench/bench_rejection.py --quick    # smoke run
"""

from __future__ import annotations

import torch

from common import (Table, gbps, nvtx_range, peak_bandwidth_gbps, profiled_region, run_device_table,
                    time_fn)

import specdec_ops  # noqa: E402  (common puts the checkout on sys.path)

K = 4


def make_logits(batch, vocab, device, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    target = torch.randn(batch, K + 1, vocab, generator=g).to(device)
    draft = (target[:, :K] + 0.5 * torch.randn(batch, K, vocab, generator=g).to(device))
    draft_probs = torch.softmax(draft, -1)
    ids = torch.multinomial(draft_probs.reshape(-1, vocab), 1).reshape(batch, K)
    seeds = torch.arange(batch, dtype=torch.int64, device=device)
    offsets = torch.zeros(batch, dtype=torch.int64, device=device)
    return target, draft, ids, seeds, offsets


def ours(target, draft, ids, seeds, offsets, one_hot, backend):
    n = torch.full((target.shape[0],), K, dtype=torch.int64, device=target.device)
    q = None if one_hot else torch.softmax(draft, -1)
    return specdec_ops.rejection_sample(torch.softmax(target, -1), ids, n, q, seeds=seeds, offsets=offsets,
                                        backend=backend)


def transformers_loop(target, draft, ids, one_hot):
    from transformers.generation.utils import _speculative_sampling

    if one_hot:  # one-hot drafts as logits: 0 at the draft, -inf elsewhere
        draft = torch.full_like(draft, float("-inf")).scatter_(-1, ids[..., None], 0.0)
    out = []
    for b in range(target.shape[0]):
        out.append(_speculative_sampling(ids[b: b + 1], draft[b: b + 1], K, target[b: b + 1]))
    return out


def run_cpu(args):
    table = Table(["mode", "B", "V", "ours_ms", "transformers_ms", "reference_ms", "x_vs_transformers",
                   "x_vs_reference"])
    batches = [1, 8] if args.quick else [1, 8, 32]
    vocabs = [32000, 49152] if args.quick else [32000, 49152, 128256]
    repeat = 3 if args.quick else 10
    for one_hot in (True, False):
        mode = "one_hot" if one_hot else "draft_probs"
        for vocab in vocabs:
            for batch in batches:
                target, draft, ids, seeds, offsets = make_logits(batch, vocab, "cpu")
                t_ours = time_fn(lambda: ours(target, draft, ids, seeds, offsets, one_hot, "cpu"), "cpu",
                                 repeat=repeat)
                t_hf = time_fn(lambda: transformers_loop(target, draft, ids, one_hot), "cpu", repeat=repeat)
                t_ref = None
                if batch <= 8 and not (args.quick and vocab > 32000):
                    t_ref = time_fn(lambda: ours(target, draft, ids, seeds, offsets, one_hot, "reference"), "cpu",
                                    warmup=1, repeat=2)
                table.add(mode=mode, B=batch, V=vocab, ours_ms=t_ours, transformers_ms=t_hf,
                          reference_ms=t_ref if t_ref is not None else "-", x_vs_transformers=t_hf / t_ours,
                          x_vs_reference=(t_ref / t_ours) if t_ref is not None else "-")
    return table


def bytes_read(probs, draft_probs, out, greedy=False):
    """Bytes the kernel must read: per request one raced row of p, plus q's row when the race is a
    residual with draft probabilities, plus the acceptance gathers (p(x), q(x) per tried draft);
    greedy: the rows up to and including the first mismatch (every row when all are accepted)."""
    elem = probs.element_size()
    vocab = probs.shape[-1]
    if greedy:
        return int((out.num_accepted + 1).sum()) * vocab * elem
    residual = out.num_accepted < K
    rows = probs.shape[0] + (int(residual.sum()) if draft_probs is not None else 0)
    gathers = int((out.num_accepted + residual.int()).sum()) * (2 if draft_probs is not None else 1)
    return rows * vocab * elem + gathers * elem


def check_split_invariance():
    """The CUDA kernel splits each request's vocabulary into a number of blocks that depends on the
    batch size and the SM count: the same request must give the same tokens alone (most blocks) and
    inside a large batch (one block), in every mode. Prints the result; raises on a mismatch."""
    vocab, big = 128256, 1024
    target, draft, ids, seeds, offsets = make_logits(big, vocab, "cuda", seed=7)
    probs, q = torch.softmax(target, -1), torch.softmax(draft, -1)
    n = torch.randint(0, K + 1, (big,), device="cuda")
    greedy = torch.arange(big, device="cuda") % 3 == 0
    for draft_probs in (q, None):
        full = specdec_ops.rejection_sample(probs, ids, n, draft_probs, seeds=seeds, offsets=offsets,
                                            greedy=greedy, backend="cuda")
        for b in (0, 1, 2, 500):
            one = specdec_ops.rejection_sample(probs[b:b + 1], ids[b:b + 1], n[b:b + 1],
                                               None if draft_probs is None else draft_probs[b:b + 1],
                                               seeds=seeds[b:b + 1], offsets=offsets[b:b + 1],
                                               greedy=greedy[b:b + 1], backend="cuda")
            if not torch.equal(one.token_ids[0], full.token_ids[b]):
                raise AssertionError(f"vocab split changes request {b}: {one.token_ids[0].tolist()} alone, "
                                     f"{full.token_ids[b].tolist()} in a batch of {big}")
    print("split invariance: request alone == request in a batch of 1024 (draft probs, one-hot, greedy)")


def run_gpu(args):
    peak = peak_bandwidth_gbps("cuda")
    table = Table(["mode", "dtype", "B", "V", "backend", "ms", "GB/s", "pct_peak", "x_vs_reference"])
    cases = [(64, 128256)] if args.quick else [(1, 32000), (8, 49152), (8, 128256), (32, 128256), (64, 128256),
                                                (256, 151936)]
    backends = ["cuda", "triton", "reference"]
    check_split_invariance()
    with profiled_region("cuda"):
        for dtype in (torch.float32, torch.bfloat16):
            for mode in ("draft_probs", "one_hot", "greedy"):
                one_hot, greedy = mode != "draft_probs", mode == "greedy"
                for batch, vocab in cases:
                    target, draft, ids, seeds, offsets = make_logits(batch, vocab, "cuda")
                    probs = torch.softmax(target, -1).to(dtype)
                    q = None if one_hot else torch.softmax(draft, -1).to(dtype)
                    n = torch.full((batch,), K, dtype=torch.int64, device="cuda")
                    flags = torch.full((batch,), greedy, dtype=torch.bool, device="cuda")
                    if greedy:  # every draft is the target's argmax: all K + 1 rows are read
                        ids = probs[:, :K].float().argmax(-1)
                    times = {}
                    for backend in backends:
                        if backend == "reference" and batch > 64:
                            continue
                        fn = lambda: specdec_ops.rejection_sample(probs, ids, n, q, seeds=seeds, offsets=offsets,  # noqa: E731
                                                                  greedy=flags, backend=backend)
                        with nvtx_range(f"rejection_sample {mode} {dtype} B={batch} V={vocab} {backend}", "cuda"):
                            times[backend] = time_fn(fn, "cuda", warmup=2 if backend == "reference" else 5,
                                                     repeat=3 if backend == "reference" else 50)
                        out = fn()
                        moved = bytes_read(probs, q, out, greedy)
                        bw = gbps(moved, times[backend])
                        table.add(mode=mode, dtype=str(dtype).replace("torch.", ""), B=batch, V=vocab,
                                  backend=backend, ms=times[backend], **{"GB/s": bw},
                                  pct_peak=(100 * bw / peak) if peak else "-",
                                  x_vs_reference=(times["reference"] / times[backend]) if "reference" in times else "-")
    return table


def main():
    run_device_table(__doc__, run_gpu, run_cpu, cpu_note=f", K = {K}")


if __name__ == "__main__":
    main()
