"""Tree attention benchmark.

CPU (``--device cpu``): the CPU path of ``tree_attention`` (composite: prefix in key chunks,
tree keys with the bitmask, exact merge) vs SDPA with a materialized ``tree_attention_bias``.

GPU (``--device cuda``): the Triton ``tree_attention`` kernel vs
  - SDPA with the dense bias (what an HF model does with a 4-D mask),
  - dense decode over the same KV length: SDPA, the N queries over all prefix + N keys without
    a mask (flash backend; the cost floor of causal decode for N << KV length),
  - flash-attn's causal ``flash_attn_with_kvcache`` when flash_attn is installed.
Goal on an H200: Triton tree attention within 1.15x of the dense decode baseline.
Achieved bandwidth counts the K/V bytes read once.

On CUDA a second table (``--tiles``, on by default there) times the kernel at the reference shape (B = 64,
N = 16, GQA 4, D = 128, prefix 8k) with the launcher's tile configuration (``_tile_config``) and the
alternatives the static model (bench/roofline.py) ranks: (BLOCK_M, BLOCK_N, BLOCK_D, num_warps, maxnreg),
each checked against the launcher's output. It is how a lent GPU decides between them.

    python bench/bench_tree_attention.py --device cuda [--quick] [--json out.json]
    nsys profile --capture-range=cudaProfilerApi python bench/bench_tree_attention.py --device cuda
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F
from common import Table, base_parser, gbps, nvtx_range, peak_bandwidth_gbps, profiled_region, time_fn

import specdec_ops
from specdec_ops import attention

# (BLOCK_M, BLOCK_N, BLOCK_D, num_warps, maxnreg) tried beside the launcher's own at the reference shape: the
# 8-warp tile it took before, the 64-key tiles, a 32-row tile
TILE_CANDIDATES = [(64, 32, 128, 8, None), (64, 64, 128, 4, None), (64, 64, 128, 8, None), (32, 64, 128, 4, None)]


def random_tree(batch: int, n: int, device: str):
    gen = torch.Generator().manual_seed(n)
    parents = torch.full((batch, n), -1, dtype=torch.int64)
    for i in range(1, n):  # a bushy tree: each node hangs off one of the 4 previous ones (or the root)
        parents[:, i] = torch.randint(max(0, i - 4), i, (batch,), generator=gen)
    return specdec_ops.build_tree(parents.to(device))


def make_inputs(batch, n, prefix, hq, hk, d, dtype, device, capacity=0):
    """capacity: cache slots per request (at least prefix + n): a long-context cache holding a short prefix."""
    gen = torch.Generator(device=device).manual_seed(0)
    kv_len = max(prefix + n, capacity)
    q = torch.randn(batch, n, hq, d, dtype=dtype, device=device, generator=gen)
    k = torch.randn(batch, kv_len, hk, d, dtype=dtype, device=device, generator=gen)
    v = torch.randn(batch, kv_len, hk, d, dtype=dtype, device=device, generator=gen)
    prefix_lens = torch.full((batch,), prefix, dtype=torch.int32, device=device)
    return q, k, v, prefix_lens, random_tree(batch, n, device)


def sdpa_with_bias(q, k, v, prefix_lens, mask):
    """HF-style: materialize the bias, expand KV heads, SDPA."""
    group = q.shape[2] // k.shape[2]
    bias = specdec_ops.tree_attention_bias(mask, prefix_lens, k.shape[1], dtype=q.dtype)
    kk = k.transpose(1, 2).repeat_interleave(group, dim=1)
    vv = v.transpose(1, 2).repeat_interleave(group, dim=1)
    return F.scaled_dot_product_attention(q.transpose(1, 2), kk, vv, attn_mask=bias).transpose(1, 2)


def dense_decode(q, k, v):
    """N queries over all keys, no mask, GQA in SDPA: the decode attention floor for the same KV length."""
    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                          enable_gqa=True).transpose(1, 2)


def main() -> None:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--dtype", default=None, choices=["float16", "bfloat16", "float32"])
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--capacity", type=int, default=0,
                        help="cache slots per request (default prefix + N); e.g. --capacity 32768 with a 2k "
                             "prefix checks that the split-KV work follows the prefix, not the cache")
    parser.add_argument("--tiles", choices=["auto", "on", "off"], default="auto",
                        help="time the kernel's tile configurations at the reference shape (auto: on CUDA)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = args.device
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if device == "cuda" else torch.float32)
    if device == "cuda":
        hq, hk, d = 32, 8, 128
        nodes = [8, 16, 32, 64]
        prefixes = [1024, 32768] if args.quick else [1024, 2048, 4096, 8192, 16384, 32768]
        batches = [1, 16, 64]  # reference shape: B = 64, N = 16, GQA 4, prefix 8k
    else:
        hq, hk, d = 8, 2, 64
        nodes = [8, 32]
        prefixes = [512] if args.quick else [512, 2048]
        batches = [1] if args.quick else [1, 4]
    repeat = 5 if args.quick else 20

    try:
        from flash_attn import flash_attn_with_kvcache
    except ImportError:
        flash_attn_with_kvcache = None

    peak = peak_bandwidth_gbps(device)
    cols = ["B", "N", "prefix", "cache", "tree_ms", "tree_GBps", "sdpa_bias_ms", "dense_decode_ms", "ratio_vs_decode",
            "speedup_vs_bias"]
    if peak:
        cols.insert(5, "pct_peak")
    if flash_attn_with_kvcache is not None:
        cols += ["fa_causal_ms", "ratio_vs_fa"]
    table = Table(cols)
    print(f"# device={device} dtype={dtype} Hq={hq} Hk={hk} D={d} cpu_threads={torch.get_num_threads()}")
    with profiled_region(device):
        for batch, n, prefix in itertools.product(batches, nodes, prefixes):
            if args.capacity and args.capacity < prefix + n:
                continue
            q, k, v, prefix_lens, info = make_inputs(batch, n, prefix, hq, hk, d, dtype, device, args.capacity)
            k_used, v_used = k[:, : prefix + n], v[:, : prefix + n]
            with nvtx_range(f"tree_attention B={batch} N={n} P={prefix}", device):
                t_tree = time_fn(lambda: specdec_ops.tree_attention(q, k, v, prefix_lens, info.mask), device,
                                 repeat=repeat)
            with nvtx_range(f"sdpa_bias B={batch} N={n} P={prefix}", device):
                t_bias = time_fn(lambda: sdpa_with_bias(q, k_used, v_used, prefix_lens, info.mask), device,
                                 repeat=repeat)
            with nvtx_range(f"dense_decode B={batch} N={n} P={prefix}", device):
                t_dec = time_fn(lambda: dense_decode(q, k_used, v_used), device, repeat=repeat)
            kv_bytes = 2 * k_used.numel() * k.element_size() + 2 * q.numel() * q.element_size()
            row = dict(B=batch, N=n, prefix=prefix, cache=k.shape[1], tree_ms=t_tree, tree_GBps=gbps(kv_bytes, t_tree),
                       sdpa_bias_ms=t_bias, dense_decode_ms=t_dec, ratio_vs_decode=t_tree / t_dec,
                       speedup_vs_bias=t_bias / t_tree)
            if peak:
                row["pct_peak"] = 100.0 * gbps(kv_bytes, t_tree) / peak
            if flash_attn_with_kvcache is not None:
                seqlens = torch.full((batch,), prefix + n, dtype=torch.int32, device=device)
                t_fa = time_fn(lambda: flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, causal=True), device,
                               repeat=repeat)
                row.update(fa_causal_ms=t_fa, ratio_vs_fa=t_tree / t_fa)
            table.add(**row)
    if args.tiles == "on" or args.tiles == "auto" and device == "cuda":
        table.rows += tile_table(device, dtype, repeat).rows
    table.write_json(args.json)


def tile_table(device: str, dtype: torch.dtype, repeat: int, batch: int = 64, n: int = 16, prefix: int = 8192,
               hq: int = 32, hk: int = 8, d: int = 128) -> Table:
    """The tree attention kernel at one shape under the launcher's tile configuration and each of
    TILE_CANDIDATES (the launcher's ``_tile_config`` replaced for the call, restored after): ms, GB/s,
    x the launcher's time, and the largest difference from the launcher's output."""
    q, k, v, prefix_lens, info = make_inputs(batch, n, prefix, hq, hk, d, dtype, device)
    kv_bytes = 2 * k.numel() * k.element_size() + 2 * q.numel() * q.element_size()
    own = attention._tile_config(dtype, n * (hq // hk), d)
    run = lambda: specdec_ops.tree_attention(q, k, v, prefix_lens, info.mask, backend="triton")  # noqa: E731
    base_out = run()
    table = Table(["tiles", "B", "N", "prefix", "tile", "tree_ms", "tree_GBps", "x_launcher", "max_diff"])
    t_own = None
    saved = attention._tile_config
    try:
        for tile in [own] + [t for t in TILE_CANDIDATES if t != own]:
            attention._tile_config = lambda *_, tile=tile: tile
            try:
                out = run()
                with nvtx_range(f"tree_attention tile={tile}", device):
                    t = time_fn(run, device, repeat=repeat)
            except Exception as e:      # a configuration this Triton cannot compile or launch
                print(f"tile {tile}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
                continue
            t_own = t if t_own is None else t_own
            table.add(tiles="launcher" if tile == own else "candidate", B=batch, N=n, prefix=prefix,
                      tile="x".join("-" if x is None else str(x) for x in tile), tree_ms=t,
                      tree_GBps=gbps(kv_bytes, t), x_launcher=t / t_own,
                      max_diff=float((out.float() - base_out.float()).abs().max()))
    finally:
        attention._tile_config = saved
    return table


if __name__ == "__main__":
    main()
