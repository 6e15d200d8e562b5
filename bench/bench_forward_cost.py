"""The decode loop's verify forward by window width: F.linear against the narrow products, in one process.

`measure_forward_cost` (what `default_setup` gives the cost model) times the loop's own forward of the
target over windows of 1 .. 32 tokens after a 128-token prefill, the fastest of 3 runs per width. Here it
runs alternately with ``NARROW_ROWS = 0`` (every linear layer through F.linear)
and with the default (windows of 1 .. NARROW_ROWS rows on CPU run their linear layers as W @ x^T, one row
padded to two: ``narrow_linears`` in specdec_ops/decoding/forward.py), and prints per width the fastest time of each over
the rounds and their ratio. On CUDA the narrow products are never used: both columns time the same forward.

    python bench/bench_forward_cost.py --device cpu --json bench/forward_cost.json   (and forward_cost.png)
"""

from __future__ import annotations

import os

import torch

from common import Table, base_parser

WIDTHS = (1, 2, 3, 4, 5, 6, 8, 16, 32)


def main() -> None:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--target", default=None, help="HF directory or .gguf (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--rounds", type=int, default=None, help="alternations of the two (default 3, --quick 1)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default 1 on CPU)")
    parser.add_argument("--plot", default=None, help="PNG path (default: beside --json)")
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
    narrow_rows = forward_mod.NARROW_ROWS
    best = {"linear": {w: float("inf") for w in widths}, "narrow": {w: float("inf") for w in widths}}
    try:
        for _ in range(rounds):
            for name, limit in (("linear", 0), ("narrow", narrow_rows)):
                forward_mod.NARROW_ROWS = limit
                for w, seconds in measure_forward_cost(model, widths=widths).items():
                    best[name][w] = min(best[name][w], seconds)
    finally:
        forward_mod.NARROW_ROWS = narrow_rows
    print(f"{args.device}, {torch.get_num_threads()} threads; verify forward after a 128-token prefill, fastest "
          f"of {rounds} x 3 runs, ms (NARROW_ROWS = {narrow_rows})")
    table = Table(["tokens", "linear_ms", "narrow_ms", "speedup", "linear_x_one", "narrow_x_one"])
    one = best["linear"][widths[0]]
    for w in widths:
        lin, nar = best["linear"][w] * 1e3, best["narrow"][w] * 1e3
        table.add(tokens=w, linear_ms=lin, narrow_ms=nar, speedup=lin / nar, linear_x_one=lin / (one * 1e3),
                  narrow_x_one=nar / (one * 1e3))
    table.write_json(args.json)
    plot_path = args.plot or (os.path.splitext(args.json)[0] + ".png" if args.json else None)
    if plot_path:
        from charts import bar_chart

        bar_chart(plot_path, "VERIFY FORWARD MS BY WINDOW TOKENS", [str(w) for w in widths],
                  {"F.LINEAR": [r["linear_ms"] for r in table.rows],
                   "NARROW W @ X^T": [r["narrow_ms"] for r in table.rows]})
        print(f"plot saved to {plot_path}")


if __name__ == "__main__":
    main()
