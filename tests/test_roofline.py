"""bench/roofline.py, the static performance model: it compiles one CUDA kernel for sm_90 (no GPU needed),
prints its table row, writes the JSON, and fails on spills; the other rows are checked in the committed table
(bench/roofline.json), which must be the one these sources give. Skipped without nvcc. The tests compile sm_90
alone (`--arch 90`): CI's build compiles every .cu for sm_80 and sm_90 with SPECDEC_FAIL_ON_SPILLS=1,
where ptxas fails on any spill or local memory (setup.py)."""

import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest
import torch

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
    result = subprocess.run([sys.executable, SCRIPT, "--only", "rejection_cuda_draft", "--arch", "90", "--json", str(out)],
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


def test_log_path_fraction_per_tile_and_per_warp():
    # Triton: a best per block, tile t new with probability 1/t: H(T) / T of the trips.
    assert roofline.log_path_fraction("triton", 1, 8) == 1.0
    assert roofline.log_path_fraction("triton", 4, 8) == pytest.approx((1 + 1 / 2 + 1 / 3 + 1 / 4) / 4)
    # CUDA: a best per thread, the warp runs entry n's log path when any of 32 lanes may win there.
    assert roofline.log_path_fraction("cuda", 2, 2) == pytest.approx(
        sum(1 - (1 - 1 / n) ** 32 for n in range(1, 5)) / 4)
    for trips in (2, 8, 16):  # per-lane bests run it more often than one best per tile
        assert roofline.log_path_fraction("cuda", trips, 8) > 1.25 * roofline.log_path_fraction("triton", trips, 8)
    assert roofline.log_path_fraction("cuda", 16, 8) > 2 * roofline.log_path_fraction("triton", 16, 8)
    assert roofline.log_path_fraction("triton", 0, 8) == 0.0
    # CUDA with bars raised to the warp's best every 2 entries: entries 3 and 4 also compete with the
    # 31 other lanes' first 2 entries.
    assert roofline.log_path_fraction("cuda", 2, 2, bar_share=2) == pytest.approx(
        sum(1 - (1 - 1 / c) ** 32 for c in (1, 2, 3 + 62, 4 + 62)) / 4)
    # at the chain kernel's B=64 shape (16 trips of 8 entries, raised every group of 4): ~6%, not ~48%
    assert roofline.log_path_fraction("cuda", 16, 8, bar_share=4) < 0.07
    assert roofline.log_path_fraction("cuda", 16, 8) > 0.45
    # one skip test per group of 4: a group's exact path runs when any lane may win at any of its entries
    assert roofline.log_path_fraction("cuda", 2, 4, bar_share=4, group=4) == pytest.approx(
        (1.0 + 1 - math.prod((1 - 1 / c) ** 32 for c in range(129, 133))) / 2)
    assert roofline.log_path_fraction("cuda", 16, 8, bar_share=4, group=4) > 2 * roofline.log_path_fraction(
        "cuda", 16, 8, bar_share=4)


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
    # a group's exact path (skip test per entry inside) around one entry's log path: the largest region
    # is the group's, the innermost the entry's
    nested = [(0x00, "MOV R1, R2"),
              (0x10, "LDG.E.128 R4, desc[UR4][R2.64]"),
              (0x20, "IMAD.WIDE.U32 R8, R8, -0x2daee0ad, RZ"),
              (0x30, "@P0 BRA 0x90"),                           # the group's skip test
              (0x40, "FSETP.GT.AND P2, PT, R3, R9, PT"),       # an entry's skip test
              (0x50, "@P2 BRA 0x80"),
              (0x60, "FFMA R3, R3, 0.69314718246459960938, R12"),
              (0x70, "MUFU.RCP R2, R3"),
              (0x80, "FMNMX R9, R9, R2, !PT"),
              (0x90, "FSETP.GT.AND P1, PT, R3, RZ, PT"),
              (0xa0, "@P1 BRA 0x10"),
              (0xb0, "EXIT")]
    assert roofline.hot_loop(nested, "race", streams=1)[1] == 5
    assert roofline.hot_loop(nested, "race", streams=1, innermost=True)[1] == 2


def test_logits_loop_kinds_tell_max_exp_sum_and_histogram_apart():
    def loop(*ins):
        return [(0x00, "MOV R1, R2")] + [(0x10 * (i + 1), x) for i, x in enumerate(ins)] + \
               [(0x10 * (len(ins) + 1), "@P1 BRA 0x10"), (0x10 * (len(ins) + 2), "EXIT")]
    max_loop = loop("LDG.E.U16 R4, desc[UR4][R2.64]", "FMNMX R5, R5, R4, !PT")
    sum_loop = loop("LDG.E.U16 R4, desc[UR4][R2.64]", "MUFU.EX2 R6, R4", "FADD R7, R7, R6")
    hist_loop = loop("LDG.E.U16 R4, desc[UR4][R2.64]", "MUFU.EX2 R6, R4", "ATOMS.ADD RZ, [R8], R9")
    triton_hist = loop("LDG.E.U16 R4, desc[UR4][R2.64]", "MUFU.EX2 R6, R4",
                       *["BAR.SYNC.DEFER_BLOCKING 0x0"] * roofline._HISTOGRAM_BARRIERS)
    assert roofline.hot_loop(max_loop, "max", 1) is not None
    assert roofline.hot_loop(max_loop, "expsum", 1) is None
    assert roofline.hot_loop(sum_loop, "expsum", 1) is not None
    assert roofline.hot_loop(sum_loop, "max", 1) is None and roofline.hot_loop(sum_loop, "radix", 1) is None
    for hist in (hist_loop, triton_hist):
        assert roofline.hot_loop(hist, "radix", 1) is not None
        assert roofline.hot_loop(hist, "expsum", 1) is None and roofline.hot_loop(hist, "max", 1) is None


def test_a_pass_over_pieces_is_read_off_the_loop_over_pieces_not_its_nested_tail():
    # split_for_each: a loop over 16-byte pieces (LDS.128) with, nested in it, the elementwise loop over the
    # piece a row's end cuts (LDS.U16). The hot loop is the outer one, without the tail's instructions.
    sass = [(0x00, "MOV R1, R2"),
            (0x10, "LDS.128 R4, [R2]"),                       # the loop over pieces
            (0x20, "@P0 BRA 0x80"),                           # a whole piece: skip the tail
            (0x30, "LDS.U16 R9, [R3]"),                       # the tail, entry by entry
            (0x40, "MUFU.EX2 R6, R9"),
            (0x50, "ATOMS.ADD RZ, [R8], R9"),
            (0x60, "@P2 BRA 0x30"),                           # the tail's back edge
            (0x70, "BRA 0xb0"),
            (0x80, "MUFU.EX2 R6, R4"),
            (0x90, "ATOMS.ADD RZ, [R8], R6"),
            (0xa0, "IADD3 R2, R2, 0x10, RZ"),
            (0xb0, "@P1 BRA 0x10"),                           # the pieces' back edge
            (0xc0, "EXIT")]
    body, cold = roofline.hot_loop(sass, "radix", 1, elem_bytes=2, smem=True)
    assert body[0] == "LDS.128 R4, [R2]" and len(body) == 7 and not any("LDS.U16" in x for x in body)
    # a race's nested loops are its exact paths: there the innermost still counts
    race = [(a, x.replace("MUFU.EX2 R6, R9", "IMAD.WIDE.U32 R8, R8, -0x2daee0ad, RZ")) for a, x in sass]
    assert any("LDS.U16" in x for x in roofline.hot_loop(race, "race", 1, elem_bytes=2, smem=True)[0])


def test_logits_cases_count_every_pass_over_the_rows():
    cases = {c.name: c for c in roofline.logits_cases()}
    row = roofline.V * 2  # bf16
    rows = roofline.K + 1  # all drafts accepted: every row is read
    def hbm(case):  # passes that read a row from HBM (the others read a copy in shared memory)
        return sum(p[1] for p in case.phases if p[3:] != ("smem",))
    for name, case in cases.items():
        assert case.min_bytes == 64 * rows * row
        assert case.passes == sum(p[1] for p in case.phases)
        assert case.bytes_moved >= 64 * hbm(case) * row
    # without filters: max + kept mass per row, then the bonus race; CUDA reads each row from HBM once
    # (the max pass copies each block's share into shared memory: max read-back, kept mass, race there)
    assert hbm(cases["logits_cuda_onehot"]) == rows
    assert [p[0] for p in cases["logits_cuda_onehot"].phases if p[3:] == ("smem",)] == ["max", "expsum", "race"]
    # Triton: one launch, every row read once (the draft rows' exp-sum, the bonus row's with its race in the
    # same pass), the walk's round trips after the last chunk as its tail
    fused = cases["logits_triton_draft"]
    assert fused.source.endswith(":chain_fused_kernel") and fused.then is None and fused.launches == 1
    assert fused.passes == 1 and fused.items == 64 * rows and fused.tail_trips == 3
    assert [(p[0], p[1]) for p in fused.phases] == [("expsum", pytest.approx(roofline.K / rows)),
                                                    ("race", pytest.approx(1 / rows))]
    assert 64 * rows * row <= fused.bytes_moved < 1.02 * 64 * rows * row
    from specdec_ops.logits import _FUSED_MAXNREG, _partials_block, fused_chunk
    assert fused.triton["maxnreg"] == roofline._FUSED_MAXNREG == _FUSED_MAXNREG  # the launcher's register cap
    const = fused.triton["constexprs"]
    assert const["CHUNK"] == fused_chunk(64, roofline.V) == 32768  # the launcher's chunk at B = 64
    assert const["CHUNKS"] == -(-roofline.V // const["CHUNK"]) and const["PAIRS"] and const["QUADS"]
    assert const["PART_BLOCK"] == _partials_block(const["CHUNK"])
    # top-p: CUDA's draft rows accepted early (max, max read-back, the exp-sum over every entry), the bonus row's
    # early token (its exp-sum over every entry, then BONUS_ROUNDS rounds of a race and the exp-sum above the
    # winner), no radix pass, each row once from HBM; Triton the split kernels with 4 radix launches (bf16: 16-bit
    # keys; the bonus row read once more per pass, the draft rows taken by the early acceptance), the kept mass
    # (the bonus row once more), then the race
    bonus = roofline.BONUS_ROUNDS
    assert 1 < bonus < 1.25  # a race over every entry kept by top-p 0.9 nine times in ten, then more often
    assert cases["logits_cuda_onehot_topp"].passes == pytest.approx(2 * rows + (rows + bonus) + bonus)
    assert [p[:2] for p in cases["logits_cuda_onehot_topp"].phases] == \
        [("max", rows), ("max", rows), ("expsum", rows + bonus), ("race", bonus)]
    assert hbm(cases["logits_cuda_onehot_topp"]) == rows
    assert [p[0] for p in cases["logits_cuda_onehot_topp"].phases if p[3:] == ("smem",)] == \
        ["max", "expsum", "race"]
    chain, kernel = [], cases["logits_triton_draft_topp"]
    while kernel is not None:
        chain.append(kernel)
        kernel = kernel.then
    # Triton: top-p's early bonus token first (the bonus rows' race over every entry, the verdict's pass), then
    # the select, the kept mass and the race of the requests whose winner top-p drops
    assert [k.source.split(":")[1] for k in chain] == ["chain_row_partials_kernel", "chain_bonus_race_kernel",
                                                        "chain_bonus_verdict_kernel", "chain_radix_pass_kernel",
                                                        "chain_kept_mass_kernel", "chain_walk_race_kernel"]
    assert [(k.passes, k.launches) for k in chain] == [(1, 1), (1, 1), (1, 1), (4, 4), (1, 1), (1, 1)]
    fallback = math.ceil(64 * roofline.TRITON_BONUS_FALLBACK)
    assert fallback == 7 and chain[1].items == chain[2].items == 64
    assert chain[1].bytes_moved >= 64 * row and chain[2].bytes_moved >= 64 * row
    assert chain[3].bytes_moved >= 4 * fallback * row and chain[4].bytes_moved >= fallback * row
    assert chain[3].items == chain[4].items == chain[5].items == fallback
    assert all(k.triton["constexprs"]["EARLY"] and k.triton["constexprs"]["EARLY_BONUS"] for k in chain)
    from specdec_ops.logits import RADIX_SPLIT, _radix_passes, _radix_split
    assert roofline.RADIX_SPLIT == RADIX_SPLIT == _radix_split(roofline.SPLIT_CHUNK, roofline.SPLIT_RADIX_BLOCK)
    assert chain[3].triton["constexprs"]["SPLIT"] == RADIX_SPLIT
    assert chain[3].triton["constexprs"]["PASSES"] == chain[4].triton["constexprs"]["PASSES"] == \
        _radix_passes(torch.bfloat16) == 4


def committed_rows(prefix):
    """The rows of bench/roofline.json whose names start with ``prefix``: the model's output for these sources
    (test_the_committed_table_is_made_from_these_sources holds it to them), compiled with nvcc and Triton for
    sm_90 and sm_80 when it was made. The one compiling test here is the chain kernel's (above)."""
    with open(os.path.join(ROOT, "bench", "roofline.json")) as f:
        return {k: v for k, v in json.load(f)["rows"].items() if k.startswith(prefix)}


def test_roofline_rows_for_the_logits_kernels():
    rows = {k: v for k, v in committed_rows("logits_").items() if "onehot" in k}
    assert set(rows) == {"logits_cuda_onehot", "logits_cuda_onehot_topp", "logits_triton_onehot",
                         "logits_triton_onehot_topp"}
    fused = rows.pop("logits_triton_onehot")  # one launch: the draft rows' exp-sum, the bonus row's with its race
    assert [p["loop"] for p in fused["phases"]] == ["expsum", "race"] and "then" not in fused
    assert all(p["instructions"] > 0 and p["trips"] > 0 for p in fused["phases"])
    assert fused["phases"][1]["instructions"] > 2 * fused["phases"][0]["instructions"] / 4  # Philox on the race
    assert fused["spills"] == 0 and fused["bytes_vs_min"] == pytest.approx(1.0, abs=0.02) and 0 < fused["pct_peak"] <= 100
    assert fused["predicted_us"] >= (roofline.LAUNCH_S + 3 * roofline.LATENCY_S) * 1e6 + fused["t_mem_us"]  # the tail
    # with top-p six kernels: the partials, the early bonus token's race and verdict, the radix passes (4
    # launches), the kept mass, the race
    filtered = rows.pop("logits_triton_onehot_topp")
    later = filtered["then_more"] + [filtered["then"]]
    assert [p["loop"] for p in filtered["phases"]] == ["expsum"] and len(later) == 5
    assert all(k["loop_instructions"] > 0 and k["spills"] == 0 for k in later)
    assert filtered["predicted_us"] > sum(k["predicted_us"] for k in later) > 0
    assert later[2]["predicted_us"] >= 4 * roofline.LAUNCH_S * 1e6  # one launch per radix pass
    assert later[0]["grid"] == filtered["then"]["grid"] * 64 // 7  # every request races; 7 fall back
    for name, row in rows.items():
        loops = [p["loop"] for p in row["phases"]]
        assert all(p["instructions"] > 0 and p["trips"] > 0 for p in row["phases"]), name
        radix = any(loop.startswith("radix") for loop in loops)
        assert loops[0] == "max" and loops[-1].startswith("race") and radix == (name == "logits_triton_draft_topp"), name
        assert 0 < row["pct_peak"] <= 100
    assert rows["logits_cuda_onehot"]["bytes_vs_min"] == pytest.approx(1.0, abs=0.02)  # each row once from HBM
    assert rows["logits_cuda_onehot"]["smem"] > 32 * 1024  # the share (dynamic) counts toward occupancy
    # the launch bounds' 4 blocks per SM at least; the share caps it at 6 (228 KB / 33.8 KB)
    assert 4 <= rows["logits_cuda_onehot"]["ctas_per_sm"] <= roofline.SMEM_PER_SM // rows["logits_cuda_onehot"]["smem"]


def test_roofline_tree_verification_splits_each_request_across_blocks():
    rows = committed_rows("tree_verify_cuda")
    for tag in ("draft", "onehot"):
        row = rows[f"tree_verify_cuda_{tag}"]
        assert row["spills"] == 0 and 0 < row["regs"] <= 128  # launch bounds: 4 blocks of 128 threads per SM
        assert row["grid"] == 64 * 8  # 8 blocks per request at B=64 on 132 SMs
        assert row["bytes_vs_min"] == pytest.approx(1.0, abs=0.01)  # one pass over the row(s)
        assert row["instr_per_elem"] is not None and row["instr_per_elem"] > 5
        assert row["pct_peak"] > 25  # one block per request: 6.6% (draft probs), 5.5% (one-hot)


def test_tree_parts_mirror_the_launcher():
    res = dict(threads=128, regs=110, shared=900)  # 4 blocks per SM: 528 resident on 132 SMs
    assert roofline._tree_parts(res) == 8          # vthreads / threads = 1024 / 128 caps it
    assert roofline._tree_parts(res, batch=132) == 4
    assert roofline._tree_parts(res, batch=300) == 1


def test_tree_loop_picks_tell_the_scenario_passes_apart():
    assert roofline._tree_sumrace_loop("LDG.E.128 R4\nLD.E R9, desc[UR4][R2.64]\n" + "MUFU.RCP R1, R2\n" * 16)
    assert not roofline._tree_sumrace_loop("LDG.E.128 R4\nLD.E R9\n" + "MUFU.RCP R1, R2\n" * 80)  # m > 0
    assert roofline._tree_sumrace_loop("LDG.E.128 R4\nLD.E R9\n" + "MUFU.RCP R1, R2\n" * 32)
    assert not roofline._tree_sumrace_loop("LDG.E.128 R4\nMUFU.RCP R1, R2")
    assert roofline._tree_residual_m0_loop("LDG.E.128 R4\nMUFU.RCP R1, R2")
    assert not roofline._tree_residual_m0_loop("LDG.E.128 R4\nLD.E R9, desc[UR4][R2.64]")


def test_every_triton_row_sets_every_constexpr_of_its_kernel():
    """A constexpr added to a Triton kernel must get a value in its roofline rows (else the row stops
    compiling, which only the full table, not CI, would show)."""
    import importlib
    import inspect

    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    for case in roofline.all_cases():
        if case.triton is None:
            continue
        module, name = case.source.split(":")
        fn = getattr(importlib.import_module(module), name)
        params = inspect.signature(getattr(fn, "fn", fn)).parameters.values()  # JITFunction or the interpreter's
        constexprs = [p.name for p in params if "constexpr" in str(p.annotation)]
        assert constexprs, f"{case.name}: no constexpr parameters found in {case.source}"
        missing = [n for n in constexprs if n not in case.triton["constexprs"]]
        assert not missing, f"{case.name}: no value for constexpr {missing} in bench/roofline.py"


def test_rejection_triton_parts_mirror_the_launcher():
    """The Triton chain rows size their grid as specdec_ops/rejection.py's launcher does on an H200."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    from specdec_ops import rejection

    assert roofline.REJECTION_TRITON_PROGRAMS_PER_SM == rejection._TRITON_PROGRAMS_PER_SM
    assert roofline.REJECTION_TRITON_MAXNREG == rejection._TRITON_MAXNREG
    assert roofline.REJECTION_TRITON_MAX_PARTS == rejection._TRITON_MAX_PARTS
    tiles = -(-roofline.V // roofline.REJECTION_TRITON_BLOCK)
    for batch in (1, 8, 64, 65, 132, 500, 1000):
        assert roofline._rejection_triton_parts(batch) == rejection._triton_parts(
            batch, tiles, roofline.SMS * rejection._TRITON_PROGRAMS_PER_SM)
    cases = {c.name: c for c in roofline.rejection_cases()}
    res = dict(threads=128, regs=80, shared=1024)
    assert cases["rejection_triton_draft"].grid(res) == (64 * 10, 10)   # B=64: 10 parts of 13 tiles
    assert cases["rejection_triton_draft_b8"].grid(res) == (8 * 63, 63)  # B=8: 63 parts of 2 tiles
    for name in ("rejection_triton_draft", "rejection_triton_greedy"):  # the workspace is counted
        assert cases[name].bytes_moved > cases[name.replace("triton", "cuda")].bytes_moved


def test_predictions_are_reused_only_for_the_sources_they_were_made_from(tmp_path, capsys):
    """--predicted (bench/gpu_check.sh on a GPU: measure only) takes a saved table's rows without compiling
    while its sources digest is this checkout's, and compiles when the digest, a row or the file is missing."""
    row = dict(regs=98, spills=0, smem=1541, threads=256, ctas_per_sm=2, grid=256, waves=1, bytes_mb=65.7,
               bytes_vs_min=1.0, instr_per_elem=46.5, predicted_us=15.7, bound="memory", pct_peak=87.0,
               measured_us=99.0)
    saved = tmp_path / "saved.json"
    saved.write_text(json.dumps(dict(rows={"rejection_cuda_draft_b8": row}, sources=roofline.sources_digest())))
    out = tmp_path / "out.json"
    interpret = os.environ.get("TRITON_INTERPRET")
    assert roofline.main(["--predicted", str(saved), "--only", "rejection_cuda_draft_b8", "--json", str(out)]) == 0
    # main() lifts TRITON_INTERPRET while it runs and puts it back: the Triton tests that this pytest worker
    # runs next still take the interpreter
    assert os.environ.get("TRITON_INTERPRET") == interpret
    printed = capsys.readouterr().out
    assert "nothing compiled" in printed and printed.count("rejection_cuda_draft_b8 ") == 1
    rows = json.loads(out.read_text())["rows"]
    assert rows["rejection_cuda_draft_b8"]["predicted_us"] == 15.7
    assert "measured_us" not in rows["rejection_cuda_draft_b8"]   # an old measurement is not carried over
    assert roofline.load_predictions(str(saved), ["rejection_cuda_draft_b8", "kv_commit_cuda"]) is None
    saved.write_text(json.dumps(dict(rows={"rejection_cuda_draft_b8": row}, sources="0" * 64)))
    assert roofline.load_predictions(str(saved), ["rejection_cuda_draft_b8"]) is None
    assert roofline.load_predictions(str(tmp_path / "missing.json"), ["rejection_cuda_draft_b8"]) is None
    assert "other sources" in capsys.readouterr().out


def test_the_committed_table_is_made_from_these_sources():
    """bench/roofline.json is what a GPU run measures against without compiling (bench/gpu_check.sh): after a
    change to a kernel, its launcher's tiles or the model, remake it with
    `python bench/roofline.py --json bench/roofline.json` (2 to 6 minutes on 2 cores; it also shows the change's
    effect on every row)."""
    path = os.path.join(ROOT, "bench", "roofline.json")
    with open(path) as f:
        data = json.load(f)
    assert data["sources"] == roofline.sources_digest(), "stale: python bench/roofline.py --json bench/roofline.json"
    assert not data["errors"] and not data["spills"]
    assert set(data["rows"]) == {c.name for c in roofline.all_cases()}
