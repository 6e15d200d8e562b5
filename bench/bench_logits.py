"""Verification from logits benchmark (DESIGN.md §5.7).

CPU (same process, the three variants timed round-robin, medians of 30): the fused op
`rejection_sample_logits` (with return_logprobs=True) against
  (a) plain-PyTorch processing as engines write it (temperature, softmax, top-k/top-p
      with torch.sort) followed by `rejection_sample`, and
  (b) the project's own `process_logits` followed by `rejection_sample`,
on B=8 K=4 V=49152 bfloat16 logits with mixed per-request parameters: a third greedy,
a third top-p 0.9, a third top-k 50 with temperature 0.7. Drafts are one-hot (an
n-gram / greedy drafter) or carry draft probabilities.

GPU (--device cuda): B=64 K=4 V=128256 bfloat16, the fused op on every GPU backend this
build has, with achieved GB/s of the logits it must read (every row up to the first
rejection, and the bonus row) against the device's peak (4.8 TB/s on an H200).

    python bench/bench_logits.py                  # CPU table
    python bench/bench_logits.py --json out.json  # also out.json and a bar chart out.png
"""

from __future__ import annotations

import statistics
import time

import torch

from charts import bar_chart
from common import (Table, gbps, nvtx_range, peak_bandwidth_gbps, profiled_region, run_device_table,
                    time_fn)

import specdec_ops  # noqa: E402  (common puts the checkout on sys.path)

K = 4


