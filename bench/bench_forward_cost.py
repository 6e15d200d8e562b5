"""The decode loop's verify forward by window width: F.linear, W @ x^T and the skinny_linear kernel, in one process.

`measure_forward_cost` (what `default_setup` gives the cost model) times the loop's own forward of the
target over windows of 1 .. 32 tokens after a 128-token prefill, the fastest of 3 runs per width. Here it
runs in turn with every linear layer through F.linear (``narrow_rows() = 0``), with the products of up to
``NARROW_ROWS`` rows as ``W @ x^T`` (one row padded to two; what runs where skinny_linear is not vectorized)
and with the default (windows of up to ``narrow_rows()`` rows through ``narrow_linear``: the skinny_linear
kernel of csrc/linear on an AVX2 / AVX-512 CPU), and prints per width the fastest time of each over the
rounds and the ratios to F.linear. ``--products`` also times the bare products over the target's linear
layers (every weight matrix once per sweep, as a forward streams them; the fastest of 5 sweeps) for 1 .. 32
rows: the numbers quoted in specdec_ops/linear.py. On CUDA none of this is used: every column times the
same forward.

    python bench/bench_forward_cost.py --device cpu --products --json bench/forward_cost.json   (and .png)
"""

from __future__ import annotations

import json
import os
import time

import torch

from common import Table, base_parser

WIDTHS = (1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32)


def main() -> None:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--target", default=None, help="HF directory or .gguf (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--rounds", type=int, default=None, help="alternations of the three (default 3, --quick 1)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default 1 on CPU)")
    parser.add_argument("--plot", default=None, help="PNG path (default: beside --json)")
    parser.add_argument("--products", action="store_true", help="also time the bare products (CPU)")
    args = parser.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(args.threads or 1)
    elif args.threads:
        torch.set_num_threads(args.threads)

    from specdec_ops.decoding import forward as forward_mod
    from specdec_ops.decoding.models import default_target, load_model
    from specdec_ops.decoding.setup import measure_forward_cost

    model, _ = load_model(args.target or default_target(), args.device)
    widths = (1, 2, 4, 8) if args.quick else WIDTHS
    rounds = args.rounds or (1 if args.quick else 3)
    default_rows, skinny = forward_mod.narrow_rows(), forward_mod._skinny_kernel()
    configs = {"linear": (lambda: 0, skinny), "mm": (lambda: forward_mod.NARROW_ROWS, False),
               "skinny": (lambda: default_rows, skinny)}
    best = {name: {w: float("inf") for w in widths} for name in configs}
    saved = forward_mod.narrow_rows, forward_mod._skinny_kernel
    try:
        for _ in range(rounds):
            for name, (rows, vectorized) in configs.items():
                forward_mod.narrow_rows = rows
                forward_mod._skinny_kernel = lambda vectorized=vectorized: vectorized
                for w, seconds in measure_forward_cost(model, widths=widths, calibrate=False).items():
                    best[name][w] = min(best[name][w], seconds)
    finally:
        forward_mod.narrow_rows, forward_mod._skinny_kernel = saved
    from specdec_ops.linear import skinny_linear_isa
    print(f"{args.device}, {torch.get_num_threads()} threads; verify forward after a 128-token prefill, fastest "
          f"of {rounds} x 3 runs, ms (skinny_linear: {skinny_linear_isa()}, up to {default_rows} rows; W @ x^T up "
          f"to {forward_mod.NARROW_ROWS} rows)")
    table = Table(["tokens", "linear_ms", "mm_ms", "skinny_ms", "x_mm", "x_skinny"])
    for w in widths:
        lin, mm, sk = (best[name][w] * 1e3 for name in ("linear", "mm", "skinny"))
        table.add(tokens=w, linear_ms=lin, mm_ms=mm, skinny_ms=sk, x_mm=lin / mm, x_skinny=lin / sk)
    products = product_sweep(model, widths) if args.products and args.device == "cpu" else None
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"forward": table.rows, "products": products, "isa": skinny_linear_isa(),
                       "threads": torch.get_num_threads()}, f, indent=1)
    plot_path = args.plot or (os.path.splitext(args.json)[0] + ".png" if args.json else None)
    if plot_path:
        from charts import bar_chart

        bar_chart(plot_path, "VERIFY FORWARD MS BY WINDOW TOKENS", [str(w) for w in widths],
                  {"F.LINEAR": [r["linear_ms"] for r in table.rows], "TORCH.MM W X-T": [r["mm_ms"] for r in table.rows],
                   "SKINNY_LINEAR": [r["skinny_ms"] for r in table.rows]})
        print(f"plot saved to {plot_path}")


@torch.inference_mode()
def product_sweep(model, widths, sweeps: int = 5) -> list[dict]:
    """ms of every linear layer's product (one sweep over the model's weight matrices) per row count: F.linear,
    W @ x^T (one row padded to two) and skinny_linear; the fastest of ``sweeps``, the three interleaved."""
    import torch.nn.functional as F

    weights = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    skinny = torch.ops.specdec.skinny_linear.default

    def mm(x, w):
        padded = torch.cat([x, x.new_zeros(1, x.shape[1])]) if x.shape[0] == 1 else x
        return torch.mm(w, padded.T)[:, :x.shape[0]].T.contiguous()

    products = {"linear": lambda x, w: F.linear(x, w), "mm": mm, "skinny": lambda x, w: skinny(x, w, None, -1)}
    megabytes = sum(w.numel() * w.element_size() for w in weights) / 1e6
    print(f"products over {len(weights)} weight matrices ({megabytes:.0f} MB), fastest of {sweeps} sweeps, ms")
    table = Table(["rows", "linear_ms", "mm_ms", "skinny_ms", "x_mm", "x_skinny"])
    for rows in widths:
        inputs = {w.shape[1]: torch.randn(rows, w.shape[1]) for w in weights}
        best = {name: float("inf") for name in products}
        for _ in range(sweeps):
            for name, product in products.items():
                start = time.perf_counter()
                for w in weights:
                    product(inputs[w.shape[1]], w)
                best[name] = min(best[name], time.perf_counter() - start)
        lin, mm_ms, sk = (best[name] * 1e3 for name in ("linear", "mm", "skinny"))
        table.add(rows=rows, linear_ms=lin, mm_ms=mm_ms, skinny_ms=sk, x_mm=lin / mm_ms, x_skinny=lin / sk)
    return table.rows


if __name__ == "__main__":
    main()
