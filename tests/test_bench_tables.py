"""bench/common.py's Table: the JSON and the chart beside it (the picture of every kernel benchmark)."""

import json
import os
import struct
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from common import Table  # noqa: E402


def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


def test_json_and_a_chart_of_the_ratio_columns(tmp_path, capsys):
    table = Table(["mode", "B", "V", "ours_ms", "x_vs_transformers", "x_vs_reference"])
    table.add(mode="sampled", B=8, V=32000, ours_ms=1.5, x_vs_transformers=3.0, x_vs_reference=2.0)
    table.add(mode="greedy", B=8, V=32000, ours_ms=1.0, x_vs_transformers=4.5, x_vs_reference="-")
    table.add(mode="greedy", B=64, V=32000, ours_ms=2.0, x_vs_transformers=5.0, x_vs_reference=1.5)
    path = tmp_path / "out.json"
    table.write_json(str(path))
    assert json.loads(path.read_text()) == table.rows
    assert table.chart_columns() == ["x_vs_transformers", "x_vs_reference"]
    # the columns that tell rows apart (V is the same everywhere; the ratios are the values)
    assert table.row_labels() == ["sampled B8", "greedy B8", "greedy B64"]
    width, height = png_size(tmp_path / "out.png")
    assert width >= 3 * (8 * len("sampled B8") + 8) and height > 200


def test_percent_of_peak_when_no_ratio_and_no_chart_without_either(tmp_path):
    gpu = Table(["mode", "backend", "ms", "pct_peak"])
    gpu.add(mode="draft", backend="cuda", ms=0.02, pct_peak=81.0)
    gpu.add(mode="draft", backend="triton", ms=0.03, pct_peak=60.0)
    assert gpu.chart_columns() == ["pct_peak"] and gpu.row_labels() == ["cuda", "triton"]
    assert gpu.write_chart(str(tmp_path / "gpu.png")) and png_size(tmp_path / "gpu.png")[0] > 0
    plain = Table(["B", "ms"])
    plain.add(B=1, ms=0.5)
    plain.write_json(str(tmp_path / "plain.json"))
    assert not plain.write_chart(str(tmp_path / "plain.png")) and not (tmp_path / "plain.png").exists()


def test_measured_report_reads_a_gpu_run(tmp_path):
    import measured_report

    data = {"rows": {
        "a_cuda": dict(predicted_us=10.0, pct_peak=80.0, measured_us=20.0, measured_pct_peak=40.0,
                       measured_how="graph", timing=dict(eager=50e-6, graph=20e-6, kernel=18e-6, kernels={})),
        "b_triton": dict(predicted_us=4.0, pct_peak=50.0, measured_us=12.0, measured_pct_peak=16.7,
                         timing=dict(eager=12e-6, graph=None)),
        "c_unmeasured": dict(predicted_us=1.0, pct_peak=99.0)}}
    rows = measured_report.rows_of(data)
    assert [r["kernel"] for r in rows] == ["a_cuda", "b_triton"]
    assert rows[0]["ratio"] == 2.0 and rows[1]["ratio"] == 3.0
    table = measured_report.markdown(rows).splitlines()
    assert table[2] == "| a_cuda | 10.0 | 20.0 | 18.0 | 50.0 | 80 | 40.0 | 2.0 |"
    assert table[3] == "| b_triton | 4.0 | 12.0 (eager) | - | 12.0 | 50 | 16.7 | 3.0 |"
    # the committed H200 run: every kernel of the model measured, and the chart drawn
    path = os.path.join(os.path.dirname(measured_report.__file__), "h200_2026-12-04.json")
    png = tmp_path / "m.png"
    assert measured_report.main([path, "--png", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with open(path) as f:
        assert len(measured_report.rows_of(json.load(f))) == 23
