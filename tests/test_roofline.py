"""bench/roofline.py, the static performance model: it compiles one CUDA kernel for sm_90 and sm_80 (no GPU
needed), prints its table row, writes the JSON, and fails on spills. Skipped without nvcc."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "bench", "roofline.py")


def _load():
    spec = importlib.util.spec_from_file_location("roofline", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["roofline"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


roofline = _load()
needs_nvcc = pytest.mark.skipif(roofline.find_nvcc() is None, reason="nvcc not found")


@pytest.mark.slow
@needs_nvcc
def test_roofline_table_for_the_chain_kernel_has_no_spills(tmp_path):
    out = tmp_path / "roofline.json"
    result = subprocess.run([sys.executable, SCRIPT, "--only", "rejection_cuda_draft", "--json", str(out)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split()[:3] == ["kernel", "regs", "spill"]
    assert lines[1].startswith("rejection_cuda_draft")
    row = json.loads(out.read_text())["rows"]["rejection_cuda_draft"]
    assert row["spills"] == 0 and 0 < row["regs"] <= 255
    assert row["grid"] > 64  # the vocabulary is split across blocks: more blocks than requests
    assert row["instr_per_elem"] is not None and row["instr_per_elem"] > 5  # a hot loop was found and counted
    assert row["bytes_vs_min"] == pytest.approx(1.0, abs=0.01)
    assert 0 < row["pct_peak"] <= 100


def test_occupancy_follows_registers_shared_memory_and_threads():
    assert roofline.blocks_per_sm(regs=64, shared=0, threads=1024) == 1
    assert roofline.blocks_per_sm(regs=32, shared=0, threads=1024) == 2
    assert roofline.blocks_per_sm(regs=128, shared=0, threads=256) == 2
    assert roofline.blocks_per_sm(regs=32, shared=100 * 1024, threads=128) == 2
    assert roofline.blocks_per_sm(regs=16, shared=0, threads=32) == 32


def test_spills_are_read_from_ptxas_and_fail_the_run():
    log = ("ptxas info    : Compiling entry function '_Z1kv' for 'sm_90'\n"
           "ptxas info    : Function properties for _Z1kv\n"
           "    16 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads\n"
           "ptxas info    : Compiling entry function '_Z1jv' for 'sm_90'\n"
           "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n")
    assert roofline.parse_ptxas(log) == {"_Z1kv": 20, "_Z1jv": 0}


def test_hot_loop_is_the_innermost_backward_branch_with_the_loads():
    sass = [(0x00, "MOV R1, R2"),
            (0x10, "LDG.E.128 R4, desc[UR4][R2.64]"),          # loop start
            (0x20, "IMAD.WIDE.U32 R8, R8, -0x2daee0ad, RZ"),   # Philox
            (0x30, "@P0 BRA 0x60"),                           # skip the log
            (0x40, "FFMA R3, R3, 0.69314718246459960938, R12"),
            (0x50, "MUFU.RCP R2, R3"),
            (0x60, "FSETP.GT.AND P1, PT, R3, RZ, PT"),
            (0x70, "@P1 BRA 0x10"),                           # back edge
            (0x80, "EXIT")]
    body, cold = roofline.hot_loop(sass, "race", streams=1)
    assert len(body) == 7 and cold == 2
    assert roofline.hot_loop(sass, "scan", streams=1) is None  # the only loop runs Philox
