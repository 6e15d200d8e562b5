"""bench/gpu_check.sh, the one script a lent GPU machine runs, checked without a GPU: its orchestration in
simulation (GPU_CHECK_SIMULATE=1: every step a stub that sleeps SIM_<step> seconds). What a lent machine
returns is at most 8 files with plain names, and a command cut off at the tool's limit returns only what is
already under $OUT; so every step must end within the budget, and every log must already be packed."""

import os
import re
import subprocess
import tarfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "bench", "gpu_check.sh")
END_TO_END = ("bench_e2e.py", "bench_forward_cost.py")   # they load SmolLM2: only with WITH_E2E=1
BENCHES = sorted(f[:-3] for f in os.listdir(os.path.join(ROOT, "bench"))
                 if f.startswith("bench_") and f.endswith(".py") and f not in END_TO_END)


def simulate(tmp_path, **env):
    out, logs = tmp_path / "out", tmp_path / "logs"
    full = dict(os.environ, GPU_CHECK_SIMULATE="1", OUT=str(out), GPU_CHECK_LOGS=str(logs), **env)
    result = subprocess.run(["bash", SCRIPT], env=full, capture_output=True, text=True, timeout=120)
    summary = (out / "summary.txt").read_text()
    return result, out, summary


def packed(out):
    with tarfile.open(out / "results.tar.gz") as tar:
        return {os.path.basename(n) for n in tar.getnames()}


def test_a_hanging_step_is_cut_at_its_limit_and_the_rest_still_runs(tmp_path):
    result, out, summary = simulate(tmp_path, GPU_CHECK_BUDGET="200", BENCH_TIMEOUT="2", SIM_bench_logits="60")
    assert result.returncode == 1, result.stdout + result.stderr
    assert re.search(r"bench_logits: exit 124 in [23] s \(TIMED OUT at 2 s\)", summary), summary
    for name in ["build", "tests", "roofline", "memcheck"] + [b for b in BENCHES if b != "bench_logits"]:
        assert re.search(rf"\] {name}: exit 0 in", summary), (name, summary)
    assert "failed or timed out: bench_logits" in summary
    # what comes back from a lent machine: at most 8 plain files directly under $OUT
    names = sorted(os.listdir(out))
    assert names == ["results.tar.gz", "summary.txt"], names
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", n) for n in names)
    logs = packed(out)
    assert {"summary.txt", "build.log", "cuda_tests.log", "roofline.log", "memcheck.log"} <= logs, logs
    assert {f"{b}.log" for b in BENCHES} <= logs, logs


def test_steps_that_no_longer_fit_the_budget_are_skipped_and_named_for_a_rerun(tmp_path):
    result, out, summary = simulate(tmp_path, GPU_CHECK_BUDGET="20", GPU_CHECK_STEPS="benches memcheck")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "] build" not in summary and "] tests" not in summary    # not asked for
    for name in BENCHES + ["memcheck"]:
        assert re.search(rf"\] {name}: SKIPPED: \d+ s of the budget left", summary), (name, summary)
    assert 'GPU_CHECK_STEPS="benches memcheck"' in summary
    assert "summary.txt" in packed(out) and "memcheck.log" not in packed(out)


def test_without_time_for_the_build_nothing_else_runs(tmp_path):
    result, out, summary = simulate(tmp_path, GPU_CHECK_BUDGET="15")
    assert result.returncode == 1
    assert "build: SKIPPED" in summary and "nothing else can run without the build" in summary
    assert "] tests" not in summary and (out / "results.tar.gz").exists()


def test_the_roofline_step_measures_against_the_committed_predictions():
    text = open(SCRIPT).read()
    assert "bench/roofline.py --measure --predicted bench/roofline.json" in text
