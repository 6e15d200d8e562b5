"""Predicted next to measured, from a table that `bench/roofline.py --measure --json PATH` wrote on a GPU.

    python bench/measured_report.py bench/h200_2026-12-04.json             # a Markdown table
    python bench/measured_report.py bench/h200_2026-12-04.json --png F.png  # and a bar chart of % of peak

Columns: the model's prediction; the GPU's time per call with the calls replayed from a CUDA graph (what the
model predicts: no host overhead); the kernels' own durations (torch.profiler; their sum); the time per call
from eager Python calls (host overhead included); % of the HBM peak, predicted and measured (graph); and
measured / predicted. Rows measured without a graph (eager only) say so.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def rows_of(data: dict) -> list[dict]:
    out = []
    for name, r in data["rows"].items():
        if "measured_us" not in r:
            continue
        t = r.get("timing", {})
        us = lambda v: None if v is None else v * 1e6  # noqa: E731
        out.append(dict(kernel=name, predicted_us=r["predicted_us"], measured_us=r["measured_us"],
                        how=r.get("measured_how", "eager"), kernels_us=us(t.get("kernel")),
                        eager_us=us(t.get("eager")), pct_predicted=r["pct_peak"],
                        pct_measured=r["measured_pct_peak"], ratio=r["measured_us"] / r["predicted_us"]))
    return out


def markdown(rows: list[dict]) -> str:
    f = lambda v, fmt: "-" if v is None else fmt.format(v)  # noqa: E731
    lines = ["| kernel | predicted us | GPU us (graph) | kernels us | eager us | % peak predicted | "
             "% peak measured | measured / predicted |", "|" + " --- |" * 8]
    for r in rows:
        how = "" if r["how"] == "graph" else " (eager)"
        lines.append(f"| {r['kernel']} | {r['predicted_us']:.1f} | {r['measured_us']:.1f}{how} | "
                     f"{f(r['kernels_us'], '{:.1f}')} | {f(r['eager_us'], '{:.1f}')} | {r['pct_predicted']:.0f} | "
                     f"{r['pct_measured']:.1f} | {r['ratio']:.1f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("table", help="a JSON written by bench/roofline.py --measure --json")
    ap.add_argument("--png", help="also draw predicted and measured %% of peak per kernel")
    args = ap.parse_args(argv)
    with open(args.table) as f:
        rows = rows_of(json.load(f))
    if not rows:
        print(f"{args.table}: no measured rows (made without --measure?)")
        return 1
    print(markdown(rows))
    if args.png:
        from charts import bar_chart
        bar_chart(args.png, "% of HBM peak: predicted (model) and measured (CUDA graph replay)",
                  [r["kernel"] for r in rows],
                  {"predicted": [r["pct_predicted"] for r in rows], "measured": [r["pct_measured"] for r in rows]},
                  label_chars=max(len(r["kernel"]) for r in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