def make_case(batch, vocab, device, dtype=torch.bfloat16, seed=0):
    """Logits, drafts (close to the target: realistic acceptance) and mixed per-request parameters."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    target = torch.randn(batch, K + 1, vocab, generator=g) * 3
    draft = target[:, :K] + 1.0 * torch.randn(batch, K, vocab, generator=g)
    draft_probs = torch.softmax(draft, -1)
    ids = torch.multinomial(draft_probs.reshape(-1, vocab), 1, generator=g).reshape(batch, K)
    third = torch.arange(batch) % 3
    temperature = torch.where(third == 0, 0.0, torch.where(third == 1, 1.0, 0.7))
    top_p = torch.where(third == 1, 0.9, 1.0)
    top_k = torch.where(third == 2, 50, 0)
    return dict(target_logits=target.to(dtype).to(device), draft_token_ids=ids.to(device),
                num_draft_tokens=torch.full((batch,), K, device=device), draft_probs=draft_probs.to(device),
                temperature=temperature.to(device), top_k=top_k.to(device), top_p=top_p.to(device),
                seeds=torch.arange(batch, dtype=torch.int64, device=device),
                offsets=torch.zeros(batch, dtype=torch.int64, device=device))


def torch_process(logits, temperature, top_k, top_p):
    """Engine-style processing in plain PyTorch: temperature, top-k and top-p by one descending
    sort, softmax; greedy rows one-hot at the argmax (what an engine hands rejection_sample)."""
    logits = logits.float()
    vocab = logits.shape[-1]
    greedy = temperature == 0
    scaled = logits / torch.where(greedy, 1.0, temperature)[:, None, None]
    sorted_logits, order = scaled.sort(dim=-1, descending=True)
    k = torch.where(top_k > 0, top_k, vocab).clamp(max=vocab)
    kth = sorted_logits.gather(-1, (k - 1)[:, None, None].expand(-1, logits.shape[1], 1))
    sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, float("-inf"))
    cum = sorted_logits.softmax(-1).cumsum(-1)
    drop = (cum - sorted_logits.softmax(-1)) >= top_p[:, None, None]  # mass before the entry already reaches p
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    probs = torch.empty_like(sorted_logits).scatter_(-1, order, sorted_logits.softmax(-1))
    one_hot = torch.nn.functional.one_hot(logits.argmax(-1), vocab).float()
    return torch.where(greedy[:, None, None], one_hot, probs)


def fused(c, q, backend):
    return specdec_ops.rejection_sample_logits(
        c["target_logits"], c["draft_token_ids"], c["num_draft_tokens"], q, temperature=c["temperature"],
        top_k=c["top_k"], top_p=c["top_p"], seeds=c["seeds"], offsets=c["offsets"], return_logprobs=True,
        backend=backend)


def unfused(c, q, probs, backend):
    return specdec_ops.rejection_sample(probs, c["draft_token_ids"], c["num_draft_tokens"], q, seeds=c["seeds"],
                                        offsets=c["offsets"], greedy=c["temperature"] == 0, backend=backend)


def interleaved_medians(fns, repeat, warmup=2):
    """Median ms of each callable, timed round-robin (one call of each per round) so that load
    from other processes on a shared machine falls on every variant alike."""
    for fn in fns:
        for _ in range(warmup):
            fn()
    times = [[] for _ in fns]
    for _ in range(repeat):
        for fn, ts in zip(fns, times):
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e3)
    return [statistics.median(ts) for ts in times]


def run_cpu(args):
    table = Table(["mode", "B", "K", "V", "dtype", "fused_ms", "torch_sort_ms", "process_logits_ms",
                   "x_vs_torch_sort", "x_vs_process_logits"])
    repeat = 5 if args.quick else 30
    batch, vocab = 8, 49152
    c = make_case(batch, vocab, "cpu")
    for mode in ("one_hot", "draft_probs"):
        q = c["draft_probs"] if mode == "draft_probs" else None
        t_fused, t_torch, t_own = interleaved_medians([
            lambda: fused(c, q, "cpu"),
            lambda: unfused(c, q, torch_process(c["target_logits"], c["temperature"], c["top_k"], c["top_p"]), "cpu"),
            lambda: unfused(c, q, specdec_ops.process_logits(c["target_logits"], c["temperature"], c["top_k"],
                                                             c["top_p"], backend="cpu"), "cpu"),
        ], repeat)
        table.add(mode=mode, B=batch, K=K, V=vocab, dtype="bfloat16", fused_ms=t_fused, torch_sort_ms=t_torch,
                  process_logits_ms=t_own, x_vs_torch_sort=t_torch / t_fused, x_vs_process_logits=t_own / t_fused)
    return table


def logits_bytes(c, out):
    """Bytes of logits the fused op must read: the rows up to and including the emitting row."""
    rows = int((out.num_accepted + 1).sum())
    return rows * c["target_logits"].shape[-1] * c["target_logits"].element_size()


def run_gpu(args):
    peak = peak_bandwidth_gbps("cuda")
    table = Table(["mode", "B", "K", "V", "backend", "ms", "GB/s", "pct_peak", "x_vs_torch_sort"])
    batch, vocab = 64, 128256
    c = make_case(batch, vocab, "cuda")
    backends = [b for b in ("cuda", "triton") if _available(b, c)]
    with profiled_region("cuda"):
        for mode in ("one_hot", "draft_probs"):
            q = c["draft_probs"] if mode == "draft_probs" else None
            t_torch = time_fn(lambda: unfused(c, q, torch_process(c["target_logits"], c["temperature"], c["top_k"],
                                                                   c["top_p"]), "cuda"), "cuda", repeat=20)
            for backend in backends:
                with nvtx_range(f"rejection_sample_logits {mode} {backend}", "cuda"):
                    ms = time_fn(lambda: fused(c, q, backend), "cuda", warmup=5, repeat=50)
                bw = gbps(logits_bytes(c, fused(c, q, backend)), ms)
                table.add(mode=mode, B=batch, K=K, V=vocab, backend=backend, ms=ms, **{"GB/s": bw},
                          pct_peak=(100 * bw / peak) if peak else "-", x_vs_torch_sort=t_torch / ms)
    return table


def _available(backend, c):
    try:
        fused(c, None, backend)
        return True
    except specdec_ops.BackendUnavailableError:
        return False


def main():
    args, table = run_device_table(__doc__, run_gpu, run_cpu)
    if not args.json:
        return
    png = args.json.rsplit(".", 1)[0] + ".png"
    if args.device == "cuda":
        modes = list(dict.fromkeys(r["mode"] for r in table.rows))
        backends = list(dict.fromkeys(r["backend"] for r in table.rows))
        gb = {(r["mode"], r["backend"]): r["GB/s"] for r in table.rows}
        bar_chart(png, "GB/S PER MODE", modes, {b: [gb.get((m, b), float("nan")) for m in modes] for b in backends})
    else:
        names = ("fused_ms", "torch_sort_ms", "process_logits_ms")
        bar_chart(png, "MS PER MODE (LOWER IS BETTER)", [r["mode"] for r in table.rows],
                  {n: [r[n] for r in table.rows] for n in names})


if __name__ == "__main__":
    main()
