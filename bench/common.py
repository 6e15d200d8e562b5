"""Timing helpers shared by every benchmark in bench/.

- `time_fn` times a callable on CPU (perf_counter) or CUDA (events on the
  current stream), after warm-up, and returns the median in milliseconds.
- `nvtx_range` marks a region for Nsight Systems; `profiled_region` brackets the
  measured part with torch.cuda.profiler.start/stop, so
  `nsys profile --capture-range=cudaProfilerApi python bench/bench_x.py --device cuda`
  captures exactly the measured cases.
- `Table` prints aligned rows and can write them as JSON (gpu_check.sh collects them), with a bar chart of
  its ratio columns beside it (same name, .png).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable

import torch

# bench/ scripts run from a checkout: make `import specdec_ops` work without installing.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from specdec_ops._nvtx import nvtx_range  # noqa: E402,F401  (re-exported for the benches)


def base_parser(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    parser.add_argument("--quick", action="store_true", help="fewer cases and repeats (smoke run)")
    parser.add_argument("--json", default=None, help="also write the rows as JSON to this path")
    return parser


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_fn(fn: Callable[[], object], device: str, *, warmup: int = 3, repeat: int = 10,
            min_time_s: float = 0.0) -> float:
    """Median wall time of fn() in milliseconds."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    times = []
    start_all = time.perf_counter()
    while len(times) < repeat or time.perf_counter() - start_all < min_time_s:
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        if len(times) >= 10 * repeat:
            break
    return statistics.median(times)


@contextlib.contextmanager
def profiled_region(device: str):
    """The region nsys captures with --capture-range=cudaProfilerApi."""
    if device == "cuda":
        torch.cuda.profiler.start()
        try:
            yield
        finally:
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
    else:
        yield


# Peak DRAM bandwidth (GB/s) of devices we report against; others print no percentage.
_PEAK_GBPS = {"H200": 4800.0, "H100 SXM": 3350.0, "H100": 3350.0, "A100": 2039.0, "L40S": 864.0}


def peak_bandwidth_gbps(device: str) -> float | None:
    if device != "cuda":
        return None
    name = torch.cuda.get_device_name()
    for key, peak in _PEAK_GBPS.items():
        if key in name:
            return peak
    return None


def gbps(num_bytes: float, ms: float) -> float:
    return num_bytes / (ms * 1e-3) / 1e9


class Table:
    def __init__(self, columns: list[str]):
        self.columns = columns
        self.rows: list[dict] = []

    def add(self, **row) -> None:
        self.rows.append(row)
        print("  ".join(f"{c}={self._fmt(row.get(c))}" for c in self.columns), flush=True)

    @staticmethod
    def _fmt(v) -> str:
        if isinstance(v, float):
            return f"{v:.3f}" if abs(v) < 1000 else f"{v:.0f}"
        return str(v)

    def write_json(self, path: str | None) -> None:
        """The rows as JSON at `path`, and `write_chart` beside it (the same name with .png)."""
        if path:
            with open(path, "w") as f:
                json.dump(self.rows, f, indent=1)
            self.write_chart(os.path.splitext(path)[0] + ".png")

    def chart_columns(self) -> list[str]:
        """What the chart shows: the ratio columns (x_..., speedup: 1.0 is the baseline of the same run), else
        the percentage of peak bandwidth; none for a table without either."""
        ratios = [c for c in self.columns if c.startswith("x_") or c == "speedup"]
        return ratios or [c for c in self.columns if c == "pct_peak"]

    def row_labels(self) -> list[str]:
        """A label per row from its text and integer columns that differ between rows ("B64 SAMPLED CUDA")."""
        keys = [c for c in self.columns if c not in self.chart_columns()
                and all(isinstance(r.get(c), (str, int)) and not isinstance(r.get(c), bool) for r in self.rows)
                and len({r.get(c) for r in self.rows}) > 1]

        def piece(c, v):
            return f"{c}{v}" if isinstance(v, int) and len(c) <= 2 else str(v)

        return [" ".join(piece(c, r[c]) for c in keys) or str(i + 1) for i, r in enumerate(self.rows)]

    def write_chart(self, path: str) -> bool:
        """A grouped bar chart (bench/charts.py) of chart_columns per row at `path`, with a line at 1.0 for
        ratios; False (nothing written) when the table has no such column or no rows."""
        names = self.chart_columns()
        if not names or not self.rows:
            return False
        from charts import bar_chart

        def value(v):
            return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else float("nan")

        labels = self.row_labels()
        ratio = names[0] != "pct_peak"
        title = ("X BASELINE" if ratio else "PCT OF PEAK BANDWIDTH") + " PER CASE"
        bar_chart(path, title, labels, {n: [value(r.get(n)) for r in self.rows] for n in names},
                  reference=1.0 if ratio else None, label_chars=max(len(s) for s in labels))
        return True


def run_device_table(description: str, run_gpu: Callable[[argparse.Namespace], Table],
                     run_cpu: Callable[[argparse.Namespace], Table], cpu_note: str = ""):
    """The main() of a kernel benchmark with only the common flags: run_gpu(args) on CUDA, else a
    "CPU, N threads" line and run_cpu(args); writes --json. Returns (args, table)."""
    args = base_parser(description).parse_args()
    torch.set_grad_enabled(False)
    if args.device == "cuda":
        table = run_gpu(args)
    else:
        print(f"CPU, {torch.get_num_threads()} threads{cpu_note}; times are medians in ms")
        table = run_cpu(args)
    table.write_json(args.json)
    return args, table
